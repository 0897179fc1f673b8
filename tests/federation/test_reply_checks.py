"""The k-anonymity the server credits a release: never more than its claim, its lightest centroid or the client's share of its memory."""

from __future__ import annotations

import json

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
