import pytest
from flwr.server.workflow import SecAggPlusWorkflow

from privfed.config import build_config
from privfed.errors import PrivfedError
from privfed.secagg.settings import default_num_shares, default_threshold, secagg_settings


def settings(num_clients: int, participation: float = 1.0, **kwargs):
    config = build_config(num_clients=num_clients, participation=participation, num_global_centroids=2, **kwargs)
    return secagg_settings(config, [10, 50, 25])


@pytest.mark.parametrize("sampled, shares", [(2, 2), (5, 5), (20, 20), (50, 17), (200, 23)])
def test_default_shares_cover_small_rounds_and_grow_logarithmically(sampled, shares):
    assert default_num_shares(sampled) == shares
    assert shares == sampled or shares % 2 == 1


def test_default_threshold_is_a_strict_majority():
    assert [default_threshold(n) for n in (2, 3, 5, 17)] == [2, 2, 3, 9]


def test_settings_follow_the_sampled_clients_and_the_largest_client():
    s = settings(10, 0.5)
    assert (s.num_shares, s.reconstruction_threshold, s.tolerated_dropouts) == (5, 3, 2)
    assert s.max_weight == 50.0
    assert settings(4, 1.0, secagg=False) is None


@pytest.mark.parametrize("sampled, shares, threshold", [(2, 2, 2), (3, 3, 2), (7, 5, 3), (50, 17, 9)])
def test_flower_runs_exactly_the_requested_shares_and_threshold(sampled, shares, threshold):
    s = settings(sampled, 1.0, secagg_shares=shares, secagg_threshold=threshold)
    workflow = SecAggPlusWorkflow(**s.workflow_arguments(sampled))  # passes Flower's own checks
    # Flower's runtime rule for fractional settings (secaggplus_workflow.setup_stage).
    flower_shares = round(workflow.num_shares * sampled)
    if flower_shares <= 2:
        flower_shares = sampled
    assert flower_shares == shares
    assert max(round(workflow.reconstruction_threshold * flower_shares), 2) == threshold


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_clients": 4, "participation": 0.25}, "at least 2 clients per round"),
        ({"num_clients": 6, "secagg_shares": 4}, "odd number"),
        ({"num_clients": 6, "secagg_shares": 7}, "odd number"),
        ({"num_clients": 6, "secagg_threshold": 7}, "between 2"),
        ({"num_clients": 6, "secagg_threshold": 1}, "between 2"),
        ({"num_clients": 6, "secagg_clipping_range": 0.0}, "clipping.range"),  # the range check names the field
        ({"num_clients": 6, "secagg_clipping_range": 3.0}, "power of two"),
    ],
)
def test_unusable_settings_are_refused_with_the_reason(kwargs, message):
    num_clients = kwargs.pop("num_clients")
    participation = kwargs.pop("participation", 1.0)
    with pytest.raises(PrivfedError, match=message):
        settings(num_clients, participation, **kwargs)
