"""A third-party training method: a tiny SimSiam, installed only through the ``privfed.methods`` entry point.

A method declares the heads its network carries and computes its loss from
one batch; privfed's one local-training loop does the rest (batches, SGD,
FedAvg under SecAgg+, evaluation). Install it by declaring, in your
package's ``pyproject.toml``::

    [project.entry-points."privfed.methods"]
    tinysiam = "third_party_method:TINYSIAM"

then ``privfed train --method tinysiam``. It clusters nothing, so its clients
release nothing but model updates.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from privfed.data.augment import two_views
from privfed.methods import Batch, Method, StepOutput
from privfed.models import Heads, OrchestraNetwork


class TinySiam(Method):
    """A linear predictor on view 1 chases the stop-gradient projection of view 2, and back."""

    def step(self, network: OrchestraNetwork, batch: Batch) -> StepOutput:
        view1, view2 = two_views(batch.images, generator=batch.generator)
        z1, z2 = network.online(view1), network.online(view2)
        predictor = network.head("tiny_predictor")
        cos = F.cosine_similarity(predictor(z1), z2.detach()) + F.cosine_similarity(predictor(z2), z1.detach())
        loss = -cos.mean() / 2
        return StepOutput(loss, {"loss": loss})


TINYSIAM = TinySiam(
    name="tinysiam",
    description="example plug-in: a tiny SimSiam with a linear predictor (FedAvg, nothing released)",
    heads=Heads(others=(("tiny_predictor", lambda shape: nn.Linear(shape.dim, shape.dim)),)),
)

if __name__ == "__main__":  # a quick look without installing: one step on random images
    torch.manual_seed(0)
    net = OrchestraNetwork("resnet8", 16, heads=TINYSIAM.heads)
    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    print(TINYSIAM.step(net, Batch(images, None, None, 0.1, torch.Generator())).values)
