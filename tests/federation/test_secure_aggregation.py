"""SecAgg+ in a real Flower run (the local runtime): what the strategy receives and what the model becomes.

Three clients, all sampled, four training rounds. A mod inside SecAgg+'s
masking records each client's plaintext update (what never leaves the node);
a spy on the strategy records what the server-side code receives. From round
2 on, one client per round drops out, each at a different stage of the
protocol (see DROPOUTS). Flower's own mask expansion is replaced by one
that raises (tests/secagg/flower_prg.py), in this process, where the
local runtime runs the server and every client, so the run also shows that
no code path calls it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from flwr.app.message_type import MessageType
from flwr.common import parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.compat.common import recorddict_compat

from privfed.config import build_config
from privfed.federation.messages import RELEASE_KEYS
from privfed.federation.simulation import simulate
from privfed.federation.strategy import OrchestraStrategy
from privfed.run.plan import plan_run
from privfed.secagg.masks import MASK_PRG
from tests.secagg import flower_prg

#: Orchestra round -> (the client that drops out, the SecAgg+ stage whose request it fails).
DROPOUTS = {2: (0, "collect_masked_vectors"), 3: (1, "setup"), 4: (2, "share_keys")}


def record_plaintext(folder: str):
    """Inner mod: saves the reply the client hands to SecAgg+, before masking."""

    def mod(msg, context, call_next):
        reply = call_next(msg, context)
        if reply.has_error() or msg.metadata.message_type != MessageType.TRAIN:
            return reply  # e.g. the server asking which partition the node holds
        fitres = recorddict_compat.recorddict_to_fitres(reply.content, keep_input=True)
        arrays = parameters_to_ndarrays(fitres.parameters)
        if arrays:
            client = int(context.node_config["partition-id"])
            round_index = int(recorddict_compat.recorddict_to_fitins(msg.content, keep_input=True).config["round"])
            np.savez(
                Path(folder) / f"round{round_index}-client{client}.npz",
                *arrays,
                num_examples=np.array(fitres.num_examples),
            )
        return reply

    return mod


def noting_the_process(folder: str):
    """Outer mod: notes the process the client runs in (where Flower's mask expansion must be replaced)."""

    def mod(msg, context, call_next):
        (Path(folder) / f"client-process-{os.getpid()}-of-{os.getppid()}").touch()
        return call_next(msg, context)

    return mod


def drop_out(msg, context, call_next):
    """Outer mod: the client DROPOUTS names fails when asked for its part of the stage it names."""
    configs = msg.content.config_records.get(RECORD_KEY_CONFIGS)
    if configs is None:  # not a SecAgg+ message (e.g. the server asking which partition the node holds)
        return call_next(msg, context)
    planned = DROPOUTS.get(int(msg.metadata.group_id) - 1)  # Flower round r is Orchestra round r - 1
    if planned is not None and configs.get("stage") == planned[1] and int(context.node_config["partition-id"]) == planned[0]:
        raise RuntimeError(f"simulated dropout at the {planned[1]} stage")
    return call_next(msg, context)


@pytest.fixture(scope="module")
def secagg_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("secagg")
    plaintext = folder / "plaintext"
    plaintext.mkdir()
    processes = folder / "processes"
    processes.mkdir()
    config = build_config(
        dataset="shapes:240", num_clients=3, participation=1.0, alpha=1.0, projection_dim=16,
        local_epochs=1, batch_size=16, memory_size=32, num_local_centroids=4, num_global_centroids=8,
        rounds=4, eval_every=4, out=str(folder / "run"), device="cpu",
    )
    seen: dict[int, dict] = {}
    original = OrchestraStrategy.aggregate_fit

    def spy(self, server_round, results, failures):
        before = self.server.global_state()
        record = {
            "parameters": [parameters_to_ndarrays(res.parameters) for _, res in results],
            "weights": [res.num_examples for _, res in results],
            "clients": [int(res.metrics["client_id"]) for _, res in results],
            "plaintext_keys": [sorted(res.metrics) for _, res in results],
            "scales": self.scales.copy(),
        }
        out = original(self, server_round, results, failures)
        after = self.server.global_state()
        record["moved"] = [(after[k] - before[k]).numpy() for k in self._keys]
        record["before"] = [before[k].numpy() for k in self._keys]
        seen[self.orchestra_round(server_round)] = record
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(OrchestraStrategy, "aggregate_fit", spy)
        flower_prg.replace_flowers_prg(patch)  # the server and, on the local runtime, every client run here
        summary = simulate(
            plan_run(config), outer_mods=[noting_the_process(str(processes)), drop_out],
            inner_mods=[record_plaintext(str(plaintext))],
        )
    metrics = [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
    return {
        "summary": summary, "seen": seen, "plaintext": plaintext, "metrics": metrics, "config": config,
        "client_processes": {path.name for path in processes.iterdir()},
    }


def client_updates(plaintext: Path, round_index: int) -> dict[int, tuple[list[np.ndarray], int]]:
    updates = {}
    for path in sorted(plaintext.glob(f"round{round_index}-client*.npz")):
        data = np.load(path)
        arrays = [data[f"arr_{i}"] for i in range(len(data.files) - 1)]
        updates[int(path.stem.split("client")[1])] = (arrays, int(data["num_examples"]))
    return updates


def quantisation_bound(updates: list[tuple[list[np.ndarray], int]], settings: dict) -> float:
    """Largest error SecAgg+'s fixed point can add to one value of the weighted mean.

    With K clients, weight ratios r_i = n_i / max_weight summing to R, clipping
    range c and Q quantisation levels: stochastic rounding moves each client's
    value by less than one level (2c/Q), and each quantised ratio is within
    0.5/Q of r_i. Together: |SecAgg - FedAvg| <= K (2c + max|x|) / (Q R).
    """
    ratios = [n / settings["max_weight"] for _, n in updates]
    peak = max(float(np.abs(a).max()) for arrays, _ in updates for a in arrays)
    c, levels = settings["clipping_range"], settings["quantization_range"]
    return len(updates) * (2 * c + peak) / (levels * sum(ratios))


def fedavg(updates: list[tuple[list[np.ndarray], int]]) -> list[np.ndarray]:
    total = sum(n for _, n in updates)
    return [sum(arrays[i] * (n / total) for arrays, n in updates) for i in range(len(updates[0][0]))]


def test_the_strategy_receives_only_the_secure_aggregate(secagg_run):
    for round_index in (1, 2):
        received = secagg_run["seen"][round_index]["parameters"]
        clients = client_updates(secagg_run["plaintext"], round_index)
        first = received[0]
        # Every reply carries the same vector: the sum's mean, not a client's update.
        for other in received[1:]:
            assert all(np.array_equal(a, b) for a, b in zip(first, other))
        bound = quantisation_bound(list(clients.values()), secagg_run["summary"]["secure_aggregation"])
        for arrays, _ in clients.values():
            assert max(float(np.abs(a - b).max()) for a, b in zip(first, arrays)) > 100 * bound


def test_a_secagg_reply_shows_the_server_only_its_ids_release_and_dp_sgd_events_in_plaintext(secagg_run):
    """Pins what reaches the strategy beside the masked sum (default kanon, no --report-client-metrics):
    a new plaintext key (a loss, a timing, a share) fails here before it leaks."""
    vectors = [k for k in RELEASE_KEYS if k != "release_table"]  # kanon sends vectors; a table mechanism its table
    expected = sorted(["client_id", "round", "dp_sgd_events", *vectors])
    for round_index in (1, 2):
        keys = secagg_run["seen"][round_index]["plaintext_keys"]
        assert keys and all(k == expected for k in keys), keys


def test_secure_aggregate_equals_fedavg_within_the_quantisation_error(secagg_run):
    settings = secagg_run["summary"]["secure_aggregation"]
    assert settings["enabled"] and settings["num_shares"] == 3 and settings["reconstruction_threshold"] == 2
    seen = secagg_run["seen"][1]
    clients = client_updates(secagg_run["plaintext"], 1)
    assert sorted(clients) == [0, 1, 2]
    updates = list(clients.values())
    expected = fedavg(updates)
    bound = quantisation_bound(updates, settings)
    assert bound < 1e-4
    for got, want in zip(seen["parameters"][0], expected):
        assert np.abs(got - want).max() <= bound
    # ... and the global model moved by exactly that mean, scaled back, tensor by tensor.
    scales = seen["scales"]
    assert secagg_run["metrics"][1]["secagg_rejected_tensors"] == 0
    for moved, want, before, scale in zip(seen["moved"], expected, seen["before"], scales):
        float32_rounding = 2**-22 * (np.abs(before) + np.abs(want * scale))
        assert np.all(np.abs(moved - want * scale) <= bound * scale + float32_rounding)


@pytest.mark.parametrize("round_index", sorted(DROPOUTS))
def test_a_client_dropping_out_at_any_stage_leaves_the_others_aggregated(secagg_run, round_index):
    dropped, stage = DROPOUTS[round_index]
    record = secagg_run["metrics"][round_index]
    assert record["clients_sampled"] == 3 and record["clients_completed"] == 2 and record["client_failures"] == 1
    assert "secagg_halted" not in record, f"a dropout at the {stage} stage halted the round"
    seen = secagg_run["seen"][round_index]
    others = sorted({0, 1, 2} - {dropped})
    assert sorted(seen["clients"]) == others
    survivors = client_updates(secagg_run["plaintext"], round_index)
    assert sorted(survivors) == others  # the dropped client never produced an update
    updates = list(survivors.values())
    bound = quantisation_bound(updates, secagg_run["summary"]["secure_aggregation"])
    for got, want in zip(seen["parameters"][0], fedavg(updates)):
        assert np.abs(got - want).max() <= bound


def test_flowers_mask_expansion_was_replaced_in_every_client_process(secagg_run):
    """The other tests here pass with it raising: neither end of privfed's SecAgg+ calls it."""
    # The local runtime: this process, or its client workers, forked from it with Flower's expansion replaced.
    pids = [name.split("-")[2:] for name in secagg_run["client_processes"]]
    assert pids and all(str(os.getpid()) in pid for pid in pids)
    assert secagg_run["summary"]["secure_aggregation"]["mask_prg"] == MASK_PRG


def test_no_round_halted(secagg_run):
    assert secagg_run["summary"]["rounds"] == 4 and secagg_run["summary"]["secure_aggregation"]["halted_rounds"] == 0
