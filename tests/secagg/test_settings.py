import pytest
from flwr.server.workflow import SecAggPlusWorkflow

from privfed.config import build_config
from privfed.errors import PrivfedError
from privfed.secagg.settings import default_num_shares, default_threshold, secagg_settings


def settings(num_clients: int, participation: float = 1.0, **kwargs):
    config = build_config(num_clients=num_clients, participation=participation, num_global_centroids=2, **kwargs)
    return secagg_settings(config, [10, 50, 25])


@pytest.mark.parametrize("sampled", [2, 5, 20, 50, 200])
def test_by_default_every_sampled_client_shares_keys_with_all_others(sampled):
    """Nodes refuse a sparse graph (the server would choose the neighbourhoods), so the default is the complete one."""
    assert default_num_shares(sampled) == sampled


def test_default_threshold_is_the_smallest_strict_majority():
    assert [default_threshold(n) for n in (2, 3, 4, 5, 6, 17, 50)] == [2, 2, 3, 3, 4, 9, 26]
    assert all(2 * default_threshold(n) > n >= 2 * (default_threshold(n) - 1) for n in range(3, 200))


def test_settings_follow_the_sampled_clients_and_the_largest_client():
    s = settings(10, 0.5)
    assert (s.num_shares, s.reconstruction_threshold, s.tolerated_dropouts) == (5, 3, 2)
    assert s.max_weight == 50.0
    assert settings(4, 1.0, secagg=False) is None


@pytest.mark.parametrize(
    "sampled, shares, threshold", [(2, 2, 2), (3, 3, 2), (6, 6, 4), (7, 7, 4), (7, 7, 7), (50, 50, 26), (50, 50, 49)]
)
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
        ({"num_clients": 6, "secagg_shares": 5}, "number of sampled clients"),  # a sparse graph
        ({"num_clients": 6, "secagg_shares": 3}, "number of sampled clients"),
        ({"num_clients": 6, "secagg_shares": 7}, "number of sampled clients"),
        ({"num_clients": 6, "secagg_threshold": 7}, "strict majority"),
        ({"num_clients": 6, "secagg_threshold": 3}, "strict majority"),  # 2t = n: two survivor sets could reach it
        ({"num_clients": 6, "secagg_threshold": 1}, "strict majority"),
        ({"num_clients": 7, "secagg_threshold": 3}, "strict majority"),
        ({"num_clients": 6, "secagg_clipping_range": 0.0}, "clipping.range"),  # the range check names the field
        ({"num_clients": 6, "secagg_clipping_range": 3.0}, "power of two"),
    ],
)
def test_unusable_settings_are_refused_with_the_reason(kwargs, message):
    num_clients = kwargs.pop("num_clients")
    participation = kwargs.pop("participation", 1.0)
    with pytest.raises(PrivfedError, match=message):
        settings(num_clients, participation, **kwargs)
