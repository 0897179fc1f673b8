"""``curves.png`` and ``privfed plot``: a picture of the right size that actually shows the runs' curves."""

from __future__ import annotations

import json

import numpy as np
import pytest
from matplotlib.image import imread

from privfed.config import build_config
from privfed.run.curves import (
    DPI,
    FIGURE_WIDTH,
    PANELS,
    RunCurves,
    curves_title,
    panels_with_data,
    plot_curves,
    run_label,
    save_run_curves,
)
from privfed.run.directory import RunDirectory


def fake_run(path, *, seed, epsilon=None, rounds=6, losses=True) -> RunDirectory:
    """A run directory with a config and a plausible round log (no training needed to draw it)."""
    overrides = {"mechanism": "ldp", "epsilon": epsilon} if epsilon is not None else {}
    run = RunDirectory(path)
    run.create(build_config(seed=seed, out=str(path), **overrides))
    rng = np.random.default_rng(seed)
    for r in range(rounds + 1):
        record = {"round": r, "round_seconds": 5 + rng.random()}
        if losses:
            record.update(cluster_loss=2.7 - 0.01 * r, rotation_loss=1.4 - 0.02 * r)
        if r % 2 == 0:
            record["knn_accuracy"] = 0.3 + 0.01 * r
        if epsilon is not None:
            record["privacy_epsilon"] = epsilon * (r + 1) / (rounds + 1)
        run.append_metrics(record)
    return run


def drawn_pixels(path) -> np.ndarray:
    image = imread(path)
    assert image.shape[1] == int(FIGURE_WIDTH * DPI) and image.shape[0] > 300
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
    assert [c.label for c in curves] == ["orchestra, ldp ε=1, seed 0", "orchestra, kanon, seed 1"]
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
    assert run_label(config) == "orchestra, ldp-sums ε=10, seed 2"
    per_release = config.replace(epsilon=None, epsilon_per_release=0.5)
    assert run_label(per_release) == "orchestra, ldp-sums ε=0.5/release, seed 2"
    assert curves_title([per_release.replace(dp_sgd=True)]).endswith("mechanism ldp-sums ε=0.5/release, DP-SGD · seed 2")


def test_a_panel_no_run_logged_is_left_out_not_drawn_empty(tmp_path):
    """A kanon run has no ε and, by default, no client losses: two panels in one row, not four with two empty."""
    kanon = fake_run(tmp_path / "kanon", seed=0, losses=False)
    ldp = fake_run(tmp_path / "ldp", seed=0, epsilon=1.0)
    assert [p.ylabel for p in panels_with_data([RunCurves.of(kanon.path)])] == ["accuracy", "seconds"]
    assert len(panels_with_data([RunCurves.of(ldp.path)])) == 4
    assert len(panels_with_data([RunCurves.of(kanon.path), RunCurves.of(ldp.path)])) == 4  # any run's data keeps a panel
    one_row, two_rows = imread(save_run_curves(kanon)), imread(save_run_curves(ldp))
    assert one_row.shape[0] < 0.7 * two_rows.shape[0]


def test_the_title_names_the_dataset_method_and_mechanism_not_the_folder(tmp_path):
    config = build_config(dataset="arrays:../shared/data/cifar10-dev.npz", mechanism="ldp", epsilon=0.8, seed=3)
    assert curves_title([config]) == "dataset cifar10-dev (arrays) · method orchestra · mechanism ldp ε=0.8 · seed 3"
    kanon = build_config(dataset="arrays:../shared/data/cifar10-dev.npz", method="rotpred", mechanism="kanon")
    assert curves_title([config, kanon]) == "dataset cifar10-dev (arrays) · method: see legend · mechanism: see legend"
    assert curves_title([build_config(method="simclr")]).endswith("method simclr · mechanism none · seed 0")


def test_drawing_leaves_the_matplotlib_backend_alone(tmp_path):
    """A notebook's inline backend must survive a library call that draws (no matplotlib.use, no pyplot)."""
    import matplotlib

    before = matplotlib.get_backend()
    matplotlib.use("svg")  # a backend other than Agg, as a notebook's inline one is
    try:
        path = save_run_curves(fake_run(tmp_path / "run", seed=0, epsilon=1.0))
        assert matplotlib.get_backend() == "svg" and matplotlib.rcParams["backend"] == "svg"
        assert (drawn_pixels(path) < 0.9).any(axis=-1).mean() > 0.02
    finally:
        matplotlib.use(before)
