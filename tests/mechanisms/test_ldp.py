import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.stats import beta

from mechanisms import accounting, available_mechanisms, create_mechanism
from mechanisms.ldp import LshCoresetMechanism, ldp_parameters, leaf_membership
from mechanisms.noise import discrete_laplace_variance

LOOSE = dict(tree_count_parameter=0.5, leaf_count_parameter=0.5, sum_noise_multiplier=1.0)


def clustered(n: int, d: int, k: int = 4, spread: float = 0.1, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    centres = F.normalize(torch.randn(k, d, generator=g), dim=1)
    labels = torch.arange(n) % k
    return F.normalize(centres[labels] + spread * torch.randn(n, d, generator=g), dim=1), centres


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_ldp_is_registered():
    assert "ldp" in available_mechanisms() and "reps" in available_mechanisms()
    assert isinstance(create_mechanism("ldp"), LshCoresetMechanism)


@pytest.mark.parametrize("n", [0, 1, 3, 50, 600])
@pytest.mark.parametrize("eps", [1.0, 10.0])
def test_release_has_exactly_L_unit_centroids_and_dp_metadata(n, eps):
    x, _ = clustered(n, 32)
    mech = create_mechanism("ldp", epsilon=eps, noise_source=random.Random(n))
    release = mech.release(x, num_centroids=8, generator=gen())
    assert release.vectors.shape == (8, 32)
    assert torch.allclose(release.vectors.norm(dim=1), torch.ones(8), atol=1e-5)
    assert (release.weights >= 0).all()
    g = release.guarantee
    assert g.kind == "differential-privacy" and g.epsilon <= eps and g.delta == mech.delta
    assert "differentially private" in g.statement
    assert {e.name for e in release.events} == {"discrete_laplace", "gaussian"}
    assert accounting.epsilon_of(release.events, g.delta) == pytest.approx(g.epsilon, rel=1e-6)
    assert set(release.metrics) >= {"coreset_size", "noisy_num_reps", "padded_centroids"}


def test_empty_coreset_pads_with_generator_vectors_not_data():
    x, _ = clustered(5, 16)
    mech = create_mechanism("ldp", leaf_threshold=1e9, **LOOSE)  # nothing can be kept
    release = mech.release(x, num_centroids=4, generator=gen(3))
    assert release.metrics["coreset_size"] == 0 and release.metrics["padded_centroids"] == 4
    assert torch.equal(release.weights, torch.zeros(4))
    assert (release.vectors @ x.T).abs().max() < 0.99  # not a raw representation


def test_small_coreset_is_padded_by_repeating_released_centres():
    x, _ = clustered(200, 16, k=1, spread=0.05)
    mech = create_mechanism("ldp", branch_threshold=1e9, leaf_threshold=1.0, **LOOSE)  # root is the only leaf
    release = mech.release(x, num_centroids=5, generator=gen())
    assert release.metrics["coreset_size"] == 1
    assert torch.allclose(release.vectors, release.vectors[:1].expand(5, -1))
    assert release.weights[0] > 0 and (release.weights[1:] == 0).all()


def test_coreset_never_reads_the_true_count():
    """Same seeded noise on n=0 and n=1 gives the same tree shape (no early exit on n)."""
    mech = create_mechanism("ldp", epsilon=1.0, noise_source=random.Random(7))
    a = mech.coreset(torch.zeros(0, 8), num_centroids=4, generator=gen())
    mech.noise_source = random.Random(7)
    b = mech.coreset(F.normalize(torch.ones(1, 8), dim=1), num_centroids=4, generator=gen())
    assert a.tree.nodes_queried == b.tree.nodes_queried


def test_noise_actually_drawn_matches_the_calibrated_scale():
    mech = create_mechanism("ldp", epsilon=2.0, branch_threshold=1e12, leaf_threshold=-1e12,
                            noise_source=random.Random(11))
    d = 4000
    x, _ = clustered(300, d, k=3)
    core = mech.coreset(x, num_centroids=4, generator=gen())
    assert len(core.tree.leaf_codes) == 1  # the root
    residual = (core.noisy_sums[0] - x.double().sum(0)).numpy()
    expected = mech.sum_noise_std(d)
    assert expected == pytest.approx(
        mech.noise.sum_noise_multiplier * mech.radius * (1 + math.sqrt(d) / 2 / (50 * math.sqrt(d))), rel=1e-9
    )
    # sample std of 4000 Gaussian residuals: relative SE ~ 1/sqrt(2*4000) = 1.1%
    assert residual.std() == pytest.approx(expected, rel=0.05)
    # leaf counts: many tiny releases, residual variance vs the discrete Laplace's
    small = create_mechanism("ldp", epsilon=2.0, branch_threshold=1e12, leaf_threshold=-1e12,
                             noise_source=random.Random(12))
    y, _ = clustered(20, 2)
    residuals = [small.coreset(y, num_centroids=2, generator=gen()).noisy_counts[0] - 20 for _ in range(1500)]
    var = discrete_laplace_variance(small.noise.leaf_count_parameter)
    assert np.var(residuals) == pytest.approx(var, rel=0.25)  # SE ~ sqrt(5/1500) = 6%


def test_leaves_partition_the_kept_points():
    x, _ = clustered(500, 16, k=6)
    mech = create_mechanism("ldp", leaf_threshold=5.0, branch_threshold=40.0, max_depth=8, **LOOSE)
    core = mech.coreset(x, num_centroids=6, generator=gen())
    codes = __import__("mechanisms.ldp", fromlist=["x"]).simhash_prefix_codes(
        x.double(), torch.randn(8, 16, generator=gen(), dtype=torch.float64), torch.zeros(16, dtype=torch.float64)
    )
    member = leaf_membership(codes, core.tree)
    hits = np.zeros(len(x), dtype=int)
    for level, code in zip(core.tree.leaf_levels, core.tree.leaf_codes):
        hits += codes[:, level] == code
    assert hits.max() <= 1 and (member >= 0).sum() == (hits == 1).sum()
    assert len(core.tree.leaf_codes) >= 6


def test_recovers_well_separated_clusters_with_little_noise():
    x, centres = clustered(4000, 32, k=4, spread=0.05, seed=1)
    mech = create_mechanism("ldp", epsilon=50.0, noise_source=random.Random(0))
    release = mech.release(x, num_centroids=4, generator=gen(2))
    assert (centres @ release.vectors.T).max(dim=1).values.min() > 0.9


def test_sinkhorn_clustering_option_and_bad_arguments():
    x, _ = clustered(400, 16)
    release = create_mechanism("ldp", clustering="sinkhorn", leaf_threshold=2.0, **LOOSE).release(
        x, num_centroids=3, generator=gen()
    )
    assert release.vectors.shape == (3, 16)
    with pytest.raises(ValueError):
        create_mechanism("ldp", tree_count_parameter=0.1)
    with pytest.raises(ValueError):
        create_mechanism("ldp", epsilon=1.0, **LOOSE)


def test_total_budget_parameters_build_a_mechanism_that_composes_to_the_total():
    params = ldp_parameters(3.0, 1e-5, num_releases=4, max_depth=6)
    mech = create_mechanism("ldp", **params)
    release = mech.release(clustered(100, 8)[0], num_centroids=4, generator=gen())
    assert accounting.epsilon_of(release.events * 4, 1e-5, discretisation=1e-5) <= 3.0
    assert release.guarantee.epsilon < 3.0


@pytest.mark.parametrize("total,delta,max_depth", [(0.05, 1e-3, 6), (0.8, 1e-3, 6), (10.0, 1e-3, 6), (0.002, 1e-6, 10),
                                                  (0.8, 1e-2, 2)])
def test_a_release_states_its_own_epsilon_within_half_a_percent_however_small(total, delta, max_depth):
    """Against dp_accounting on a grid whose rounding costs at most 0.1 % of the answer; never below it (to that rounding).

    The smallest budgets are what a fixed grid, or one refinement of it, overstated by 2 to 13 % (helper-20's review).
    """
    from dp_accounting.pld import pld_privacy_accountant

    mech = create_mechanism("ldp", **ldp_parameters(total, delta, num_releases=21, max_depth=max_depth))
    release = mech.release(clustered(100, 8)[0], num_centroids=4, generator=gen())
    stated = release.guarantee.epsilon
    reference = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3 * stated / (2 * max_depth + 4))
    reference.compose(accounting.release_event(mech.noise, tree_levels=mech.tree_levels), 1)
    exact = reference.get_epsilon(delta)
    assert 0.999 * exact <= stated <= 1.005 * exact
    assert f"({stated:.3g}, {delta:.3g})-differentially private" in release.guarantee.statement


