"""--record-releases keeps exactly what the server had in each round, and nothing of the clients' data beyond it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mechanisms.base import K_ANONYMITY, Guarantee, Release
from privfed.config import TrainConfig
from privfed.errors import PrivfedError
from privfed.run.recording import (
    RecordedRound,
    RecordedSecureSum,
    client_state,
    read_round,
    recorded_rounds,
    round_path,
    write_round,
)
from tests.federation.honest_round import small_round_config

#: A file's keys: what the server sent and received, nothing more.
ROUND_KEYS = {"round", "model_state", "centroids", "mechanism", "mechanism_params", "releases", "updates", "secure_sum"}


def a_round(round_index: int = 3) -> RecordedRound:
    release = Release(torch.randn(2, 4), torch.tensor([5.0, 6.0]), Guarantee(K_ANONYMITY, "k", k=5))
    return RecordedRound.of(
        round_index, model_state={"w": torch.ones(2, 2)}, centroids=torch.eye(4), mechanism="kanon",
        mechanism_params={"min_k": 5}, releases=[(7, release)],
    )


def test_a_round_reads_back_as_written(tmp_path: Path) -> None:
    written = a_round()
    write_round(tmp_path, written)
    read = read_round(tmp_path, 3)
    assert read.round == 3 and read.mechanism == "kanon" and read.mechanism_params == {"min_k": 5}
    assert read.centroids is not None and torch.equal(read.centroids, torch.eye(4))
    assert torch.equal(read.model_state["w"], written.model_state["w"])
    (release,) = read.releases
    assert release.client == 7 and torch.equal(release.vectors, written.releases[0].vectors)
    assert release.weights.tolist() == [5.0, 6.0] and release.guarantee["k"] == 5
    assert recorded_rounds(tmp_path) == [3] and recorded_rounds(tmp_path / "none") == []


def test_a_missing_or_broken_round_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PrivfedError, match="round 2 was not recorded"):
        read_round(tmp_path, 2)
    round_path(tmp_path, 2).write_bytes(b"not a torch file")
    with pytest.raises(PrivfedError, match="cannot read recorded round"):
        read_round(tmp_path, 2)


def test_updates_and_a_secure_sum_read_back_and_an_older_file_has_neither(tmp_path: Path) -> None:
    delta = {"w": torch.full((2, 2), 0.5)}
    summed = RecordedSecureSum(torch.eye(4, dtype=torch.float64), torch.arange(4.0, dtype=torch.float64), (0, 2))
    written = RecordedRound.of(
        4, model_state={"w": torch.ones(2, 2)}, centroids=torch.eye(4), mechanism="kanon", mechanism_params={},
        releases=[], updates={7: delta}, secure_sum=summed,
    )
    write_round(tmp_path, written)
    read = read_round(tmp_path, 4)
    assert read.updates is not None and list(read.updates) == [7] and torch.equal(read.updates[7]["w"], delta["w"])
    assert read.secure_sum is not None and read.secure_sum.clients == (0, 2)
    assert torch.equal(read.secure_sum.vectors, summed.vectors) and torch.equal(read.secure_sum.weights, summed.weights)
    ended = client_state(read, 7)
    assert ended is not None and torch.equal(ended["w"], torch.full((2, 2), 1.5)) and client_state(read, 8) is None
    # A file written before updates and secure sums were kept: both read as None.
    payload = torch.load(round_path(tmp_path, 4), weights_only=True)
    del payload["updates"], payload["secure_sum"]
    torch.save(payload, round_path(tmp_path, 4))
    old = read_round(tmp_path, 4)
    assert old.updates is None and old.secure_sum is None and client_state(old, 7) is None


def recorded_run(out: Path, **changes: object) -> TrainConfig:
    """A real two-round run (4 clients, all sampled) with ``--record-releases``, in ``out``; returns its config."""
    from privfed.federation.simulation import simulate
    from privfed.run.plan import plan_run

    config = small_round_config(
        **{"participation": 1.0, "rounds": 2, "record_releases": True, "mechanism": "reps", "out": str(out), **changes}
    )
    simulate(plan_run(config))
    return config


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[TrainConfig, Path]:
    """A reps run without SecAgg+: the server sees each update in the clear."""
    out = tmp_path_factory.mktemp("plain") / "run"
    return recorded_run(out), out


def test_a_recorded_run_holds_the_state_each_round_started_from_and_no_client_data(
    plain_run: tuple[TrainConfig, Path],
) -> None:
    from privfed.run.directory import RunDirectory, load_network

    config, out = plain_run
    run = RunDirectory(out)
    assert recorded_rounds(run.releases) == [0, 1, 2]
    first, second, last = (read_round(run.releases, r) for r in (0, 1, 2))
    initial = load_network(config, run.checkpoint_path("initial")).state_dict()
    final = load_network(config, run.checkpoint_path("final")).state_dict()
    # Round 0 trains nothing, so rounds 0 and 1 both start from the initial model; round 2 from round 1's result.
    assert all(torch.equal(state.model_state[k], initial[k]) for state in (first, second) for k in state.model_state)
    assert first.centroids is None and second.centroids is not None
    weights = [k for k in last.model_state if k.endswith("weight")]
    assert not any(torch.equal(last.model_state[k], initial[k]) for k in weights)
    assert not any(torch.equal(last.model_state[k], final[k]) for k in weights)  # the state sent, not the one after
    # One release per sampled client, reps: the memory's rows themselves (at most memory_size distinct images).
    assert len(last.releases) == config.clients_per_round
    assert all(0 < r.vectors.shape[0] <= config.memory_size for r in last.releases)
    payload = torch.load(round_path(run.releases, 2), weights_only=True)
    assert set(payload) == ROUND_KEYS and payload["secure_sum"] is None
    assert all(set(r) == {"client", "vectors", "weights", "guarantee"} for r in payload["releases"])
    # Each update's keys are the travelling state's, nothing else of the client.
    assert sorted(payload["updates"]) == list(range(4))
    assert all(set(delta) == set(payload["model_state"]) for delta in payload["updates"].values())


def test_without_secagg_each_update_is_what_the_client_sent(plain_run: tuple[TrainConfig, Path]) -> None:
    from mechanisms import create_mechanism
    from privfed.data.federated import FederatedSplit
    from privfed.federation.client import client_seed
    from privfed.methods import build_network
    from privfed.orchestra.client_update import run_client_round
    from privfed.orchestra.local_training import LocalTrainingConfig
    from privfed.orchestra.model_state import apply_delta, weighted_mean
    from privfed.run.directory import RunDirectory, load_network

    config, out = plain_run
    run = RunDirectory(out)
    assert read_round(run.releases, 0).updates is None  # round 0 initialises: no update
    recorded, after = read_round(run.releases, 1), read_round(run.releases, 2)
    assert recorded.updates is not None and sorted(recorded.updates) == [0, 1, 2, 3]
    assert all(v.dtype == torch.float32 and v.device.type == "cpu" for d in recorded.updates.values() for v in d.values())
    # Client 2's round, computed again from the recorded start state and centroids with its seed.
    client, split = 2, FederatedSplit.of(config)
    update, _ = run_client_round(
        build_network(config), recorded.model_state, recorded.centroids, split.client_images(client), train=True,
        config=LocalTrainingConfig.from_run(config), mechanism=create_mechanism(recorded.mechanism, **recorded.mechanism_params),
        num_local_centroids=config.num_local_centroids, seed=client_seed(config.seed, 1, client),
        device=torch.device("cpu"),
    )
    assert update.delta is not None and set(update.delta) == set(recorded.updates[client])
    assert all(torch.equal(update.delta[k], recorded.updates[client][k]) for k in update.delta)
    ended = client_state(recorded, client)
    assert ended is not None and any(not torch.equal(ended[k], recorded.model_state[k]) for k in ended)
    # FedAvg of the recorded updates is the state the next round started from.
    sizes = split.client_sizes()
    mean = weighted_mean(list(recorded.updates.values()), [float(sizes[c]) for c in recorded.updates])
    expected = apply_delta(recorded.model_state, mean)
    assert all(torch.equal(after.model_state[k], expected[k]) for k in expected)
    final = load_network(config, run.checkpoint_path("final")).state_dict()
    assert after.updates is not None and any(not torch.equal(final[k], after.model_state[k]) for k in after.model_state)


def test_under_secagg_a_secure_sum_is_recorded_as_combine_read_it_and_no_update(tmp_path: Path) -> None:
    from mechanisms import create_mechanism
    from mechanisms.ddp_sums import DdpSumsMechanism
    from mechanisms.ldp_sums import lloyd_step
    from privfed.run.directory import RunDirectory

    config = recorded_run(tmp_path / "run", secagg=True, mechanism="ddp-sums", epsilon=10.0, seed=1)
    run = RunDirectory(tmp_path / "run")
    assert recorded_rounds(run.releases) == [0, 1, 2]
    first, summed, after = (read_round(run.releases, r) for r in (0, 1, 2))
    assert first.secure_sum is None and all(r.updates is None for r in (first, summed, after))  # SecAgg+: sums only
    assert summed.releases == () and summed.secure_sum is not None and summed.secure_sum.clients == (0, 1, 2, 3)
    vectors, weights = summed.secure_sum.vectors, summed.secure_sum.weights
    assert summed.centroids is not None and vectors.shape == summed.centroids.shape and weights.shape == (8,)
    assert torch.allclose(vectors.norm(dim=1)[vectors.norm(dim=1) > 0], torch.ones(1, dtype=torch.float64))
    # The round's Lloyd step, taken again from what was recorded, gives the centroids the next round was sent.
    mechanism = create_mechanism("ddp-sums", **summed.mechanism_params)
    assert isinstance(mechanism, DdpSumsMechanism) and after.centroids is not None
    threshold = mechanism.move_threshold(dim=config.projection_dim, num_summed=4)
    step = lloyd_step(summed.centroids, weights.numpy(), vectors, threshold=threshold, momentum=mechanism.momentum)
    assert torch.equal(step, after.centroids) and not torch.equal(after.centroids, summed.centroids)
    payload = torch.load(round_path(run.releases, 1), weights_only=True)
    assert set(payload) == ROUND_KEYS and payload["updates"] is None
    assert set(payload["secure_sum"]) == {"vectors", "weights", "clients"}
