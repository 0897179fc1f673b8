"""A third-party attack, installed only through the ``privfed.attacks`` entry point, attacks a recorded run end to end.

The plug-in is ``examples/third_party_attack.py``: privfed never imports it
nor registers it; a fake installed distribution declares it and the real
``privfed`` CLI finds it there.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from attacks.base import represent
from attacks.evaluation import attack_target, load_auxiliary
from attacks.scoring.ground_truth import VERIFIED
from privfed.run.recording import read_round
from tests.attacks.test_attack_run import tiny_run
from tests.plugin_env import PLUGIN_FOLDERS, installed_env, run_privfed

NAME = "nearest-aux"
GROUP = "privfed.attacks"


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory) -> dict[str, str]:
    entry = f"{NAME} = third_party_attack:NearestAuxAttack"
    return installed_env(tmp_path_factory.mktemp("site"), "fake-privfed-attack", entry, group=GROUP)


@pytest.fixture(scope="module")
def reps_run(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("attack") / "reps", mechanism="reps")


def test_the_attack_is_listed_only_when_its_distribution_is_installed(plugin_env, tmp_path):
    listed = run_privfed(plugin_env, "attacks", cwd=tmp_path)
    assert listed.returncode == 0 and NAME in listed.stdout and "decoder" in listed.stdout, listed.stderr
    without = run_privfed({k: v for k, v in plugin_env.items() if k != "PYTHONPATH"}, "attacks", cwd=tmp_path)
    assert without.returncode == 0 and NAME not in without.stdout


def test_a_broken_attack_plugin_is_named_on_one_line(tmp_path):
    env = installed_env(tmp_path / "site", "broken-attack", f"{NAME} = no_such_module_anywhere:Attack", group=GROUP)
    result = run_privfed(env, "attacks", cwd=tmp_path)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert f"plugin '{NAME}'" in result.stderr and "cannot be loaded" in result.stderr


def test_privfed_attack_scores_the_plugin_like_a_built_in_attack(plugin_env, reps_run, tmp_path):
    result = run_privfed(
        plugin_env, "attack", str(reps_run.path), "--method", NAME, "--rounds", "1", "--max-vectors", "6", cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"  {NAME}: 1/" in result.stdout  # its own progress reports
    report = json.loads((reps_run.path / "attack.json").read_text())
    assert report["attack"] == {"method": NAME, "seed": 0, "batch_size": 256}
    (row,) = report["rounds"]
    assert row["round"] == 1 and row["vectors"] == 6 and set(row["membership"].values()) == {VERIFIED}
    for score in ("psnr_source", "ssim_source", "psnr_best_client", "reid_rate"):
        assert {f"null_{score}", f"advantage_{score}"} <= set(row) and row[f"n_{score}"] == 6
    assert (reps_run.path / "attack.png").stat().st_size > 0


def test_a_vector_embedded_from_an_auxiliary_image_is_inverted_to_that_image(reps_run):
    spec = importlib.util.spec_from_file_location("third_party_attack", PLUGIN_FOLDERS[0] / "third_party_attack.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = reps_run.config()
    target = attack_target(config, read_round(reps_run.releases, 1), torch.device("cpu"))
    aux = load_auxiliary(config, None)[0][:40]
    invert = module.NearestAuxAttack(batch_size=len(aux)).fit(target, aux)
    with torch.no_grad():
        vectors = represent(target.frozen_encoder().eval(), aux.float() / 255)
    assert torch.equal(invert(vectors.flip(0)), aux.flip(0).float() / 255)
