"""The one local-training loop, with shuffled batches and SGD, is the few lines anyone would write by hand."""

import copy

import pytest
import torch
import torch.nn.functional as F

from privfed.data import FederatedSplit
from privfed.methods import Batch, build_network, get_method
from privfed.models import ema_update
from privfed.orchestra.client_update import train_locally
from privfed.orchestra.local_training import LocalTrainingConfig


@pytest.mark.parametrize("method", ["byol", "orchestra"])
def test_the_loop_is_shuffled_batches_a_methods_step_sgd_and_ema(tiny_config, method):
    config = tiny_config.replace(method=method, local_epochs=2, batch_size=24)
    local = LocalTrainingConfig.from_run(config)
    images = FederatedSplit.of(config).client_images(0)
    centroids = F.normalize(torch.randn(8, 16), dim=1) if method == "orchestra" else None
    torch.manual_seed(0)
    network = build_network(config)
    by_hand = copy.deepcopy(network)
    result = train_locally(network, images, centroids, local, generator=torch.Generator().manual_seed(3), device=torch.device("cpu"))

    generator = torch.Generator().manual_seed(3)
    augment = torch.Generator().manual_seed(int(torch.randint(2**62, (1,), generator=generator)))
    optimizer = torch.optim.SGD(by_hand.trainable_parameters(), lr=local.lr, momentum=local.momentum, weight_decay=local.weight_decay)
    losses = []
    unit = None if centroids is None else F.normalize(centroids, dim=1)
    by_hand.train()
    for _ in range(local.epochs):
        for index in torch.randperm(len(images), generator=generator).split(local.batch_size):
            if len(index) < 2:
                continue  # BatchNorm needs two
            loss = get_method(method).step(by_hand, Batch(images[index], None, unit, local.temperature, augment)).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            ema_update(by_hand.target, by_hand.online, local.ema_decay)
            losses.append(loss.item())

    assert result.num_steps == len(losses) and result.step_means["loss"] == pytest.approx(sum(losses) / len(losses))
    assert all(torch.equal(a, b) for a, b in zip(network.state_dict().values(), by_hand.state_dict().values()))
