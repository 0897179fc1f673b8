"""Clients build the options they read from their declared run; the server sends none of them."""

from __future__ import annotations

import torch

from privfed.config import build_config
from privfed.federation.client_config import ClientConfig
from privfed.models import build_network
from privfed.orchestra.model_state import shared_keys
from tests.federation.honest_round import instructions

SECAGG_ENCODING = ("secagg_max_weight", "secagg_clipping_range", "secagg_quantization_range", "secagg_modulus_range")

def test_the_fit_message_carries_only_the_rounds_values(tiny_config):
    """The client reads its options from its declared run; the server sends no option at all."""
    config = tiny_config.replace(mechanism="ldp", epsilon=1.0, rounds=7, out="/somewhere/secret", knn_k=17)
    assert set(instructions(config, train=False).config) == {"task", "round"}
    assert set(instructions(config).config) == {"task", "round", "centroids", "secagg_scales", *SECAGG_ENCODING}
    assert set(instructions(config.replace(secagg=False)).config) == {"task", "round", "centroids"}


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
    assert client.mechanism is None
    assert ClientConfig.of(tiny_config).mechanism == tiny_config.mechanism
