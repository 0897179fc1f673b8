"""Differentially private centroids from an LSH-tree coreset.

Google's LSH-tree coreset clustering, a *central*-model DP algorithm
(the "practical differentially private clustering" line of work by Chang,
Ghazi, Kumar and Manurangsi), run once by each client on its own
representations: the client is the curator of its own data. It is not
Chang et al.'s one-round *local*-model algorithm ("Locally Private k-Means
in One Round", ICML 2021), whose users each randomise a single point. The
steps:

1. clip every representation to radius ``r``;
2. hash it with SimHash: bit ``l`` is ``sign <x - c, v_l>`` for hyperplanes
   ``v_l`` drawn independently of the data around a public centre ``c``;
3. grow a prefix tree over the hash bits level by level, releasing a noisy
   (discrete Laplace) count for every node it looks at; a node is kept when
   its noisy count reaches ``T_n`` and split when it reaches ``T_b``;
4. every leaf releases a noisy count and a noisy sum (discrete Gaussian on an
   integer grid); the coreset point is ``sum / max(count, 1)`` clipped to
   ``r``, weighted by the count;
5. ``L`` centres by weighted spherical k-means on the coreset, normalised and
   padded to exactly ``L``. This step, and everything after step 4, only
   reads noisy values: it is post-processing and costs no privacy.

Privacy unit: one representation of the client, replace-one neighbours
(see :mod:`mechanisms.accounting` for why not add/remove). Replacing one
representation changes at most two node counts per tree level (by one
each), two leaf counts, and the leaf sums by at most ``2r`` in L2 (both in
one leaf), so a release is the composition of ``max_depth + 1``
discrete-Laplace count queries, one discrete-Laplace leaf-count query and
one Gaussian sum query, each at that replacement sensitivity. Every level is
charged even when the tree stops early. Nothing here branches on the true
number of representations: a client with zero representations runs the same
code and releases ``L`` vectors, so ``n = 0`` is indistinguishable from
``n = 1`` up to the guarantee.

Utility depends on the client's sample size above all: a coreset point of
``m`` representations carries noise of norm about ``z * r * sqrt(D) / m``.
Measured floors and coverage: docs/privacy.md, "Where local DP stops
carrying signal".

What the guarantee covers: the released centroids and weights (and the
metrics, which are functions of noisy values). It does not cover the
client's encoder update, which SecAgg+ hides from the server but does not
make differentially private.

Default delta when the mechanism is built on its own: ``1e-5``. privfed
always passes the run's delta (``privfed.privacy.budget.default_delta``:
``min(1e-6, 1/(100 n))`` unless ``--delta`` says otherwise).
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

#: Tree depth: 2**10 cells is far more than the L <= 16 clusters a client
#: needs, and every extra level is one more charged count query.
DEFAULT_MAX_DEPTH = 10


# ---------------------------------------------------------------------------
# budget


def ldp_parameters(
    total_epsilon: float,
    total_delta: float = DEFAULT_DELTA,
    *,
    num_releases: int,
    max_depth: int = DEFAULT_MAX_DEPTH,
    split: BudgetSplit = BudgetSplit(),
) -> dict[str, float | int]:
    """Per-release parameters for a client that may release ``num_releases`` times.

    ``--epsilon`` is the total a client may spend over the run; the training
    core calls this once and builds the mechanism with the result
    (``create_mechanism("ldp", **params)``). Its ledger then composes the
    releases the client actually makes, which is never more than planned.

    Args:
        total_epsilon: Budget over all of the client's releases.
        total_delta: Total delta; each release's epsilon is also quoted at it.
        num_releases: The most releases one client can make (e.g. rounds + 1
            for the round-0 initialisation, under full participation).
        max_depth: Tree depth the mechanism will use.
        split: Budget fractions between tree counts, leaf counts, leaf sums.

    Returns:
        Keyword arguments for :class:`LshCoresetMechanism`.
    """
    noise = accounting.calibrate(
        total_epsilon, total_delta, num_releases=num_releases, tree_levels=max_depth + 1, split=split
    )
    return {**{k: float(v) for k, v in noise.to_dict().items()}, "delta": float(total_delta), "max_depth": max_depth}


#: How many times :func:`release_epsilon` may refine its PLD grid (each pass shrinks it to what the last result needs).
MAX_GRID_REFINEMENTS = 8


@lru_cache(maxsize=256)
def release_epsilon(noise: NoiseParameters, *, tree_levels: int, delta: float) -> float:
    """Epsilon of one release at ``delta`` under replace-one (PLD), at most about 0.5 % above the exact value.

    The accountant rounds every loss up to its grid, which can cost up to
    one grid step per composed PLD. So the grid is refined until that
    rounding is at most half a percent of the epsilon found on it (a fixed
    grid overstated a tiny per-release epsilon by 13 %, and the 1 %
    calibration grid of a first, rounded-up result by 2 %). Each result is
    an upper bound, so stopping early only overstates.
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


