"""Each baseline's network has the heads its loss uses, and only those travel."""

from __future__ import annotations

import pytest
import torch.nn as nn

from privfed.config import build_config
from privfed.errors import PrivfedError
from privfed.methods import build_network, get_method
from privfed.models import OrchestraNetwork
from privfed.orchestra.model_state import shared_keys


def network(method: str, **options) -> OrchestraNetwork:
    return OrchestraNetwork("resnet8", 16, heads=get_method(method).heads, **options)


def parts(net: OrchestraNetwork) -> set[str]:
    return {name.split(".")[0] for name in shared_keys(net)}


def test_each_method_builds_the_parts_its_loss_uses():
    assert parts(OrchestraNetwork("resnet8", 16)) == {"online", "target", "rotation"}
    assert parts(network("simclr")) == {"online"}
    assert parts(network("simsiam")) == {"online", "predictor"}
    assert parts(network("byol")) == {"online", "target", "predictor"}
    assert parts(network("specloss", num_clusters=8)) == {"online", "cluster_head"}
    supervised = network("supervised", num_classes=10)
    assert parts(supervised) == {"online", "classifier"}
    assert not any(".projector." in key for key in shared_keys(supervised))  # the classifier reads the backbone


def test_the_heads_have_the_shapes_of_the_authors_code_scaled_to_d_and_h():
    simsiam = list(network("simsiam", projection_hidden_dim=24).online.projector)
    assert [type(m) for m in simsiam].count(nn.Linear) == 3 and not simsiam[-1].affine  # ends in BN(affine=False)
    byol = network("byol", projection_hidden_dim=24)
    assert [m.out_features for m in byol.online.projector if isinstance(m, nn.Linear)] == [48, 16]  # 2H, no final BN
    assert [m.out_features for m in byol.head("predictor") if isinstance(m, nn.Linear)] == [48, 16]
    specloss = network("specloss", num_clusters=8)
    assert (specloss.head("cluster_head").in_features, specloss.head("cluster_head").out_features) == (16, 8)


def test_the_trained_parameters_include_the_heads_but_never_the_target():
    net = network("byol")
    trained = {id(p) for p in net.trainable_parameters()}
    assert {id(p) for p in net.head("predictor").parameters()} <= trained
    assert not {id(p) for p in net.target.parameters()} & trained
    assert all(p.requires_grad for p in net.trainable_parameters())


def test_build_network_follows_the_runs_method():
    config = build_config(method="specloss", num_global_centroids=12, projection_dim=16)
    assert build_network(config).head("cluster_head").out_features == 12
    assert build_network(config.replace(method="simclr")).target is None
    assert build_network(config.replace(method="supervised", dataset="shapes:300")).head("classifier").out_features == 10


def test_a_network_missing_a_size_its_heads_need_says_which():
    assert network("simclr").target is None
    with pytest.raises(PrivfedError, match="needs num_clusters"):
        network("specloss")
    with pytest.raises(PrivfedError, match="needs num_classes"):
        network("supervised")
    with pytest.raises(PrivfedError, match="has no predictor head"):
        network("simclr").head("predictor")
