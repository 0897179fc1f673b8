"""The release floors docs/privacy.md quotes ("Where local DP stops carrying signal"), computed by the mechanisms."""

from __future__ import annotations

import pytest

from mechanisms.ldp import LshCoresetMechanism
from mechanisms.ldp_sums import LdpSumsMechanism


@pytest.mark.parametrize("delta,per_release_one,total_one_over_21", [(1e-3, 142, 629), (1e-6, 243, 1042)])
def test_ldps_threshold_t_n_is_what_the_docs_say(delta, per_release_one, total_one_over_21):
    one = LshCoresetMechanism(**LshCoresetMechanism.calibrate(epsilon=1.0, delta=delta, num_releases=1))
    total = LshCoresetMechanism(**LshCoresetMechanism.calibrate(epsilon=1.0, delta=delta, num_releases=21))
    assert one.rows_per_vector(rows=128, dim=512, num_centroids=8) == pytest.approx(per_release_one, rel=0.01)
    assert total.rows_per_vector(rows=128, dim=512, num_centroids=8) == pytest.approx(total_one_over_21, rel=0.01)


@pytest.mark.parametrize("delta,unsampled,half", [(1e-3, 72, 50), (1e-6, 117, 83)])
def test_ldp_sums_count_threshold_at_a_total_epsilon_of_one_is_what_the_docs_say(delta, unsampled, half):
    def threshold(rate: float) -> float:
        params = LdpSumsMechanism.calibrate(epsilon=1.0, delta=delta, num_releases=21, sampling_rate=rate)
        return LdpSumsMechanism(**params).threshold

    assert threshold(1.0) == pytest.approx(unsampled, rel=0.02)
    assert threshold(0.5) == pytest.approx(half, rel=0.02)
