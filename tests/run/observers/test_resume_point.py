"""The resume point is written after the metrics line, when ``--checkpoint-every`` says so, at a stop and at the end."""

from __future__ import annotations

import torch

from privfed.orchestra.round_report import RoundReport
from privfed.run.observers.resume_point import SaveResumePoint
from privfed.run.plan import plan_run
from privfed.run.resume import RESUME_FILE, read_resume_point
from tests.run.observers.small_run import finished, server_of


def test_points_are_written_when_due_with_the_server_and_the_drivers_figures(tiny_config, tmp_path):
    config = tiny_config.replace(rounds=5, checkpoint_every=2, out=str(tmp_path / "run"))
    plan = plan_run(config)
    plan.run_dir.create(config)
    server = server_of(config)
    stopping = [False]
    points = SaveResumePoint(plan.run_dir, server, config, stopping=lambda: stopping[0], figures=lambda: {"last_loss": 1.5},
                             mechanism_params=plan.privacy.params)
    path = plan.run_dir.checkpoints / RESUME_FILE

    def end_of(index: int) -> int | None:
        round_ = finished(RoundReport(round=index, completed=1, failures=0, seconds=0.1, server_stats={},
                                      runtime_state={"sampling": index}))
        points.after_round(round_)
        assert not path.exists() or read_resume_point(plan.run_dir).round != index  # only after the metrics line
        points.after_metrics(round_)
        return read_resume_point(plan.run_dir).round if path.exists() else None

    assert [end_of(0), end_of(1)] == [0, 0]  # round 1 is not due
    assert end_of(2) == 2
    stopping[0] = True
    assert end_of(3) == 3
    point = read_resume_point(plan.run_dir)
    assert point.driver == {"last_loss": 1.5} and point.runtime == {"sampling": 3}
    assert point.mechanism_params == plan.privacy.params
    assert all(torch.equal(point.network[k], v) for k, v in server.network.state_dict().items())
    stopping[0] = False
    end_of(4)
    assert end_of(5) == 5  # the last round
