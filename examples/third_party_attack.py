"""A third-party inversion attack: each released vector becomes the nearest public image.

Copy this file into your own package and declare the class in the
``privfed.attacks`` entry-point group of its ``pyproject.toml``::

    [project.entry-points."privfed.attacks"]
    nearest-aux = "mypkg.third_party_attack:NearestAuxAttack"

Once the package is installed, ``privfed attacks`` lists it and
``privfed attack RUN_DIR --method nearest-aux`` scores it against the same
null and ground truth as the built-in attacks (``tests/test_third_party_attack.py``).
Like them it sees only what the server knows (``AttackTarget``) and public
auxiliary images. It embeds every auxiliary image with the round's encoder
(in eval mode, a simplification: clients embed in training-mode batches) and
inverts a vector to the image of highest cosine similarity: a retrieval
baseline that needs no training.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attacks.base import Attack, AttackTarget, Inversion, ProgressCallback, check_settings, represent


class NearestAuxAttack(Attack):
    name = "nearest-aux"
    description = "example plug-in: the auxiliary image whose representation is nearest to the released vector"

    def __init__(self, *, seed: int = 0, batch_size: int = 256) -> None:
        super().__init__(seed=seed)
        check_settings(counts={"batch_size": batch_size})
        self.batch_size = int(batch_size)

    def settings(self) -> dict[str, int]:
        return {**super().settings(), "batch_size": self.batch_size}

    def fit(self, target: AttackTarget, aux_images: torch.Tensor, *, progress: ProgressCallback | None = None) -> Inversion:
        encoder = target.frozen_encoder().eval()
        images = aux_images.to(target.device).float() / 255
        batches = images.split(self.batch_size)
        embedded = []
        with torch.no_grad():
            for done, batch in enumerate(batches, start=1):
                embedded.append(represent(encoder, batch))
                if progress is not None:
                    progress(self.name, done, len(batches), {})
        library = torch.cat(embedded)

        def invert(vectors: torch.Tensor) -> torch.Tensor:
            nearest = (F.normalize(vectors.to(library), dim=1) @ library.T).argmax(dim=1)
            return images[nearest]

        return invert
