"""Protocol v4 against a server that withholds key shares to isolate a client (it recovered the client's update
before v4).

The server (``tests/secagg/deviating_server.py``) forwards each target only
the shares of ``threshold - 1`` holders, so the target masks with them
alone, then announces survivor sets: the same to every node or different
ones. A node unmasks only for the one set it signed, once ``t`` survivors
signed it. A set that leaves out every holder lacks the target's signature
(every survivor must have sent it shares) and the rest number at most
``n - t < t``; a set that keeps a holder keeps that holder's key, so one
pairwise mask on the target, secret, and the target's own key too unless it
leaves out the target, whose seed then stays secret. For each strategy the
server gets shares of at most one secret of each node, and its best rebuild
of a target's update from the target's masked vector is noise. With the
nodes' consistency checks made permissive, the same server recovers the
updates.
"""

from __future__ import annotations

import pytest
from flwr.app import ConfigRecord
from flwr.supercore.task_identity import TaskIdentity

from privfed.secagg import client_agreement
from privfed.secagg import identity as ids
from privfed.secagg.client_agreement import AgreementRefused
from privfed.secagg.settings import default_threshold
from tests.secagg.deviating_server import Strategy, keyed, play


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    for name, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, name, value, raising=False)


def case(count: int, targets: int) -> tuple[list[int], list[int], list[int]]:
    """Everyone, the targets and their holders (S): one target and the next t - 1 nodes, or 2 targets of 7 after S."""
    everyone, threshold = [100 + i for i in range(count)], default_threshold(count)
    if targets == 1:
        return everyone, everyone[:1], everyone[1:threshold]
    return everyone, everyone[threshold + 1 :], everyone[: threshold - 1]


CASES = {"5 clients": (5, 1), "7 clients": (7, 1), "2 of 7 clients": (7, 2)}


def strategies(everyone: list[int], targets: list[int], holders: list[int]) -> dict[str, Strategy]:
    """Every survivor set a server can announce to reach a target, and ways of showing several."""
    all_, s, t = frozenset(everyone), frozenset(holders), frozenset(targets)
    sets = {
        "without the holders": all_ - s,  # what the old attack told all but the holders
        "without the holders or the targets": all_ - s - t,
        "without one holder": all_ - {holders[0]},  # one holder's key revealed, the others' kept
        "without all holders but one": all_ - set(holders[:-1]),  # one target: as many out as leaves t signers
        "everyone": all_,
        "without the targets": all_ - t,  # a target's key revealed, its seed kept
        "the holders and the targets": s | t,
    }
    shown: dict[str, Strategy] = {name: (lambda node, u=u: [u]) for name, u in sets.items()}
    # The old attack's sets: each holder is told the other holders dropped, everyone else that all holders did.
    shown["different sets: the other holders dropped"] = lambda node: [all_ - (s - {node})]
    shown["different sets: the holders and targets apart"] = lambda node: [s | t] if node in s | t else [all_ - s]
    shown["every set to every node in turn"] = lambda node: list(sets.values())
    return shown


ATTACKS = [(name, count, targets, strategy) for name, (count, targets) in CASES.items()
           for strategy in strategies(*case(count, targets))]


@pytest.mark.parametrize(
    ("count", "targets", "strategy"), [a[1:] for a in ATTACKS], ids=[f"{a[0]}, {a[3]}" for a in ATTACKS]
)
def test_a_server_withholding_shares_recovers_no_update_whatever_survivors_it_announces(count, targets, strategy):
    everyone, target_ids, holders = case(count, targets)
    take = play(count, target_ids, holders, strategies(everyone, target_ids, holders)[strategy])
    assert all(isinstance(err, AgreementRefused) for _, _, err in take.refusals), take.refusals  # no other failure
    assert not [n for n in everyone if take.seed_shares[n] and take.key_shares[n]], take.summary()
    assert len(set(take.answered.values())) <= 1  # the nodes that unmask all do so for one set
    assert min(take.errors.values()) > 1.0, take.summary()  # larger than any update's range: noise


def sign_anything(configs: ConfigRecord, context, trust) -> ConfigRecord:
    return ConfigRecord({ids.SURVIVORS_SIGNATURE_KEY: trust.identity.sign(b"no check")})


def unmask_anything(configs: ConfigRecord, context) -> None:
    for key in (ids.SURVIVORS_KEY, ids.SIGNERS_KEY, ids.SIGNATURES_KEY):
        configs.pop(key, None)  # read, not checked


@pytest.mark.parametrize("removed", ["both checks", "the unmask check"])
@pytest.mark.parametrize(("count", "targets"), CASES.values(), ids=CASES.keys())
def test_without_the_consistency_checks_the_same_server_recovers_the_targets_updates(
    monkeypatch, count, targets, removed
):
    if removed == "both checks":
        monkeypatch.setattr(client_agreement, "sign_survivors", sign_anything)
    monkeypatch.setattr(client_agreement, "check_unmask", unmask_anything)
    everyone, target_ids, holders = case(count, targets)
    old_attack = strategies(everyone, target_ids, holders)["different sets: the other holders dropped"]
    take = play(count, target_ids, holders, old_attack)
    assert len(take.errors) == targets and max(take.errors.values()) < 1e-4, take.summary()


def test_a_node_does_not_mask_with_fewer_neighbours_than_the_threshold_needs():
    """With no pairwise mask its private seed alone, which the threshold of others can rebuild, would unmask it."""
    round_ = keyed(5)
    with pytest.raises(ValueError, match="neighbours' shares arrived"):
        round_.collect(100, round_.sent[100][: default_threshold(5) - 2])
