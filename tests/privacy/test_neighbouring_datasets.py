"""Replace-one neighbours, run through the real client pipeline under the same seed, differ only where the ledger charges.

privfed accounts every mechanism and DP-SGD under replace-one neighbouring
(:mod:`mechanisms.accounting`). This is the property that makes that honest:
with the round seed and the client's secret seeds held fixed, replacing one
image changes that image's own representation in the memory and, when DP-SGD
samples it, its gradient, and nothing else: not the other memory rows, not
the SimHash hyperplanes, not the batches, not the charged events. Removing an
image, by contrast, shifts everything drawn by position, which is why
add/remove-one is not claimed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

import mechanisms.ldp as ldp
import privfed.orchestra.client_update as client_update_module
import privfed.orchestra.dp_sgd_training as dp_sgd_training
from mechanisms import create_mechanism
from privfed.data import FederatedSplit
from privfed.methods import build_network
from privfed.orchestra.client_update import ClientUpdate, run_client_round
from privfed.orchestra.local_training import LocalTrainingConfig
from privfed.orchestra.model_state import shared_state
from privfed.privacy.budget import plan_privacy
from tests.orchestra.secret_seeds import fixed_secret_seeds


class Spy:
    """Records what the pipeline computed on the client in its last run, without changing it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reset()
        released, hashed, sampled = (
            client_update_module.checked_release, ldp.simhash_prefix_codes, dp_sgd_training.poisson_sample
        )

        def release(mechanism, reps, **kwargs):
            self.memory = reps.clone()
            return released(mechanism, reps, **kwargs)

        def simhash(x, hyperplanes, center):
            self.hyperplanes = hyperplanes.clone()
            return hashed(x, hyperplanes, center)

        def poisson(n, rate, generator):
            index = sampled(n, rate, generator)
            self.batches.append(index.clone())
            return index

        monkeypatch.setattr(client_update_module, "checked_release", release)
        monkeypatch.setattr(ldp, "simhash_prefix_codes", simhash)
        monkeypatch.setattr(dp_sgd_training, "poisson_sample", poisson)

    def reset(self) -> None:
        self.memory: torch.Tensor | None = None
        self.hyperplanes: torch.Tensor | None = None
        self.batches: list[torch.Tensor] = []


@dataclass(frozen=True)
class Seen:
    memory: torch.Tensor
    hyperplanes: torch.Tensor
    batches: list[list[int]]


@pytest.fixture
def dp_config(tiny_config):
    return tiny_config.replace(mechanism="ldp", epsilon=4.0, dp_sgd=True, dp_sgd_noise_multiplier=1.0)


@pytest.fixture
def spy(monkeypatch) -> Spy:
    return Spy(monkeypatch)


def run(config, images: torch.Tensor, spy: Spy, *, train: bool) -> tuple[ClientUpdate, Seen]:
    """One client round with the round seed and every secret seed fixed."""
    spy.reset()
    plan = plan_privacy(config, [images.shape[0]] * config.num_clients)
    local = LocalTrainingConfig.from_run(config)
    torch.manual_seed(0)
    network = build_network(config)
    centroids = F.normalize(torch.randn(8, config.projection_dim, generator=torch.Generator().manual_seed(3)), dim=1)
    mechanism = create_mechanism("ldp", **plan.params, noise_source=random.Random(7))
    mechanism.observe_global_centroids(centroids)
    with fixed_secret_seeds(5):
        update, _ = run_client_round(
            network, shared_state(network), centroids if train else None, images, train=train,
            config=local.replace(dp_sgd=None if plan.dp_sgd is None else plan.dp_sgd.settings), mechanism=mechanism,
            num_local_centroids=config.num_local_centroids, seed=11, device=torch.device("cpu"),
        )
    return update, Seen(spy.memory, spy.hyperplanes, [b.tolist() for b in spy.batches])