def test_a_release_whose_epsilon_rounds_to_zero_states_zero_instead_of_failing():
    mech = create_mechanism("ldp", **ldp_parameters(0.005, 1e-3, num_releases=21, max_depth=1))
    assert mech.release(clustered(100, 8)[0], num_centroids=4, generator=gen()).guarantee.epsilon == 0.0


# --------------------------------------------------------------------------- audit


def _clopper_pearson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    lo = beta.ppf(alpha / 2, successes, trials - successes + 1) if successes > 0 else 0.0
    hi = beta.ppf(1 - alpha / 2, successes + 1, trials - successes) if successes < trials else 1.0
    return float(lo), float(hi)


def epsilon_lower_bound(hits_with: int, hits_without: int, trials: int, delta: float, alpha: float = 0.05) -> float:
    """Lower bound on epsilon (confidence 1 - alpha) from a threshold test's hit rates.

    (eps, delta)-DP forces P[T | D'] <= e^eps P[T | D] + delta for every test T,
    and the same with the complement of T.
    """
    p1_lo, _ = _clopper_pearson(hits_with, trials, alpha / 2)
    _, p0_hi = _clopper_pearson(hits_without, trials, alpha / 2)
    q0_lo, _ = _clopper_pearson(trials - hits_without, trials, alpha / 2)
    _, q1_hi = _clopper_pearson(trials - hits_with, trials, alpha / 2)
    bounds = [0.0]
    if p1_lo - delta > 0:
        bounds.append(math.log((p1_lo - delta) / max(p0_hi, 1e-300)))
    if q0_lo - delta > 0:
        bounds.append(math.log((q0_lo - delta) / max(q1_hi, 1e-300)))
    return max(bounds)


