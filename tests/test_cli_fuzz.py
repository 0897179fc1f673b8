"""Malformed invocations of every command end in one line on stderr and exit code 2, never in a traceback.

The invocations are generated: every float option with values outside its
range, integer options below theirs, names no registry knows, each file of a
run damaged in several ways, paths nothing can be written to, broken study
and config files. They run in-process through ``privfed.cli.main`` (a few as
real processes), and every one must fail before any training starts: the
fixture below fails the test if one reaches the runtime.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from mechanisms.base import K_ANONYMITY, Guarantee
from privfed.cli import main
from privfed.config import FLOAT_RANGES, INT_MAXIMA, MAX_INT, build_config, field_types
from privfed.methods import build_network
from privfed.privacy.ledger import LedgerEntry
from privfed.run.directory import RunDirectory
from privfed.run.resume import ResumePoint, mark_end, write_resume_point

#: Paths nothing can be created under, as root too: /proc refuses new entries, /sys new directories.
MISSING_UNDER_PROC = "/proc/privfed-nowhere/out"
REFUSED_UNDER_SYS = "/sys/privfed-refused"


@dataclass(frozen=True)
class Case:
    """One malformed invocation: its arguments (``{tmp}``, ``{run}``, ... filled in per test) and words its error names."""

    name: str
    argv: tuple[str, ...]
    needles: tuple[str, ...] = ()  # the line must contain one of these (empty: any line)


def flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def out_of_range(low: float, high: float, low_in: bool, high_in: bool) -> list[str]:
    """Values a float option must refuse: NaN, infinities and the nearest values outside its interval."""
    values = ["nan", "inf", "-inf"]
    values.append(f"{low - 1:g}")
    if not low_in:
        values.append(f"{low:g}")
    if math.isfinite(high):
        values.append(f"{high * 2 + 1:g}")
        if not high_in:
            values.append(f"{high:g}")
    elif low > 0:
        values.append("1e-300")
    return list(dict.fromkeys(values))


def train(*args: str) -> tuple[str, ...]:
    return ("train", "--out", "{tmp}/out", *args)


def option_cases() -> list[Case]:
    """`privfed train` with each option set to values it must refuse."""
    cases = []
    for field, bounds in FLOAT_RANGES.items():
        for value in out_of_range(*bounds):
            cases.append(Case(f"{field}={value}", train(f"{flag(field)}={value}"), (field, flag(field))))
    positive = ("num_clients", "rounds", "local_epochs", "batch_size", "memory_size", "num_local_centroids",
                "num_global_centroids", "projection_dim", "eval_every", "knn_k", "projection_hidden_dim")
    for field in positive:
        for value in ("0", "-5"):
            cases.append(Case(f"{field}={value}", train(f"{flag(field)}={value}"), (field, flag(field))))
    ints = [name for name, hint in field_types().items() if int in getattr(hint, "__args__", (hint,)) and name != "seed"]
    for field in ints:
        value = str(INT_MAXIMA.get(field, MAX_INT) + 1)
        cases.append(Case(f"{field}={value}", train(f"{flag(field)}={value}"), (field, flag(field))))
    cases += [
        Case("noise multiplier 0.01", train("--dp-sgd", "--dp-sgd-noise-multiplier=0.01"), ("dp_sgd_noise_multiplier",)),
        Case("delta 1e-300", train("--mechanism=ldp", "--epsilon=1", "--delta=1e-300"), ("delta",)),
    ]
    for value in ("-1", str(2**32), str(2**70)):
        cases.append(Case(f"seed={value}", train(f"--seed={value}"), ("seed",)))
    cases += [
        Case("checkpoint_every=-1", train("--checkpoint-every=-1"), ("checkpoint_every",)),
        Case("kanon_min_k=1", train("--kanon-min-k=1"), ("min_k",)),
        Case("batch_size=1", train("--batch-size=1"), ("batch_size",)),
        Case("shares without secagg", train("--no-secagg", "--secagg-shares=3"), ("--secagg-shares",)),
        Case("threshold without secagg", train("--no-secagg", "--secagg-threshold=2"), ("--secagg-threshold",)),
        Case("timeout without secagg", train("--no-secagg", "--secagg-timeout=5"), ("--secagg-timeout",)),
        Case("secagg shares 2", train("--secagg-shares=2"), ("--secagg-shares",)),
        Case("secagg clipping 3", train("--secagg-clipping-range=3"), ("--secagg-clipping-range",)),
        Case("client cpus beyond the machine", train("--client-cpus=100000"), ("--client-cpus",)),
        Case("client gpus beyond the machine", train("--client-gpus=100000"), ("--client-gpus",)),
        Case("too few centroids", train("-G", "1000"), ("num_global_centroids",)),
    ]
    if not torch.cuda.is_available():
        cases.append(Case("device cuda without a gpu", train("--device=cuda"), ("--device cuda",)))
    for value in ("abc", "1.5x", ""):
        cases.append(Case(f"lr not a number {value!r}", train(f"--lr={value}"), ("--lr",)))
    for value in ("1.5", "many"):
        cases.append(Case(f"rounds not an int {value!r}", train(f"--rounds={value}"), ("--rounds",)))
    return cases


def name_cases() -> list[Case]:
    """Names no registry knows, refused before any runtime starts."""
    names = {
        "backbone": ("bogus", "resnet"), "method": ("bogus", "Orchestra"), "mechanism": ("bogus", ""),
        "global_clustering": ("bogus",), "device": ("tpu", "cuda:x"),
        "dataset": ("bogus", "shapes:0", "shapes:x", "arrays:", "arrays:{tmp}/missing.npz", "cifar10:5"),
        "test_dataset": ("bogus", "shapes:-3", "arrays:{tmp}"),
    }
    cases = [Case(f"{field}={value}", train(f"{flag(field)}={value}")) for field, values in names.items() for value in values]
    cases += [
        Case("unknown option", train("--learning-rate=0.1"), ("--learning-rate",)),
        Case("unknown command", ("fly",), ("fly",)),
        Case("resume with config", ("train", "--resume", "{run}", "--config", "{tmp}/preset.toml"), ("--config",)),
        Case("resume a missing run", ("train", "--resume", "{tmp}/no-run"), ("no-run",)),
        Case("resume changes the seed", ("train", "--resume", "{run}", "--seed", "4"), ("seed",)),
        Case("resume with rounds beyond 32 bits", ("train", "--resume", "{run}", "--rounds", str(2**40)), ("rounds",)),
        Case("attack seed", ("attack", "{run}", "--method", "decoder", "--seed=-1"), ("seed",)),
        Case("attack rounds", ("attack", "{run}", "--method", "decoder", "--rounds", "1,x"), ("--rounds",)),
        Case("attack without releases", ("attack", "{run}", "--method", "decoder"), ()),
        Case("plot no run", ("plot", "{tmp}", "--out", "{tmp}/p.png"), ("metrics.jsonl",)),
    ]
    return cases


def file_system_cases() -> list[Case]:
    """Output paths that are files, under /proc or /sys, with a missing folder or an unknown picture type."""
    return [
        Case("train out is a file", train("--out", "{tmp}/a-file"), ("a-file",)),
        Case("train out under proc", train("--out", MISSING_UNDER_PROC), ("/proc",)),
        Case("train out under sys", train("--out", REFUSED_UNDER_SYS), ("/sys",)),
        Case("plot out missing folder", ("plot", "{run}", "--out", "{tmp}/nowhere/p.png"), ("nowhere",)),
        Case("plot out unknown type", ("plot", "{run}", "--out", "{tmp}/p.xyz"), (".xyz",)),
        Case("plot out under proc", ("plot", "{run}", "--out", MISSING_UNDER_PROC + ".png"), ("/proc",)),
        Case("plot out is a folder", ("plot", "{run}", "--out", "{tmp}/folder.png"), ("folder.png",)),
        Case("study out is a file", ("study", "{tmp}/study.toml", "--out", "{tmp}/a-file"), ("a-file",)),
        Case("study out under sys", ("study", "{tmp}/study.toml", "--out", REFUSED_UNDER_SYS), ("/sys",)),
        Case("study report of nothing", ("study", "{tmp}/study.toml", "--report", "--out", "{tmp}/empty"), ()),
        Case("certs out is a file", ("certs", "--out-dir", "{tmp}/a-file"), ("a-file",)),
        Case("certs out under proc", ("certs", "--out-dir", MISSING_UNDER_PROC), ("/proc",)),
        Case("certs out under sys", ("certs", "--out-dir", REFUSED_UNDER_SYS), ("/sys",)),
        Case("certs days huge", ("certs", "--out-dir", "{tmp}/c1", "--days", "1000000000"), ("--days",)),
        Case("certs days zero", ("certs", "--out-dir", "{tmp}/c2", "--days", "0"), ("--days",)),
        Case("certs port", ("certs", "--out-dir", "{tmp}/c3", "--port", "70000"), ("--port",)),
        Case("certs supernodes huge", ("certs", "--out-dir", "{tmp}/c4", "--supernodes", "100000000000"), ("--supernodes",)),
        Case("certs supernodes negative", ("certs", "--out-dir", "{tmp}/c5", "--supernodes=-1"), ("--supernodes",)),
    ]


def evaluate(*args: str) -> tuple[str, ...]:
    return ("evaluate", "{run}", "--train-data", "shapes:300", "--test-data", "shapes:300", *args)


def evaluate_cases() -> list[Case]:
    """`privfed evaluate` with options it must refuse, before it loads anything."""
    bad = {
        "label_fraction": ("0", "nan", "2", "-1", "inf"),
        "knn_k": ("-5", "0"),
        "knn_temperature": ("0", "nan", "-1", "inf"),
        "seed": ("-1", str(2**70)),
    }
    cases = [Case(f"evaluate {field}={value}", evaluate(f"{flag(field)}={value}"), (field, flag(field)))
             for field, values in bad.items() for value in values]
    cases += [
        Case("evaluate checkpoint /etc/passwd", evaluate("--checkpoint", "/etc/passwd"), ("/etc/passwd",)),
        Case("evaluate checkpoint missing", evaluate("--checkpoint", "{tmp}/none.pt"), ("none.pt",)),
        Case("evaluate protocol", evaluate("--protocol", "svm"), ("svm",)),
        Case("evaluate missing run", ("evaluate", "{tmp}/gone", "--train-data", "shapes", "--test-data", "shapes"), ("gone",)),
    ]
    return cases


def input_file_cases() -> list[Case]:
    """Config, study and .npz files that are damaged or say something impossible."""
    configs = {"bad-utf8": "not UTF-8", "not-toml": "TOML", "unknown-key": "learning_rate", "lr-string": "lr",
               "lr-nan": "lr", "seed-negative": "seed"}
    studies = {"study-preset-5": "preset", "study-base-5": "base", "study-seeds": "seeds", "study-grid": "grid",
               "study-attack-5": "attack", "study-bad-utf8": "UTF-8", "study-unknown": "unknown",
               "study-cell": "momentum", "study-preset-missing": "not found"}
    npz = {"labels-huge": "labels", "labels-beyond-images": "labels", "labels-negative": "negative",
           "images-float": "uint8"}
    return [
        *(Case(f"config {name}", train("--config", f"{{tmp}}/{name}.toml"), (needle,)) for name, needle in configs.items()),
        *(Case(f"study {name}", ("study", f"{{tmp}}/{name}.toml", "--out", "{tmp}/s"), (needle,))
          for name, needle in studies.items()),
        *(Case(f"npz {name}", train("--dataset", f"arrays:{{tmp}}/{name}.npz"), (needle,)) for name, needle in npz.items()),
    ]


def inapplicable_option_cases() -> list[Case]:
    """Mechanism options set (away from their defaults) where they do nothing, refused like --epsilon with kanon."""
    return [
        Case("kanon_min_k with ldp", train("--mechanism=ldp", "--epsilon=1", "--kanon-min-k=7"), ("--kanon-min-k",)),
        Case("kanon_min_k with reps", train("--mechanism=reps", "--kanon-min-k=7"), ("--kanon-min-k",)),
        Case("no secret sample with kanon", train("--no-secret-sample"), ("--no-secret-sample",)),
        Case("mechanism with rotpred", train("--method=rotpred", "--mechanism=ldp"), ("--mechanism",)),
        Case("mechanism with simclr", train("--method=simclr", "--mechanism=reps"), ("--mechanism",)),
        Case("kanon_min_k with supervised", train("--method=supervised", "--kanon-min-k=7"), ("--kanon-min-k",)),
    ]


def too_little_data_cases() -> list[Case]:
    """Data no client can train on or release from, images that are not square, and sizes too large to make."""
    huge = "shapes:10000000000"
    return [
        Case("train shapes huge", train("--dataset", huge), ("shapes:N",)),
        Case("train test shapes huge", train("--test-dataset", huge), ("shapes:N",)),
        Case("evaluate shapes huge", ("evaluate", "{run}", "--train-data", huge, "--test-data", "shapes:300"), ("shapes:N",)),
        Case("one image per client", train("--dataset", "shapes:10", "-K", "10"), ("at most 1 image",)),
        Case("memory below k", train("--memory-size=4", "-L", "4"), ("min_k",)),
        Case("no client holds k", train("--kanon-min-k=1000"), ("min_k",)),
        Case("non-square images", train("--dataset", "arrays:{tmp}/non-square.npz", "-K", "4"), ("square",)),
        Case("tsne of 3 images", evaluate_on("tsne", "three", "three-too"), ("t-SNE",)),
        *(Case(f"{protocol} of an empty test split", evaluate_on(protocol, "one", "one"), ("test image",))
          for protocol in ("knn", "linear", "finetune", "tsne")),
        *(Case(f"{protocol} of an empty test split of 2", evaluate_on(protocol, "two", "two"), ("test image",))
          for protocol in ("knn", "linear")),
    ]


def evaluate_on(protocol: str, train_file: str, test_file: str) -> tuple[str, ...]:
    return ("evaluate", "{run}", "--protocol", protocol, "--train-data", f"arrays:{{tmp}}/{train_file}.npz",
            "--test-data", f"arrays:{{tmp}}/{test_file}.npz")


#: Study files whose cells cannot run, each with words of its error.
UNRUNNABLE_STUDIES = {
    "study-seeds-twice": "more than once",
    "study-ldp-without-epsilon": "mechanism-ldp-seed0",
    "study-kanon-k-with-ldp": "--kanon-min-k",
    "study-one-image-each": "at most 1 image",
    "study-shapes-huge": "shapes:N",
}
#: How a study's ``cell.json`` is damaged (``damage()``'s names), each studied in its own --out.
CELL_DAMAGE = ("truncated", "not-utf8", "not-json", "not-an-object", "empty", "wrong-field")


def study_cases() -> list[Case]:
    """Studies that must stop before any cell trains: cells that cannot run, and a damaged finished cell."""
    cases = [Case(name, ("study", f"{{tmp}}/{name}.toml", "--out", f"{{tmp}}/{name}-out"), (needle,))
             for name, needle in UNRUNNABLE_STUDIES.items()]
    for how in CELL_DAMAGE:
        out = f"{{tmp}}/cells-{how}"
        cases.append(Case(f"study cell.json {how}", ("study", "{tmp}/study.toml", "--out", out), ("cell.json",)))
        cases.append(Case(f"study report cell.json {how}", ("study", "{tmp}/study.toml", "--report", "--out", out),
                          ("cell.json",)))
    return cases


#: How each file of a run is damaged: JSON and JSON-lines files, and checkpoints.
DAMAGE = {
    "json": ("truncated", "not-utf8", "not-json", "not-an-object"),
    "jsonl": ("truncated", "not-utf8", "not-json", "wrong-shape"),
    "pt": ("truncated", "not-utf8", "text"),
}
#: A simulated client's own ledger in the fabricated run.
CLIENT_LEDGER = "client-ledgers/privfed-ledger-partition-0.jsonl"
#: The files each command reads, and the command.
DAMAGED_FILES = {
    "resume": (("train", "--resume", "{run}"),
               ("config.json", "metrics.jsonl", "summary.json", "ledger.jsonl", CLIENT_LEDGER, "checkpoints/resume.pt")),
    "evaluate": (evaluate(), ("config.json", "evaluation.json", "checkpoints/final.pt")),
    "plot": (("plot", "{run}", "--out", "{tmp}/p.png"), ("metrics.jsonl", "config.json", "summary.json")),
}


def damaged_run_cases() -> list[Case]:
    cases = []
    for command, (argv, files) in DAMAGED_FILES.items():
        for file in files:
            kind = file.rsplit(".", 1)[1]
            for damage in DAMAGE[kind]:
                cases.append(Case(f"{command} {file} {damage}", ("damage", file, damage, *argv), (Path(file).name,)))
    return cases


def unwritable_result_cases() -> list[Case]:
    """`evaluate` and `attack` whose result file could not be written: refused before anything is computed."""
    attack = ("attack", "{run}", "--method", "decoder")
    return [
        Case("evaluate evaluation.json is a folder", ("damage", "evaluation.json", "folder", *evaluate()),
             ("evaluation.json",)),
        Case("evaluate tsne picture is a folder", ("damage", "embedding-tsne-final.png", "folder",
                                                   *evaluate("--protocol", "tsne")), ("embedding-tsne-final.png",)),
        Case("attack attack.json is a folder", ("damage", "attack.json", "folder", *attack), ("attack.json",)),
        Case("attack attack.png is a folder", ("damage", "attack.png", "folder", *attack), ("attack.png",)),
        Case("evaluate evaluation.json's temporary is a folder", ("damage", ".evaluation.json.tmp", "folder",
                                                                  *evaluate()), ("evaluation.json",)),
    ]


#: A file name the system refuses (over 255 bytes), and a path it refuses (over PATH_MAX, 4096 bytes).
LONG_NAME = "{tmp}/" + "n" * 300
LONG_PATH = "{tmp}/" + "/".join(["p" * 200] * 25)


def path_cases() -> list[Case]:
    """Paths the system refuses midway (with a traceback, before): refused first, in one line."""
    cases = []
    for what, path, needle in (("name", LONG_NAME, "255"), ("path", LONG_PATH, "too long")):
        cases += [
            Case(f"train out long {what}", train("--out", path), (needle,)),
            Case(f"resume long {what}", ("train", "--resume", path), (needle,)),
            Case(f"evaluate long {what}", ("evaluate", path, "--test-data", "shapes:300"), (needle,)),
            Case(f"attack long {what}", ("attack", path, "--method", "decoder"), (needle,)),
            Case(f"plot run long {what}", ("plot", path, "--out", "{tmp}/p.png"), (needle,)),
            Case(f"plot out long {what}", ("plot", "{run}", "--out", path + ".png"), (needle,)),
            Case(f"study out long {what}", ("study", "{tmp}/study.toml", "--out", path), (needle,)),
            Case(f"study report long {what}", ("study", "{tmp}/study.toml", "--report", "--out", path), (needle,)),
        ]
    cases.append(Case("plot out empty", ("plot", "{run}", "--out", ""), ("file name",)))
    return cases


#: How a stopped run is tampered with after its resume point, and what the refusal says (``{name}``: the file's name).
TAMPERING = {
    "ledger.jsonl": {"deleted": "{name} is gone", "first-line": "{name} has 1 entry",
                     "edited-entry": "{name}'s first 2 entries are not"},
    CLIENT_LEDGER: {"deleted": "{name} is gone", "first-line": "{name} has 1 entry",
                    "edited-entry": "{name}'s first 2 entries are not"},
    "config.json": {
        "set " + json.dumps(edit): "config.json was changed after the run's last resume point"
        for edit in ({"mechanism": "ldp", "epsilon": 5.0}, {"mechanism": "reps"}, {"dataset": "shapes:400"},
                     {"num_global_centroids": 6}, {"seed": 7})
    } | {"set " + json.dumps({"run_id": "0" * 32}): "belongs to another run"},
}


def tampered_run_cases() -> list[Case]:
    """A stopped run whose ledgers or configuration changed after its resume point, and a used folder for a new run."""
    cases = [
        Case(f"resume {file} {how}", ("damage", file, how, "train", "--resume", "{run}"),
             (needle.format(name=Path(file).name),))
        for file, hows in TAMPERING.items() for how, needle in hows.items()
    ]
    cases.append(Case("train out into a used folder without config.json", ("train", "--out", "{tmp}/used"),
                      ("holds files but no privfed run",)))
    return cases


CASES = [*option_cases(), *name_cases(), *file_system_cases(), *evaluate_cases(), *input_file_cases(), *damaged_run_cases(),
         *unwritable_result_cases(), *path_cases(),
         *inapplicable_option_cases(), *too_little_data_cases(), *study_cases(),
         *tampered_run_cases()]


def test_at_least_150_malformed_invocations_are_generated():
    assert len(CASES) >= 150, len(CASES)
    assert len({c.name for c in CASES}) == len(CASES)


def fabricate_run(folder: Path) -> None:
    """A stopped run's files, as ``privfed train`` leaves them after round 1 of 1 (written directly: no training)."""
    config = build_config(dataset="shapes:300", num_clients=4, participation=1.0, projection_dim=16, batch_size=16,
                          memory_size=32, num_local_centroids=4, num_global_centroids=8, rounds=1, device="cpu",
                          out=str(folder))
    run = RunDirectory(folder)
    run.create(config)
    run.append_metrics({"round": 0, "task": "init", "clients_completed": 4, "loss": None})
    run.append_metrics({"round": 1, "task": "train", "clients_completed": 4, "loss": 1.0, "knn_accuracy": 0.3})
    run.write_json("summary.json", {"stopped_early": None, "knn_accuracy": 0.3, "knn_accuracy_init": 0.2})
    run.write_json("evaluation.json", {"evaluations": []})
    guarantee = Guarantee(kind=K_ANONYMITY, statement="k-anonymous", k=5)
    entries = [LedgerEntry(0, r, "kanon", guarantee, ()) for r in (0, 1)]
    (folder / "ledger.jsonl").write_text("".join(json.dumps(e.to_dict()) + "\n" for e in entries))
    (folder / CLIENT_LEDGER).parent.mkdir()
    own = [LedgerEntry(0, r, "kanon", guarantee, (), run=0) for r in (0, 1)]
    (folder / CLIENT_LEDGER).write_text("".join(json.dumps(e.to_dict()) + "\n" for e in own))
    network = build_network(config)
    run.save_checkpoint("final", network, None, round_index=1)
    # Bound to the config and ledgers just written, as the driver's are.
    write_resume_point(run, ResumePoint(round=1, network=network.state_dict(), centroids=None, initialised=True,
                                        server_generator=torch.zeros(1), runtime={}, driver={}))
    mark_end(run, ended=True)  # the run ended there with this summary.json


