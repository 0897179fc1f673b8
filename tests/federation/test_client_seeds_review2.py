"""Review of issue 44: the clients' 64-bit seeds (training, SecAgg+ rounding) never repeat within a run, and a seed
shared across runs repeats only public randomness, never a release's noise."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mechanisms import create_mechanism
from privfed.config import MAX_SEED, check_seed
from privfed.errors import PrivfedError
from privfed.federation.client import client_seed
from privfed.federation.client_app import rounding_seed


def as_uint64(words: list[int]) -> int:
    return int(np.array(words, dtype=np.uint32).view(np.uint64)[0])


@pytest.mark.parametrize("run_seed", [0, 1, MAX_SEED])
def test_no_two_rounds_or_clients_or_streams_of_a_run_share_a_seed(run_seed):
    """60 rounds x 500 clients, both streams: 60,000 seeds, all distinct (a chance clash has probability ~1e-10)."""
    seeds = [client_seed(run_seed, r, c) for r in range(60) for c in range(500)]
    seeds += [as_uint64(rounding_seed(run_seed, r, c)) for r in range(60) for c in range(500)]
    assert len(set(seeds)) == len(seeds)


def test_seeds_past_32_bits_are_refused_so_seed_sequences_cannot_alias():
    """numpy's SeedSequence reads [s, r, c] as 32-bit words and pads with zeros, so seed s + 2**32 * r, round c,
    client 0 would draw client c's round-r seed of run s; a run seed is one word, which rules that out."""
    s, r, c = 5, 7, 9
    assert client_seed(s + 2**32 * r, c, 0) == client_seed(s, r, c)
    with pytest.raises(PrivfedError, match="seed must be an integer from 0 to"):
        check_seed("seed", 2**32)


def test_two_runs_with_one_seed_release_different_noise():
    """The seeded generator drives only public choices; the noise comes from the OS, so the same seed, data and
    generator state still give two different ldp releases (a server knowing the seed cannot subtract the noise)."""
    mechanism = create_mechanism("ldp", epsilon=8.0)  # enough rows and budget that the release is not all padding
    reps = torch.nn.functional.normalize(torch.randn(2000, 16, generator=torch.Generator().manual_seed(0)), dim=1)
    first, second = (
        mechanism.release(reps, num_centroids=4, generator=torch.Generator().manual_seed(client_seed(1, 3, 2)))
        for _ in range(2)
    )
    assert first.metrics["padded_centroids"] == 0
    assert not torch.equal(first.vectors, second.vectors) and not torch.equal(first.weights, second.weights)