def _audit(mech: LshCoresetMechanism, trials: int) -> float:
    d = 8
    base = F.normalize(
        torch.tensor([1.0] + [0.0] * (d - 1)) + 0.05 * torch.randn(60, d, generator=gen(5)), dim=1
    )
    outlier = -torch.eye(d)[:1]
    neighbour = torch.cat([base, outlier])

    def hit(data: torch.Tensor, seed: int) -> bool:
        release = mech.release(data, num_centroids=4, generator=gen(seed))
        live = release.vectors[release.weights > 0]
        return bool(live.numel()) and float((live @ outlier.T).max()) > 0.5

    with_outlier = sum(hit(neighbour, s) for s in range(trials))
    without = sum(hit(base, s) for s in range(trials))
    return epsilon_lower_bound(with_outlier, without, trials, mech.delta)


def test_empirical_audit_stays_below_the_claimed_epsilon():
    """One far outlier; the attacker asks 'is any released centroid near it?'."""
    mech = create_mechanism("ldp", epsilon=2.0, leaf_threshold=2.0, max_depth=4)  # secure noise
    assert _audit(mech, trials=300) <= mech.epsilon


def test_audit_has_power_against_a_mechanism_with_almost_no_noise():
    weak = create_mechanism(
        "ldp", tree_count_parameter=8.0, leaf_count_parameter=8.0, sum_noise_multiplier=0.2,
        leaf_threshold=0.5, branch_threshold=1.5, max_depth=4,
    )
    assert _audit(weak, trials=150) > 2.0


@pytest.mark.parametrize(
    "key, value, named",
    [
        ("tree_count_parameter", 1e-9, "tree_count_parameter"),
        ("leaf_count_parameter", 2.0**40, "leaf_count_parameter"),
        ("sum_noise_multiplier", 1e12, "sum_noise_multiplier"),  # sigma = z * the sensitivity at 2**16 dimensions
        ("sum_noise_multiplier", float("nan"), "positive and finite"),
    ],
)
def test_noise_the_samplers_cannot_draw_is_refused_when_the_mechanism_is_built(key, value, named):
    """Built, not released: privfed builds the mechanism (plan, client guard) before it charges a release."""
    with pytest.raises(ValueError, match=named):
        create_mechanism("ldp", **{**LOOSE, key: value})


def test_a_release_wider_than_the_checked_dimension_is_refused():
    wide = F.normalize(torch.randn(4, 2**16 + 1, generator=gen()), dim=1)
    with pytest.raises(ValueError, match="at most 65536 dimensions"):
        create_mechanism("ldp", **LOOSE).release(wide, num_centroids=2, generator=gen())
