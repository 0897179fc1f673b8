"""A cohort trains each client exactly as it would train alone (float64, to rounding), whoever shares its calls.

Rounding is all that may differ (a grouped convolution sums in another order),
and this tiny network at batch 4 amplifies it about tenfold per step: the
per-client path itself, started from weights moved by 1e-16 relative, ends
7 steps later up to 8e-11 away. So every client here takes at most 4 steps.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from mechanisms import create_mechanism
from privfed.config import build_config
from privfed.data.shapes import make_shapes
from privfed.methods import build_network
from privfed.orchestra.client_update import run_client_round, train_locally
from privfed.orchestra.cohort_training import CohortMember, TrainedMember, train_cohort, trains_in_cohort
from privfed.orchestra.local_training import LocalTrainingConfig
from privfed.orchestra.model_state import shared_state

#: Uneven clients at batch 4: short last batches (7, 2, 6), a trailing batch of one dropped (9, 5), none at all (1).
SIZES = (9, 5, 7, 2, 1, 6, 8)
TOLERANCE = 1e-10


@pytest.fixture(autouse=True)
def float64() -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def _setup(method: str) -> tuple:
    config = build_config(
        backbone="resnet8", method=method, batch_size=4, local_epochs=2, memory_size=6, projection_dim=16,
        num_global_centroids=5, num_local_centroids=2, mechanism="kanon",
    )
    torch.manual_seed(0)
    network = build_network(config)
    state = shared_state(network)
    # A moved global model: the target differs from the online encoder, as after a few rounds.
    state = {name: tensor + 0.01 * torch.randn_like(tensor) if name.startswith("target.") else tensor for name, tensor in state.items()}
    pool = make_shapes(sum(SIZES), seed=0).to_tensor()
    images = list(pool.split(SIZES))
    centroids = torch.nn.functional.normalize(torch.randn(5, 16), dim=1)
    return config, LocalTrainingConfig.from_run(config), state, images, centroids


def _alone(config, local, state, images, centroids, seed: int) -> tuple:
    network = build_network(config).double()
    network.load_state_dict(state, strict=False)
    generator = torch.Generator().manual_seed(seed)
    result = train_locally(network, images, centroids, local, generator=generator, device=torch.device("cpu"))
    return network.state_dict(), result, generator.get_state()


def _together(config, local, state, images, centroids, seeds, slots) -> list[TrainedMember]:
    members = [CohortMember(image, torch.Generator().manual_seed(seed)) for image, seed in zip(images, seeds)]
    return train_cohort(build_network(config).double(), state, centroids, members, local, device=torch.device("cpu"), slots=slots)


def _max_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return float((torch.as_tensor(a).double() - torch.as_tensor(b).double()).abs().max()) if a.numel() else 0.0


def _assert_same(alone: tuple, together: TrainedMember, tolerance: float = TOLERANCE) -> None:
    state, result, generator_state = alone
    assert together.state.keys() == state.keys()
    for name, tensor in state.items():
        assert _max_difference(together.state[name], tensor) <= tolerance, name
    assert torch.equal(together.result.memory_examples, result.memory_examples)
    assert together.result.memory.shape == result.memory.shape
    assert _max_difference(together.result.memory, result.memory) <= tolerance
    assert together.result.step_means.keys() == result.step_means.keys()
    for name, value in result.step_means.items():
        assert abs(together.result.step_means[name] - value) <= tolerance, name
    assert (together.result.num_steps, together.result.num_samples) == (result.num_steps, result.num_samples)
    assert torch.equal(together.generator_state, generator_state)


#: f-SimCLR's contrast of 4 images at τ 0.1 amplifies rounding a hundredfold more: alone, from weights moved by
#: 1e-16 relative, its 6-image client ends 9e-9 away (a cohort: 1e-9).
SIMCLR_TOLERANCE = 1e-8


@pytest.mark.parametrize(
    ("method", "slots", "tolerance"),
    [
        *(("orchestra", slots, TOLERANCE) for slots in (1, 3, len(SIZES))),
        *((method, 3, TOLERANCE) for method in ("rotpred", "byol", "simsiam", "specloss")),
        ("simclr", 3, SIMCLR_TOLERANCE),
    ],
)
def test_every_client_of_a_cohort_ends_as_it_would_alone(method, slots, tolerance):
    """Slots 1 and 3 reuse freed slots (a fresh optimizer each); 7 trains every client in every call."""
    config, local, state, images, centroids = _setup(method)
    seeds = [100 + k for k in range(len(SIZES))]
    together = _together(config, local, state, images, centroids, seeds, slots)
    for k, (image, seed) in enumerate(zip(images, seeds)):
        _assert_same(_alone(config, local, state, image, centroids, seed), together[k], tolerance)


def test_a_clients_training_does_not_depend_on_who_shares_its_calls():
    config, local, state, images, centroids = _setup("orchestra")
    seeds = [100 + k for k in range(len(SIZES))]
    everyone = _together(config, local, state, images, centroids, seeds, len(SIZES))
    others = [0, 5, 2]  # client 2 (7 images) with two others, in another order and another slot
    some = _together(config, local, state, [images[k] for k in others], centroids, [seeds[k] for k in others], 2)
    mine = some[others.index(2)]
    for name, tensor in everyone[2].state.items():
        assert _max_difference(mine.state[name], tensor) <= TOLERANCE, name
    assert _max_difference(mine.result.memory, everyone[2].result.memory) <= TOLERANCE


def test_a_round_from_a_cohorts_training_sends_what_the_client_alone_sends():
    """Delta, release and step means of :func:`run_client_round`, with the cohort's training standing in."""
    config, local, state, images, centroids = _setup("orchestra")
    seeds = [7, 8, 9]
    chosen = [images[0], images[5], images[6]]
    together = _together(config, local, state, chosen, centroids, seeds, 2)
    for image, seed, trained in zip(chosen, seeds, together):
        updates = [
            run_client_round(
                build_network(config).double(), state, centroids, image, train=True, config=local,
                mechanism=create_mechanism("kanon"), num_local_centroids=2, seed=seed, device=torch.device("cpu"),
                trained=cohort,
            )[0]
            for cohort in (None, trained)
        ]
        alone, batched = updates
        assert alone.delta is not None and batched.delta is not None
        for name, delta in alone.delta.items():
            assert _max_difference(batched.delta[name], delta) <= TOLERANCE, name
        assert alone.release is not None and batched.release is not None
        assert _max_difference(batched.release.vectors, alone.release.vectors) <= TOLERANCE
        timings = {"train_seconds", "release_seconds"}
        assert alone.metrics.keys() == batched.metrics.keys()
        for name in alone.metrics.keys() - timings:
            assert abs(batched.metrics[name] - alone.metrics[name]) <= TOLERANCE, name


def test_dp_sgd_and_methods_without_a_batched_step_train_alone():
    assert trains_in_cohort(LocalTrainingConfig.from_run(build_config(method="orchestra"))) is None
    assert "does not declare" in str(trains_in_cohort(LocalTrainingConfig.from_run(build_config(method="supervised"))))
    config, local, state, images, centroids = _setup("orchestra")
    with pytest.raises(ValueError, match="at least one slot"):
        _together(config, local, state, images[:1], centroids, [0], 0)
