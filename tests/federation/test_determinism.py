"""Same seed, same run: sampled clients and every metric, with SecAgg+, on the local runtime.

(``test_local_runtime.py`` checks that Ray's runtime gives the same run, and
that the local runtime's worker processes, which these runs use on a machine of
two cores or more, give the run of clients trained one after another.)

Flower draws node IDs at random, and SecAgg+ rounds updates stochastically;
neither may change what a seeded run computes. (DP noise is the one thing
that must not repeat: these runs use kanon.)
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key

from privfed.config import build_config
from privfed.federation.client import client_seed
from privfed.federation.client_app import rounding_seed
from privfed.federation.simulation import simulate
from privfed.run.plan import plan_run
from tests.run_records import jsonl, same

TIMINGS = ("round_seconds", "elapsed_seconds", "train_seconds", "release_seconds")


def record_masked_vectors(folder: str):
    """Outer mod: a digest of each masked update as it leaves the node (what the server receives),
    and NumPy's next global draw once SecAgg+ is done (what a later mod or plugin would get)."""

    def mod(msg, context, call_next):
        reply = call_next(msg, context)
        configs = reply.content.config_records.get(RECORD_KEY_CONFIGS) if not reply.has_error() else None
        if configs is not None and Key.MASKED_PARAMETERS in configs:
            digest = hashlib.sha256(b"".join(configs[Key.MASKED_PARAMETERS])).hexdigest()
            name = f"round{msg.metadata.group_id}-client{context.node_config['partition-id']}.txt"
            (Path(folder) / name).write_text(f"{digest} {np.random.rand()!r}")
        return reply

    return mod


def run(tmp_path, name: str, seed: int, rounds: int = 3) -> list[dict]:
    config = build_config(
        dataset="shapes:300", num_clients=6, participation=0.5, projection_dim=16, local_epochs=1, batch_size=16,
        memory_size=32, num_local_centroids=4, num_global_centroids=8, rounds=rounds, eval_every=2, seed=seed,
        device="cpu", out=str(tmp_path / name),
    )
    masked = tmp_path / f"{name}-masked"
    masked.mkdir()
    simulate(plan_run(config), outer_mods=[record_masked_vectors(str(masked))])
    metrics = jsonl(tmp_path / name / "metrics.jsonl")
    return [{k: v for k, v in record.items() if k not in TIMINGS} for record in metrics]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("determinism")
    # Another seed needs only its first sampling rounds to show it samples differently.
    return run(folder, "a", seed=3), run(folder, "b", seed=3), run(folder, "c", seed=4, rounds=1), folder


def test_a_seed_fixes_the_sampled_clients(runs):
    first, again, other, _ = runs
    sampled = [record["sampled_clients"] for record in first]
    assert sampled == [record["sampled_clients"] for record in again]
    assert all(len(ids) == 3 for ids in sampled) and len({tuple(ids) for ids in sampled}) > 1  # not always the same three
    assert sampled[: len(other)] != [record["sampled_clients"] for record in other]


def test_a_seed_fixes_every_metric(runs):
    first, again, _, _ = runs
    assert len(first) == 4  # round 0 and three training rounds, all with SecAgg+ after round 0
    for a, b in zip(first, again):
        assert a.keys() == b.keys()
        for key in a:
            assert same(a[key], b[key], rel=1e-6, abs=1e-9), (a["round"], key, a[key], b[key])


def test_the_seed_does_not_reach_the_masks(runs):
    """Same seed, same aggregate, yet every masked update the server receives differs between the runs.

    The seed fixes SecAgg+'s rounding, not its masks (they come from the OS),
    so the server cannot strip a client's mask by replaying the run.
    """
    folder = runs[3]
    first = {p.name: p.read_text().split()[0] for p in (folder / "a-masked").iterdir()}
    again = {p.name: p.read_text().split()[0] for p in (folder / "b-masked").iterdir()}
    assert first and first.keys() == again.keys()  # the same clients masked in the same rounds
    assert all(first[name] != again[name] for name in first)


def test_the_rounding_seed_does_not_predict_later_draws(runs):
    """After SecAgg+ the client's NumPy generator is reseeded from the OS: its next draw differs between runs."""
    folder = runs[3]
    first = {p.name: p.read_text().split()[1] for p in (folder / "a-masked").iterdir()}
    again = {p.name: p.read_text().split()[1] for p in (folder / "b-masked").iterdir()}
    assert first and all(first[name] != again[name] for name in first)


def test_client_and_rounding_seeds_span_64_bits():
    """Per-(round, client) seeds come from 64 bits (they were 32: a million pairs held about 116 shared seeds),
    and every consumer takes them: torch's generators and NumPy's global one."""
    seeds = [client_seed(7, round_index, client) for round_index in range(20) for client in range(50)]
    assert len(set(seeds)) == len(seeds) and all(0 <= s < 2**64 for s in seeds)
    assert sum(s >= 2**32 for s in seeds) > 900  # a uniform 64-bit seed is below 2**32 with probability 2**-32
    torch.Generator().manual_seed(max(seeds))
    words = rounding_seed(7, 1, 0)
    assert len(words) == 2 and rounding_seed(7, 1, 0) == words != rounding_seed(7, 1, 1)
    np.random.seed(words)
    first = np.random.rand()
    np.random.seed(words)
    assert np.random.rand() == first
