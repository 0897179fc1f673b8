"""The methods' losses (Orchestra's terms, the baselines') on inputs whose value can be worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from privfed.methods.losses import (
    cluster_consistency_loss,
    mean_best_cosine,
    negative_cosine_loss,
    normalised_target_entropy,
    nt_xent_loss,
    rotation_loss,
    spectral_contrastive_loss,
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


def nt_xent_by_the_definition(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> float:
    """One view at a time: -log(exp(sim(view, partner)/t) / sum over the other 2B-1 views)."""
    views = F.normalize(torch.cat([z1, z2]), dim=1).tolist()
    batch, total = z1.shape[0], 0.0
    for i, view in enumerate(views):
        partner = (i + batch) % (2 * batch)
        sims = {j: sum(a * b for a, b in zip(view, other)) / temperature for j, other in enumerate(views) if j != i}
        total -= sims[partner] - math.log(sum(math.exp(s) for s in sims.values()))
    return total / (2 * batch)


def test_nt_xent_with_identical_views_of_orthogonal_images():
    # Each view's partner has similarity 1, its 2(B-1) other views 0: loss = log(1 + 2(B-1) e^(-1/t)).
    batch, temperature = 4, 0.5
    z = torch.eye(batch, 8)
    expected = math.log(1 + 2 * (batch - 1) * math.exp(-1 / temperature))
    assert nt_xent_loss(z, z.clone(), temperature).item() == pytest.approx(expected, rel=1e-6)


def test_nt_xent_matches_its_definition_and_punishes_swapped_partners():
    z1, z2 = torch.randn(5, 6, generator=torch.Generator().manual_seed(0)), torch.randn(5, 6)
    assert nt_xent_loss(z1, z2, 0.3).item() == pytest.approx(nt_xent_by_the_definition(z1, z2, 0.3), rel=1e-5)
    z = torch.eye(4, 8)
    assert nt_xent_loss(z, z.roll(1, dims=0), 0.5) > nt_xent_loss(z, z, 0.5) + 1  # the partner is now orthogonal


def test_negative_cosine_is_minus_one_aligned_zero_orthogonal_plus_one_opposite():
    z = torch.eye(3, 5)
    assert negative_cosine_loss(2 * z, 3 * z, z, z).item() == pytest.approx(-1.0)  # scale does not matter
    assert negative_cosine_loss(z.roll(1, dims=1), z.roll(1, dims=1), z, z).item() == pytest.approx(0.0)
    assert negative_cosine_loss(-z, -z, z, z).item() == pytest.approx(1.0)


def test_negative_cosine_sends_no_gradient_into_the_targets():
    p = torch.randn(4, 3, requires_grad=True)
    z = torch.randn(4, 3, requires_grad=True)
    negative_cosine_loss(p, p, z, z).backward()
    assert p.grad is not None and p.grad.abs().sum() > 0
    assert z.grad is None


def test_spectral_loss_rewards_aligned_views_and_punishes_collapse():
    orthogonal = torch.eye(4, 6)
    assert spectral_contrastive_loss(orthogonal, orthogonal.clone()).item() == pytest.approx(-2.0)  # the best value
    collapsed = torch.ones(4, 6)
    assert spectral_contrastive_loss(collapsed, collapsed).item() == pytest.approx(-1.0)  # -2 + every negative at 1
    # Scale does not matter: the similarities are cosines.
    assert spectral_contrastive_loss(5 * orthogonal, orthogonal).item() == pytest.approx(-2.0)


@pytest.mark.parametrize("loss", [
    lambda a, b: nt_xent_loss(a, b, 0.5),
    lambda a, b: negative_cosine_loss(a, a, b, b),
    spectral_contrastive_loss,
])
def test_views_of_different_shapes_are_refused(loss):
    with pytest.raises(ValueError, match="one shape"):
        loss(torch.zeros(4, 3), torch.zeros(4, 2))


@pytest.mark.parametrize("loss", [lambda a, b: nt_xent_loss(a, b, 0.5), spectral_contrastive_loss])
def test_the_contrastive_losses_need_a_negative(loss):
    with pytest.raises(ValueError, match="at least two images"):
        loss(torch.ones(1, 3), torch.ones(1, 3))
