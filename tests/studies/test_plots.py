"""A study's pictures: drawn from the settings' means and spreads, and only when the study has the data."""

from __future__ import annotations

import matplotlib.image
import numpy as np
import pytest

from privfed.studies.plots import (
    plot_accuracy_by_setting,
    plot_accuracy_vs_attack,
    plot_accuracy_vs_epsilon,
    setting_labels,
    setting_points,
    write_study_plots,
)
from privfed.studies.runner import CellRecord


def privacy_study() -> list[CellRecord]:
    records = []
    settings = [("mechanism-reps", "reps", None, 0.40), ("mechanism-kanon", "kanon", None, 0.38),
                ("mechanism-ldp_epsilon-10", "ldp", 10.0, 0.36), ("mechanism-ldp_epsilon-1", "ldp", 1.0, 0.33)]
    for name, mechanism, budget, accuracy in settings:
        overrides = {"mechanism": mechanism, **({"epsilon": budget} if budget is not None else {})}
        for seed in (0, 1, 2):
            row = {"mechanism": mechanism, "epsilon_budget": budget, "linear": accuracy + seed / 100, "knn": 0.3,
                   # DP releases cannot be replayed: no member figure for ldp, only the client one.
                   "attack_advantage_psnr": None if mechanism == "ldp" else (3.0 if mechanism == "reps" else 0.5) - seed / 10,
                   "attack_advantage_psnr_client": 0.2 - seed / 10}
            records.append(CellRecord(name, seed, row, None, 1.0, overrides=overrides))
    records.append(CellRecord("mechanism-ldp_epsilon-1", 3, None, "RuntimeError: failed", 1.0,
                              overrides={"mechanism": "ldp", "epsilon": 1.0}))
    return records


def assert_a_real_picture(path, size=(440, 640)):
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[:2] == size
    assert np.std(pixels[..., :3]) > 0.05  # not blank


def test_a_setting_point_is_the_mean_and_spread_of_its_finished_seeds():
    (point,) = [p for p in setting_points(privacy_study(), "epsilon_budget", "linear") if p.name.endswith("epsilon-1")]
    assert point.x == 1.0 and point.x_std == 0.0
    assert abs(point.y - 0.34) < 1e-9 and abs(point.y_std - 0.01) < 1e-9  # the failed seed is left out


def test_every_picture_is_drawn_for_a_privacy_study(tmp_path):
    drawn = write_study_plots(privacy_study(), tmp_path)
    assert [p.name for p in drawn] == ["accuracy-by-setting.png", "accuracy-vs-epsilon.png", "accuracy-vs-attack.png"]
    assert_a_real_picture(drawn[0], size=(340, 640))  # a row per setting
    assert_a_real_picture(drawn[1])
    assert_a_real_picture(drawn[2], size=(440, 1100))  # a panel per attack figure


@pytest.mark.filterwarnings("ignore:No artists with labels")  # errorbar is replaced by a recorder
def test_the_attack_picture_puts_a_setting_in_every_panel_that_has_its_figure(tmp_path, monkeypatch):
    import matplotlib.axes

    drawn = []
    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", lambda self, x, y, **kw: drawn.append((id(self), kw["label"], x)))
    plot_accuracy_vs_attack(privacy_study(), tmp_path / "a.png")
    panels = list(dict.fromkeys(axis for axis, _, _ in drawn))
    by_panel = [[(label, x) for axis, label, x in drawn if axis == panel] for panel in panels]
    assert [label for label, _ in by_panel[0]] == ["reps", "kanon"]  # ldp's members are unknown
    assert [label for label, _ in by_panel[1]] == ["reps", "kanon", "ldp, ε=10", "ldp, ε=1"]
    assert by_panel[0][0][1] == pytest.approx(2.9) and by_panel[1][2][1] == pytest.approx(0.1)


def test_a_study_without_budgets_or_attacks_draws_only_its_settings_accuracy(tmp_path):
    records = [CellRecord(f"method-{m}", 0, {"mechanism": None, "epsilon_budget": None, "linear": 0.3}, None, 1.0)
               for m in ("simclr", "byol")]
    assert plot_accuracy_vs_epsilon(records, tmp_path / "e.png") is None
    assert plot_accuracy_vs_attack(records, tmp_path / "a.png") is None
    assert [p.name for p in write_study_plots(records, tmp_path)] == ["accuracy-by-setting.png"]


def test_nothing_is_drawn_without_an_accuracy(tmp_path):
    records = [CellRecord("method-simclr", 0, None, "RuntimeError: failed", 1.0),
               CellRecord("method-byol", 0, {"method": "byol", "linear": None}, None, 1.0)]
    assert write_study_plots(records, tmp_path) == []