def damage(path: Path, how: str) -> None:
    if how == "folder":  # a folder where the command writes a file
        path.unlink(missing_ok=True)
        path.mkdir()
        return
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "not-utf8":
        path.write_bytes(b"\xff\xfe\x00\x81" + data[4:])
    elif how == "not-json":
        path.write_text("{oops\n")
    elif how == "not-an-object":
        path.write_text("[1, 2, 3]\n")
    elif how == "wrong-shape":
        path.write_text(data.decode() + '{"round": "one", "client": "x"}\n')
    elif how == "text":
        path.write_text("just some text\n")
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "wrong-field":
        path.write_text(json.dumps({**json.loads(data), "seed": "zero"}))
    elif how == "deleted":
        path.unlink()
    elif how == "first-line":
        path.write_bytes(data.splitlines(keepends=True)[0])
    elif how == "edited-entry":  # the last entry claims a larger k
        *kept, last = data.decode().splitlines(keepends=True)
        path.write_text("".join(kept) + last.replace('"k": 5', '"k": 50'))
    elif how.startswith("set "):  # config.json edited by hand
        path.write_text(json.dumps({**json.loads(data), **json.loads(how.removeprefix("set "))}))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files the cases refer to: a run, a file where folders are expected, broken presets, studies and arrays."""
    tmp = tmp_path_factory.mktemp("fuzz")
    fabricate_run(tmp / "run")
    shutil.copytree(tmp / "run", tmp / "used")  # a finished run's files without its config.json
    (tmp / "used" / "config.json").unlink()
    (tmp / "a-file").write_text("a file, not a folder\n")
    (tmp / "folder.png").mkdir()
    (tmp / "preset.toml").write_text('rounds = 2\n')
    presets = {"not-toml": "rounds = = 2\n", "unknown-key": "learning_rate = 0.1\n", "lr-string": 'lr = "fast"\n',
               "lr-nan": "lr = nan\n", "seed-negative": "seed = -1\n"}
    for name, text in presets.items():
        (tmp / f"{name}.toml").write_text(text)
    (tmp / "bad-utf8.toml").write_bytes(b"rounds = 2\n# \xff\xfe\n")
    study = 'seeds = [0]\n[base]\ndataset = "shapes:300"\nnum_clients = 4\nparticipation = 1.0\n'
    studies = {"study": study, "study-preset-5": "preset = 5\n" + study, "study-base-5": "base = 5\n",
               "study-seeds": 'seeds = "all"\n', "study-grid": "grid = 5\n", "study-attack-5": "attack = 5\n" + study,
               "study-unknown": "colour = 1\n", "study-cell": study + "[[grid]]\nmomentum = [0.9, -5.0]\n",
               "study-preset-missing": 'preset = "none.toml"\n' + study}
    for name, text in studies.items():
        (tmp / f"{name}.toml").write_text(text)
    (tmp / "study-bad-utf8.toml").write_bytes(b'seeds = [0]\n# \xff\n')
    cell_study = ('seeds = [0]\n[base]\ndataset = "shapes:300"\nnum_clients = 4\nparticipation = 1.0\n'
                  '[[grid]]\nmechanism = ["kanon", "ldp"]\n')
    unrunnable = {"study-seeds-twice": study.replace("[0]", "[0, 0]"), "study-ldp-without-epsilon": cell_study,
                  "study-kanon-k-with-ldp": cell_study.replace("[[grid]]", "kanon_min_k = 7\nepsilon = 5.0\n[[grid]]"),
                  "study-one-image-each": study.replace("shapes:300", "shapes:4"),
                  "study-shapes-huge": study.replace("shapes:300", "shapes:10000000000")}
    for name, text in unrunnable.items():
        (tmp / f"{name}.toml").write_text(text)
    for how in CELL_DAMAGE:  # a finished cell of the study "study", then damaged
        cell = tmp / f"cells-{how}" / "cells" / "base-seed0"
        cell.mkdir(parents=True)
        record = {"name": "base", "seed": 0, "row": {"knn": 0.3}, "error": None, "seconds": 1.0, "config_hash": "0" * 64,
                  "settings": {}, "overrides": {}}
        (cell / "cell.json").write_text(json.dumps(record))
        damage(cell / "cell.json", how)
    images = np.random.default_rng(0).integers(0, 255, size=(30, 8, 8, 3), dtype=np.uint8)
    labels = np.arange(30) % 3
    for name, count in {"one": 1, "two": 2, "three": 3, "three-too": 3}.items():
        np.savez(tmp / f"{name}.npz", x=images[:count], y=labels[:count])
    np.savez(tmp / "non-square.npz", x=np.zeros((300, 32, 24, 3), dtype=np.uint8), y=np.arange(300) % 3)
    np.savez(tmp / "labels-huge.npz", x=images, y=np.where(labels == 0, 10_000_000, labels))
    np.savez(tmp / "labels-beyond-images.npz", x=images, y=labels + 30)
    np.savez(tmp / "labels-negative.npz", x=images, y=labels - 1)
    np.savez(tmp / "images-float.npz", x=images.astype(np.float32), y=labels)
    return tmp


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test if an invocation gets as far as starting the runtime, an evaluation's features or an attack's
    auxiliary data: every case must fail before."""
    import attacks.evaluation
    import privfed.federation.simulation as simulation
    import privfed.run.evaluation

    def reached(*args: object, **kwargs: object) -> None:
        pytest.fail("a malformed invocation reached training or computing")

    monkeypatch.setattr(simulation, "simulate", reached)
    for name in ("extract_features", "fine_tune_accuracy"):
        monkeypatch.setattr(privfed.run.evaluation, name, reached)
    monkeypatch.setattr(attacks.evaluation, "load_auxiliary", reached)


