"""One source for every run option: TrainConfig's fields, their help, and every copy derived from them."""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from pathlib import Path

import pytest

from privfed.config import DEFAULTS, OPTION_METADATA, TrainConfig, build_config, load_saved_config, option_help
from privfed.errors import PrivfedError
from privfed.orchestra.local_training import LocalTrainingConfig
from privfed.privacy.dp_sgd_plan import DpSgdSettings

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_flwr_app_config_declares_exactly_trainconfigs_names_and_defaults():
    declared = tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"]
    expected = {f.name.replace("_", "-"): "" if f.default is None else f.default for f in dataclasses.fields(TrainConfig)}
    assert set(declared) == set(expected)
    for key, default in expected.items():
        assert declared[key] == default and type(declared[key]) is type(default), key


def test_every_field_carries_its_own_help():
    for field in dataclasses.fields(TrainConfig):
        info = field.metadata[OPTION_METADATA]
        assert info.help.strip().endswith("."), field.name
        assert all(flag.startswith("-") and not flag.startswith("--") for flag in info.flags), field.name


def test_train_help_is_generated_from_the_fields(run_privfed):
    result = run_privfed("train", "--help")
    text = " ".join(result.stdout.split())  # click wraps lines
    for field in dataclasses.fields(TrainConfig):
        assert " ".join(option_help(field.name).help.split()[:4]) in text, field.name
    assert "-K, --num-clients" in text and "--secagg / --no-secagg" in text


def test_generated_options_reach_the_config(tmp_path, run_privfed):
    """Flags override the file, short flags work, and a bad value is refused by the config's own check."""
    preset = tmp_path / "preset.toml"
    preset.write_text("num_clients = 3\nparticipation = 1.0\n")
    result = run_privfed("train", "--config", str(preset), "-K", "2", "-G", "64", "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "2 sampled clients x 8 local centroids = 16 released centroids" in result.stderr


def test_local_training_config_has_no_defaults_of_its_own():
    for field in dataclasses.fields(LocalTrainingConfig):
        assert field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING, field.name
    with pytest.raises(TypeError):
        LocalTrainingConfig()  # type: ignore[call-arg]


def test_local_training_config_copies_the_runs_values():
    run = build_config(local_epochs=3, batch_size=8, lr=0.5, momentum=0.1, weight_decay=0.2, temperature=0.7,
                       ema_decay=0.5, memory_size=64, method="orchestra-no-target")
    settings = DpSgdSettings(noise_multiplier=1.0, max_grad_norm=2.0)
    local = LocalTrainingConfig.from_run(run, settings)
    assert dataclasses.asdict(local) == {
        "epochs": 3, "batch_size": 8, "lr": 0.5, "momentum": 0.1, "weight_decay": 0.2, "temperature": 0.7,
        "ema_decay": 0.5, "memory_size": 64, "dp_sgd": {"noise_multiplier": 1.0, "max_grad_norm": 2.0},
        "method": "orchestra-no-target",
    }
    assert LocalTrainingConfig.from_run(DEFAULTS).lr == TrainConfig().lr


def test_a_mechanism_releasing_raw_data_is_not_held_to_the_centroid_count():
    with pytest.raises(PrivfedError, match="fewer than num_global_centroids"):
        build_config(num_clients=2, participation=1.0, num_global_centroids=64, mechanism="kanon")
    assert build_config(num_clients=2, participation=1.0, num_global_centroids=64, mechanism="reps")


def test_evaluate_takes_the_shared_options_from_trainconfig():
    import inspect

    from privfed import cli
    from privfed.run.evaluation import evaluate_run

    command = inspect.signature(cli.evaluate).parameters
    function = inspect.signature(evaluate_run).parameters
    for name in ("download", "device", "knn_k", "knn_temperature"):
        assert command[name].default.default == getattr(DEFAULTS, name), name
        assert command[name].default.help == option_help(name).help, name
        assert function[name].default == getattr(DEFAULTS, name)
    assert command["data_dir"].default.default is None  # the run's own, as for its data


def test_recording_the_releases_of_a_method_that_releases_nothing_is_refused():
    assert build_config(record_releases=True).record_releases
    with pytest.raises(PrivfedError, match="rotpred releases nothing, so --record-releases has nothing to record"):
        build_config(method="rotpred", record_releases=True)


def test_every_float_option_has_a_range_and_nan_inf_are_refused():
    """A float option missing from FLOAT_RANGES would let NaN or infinity through to a run."""
    from privfed.config import FLOAT_RANGES, field_types

    floats = {name for name, hint in field_types().items() if float in getattr(hint, "__args__", (hint,))}
    assert floats == set(FLOAT_RANGES)
    for name in sorted(floats):
        for bad in (math.nan, math.inf, -math.inf):
            with pytest.raises(PrivfedError, match=name):
                build_config(**{name: bad})


@pytest.mark.parametrize("seed", [-1, 2**32, 2**70])
def test_a_seed_outside_32_bits_is_refused(seed):
    with pytest.raises(PrivfedError, match="seed must be an integer from 0 to 4294967295"):
        build_config(seed=seed)


def test_secagg_options_without_secagg_are_refused():
    with pytest.raises(PrivfedError, match="--secagg-shares, --secagg-timeout set up SecAgg"):
        build_config(secagg=False, secagg_shares=3, secagg_timeout=5.0)


def test_a_damaged_saved_config_is_one_error_naming_the_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"lr": "fast"}')
    with pytest.raises(PrivfedError, match=f"{path}: config key 'lr' must be float"):
        load_saved_config(path)
    path.write_bytes(b"\xff{}")
    with pytest.raises(PrivfedError, match="is not UTF-8 text"):
        load_saved_config(path)


