"""`ddp-sums` releases nothing per client: the attack reads the decoded secure sum as one release of every summed
client, against a null sum of simulated auxiliary clients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attacks.attackers.aux_releases import aux_views_and_representations, summed_again
from attacks.base import AttackTarget
from attacks.evaluation import SUMMED, attack_run
from mechanisms.ldp_sums import nearest_cells
from privfed.errors import PrivfedError
from tests.attacks.test_attack_run import tiny_run


def ddp_target(noise_multiplier: float) -> AttackTarget:
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.AvgPool2d(8), nn.Flatten(), nn.Linear(48, 8))
    return AttackTarget(
        round=2, encoder=encoder, mechanism="ddp-sums",
        mechanism_params={"noise_multiplier": noise_multiplier, "delta": 1e-6, "min_shares": 2, "modulus": 2**32},
        centroids=nn.functional.normalize(torch.randn(4, 8), dim=1), num_local_centroids=4, memory_size=32,
        batch_size=16,
    )


def test_a_null_sum_decodes_to_the_simulated_clients_cell_counts():
    images = [torch.randint(0, 256, (24, 3, 32, 32), generator=torch.Generator().manual_seed(i), dtype=torch.uint8)
              for i in range(3)]
    target = ddp_target(noise_multiplier=0.1)  # the least noise a share may carry
    vectors, weights = summed_again(target, images, generator=torch.Generator().manual_seed(0))
    assert vectors.shape == (4, 8) and weights.shape == (4,)
    # The same views again (same seed): each simulated client's rows fall in the same cells.
    generator, expected = torch.Generator().manual_seed(0), torch.zeros(4)
    for memory in images:
        reps, _ = aux_views_and_representations(target, memory, generator=generator)
        expected += torch.bincount(torch.as_tensor(nearest_cells(reps.double(), target.centroids.double())), minlength=4)
    assert weights.sum().item() == pytest.approx(72, abs=1.0)
    assert torch.allclose(weights, expected, atol=1.0)
    noisy = summed_again(ddp_target(noise_multiplier=50.0), images, generator=torch.Generator().manual_seed(0))[1]
    assert (noisy - expected).abs().max() > 5  # the shares' noise is in the null sum


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("ddp") / "run", mechanism="ddp-sums", epsilon=10.0, secagg=True, rounds=2)


def test_the_secure_sum_is_attacked_as_one_release_of_the_summed_clients(ddp_run):
    report = attack_run(ddp_run.path, method="decoder", rounds=[1], device="cpu", max_vectors=4,
                        attack_settings={"steps": 2, "batch_size": 8})
    (row,) = report["rounds"]
    assert list(row["membership"].values()) == [SUMMED] and "clients 0, 1, 2" in next(iter(row["membership"]))
    assert row["vectors_released"] == 8 and 0 < row["vectors"] <= 4
    assert {"psnr_best_client", "null_psnr_best_client", "advantage_psnr_best_client"} <= set(row)
    assert "psnr_best_member" not in row  # members unknown: the sum mixes every client's rows
    with pytest.raises(PrivfedError, match="nothing per client to read across rounds"):
        attack_run(ddp_run.path, method="cross-round", rounds=[1], device="cpu")


def test_the_null_sums_as_many_simulated_clients_as_the_secure_sum_holds(ddp_run, monkeypatch):
    import attacks.evaluation as evaluation

    calls = []
    real = evaluation.summed_again

    def counting(target, memories, *, generator):
        calls.append([m.shape[0] for m in memories])
        return real(target, memories, generator=generator)

    monkeypatch.setattr(evaluation, "summed_again", counting)
    attack_run(ddp_run.path, method="decoder", rounds=[1], device="cpu", max_vectors=4,
               attack_settings={"steps": 2, "batch_size": 8})
    # Three clients in the sum; each simulated client holds memory_size (32) of the held-out images.
    assert calls and all(sizes == [32, 32, 32] for sizes in calls), calls


def test_client_models_are_refused_on_a_secagg_run(ddp_run):
    with pytest.raises(PrivfedError, match="round 1 kept no client's update"):
        attack_run(ddp_run.path, method="decoder", rounds=[1], device="cpu", client_models=True,
                   attack_settings={"steps": 1})
