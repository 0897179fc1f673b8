"""Learned inversion (He, Zhang and Lee, 2019): a decoder from released vectors back to images, trained on
auxiliary (representation, image) pairs or on the mechanism's releases of auxiliary memories (docs/attacks.md)."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attacks.attackers.aux_releases import aux_releases, aux_views_and_representations
from attacks.base import Attack, AttackTarget, Inversion, ProgressCallback, check_settings
from attacks.registry import register_attack
from privfed.data.augment import to_float
from privfed.errors import PrivfedError


class ImageDecoder(nn.Module):
    """``[m, D]`` unit vectors → ``[m, 3, S, S]`` images in [0, 1], by transposed convolutions from 4×4."""

    def __init__(self, dim: int, image_size: int, *, width: int = 128) -> None:
        super().__init__()
        doublings = math.log2(image_size / 4)
        if image_size < 8 or not doublings.is_integer():
            raise PrivfedError(f"the decoders make square images of 4 * 2**k pixels (8, 16, 32, 64...), not {image_size}")
        self.width = width
        self.stem = nn.Sequential(nn.Linear(dim, width * 16), nn.ReLU())
        layers: list[nn.Module] = []
        channels = width
        for _ in range(int(doublings)):
            out = max(channels // 2, 32)
            layers += [nn.ConvTranspose2d(channels, out, 4, stride=2, padding=1), nn.BatchNorm2d(out), nn.ReLU()]
            channels = out
        layers += [nn.Conv2d(channels, 3, 3, padding=1), nn.Sigmoid()]
        self.body = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.body(self.stem(z).view(z.shape[0], self.width, 4, 4))


def train_decoder(
    inputs: torch.Tensor,
    images: torch.Tensor,
    image_of_input: torch.Tensor,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    generator: torch.Generator,
    device: torch.device,
    progress: ProgressCallback | None = None,
    stage: str = "decoder",
) -> ImageDecoder:
    """Fits a decoder from ``inputs`` to ``images[image_of_input]`` (uint8 or float, indexed per batch) by MSE."""
    decoder = ImageDecoder(inputs.shape[1], images.shape[-1]).to(device)
    optimizer = torch.optim.Adam(decoder.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    decoder.train()
    report_every = max(1, steps // 20)
    running = 0.0
    for step in range(1, steps + 1):
        batch = torch.randint(inputs.shape[0], (batch_size,), generator=generator)
        goal = images[image_of_input[batch]]
        goal = to_float(goal) if goal.dtype == torch.uint8 else goal
        loss = F.mse_loss(decoder(inputs[batch].to(device)), goal.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        running += float(loss.detach())
        if progress is not None and (step % report_every == 0 or step == steps):
            progress(stage, step, steps, {"mse": running / report_every})
            running = 0.0
    return decoder.eval()


def _inversion(decoder: ImageDecoder, device: torch.device) -> Inversion:
    @torch.no_grad()
    def invert(vectors: torch.Tensor) -> torch.Tensor:
        if not len(vectors):
            return vectors.new_zeros(0)
        return torch.cat([decoder(chunk.to(device).float()).cpu() for chunk in vectors.split(512)])

    return invert


@register_attack
class DecoderAttack(Attack):
    """Decoder trained on representations of augmented auxiliary images."""

    name = "decoder"
    description = "learned inverse trained on auxiliary (representation, image) pairs; decodes each released vector"

    def __init__(self, *, seed: int = 0, steps: int = 2000, batch_size: int = 64, lr: float = 2e-3, views: int = 8) -> None:
        super().__init__(seed=seed)
        check_settings(counts={"steps": steps, "batch_size": batch_size, "views": views}, rates={"lr": lr})
        self.steps, self.batch_size, self.lr, self.views = int(steps), int(batch_size), lr, int(views)

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "steps": self.steps, "batch_size": self.batch_size, "lr": self.lr, "views": self.views}

    def fit(
        self, target: AttackTarget, aux_images: torch.Tensor, *, progress: ProgressCallback | None = None
    ) -> Inversion:
        generator = torch.Generator().manual_seed(self.seed)
        reps, image_of_rep = aux_views_and_representations(target, aux_images, generator=generator, passes=self.views)
        inputs, images, image_of_input = self._training_pairs(target, reps, image_of_rep, aux_images, generator)
        decoder = train_decoder(
            inputs, images, image_of_input, steps=self.steps, batch_size=self.batch_size, lr=self.lr,
            generator=generator, device=target.device, progress=progress,
        )
        return _inversion(decoder, target.device)

    def _training_pairs(
        self,
        target: AttackTarget,
        reps: torch.Tensor,
        image_of_rep: torch.Tensor,
        aux_images: torch.Tensor,
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(decoder inputs, target images, the target image of each input): here each view's image."""
        return reps, aux_images, image_of_rep


@register_attack
class ReleaseDecoderAttack(DecoderAttack):
    """Mechanism-aware decoder: trained on the round's mechanism run over auxiliary memories."""

    name = "decoder-releases"
    uses_mechanism = True
    description = (
        "learned inverse trained on the mechanism's releases of auxiliary memories (released vector -> mean image "
        "of its members); for reps it is the plain decoder"
    )

    def __init__(self, *, seed: int = 0, memories: int = 400, **decoder: Any) -> None:
        super().__init__(seed=seed, **decoder)
        check_settings(counts={"memories": memories})
        self.memories = int(memories)

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "memories": self.memories}

    def _training_pairs(
        self,
        target: AttackTarget,
        reps: torch.Tensor,
        image_of_rep: torch.Tensor,
        aux_images: torch.Tensor,
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each vector the mechanism releases from an auxiliary memory, and its members' mean image."""
        released = aux_releases(
            target, reps, image_of_rep, aux_images, num_memories=self.memories, generator=generator
        )
        if released.vectors.shape[0] == 0:
            raise PrivfedError(
                f"{target.mechanism} released nothing with weight from {self.memories} auxiliary memories: "
                "the mechanism-aware decoder has nothing to learn from"
            )
        return released.vectors, released.member_means, torch.arange(released.vectors.shape[0])
