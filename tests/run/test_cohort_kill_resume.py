"""Review: ``kill -9`` inside a round whose clients train together, then ``--resume``, on the local runtime.

With ``clients_per_step`` 3 the runtime answers a round's training messages
in two passes (:mod:`privfed.federation.cohort_round`): the first admits and
charges every client, the cohort trains them, the second answers. Each run
here is its own process (``python -m`` this module), so every run computes
with the same thread count. The kill comes from an outer mod (a ClientApp mod
sees every delivery of both passes): it SIGKILLs the process as the second
pass of round ``KILLED_ROUND`` reaches its ``n``-th training message, before
that client answers. ``n`` = 1: every sampled client charged and begun, none
answered (what a kill during the cohort's training also leaves); ``n`` = 2:
one client answered.

The resumed run must charge nothing twice (the clients' ledgers equal the
uninterrupted run's); after a kill before any answer it ends where the
uninterrupted run ends. After a kill once a client answered it does not
(tests/federation/test_cohort_round_review.py: the answered client's
replay is refused under SecAgg+, and the others train in a smaller cohort).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from tests.run_records import jsonl, same

KILLED_ROUND = 2
ROUNDS = 2


def _config(out: Path):
    from privfed.config import build_config

    return build_config(
        dataset="shapes:300", num_clients=4, participation=0.75, projection_dim=16, local_epochs=1, batch_size=16,
        memory_size=32, num_local_centroids=4, num_global_centroids=8, rounds=ROUNDS, seed=5, device="cpu",
        mechanism="kanon", clients_per_step=3, out=str(out),
    )


def _killer(at: int):
    """Outer mod: SIGKILL as the ``at``-th second-pass training message of round KILLED_ROUND arrives."""
    from flwr.app.message_type import MessageType

    from privfed.federation.client_app import FIT_CONFIG_RECORD

    seen: Counter = Counter()
    second_pass = [0]

    def mod(msg, context, call_next):
        fit = msg.content.config_records.get(FIT_CONFIG_RECORD)
        if msg.metadata.message_type == MessageType.TRAIN and fit is not None and fit.get("task") == "train":
            key = (int(context.node_config["partition-id"]), int(fit["round"]))
            seen[key] += 1
            if key[1] == KILLED_ROUND and seen[key] == 2:
                second_pass[0] += 1
                if second_pass[0] == at:
                    os.kill(os.getpid(), signal.SIGKILL)
        return call_next(msg, context)

    return mod


def _main(argv: list[str]) -> None:
    """``whole OUT`` | ``killed OUT AT`` | ``resume OUT``: one run, in this process."""
    from privfed.federation.simulation import simulate
    from privfed.run.plan import plan_resume, plan_run

    what, out = argv[0], Path(argv[1])
    if what == "whole":
        simulate(plan_run(_config(out)))
    elif what == "killed":
        simulate(plan_run(_config(out)), outer_mods=[_killer(int(argv[2]))])
        raise SystemExit("the kill never came")
    else:
        plan, point = plan_resume(out, {})
        assert point.round == KILLED_ROUND - 1, point
        simulate(plan, resume=point)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tests.run.test_cohort_kill_resume", *args], capture_output=True, text=True, timeout=900,
        cwd=Path(__file__).resolve().parents[2],
    )


def _comparable(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.endswith("seconds")}


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cohort-kill") / "whole"
    done = _run("whole", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _killed_and_resumed(folder: Path, at: int) -> Path:
    from privfed.federation.local_runtime import SIMULATED_RUN_KEY
    from privfed.federation.reply_store import ReplyStore

    out = folder / f"killed-{at}"
    killed = _run("killed", str(out), str(at))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    ledgers = out / "client-ledgers"
    charged = [json.loads(line)["round"] for path in ledgers.glob("*.jsonl") for line in path.read_text().splitlines()]
    assert charged.count(KILLED_ROUND) == 3  # every sampled client was charged in the first pass
    stored = [ReplyStore(path).get(SIMULATED_RUN_KEY, KILLED_ROUND) for path in ledgers.glob("privfed-reply-partition-*.npz")]
    assert sum(s is not None and s.reply is not None for s in stored) == at - 1  # answered before the kill
    assert sum(s is not None and s.reply is None and not s.failed for s in stored) == 3 - (at - 1)  # begun
    resumed = _run("resume", str(out))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return out


def _assert_charged_once(whole: Path, resumed: Path) -> None:
    names = sorted(path.name for path in (whole / "client-ledgers").glob("*.jsonl"))
    assert names == sorted(path.name for path in (resumed / "client-ledgers").glob("*.jsonl"))
    for name in names:
        assert jsonl(whole / "client-ledgers" / name) == jsonl(resumed / "client-ledgers" / name), name


def _assert_same_run(whole: Path, resumed: Path) -> None:
    _assert_charged_once(whole, resumed)
    assert jsonl(whole / "ledger.jsonl") == jsonl(resumed / "ledger.jsonl")
    a, b = jsonl(whole / "metrics.jsonl"), jsonl(resumed / "metrics.jsonl")
    assert [m["round"] for m in b] == list(range(ROUNDS + 1))
    for x, y in zip(a, b):
        assert same(_comparable(x), _comparable(y)), (_comparable(x), _comparable(y))
    final_a = torch.load(whole / "checkpoints" / "final.pt", weights_only=True)
    final_b = torch.load(resumed / "checkpoints" / "final.pt", weights_only=True)
    for key, value in final_a["network"].items():
        assert torch.allclose(value.double(), final_b["network"][key].double(), atol=1e-5), key


@pytest.mark.slow
def test_a_kill_after_the_first_pass_before_any_answer_resumes_to_the_uninterrupted_run(whole, tmp_path):
    _assert_same_run(whole, _killed_and_resumed(tmp_path, 1))


@pytest.mark.slow
def test_a_kill_in_the_second_pass_charges_nothing_twice(whole, tmp_path):
    _assert_charged_once(whole, _killed_and_resumed(tmp_path, 2))


if __name__ == "__main__":
    _main(sys.argv[1:])
