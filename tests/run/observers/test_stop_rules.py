"""The stop rules: the first stop stands, a spent budget outranks it, and each rule fires on its own condition."""

from __future__ import annotations

from privfed.orchestra.round_report import RoundReport
from privfed.run.interruption import StopRequest
from privfed.run.observers.stop_rules import StopRules
from privfed.run.plan import plan_run
from privfed.run.stop import BUDGET, INTERRUPTED, NO_UPDATES, RUNTIME_ENDED, UNUSABLE_ROUND
from tests.run.observers.small_run import finished, ledger_of


def rules_for(config, tmp_path, request: StopRequest | None = None) -> tuple[StopRules, list[dict]]:
    plan = plan_run(config.replace(out=str(tmp_path / "run")))
    events: list[dict] = []
    return StopRules(plan, ledger_of(plan), request=request, emit=events.append, killed_round=None), events


def round_(index: int, *, completed: int = 2, dropped: str | None = None, unusable: str | None = None) -> RoundReport:
    return RoundReport(round=index, completed=completed, failures=2 - completed, seconds=0.1, server_stats={},
                       sampled_clients=(0, 1), update_dropped=dropped, unusable=unusable)


def test_an_unusable_round_stops_the_run_with_the_runtimes_reason_and_the_first_stop_stands(tiny_config, tmp_path):
    request = StopRequest()
    rules, events = rules_for(tiny_config.replace(rounds=3), tmp_path, request)
    rules.after_round(finished(round_(1, completed=0, unusable="round 1: no usable reply (2 failed, 0 rejected)")))
    request.request("interrupted by SIGINT")
    rules.after_metrics(finished(round_(1, completed=0)))
    assert (rules.stop.cause, rules.stop.round, rules.reason) == (UNUSABLE_ROUND, 1, "round 1: no usable reply (2 failed, 0 rejected)")
    assert events == [{"event": "stop", "reason": rules.reason, "cause": UNUSABLE_ROUND}]


def test_three_training_rounds_without_an_update_stop_the_run_and_an_applied_one_resets_the_count(tiny_config, tmp_path):
    rules, _ = rules_for(tiny_config.replace(rounds=9), tmp_path)
    for index, dropped in enumerate(["halted", "halted", None, "halted", "overflow"], start=1):
        rules.after_round(finished(round_(index, dropped=dropped)))
    assert rules.stop is None and rules.dropped == ["halted", "overflow"]
    rules.after_round(finished(round_(6, dropped="halted")))
    assert rules.stop.cause == NO_UPDATES and rules.reason.startswith("rounds 4 to 6 applied no model update (halted; overflow)")


def test_ctrl_c_stops_after_the_round_but_not_after_the_last(tiny_config, tmp_path):
    request = StopRequest()
    request.request("interrupted by SIGINT")
    rules, _ = rules_for(tiny_config.replace(rounds=2), tmp_path, request)
    rules.after_round(finished(round_(2)))
    rules.after_metrics(finished(round_(2)))
    assert rules.stop is None
    rules.after_metrics(finished(round_(1)))
    assert rules.stop.cause == INTERRUPTED and rules.reason == "interrupted by SIGINT; stopped after round 1"


def test_a_spent_budget_outranks_an_earlier_stop(tiny_config, tmp_path):
    rules, events = rules_for(tiny_config.replace(mechanism="ldp", epsilon=2.0, rounds=3), tmp_path)
    object.__setattr__(rules.plan.privacy, "budget", 1e-9)  # any further release would exceed it
    rules.after_round(finished(round_(1, completed=0)))
    assert rules.stop.cause == BUDGET and [e["cause"] for e in events] == [UNUSABLE_ROUND, BUDGET]


def test_a_runtime_that_ends_early_is_a_stop_and_the_figures_survive_a_resume(tiny_config, tmp_path):
    rules, _ = rules_for(tiny_config.replace(rounds=3), tmp_path)
    rules.after_round(finished(round_(1)))
    rules.after_round(finished(round_(2, dropped="halted")))
    rules.at_end(2)
    assert rules.stop.cause == RUNTIME_ENDED and rules.reason == "the runtime ended after round 2 of 3"
    again, _ = rules_for(tiny_config.replace(rounds=3), tmp_path / "again")
    again.restore(rules.figures(), round_index=3)  # no round left: the run ends as it stopped
    assert again.stop == rules.stop and again.dropped == ["halted"]


def test_a_runtime_that_ends_early_having_applied_no_update_is_a_failed_run(tiny_config, tmp_path):
    rules, _ = rules_for(tiny_config.replace(rounds=3), tmp_path)
    rules.after_round(finished(round_(1, dropped="halted")))
    rules.at_end(1)
    assert rules.stop.cause == NO_UPDATES
    assert rules.reason.startswith("the runtime ended after round 1 of 3; round 1 applied no model update")
