"""GroupNorm networks for DP-SGD: no BatchNorm anywhere, per-sample outputs, loadable checkpoints."""

import pytest
import torch
import torch.nn as nn
from opacus.validators import ModuleValidator

from privfed.config import build_config
from privfed.errors import PrivfedError
from privfed.methods import build_network
from privfed.models import OrchestraNetwork, network_norm
from privfed.models.norms import group_count
from privfed.run.directory import load_network


def test_group_norm_network_has_no_batch_norm_in_either_encoder():
    net = OrchestraNetwork("resnet8", 16, norm="group")
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in net.modules())
    assert ModuleValidator.validate(net, strict=False) == []
    assert ModuleValidator.validate(OrchestraNetwork("resnet8", 16), strict=False)  # BatchNorm is refused
    last = net.online.projector[-1]
    assert isinstance(last, nn.GroupNorm) and last.num_groups == 1 and not last.affine
    assert isinstance(net.target.projector[-1], nn.GroupNorm)


def test_group_norm_outputs_do_not_depend_on_the_rest_of_the_batch():
    torch.manual_seed(0)
    net = OrchestraNetwork("resnet8", 16, norm="group").train()
    x = torch.randn(5, 3, 32, 32)
    together = net.online(x)
    alone = torch.cat([net.online(x[i : i + 1]) for i in range(5)])
    assert torch.allclose(together, alone, atol=1e-5)
    batch_net = OrchestraNetwork("resnet8", 16).train()
    assert not torch.allclose(batch_net.online(x)[:2], batch_net.online(x[:2]), atol=1e-3)


def test_group_counts_keep_at_least_four_channels_per_group():
    assert [group_count(c) for c in (16, 32, 64, 128, 512, 12)] == [4, 8, 16, 32, 32, 3]


def test_the_run_config_decides_the_norm_and_checkpoints_load_back(tmp_path):
    config = build_config(dataset="shapes:100", dp_sgd=True)
    assert network_norm(dp_sgd=True) == "group" and network_norm(dp_sgd=False) == "batch"
    net = build_network(config)
    assert net.norm == "group"
    path = tmp_path / "ckpt.pt"
    torch.save({"network": net.state_dict(), "centroids": None, "round": 0}, path)
    loaded = load_network(config, path)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in net.state_dict().items())
    with pytest.raises(PrivfedError, match="cannot load checkpoint"):
        load_network(config.replace(dp_sgd=False), path)


def test_unknown_norm_is_a_user_error():
    with pytest.raises(PrivfedError, match="unknown normalisation"):
        OrchestraNetwork("resnet8", 16, norm="layer")
