"""Clients receive only the options they read, built from the run's TrainConfig."""

from __future__ import annotations

import json

import torch
from flwr.common import ndarrays_to_parameters

from privfed.config import build_config
from privfed.federation.client_config import ClientConfig
from privfed.federation.strategy import OrchestraStrategy
from privfed.methods import build_network
from privfed.orchestra.model_state import shared_keys
from privfed.orchestra.server import OrchestraServer

#: TrainConfig fields only the server uses: they must never reach a client.
SERVER_ONLY = (
    "rounds", "participation", "epsilon", "delta", "epsilon_per_release", "secagg_shares", "secagg_threshold",
    "secagg_timeout", "out", "eval_every", "knn_k", "knn_temperature", "num_global_centroids", "test_dataset",
    "dp_sgd_epsilon", "dp_sgd_noise_multiplier",
)


def test_client_config_round_trips_through_json(tiny_config):
    config = ClientConfig.of(tiny_config.replace(dp_sgd=True, lr=0.25, client_cpus=2.0, method="orchestra-no-target"))
    again = ClientConfig.from_json(config.to_json())
    assert again == config
    assert again.local.lr == 0.25 and again.threads == 2 and again.dp_sgd
    assert again.method == "orchestra-no-target" and again.local.method == "orchestra-no-target"
    assert again.split.num_clients == tiny_config.num_clients and again.split.download == tiny_config.download


def test_the_fit_message_carries_no_server_only_option(tiny_config):
    config = tiny_config.replace(mechanism="ldp", epsilon=1.0, rounds=7, out="/somewhere/secret", knn_k=17)
    server = OrchestraServer(build_network(config), num_global_centroids=config.num_global_centroids, seed=0)
    strategy = OrchestraStrategy(
        server, ClientConfig.of(config), lambda report: None, clients_per_round=4, seed=config.seed
    )
    arrays = [server.global_state()[k].numpy() for k in shared_keys(server.network)]
    ins = strategy.fit_instructions(1, ndarrays_to_parameters(arrays))
    sent = json.loads(str(ins.config["client_config"]))

    def keys(value):
        if isinstance(value, dict):
            for k, v in value.items():
                yield k
                yield from keys(v)

    assert not set(keys(sent)) & set(SERVER_ONLY)
    assert "/somewhere/secret" not in str(ins.config)
    assert "run_config" not in ins.config


def test_the_client_builds_the_servers_network(tiny_config):
    for dp_sgd, hidden in ((False, None), (True, None), (False, 40)):
        config = tiny_config.replace(dp_sgd=dp_sgd, projection_hidden_dim=hidden)
        server_net, client_net = build_network(config), ClientConfig.of(config).build_network()
        assert shared_keys(server_net) == shared_keys(client_net)
        assert all(a.shape == b.shape for a, b in zip(server_net.state_dict().values(), client_net.state_dict().values()))
        assert client_net.norm == ("group" if dp_sgd else "batch")


def test_client_config_follows_the_run_config():
    config = build_config(dataset="shapes:300", num_clients=3, alpha=0.5, seed=4, backbone="resnet20",
                          projection_dim=24, memory_size=64, num_local_centroids=4, num_global_centroids=8,
                          participation=1.0, device="cpu")
    client = ClientConfig.of(config)
    assert (client.split.dataset, client.split.num_clients, client.split.alpha, client.split.seed) == ("shapes:300", 3, 0.5, 4)
    assert (client.backbone, client.projection_dim, client.local.memory_size, client.num_local_centroids) == (
        "resnet20", 24, 64, 4,
    )
    assert client.device == "cpu" and client.local.dp_sgd is None
    assert torch.equal(client.split.client_images(0), client.split.client_images(0))


def test_a_method_that_releases_nothing_sends_clients_no_mechanism(tiny_config):
    config = tiny_config.replace(method="rotpred", mechanism="reps")
    client = ClientConfig.of(config)
    assert client.mechanism is None and ClientConfig.from_json(client.to_json()).mechanism is None
    assert ClientConfig.of(tiny_config).mechanism == tiny_config.mechanism