def filled(argv: tuple[str, ...], tmp: Path, run: Path) -> list[str]:
    return [a.replace("{tmp}", str(tmp)).replace("{run}", str(run)) for a in argv]


def assert_one_line_error(code: object, stdout: str, stderr: str, needles: tuple[str, ...]) -> None:
    assert "Traceback" not in stdout + stderr, stdout + stderr
    assert code == 2, (code, stderr)
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert not needles or any(n in lines[0] for n in needles), (needles, lines[0])


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_malformed_invocation_is_one_line_and_exit_code_2(case, world, no_training, tmp_path, capsys):
    run = world / "run"
    argv = case.argv
    if argv[0] == "damage":  # a copy of the run, with one file damaged
        _, file, how, *argv = argv
        run = tmp_path / "run"
        shutil.copytree(world / "run", run)
        damage(run / file, how)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(filled(tuple(argv), world, run))
    captured = capsys.readouterr()
    assert_one_line_error(exit_.value.code, captured.out, captured.err, case.needles)


def test_the_undamaged_run_resumes_as_far_as_the_check_that_it_is_finished(world, no_training, tmp_path, capsys):
    """So the damaged copies fail for their damage: the intact run gets past every file check."""
    shutil.copytree(world / "run", tmp_path / "run")
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--resume", str(tmp_path / "run")])
    captured = capsys.readouterr()
    assert_one_line_error(exit_.value.code, captured.out, captured.err, ("already finished round 1 of 1",))


