"""Every release goes through one check: finite representations in, well-formed vectors out."""

import pytest
import torch
import torch.nn.functional as F

from mechanisms import Guarantee, Mechanism, Release, ReleaseMechanism, TableRelease, create_mechanism
from mechanisms.base import checked_release


def reps(n: int = 64, dim: int = 16) -> torch.Tensor:
    return F.normalize(torch.randn(n, dim, generator=torch.Generator().manual_seed(0)), dim=1)


def mechanism(name: str) -> Mechanism:
    if name == "ldp":
        from mechanisms.ldp import LshCoresetMechanism

        return LshCoresetMechanism(**LshCoresetMechanism.calibrate(epsilon=1.0, delta=1e-5, num_releases=1))
    return create_mechanism(name)


@pytest.mark.parametrize("name", ["kanon", "ldp", "ldp-sums", "reps"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_representation_stops_every_mechanism(name, bad):
    memory = reps()
    memory[5, 3] = bad
    with pytest.raises(ValueError, match="1 of 64 representations hold NaN or Inf; nothing is released"):
        checked_release(mechanism(name), memory, num_centroids=4, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", ["kanon", "ldp", "ldp-sums", "reps"])
def test_finite_representations_are_released_as_the_mechanism_says(name):
    release = checked_release(mechanism(name), reps(), num_centroids=4, generator=torch.Generator().manual_seed(0))
    assert release.vectors.shape[1] == 16
    if isinstance(release, TableRelease):  # its noisy table; the view may hold no cell at this noise
        assert release.table.shape == (4, 17) and release.num_vectors <= 4
    else:
        assert release.num_vectors > 0


class Broken(ReleaseMechanism):
    """Releases whatever ``output`` says, to check the outgoing half."""

    name = "broken"
    description = "test only"

    def __init__(self, *, vectors: torch.Tensor, weights: torch.Tensor) -> None:
        self.vectors, self.weights = vectors, weights

    def guarantee(self, *, num_reps: int, num_centroids: int) -> Guarantee:
        return Guarantee(kind="none", statement="test")

    def release(self, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator) -> Release:
        return Release(self.vectors, self.weights, self.guarantee(num_reps=len(reps), num_centroids=num_centroids))


@pytest.mark.parametrize(
    "vectors,weights,message",
    [
        (torch.full((2, 16), float("nan")), torch.ones(2), "NaN or Inf values"),
        (torch.ones(2, 16), torch.tensor([1.0, float("inf")]), "NaN or Inf values"),
        (torch.ones(2, 8), torch.ones(2), "8-dimensional vectors from 16-dimensional"),
        (torch.ones(2, 16), torch.tensor([1.0, -1.0]), "negative weights"),
    ],
)
def test_a_malformed_release_is_refused(vectors, weights, message):
    with pytest.raises(ValueError, match=message):
        checked_release(Broken(vectors=vectors, weights=weights), reps(), num_centroids=2, generator=torch.Generator())


def test_input_must_be_a_floating_matrix():
    with pytest.raises(ValueError, match="floating"):
        checked_release(create_mechanism("kanon"), torch.ones(8, 4, dtype=torch.long), num_centroids=2,
                        generator=torch.Generator())


@pytest.mark.parametrize("name", ["kanon", "ldp", "ldp-sums", "reps"])
@pytest.mark.parametrize("method", ["release", "release_with_members"])
def test_a_mechanisms_own_release_refuses_non_finite_input_without_checked_release(name, method):
    """A direct caller of ``ldp.release`` once got sums wrapped by a NaN rounded to -2**63."""
    memory = reps()
    memory[7, 0] = float("nan")
    with pytest.raises(ValueError, match="1 of 64 representations hold NaN or Inf; nothing is released"):
        getattr(mechanism(name), method)(memory, num_centroids=4, generator=torch.Generator().manual_seed(0))


def test_a_third_party_release_refuses_non_finite_input_too():
    memory = reps()
    memory[0, 0] = float("inf")
    broken = Broken(vectors=torch.ones(2, 16), weights=torch.ones(2))
    with pytest.raises(ValueError, match="hold NaN or Inf"):
        broken.release(memory, num_centroids=2, generator=torch.Generator())
    assert broken.release(reps(), num_centroids=2, generator=torch.Generator()).num_vectors == 2
