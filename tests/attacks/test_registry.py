"""Attacks are found by name, like mechanisms; a clash or a nameless class is refused."""

from __future__ import annotations

import pytest

from attacks import Attack, UnknownAttackError, available_attacks, get_attack_class, register_attack
from attacks.attackers import DecoderAttack, OptimizationAttack, ReleaseDecoderAttack
from attacks.registry import _REGISTRY


def test_the_built_in_attacks_are_registered_under_their_names():
    assert {"decoder", "decoder-releases", "optimization"} <= set(available_attacks())
    assert get_attack_class("decoder") is DecoderAttack and get_attack_class("optimization") is OptimizationAttack
    assert get_attack_class("decoder-releases") is ReleaseDecoderAttack and ReleaseDecoderAttack.uses_mechanism


def test_an_unknown_name_lists_the_choices():
    with pytest.raises(UnknownAttackError, match=r"unknown attack 'gradient'.*decoder.*optimization"):
        get_attack_class("gradient")


def test_a_new_attack_registers_and_a_clash_or_a_missing_name_is_refused(monkeypatch):
    monkeypatch.setattr("attacks.registry._REGISTRY", dict(_REGISTRY))

    @register_attack
    class Mean(Attack):
        name = "mean-image"
        description = "the auxiliary mean image, whatever the release"

        def fit(self, target, aux_images, *, progress=None):
            return lambda vectors: aux_images.float().mean(0, keepdim=True).div(255).expand(len(vectors), -1, -1, -1)

    assert get_attack_class("mean-image") is Mean
    with pytest.raises(ValueError, match="already taken"):
        register_attack(type("Other", (Mean,), {"name": "decoder"}))
    with pytest.raises(ValueError, match="non-empty class attribute `name`"):
        register_attack(type("Nameless", (Attack,), {"fit": Mean.fit}))


def test_the_cli_lists_the_attacks(run_privfed):
    result = run_privfed("attacks")
    assert result.returncode == 0 and "decoder-releases" in result.stdout and "optimization" in result.stdout


@pytest.mark.parametrize(
    ("name", "settings", "message"),
    [
        ("decoder", {"steps": 0}, "steps must be a whole number >= 1, got 0"),
        ("decoder", {"steps": "2000"}, "steps must be a whole number >= 1, got '2000'"),
        ("decoder", {"batch_size": 2.5}, "batch_size must be a whole number"),
        ("decoder", {"lr": 0}, "lr must be a number > 0"),
        ("decoder-releases", {"memories": True}, "memories must be a whole number"),
        ("optimization", {"restarts": -1}, "restarts must be a whole number"),
        ("optimization", {"tv_weight": -0.1}, "tv_weight must be a number >= 0"),
    ],
)
def test_a_setting_that_would_quietly_weaken_the_attack_is_refused(name, settings, message):
    with pytest.raises(ValueError, match=message):
        get_attack_class(name)(**settings)


def test_valid_settings_are_kept_as_whole_numbers():
    attack = get_attack_class("decoder")(steps=20.0, lr=1e-3)
    assert attack.settings()["steps"] == 20 and isinstance(attack.steps, int)
    assert get_attack_class("optimization")(tv_weight=0).settings()["tv_weight"] == 0
