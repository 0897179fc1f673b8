"""Optimisation inversion (Mahendran and Vedaldi, 2015): maximise ``cos(g(x), c) - tv_weight * TV(x)`` over
sigmoid image logits from several starts, keeping the best (docs/attacks.md); ``g`` runs in training mode.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from attacks.base import Attack, AttackTarget, Inversion, ProgressCallback, check_settings, represent
from attacks.registry import register_attack
from privfed.data.augment import to_float


def total_variation(images: torch.Tensor) -> torch.Tensor:
    """Mean absolute difference of neighbouring pixels, per image (``[m]``)."""
    dx = (images[..., :, 1:] - images[..., :, :-1]).abs().mean(dim=(1, 2, 3))
    dy = (images[..., 1:, :] - images[..., :-1, :]).abs().mean(dim=(1, 2, 3))
    return dx + dy


@register_attack
class OptimizationAttack(Attack):
    """Gradient search in image space for a representation that matches the release."""

    name = "optimization"
    description = "image search maximising cosine to each released vector, total-variation prior, best of several restarts"

    def __init__(
        self, *, seed: int = 0, steps: int = 200, restarts: int = 4, lr: float = 0.1, tv_weight: float = 0.05, chunk: int = 256
    ) -> None:
        super().__init__(seed=seed)
        check_settings(counts={"steps": steps, "restarts": restarts, "chunk": chunk}, rates={"lr": lr}, weights={"tv_weight": tv_weight})
        self.steps, self.restarts, self.lr, self.tv_weight, self.chunk = int(steps), int(restarts), lr, tv_weight, int(chunk)

    def settings(self) -> dict[str, Any]:
        return {
            **super().settings(), "steps": self.steps, "restarts": self.restarts, "lr": self.lr,
            "tv_weight": self.tv_weight,
        }

    def fit(
        self, target: AttackTarget, aux_images: torch.Tensor, *, progress: ProgressCallback | None = None
    ) -> Inversion:
        encoder = target.frozen_encoder().train()
        image_shape = tuple(aux_images.shape[1:])
        # Starts near the auxiliary mean image: a public prior that keeps early steps in the data's range.
        prior = to_float(aux_images).mean(dim=0).clamp(0.02, 0.98)
        generator = torch.Generator().manual_seed(self.seed)
        device = target.device

        def search(vectors: torch.Tensor, chunk_index: int, num_chunks: int) -> torch.Tensor:
            m, r = vectors.shape[0], self.restarts
            goal = F.normalize(vectors.to(device), dim=1).repeat_interleave(r, dim=0)
            spread = 0.5 * torch.randn(m * r, *image_shape, generator=generator)
            start = torch.logit(prior).expand(m * r, *image_shape) + spread
            logits = start.to(device).requires_grad_(True)
            optimizer = torch.optim.Adam([logits], lr=self.lr)
            for step in range(1, self.steps + 1):
                images = torch.sigmoid(logits)
                cosine = (represent(encoder, images) * goal).sum(dim=1)
                loss = (-cosine + self.tv_weight * total_variation(images)).sum()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                if progress is not None and step % max(1, self.steps // 10) == 0:
                    done, total = chunk_index * self.steps + step, num_chunks * self.steps
                    progress("optimization", done, total, {"cosine": float(cosine.mean())})
            with torch.no_grad():
                images = torch.sigmoid(logits)
                cosine = (represent(encoder, images) * goal).sum(dim=1).view(m, r)
                best = cosine.argmax(dim=1)
                return images.view(m, r, *image_shape)[torch.arange(m), best.to(images.device)].cpu()

        def invert(vectors: torch.Tensor) -> torch.Tensor:
            chunks = list(vectors.float().split(max(1, self.chunk // self.restarts)))
            out = [search(chunk, i, len(chunks)) for i, chunk in enumerate(chunks)]
            return torch.cat(out) if out else torch.zeros(0, *image_shape)

        return invert