def rows_without_a_match(a: torch.Tensor, b: torch.Tensor) -> int:
    """Rows of ``a`` equal to no row of ``b``, up to float32 rounding.

    A batched forward pass rounds one row's arithmetic slightly differently
    when another row of the batch changes (differences of about 2e-8 on unit
    vectors, measured); a representation that depends on its own image moves
    by far more than 1e-6.
    """
    return int((torch.cdist(a.double(), b.double()).min(dim=1).values > 1e-6).sum())


def replaced(images: torch.Tensor, index: int, other: torch.Tensor) -> torch.Tensor:
    neighbour = images.clone()
    neighbour[index] = other
    return neighbour


@pytest.mark.parametrize("index", [0, 37, -1])
def test_replacing_one_image_moves_one_memory_row_and_nothing_else_in_round_zero(dp_config, spy, index):
    split = FederatedSplit.of(dp_config)
    images, other = split.client_images(1), split.client_images(2)[0]
    a, spy_a = run(dp_config, images, spy, train=False)
    b, spy_b = run(dp_config, replaced(images, index, other), spy, train=False)
    assert spy_a.memory.shape == spy_b.memory.shape
    assert rows_without_a_match(spy_a.memory, spy_b.memory) <= 1
    assert torch.equal(spy_a.hyperplanes, spy_b.hyperplanes)
    assert a.release.events == b.release.events and a.num_samples == b.num_samples


def test_replacing_an_image_dp_sgd_never_sampled_leaves_the_update_and_the_batches_unchanged(dp_config, spy):
    split = FederatedSplit.of(dp_config)
    images, other = split.client_images(1), split.client_images(2)[0]
    a, spy_a = run(dp_config, images, spy, train=True)
    sampled = {i for batch in spy_a.batches for i in batch}
    unsampled = next(i for i in range(images.shape[0]) if i not in sampled)
    b, spy_b = run(dp_config, replaced(images, unsampled, other), spy, train=True)
    assert spy_a.batches == spy_b.batches
    assert all(torch.equal(a.delta[k], b.delta[k]) for k in a.delta)
    assert rows_without_a_match(spy_a.memory, spy_b.memory) <= 1
    assert torch.equal(spy_a.hyperplanes, spy_b.hyperplanes)
    assert a.privacy_events == b.privacy_events and a.release.events == b.release.events


def test_replacing_a_sampled_image_changes_the_update_but_not_the_batches_or_the_charge(dp_config, spy):
    """The check above can fail: a sampled image moves the update, through its clipped and noised gradient only."""
    split = FederatedSplit.of(dp_config)
    images, other = split.client_images(1), split.client_images(2)[0]
    a, spy_a = run(dp_config, images, spy, train=True)
    sampled = spy_a.batches[0][0]
    b, spy_b = run(dp_config, replaced(images, sampled, other), spy, train=True)
    assert spy_a.batches == spy_b.batches
    assert any(not torch.equal(a.delta[k], b.delta[k]) for k in a.delta)
    assert a.privacy_events == b.privacy_events and a.num_samples == b.num_samples


def test_removing_one_image_moves_other_memory_rows_so_add_remove_is_not_claimed(dp_config, spy):
    """Sampling and augmentation are drawn by position: one image fewer shifts the draws of all the others."""
    images = FederatedSplit.of(dp_config).client_images(1)
    _, spy_a = run(dp_config, images, spy, train=False)
    _, spy_b = run(dp_config, images[1:], spy, train=False)
    assert rows_without_a_match(spy_b.memory, spy_a.memory) > 1


def test_without_dp_sgd_replacing_one_image_moves_other_rows_so_the_unit_is_one_representation(dp_config, spy):
    """BatchNorm normalises each batch by its own statistics: one image changes its batch-mates' representations.

    This is why, without DP-SGD, the statement's unit is one representation
    of the memory (the rest held fixed), not one image (docs/privacy.md).
    """
    config = dp_config.replace(dp_sgd=False, dp_sgd_noise_multiplier=None)
    split = FederatedSplit.of(config)
    images, other = split.client_images(1), split.client_images(2)[0]
    _, spy_a = run(config, images, spy, train=False)
    _, spy_b = run(config, replaced(images, 0, other), spy, train=False)
    assert rows_without_a_match(spy_a.memory, spy_b.memory) > 1
