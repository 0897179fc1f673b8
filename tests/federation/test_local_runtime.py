"""The local runtime: Flower's apps in one process, the same run as on Ray, and no Ray needed for it."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest
from flwr.app import Context, Message, RecordDict
from flwr.client import ClientApp
from flwr.common import ConfigRecord
from flwr.common.secure_aggregation.secaggplus_constants import (
    RECORD_KEY_CONFIGS,
    Key,
    Stage,
)
from flwr.supercore.task_identity import TaskIdentity

from benchmarks.dropout_injection import InjectedDropout
from privfed.config import build_config
from privfed.errors import PrivfedError
from privfed.federation import local_runtime
from privfed.federation.local_runtime import LocalGrid
from privfed.federation.local_workers import ClientWorkers, worker_count
from privfed.federation.simulation import simulate
from privfed.run.plan import plan_run
from tests.run_records import jsonl, same

TINY = [
    "--dataset", "shapes:240", "-K", "3", "-R", "1.0", "--projection-dim", "16", "-E", "1", "--batch-size", "16",
    "--memory-size", "32", "-L", "4", "-G", "8", "-C", "2", "--seed", "5", "--device", "cpu",
]  # fmt: skip
#: Runs privfed's CLI in a Python where ``import ray`` fails, as on a machine without the extra.
WITHOUT_RAY = "import sys, runpy; sys.modules['ray'] = None; runpy.run_module('privfed.cli', run_name='__main__')"


def privfed_without_ray(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", WITHOUT_RAY, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)


def without_timings(path) -> list[dict]:
    return [{k: v for k, v in record.items() if not k.endswith("seconds")} for record in jsonl(path)]


@pytest.mark.slow
def test_the_same_seed_gives_the_same_metrics_on_both_runtimes(tmp_path, run_privfed):
    local = privfed_without_ray("train", *TINY, "--runtime", "local", "--out", str(tmp_path / "local"))
    assert local.returncode == 0, local.stderr
    assert "round   2  clients 3/3" in local.stdout  # the CLI's per-round line
    ray = run_privfed("train", *TINY, "--runtime", "ray", "--out", str(tmp_path / "ray"))
    assert ray.returncode == 0, ray.stderr
    a, b = without_timings(tmp_path / "local" / "metrics.jsonl"), without_timings(tmp_path / "ray" / "metrics.jsonl")
    assert [r["round"] for r in a] == [0, 1, 2] and a[-1]["clients_completed"] == 3
    for x, y in zip(a, b, strict=True):
        assert same(x, y, rel=1e-6, abs=1e-9), (x, y)


def test_asking_for_ray_without_it_names_the_extra(tmp_path):
    done = privfed_without_ray("train", *TINY, "--runtime", "ray", "--out", str(tmp_path / "run"))
    assert done.returncode == 2
    assert "pip install 'privfed[ray]'" in done.stderr and "--runtime local" in done.stderr
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_an_unknown_runtime_is_refused():
    with pytest.raises(PrivfedError, match="unknown runtime 'threads'"):
        build_config(runtime="threads")


def fail_at_masking(partition: int, flower_round: int):
    """Outer mod: ``partition`` drops out after the key exchange of ``flower_round``, before it trains."""

    def mod(msg, context, call_next):
        configs = msg.content.config_records.get(RECORD_KEY_CONFIGS)
        stage = None if configs is None else configs.get(Key.STAGE)
        this_round = stage == Stage.COLLECT_MASKED_VECTORS and int(msg.metadata.group_id) == flower_round
        if this_round and int(context.node_config["partition-id"]) == partition:
            raise InjectedDropout("dropped before masking")
        return call_next(msg, context)

    return mod


def test_secagg_survives_a_dropout_on_the_local_runtime(tmp_path):
    config = build_config(
        dataset="shapes:300", num_clients=4, participation=1.0, projection_dim=16, local_epochs=1, batch_size=16,
        memory_size=32, num_local_centroids=4, num_global_centroids=8, rounds=2, device="cpu", out=str(tmp_path / "run"),
    )  # fmt: skip
    summary = simulate(plan_run(config), outer_mods=[fail_at_masking(partition=1, flower_round=2)])
    rounds = {r["round"]: r for r in jsonl(tmp_path / "run" / "metrics.jsonl")}
    assert rounds[1]["clients_completed"] == 3 and rounds[1]["client_failures"] == 1  # Flower round 2 is round 1
    assert rounds[1]["knn_accuracy"] is not None and rounds[2]["clients_completed"] == 4
    assert summary["secure_aggregation"]["halted_rounds"] == 0 and summary["stopped_early"] is None


def echo_node(message: Message, context: Context) -> Message:
    """A ClientApp's whole work: count this node's messages in its state, and say who it is."""
    seen = int(context.state.config_records.get("seen", ConfigRecord({"n": 0}))["n"]) + 1
    context.state.config_records["seen"] = ConfigRecord({"n": seen})
    message.content.config_records["shared"]["touched"] = True  # must not reach the other nodes' copies
    node = context.node_config
    reply = ConfigRecord({"partition": node["partition-id"], "of": node["num-partitions"], "seen": seen})
    return Message(RecordDict({"reply": reply}), reply_to=message)


def test_each_node_keeps_its_own_context_and_gets_its_own_copy():
    app = ClientApp()
    app.query()(echo_node)
    grid = LocalGrid(app, num_nodes=3, run_id=7)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 7, 1
    nodes = list(grid.get_node_ids())
    shared = RecordDict({"shared": ConfigRecord({"touched": False})})
    for _ in range(2):
        replies = list(grid.send_and_receive([Message(shared, node, "query") for node in nodes]))
    assert shared.config_records["shared"]["touched"] is False
    answers = {r.metadata.src_node_id: dict(r.content.config_records["reply"]) for r in replies}
    assert answers == {node: {"partition": i, "of": 3, "seen": 2} for i, node in enumerate(nodes)}
    assert len(set(nodes)) == 3 and 1 not in nodes  # distinct, never the SuperLink's id


def noting_the_process(folder: str):
    """Outer mod: notes the process each client's message ran in."""

    def mod(msg, context, call_next):
        (Path(folder) / f"{os.getpid()}").touch()
        return call_next(msg, context)

    return mod


