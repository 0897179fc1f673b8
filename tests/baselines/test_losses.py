"""The baselines' losses on inputs whose value can be worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from privfed.baselines.losses import negative_cosine_loss, nt_xent_loss, spectral_contrastive_loss


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
