"""Alignment, uniformity and the tuning score on embeddings whose values are known."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from privfed.evaluation.align_uniform import (
    AlignUniform,
    alignment,
    client_align_uniform,
    mean_over_clients,
    tuning_score,
    uniformity,
)


def test_alignment_is_the_mean_cosine_of_the_two_views():
    z = torch.eye(4, 6)
    assert alignment(z, 3 * z) == pytest.approx(1.0)
    assert alignment(z, z.roll(1, dims=1)) == pytest.approx(0.0)
    assert alignment(z, torch.cat([z[:2], -z[2:]])) == pytest.approx(0.0)  # two aligned, two opposite


def test_uniformity_of_orthogonal_collapsed_and_antipodal_points():
    # Orthonormal images: every pair of different images has cos 0, so the value is -log(e^-t)/(2t) = 1/2.
    z = torch.eye(4, 6)
    assert uniformity(z, z, t=0.2) == pytest.approx(0.5)
    assert uniformity(z, z, t=2.0) == pytest.approx(0.5)
    # Collapse: every pair coincides, exp(0) = 1, value 0.
    assert uniformity(torch.ones(4, 6), torch.ones(4, 6)) == pytest.approx(0.0)
    # Two antipodal images, both views on the point: all 4 pairs of different images have cos -1.
    pair = torch.tensor([[1.0, 0.0], [-1.0, 0.0]])
    assert uniformity(pair, pair, t=0.5) == pytest.approx(1.0)  # -log(e^{-2t})/(2t) = 1


def test_uniformity_uses_only_pairs_of_different_images():
    # Views of one image disagree completely, different images agree: alignment -1, uniformity still 0.
    a = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    assert alignment(a, -a) == pytest.approx(-1.0)
    t = 0.2
    # Pairs of different images: within a view cos 1, across views cos -1 -> mean of e^0 and e^{-2t}, half each.
    expected = -math.log((1 + math.exp(-2 * t)) / 2) / (2 * t)
    assert uniformity(a, -a, t=t) == pytest.approx(expected)


def test_the_score_weighs_uniformity_by_one_fifth():
    assert tuning_score(0.5, 1.0) == pytest.approx(0.7)
    assert AlignUniform(0.5, 1.0).score == pytest.approx(0.7)
    assert mean_over_clients([AlignUniform(1.0, 0.0), AlignUniform(0.0, 1.0)]) == AlignUniform(0.5, 0.5)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="one shape"):
        alignment(torch.zeros(3, 2), torch.zeros(3, 4))
    with pytest.raises(ValueError, match="at least two images"):
        uniformity(torch.ones(1, 2), torch.ones(1, 2))
    with pytest.raises(ValueError, match="no client"):
        mean_over_clients([])


def test_a_clients_score_is_seeded_and_sees_a_collapsed_encoder():
    images = torch.randint(0, 256, (10, 3, 32, 32), dtype=torch.uint8)
    collapsed = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 4), nn.Linear(4, 4))
    with torch.no_grad():
        collapsed[1].weight.zero_()  # every image maps to the same point: perfectly aligned, not uniform at all
    score = client_align_uniform(collapsed, images, batch_size=4, seed=0, device=torch.device("cpu"))
    assert score.alignment == pytest.approx(1.0) and score.uniformity == pytest.approx(0.0, abs=1e-6)
    spread = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 8))
    first = client_align_uniform(spread, images, batch_size=4, seed=0, device=torch.device("cpu"))
    assert first == client_align_uniform(spread, images, batch_size=4, seed=0, device=torch.device("cpu"))
    assert first.uniformity > 0.1 and first.alignment < 1
