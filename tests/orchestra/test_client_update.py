import random

import pytest
import torch

from mechanisms import create_mechanism
from privfed.data import FederatedSplit
from privfed.models import OrchestraNetwork
from privfed.orchestra.client_update import run_client_round
from privfed.orchestra.local_training import LocalTrainingConfig
from privfed.orchestra.model_state import shared_keys, shared_state


def run(config, centroids, seed=0, mechanism="kanon", **params):
    torch.manual_seed(0)
    network = OrchestraNetwork(config.backbone, config.projection_dim)
    return run_client_round(
        OrchestraNetwork(config.backbone, config.projection_dim),
        shared_state(network),
        centroids,
        FederatedSplit.of(config).client_images(0),
        train=centroids is not None,
        config=LocalTrainingConfig.from_run(config),
        mechanism=create_mechanism(mechanism, **params),
        num_local_centroids=config.num_local_centroids,
        seed=seed,
        device=torch.device("cpu"),
    )[0], network


def test_round_zero_releases_centroids_without_training(tiny_config):
    update, _ = run(tiny_config, None)
    assert update.delta is None
    assert update.release.num_vectors == tiny_config.num_local_centroids


def test_training_round_returns_a_delta_for_every_shared_entry(tiny_config):
    centroids = torch.nn.functional.normalize(torch.randn(8, tiny_config.projection_dim), dim=1)
    update, network = run(tiny_config, centroids)
    assert set(update.delta) == set(shared_keys(network))
    assert any(v.abs().sum() > 0 for v in update.delta.values())
    assert update.metrics["steps"] >= 1 and update.metrics["loss"] > 0
    assert update.release.guarantee.k == tiny_config.memory_size // tiny_config.num_local_centroids


def test_client_update_is_reproducible_for_a_seed(tiny_config):
    centroids = torch.nn.functional.normalize(torch.randn(8, tiny_config.projection_dim), dim=1)
    a, _ = run(tiny_config, centroids, seed=3)
    b, _ = run(tiny_config, centroids, seed=3)
    assert torch.equal(a.release.vectors, b.release.vectors)
    assert all(torch.equal(a.delta[k], b.delta[k]) for k in a.delta)


@pytest.mark.parametrize("mechanism", ["ldp", "ldp-sums"])
def test_a_dp_release_draws_noise_the_public_seed_does_not_determine(tiny_config, mechanism):
    """The (ε, δ) claims hold against a server that knows the run seed: its noise comes from the OS CSPRNG."""
    centroids = torch.nn.functional.normalize(torch.randn(8, tiny_config.projection_dim), dim=1)
    a, _ = run(tiny_config, centroids, seed=3, mechanism=mechanism, epsilon=50.0)
    b, _ = run(tiny_config, centroids, seed=3, mechanism=mechanism, epsilon=50.0)
    assert all(torch.equal(a.delta[k], b.delta[k]) for k in a.delta)  # the same training: only the noise differs
    assert not torch.equal(a.release.vectors, b.release.vectors)


def test_a_training_round_reports_whether_the_clustering_bites(tiny_config):
    centroids = torch.nn.functional.normalize(torch.randn(8, tiny_config.projection_dim), dim=1)
    update, _ = run(tiny_config, centroids)
    assert 0.0 < update.metrics["target_entropy"] <= 1.0
    assert -1.0 <= update.metrics["centroid_cosine"] <= 1.0
    assert update.metrics["cluster_loss"] + update.metrics["rotation_loss"] == pytest.approx(update.metrics["loss"], rel=1e-5)


def test_without_dp_sgd_the_update_carries_an_average_of_the_clients_representations(tiny_config):
    """Why the privacy statement names BatchNorm statistics: the server can read a centroid off the delta."""
    torch.manual_seed(0)
    network = OrchestraNetwork(tiny_config.backbone, tiny_config.projection_dim)
    start = shared_state(network)
    batch_means: list[torch.Tensor] = []
    last_norm = network.online.projector[4]  # BatchNorm1d(affine=False) on the online projector's output
    last_norm.register_forward_hook(lambda module, inputs, output: batch_means.append(inputs[0].detach().mean(0)))
    update, _ = run_client_round(
        network, start, None, FederatedSplit.of(tiny_config).client_images(0), train=True,
        config=LocalTrainingConfig.from_run(tiny_config.replace(method="rotpred")), mechanism=None,
        num_local_centroids=4, seed=0, device=torch.device("cpu"),
    )
    assert update.release is None
    key = "online.projector.4.running_mean"
    steps, momentum = len(batch_means), last_norm.momentum
    # What the server computes from the global state it sent and the delta it got back:
    decayed = (1 - momentum) ** steps
    recovered = (start[key] + update.delta[key] - decayed * start[key]) / (1 - decayed)
    weights = torch.tensor([momentum * (1 - momentum) ** (steps - 1 - t) for t in range(steps)])
    truth = (weights[:, None] * torch.stack(batch_means)).sum(0) / weights.sum()
    assert torch.allclose(recovered, truth, atol=1e-5)