# ---------------------------------------------------------------------------
# pure building blocks


def check_drawable(noise: NoiseParameters, grid: Grid) -> None:
    """Refuses noise the samplers of :mod:`mechanisms.noise` cannot draw, before a release is charged.

    ``grid`` is the widest grid a release may use (:data:`MAX_DIMENSION`): its
    sensitivity scales the leaf-sum sigma.

    Raises:
        ValueError: naming the parameter and the sampler's range.
    """
    for name in ("tree_count_parameter", "leaf_count_parameter"):
        try:
            check_decay(getattr(noise, name))
        except ValueError as err:
            raise ValueError(f"ldp {name}: {err}") from None
    try:
        check_sigma(noise.sum_noise_multiplier * grid.sensitivity)
    except ValueError as err:
        raise ValueError(f"ldp sum_noise_multiplier {noise.sum_noise_multiplier!r}: {err}") from None


def simhash_prefix_codes(x: torch.Tensor, hyperplanes: torch.Tensor, center: torch.Tensor) -> np.ndarray:
    """Prefix codes of SimHash bits: column ``l`` is the integer of the first ``l`` bits.

    Column 0 is the root (0 for everyone); column ``l + 1`` is
    ``2 * column_l + bit_l`` with ``bit_l = <x - c, v_l> > 0``.
    """
    bits = ((x.double() - center.double()) @ hyperplanes.double().T > 0).cpu().numpy().astype(np.int64)
    n, depth = bits.shape
    codes = np.zeros((n, depth + 1), dtype=np.int64)
    for level in range(depth):
        codes[:, level + 1] = 2 * codes[:, level] + bits[:, level]
    return codes


def count_members(point_codes: np.ndarray, node_codes: np.ndarray) -> np.ndarray:
    """How many points carry each of ``node_codes`` (all nodes on one level)."""
    order = np.argsort(node_codes)
    sorted_nodes = node_codes[order]
    pos = np.searchsorted(sorted_nodes, point_codes)
    pos_clipped = np.minimum(pos, max(len(sorted_nodes) - 1, 0))
    hit = (pos < len(sorted_nodes)) & (sorted_nodes[pos_clipped] == point_codes) if len(sorted_nodes) else pos < 0
    counts_sorted = np.bincount(pos[hit], minlength=len(sorted_nodes))
    counts = np.empty_like(counts_sorted)
    counts[order] = counts_sorted
    return counts


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
    codes: np.ndarray,
    *,
    max_depth: int,
    tree_count_parameter: float,
    thresholds_for_root: Callable[[float], Thresholds],
    source: random.Random,
) -> Tree:
    """Grows the prefix tree level by level with noisy counts.

    Both children of every split node are queried, empty or not: which
    counts get released must depend only on earlier noisy outputs.

    Args:
        codes: ``[n, max_depth + 1]`` prefix codes (see :func:`simhash_prefix_codes`).
        max_depth: Deepest level (levels ``0..max_depth`` release counts).
        tree_count_parameter: Discrete-Laplace decay of every node count.
        thresholds_for_root: Maps the noisy root count to the thresholds.
        source: Noise source.
    """
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
    return Tree(
        leaf_levels=np.concatenate(leaf_levels),
        leaf_codes=np.concatenate(leaf_codes),
        root_count=root_count,
        nodes_queried=queried,
        depth_reached=depth_reached,
    )


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
    x: torch.Tensor,
    membership: np.ndarray,
    num_leaves: int,
    *,
    grid: Grid,
    noise: NoiseParameters,
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


