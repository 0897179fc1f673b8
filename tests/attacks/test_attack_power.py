"""Power checks: on toy problems the attacks must invert better than their null. A broken attack fails these."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from attacks import get_attack_class
from attacks.base import AttackTarget, represent
from attacks.scoring.image_scores import psnr
from privfed.data import load_dataset
from privfed.data.augment import to_float


def toy_target(dim: int = 32) -> AttackTarget:
    """A fixed random linear encoder of 32x32 images: invertible as far as 32 dimensions allow."""
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, dim))
    return AttackTarget(
        round=1, encoder=encoder, mechanism="reps", mechanism_params={}, centroids=None,
        num_local_centroids=4, memory_size=64, batch_size=32,
    )


def shapes(n: int, split: str) -> torch.Tensor:
    return load_dataset(f"shapes:{n}", split=split, data_dir=Path("data")).to_tensor()


def test_a_decoder_trained_on_auxiliary_images_inverts_unseen_representations_better_than_null():
    target = toy_target()
    aux, private = shapes(600, "train"), shapes(200, "test")[:64]
    inversion = get_attack_class("decoder")(seed=0, steps=150, views=2).fit(target, aux)
    with torch.no_grad():
        released = represent(target.encoder, to_float(private))
    truth = to_float(private)
    score = psnr(inversion(released), truth)
    null = psnr(inversion(released.roll(1, dims=0)), truth)  # another image's vector: no information on this one
    # Measured: 13.8 dB against 11.7 dB after 150 steps; an attack that ignores its input gains nothing.
    assert score.mean() > null.mean() + 1.0, (float(score.mean()), float(null.mean()))
