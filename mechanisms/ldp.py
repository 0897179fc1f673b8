"""Differentially private centroids from an LSH-tree coreset.

Google's LSH-tree coreset clustering (Chang, Ghazi, Kumar and Manurangsi's
"practical differentially private clustering"), a *central*-model DP
algorithm that each client runs on its own representations as the curator
of its own data; not their one-round *local*-model algorithm (ICML 2021),
whose users each randomise a single point. The steps:

1. clip every representation to radius ``r``;
2. hash it with SimHash: bit ``l`` is ``sign <x - c, v_l>``, hyperplanes
   ``v_l`` drawn independently of the data around a public centre ``c``;
3. grow a prefix tree over the bits level by level, releasing a noisy
   (discrete Laplace) count for every node it looks at; a node is kept from
   noisy count ``T_n`` on and split from ``T_b`` on;
4. every leaf releases a noisy count and a noisy sum (discrete Gaussian on an
   integer grid); its coreset point is ``sum / max(count, 1)`` clipped to
   ``r``, weighted by the count;
5. ``L`` centres by weighted spherical k-means on the coreset, normalised and
   padded to exactly ``L``: post-processing of noisy values, free of charge.

Privacy unit: one representation of the client, replace-one neighbours
(:mod:`mechanisms.accounting` says why not add/remove). Replacing one changes
at most two node counts per level (by one each), two leaf counts, and the
leaf sums by at most ``2r`` in L2 (both in one leaf): a release composes
``max_depth + 1`` discrete-Laplace count queries, one discrete-Laplace
leaf-count query and one Gaussian sum query at that sensitivity. Every level
is charged even when the tree stops early. Nothing branches on the true
number of representations: ``n = 0`` runs the same code, releases ``L``
vectors and is indistinguishable from ``n = 1`` up to the guarantee.

The guarantee covers the released centroids, weights and metrics (functions
of noisy values), not the client's encoder update, which SecAgg+ hides from
the server but does not make differentially private. Utility (a coreset
point of ``m`` rows carries noise of norm about ``z r sqrt(D) / m``):
docs/privacy.md, "Where local DP stops carrying signal". Built on its own the
mechanism defaults to delta ``1e-5``; privfed always passes the run's delta.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from mechanisms import accounting
from mechanisms.accounting import BudgetSplit, NoiseParameters
from mechanisms.base import (
    DIFFERENTIAL_PRIVACY,
    Guarantee,
    PrivacyEvent,
    Release,
    ReleaseMechanism,
    replace_one_dp_guarantee,
)
from mechanisms.clustering import sinkhorn_kmeans
from mechanisms.dp_pieces import (
    DEFAULT_DELTA,
    DEFAULT_EPSILON,
    MAX_DIMENSION,
    WEIGHT_NOISE_SCALES,
    Grid,
    clip_to_radius,
    pad_centres,
)
from mechanisms.noise import (
    check_decay,
    check_sigma,
    discrete_gaussian,
    discrete_laplace,
    discrete_laplace_variance,
    secure_source,
)
from mechanisms.registry import register_mechanism

#: Tree depth: 2**10 cells is far more than the L <= 16 clusters a client needs; each level is a charged query.
DEFAULT_MAX_DEPTH = 10


def ldp_parameters(
    total_epsilon: float,
    total_delta: float = DEFAULT_DELTA,
    *,
    num_releases: int,
    max_depth: int = DEFAULT_MAX_DEPTH,
    split: BudgetSplit = BudgetSplit(),
) -> dict[str, float | int]:
    """Keyword arguments for :class:`LshCoresetMechanism` whose ``num_releases`` releases spend at most
    ``(total_epsilon, total_delta)`` (``split`` between tree counts, leaf counts and leaf sums)."""
    noise = accounting.calibrate(
        total_epsilon, total_delta, num_releases=num_releases, tree_levels=max_depth + 1, split=split
    )
    return {**{k: float(v) for k, v in noise.to_dict().items()}, "delta": float(total_delta), "max_depth": max_depth}


#: How many times :func:`release_epsilon` may refine its PLD grid (each pass shrinks it to what the last result needs).
MAX_GRID_REFINEMENTS = 8


@lru_cache(maxsize=256)
def release_epsilon(noise: NoiseParameters, *, tree_levels: int, delta: float) -> float:
    """Epsilon of one release at ``delta`` under replace-one (PLD), at most about 0.5 % above the exact value.

    The accountant rounds every loss up to its grid, up to one step per
    composed PLD, so the grid is refined until that is at most half a percent
    of the epsilon found on it. Each result is an upper bound: stopping early only overstates.
    """
    events = accounting.release_privacy_events(noise, tree_levels=tree_levels)
    compositions = accounting.rounding_compositions(events)
    grid = accounting.DEFAULT_DISCRETISATION
    epsilon = accounting.epsilon_of(events, delta, discretisation=grid)
    for _ in range(MAX_GRID_REFINEMENTS):
        wanted = 0.5 * accounting.calibration_discretisation(epsilon, compositions)
        if epsilon == 0.0 or grid <= wanted:
            break
        grid = wanted
        epsilon = accounting.epsilon_of(events, delta, discretisation=grid)
    return epsilon


def simhash_prefix_codes(x: torch.Tensor, hyperplanes: torch.Tensor, center: torch.Tensor) -> np.ndarray:
    """Prefix codes of SimHash bits: column ``l`` is the integer of the first ``l`` bits, ``bit_l = <x - c, v_l> > 0``
    (column 0, the root, is 0 for everyone)."""
    bits = ((x.double() - center.double()) @ hyperplanes.double().T > 0).cpu().numpy().astype(np.int64)
    n, depth = bits.shape
    codes = np.zeros((n, depth + 1), dtype=np.int64)
    for level in range(depth):
        codes[:, level + 1] = 2 * codes[:, level] + bits[:, level]
    return codes


def count_members(point_codes: np.ndarray, node_codes: np.ndarray) -> np.ndarray:
    """How many points carry each of ``node_codes`` (all nodes on one level)."""
    points = np.sort(point_codes)
    return np.searchsorted(points, node_codes, side="right") - np.searchsorted(points, node_codes, side="left")


@dataclass(frozen=True)
class Thresholds:
    """When a node is kept (``keep``) and when it is split (``branch``)."""

    keep: float
    branch: float


def default_thresholds(
    *, root_count: float, num_centroids: int, noise: NoiseParameters, grid_std_norm: float
) -> Thresholds:
    """Thresholds from the *noisy* root count and public noise scales only.

    ``keep`` is the larger of three tree-count standard deviations (so a kept
    node is rarely pure noise) and the expected norm of a leaf's sum noise in
    units of ``r`` (so a kept leaf's mean is not dominated by noise).
    ``branch`` is at least twice ``keep`` and at least ``n_hat / (2 L)``, so
    the tree stops splitting once nodes are a fraction of a cluster, leaving
    roughly ``2L`` to ``4L`` leaves when the data allow.
    """
    tree_std = math.sqrt(discrete_laplace_variance(noise.tree_count_parameter))
    keep = max(3.0 * tree_std, grid_std_norm, 1.0)
    branch = max(2.0 * keep, root_count / (2.0 * num_centroids))
    return Thresholds(keep=keep, branch=branch)


@dataclass(frozen=True)
class Tree:
    """The released tree: which leaves it found, plus diagnostics."""

    leaf_levels: np.ndarray
    leaf_codes: np.ndarray
    root_count: float
    nodes_queried: int
    depth_reached: int


def grow_tree(
    codes: np.ndarray, *, max_depth: int, tree_count_parameter: float,
    thresholds_for_root: Callable[[float], Thresholds], source: random.Random,
) -> Tree:
    """Grows the prefix tree over ``codes`` level by level with noisy counts, querying both children of every
    split node, empty or not: which counts get released must depend only on earlier noisy outputs."""
    nodes = np.zeros(1, dtype=np.int64)
    noisy = count_members(codes[:, 0], nodes) + discrete_laplace(1, parameter=tree_count_parameter, source=source)
    root_count = float(noisy[0])
    thresholds = thresholds_for_root(root_count)
    leaf_levels: list[np.ndarray] = []
    leaf_codes: list[np.ndarray] = []
    queried, depth_reached = 1, 0
    for level in range(max_depth + 1):
        keep = noisy >= thresholds.keep
        branch = keep & (noisy >= thresholds.branch) & (level < max_depth)
        leaves = nodes[keep & ~branch]
        leaf_codes.append(leaves)
        leaf_levels.append(np.full(leaves.shape[0], level, dtype=np.int64))
        parents = nodes[branch]
        if parents.size == 0:
            break
        nodes = np.concatenate([2 * parents, 2 * parents + 1])
        noise = discrete_laplace(nodes.shape[0], parameter=tree_count_parameter, source=source)
        noisy = count_members(codes[:, level + 1], nodes) + noise
        queried += nodes.shape[0]
        depth_reached = level + 1
    return Tree(np.concatenate(leaf_levels), np.concatenate(leaf_codes), root_count, queried, depth_reached)


def leaf_membership(codes: np.ndarray, tree: Tree) -> np.ndarray:
    """Leaf index of every point, ``-1`` for points in no kept leaf (leaves are disjoint)."""
    member = np.full(codes.shape[0], -1, dtype=np.int64)
    for index, (level, code) in enumerate(zip(tree.leaf_levels, tree.leaf_codes)):
        member[codes[:, level] == code] = index
    return member


@dataclass(frozen=True)
class Coreset:
    """Noisy leaf statistics and the weighted points made from them."""

    points: torch.Tensor  # [m, D] in the radius-r ball
    weights: torch.Tensor  # [m] noisy counts, > 0
    noisy_counts: np.ndarray  # [leaves] all leaves, before dropping
    noisy_sums: torch.Tensor  # [leaves, D] in data units
    tree: Tree
    leaf_of_row: np.ndarray  # [n] each input row's leaf, -1 for none (never released: for scoring attacks)


def noisy_leaf_statistics(
    x: torch.Tensor, membership: np.ndarray, num_leaves: int, *, grid: Grid, noise: NoiseParameters,
    source: random.Random,
) -> tuple[np.ndarray, torch.Tensor]:
    """Noisy count (discrete Laplace) and noisy sum (discrete Gaussian) per leaf."""
    dim = x.shape[1]
    member = membership >= 0
    counts = np.bincount(membership[member], minlength=num_leaves)[:num_leaves]
    rounded = np.rint(x.double().cpu().numpy() / grid.step).astype(np.int64)
    sums = np.zeros((num_leaves, dim), dtype=np.int64)
    np.add.at(sums, membership[member], rounded[member])
    noisy_counts = counts + discrete_laplace(num_leaves, parameter=noise.leaf_count_parameter, source=source)
    sigma = noise.sum_noise_multiplier * grid.sensitivity
    noisy_sums = sums + discrete_gaussian(num_leaves * dim, sigma=sigma, source=source).reshape(num_leaves, dim)
    return noisy_counts, torch.from_numpy(noisy_sums.astype(np.float64) * grid.step)


def weighted_spherical_kmeans(
    points: torch.Tensor, weights: torch.Tensor, num_clusters: int, *, generator: torch.Generator, num_iters: int = 20
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted k-means by cosine: ``(unit centres [k, D], cluster weights [k])``; a centre moves to the direction
    of ``sum_i w_i p_i`` over its members (for coreset points, that of their leaves' noisy sums)."""
    directions = F.normalize(points.double(), dim=1)
    mass = points.double() * weights.double()[:, None]
    w = weights.double()
    first = int(torch.multinomial(w, 1, generator=generator))
    centres = [directions[first]]
    for _ in range(1, num_clusters):
        dist = (1.0 - (directions @ torch.stack(centres).T).max(dim=1).values).clamp_min(0)
        probs = dist * w
        probs = probs if probs.sum() > 0 else w
        centres.append(directions[int(torch.multinomial(probs, 1, generator=generator))])
    centres_t = torch.stack(centres)
    assignment = torch.zeros(points.shape[0], dtype=torch.long)
    for _ in range(num_iters):
        assignment = (directions @ centres_t.T).argmax(dim=1)
        sums = torch.zeros_like(centres_t).index_add_(0, assignment, mass)
        occupied = sums.norm(dim=1) > 0
        centres_t = torch.where(occupied[:, None], F.normalize(sums, dim=1), centres_t)
    cluster_weights = torch.zeros(num_clusters, dtype=torch.float64).index_add_(0, assignment, w)
    return centres_t, cluster_weights


@register_mechanism
class LshCoresetMechanism(ReleaseMechanism):
    """(epsilon, delta)-DP centroids from a noisy SimHash prefix-tree coreset."""

    name = "ldp"
    description = (
        "L centroids clustered from a differentially private LSH-tree coreset "
        "(Chang et al. 2021); (epsilon, delta) per release"
    )
    guarantee_kind = DIFFERENTIAL_PRIVACY

    @classmethod
    def calibrate(cls, *, epsilon: float, delta: float, num_releases: int) -> dict[str, float | int]:
        """Explicit noise for ``num_releases`` releases within ``(epsilon, delta)`` (see :func:`ldp_parameters`)."""
        return ldp_parameters(epsilon, delta, num_releases=num_releases)

    def __init__(
        self,
        *,
        epsilon: float | None = None,
        delta: float = DEFAULT_DELTA,
        tree_count_parameter: float | None = None,
        leaf_count_parameter: float | None = None,
        sum_noise_multiplier: float | None = None,
        radius: float = 1.0,
        max_depth: int = DEFAULT_MAX_DEPTH,
        branch_threshold: float | None = None,
        leaf_threshold: float | None = None,
        center: torch.Tensor | None = None,
        clustering: str = "kmeans",
        kmeans_iters: int = 20,
        grid_resolution: float | None = None,
        budget_split: BudgetSplit | None = None,
        noise_source: random.Random | None = None,
    ) -> None:
        """From the three noise parameters (``sum_noise_multiplier``: leaf-sum std over its sensitivity), or
        calibrated to a per-release ``epsilon`` (default 1.0). ``T_b`` (``branch_threshold``) and ``T_n``
        (``leaf_threshold``) default to :func:`default_thresholds`, the public SimHash ``center`` to the origin;
        ``clustering`` of the coreset is ``"kmeans"`` (weighted spherical) or ``"sinkhorn"`` (equal-mass). Leave
        ``noise_source`` unset (the OS CSPRNG); tests pass a seeded one."""
        given = [p is not None for p in (tree_count_parameter, leaf_count_parameter, sum_noise_multiplier)]
        if any(given) and not all(given):
            raise ValueError("give all three noise parameters or none (then epsilon is calibrated)")
        if any(given) and epsilon is not None:
            raise ValueError("give either epsilon or explicit noise parameters, not both")
        if clustering not in ("kmeans", "sinkhorn"):
            raise ValueError(f"clustering must be 'kmeans' or 'sinkhorn', got {clustering!r}")
        if radius <= 0 or max_depth < 0 or max_depth > 60:
            raise ValueError("need radius > 0 and 0 <= max_depth <= 60")
        self.delta = delta
        self.radius = radius
        self.max_depth = max_depth
        self.branch_threshold = branch_threshold
        self.leaf_threshold = leaf_threshold
        self.center = center
        self.clustering = clustering
        self.kmeans_iters = kmeans_iters
        self.grid_resolution = grid_resolution
        self.noise_source = noise_source
        if tree_count_parameter is not None and leaf_count_parameter is not None and sum_noise_multiplier is not None:
            self.noise = NoiseParameters(
                tree_count_parameter=float(tree_count_parameter),
                leaf_count_parameter=float(leaf_count_parameter),
                sum_noise_multiplier=float(sum_noise_multiplier),
            )
        else:
            self.noise = accounting.calibrate(
                DEFAULT_EPSILON if epsilon is None else epsilon,
                delta,
                num_releases=1,
                tree_levels=self.tree_levels,
                split=budget_split or BudgetSplit(),
            )
        # Refuse noise the samplers cannot draw, on the widest grid a release may use, before any release is charged.
        for name in ("tree_count_parameter", "leaf_count_parameter"):
            try:
                check_decay(getattr(self.noise, name))
            except ValueError as err:
                raise ValueError(f"ldp {name}: {err}") from None
        try:
            check_sigma(self.noise.sum_noise_multiplier * self.grid(MAX_DIMENSION).sensitivity)
        except ValueError as err:
            raise ValueError(f"ldp sum_noise_multiplier {self.noise.sum_noise_multiplier!r}: {err}") from None

    def observe_global_centroids(self, centroids: torch.Tensor) -> None:
        """SimHash centre ``c`` = mean of last round's (public) global centroids."""
        self.center = centroids.detach().double().mean(dim=0).cpu()

    @property
    def tree_levels(self) -> int:
        return self.max_depth + 1

    @property
    def epsilon(self) -> float:
        """Per-release epsilon at ``delta``, from the PLD accountant."""
        return release_epsilon(self.noise, tree_levels=self.tree_levels, delta=self.delta)

    @classmethod
    def max_total_weight(cls, *, num_reps: int, params: dict[str, Any]) -> float:
        """``num_reps`` plus :data:`WEIGHT_NOISE_SCALES` scales of the (unbounded) leaf-count noise in the weights."""
        noise = cls(**params).noise
        return float(num_reps) + WEIGHT_NOISE_SCALES / noise.leaf_count_parameter

    def privacy_events(self) -> tuple[PrivacyEvent, ...]:
        return accounting.release_privacy_events(self.noise, tree_levels=self.tree_levels)

    def guarantee(self, *, num_reps: int, num_centroids: int) -> Guarantee:
        return replace_one_dp_guarantee(
            self.epsilon, self.delta, accounting="PLD accountant; leaf sums accounted as a Gaussian",
            covers="the released centroids, weights and metrics",
        )

    def grid(self, dim: int) -> Grid:
        return Grid.for_dimension(dim, self.radius, self.grid_resolution)

    def sum_noise_std(self, dim: int) -> float:
        """Standard deviation of each coordinate of a leaf sum's noise, in data units."""
        grid = self.grid(dim)
        return self.noise.sum_noise_multiplier * grid.sensitivity * grid.step

    def rows_per_vector(self, *, rows: int, dim: int, num_centroids: int) -> float | None:
        """``T_n``: a tree node, hence a coreset point, is kept only from this noisy count on."""
        return self.thresholds(root_count=rows, num_centroids=num_centroids, dim=dim).keep

    def thresholds(self, *, root_count: float, num_centroids: int, dim: int) -> Thresholds:
        auto = default_thresholds(
            root_count=root_count,
            num_centroids=num_centroids,
            noise=self.noise,
            grid_std_norm=self.sum_noise_std(dim) * math.sqrt(dim) / self.radius,
        )
        keep = auto.keep if self.leaf_threshold is None else self.leaf_threshold
        branch = self.branch_threshold if self.branch_threshold is not None else max(auto.branch, 2 * keep)
        return Thresholds(keep=keep, branch=branch)

    def coreset(self, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator) -> Coreset:
        """Steps 1-4: the private part. Consumes ``max_depth * D`` normals of ``generator``."""
        n, dim = reps.shape
        source = self.noise_source if self.noise_source is not None else secure_source()
        hyperplanes = torch.randn(self.max_depth, dim, generator=generator, dtype=torch.float64)
        center = torch.zeros(dim, dtype=torch.float64) if self.center is None else self.center.double().cpu()
        x = clip_to_radius(reps.detach().double().cpu(), self.radius)
        codes = simhash_prefix_codes(x, hyperplanes, center) if n else np.zeros((0, self.max_depth + 1), np.int64)
        tree = grow_tree(
            codes, max_depth=self.max_depth, tree_count_parameter=self.noise.tree_count_parameter,
            thresholds_for_root=lambda root: self.thresholds(root_count=root, num_centroids=num_centroids, dim=dim),
            source=source,
        )
        membership = leaf_membership(codes, tree)
        noisy_counts, noisy_sums = noisy_leaf_statistics(
            x, membership, len(tree.leaf_codes), grid=self.grid(dim), noise=self.noise, source=source
        )
        # Post-processing: leaves of positive noisy count become ``sum / max(count, 1)`` clipped to ``r``.
        counts = torch.from_numpy(noisy_counts.astype(np.float64))
        keep = counts > 0
        points = clip_to_radius(noisy_sums[keep] / counts[keep].clamp_min(1.0)[:, None], self.radius)
        return Coreset(points, counts[keep], noisy_counts, noisy_sums, tree, membership)

    def cluster(
        self, coreset: Coreset, *, num_centroids: int, dim: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Step 5 (post-processing): exactly ``num_centroids`` unit centres and weights."""
        usable = coreset.points.norm(dim=1) > 0
        points, weights = coreset.points[usable], coreset.weights[usable]
        if points.shape[0] <= num_centroids:
            centres, cluster_weights = F.normalize(points, dim=1), weights
        elif self.clustering == "sinkhorn":
            centres = sinkhorn_kmeans(
                F.normalize(points, dim=1), num_centroids, weights=weights,
                generator=generator, num_iters=self.kmeans_iters,
            ).double()
            nearest = (F.normalize(points, dim=1) @ centres.T).argmax(dim=1)
            cluster_weights = torch.zeros(num_centroids, dtype=torch.float64).index_add_(0, nearest, weights)
        else:
            centres, cluster_weights = weighted_spherical_kmeans(
                points, weights, num_centroids, generator=generator, num_iters=self.kmeans_iters
            )
        return pad_centres(centres, cluster_weights, num_centroids, dim, generator=generator)

    def release(self, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator) -> Release:
        return self.release_with_members(reps, num_centroids=num_centroids, generator=generator)[0]

    def release_with_members(
        self, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator
    ) -> tuple[Release, torch.Tensor]:
        """The release, and for each row the centre nearest its leaf's coreset point (``-1``: no usable leaf), as
        the weighted k-means ends assigning them; a padding centre (weight 0) has no members."""
        if reps.shape[1] > MAX_DIMENSION:
            raise ValueError(f"ldp releases representations of at most {MAX_DIMENSION} dimensions, got {reps.shape[1]}")
        if num_centroids < 1:
            raise ValueError(f"num_centroids must be >= 1, got {num_centroids}")
        n, dim = reps.shape
        coreset = self.coreset(reps, num_centroids=num_centroids, generator=generator)
        centres, weights = self.cluster(coreset, num_centroids=num_centroids, dim=dim, generator=generator)
        real = int((weights > 0).sum())
        release = Release(
            vectors=centres.to(reps.dtype),
            weights=weights.float(),
            guarantee=self.guarantee(num_reps=n, num_centroids=num_centroids),
            events=self.privacy_events(),
            metrics={
                "coreset_size": float(coreset.points.shape[0]),
                "noisy_num_reps": coreset.tree.root_count,
                "tree_leaves": float(len(coreset.tree.leaf_codes)),
                "tree_nodes": float(coreset.tree.nodes_queried),
                "tree_depth": float(coreset.tree.depth_reached),
                "padded_centroids": float(num_centroids - real),
                "epsilon": self.epsilon,
                "delta": self.delta,
            },
        )
        return release, _centre_of_row(coreset, centres, weights)


def _centre_of_row(coreset: Coreset, centres: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each row's released centre via its leaf's coreset point (``-1``: dropped leaf, no leaf, or only padding)."""
    members = torch.full((coreset.leaf_of_row.shape[0],), -1, dtype=torch.long)
    real = torch.nonzero(weights > 0).squeeze(1)
    kept = torch.nonzero(torch.from_numpy(coreset.noisy_counts) > 0).squeeze(1)  # leaf of each coreset point
    usable = coreset.points.norm(dim=1) > 0
    if real.numel() == 0 or not bool(usable.any()):
        return members
    nearest = real[(F.normalize(coreset.points[usable], dim=1) @ centres[real].double().T).argmax(dim=1)]
    centre_of_leaf = torch.full((len(coreset.noisy_counts),), -1, dtype=torch.long)
    centre_of_leaf[kept[usable]] = nearest
    rows = torch.from_numpy(coreset.leaf_of_row)
    in_leaf = rows >= 0
    members[in_leaf] = centre_of_leaf[rows[in_leaf]]
    return members
