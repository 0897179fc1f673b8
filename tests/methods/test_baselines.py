"""A baseline's client round: it trains its own loss, releases nothing, and is reproducible from its seed."""

from __future__ import annotations

import pytest
import torch

from privfed.data import FederatedSplit
from privfed.methods import build_network
from privfed.orchestra.client_update import run_client_round
from privfed.orchestra.local_training import LocalTrainingConfig
from privfed.orchestra.model_state import shared_keys, shared_state

BASELINE_LOSSES = ("simclr", "simsiam", "byol", "specloss")


def round_of(config, *, seed=0):
    torch.manual_seed(0)
    start = shared_state(build_network(config))
    update, _ = run_client_round(
        build_network(config), start, None, FederatedSplit.of(config).client_images(0), train=True,
        config=LocalTrainingConfig.from_run(config), mechanism=None, num_local_centroids=config.num_local_centroids,
        seed=seed, device=torch.device("cpu"),
    )
    return update, start


@pytest.mark.parametrize("method", BASELINE_LOSSES)
def test_a_baseline_round_trains_every_shared_part_and_releases_nothing(tiny_config, method):
    config = tiny_config.replace(method=method)
    update, start = round_of(config)
    assert update.release is None and update.privacy_events == ()
    assert set(update.delta) == set(start) == set(shared_keys(build_network(config)))
    moved = {key.split(".")[0] for key, delta in update.delta.items() if delta.abs().sum() > 0}
    assert moved == {key.split(".")[0] for key in start}  # the heads and (BYOL) the EMA target moved too
    assert update.metrics["steps"] >= 1 and torch.isfinite(torch.tensor(update.metrics["loss"]))
    assert set(update.metrics) == {"loss", "train_seconds", "steps"}  # no Orchestra-only diagnostics


def test_the_losses_report_values_in_their_ranges(tiny_config):
    losses = {m: round_of(tiny_config.replace(method=m))[0].metrics["loss"] for m in BASELINE_LOSSES}
    assert -1 <= losses["simsiam"] <= 1 and -1 <= losses["byol"] <= 1
    assert -2 <= losses["specloss"] <= 1
    assert losses["simclr"] > 0


def test_byols_target_follows_the_online_network_by_ema(tiny_config):
    config = tiny_config.replace(method="byol", ema_decay=0.9)
    update, start = round_of(config)
    after = {key: start[key] + update.delta[key] for key in start}
    weight = "online.projector.0.weight"
    online_moved = (after[weight] - start[weight]).norm()
    target_moved = (after[weight.replace("online", "target")] - start[weight.replace("online", "target")]).norm()
    assert 0 < target_moved < online_moved  # a lagging average of the online weights


def test_a_baseline_round_is_a_function_of_its_seed(tiny_config):
    config = tiny_config.replace(method="simclr")
    first, _ = round_of(config, seed=3)
    again, _ = round_of(config, seed=3)
    other, _ = round_of(config, seed=4)
    assert all(torch.equal(first.delta[k], again.delta[k]) for k in first.delta)
    assert not all(torch.equal(first.delta[k], other.delta[k]) for k in first.delta)


def test_supervised_fedavg_learns_a_clients_labels(tiny_config):
    config = tiny_config.replace(method="supervised", local_epochs=8, lr=0.05)
    split = FederatedSplit.of(config)
    images, labels = split.client_images(0), split.client_labels(0)
    assert labels.shape == (images.shape[0],) and int(labels.max()) < config.classifier_outputs
    torch.manual_seed(0)
    network = build_network(config)
    start = shared_state(network)

    def accuracy(state):
        model = build_network(config)
        model.load_state_dict(state, strict=False)
        model.eval()
        with torch.no_grad():
            from privfed.data.augment import normalize, to_float

            predicted = model.head("classifier")(model.online.backbone(normalize(to_float(images)))).argmax(1)
        return float((predicted == labels).float().mean())

    local = LocalTrainingConfig.from_run(config)
    update, _ = run_client_round(network, start, None, images, train=True, config=local, mechanism=None,
                           num_local_centroids=4, seed=0, device=torch.device("cpu"), labels=labels)
    trained = {k: start[k] + update.delta[k] for k in start}
    assert update.release is None and set(update.metrics) == {"loss", "train_seconds", "steps"}
    assert accuracy(trained) > accuracy(start) + 0.2
