"""``--record-releases`` keeps, for each round, the state the server sent (the one before the round) and the releases."""

from __future__ import annotations

import torch

from privfed.orchestra.round_report import RoundReport
from privfed.run.observers.release_recording import RecordReleases
from privfed.run.plan import plan_run
from privfed.run.recording import read_round, recorded_rounds
from tests.run.observers.small_run import finished, mechanism_of, release, server_of


def test_each_round_records_the_state_the_server_sent_before_it(tiny_config, tmp_path):
    config = tiny_config.replace(out=str(tmp_path / "run"), record_releases=True)
    plan = plan_run(config)
    server = server_of(config)
    sent = {k: v.clone() for k, v in server.global_state().items()}
    recorder = RecordReleases(plan.run_dir, server, mechanism_of(plan), plan.privacy.params)
    with torch.no_grad():
        for parameter in server.network.parameters():
            parameter.add_(1.0)  # round 0's update, applied before the round ends
    after_round_0 = {k: v.clone() for k, v in server.global_state().items()}
    recorder.after_round(finished(RoundReport(round=0, completed=1, failures=0, seconds=0.1, server_stats={},
                                              releases=[(3, release(k=8))])))
    recorder.after_round(finished(RoundReport(round=1, completed=0, failures=1, seconds=0.1, server_stats={})))

    assert recorded_rounds(plan.run_dir.releases) == [0, 1]
    first, second = read_round(plan.run_dir.releases, 0), read_round(plan.run_dir.releases, 1)
    assert any(not torch.equal(sent[k], v) for k, v in after_round_0.items())  # the two states differ
    assert all(torch.equal(first.model_state[k], v) for k, v in sent.items())
    assert all(torch.equal(second.model_state[k], v) for k, v in after_round_0.items())
    assert [r.client for r in first.releases] == [3] and first.mechanism == "kanon" and second.releases == ()


def test_a_method_that_releases_nothing_records_nothing(tiny_config, tmp_path):
    config = tiny_config.replace(out=str(tmp_path / "run"))
    plan = plan_run(config)
    RecordReleases(plan.run_dir, server_of(config), None, {}).after_round(
        finished(RoundReport(round=0, completed=1, failures=0, seconds=0.1, server_stats={}))
    )
    assert recorded_rounds(plan.run_dir.releases) == []
