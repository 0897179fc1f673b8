"""DP-SGD local training: exact per-sample gradients, bounded influence, noise, events, memory."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from opacus.optimizers import DPOptimizer

from mechanisms import create_mechanism
from privfed.config import DEFAULTS
from privfed.data import FederatedSplit
from privfed.data.augment import OrchestraViews, orchestra_views
from privfed.methods import ORCHESTRA, get_method
from privfed.models import OrchestraNetwork
from privfed.orchestra.client_update import DP_SGD_METRICS, run_client_round, train_locally
from privfed.orchestra.dp_sgd_training import dp_optimizer, dp_step, per_sample_gradients
from privfed.orchestra.local_training import LocalTrainingConfig
from privfed.orchestra.memory_sampling import poisson_memory
from privfed.orchestra.model_state import shared_state
from privfed.privacy.dp_sgd_plan import DpSgdSettings
from tests.orchestra.secret_seeds import fixed_secret_seeds

TEMPERATURE = 0.3


@pytest.fixture(scope="module")
def batch():
    """A real batch: views of four client images, global centroids, a GroupNorm network."""
    from privfed.config import build_config

    config = build_config(dataset="shapes:300", num_clients=4, participation=1.0, num_global_centroids=8)
    images = FederatedSplit.of(config).client_images(0)[:4]
    views = orchestra_views(images, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    network = OrchestraNetwork("resnet8", 16, norm="group").train()
    centroids = F.normalize(torch.randn(8, 16, generator=torch.Generator().manual_seed(1)), dim=1)
    return network, views, centroids


def subset(views: OrchestraViews, index: list[int]) -> OrchestraViews:
    return OrchestraViews(views.view1[index], views.view2[index], views.view3[index], views.rotation_labels[index])


def named_trainable(network):
    return [*network.online.named_parameters(), *(("rotation." + n, p) for n, p in network.head("rotation").named_parameters())]


@pytest.mark.parametrize("method", ["orchestra", "orchestra-no-target", "rotpred"])
def test_per_sample_gradients_equal_each_example_trained_alone(batch, method):
    network, views, centroids = batch
    network = copy.deepcopy(network)
    method = get_method(method)
    with per_sample_gradients(network, method):
        method.step_on_views(network, views, centroids, TEMPERATURE).loss.backward()
        per_sample = {name: p.grad_sample.clone() for name, p in named_trainable(network)}
    assert all(not hasattr(p, "grad_sample") for p in network.parameters())  # hooks and attributes gone
    for i in range(4):
        network.zero_grad(set_to_none=True)
        method.step_on_views(network, subset(views, [i]), centroids, TEMPERATURE).loss.backward()
        for name, p in named_trainable(network):
            assert torch.allclose(per_sample[name][i], p.grad, rtol=1e-4, atol=1e-6), (name, i)


def test_without_the_rotation_loss_dp_sgd_steps_only_the_encoder(tiny_config):
    config = tiny_config.replace(method="orchestra-no-rotation")
    centroids = F.normalize(torch.randn(8, config.projection_dim), dim=1)
    with fixed_secret_seeds(3):
        update = dp_round(config, centroids)
    assert all(not update.delta[k].any() for k in update.delta if k.startswith("rotation."))
    assert any(update.delta[k].abs().sum() > 0 for k in update.delta if k.startswith("online."))


def summed_clipped_gradient(network, views, centroids, clip):
    """One real DP-SGD step with no noise, lr 1 and no averaging: minus the update is the clipped sum."""
    network = copy.deepcopy(network)
    before = [p.detach().clone() for p in network.trainable_parameters()]
    with per_sample_gradients(network, ORCHESTRA):
        optimizer = DPOptimizer(
            torch.optim.SGD(network.trainable_parameters(), lr=1.0),
            noise_multiplier=0.0,
            max_grad_norm=clip,
            expected_batch_size=1,
        )
        dp_step(optimizer, ORCHESTRA.step_on_views(network, views, centroids, TEMPERATURE).loss)
    return torch.cat([(b - p.detach()).flatten() for b, p in zip(before, network.trainable_parameters())])


def test_clipping_bounds_what_one_example_can_change(batch):
    network, views, centroids = batch
    clip = 0.05
    full = summed_clipped_gradient(network, views, centroids, clip)
    for removed in (0, 3):
        others = [i for i in range(4) if i != removed]
        without = summed_clipped_gradient(network, subset(views, others), centroids, clip)
        influence = (full - without).norm()
        assert influence <= clip * (1 + 1e-4)
        assert influence >= clip * 0.999  # every raw gradient is far above the bound, so it is reached
    unclipped = summed_clipped_gradient(network, views, centroids, 1e6) - summed_clipped_gradient(
        network, subset(views, [1, 2, 3]), centroids, 1e6
    )
    assert unclipped.norm() > 10 * clip  # without clipping one example moves the update much more


def test_an_empty_poisson_batch_still_adds_calibrated_noise(batch):
    network, _, _ = batch
    network = copy.deepcopy(network)
    before = torch.cat([p.detach().flatten().clone() for p in network.trainable_parameters()])
    config = LocalTrainingConfig.from_run(DEFAULTS).replace(lr=0.1, momentum=0.0, weight_decay=0.0)
    settings = DpSgdSettings(noise_multiplier=2.0, max_grad_norm=0.5)
    with per_sample_gradients(network, ORCHESTRA) as hooks:
        optimizer = dp_optimizer(hooks, config, settings, expected_batch_size=4.0, noise_generator=torch.Generator().manual_seed(0))
        dp_step(optimizer, None)
    change = torch.cat([p.detach().flatten() for p in network.trainable_parameters()]) - before
    assert change.std().item() == pytest.approx(0.1 * 2.0 * 0.5 / 4.0, rel=0.03)
    assert abs(change.mean().item()) < 1e-3


def test_dp_sgd_refuses_a_batch_norm_network(batch):
    _, _, centroids = batch
    config = LocalTrainingConfig.from_run(DEFAULTS, DpSgdSettings(1.0, 1.0))
    with pytest.raises(ValueError, match='norm="group"'):
        train_locally(
            OrchestraNetwork("resnet8", 16), torch.zeros(4, 3, 32, 32, dtype=torch.uint8), centroids, config,
            generator=torch.Generator(), device=torch.device("cpu"),
        )


def dp_round(config, centroids):
    torch.manual_seed(0)
    network = OrchestraNetwork(config.backbone, config.projection_dim, norm="group")
    settings = DpSgdSettings(noise_multiplier=0.8, max_grad_norm=1.0)
    local = LocalTrainingConfig.from_run(config, settings)
    update, _ = run_client_round(
        copy.deepcopy(network),
        shared_state(network),
        centroids,
        FederatedSplit.of(config).client_images(2),
        train=True,
        config=local,
        mechanism=create_mechanism("kanon"),
        num_local_centroids=config.num_local_centroids,
        seed=5,
        device=torch.device("cpu"),
    )
    return update


def test_dp_sgd_round_trains_reports_its_cost_and_keeps_losses_home(tiny_config):
    centroids = F.normalize(torch.randn(8, tiny_config.projection_dim), dim=1)
    with fixed_secret_seeds(11):
        a = dp_round(tiny_config, centroids)
    n = a.num_samples
    assert any(v.abs().sum() > 0 for v in a.delta.values())
    (event,) = a.privacy_events
    assert event.name == "poisson_gaussian"
    assert event.params == {
        "sampling_rate": min(1.0, tiny_config.batch_size / n),
        "noise_multiplier": 0.8,
        "count": float(tiny_config.local_epochs * math.ceil(n / tiny_config.batch_size)),
    }
    assert set(a.metrics) <= set(DP_SGD_METRICS) and "loss" not in a.metrics
    assert a.metrics["steps"] == event.params["count"]
    # Sampling and noise are secret: the public seed alone does not reproduce the update.
    with fixed_secret_seeds(11):
        b = dp_round(tiny_config, centroids)
    c = dp_round(tiny_config, centroids)
    assert all(torch.equal(a.delta[k], b.delta[k]) for k in a.delta)
    assert any(not torch.equal(a.delta[k], c.delta[k]) for k in a.delta)


def test_round_zero_under_dp_sgd_releases_from_a_poisson_memory(tiny_config):
    torch.manual_seed(0)
    network = OrchestraNetwork(tiny_config.backbone, tiny_config.projection_dim, norm="group")
    local = LocalTrainingConfig.from_run(tiny_config, DpSgdSettings(1.0, 1.0))
    update, _ = run_client_round(
        network, shared_state(network), None, FederatedSplit.of(tiny_config).client_images(2), train=False, config=local,
        mechanism=create_mechanism("reps"), num_local_centroids=4, seed=0, device=torch.device("cpu"),
    )
    assert update.delta is None and update.privacy_events == ()
    assert update.release.num_vectors > 0  # reps releases the memory itself


def test_poisson_memory_is_an_uncapped_poisson_sample_of_examples(batch):
    network, _, _ = batch
    images = torch.randint(0, 256, (60, 3, 32, 32), dtype=torch.uint8)
    cpu = torch.device("cpu")

    def memory(size: int, seed: int, net=network) -> torch.Tensor:
        config = LocalTrainingConfig.from_run(DEFAULTS).replace(memory_size=size)
        return poisson_memory(net, images, config, generator=torch.Generator().manual_seed(seed), device=cpu)[0]

    assert memory(128, 0).shape == (60, 16)  # rate 1: every example exactly once, none twice
    sizes = [memory(15, seed).shape[0] for seed in range(12)]
    assert len(set(sizes)) > 1 and max(sizes) <= 60  # a Poisson count, no cap
    assert 10 <= sum(sizes) / len(sizes) <= 20
    with pytest.raises(ValueError, match="GroupNorm"):
        memory(15, 0, net=OrchestraNetwork("resnet8", 16))


@pytest.mark.parametrize("method", ["simclr", "specloss", "byol"])
def test_the_training_loop_itself_refuses_dp_sgd_for_a_method_it_does_not_cover(tiny_config, method):
    """The configuration refuses these; the loop must too, or a library caller gets DP-SGD events for a coupled batch."""
    from privfed.methods import build_network

    config = tiny_config.replace(method=method)
    local = LocalTrainingConfig.from_run(config, DpSgdSettings(1.0, 1.0))
    images = FederatedSplit.of(config).client_images(0)
    with pytest.raises(ValueError, match=r"couples its batch|covers Orchestra"):
        train_locally(
            build_network(config.replace(dp_sgd=True)), images, None, local,
            generator=torch.Generator().manual_seed(0), device=torch.device("cpu"),
        )