def test_mechanism_flags_become_the_mechanisms_settings_and_are_refused_where_none_takes_them():
    assert build_config(mechanism="kanon", kanon_min_k=7).mechanism_settings == {"min_k": 7}
    assert build_config(mechanism="ldp-sums", epsilon=1.0, secret_sample=False).mechanism_settings == {"secret_sample": False}
    assert build_config().mechanism_settings == {}  # unset: each mechanism's own default
    with pytest.raises(PrivfedError, match=r"--kanon-min-k applies to mechanisms that take min_k \(kanon\), not ldp"):
        build_config(mechanism="ldp", epsilon=1.0, kanon_min_k=5)
    with pytest.raises(PrivfedError, match=r"--no-secret-sample applies to mechanisms that take secret_sample \(ddp-sums, ldp-sums\)"):
        build_config(secret_sample=False)


def test_a_saved_config_from_before_mechanism_settings_reads_its_written_defaults_as_unset(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**DEFAULTS.to_dict(), "mechanism": "ldp", "epsilon": 1.0, "kanon_min_k": 5, "secret_sample": True}))
    config = load_saved_config(path)
    assert config.kanon_min_k is None and config.secret_sample is None
    path.write_text(json.dumps({**DEFAULTS.to_dict(), "mechanism": "kanon", "kanon_min_k": 5, "secret_sample": False}))
    config = load_saved_config(path)
    assert config.kanon_min_k == 5 and config.secret_sample is False  # kanon takes min_k; False was given


def test_a_recorded_config_reads_the_defaults_every_run_wrote_as_unset_where_nothing_took_them():
    from privfed.config import read_legacy_settings

    old = {"method": "simclr", "mechanism": "kanon", "kanon_min_k": 5, "secret_sample": True}  # simclr releases nothing
    assert read_legacy_settings(old) == {**old, "kanon_min_k": None, "secret_sample": None}
    kanon = {"method": "orchestra", "mechanism": "kanon", "kanon_min_k": 5, "secret_sample": True}
    assert read_legacy_settings(kanon) == {**kanon, "secret_sample": None}
    sums = {"method": "orchestra", "mechanism": "ddp-sums", "kanon_min_k": 7, "secret_sample": True}
    assert read_legacy_settings(sums) == sums  # 7 was given (and is refused later); ddp-sums takes secret_sample