def test_plot_says_the_path_it_wrote(world, tmp_path, capsys):
    main(["plot", str(world / "run"), "--out", str(tmp_path / "curves")])
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'curves.png'}"
    assert (tmp_path / "curves.png").is_file()


#: Invocations run as real processes: the console entry point, its streams and its exit, as a user sees them.
PROCESS_CASES = [
    ("train", "--lr", "nan"),
    ("plot", "{run}", "--out", "{tmp}/p.xyz"),
]


def test_malformed_invocations_in_a_real_process_print_one_line_and_exit_2(world):
    env_cwd = world  # a run directory the default --out would create lands here, never in the repository
    processes = [
        subprocess.Popen([sys.executable, "-m", "privfed.cli", *filled(argv, world, world / "run")], cwd=env_cwd,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for argv in PROCESS_CASES
    ]
    for process in processes:
        stdout, stderr = process.communicate(timeout=300)
        assert_one_line_error(process.returncode, stdout, stderr, ())


#: Commands that end well, each run in a process with every warning an error (``PYTHONWARNINGS=error``).
WARNING_FREE = [
    (("--version",), 0),
    (("train", "--help"), 0),
    (("mechanisms",), 0),
    (("plot", "{run}", "--out", "{tmp}/warnings.png"), 0),
    (("evaluate", "{run}", "--train-data", "shapes:300", "--test-data", "shapes:300", "--device", "cpu"), 0),
    (("train", "--lr", "nan"), 2),
]


def test_commands_under_pythonwarnings_error_end_as_they_would_without(world, tmp_path):
    """A third-party warning privfed cannot act on must not become a traceback; the user's filter stays (see below)."""
    shutil.copytree(world / "run", tmp_path / "run")
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    processes = [
        (subprocess.Popen([sys.executable, "-m", "privfed.cli", *filled(argv, tmp_path, tmp_path / "run")], cwd=tmp_path,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env), code)
        for argv, code in WARNING_FREE
    ]
    for process, code in processes:
        _, stderr = process.communicate(timeout=300)
        assert "Traceback" not in stderr and process.returncode == code, (process.args, stderr)


def test_the_users_warning_filter_is_kept(tmp_path):
    """Filtered are named third-party warnings only: a warning of the user's own is still an error."""
    code = ("import warnings, privfed.cli\n"
            "try:\n    warnings.warn('mine', DeprecationWarning)\nexcept DeprecationWarning:\n    print('raised')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONWARNINGS": "error"}, timeout=120)
    assert result.stdout.strip() == "raised", result.stderr


