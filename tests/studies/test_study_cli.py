"""`privfed study` refuses a bad attack setting before any cell trains."""

from __future__ import annotations

STUDY = """
attack = "decoder"

[attack_settings]
stepz = 5

[base]
dataset = "shapes:120"
rounds = 1
"""


def test_an_attack_setting_the_attack_does_not_take_fails_before_anything_trains(tmp_path, run_privfed):
    (tmp_path / "study.toml").write_text(STUDY)
    result = run_privfed("study", str(tmp_path / "study.toml"), "--out", str(tmp_path / "out"))
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "Traceback" not in output
    assert "[attack_settings] for decoder" in output and "stepz" in output
    assert not (tmp_path / "out" / "cells").exists()
