"""Presets run from any folder: found by name, shipped in the package, their data paths read against the file."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from privfed.cli import main
from privfed.config import build_config, resolve_preset, shipped_presets
from privfed.data.arrays import ImageArrays, load_npz
from privfed.data.datasets import balanced_subset, load_dataset
from privfed.errors import PrivfedError
from privfed.studies.grid import Study

REPO = Path(__file__).resolve().parents[1]


def write_npz(path: Path, counts: list[int], *, seed: int = 0) -> Path:
    """An image-arrays file with ``counts[c]`` images of class c (uneven on purpose)."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(len(counts)), counts)
    images = rng.integers(0, 256, size=(labels.size, 8, 8, 3), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=images, y=labels)
    return path


def test_the_package_ships_every_preset_and_study() -> None:
    root = resources.files("privfed") / "presets"
    names = {entry.name for entry in root.iterdir()}
    studies = {entry.name for entry in (root / "studies").iterdir()}
    assert {"quick.toml", "cpu-cifar10.toml", "paper-cifar10-cross-device.toml"} <= names
    assert {"privacy-cpu-cifar10.toml", "methods-cpu-cifar10.toml", "tune-cpu-cifar10.toml"} <= studies
    assert (REPO / "configs" / "cpu-cifar10.toml").samefile(shipped_presets()["cpu-cifar10"])  # the checkout's view


def test_the_wheel_carries_the_presets(tmp_path: Path) -> None:
    """Built as pip builds it; `--config NAME` must work from an installed wheel, not only from a checkout."""
    source = tmp_path / "source"  # a copy: setuptools writes build/ and *.egg-info beside the sources
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        source.mkdir(exist_ok=True)
        shutil.copy(REPO / name, source / name)
    for package in ("privfed", "mechanisms", "attacks"):
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(source)],
        check=True, capture_output=True,
    )
    (wheel,) = tmp_path.glob("privfed-*.whl")
    inside = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"privfed/presets/{p.name}" for p in shipped_presets().values()}
    shipped |= {f"privfed/presets/studies/{p.name}" for p in shipped_presets("study").values()}
    assert len(shipped) >= 10 and shipped <= inside


def test_a_preset_name_works_from_any_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert build_config("cpu-cifar10").dataset == "cifar10:5000"
    assert build_config(Path("quick")).dataset == "shapes:1000"  # the CLI hands over a Path
    study = Study.load("privacy-cpu-cifar10")
    assert study.preset == shipped_presets()["cpu-cifar10"]
    assert {cell.config.dataset for cell in study.cells()} == {"cifar10:5000"}


def test_a_path_keeps_working_and_a_bare_file_beats_no_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mine.toml").write_text("rounds = 3\n")
    (tmp_path / "plain").write_text("rounds = 4\n")
    monkeypatch.chdir(tmp_path)
    assert build_config("mine.toml").rounds == 3
    assert build_config(tmp_path / "mine.toml").rounds == 3
    assert build_config("plain").rounds == 4  # not a shipped name, but a file here
    assert resolve_preset("quick") == shipped_presets()["quick"]


def test_an_unknown_name_lists_the_shipped_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main(["train", "--config", "cpu-cifar11"])
    assert stop.value.code == 2
    message = capsys.readouterr().err
    assert "cpu-cifar11" in message and "quick" in message and "cpu-cifar10" in message
    with pytest.raises(PrivfedError, match="privacy-cpu-cifar10"):
        Study.load("privacy")


