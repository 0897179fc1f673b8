"""Orchestra's per-step objective and what each ablation switches off."""

import copy

import pytest
import torch
import torch.nn.functional as F

from privfed.data.augment import orchestra_views
from privfed.methods import Objective
from privfed.models import OrchestraNetwork
from privfed.orchestra.objective import cluster_targets, orchestra_losses


@pytest.fixture()
def step():
    torch.manual_seed(0)
    network = OrchestraNetwork("resnet8", 16).train()
    images = torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8)
    views = orchestra_views(images, generator=torch.Generator().manual_seed(0))
    centroids = F.normalize(torch.randn(8, 16, generator=torch.Generator().manual_seed(1)), dim=1)
    return network, views, centroids


def gradients(network, views, centroids, objective):
    network.zero_grad(set_to_none=True)
    losses = orchestra_losses(network, views, centroids, 0.3, objective)
    losses.total.backward()
    return losses, network


def test_orchestra_trains_both_terms(step):
    network, views, centroids = step
    losses, network = gradients(network, views, centroids, Objective())
    assert losses.cluster > 0 and losses.rotation > 0
    assert torch.allclose(losses.total, losses.cluster + losses.rotation)
    assert network.rotation.weight.grad is not None
    assert 0 < losses.target_entropy <= 1 and -1 <= losses.centroid_cosine <= 1


def test_rotpred_needs_no_centroids_and_clusters_nothing(step):
    network, views, _ = step
    losses, network = gradients(network, views, None, Objective(cluster_loss=False))
    assert losses.cluster == 0 and torch.equal(losses.total, losses.rotation)
    assert losses.target_reps is None  # nothing for a memory to hold
    assert torch.isnan(losses.target_entropy) and torch.isnan(losses.centroid_cosine)
    with pytest.raises(ValueError, match="needs global centroids"):
        orchestra_losses(network, views, None, 0.3, Objective())


def test_without_rotation_the_rotation_head_learns_nothing(step):
    network, views, centroids = step
    losses, network = gradients(network, views, centroids, Objective(rotation_loss=False))
    assert losses.rotation == 0 and torch.equal(losses.total, losses.cluster)
    assert network.rotation.weight.grad is None
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in network.online.parameters())


def test_without_the_target_network_the_online_encoder_sets_the_targets(step):
    network, views, centroids = step
    with torch.no_grad():  # make the target differ from the online encoder
        for p in network.target.parameters():
            p.add_(0.5 * torch.randn_like(p))
    online = cluster_targets(copy.deepcopy(network), views.view1, Objective(ema_targets=False))
    target = cluster_targets(copy.deepcopy(network), views.view1, Objective())
    expected = F.normalize(copy.deepcopy(network).online(views.view1), dim=1)
    assert torch.allclose(online, expected, atol=1e-5)
    assert not torch.allclose(online, target, atol=1e-3)
    assert not online.requires_grad  # targets are constants for the loss
    with_target = orchestra_losses(copy.deepcopy(network), views, centroids, 0.3, Objective())
    without = orchestra_losses(copy.deepcopy(network), views, centroids, 0.3, Objective(ema_targets=False))
    assert not torch.allclose(with_target.cluster, without.cluster)
