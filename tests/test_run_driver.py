"""The server-side driver charges what it planned, and refuses replies that contradict the plan or the mechanism."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from mechanisms import Guarantee, PrivacyEvent, Release, create_mechanism
from privfed.orchestra.round_report import RoundReport
from privfed.run_driver import RunDriver
from privfed.run_plan import plan_run


def started(config) -> RunDriver:
    driver = RunDriver(plan_run(config))
    driver.start()
    return driver


def report(*releases: tuple[int, Release]) -> RoundReport:
    return RoundReport(round=0, completed=len(releases), failures=0, seconds=0.1, server_stats={},
                       sampled_clients=tuple(client for client, _ in releases), releases=list(releases))


def vectors(n: int = 4, dim: int = 16) -> torch.Tensor:
    return F.normalize(torch.randn(n, dim, generator=torch.Generator().manual_seed(n)), dim=1)


@pytest.fixture
def ldp_driver(tiny_config, tmp_path) -> RunDriver:
    return started(tiny_config.replace(mechanism="ldp", epsilon=2.0, out=str(tmp_path / "run")))


def honest_ldp_release(driver: RunDriver) -> Release:
    mechanism = create_mechanism("ldp", **driver.plan.privacy.params)
    return mechanism.release(vectors(32), num_centroids=4, generator=torch.Generator().manual_seed(0))


def ledger_lines(driver: RunDriver) -> list[dict]:
    return [json.loads(line) for line in (driver.run_dir.path / "ledger.jsonl").read_text().splitlines()]


def test_an_honest_release_is_charged_the_planned_events(ldp_driver):
    ldp_driver.on_round_end(report((1, honest_ldp_release(ldp_driver))))
    (entry,) = ledger_lines(ldp_driver)
    planned = [{"name": e.name, "params": e.params} for e in ldp_driver.plan.privacy.per_release_events]
    assert entry["client"] == 1 and entry["events"] == planned
    assert ldp_driver.ledger.worst_case_summary().epsilon > 0


@pytest.mark.parametrize("events", [(), (PrivacyEvent("gaussian", {"noise_multiplier": 50.0, "count": 2.0}),)])
def test_a_release_reporting_other_costs_than_planned_is_refused(ldp_driver, events):
    honest = honest_ldp_release(ldp_driver)
    cheap = Release(honest.vectors, honest.weights, honest.guarantee, events=events)
    with pytest.raises(RuntimeError, match="client 3 reports release costs"):
        ldp_driver.on_round_end(report((3, cheap)))
    assert not (ldp_driver.run_dir.path / "ledger.jsonl").exists()


def test_a_release_claiming_another_kind_of_guarantee_is_refused(ldp_driver):
    honest = honest_ldp_release(ldp_driver)
    claimed = Release(honest.vectors, honest.weights, Guarantee(kind="k-anonymity", statement="k=50", k=50), honest.events)
    with pytest.raises(RuntimeError, match="claims 'k-anonymity', but ldp declares 'differential-privacy'"):
        ldp_driver.on_round_end(report((0, claimed)))


def test_k_counts_only_for_released_vectors_and_never_exceeds_their_weights(tiny_config, tmp_path):
    driver = started(tiny_config.replace(kanon_min_k=2, out=str(tmp_path / "run")))
    overclaimed = Release(vectors(), torch.tensor([3.0, 9.0, 9.0, 9.0]), Guarantee(kind="k-anonymity", statement="", k=8))
    empty = Release(torch.zeros(0, 16), torch.zeros(0), Guarantee(kind="k-anonymity", statement="", k=0))
    driver.on_round_end(report((0, overclaimed), (1, empty)))
    assert driver.ledger.min_k == 3
    assert [line["guarantee"]["k"] for line in ledger_lines(driver)] == [3, None]
    # the round's log shows the k the server charged, not the k the client claimed
    (round_line,) = driver.run_dir.metrics()
    assert round_line["min_k"] == 3


def test_a_release_below_the_runs_min_k_is_refused(tiny_config, tmp_path):
    driver = started(tiny_config.replace(out=str(tmp_path / "run")))  # kanon, min_k 5
    assert driver.plan.privacy.params == {"min_k": 5}
    small = Release(vectors(), torch.tensor([4.0, 9.0, 9.0, 9.0]), Guarantee(kind="k-anonymity", statement="", k=4))
    with pytest.raises(RuntimeError, match="below the run's min_k 5"):
        driver.on_round_end(report((0, small)))


def test_a_k_claim_from_a_mechanism_that_is_not_k_anonymous_is_ignored(tiny_config, tmp_path):
    driver = started(tiny_config.replace(mechanism="reps", out=str(tmp_path / "run")))
    claimed = Release(vectors(), torch.ones(4), Guarantee(kind="none", statement="", k=1000))
    driver.on_round_end(report((0, claimed)))
    assert driver.ledger.min_k is None


def test_k_never_exceeds_the_clients_size_over_its_vectors(tiny_config, tmp_path):
    driver = started(tiny_config.replace(out=str(tmp_path / "run")))  # kanon
    client = min(range(tiny_config.num_clients), key=lambda c: driver.plan.client_sizes[c])
    bound = driver.plan.client_sizes[client] // 4
    inflated = Release(vectors(), torch.full((4,), 10_000.0), Guarantee(kind="k-anonymity", statement="", k=10_000))
    driver.on_round_end(report((client, inflated)))
    assert driver.ledger.min_k == bound < 10_000


def test_a_training_round_without_its_dp_sgd_cost_is_refused(tiny_config, tmp_path):
    driver = started(tiny_config.replace(dp_sgd=True, out=str(tmp_path / "run")))
    release = Release(vectors(), torch.full((4,), 8.0), Guarantee(kind="k-anonymity", statement="", k=8))
    base = report((0, release))
    silent = RoundReport(round=1, completed=1, failures=0, seconds=0.1, server_stats={}, sampled_clients=(0,),
                         releases=base.releases, training_events=[(0, ())])
    with pytest.raises(RuntimeError, match="client 0 reports DP-SGD costs"):
        driver.on_round_end(silent)
