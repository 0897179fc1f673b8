"""``curves.png`` and ``privfed plot``: a picture of the right size that actually shows the runs' curves."""

from __future__ import annotations

import json

import numpy as np
import pytest
from matplotlib.image import imread

from privfed.config import build_config
from privfed.run_curves import DPI, FIGURE_SIZE, PANELS, RunCurves, plot_curves, run_label, save_run_curves
from privfed.runs import RunDirectory


def fake_run(path, *, seed, epsilon=None, rounds=6) -> RunDirectory:
    """A run directory with a config and a plausible round log (no training needed to draw it)."""
    overrides = {"mechanism": "ldp", "epsilon": epsilon} if epsilon is not None else {}
    run = RunDirectory(path)
    run.create(build_config(seed=seed, out=str(path), **overrides))
    rng = np.random.default_rng(seed)
    for r in range(rounds + 1):
        record = {"round": r, "round_seconds": 5 + rng.random(), "cluster_loss": 2.7 - 0.01 * r, "rotation_loss": 1.4 - 0.02 * r}
        if r % 2 == 0:
            record["knn_accuracy"] = 0.3 + 0.01 * r
        if epsilon is not None:
            record["privacy_epsilon"] = epsilon * (r + 1) / (rounds + 1)
        run.append_metrics(record)
    return run


def drawn_pixels(path) -> np.ndarray:
    image = imread(path)
    assert image.shape[:2] == (int(FIGURE_SIZE[1] * DPI), int(FIGURE_SIZE[0] * DPI))
    return image[..., :3]


def test_one_runs_curves_are_drawn_next_to_its_summary(tmp_path):
    run = fake_run(tmp_path / "run", seed=0, epsilon=1.0)
    path = save_run_curves(run)
    assert path == run.path / "curves.png"
    pixels = drawn_pixels(path)
    assert (pixels < 0.9).any(axis=-1).mean() > 0.02  # lines and text, not a blank canvas


def test_two_runs_overlay_in_distinct_colours_with_a_legend_from_their_configs(tmp_path):
    runs = [fake_run(tmp_path / "a", seed=0, epsilon=1.0), fake_run(tmp_path / "b", seed=1)]
    curves = [RunCurves.of(run.path) for run in runs]
    assert [c.label for c in curves] == ["orchestra, ldp eps=1, seed 0", "orchestra, kanon, seed 1"]
    pixels = drawn_pixels(plot_curves(curves, tmp_path / "both.png"))
    one = drawn_pixels(plot_curves(curves[:1], tmp_path / "one.png"))
    colourful = lambda p: (p.max(axis=-1) - p.min(axis=-1) > 0.3).mean()
    assert colourful(pixels) > colourful(one)  # the second run's curves are there too


def test_a_finished_runs_knn_curve_starts_at_the_untrained_encoder(tmp_path):
    run = fake_run(tmp_path / "run", seed=0)
    run.append_metrics({"round": 7, "round_seconds": 5.0})
    metrics = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
    kept = [{k: v for k, v in m.items() if not (m["round"] == 0 and k == "knn_accuracy")} for m in metrics]
    (run.path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in kept))
    run.write_json("summary.json", {"knn_accuracy_init": 0.11})
    rounds, values = RunCurves.of(run.path).series("knn_accuracy")
    assert rounds[0] == 0 and values[0] == pytest.approx(0.11)


def test_a_loss_that_is_off_is_not_drawn_as_zero(tmp_path):
    curves = RunCurves("rotpred", [{"round": r, "cluster_loss": 0.0, "rotation_loss": 1.0} for r in range(3)])
    assert curves.series("cluster_loss") == ([], []) and curves.series("rotation_loss")[0] == [0, 1, 2]


def test_a_run_whose_clients_sent_no_metrics_is_drawn_with_its_loss_panel_saying_why(tmp_path):
    """By default clients send no losses (--report-client-metrics), so metrics.jsonl logs them as null."""
    run = RunDirectory(tmp_path / "run")
    run.create(build_config(out=str(run.path)))
    for r in range(3):
        run.append_metrics({"round": r, "round_seconds": 5.0, "loss": None, "cluster_loss": None, "rotation_loss": None})
    curves = RunCurves.of(run.path)
    assert curves.series("cluster_loss") == ([], []) and curves.series("round_seconds")[0] == [0, 1, 2]
    assert PANELS[1].missing.endswith("--report-client-metrics")
    assert save_run_curves(run) == run.path / "curves.png"


def test_labels_name_what_tells_runs_apart():
    assert run_label(build_config(method="rotpred", seed=2)) == "rotpred, seed 2"
    assert run_label(build_config(mechanism="reps", dp_sgd=True, seed=0)) == "orchestra, reps, DP-SGD, seed 0"


def test_privfed_plot_overlays_two_runs(tmp_path, run_privfed):
    runs = [fake_run(tmp_path / "a", seed=0), fake_run(tmp_path / "b", seed=1)]
    out = tmp_path / "compared.png"
    result = run_privfed("plot", str(runs[0].path), str(runs[1].path), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert (drawn_pixels(out) < 0.9).any(axis=-1).mean() > 0.02


def test_every_dp_mechanism_is_labelled_with_its_epsilon():
    config = build_config(mechanism="ldp-sums", epsilon=10.0, seed=2, out="unused")
    assert run_label(config) == "orchestra, ldp-sums eps=10, seed 2"
