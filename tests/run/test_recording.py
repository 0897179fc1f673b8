"""--record-releases keeps exactly what the server had in each round, and nothing of the clients' data beyond it."""

from __future__ import annotations

import pytest
import torch

from mechanisms.base import K_ANONYMITY, Guarantee, Release
from privfed.errors import PrivfedError
from privfed.run.recording import RecordedRound, read_round, recorded_rounds, round_path, write_round


def a_round(round_index: int = 3) -> RecordedRound:
    release = Release(torch.randn(2, 4), torch.tensor([5.0, 6.0]), Guarantee(K_ANONYMITY, "k", k=5))
    return RecordedRound.of(
        round_index, model_state={"w": torch.ones(2, 2)}, centroids=torch.eye(4), mechanism="kanon",
        mechanism_params={"min_k": 5}, releases=[(7, release)],
    )


def test_a_round_reads_back_as_written(tmp_path):
    written = a_round()
    write_round(tmp_path, written)
    read = read_round(tmp_path, 3)
    assert read.round == 3 and read.mechanism == "kanon" and read.mechanism_params == {"min_k": 5}
    assert torch.equal(read.model_state["w"], written.model_state["w"]) and torch.equal(read.centroids, torch.eye(4))
    (release,) = read.releases
    assert release.client == 7 and torch.equal(release.vectors, written.releases[0].vectors)
    assert release.weights.tolist() == [5.0, 6.0] and release.guarantee["k"] == 5
    assert recorded_rounds(tmp_path) == [3] and recorded_rounds(tmp_path / "none") == []


def test_a_missing_or_broken_round_is_a_clear_error(tmp_path):
    with pytest.raises(PrivfedError, match="round 2 was not recorded"):
        read_round(tmp_path, 2)
    round_path(tmp_path, 2).write_bytes(b"not a torch file")
    with pytest.raises(PrivfedError, match="cannot read recorded round"):
        read_round(tmp_path, 2)


def test_a_recorded_run_holds_the_state_each_round_started_from_and_no_client_data(tmp_path, tiny_config):
    from privfed.federation.simulation import simulate
    from privfed.run.directory import RunDirectory, load_network
    from privfed.run.plan import plan_run

    config = tiny_config.replace(rounds=2, record_releases=True, secagg=False, mechanism="reps", out=str(tmp_path / "run"))
    simulate(plan_run(config))
    run = RunDirectory(tmp_path / "run")
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
    assert set(payload) == {"round", "model_state", "centroids", "mechanism", "mechanism_params", "releases"}
    assert all(set(r) == {"client", "vectors", "weights", "guarantee"} for r in payload["releases"])