def test_clients_in_worker_processes_give_the_run_of_clients_one_after_another(tmp_path, monkeypatch):
    """The default on a CPU: a round's clients train side by side in worker processes, and the run is the same."""
    config = build_config(
        dataset="shapes:300", num_clients=4, participation=1.0, projection_dim=16, local_epochs=1, batch_size=16,
        memory_size=32, num_local_centroids=4, num_global_centroids=8, rounds=2, seed=2, device="cpu",
        client_cpus=0.5,  # one thread each, and two or more at once on any machine
    )  # fmt: skip
    (tmp_path / "parallel-pids").mkdir()
    simulate(plan_run(config.replace(out=str(tmp_path / "parallel"))), outer_mods=[noting_the_process(str(tmp_path / "parallel-pids"))])
    assert not multiprocessing.active_children()  # the workers ended with the run
    monkeypatch.setattr(local_runtime, "worker_count", lambda config: 1)
    simulate(plan_run(config.replace(out=str(tmp_path / "in-turn"))))
    workers = {int(path.name) for path in (tmp_path / "parallel-pids").iterdir()}
    assert len(workers) >= 2 and os.getpid() not in workers
    a, b = without_timings(tmp_path / "parallel" / "metrics.jsonl"), without_timings(tmp_path / "in-turn" / "metrics.jsonl")
    assert [r["clients_completed"] for r in a] == [4, 4, 4]
    assert a == b  # exactly: the same threads per client, and the server adds the replies in the same order


def test_clients_train_in_parallel_one_thread_each_and_only_where_a_fork_is_safe():
    default = build_config(device="cpu")  # 5 clients a round, 1 CPU each
    assert worker_count(default, cores=2) == 2 and worker_count(default, cores=64) == 5
    assert worker_count(default.replace(client_cpus=0.5), cores=2) == 4  # as Ray: 2 cores / 0.5
    assert worker_count(default.replace(client_cpus=1.5), cores=2) == 1
    assert worker_count(default.replace(client_cpus=2), cores=64) == 1  # a forked child with 2 threads can hang


def exit_on_partition_one(message: Message, context: Context) -> Message:
    """A ClientApp whose partition 1 kills its process, as the kernel's out-of-memory killer would."""
    if context.node_config["partition-id"] == 1:
        os._exit(3)
    return echo_node(message, context)


def test_a_dead_worker_is_a_lost_node_and_the_others_answer():
    app = ClientApp()
    app.query()(exit_on_partition_one)
    grid = LocalGrid(app, num_nodes=3, run_id=7, workers=2)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 7, 1
    nodes = list(grid.get_node_ids())
    try:
        for _ in range(2):  # the second time on a worker started in place of the dead one
            replies = list(grid.send_and_receive([Message(RecordDict({"shared": ConfigRecord()}), n, "query") for n in nodes]))
            assert [r.metadata.src_node_id for r in replies] == nodes  # in the order sent
            assert [r.has_error() for r in replies] == [False, True, False]
            assert "worker process died (exit code 3)" in replies[1].error.reason
        assert dict(replies[2].content.config_records["reply"])["seen"] == 2  # its state came back from the worker
    finally:
        grid.close()
    assert not multiprocessing.active_children()


def test_the_largest_partitions_start_first(tmp_path):
    """A round ends with its last client: the largest started last would train alone while the other cores idle."""
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 7, 1
    started = tmp_path / "started"

    def answer(message: Message, context: Context) -> tuple[Message, Context]:
        with started.open("a") as log:
            log.write(f"{context.node_id}\n")
        return Message(RecordDict(), reply_to=message), context

    contexts = {node: Context(7, node, {}, RecordDict(), {}) for node in (11, 12, 13)}
    workers = ClientWorkers(answer, contexts, count=1, weights={11: 40, 12: 500, 13: 300})
    try:
        workers.submit([(str(node), Message(RecordDict(), node, "query")) for node in contexts])
        assert [workers.take([str(node)])[0] for node in contexts] == ["11", "12", "13"]  # taken in any order asked
    finally:
        workers.close()
    assert started.read_text().split() == ["12", "13", "11"]
