"""Review: a cohort trains each client as alone (float64) in shapes and methods the first tests leave out.

Memory larger than a client's data (several views of one image kept, the
latest of each), three epochs, clients of two and three images, batch sizes
that give several short-batch sizes at one step, weight decay, and the
ablations whose step leaves a head without a gradient (orchestra-no-rotation)
or takes its targets from the online encoder (orchestra-no-target), or trains
against fixed centroids. Each client takes at most 4 steps (rounding grows
about tenfold per step on this tiny network: tests/orchestra/test_cohort_training.py).
"""

from __future__ import annotations

import pytest
import torch

from privfed.config import build_config
from privfed.data.shapes import make_shapes
from privfed.methods import build_network
from privfed.orchestra.cohort_training import CohortMember, train_cohort
from privfed.orchestra.local_training import LocalTrainingConfig
from privfed.orchestra.model_state import shared_state
from tests.orchestra.test_cohort_training import TOLERANCE, _alone, _assert_same, _max_difference, _together, float64  # noqa: F401


def _setup(method: str, sizes: tuple[int, ...], **changes) -> tuple:
    settings = dict(
        backbone="resnet8", method=method, batch_size=4, local_epochs=2, memory_size=6, projection_dim=16,
        num_global_centroids=5, num_local_centroids=2, mechanism="kanon", weight_decay=0.05,
    )
    config = build_config(**{**settings, **changes})
    torch.manual_seed(1)
    network = build_network(config)
    state = shared_state(network)
    state = {name: tensor + 0.01 * torch.randn_like(tensor) if name.startswith("target.") else tensor for name, tensor in state.items()}
    pool = make_shapes(sum(sizes), seed=4).to_tensor()
    centroids = torch.nn.functional.normalize(torch.randn(5, 16), dim=1)
    return config, LocalTrainingConfig.from_run(config), state, list(pool.split(sizes)), centroids


def _check(config, local, state, images, centroids, slots: int) -> list:
    seeds = [31 + k for k in range(len(images))]
    together = _together(config, local, state, images, centroids, seeds, slots)
    alone = [_alone(config, local, state, image, centroids, seed) for image, seed in zip(images, seeds)]
    for own, cohort in zip(alone, together):
        _assert_same(own, cohort)
    return alone


@pytest.mark.parametrize("slots", [2, 4])
def test_memory_larger_than_the_data_keeps_the_latest_view_of_each_image_as_alone(slots):
    """Three epochs over 2 and 3 images (one batch each epoch), memory 16: every image pushed three times."""
    config, local, state, images, centroids = _setup("orchestra", (3, 2, 3, 2), local_epochs=3, memory_size=16)
    alone = _check(config, local, state, images, centroids, slots)
    for _, result, _ in alone:  # one row per image, not per view
        assert sorted(result.memory_examples.tolist()) == list(range(int(result.num_samples)))


def test_several_short_batch_sizes_at_one_step_train_as_alone():
    """Batch 4 over 5, 6, 7 and 4 images: at the second step the batches are of 1 (dropped), 2, 3 and none."""
    config, local, state, images, centroids = _setup("orchestra", (5, 6, 7, 4, 3), local_epochs=1, memory_size=5)
    _check(config, local, state, images, centroids, 5)


@pytest.mark.parametrize("method", ["orchestra-no-rotation", "orchestra-no-target", "orchestra-fixed-centroids"])
def test_ablations_with_untrained_heads_or_online_targets_train_as_alone_with_weight_decay(method):
    config, local, state, images, centroids = _setup(method, (7, 5, 3), local_epochs=2)
    assert local.weight_decay > 0
    alone = _check(config, local, state, images, centroids, 2)
    if method == "orchestra-no-rotation":  # the head without a gradient is skipped by SGD, weight decay included
        for own_state, _, _ in alone:
            for name in ("rotation.weight", "rotation.bias"):
                assert torch.equal(own_state[name], state[name].double()), name


def test_a_mechanism_that_samples_every_image_after_training_sees_the_same_representations_from_a_cohort():
    """ldp-sums with a secret sample (rate below 1): every image's representation is drawn after training, from the
    trained network and the round generator the cohort hands back; they must be those the client alone computes."""
    from mechanisms import create_mechanism
    from privfed.orchestra.client_update import run_client_round

    config, local, state, images, centroids = _setup("orchestra", (7, 6, 5), local_epochs=1)
    mechanism = create_mechanism("ldp-sums", noise_multiplier=2.0, delta=1e-6, sampling_rate=0.5)
    assert mechanism.input_sampling_rate < 1
    seeds = [5, 6, 7]
    members = [CohortMember(image, torch.Generator().manual_seed(seed)) for image, seed in zip(images, seeds)]
    together = train_cohort(build_network(config).double(), state, centroids, members, local, device=torch.device("cpu"), slots=3)
    for image, seed, trained in zip(images, seeds, together):
        rounds = [
            run_client_round(
                build_network(config).double(), state, centroids, image, train=True, config=local, mechanism=mechanism,
                num_local_centroids=2, seed=seed, device=torch.device("cpu"), trained=cohort,
            )
            for cohort in (None, trained)
        ]
        (alone, alone_private), (batched, batched_private) = rounds
        assert alone_private.memory is not None and batched_private.memory is not None
        assert alone_private.memory.shape[0] == int(image.shape[0])  # every image, not the last batches
        assert torch.equal(batched_private.memory_examples, alone_private.memory_examples)
        assert _max_difference(batched_private.memory, alone_private.memory) <= TOLERANCE
        assert torch.equal(batched_private.release_generator_state, alone_private.release_generator_state)
        for name, delta in alone.delta.items():
            assert _max_difference(batched.delta[name], delta) <= TOLERANCE, name