@pytest.mark.filterwarnings("ignore:No artists with labels")  # barh is replaced by a recorder
def test_the_settings_picture_has_a_bar_per_setting_and_accuracy_and_the_untrained_network_as_lines(tmp_path, monkeypatch):
    import matplotlib.axes

    records = [CellRecord(f"method-{method}", seed, {"knn": base + seed / 100, "linear": base + 0.1, "knn_init": 0.25,
                                                     "linear_init": 0.3 + seed / 100}, None, 1.0)
               for method, base in (("orchestra", 0.3), ("simclr", 0.2)) for seed in (0, 1, 2)]
    records.append(CellRecord("method-byol", 0, {"knn": 0.28, "linear": None, "knn_init": 0.27, "linear_init": None}, None, 1.0))
    bars, lines = [], []
    monkeypatch.setattr(
        matplotlib.axes.Axes, "barh", lambda self, y, width, **kw: bars.append((kw["label"], list(y), list(width), kw["xerr"]))
    )
    monkeypatch.setattr(matplotlib.axes.Axes, "axvline", lambda self, x, **kw: lines.append((kw["label"], x)))
    plot_accuracy_by_setting(records, tmp_path / "s.png")
    (knn_label, knn_rows, knn, knn_std), (linear_label, linear_rows, linear, _) = bars
    assert knn_label.startswith("kNN") and linear_label.startswith("linear")
    assert knn == pytest.approx([0.31, 0.21, 0.28]) and knn_std == pytest.approx([0.01, 0.01, 0.0])
    assert linear == pytest.approx([0.4, 0.3])  # byol has no linear probe: no bar
    assert len(linear_rows) == 2 and all(k < lin < k + 1 for k, lin in zip(knn_rows, linear_rows))  # side by side per row
    assert lines == [("kNN monitor, untrained network", pytest.approx((0.25 + 0.25 + 0.27) / 3)),
                     ("linear probe, untrained network", pytest.approx(0.31))]  # byol has no untrained probe


def test_settings_that_differ_in_more_than_epsilon_get_lines_of_their_own(tmp_path, monkeypatch):
    records = []
    for method, base in (("orchestra", 0.7), ("rotpred", 0.4)):
        for budget in (1.0, 10.0):
            row = {"mechanism": "ldp", "epsilon_budget": budget, "linear": base + budget / 100}
            records.append(CellRecord(f"method-{method}_mechanism-ldp_epsilon-{budget:g}", 0, row, None, 1.0,
                                      overrides={"method": method, "mechanism": "ldp", "epsilon": budget}))
        records.append(CellRecord(f"method-{method}_mechanism-kanon", 0,
                                  {"mechanism": "kanon", "epsilon_budget": None, "linear": base}, None, 1.0,
                                  overrides={"method": method, "mechanism": "kanon"}))
    import matplotlib.axes

    drawn_lines, drawn_references = [], []
    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar",
                        lambda self, x, y, **kw: drawn_lines.append((kw["label"], list(y), kw["linestyle"])))
    original = matplotlib.axes.Axes.axhline
    monkeypatch.setattr(matplotlib.axes.Axes, "axhline",
                        lambda self, y, **kw: drawn_references.append((kw["label"], y)) or original(self, y, **kw))
    plot_accuracy_vs_epsilon(records, tmp_path / "e.png")
    assert [label for label, _, _ in drawn_lines] == ["orchestra, ldp", "rotpred, ldp"]
    assert [values for _, values, _ in drawn_lines] == [pytest.approx([0.71, 0.8]), pytest.approx([0.41, 0.5])]
    assert {style for _, _, style in drawn_lines} == {"none"}  # markers, no line joining separate settings
    assert drawn_references == [("orchestra, kanon (no ε)", 0.7), ("rotpred, kanon (no ε)", 0.4)]


def test_a_record_without_its_options_is_labelled_by_its_name():
    records = [CellRecord("mechanism-ldp_epsilon-1", 0, {"linear": 0.3}, None, 1.0)]
    assert setting_labels(records) == {"mechanism-ldp_epsilon-1": ("mechanism-ldp_epsilon-1", "mechanism-ldp")}


def test_the_epsilon_axis_has_a_tick_at_each_budget_of_the_study(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    ticks = []
    original = Figure.savefig
    monkeypatch.setattr(Figure, "savefig",
                        lambda self, *a, **kw: ticks.append(list(self.axes[0].get_xticks())) or original(self, *a, **kw))
    plot_accuracy_vs_epsilon(privacy_study(), tmp_path / "e.png")
    assert ticks == [[1.0, 10.0]]
    assert_a_real_picture(tmp_path / "e.png")


def test_drawing_leaves_the_matplotlib_backend_alone(tmp_path):
    """A notebook's inline backend must survive a study's pictures (a Figure each, never pyplot)."""
    import matplotlib

    before = matplotlib.get_backend()
    matplotlib.use("svg")
    try:
        drawn = write_study_plots(privacy_study(), tmp_path)
        assert matplotlib.get_backend() == "svg" and len(drawn) == 3
    finally:
        matplotlib.use(before)
    for path in drawn:
        assert np.std(matplotlib.image.imread(path)[..., :3]) > 0.05
