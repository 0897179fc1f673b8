"""The release floors docs/privacy.md quotes ("Where local DP stops carrying signal"), computed by the mechanisms."""

from __future__ import annotations

import pytest

from mechanisms.ldp import LshCoresetMechanism
from mechanisms.ldp_sums import LdpSumsMechanism


def t_n(delta: float, releases: int, *, epsilon: float = 1.0) -> float:
    """ldp's threshold at a total ``epsilon`` over ``releases`` releases, D 512, 128 rows."""
    mechanism = LshCoresetMechanism(**LshCoresetMechanism.calibrate(epsilon=epsilon, delta=delta, num_releases=releases))
    return mechanism.rows_per_vector(rows=128, dim=512, num_centroids=8)


@pytest.mark.parametrize(
    "delta,per_release_one,per_release_half,over_21", [(1e-3, 142, 250, 629), (1e-6, 243, 461, 1042)]
)
def test_ldps_threshold_t_n_is_what_the_docs_say(delta, per_release_one, per_release_half, over_21):
    assert t_n(delta, 1) == pytest.approx(per_release_one, rel=0.01)
    assert t_n(delta, 1, epsilon=0.5) == pytest.approx(per_release_half, rel=0.01)
    assert t_n(delta, 21) == pytest.approx(over_21, rel=0.01)


@pytest.mark.slow
@pytest.mark.parametrize("delta,over_101", [(1e-3, 1377), (1e-6, 2282)])
def test_ldps_threshold_t_n_over_101_releases_is_what_the_docs_say(delta, over_101):
    assert t_n(delta, 101) == pytest.approx(over_101, rel=0.01)


@pytest.mark.parametrize("delta,unsampled,half", [(1e-3, 72, 50), (1e-6, 117, 83)])
def test_ldp_sums_count_threshold_at_a_total_epsilon_of_one_is_what_the_docs_say(delta, unsampled, half):
    def threshold(rate: float) -> float:
        params = LdpSumsMechanism.calibrate(epsilon=1.0, delta=delta, num_releases=21, sampling_rate=rate)
        return LdpSumsMechanism(**params).threshold

    assert threshold(1.0) == pytest.approx(unsampled, rel=0.02)
    assert threshold(0.5) == pytest.approx(half, rel=0.02)
