import math

import pytest
import torch
import torch.nn.functional as F

from privfed.orchestra.loss import (
    cluster_consistency_loss,
    mean_best_cosine,
    normalised_target_entropy,
    rotation_loss,
)


def test_cluster_loss_is_cross_entropy_of_soft_assignments():
    g = torch.Generator().manual_seed(0)
    t = F.normalize(torch.randn(4, 8, generator=g), dim=1)
    o = F.normalize(torch.randn(4, 8, generator=g), dim=1)
    mu = F.normalize(torch.randn(5, 8, generator=g), dim=1)
    loss = cluster_consistency_loss(t, o, mu, temperature=0.1)
    p = torch.softmax(t @ mu.T / 0.1, 1)
    q = torch.softmax(o @ mu.T / 0.1, 1)
    assert torch.isclose(loss, -(p * q.log()).sum(1).mean(), atol=1e-5)


def test_cluster_loss_sends_no_gradient_to_the_target_side():
    g = torch.Generator().manual_seed(1)
    t = F.normalize(torch.randn(4, 8, generator=g), dim=1).requires_grad_()
    o = F.normalize(torch.randn(4, 8, generator=g), dim=1).requires_grad_()
    mu = F.normalize(torch.randn(5, 8, generator=g), dim=1)
    cluster_consistency_loss(t, o, mu, 0.1).backward()
    assert t.grad is None and o.grad is not None


def test_cluster_loss_is_minimal_when_views_agree_confidently():
    mu = torch.eye(4)
    agree = cluster_consistency_loss(mu, mu, mu, temperature=0.01)
    disagree = cluster_consistency_loss(mu, mu.roll(1, 0), mu, temperature=0.01)
    assert agree < 1e-3 < disagree


def test_rotation_loss_of_uniform_logits_is_log4():
    assert math.isclose(float(rotation_loss(torch.zeros(3, 4), torch.tensor([0, 1, 3]))), math.log(4), rel_tol=1e-6)


def test_cluster_loss_is_the_mean_of_per_sample_losses():
    """No sample's loss depends on the others (DP-SGD's per-sample gradients rely on it)."""
    g = torch.Generator().manual_seed(2)
    t = F.normalize(torch.randn(6, 8, generator=g), dim=1)
    o = F.normalize(torch.randn(6, 8, generator=g), dim=1)
    mu = F.normalize(torch.randn(5, 8, generator=g), dim=1)
    alone = torch.stack([cluster_consistency_loss(t[i : i + 1], o[i : i + 1], mu, 0.1) for i in range(6)])
    assert torch.isclose(cluster_consistency_loss(t, o, mu, 0.1), alone.mean(), atol=1e-6)


def test_target_entropy_is_one_for_uniform_targets_and_falls_as_they_sharpen():
    centroids = F.normalize(torch.randn(8, 16, generator=torch.Generator().manual_seed(0)), dim=1)
    reps = centroids[:4].clone()  # each sits on a centroid
    assert normalised_target_entropy(reps, centroids, temperature=1e6).item() == pytest.approx(1.0, abs=1e-6)
    soft = normalised_target_entropy(reps, centroids, temperature=1.0).item()
    sharp = normalised_target_entropy(reps, centroids, temperature=0.01).item()
    assert 1.0 > soft > sharp >= 0.0 and sharp < 0.05


def test_mean_best_cosine_is_one_on_the_centroids_and_lower_off_them():
    centroids = F.normalize(torch.randn(8, 16, generator=torch.Generator().manual_seed(1)), dim=1)
    assert mean_best_cosine(centroids[:3], centroids).item() == pytest.approx(1.0, abs=1e-6)
    off = F.normalize(torch.randn(50, 16, generator=torch.Generator().manual_seed(2)), dim=1)
    assert mean_best_cosine(off, centroids).item() < 0.9
