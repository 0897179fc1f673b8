"""The figures the kanon statement and docs/attacks.md quote from the recorded cross-round attacks
(``benchmarks/results/cross_round``, made by ``benchmarks/cross_round_table.py``)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from privfed.privacy.statement import KANON_DIFFERENCING
from tests.benchmarks.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "cross_round"


@pytest.fixture(scope="module")
def table():
    return load_script("cross_round_table", ROOT / "benchmarks" / "cross_round_table.py")


def seeds_of(table, mechanism: str) -> list[dict[int, dict[str, float | None]]]:
    runs = sorted(RESULTS.glob(f"{mechanism}-s*"))
    return [table.figures(run) for run in runs]


def test_the_table_holds_three_seeds_of_every_mechanism_the_issue_names(table):
    for mechanism in ("reps", "kanon", "ldp-sums", "ddp-sums"):
        runs = seeds_of(table, mechanism)
        assert len(runs) >= 3, mechanism
        assert all({2, 20} <= set(run) for run in runs), mechanism


def test_kanon_history_comes_no_closer_than_the_round_alone_as_its_statement_says(table):
    clause = KANON_DIFFERENCING.long
    assert "came on average no closer to its images (PSNR) than that round's release alone" in clause
    assert "re-identified a member at most 1.3 points more often, mean over seeds" in clause
    assert "up to 16" in clause
    runs = seeds_of(table, "kanon")
    for round_index in (2, 20):
        single = statistics.fmean(run[round_index]["single psnr"] for run in runs)
        cross = statistics.fmean(run[round_index]["cross psnr"] for run in runs)
        assert cross <= single, (round_index, cross, single)
        reid_single = statistics.fmean(run[round_index]["single reid"] for run in runs)
        reid_cross = statistics.fmean(run[round_index]["cross reid"] for run in runs)
        assert reid_cross <= reid_single + 0.013, (round_index, reid_cross, reid_single)
    assert all(run[20]["cross psnr"] < run[20]["single psnr"] for run in runs)


def test_the_runs_are_what_their_names_say_and_read_the_documented_history():
    """Each run's mechanism and budget, and the cross-round settings docs/attacks.md gives (window 40, decay 0.5)."""
    for run in RESULTS.iterdir():
        config = json.loads((run / "config.json").read_text())
        assert run.name == f"{config['mechanism']}-s{config['seed']}" and config["rounds"] == 20, run.name
        assert config["record_releases"] and config["secagg"] == (config["mechanism"] == "ddp-sums"), run.name
        if config["mechanism"] in ("ldp-sums", "ddp-sums"):
            assert config["epsilon"] == 10.0, run.name
        cross = run / "attack-cross-round.json"
        if cross.exists():
            attack = json.loads(cross.read_text())["attack"]
            assert (attack["window"], attack["decay"], attack["inverter"]["steps"]) == (40, 0.5, 500), run.name


def test_the_client_model_beats_the_starting_model_in_each_seed_it_ran(table):
    runs = [run for run in seeds_of(table, "kanon") if run[20]["own-model psnr"] is not None]
    assert len(runs) >= 2
    assert all(run[20]["own-model psnr"] > run[20]["single psnr"] for run in runs)


def test_the_docs_tables_are_the_scripts_output(table, capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["cross_round_table.py", str(RESULTS)])
    table.main()
    printed = capsys.readouterr().out
    docs = (ROOT / "docs" / "attacks.md").read_text()
    rows = [line for line in printed.splitlines()  # the docs leave out rows with nothing measured
            if line.startswith("| ") and any(c.strip() != "–" for c in line.strip("|").split("|")[2:])]
    assert rows and all(row in docs for row in rows), [row for row in rows if row not in docs][:3]


def test_the_dp_mechanisms_sit_at_the_null_for_the_clients_that_carry_the_figures(table):
    """Clients with at least memory_size images, and secure sums: the mean over seeds within 0.25 dB of the null.
    Smaller clients give 1 to 4 DP vectors a seed: too few to test (docs/attacks.md)."""
    for mechanism, column in (("ldp-sums", "cross psnr, large"), ("ldp-sums", "single psnr, large"),
                              ("ddp-sums", "single psnr")):
        runs = seeds_of(table, mechanism)
        for round_index in (2, 20):
            mean = statistics.fmean(run[round_index][column] for run in runs)
            assert abs(mean) < 0.25, (mechanism, column, round_index, mean)
            values = [run[round_index][column] for run in runs]
            assert min(values) < 0 < max(values), (mechanism, column, round_index, values)
