import pytest
import torch
import torch.nn as nn

from privfed.errors import PrivfedError
from privfed.models import BACKBONES, OrchestraNetwork, ema_update


@pytest.mark.parametrize("name,dim", [("resnet8", 64), ("resnet20", 64), ("resnet18", 512)])
def test_backbones_map_cifar_images_to_feature_vectors(name, dim):
    net = BACKBONES[name]()
    assert net.feature_dim == dim
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, dim)


def test_resnet18_uses_a_cifar_stem():
    stem_conv = BACKBONES["resnet18"]().stem[0]
    assert stem_conv.kernel_size == (3, 3) and stem_conv.stride == (1, 1)


def test_projector_matches_the_paper():
    net = OrchestraNetwork("resnet8", 32)
    layers = list(net.online.projector)
    assert [type(m) for m in layers] == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear, nn.BatchNorm1d]
    assert layers[0].bias is None and layers[3].bias is None
    assert not layers[4].affine
    assert net.rotation.out_features == 4


def test_the_projector_hidden_width_is_its_own_option():
    layers = list(OrchestraNetwork("resnet8", 32, projection_hidden_dim=128).online.projector)
    assert (layers[0].in_features, layers[0].out_features) == (64, 128)
    assert (layers[3].in_features, layers[3].out_features) == (128, 32)
    assert next(iter(OrchestraNetwork("resnet8", 32).online.projector)).out_features == 32  # default: D


def test_target_encoder_is_not_touched_by_gradients():
    torch.manual_seed(0)
    net = OrchestraNetwork("resnet8", 32)
    before = {k: v.clone() for k, v in net.target.state_dict().items()}
    optimizer = torch.optim.SGD(net.trainable_parameters(), lr=0.5)
    x = torch.randn(8, 3, 32, 32)
    loss = net.online(x).pow(2).sum() + net.target(x).sum() + net.rotation(net.online(x)).sum()
    loss.backward()
    optimizer.step()
    assert all(p.grad is None for p in net.target.parameters())
    assert all(not p.requires_grad for p in net.target.parameters())
    for name, param in net.target.named_parameters():
        assert torch.equal(param, before[name]), name
    assert any(not torch.equal(p, before[n]) for n, p in net.online.named_parameters())


def test_ema_update_moves_target_towards_online():
    torch.manual_seed(0)
    net = OrchestraNetwork("resnet8", 32)
    with torch.no_grad():
        for p in net.online.parameters():
            p.add_(1.0)
    target_before = [p.clone() for p in net.target.parameters()]
    ema_update(net.target, net.online, decay=0.9)
    for t, t0, o in zip(net.target.parameters(), target_before, net.online.parameters()):
        assert torch.allclose(t, 0.9 * t0 + 0.1 * o)


def test_unknown_backbone_is_a_user_error():
    with pytest.raises(PrivfedError, match="unknown backbone"):
        OrchestraNetwork("vgg", 32)
