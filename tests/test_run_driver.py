"""The server-side driver charges what it planned, for accepted and rejected replies alike (the checks are federation/reply_checks.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

from mechanisms import Guarantee, Release, create_mechanism
from privfed.orchestra.round_report import Rejection, RoundReport
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


def test_a_rejected_reply_from_an_asked_client_is_charged_as_planned_once(ldp_driver):
    rejected = [Rejection(2, "release holds NaN or Inf"), Rejection(2, "more than one reply"), Rejection(None, "node 9")]
    ldp_driver.on_round_end(dataclasses.replace(report((1, honest_ldp_release(ldp_driver))), rejected=rejected))
    lines = ledger_lines(ldp_driver)
    assert [line["client"] for line in lines] == [1, 2]  # the unasked node is nobody's cost
    assert lines[0]["events"] == lines[1]["events"] and "rejected" in lines[1]["guarantee"]["statement"]
    (round_line,) = ldp_driver.run_dir.metrics()
    assert round_line["rejected_replies"] == 3 and round_line["rejection_reasons"][0]["reason"] == "release holds NaN or Inf"


def test_the_k_the_checks_credited_is_the_k_charged(tiny_config, tmp_path):
    driver = started(tiny_config.replace(kanon_min_k=2, out=str(tmp_path / "run")))
    credited = Release(vectors(), torch.tensor([3.0, 9.0, 9.0, 9.0]), Guarantee(kind="k-anonymity", statement="", k=3))
    empty = Release(torch.zeros(0, 16), torch.zeros(0), Guarantee(kind="k-anonymity", statement="", k=None))
    driver.on_round_end(report((0, credited), (1, empty)))
    assert driver.ledger.min_k == 3
    assert [line["guarantee"]["k"] for line in ledger_lines(driver)] == [3, None]
    (round_line,) = driver.run_dir.metrics()
    assert round_line["min_k"] == 3


def test_a_k_claim_from_a_mechanism_that_is_not_k_anonymous_is_ignored(tiny_config, tmp_path):
    driver = started(tiny_config.replace(mechanism="reps", out=str(tmp_path / "run")))
    claimed = Release(vectors(), torch.ones(4), Guarantee(kind="none", statement="", k=1000))
    driver.on_round_end(report((0, claimed)))
    assert driver.ledger.min_k is None


def test_a_training_round_charges_the_planned_dp_sgd_cost_of_every_reply_rejected_ones_included(tiny_config, tmp_path):
    driver = started(tiny_config.replace(dp_sgd=True, out=str(tmp_path / "run")))
    release = Release(vectors(), torch.full((4,), 8.0), Guarantee(kind="k-anonymity", statement="", k=8))
    training = RoundReport(round=1, completed=1, failures=0, seconds=0.1, server_stats={}, sampled_clients=(0, 1),
                           releases=[(0, release)], training_events=[(0, ())], rejected=[Rejection(1, "bad")])
    driver.on_round_end(training)
    charged = [line for line in ledger_lines(driver) if line["kind"] == "dp_sgd"]
    assert [line["client"] for line in charged] == [0, 1]
    for line in charged:
        planned = driver.plan.privacy.dp_sgd.round_events(driver.plan.client_sizes[line["client"]])
        assert line["events"] == [{"name": e.name, "params": e.params} for e in planned]
