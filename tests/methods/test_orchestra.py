"""Orchestra's step, and what each ablation switches off."""

import copy

import pytest
import torch
import torch.nn.functional as F

from privfed.data.augment import orchestra_views
from privfed.methods import Batch, get_method
from privfed.models import OrchestraNetwork


@pytest.fixture()
def step():
    torch.manual_seed(0)
    network = OrchestraNetwork("resnet8", 16).train()
    images = torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8)
    centroids = F.normalize(torch.randn(8, 16, generator=torch.Generator().manual_seed(1)), dim=1)
    return network, images, centroids


def gradients(network, images, centroids, method):
    network.zero_grad(set_to_none=True)
    out = get_method(method).step(network, Batch(images, None, centroids, 0.3, torch.Generator().manual_seed(0)))
    out.loss.backward()
    return out, out.values


def test_orchestra_trains_both_terms(step):
    network, images, centroids = step
    out, values = gradients(network, images, centroids, "orchestra")
    assert values["cluster_loss"] > 0 and values["rotation_loss"] > 0
    assert torch.allclose(out.loss, values["cluster_loss"] + values["rotation_loss"])
    assert network.rotation.weight.grad is not None
    assert 0 < values["target_entropy"] <= 1 and -1 <= values["centroid_cosine"] <= 1
    assert out.target_reps.shape == (6, 16) and not out.target_reps.requires_grad
    assert tuple(values) == get_method("orchestra").step_values


def test_rotpred_needs_no_centroids_and_clusters_nothing(step):
    network, images, _ = step
    out, values = gradients(network, images, None, "rotpred")
    assert values["cluster_loss"] == 0 and torch.equal(out.loss, values["rotation_loss"])
    assert out.target_reps is None  # nothing for a memory to hold
    assert set(values) == {"loss", "cluster_loss", "rotation_loss"}
    with pytest.raises(ValueError, match="needs global centroids"):
        gradients(network, images, None, "orchestra")


def test_without_rotation_the_rotation_head_learns_nothing(step):
    network, images, centroids = step
    out, values = gradients(network, images, centroids, "orchestra-no-rotation")
    assert values["rotation_loss"] == 0 and torch.equal(out.loss, values["cluster_loss"])
    assert network.rotation.weight.grad is None
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in network.online.parameters())


def test_without_the_target_network_the_online_encoder_sets_the_targets(step):
    network, images, centroids = step
    with torch.no_grad():  # make the target differ from the online encoder
        for p in network.target.parameters():
            p.add_(0.5 * torch.randn_like(p))
    view1 = orchestra_views(images, generator=torch.Generator().manual_seed(0)).view1
    online = get_method("orchestra-no-target").representations(copy.deepcopy(network), view1)
    target = get_method("orchestra").representations(copy.deepcopy(network), view1)
    expected = F.normalize(copy.deepcopy(network).online(view1), dim=1)
    assert torch.allclose(online, expected, atol=1e-5)
    assert not torch.allclose(online, target, atol=1e-3)
    assert not online.requires_grad  # targets are constants for the loss
    with_target, _ = gradients(copy.deepcopy(network), images, centroids, "orchestra")
    without, _ = gradients(copy.deepcopy(network), images, centroids, "orchestra-no-target")
    assert not torch.allclose(with_target.values["cluster_loss"], without.values["cluster_loss"])
