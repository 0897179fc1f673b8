"""The kNN observer evaluates the server's encoder in due rounds only, and once more for a summary that has none."""

from __future__ import annotations

import torch

from privfed.orchestra.round_report import RoundReport
from privfed.run.observers.monitor import KnnEvaluation, build_monitor
from privfed.run.plan import plan_run
from tests.run.observers.small_run import finished, server_of


def test_the_accuracy_is_logged_every_eval_every_rounds_and_at_the_last(tiny_config, tmp_path):
    config = tiny_config.replace(rounds=3, eval_every=2, out=str(tmp_path / "run"))
    plan = plan_run(config)
    knn = KnnEvaluation(build_monitor(plan, torch.device("cpu")), server_of(config), config)
    logged = {}
    for index in range(4):
        round_ = finished(RoundReport(round=index, completed=1, failures=0, seconds=0.1, server_stats={}))
        knn.after_round(round_)
        logged[index] = round_.metrics.get("knn_accuracy")
    assert [index for index, accuracy in logged.items() if accuracy is not None] == [2, 3]
    assert 0.0 <= logged[3] <= 1.0 and knn.latest == logged[3]
    assert knn.final(3) == logged[3]  # evaluated already: not again
    assert knn.figures() == {"knn_init": None, "last_knn": logged[3]}


def test_a_run_that_trained_no_round_is_evaluated_for_its_summary(tiny_config, tmp_path):
    config = tiny_config.replace(out=str(tmp_path / "run"))
    knn = KnnEvaluation(build_monitor(plan_run(config), torch.device("cpu")), server_of(config), config)
    knn.latest = 2.0  # not an accuracy: final must replace it
    assert 0.0 <= knn.final(0) <= 1.0
