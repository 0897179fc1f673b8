"""Inverting with the model each client ended its round with, where the server saw its update (``--no-secagg``)."""

from __future__ import annotations

import pytest
import torch

from attacks import get_attack_class
from attacks.evaluation import RoundModel, attack_run, attack_target, fitted_client_models
from privfed.errors import PrivfedError
from privfed.methods import build_network, get_method
from privfed.orchestra.model_state import load_shared_state
from privfed.run.recording import client_state, read_round
from tests.attacks.test_attack_run import tiny_run


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("client-models") / "kanon", mechanism="kanon", kanon_min_k=4)


class CountingDecoder(get_attack_class("decoder")):  # type: ignore[misc]
    """The real decoder, counting the encoders it is fitted to."""

    fitted: list[torch.nn.Module]

    def fit(self, target, aux_images, *, progress=None):
        self.fitted.append(target.encoder)
        return super().fit(target, aux_images, progress=progress)


def test_each_client_is_attacked_under_its_own_model_after_local_training(plain_run):
    config = plain_run.config()
    recorded = read_round(plain_run.releases, 1)
    round_target = attack_target(config, recorded, torch.device("cpu"))
    attack = CountingDecoder(steps=2, batch_size=8)
    attack.fitted = []
    aux = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    models = fitted_client_models(
        attack, config, recorded, RoundModel(round_target, lambda v: v), aux, progress=None, say=lambda _: None
    )
    assert len(models) == len(recorded.releases) == len(attack.fitted) == 3  # one fit per client, none shared
    for model, release, fitted in zip(models, recorded.releases, attack.fitted):
        ended = client_state(recorded, release.client)
        assert ended is not None and fitted is model.target.encoder
        network = build_network(config)
        load_shared_state(network, ended)
        expected = get_method(config.method).encoder(network).state_dict()
        own, sent = model.target.encoder.state_dict(), round_target.encoder.state_dict()
        assert all(torch.equal(own[k], expected[k]) for k in expected)  # this client's encoder after its round
        assert any(not torch.equal(own[k], sent[k]) for k in own if own[k].dtype.is_floating_point)


def test_client_models_are_refused_where_the_server_never_saw_an_update(plain_run):
    with pytest.raises(PrivfedError, match="round 0 kept no client's update"):
        attack_run(plain_run.path, method="decoder", rounds=[0], device="cpu", client_models=True,
                   attack_settings={"steps": 1})
    with pytest.raises(PrivfedError, match="cannot invert with client models"):
        attack_run(plain_run.path, method="cross-round", rounds=[1], device="cpu", client_models=True)


def test_an_attack_with_client_models_says_so_beside_its_scores(plain_run):
    report = attack_run(plain_run.path, method="decoder", rounds=[1], device="cpu", max_vectors=4, client_models=True,
                        attack_settings={"steps": 2, "batch_size": 8})
    (row,) = report["rounds"]
    assert row["models"].startswith("each client's own") and row["vectors"] == 4
    assert {"psnr_best_member", "null_psnr_best_member", "advantage_psnr_best_member"} <= set(row)
