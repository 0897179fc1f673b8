"""A study file expands into its cells: the product of each grid, the grids one after another, seeds innermost."""

from __future__ import annotations

import pytest

from privfed.errors import PrivfedError
from privfed.studies.grid import Study, cell_name

PRIVACY_TABLE = """
seeds = [0, 1, 2]

[base]
rounds = 3
dataset = "shapes:200"

[[grid]]
mechanism = ["reps", "kanon"]

[[grid]]
mechanism = ["ldp"]
epsilon = [10, 1.0, 0.8]
"""


def study(tmp_path, text: str) -> Study:
    path = tmp_path / "study.toml"
    path.write_text(text)
    return Study.load(path)


def test_the_privacy_table_expands_into_five_settings_at_three_seeds(tmp_path):
    cells = study(tmp_path, PRIVACY_TABLE).cells()
    names = list(dict.fromkeys(c.name for c in cells))
    assert names == ["mechanism-reps", "mechanism-kanon", "mechanism-ldp_epsilon-10", "mechanism-ldp_epsilon-1",
                     "mechanism-ldp_epsilon-0.8"]
    assert len(cells) == 15 and [c.seed for c in cells[:3]] == [0, 1, 2]  # seeds innermost
    ldp = [c for c in cells if c.name == "mechanism-ldp_epsilon-10"]
    assert {c.config.epsilon for c in ldp} == {10.0} and isinstance(ldp[0].config.epsilon, float)  # 10 read as 10.0
    assert all(c.config.rounds == 3 and c.config.dataset == "shapes:200" for c in cells)
    assert {c.run_name for c in cells} >= {"mechanism-reps-seed0", "mechanism-ldp_epsilon-0.8-seed2"}


def test_a_study_without_grids_is_one_cell_per_seed(tmp_path):
    cells = study(tmp_path, "seeds = [4, 5]\n[base]\nrounds = 2\n").cells()
    assert [(c.name, c.seed) for c in cells] == [("base", 4), ("base", 5)]


def test_the_preset_is_read_relative_to_the_study_file(tmp_path):
    (tmp_path / "preset.toml").write_text('rounds = 7\ndataset = "shapes:100"\n')
    cells = study(tmp_path, 'preset = "preset.toml"\n[[grid]]\nalpha = [0.1, 1.0]\n').cells()
    assert [c.config.rounds for c in cells] == [7, 7] and [c.config.alpha for c in cells] == [0.1, 1.0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[grid]]\nmechanisms = ['kanon']\n", "unknown keys: mechanisms"),
        ("[base]\nroundz = 3\n", "unknown keys: roundz"),
        ("[[grid]]\nrounds = ['many']\n", "'rounds' must be int"),
        ("[[grid]]\nparticipation = [0.5, 1.5]\n", "cell participation-1.5"),
        ("[[grid]]\nmechanism = []\n", "non-empty list"),
        ("[[grid]]\nmechanism = 'kanon'\n", "non-empty list"),
        ("seeds = []\n", "seeds must be a non-empty list"),
        ("[base]\nseed = 3\n", "top-level `seeds` list"),
        ("[[grid]]\nmechanism = ['kanon']\n[[grid]]\nmechanism = ['kanon']\n", "appears twice"),
        ("study = 'x'\n", "unknown keys: study"),
        ("[[grid\n", "not valid TOML"),
        ("[attack_settings]\nsteps = 5\n", "attack_settings without an attack"),
        ("attack = 'decoder'\nattack_settings = 5\n", r"an \[attack_settings\] table"),
        ("attack = 'decoder'\n[attack_settings]\nseed = 3\n", "takes no seed"),
        ("finetune = 0.1\n", "finetune must be a list of label fractions"),
        ("finetune = [0.01, 1.5]\n", "finetune must be a list of label fractions"),
        ("finetune = [0]\n", "finetune must be a list of label fractions"),
        ("finetune = ['10%']\n", "finetune must be a list of label fractions"),
    ],
)
def test_a_mistake_in_a_study_file_is_named_before_anything_trains(tmp_path, text, message):
    with pytest.raises(PrivfedError, match=message):
        study(tmp_path, text).cells()


def test_cell_names_are_stable_and_safe_for_file_names():
    assert cell_name({"dp_sgd": True, "alpha": 0.1}) == "dp_sgd-on_alpha-0.1"
    assert cell_name({"dataset": "arrays:../data/x.npz"}) == "dataset-arrays-..-data-x.npz"
    assert cell_name({}) == "base"


def test_a_long_setting_gets_a_folder_name_the_file_system_takes_and_keeps_apart():
    """A value that becomes a name over 255 bytes (here a long data path) is cut, with a hash of the whole."""
    long_path = "/data/" + "/".join(["d" * 50] * 6)
    names = [cell_name({"data_dir": long_path + end}) for end in ("/a", "/b")]
    assert names[0] != names[1]
    assert all(len(f"{name}-seed{2**32 - 1}".encode()) <= 255 for name in names), names
    assert names[0].startswith("data_dir--data-ddd") and names[0] == cell_name({"data_dir": long_path + "/a"})


@pytest.mark.parametrize("name", ["privacy", "methods"])
@pytest.mark.parametrize("scale", ["cpu", "paper"])
def test_the_shipped_studies_load_with_three_seeds_per_cell(name, scale):
    from pathlib import Path

    spec = Study.load(Path(__file__).resolve().parents[2] / "configs" / "studies" / f"{name}-{scale}-cifar10.toml")
    cells = spec.cells()
    assert spec.seeds == (0, 1, 2) and len(cells) == 3 * len({c.name for c in cells})
    if name == "privacy":
        assert {c.name for c in cells} == {"mechanism-reps", "mechanism-kanon", "mechanism-ldp_epsilon-10",
                                           "mechanism-ldp_epsilon-1", "mechanism-ldp_epsilon-0.8"}
        assert all(c.config.delta == 1e-3 for c in cells) and spec.attack == "decoder"
    else:
        assert {c.config.method for c in cells} == {"orchestra", "rotpred", "simclr", "simsiam", "byol", "specloss", "supervised"}
        assert spec.finetune == (0.01, 0.1)  # the paper's semi-supervised protocol


def test_attack_settings_are_read_for_the_attack(tmp_path):
    spec = study(tmp_path, "attack = 'decoder'\n[attack_settings]\nsteps = 200\n")
    assert spec.attack == "decoder" and spec.attack_settings == {"steps": 200}


def test_finetune_fractions_are_read_once_each_and_default_to_none(tmp_path):
    assert study(tmp_path, "finetune = [0.01, 0.1, 0.01, 1]\n").finetune == (0.01, 0.1, 1.0)
    assert study(tmp_path, "seeds = [0]\n").finetune == ()