def test_evaluate_warns_about_test_images_of_another_size_and_keeps_the_result(world, tmp_path, capsys):
    """Allowed, but said: the encoder runs on both sizes, yet compares unlike images."""
    shutil.copytree(world / "run", tmp_path / "run")
    images = np.random.default_rng(1).integers(0, 255, size=(30, 8, 8, 3), dtype=np.uint8)
    np.savez(tmp_path / "small.npz", x=images, y=np.arange(30) % 3)
    main(["evaluate", str(tmp_path / "run"), "--train-data", f"arrays:{tmp_path / 'small.npz'}",
          "--test-data", "shapes:300", "--knn-k", "5", "--device", "cpu"])
    captured = capsys.readouterr()
    assert captured.err.startswith("warning: the test (shapes:300) images are 32×32×3 but the train (arrays:")
    assert captured.out.startswith("knn accuracy: ")
    (kept,) = json.loads((tmp_path / "run" / "evaluation.json").read_text())["evaluations"]
    assert kept["num_train"] == 30 and kept["warnings"] == [captured.err.strip().removeprefix("warning: ")]


def test_evaluate_warns_that_one_class_of_train_labels_makes_any_accuracy_meaningless(world, tmp_path, capsys):
    """One train image (one label) is still a probe: kNN caps k at 1; but its 1.0 on that class says nothing."""
    shutil.copytree(world / "run", tmp_path / "run")
    main(["evaluate", str(tmp_path / "run"), "--train-data", f"arrays:{world / 'one.npz'}",
          "--test-data", f"arrays:{world / 'three.npz'}", "--device", "cpu"])
    captured = capsys.readouterr()
    assert captured.err.startswith(f"warning: every train (arrays:{world / 'one.npz'}) image has label 0, so the probe")
    (kept,) = json.loads((tmp_path / "run" / "evaluation.json").read_text())["evaluations"]
    assert kept["num_train"] == 1 and kept["accuracy"] == pytest.approx(1 / 3)  # labels 0, 1, 2: only the 0 is right
    assert kept["warnings"] == [captured.err.strip().removeprefix("warning: ")]


def test_train_warns_that_one_class_of_training_labels_makes_the_monitor_meaningless(tmp_path):
    """Labels all 0: the kNN monitor scores 1.0 on a test split of that class, whatever the encoder learnt."""
    from privfed.run.plan import plan_run

    images = np.random.default_rng(2).integers(0, 255, size=(300, 8, 8, 3), dtype=np.uint8)
    np.savez(tmp_path / "zeros.npz", x=images, y=np.zeros(300, dtype=np.int64))
    config = build_config(dataset=f"arrays:{tmp_path / 'zeros.npz'}", num_clients=4, out=str(tmp_path / "run"))
    (warning,) = plan_run(config).warnings
    assert warning.startswith(f"every training image of arrays:{tmp_path / 'zeros.npz'} has label 0, so the kNN monitor")
