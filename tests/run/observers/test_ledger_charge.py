"""The ledger observers charge what the server planned: every release that reached it, then DP-SGD steps."""

from __future__ import annotations

import json

from privfed.orchestra.round_report import Rejection, RoundReport
from privfed.run.observers.ledger_charge import (
    IN_PROGRESS_STATEMENT,
    REJECTED_STATEMENT,
    ChargeReleases,
    ChargeTraining,
)
from privfed.run.plan import plan_run
from tests.run.observers.small_run import finished, ledger_of, mechanism_of, release


def lines(plan) -> list[dict]:
    return [json.loads(line) for line in (plan.run_dir.path / "ledger.jsonl").read_text().splitlines()]


def test_accepted_rejected_and_killed_round_silent_clients_are_each_charged_the_planned_release(tiny_config, tmp_path):
    plan = plan_run(tiny_config.replace(mechanism="ldp", epsilon=2.0, out=str(tmp_path / "run")))
    charge = ChargeReleases(ledger_of(plan), plan, mechanism_of(plan), killed_round=1)
    report = RoundReport(round=1, completed=1, failures=2, seconds=0.1, server_stats={}, sampled_clients=(0, 1, 2, 3),
                         releases=[(0, release())], training_events=[(0, ())],
                         rejected=[Rejection(1, "bad"), Rejection(1, "twice"), Rejection(None, "unasked")])
    charge.after_round(finished(report))
    charged = lines(plan)
    assert [line["client"] for line in charged] == [0, 1, 2, 3]  # 2 and 3 were silent in the killed round
    planned = [{"name": e.name, "params": e.params} for e in plan.privacy.per_release_events]
    assert all(line["events"] == planned for line in charged)
    assert [line["guarantee"]["statement"] for line in charged[1:]] == [REJECTED_STATEMENT] + [IN_PROGRESS_STATEMENT] * 2
    assert charged[0]["guarantee"]["epsilon"] == plan.privacy.epsilon_per_release  # the plan's, not the client's


def test_the_least_k_credited_goes_into_the_metrics_line(tiny_config, tmp_path):
    plan = plan_run(tiny_config.replace(kanon_min_k=2, out=str(tmp_path / "run")))
    charge = ChargeReleases(ledger_of(plan), plan, mechanism_of(plan), killed_round=None)
    round_ = finished(RoundReport(round=0, completed=3, failures=0, seconds=0.1, server_stats={}, sampled_clients=(0, 1, 2),
                                  releases=[(0, release(k=5)), (1, release(k=3)), (2, release(k=None))]))
    charge.after_round(round_)
    assert round_.metrics == {"min_k": 3}
    assert [line["guarantee"]["k"] for line in lines(plan)] == [5, 3, None]


def test_dp_sgd_steps_are_charged_in_training_rounds_and_the_worst_case_is_logged(tiny_config, tmp_path):
    plan = plan_run(tiny_config.replace(dp_sgd=True, out=str(tmp_path / "run")))
    ledger = ledger_of(plan)
    charge = ChargeTraining(ledger, plan, killed_round=None)
    round_0 = finished(RoundReport(round=0, completed=2, failures=0, seconds=0.1, server_stats={}, sampled_clients=(0, 1),
                                   training_events=[(0, ()), (1, ())]))
    charge.after_round(round_0)
    assert not (plan.run_dir.path / "ledger.jsonl").exists()  # round 0 trains nothing
    round_1 = finished(RoundReport(round=1, completed=1, failures=1, seconds=0.1, server_stats={}, sampled_clients=(0, 1),
                                   training_events=[(0, ())], rejected=[Rejection(1, "bad")]))
    charge.after_round(round_1)
    charged = lines(plan)
    assert [(line["client"], line["kind"]) for line in charged] == [(0, "dp_sgd"), (1, "dp_sgd")]
    for line in charged:
        planned = plan.privacy.dp_sgd.round_events(plan.client_sizes[line["client"]])
        assert line["events"] == [{"name": e.name, "params": e.params} for e in planned]
    worst = ledger.worst_case_summary()
    assert worst.epsilon > 0 and round_1.metrics["privacy_epsilon"] == worst.epsilon
    assert round_1.metrics["privacy_dp_sgd_epsilon"] == worst.dp_sgd_worst


def test_a_secure_sum_mechanisms_round_0_charges_nobody_and_its_training_round_every_share(tiny_config, tmp_path):
    plan = plan_run(tiny_config.replace(mechanism="ddp-sums", epsilon=20.0, out=str(tmp_path / "run")))
    charge = ChargeReleases(ledger_of(plan), plan, mechanism_of(plan), killed_round=0)
    quiet = RoundReport(round=0, completed=1, failures=1, seconds=0.1, server_stats={}, sampled_clients=(0, 1, 2),
                        training_events=[(0, ())], rejected=[Rejection(1, "bad")])
    charge.after_round(finished(quiet))  # rejected 1 and silent 2 sent nothing either: no secure sum in round 0
    assert not (plan.run_dir.path / "ledger.jsonl").exists()
    charge.killed_round = None
    charge.after_round(finished(RoundReport(round=1, completed=2, failures=1, seconds=0.1, server_stats={},
                                            sampled_clients=(0, 1, 2), training_events=[(0, ()), (2, ())],
                                            rejected=[Rejection(1, "bad")])))
    assert [line["client"] for line in lines(plan)] == [0, 2, 1]
