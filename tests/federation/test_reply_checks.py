"""The k-anonymity the server credits a release: never more than its claim, its lightest centroid or the client's share of its memory."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.common import Code, FitRes, Parameters, Status

from mechanisms import Guarantee, Release, get_mechanism_class
from privfed.federation.messages import encode_release
from privfed.federation.reply_checks import RejectedReply, ReplyRules, check_reply
from privfed.run.plan import plan_run


@pytest.fixture
def kanon_rules(tiny_config, tmp_path):
    plan = plan_run(tiny_config.replace(kanon_min_k=2, out=str(tmp_path / "run")))
    return plan, ReplyRules.of(plan, get_mechanism_class("kanon"))


def reply_with(release: Release, client: int, size: int) -> FitRes:
    metrics = {"client_id": client, **encode_release(release), "dp_sgd_events": json.dumps([])}
    return FitRes(Status(Code.OK, "ok"), Parameters([], ""), size, metrics)


def kanon_release(weights: list[float], k: int | None) -> Release:
    vectors = F.normalize(torch.randn(len(weights), 16, generator=torch.Generator().manual_seed(0)), dim=1)
    return Release(vectors, torch.tensor(weights), Guarantee(kind="k-anonymity", statement="", k=k))


def credited(rules, plan, release: Release, client: int = 0) -> int | None:
    res = reply_with(release, client, plan.client_sizes[client])
    return check_reply(res, client=client, rules=rules, train=False, delta_shapes=None).release.guarantee.k


def test_an_overclaimed_k_is_cut_to_the_lightest_centroid(kanon_rules):
    plan, rules = kanon_rules
    assert credited(rules, plan, kanon_release([3.0, 9.0, 9.0, 9.0], k=8)) == 3


def test_k_never_exceeds_the_clients_memory_over_its_vectors(kanon_rules):
    plan, rules = kanon_rules
    client = min(range(len(plan.client_sizes)), key=lambda c: plan.client_sizes[c])
    share = rules.most_reps(plan.client_sizes[client]) // 4  # its memory's rows: min(size, memory_size)
    heavy = [share + 1.0] * 4  # weights must total at most the memory's rows, so they cannot all exceed the share
    with pytest.raises(RejectedReply, match="total more than"):
        credited(rules, plan, kanon_release(heavy, k=10_000), client)
    assert credited(rules, plan, kanon_release([float(share)] * 4, k=10_000), client) == share


def test_an_empty_release_has_no_k(kanon_rules):
    plan, rules = kanon_rules
    assert credited(rules, plan, Release(torch.zeros(0, 16), torch.zeros(0), Guarantee(kind="k-anonymity", statement="", k=0))) is None


def test_a_release_below_the_runs_min_k_is_rejected(tiny_config, tmp_path):
    plan = plan_run(tiny_config.replace(out=str(tmp_path / "run")))  # kanon, min_k 5
    rules = ReplyRules.of(plan, get_mechanism_class("kanon"))
    with pytest.raises(RejectedReply, match="below the run's min_k 5"):
        credited(rules, plan, kanon_release([4.0, 9.0, 9.0, 9.0], k=4))


@pytest.fixture
def table_rules(tiny_config, tmp_path):
    plan = plan_run(tiny_config.replace(mechanism="ldp-sums", epsilon=10.0, out=str(tmp_path / "run")))
    return plan, ReplyRules.of(plan, get_mechanism_class("ldp-sums"))


def table_reply(plan, rules, *, train: bool, client: int = 0, **tamper) -> FitRes:
    mechanism = get_mechanism_class("ldp-sums")(**rules.mechanism_params)
    config = plan.config
    if train:
        mechanism.observe_global_centroids(F.normalize(torch.randn(config.num_global_centroids, 16), dim=1))
    reps = F.normalize(torch.randn(40, 16, generator=torch.Generator().manual_seed(1)), dim=1)
    release = mechanism.release(reps, num_centroids=config.num_local_centroids, generator=torch.Generator())
    res = reply_with(release, client, plan.client_sizes[client])
    res.metrics.update(tamper)
    return res


@pytest.mark.parametrize("train", [False, True])
def test_the_server_reads_a_table_releases_vectors_from_its_table(table_rules, train):
    plan, rules = table_rules
    res = table_reply(plan, rules, train=train)
    assert set(res.metrics) >= {"release_table"} and "release_vectors" not in res.metrics
    release = check_reply(res, client=0, rules=rules, train=train, delta_shapes=None).release
    assert release.table.shape == (plan.config.num_global_centroids if train else plan.config.num_local_centroids, 17)
    vectors, weights = rules.table_mechanism.table_view(release.table, num_centroids=plan.config.num_local_centroids)
    assert torch.equal(release.vectors, vectors) and torch.equal(release.weights, weights)


def test_a_table_run_refuses_vectors_other_cells_and_inflated_counts(table_rules):
    from flwr.common import ndarray_to_bytes

    plan, rules = table_rules
    honest = table_reply(plan, rules, train=True)
    table = check_reply(honest, client=0, rules=rules, train=True, delta_shapes=None).release.table.numpy()
    inflated = table.copy()
    inflated[0, -1] += 10**9
    cases = {
        "sends its table alone": dict(release_vectors=ndarray_to_bytes(np.zeros((1, 16), np.float32))),
        "not int64": dict(release_table=ndarray_to_bytes(table.astype(np.float64))),
        "int64 \\(": dict(release_table=ndarray_to_bytes(table[:-1])),
        "count lies outside": dict(release_table=ndarray_to_bytes(inflated)),
    }
    for why, tamper in cases.items():
        with pytest.raises(RejectedReply, match=why):
            check_reply(table_reply(plan, rules, train=True, **tamper), client=0, rules=rules, train=True, delta_shapes=None)
    with pytest.raises(RejectedReply, match="int64 \\("):  # round 0's table has the client's own L cells
        check_reply(honest, client=0, rules=rules, train=False, delta_shapes=None)