def test_a_client_whose_representations_are_not_finite_sends_nothing(tiny_config):
    network = OrchestraNetwork(tiny_config.backbone, tiny_config.projection_dim)
    poisoned = {k: torch.full_like(v, float("nan")) if k.startswith("target.projector") and v.is_floating_point() else v
                for k, v in shared_state(network).items()}
    with pytest.raises(ValueError, match="representations hold NaN or Inf; nothing is released"):
        run_client_round(
            network, poisoned, None, FederatedSplit.of(tiny_config).client_images(0), train=False,
            config=LocalTrainingConfig.from_run(tiny_config), mechanism=create_mechanism("kanon"),
            num_local_centroids=4, seed=0, device=torch.device("cpu"),
        )


def test_a_client_too_small_to_take_a_step_reports_no_losses(tiny_config):
    torch.manual_seed(0)
    network = OrchestraNetwork(tiny_config.backbone, tiny_config.projection_dim)
    one_image = FederatedSplit.of(tiny_config).client_images(0)[:1]  # BatchNorm needs two: no batch at all
    update, _ = run_client_round(
        network, shared_state(network), torch.nn.functional.normalize(torch.randn(8, 16), dim=1), one_image,
        train=True, config=LocalTrainingConfig.from_run(tiny_config), mechanism=None, num_local_centroids=4,
        seed=0, device=torch.device("cpu"),
    )
    assert update.metrics["steps"] == 0
    assert not {"loss", "cluster_loss", "rotation_loss", "target_entropy", "centroid_cosine"} & set(update.metrics)


@pytest.mark.parametrize("min_k,released", [(5, 0), (2, 2)])
def test_k_counts_images_not_the_views_a_long_run_leaves_in_the_memory(tiny_config, min_k, released):
    """4 images trained for 10 epochs fill a memory of 40 with 10 views each: an anonymity set of 4 images at most."""
    torch.manual_seed(0)
    network = OrchestraNetwork(tiny_config.backbone, tiny_config.projection_dim)
    centroids = torch.nn.functional.normalize(torch.randn(8, tiny_config.projection_dim), dim=1)
    config = LocalTrainingConfig.from_run(tiny_config.replace(local_epochs=10, batch_size=2, memory_size=40))
    update, _ = run_client_round(
        network, shared_state(network), centroids, FederatedSplit.of(tiny_config).client_images(0)[:4], train=True,
        config=config, mechanism=create_mechanism("kanon", min_k=min_k), num_local_centroids=8, seed=0,
        device=torch.device("cpu"),
    )
    assert update.metrics["steps"] == 20
    assert update.release.num_vectors == released
    assert update.release.weights.sum() == (4 if released else 0)
    if released:
        assert update.release.guarantee.k == 2 and update.release.weights.tolist() == [2.0, 2.0]


@pytest.mark.parametrize("train", [False, True])
def test_a_mechanism_that_samples_in_secret_is_handed_one_row_per_image_and_keeps_about_its_rate(tiny_config, train):
    """The client hands every image's representation over; the mechanism, not the round's seed, picks the sample."""

    images = FederatedSplit.of(tiny_config).client_images(0)
    network = OrchestraNetwork(tiny_config.backbone, tiny_config.projection_dim)
    centroids = torch.nn.functional.normalize(torch.randn(8, tiny_config.projection_dim), dim=1) if train else None
    mechanism = create_mechanism(
        "ldp-sums", noise_multiplier=0.05, count_threshold=-1e9, sampling_rate=0.5, noise_source=random.Random(7)
    )
    update, private = run_client_round(
        network, shared_state(network), centroids, images, train=train, config=LocalTrainingConfig.from_run(tiny_config),
        mechanism=mechanism, num_local_centroids=tiny_config.num_local_centroids, seed=0, device=torch.device("cpu"),
    )
    n = images.shape[0]
    assert private.memory.shape[0] == n > tiny_config.memory_size
    assert sorted(private.memory_examples.tolist()) == list(range(n))
    assert update.release.events[0].name == "poisson_gaussian"
    assert abs(update.release.metrics["noisy_num_reps"] - n / 2) < 4 * (n * 0.25) ** 0.5 + 1