def test_arrays_paths_in_a_preset_resolve_against_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = write_npz(tmp_path / "presets" / "data" / "tiny.npz", [30, 30])
    preset = tmp_path / "presets" / "tiny.toml"
    preset.write_text('dataset = "arrays:data/tiny.npz"\ntest_dataset = "arrays:./data/tiny.npz"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = build_config(preset)
    assert config.dataset == config.test_dataset == f"arrays:{data.resolve()}"
    assert len(load_dataset(config.dataset, split="train", data_dir=elsewhere)) == 48  # the file's fixed 80 %
    # The command line stays relative to the working directory, and overrides the preset's path.
    assert build_config(preset, dataset="arrays:other.npz").dataset == "arrays:other.npz"
    # A study's [base] and [[grid]] read theirs against the study file, like a preset.
    study = tmp_path / "presets" / "study.toml"
    study.write_text('preset = "tiny.toml"\n[base]\nrounds = 1\n[[grid]]\ntest_dataset = ["arrays:data/tiny.npz"]\n')
    (cell,) = Study.load(study).cells()
    assert cell.config.test_dataset == f"arrays:{data.resolve()}" and cell.config.dataset == config.dataset


def test_a_study_takes_overrides_on_top_of_its_base(tmp_path: Path) -> None:
    """How an offline machine runs a shipped study: its dataset replaced (``privfed study`` can pass it on)."""
    data = write_npz(tmp_path / "dev.npz", [20, 20])
    study = Study.load("tune-cpu-cifar10", overrides={"dataset": f"arrays:{data}", "download": None})
    assert {cell.config.dataset for cell in study.cells()} == {f"arrays:{data}"}


def test_missing_data_names_both_ways_to_get_it(tmp_path: Path) -> None:
    for spec in ("cifar10", "cifar10:5000", "arrays:" + str(tmp_path / "missing.npz")):
        with pytest.raises(PrivfedError) as err:
            load_dataset(spec, split="train", data_dir=tmp_path)
        assert "--download" in str(err.value) and "--dataset arrays:PATH" in str(err.value), spec


@pytest.mark.parametrize("spec", ["cifar10:0", "cifar10:many", "cifar100:-5"])
def test_a_bad_subset_size_is_refused_before_any_data_is_read(tmp_path: Path, spec: str) -> None:
    with pytest.raises(PrivfedError, match=r"cifar100?:N needs"):
        load_dataset(spec, split="train", data_dir=tmp_path)


def test_the_subset_is_class_balanced_and_seeded(tmp_path: Path) -> None:
    data = load_npz(write_npz(tmp_path / "uneven.npz", [300, 120, 40, 200]), split="all")
    first = balanced_subset(data, 301, seed=3)
    counts = np.bincount(first.labels, minlength=4)
    # 40 is all class 2 has; the other three share the rest as equally as possible (87, 87, 87).
    assert counts.sum() == 301 and counts[2] == 40 and sorted(counts[[0, 1, 3]]) == [87, 87, 87]
    again = balanced_subset(data, 301, seed=3)
    other = balanced_subset(data, 301, seed=4)
    assert np.array_equal(first.images, again.images) and np.array_equal(first.labels, again.labels)
    assert not np.array_equal(first.images, other.images)
    # The subset is made of the data's own images, each at most once.
    rows = {row.tobytes() for row in data.images.reshape(len(data), -1)}
    picked = [row.tobytes() for row in first.images.reshape(len(first), -1)]
    assert len(set(picked)) == len(picked) and set(picked) <= rows
    with pytest.raises(PrivfedError, match="asks for 661"):
        balanced_subset(data, 661, seed=0)


def test_an_even_subset_splits_equally_with_a_seeded_remainder() -> None:
    labels = np.repeat(np.arange(10), 50)
    data = ImageArrays(np.zeros((500, 2, 2, 3), np.uint8), labels, tuple("abcdefghij"), "even")
    counts = np.bincount(balanced_subset(data, 105, seed=1).labels)
    assert sorted(counts) == [10] * 5 + [11] * 5
    assert np.array_equal(np.bincount(balanced_subset(data, 100, seed=9).labels), [10] * 10)


def test_the_gpu_preset_is_the_paper_recipe_on_dev_sized_data_without_secagg() -> None:
    """gpu-cifar10-dev keeps every training setting of the paper's cross-device preset (issue 43)."""
    paper, gpu = build_config("paper-cifar10-cross-device").to_dict(), build_config("gpu-cifar10-dev").to_dict()
    changed = {name for name in paper if paper[name] != gpu[name]}
    # Data (dev-sized), rounds (4 minutes), kNN cadence, SecAgg+ (off: the study compares learning),
    # client metrics (the clustering's health); client_gpus is Ray's, and the preset runs locally.
    assert changed == {"dataset", "rounds", "eval_every", "secagg", "report_client_metrics", "client_gpus"}
    assert gpu["dataset"] == "cifar10:5000" and not gpu["secagg"] and gpu["clients_per_step"] == 0
    assert 1 <= gpu["rounds"] < paper["rounds"]