def coreset_points(
    noisy_counts: np.ndarray, noisy_sums: torch.Tensor, radius: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted coreset from noisy leaf statistics (post-processing).

    A leaf whose noisy count is zero or negative carries no usable weight and
    is dropped; the others become ``sum / max(count, 1)`` clipped to ``r``.
    """
    counts = torch.from_numpy(noisy_counts.astype(np.float64))
    keep = counts > 0
    points = noisy_sums[keep] / counts[keep].clamp_min(1.0)[:, None]
    return clip_to_radius(points, radius), counts[keep]


def weighted_spherical_kmeans(
    points: torch.Tensor,
    weights: torch.Tensor,
    num_clusters: int,
    *,
    generator: torch.Generator,
    num_iters: int = 20,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted k-means on directions; centres are normalised weighted sums.

    Assignment uses cosine similarity; a centre moves to the direction of
    ``sum_i w_i p_i`` over its members, which for coreset points is the
    direction of the sum of their leaves' (noisy) sums: the natural estimate
    of the members' mean direction.

    Returns:
        ``(centres [k, D] unit-norm, cluster weights [k])``.
    """
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


# ---------------------------------------------------------------------------
# the mechanism


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
        """Builds the mechanism from explicit noise or from a per-release budget.

        Args:
            epsilon: Per-release epsilon to calibrate to (default 1.0 when no
                noise parameters are given). For a budget over a whole run use
                :func:`ldp_parameters`.
            delta: Delta of each release's quoted epsilon.
            tree_count_parameter: Discrete-Laplace decay of node counts.
            leaf_count_parameter: Discrete-Laplace decay of leaf counts.
            sum_noise_multiplier: Leaf-sum noise std / sensitivity.
            radius: Clip radius ``r``; 1 for unit representations.
            max_depth: Deepest tree level; ``max_depth + 1`` levels are charged.
            branch_threshold: ``T_b``; derived from the noisy root count if omitted.
            leaf_threshold: ``T_n``; derived from the noise scales if omitted.
            center: Public SimHash centre ``c`` (e.g. mean of last round's
                global centroids); the origin if omitted. May be reassigned
                between releases.
            clustering: ``"kmeans"`` (weighted spherical k-means) or
                ``"sinkhorn"`` (equal-mass Sinkhorn k-means) on the coreset.
            kmeans_iters: Lloyd iterations of the coreset clustering.
            grid_resolution: Grid steps per radius for the sums (default 50 sqrt(D)).
            budget_split: Fractions used when calibrating from ``epsilon``.
            noise_source: Randomness for the DP noise. Leave unset (the OS
                CSPRNG); tests pass a seeded ``random.Random``.
        """
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
        check_drawable(self.noise, self.grid(MAX_DIMENSION))

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
        """``num_reps`` plus room for the leaf-count noise: :data:`WEIGHT_NOISE_SCALES` of its scale.

        The weights are the kept leaves' noisy counts, whose discrete-Laplace
        noise has no upper bound; an honest total above this needs the kept
        leaves' noise to add up to a thousand times its scale.
        """
        noise = cls(**params).noise
        return float(num_reps) + WEIGHT_NOISE_SCALES / noise.leaf_count_parameter

    def privacy_events(self) -> tuple[PrivacyEvent, ...]:
        """What one release costs, for the run's ledger."""
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

    def coreset(
        self, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator
    ) -> Coreset:
        """Steps 1-4: the private part. Consumes ``max_depth * D`` normals of ``generator``."""
        n, dim = reps.shape
        source = self.noise_source if self.noise_source is not None else secure_source()
        hyperplanes = torch.randn(self.max_depth, dim, generator=generator, dtype=torch.float64)
        center = torch.zeros(dim, dtype=torch.float64) if self.center is None else self.center.double().cpu()
        x = clip_to_radius(reps.detach().double().cpu(), self.radius)
        codes = simhash_prefix_codes(x, hyperplanes, center) if n else np.zeros((0, self.max_depth + 1), np.int64)
        tree = grow_tree(
            codes,
            max_depth=self.max_depth,
            tree_count_parameter=self.noise.tree_count_parameter,
            thresholds_for_root=lambda root: self.thresholds(root_count=root, num_centroids=num_centroids, dim=dim),
            source=source,
        )
        membership = leaf_membership(codes, tree)
        noisy_counts, noisy_sums = noisy_leaf_statistics(
            x, membership, len(tree.leaf_codes), grid=self.grid(dim), noise=self.noise, source=source
        )
        points, weights = coreset_points(noisy_counts, noisy_sums, self.radius)
        return Coreset(
            points=points, weights=weights, noisy_counts=noisy_counts, noisy_sums=noisy_sums, tree=tree,
            leaf_of_row=membership,
        )

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

    def release(
        self, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator
    ) -> Release:
        return self.release_with_members(reps, num_centroids=num_centroids, generator=generator)[0]

    def release_with_members(
        self, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator
    ) -> tuple[Release, torch.Tensor]:
        """The release, and for each row the centre its leaf's coreset point is nearest (``-1``: no usable leaf).

        A padding centre (weight 0) has no members. Which centre a coreset
        point "fed" is approximated by the nearest one: the weighted k-means
        that made them ends with that assignment.
        """
        if reps.ndim != 2:
            raise ValueError(f"reps must be [n, D], got shape {tuple(reps.shape)}")
        if reps.shape[1] > MAX_DIMENSION:
            raise ValueError(f"ldp releases representations of at most {MAX_DIMENSION} dimensions, got {reps.shape[1]}")
        if num_centroids < 1:
            raise ValueError(f"num_centroids must be >= 1, got {num_centroids}")
        n, dim = reps.shape
        coreset = self.coreset(reps, num_centroids=num_centroids, generator=generator)
        centres, weights = self.cluster(coreset, num_centroids=num_centroids, dim=dim, generator=generator)
        real = int((weights > 0).sum())
        release = Release(
            vectors=centres.to(reps.dtype if reps.is_floating_point() else torch.float32),
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
