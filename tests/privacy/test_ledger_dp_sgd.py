"""One ledger for DP-SGD and releases: combined and per-part epsilons, checked against dp_accounting."""


import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.pld import privacy_loss_distribution as pld
from dp_accounting.privacy_accountant import NeighboringRelation

from mechanisms.base import Guarantee, PrivacyEvent
from privfed.privacy.ledger import (
    DP_SGD,
    RELEASES,
    LedgerEntry,
    PrivacyLedger,
    events_from_json,
    events_to_json,
)

DELTA = 1e-5
RELEASE = (
    PrivacyEvent("discrete_laplace", {"noise_parameter": 0.8, "sensitivity": 1.0, "count": 11.0}),
    PrivacyEvent("gaussian", {"noise_multiplier": 2.0, "count": 1.0}),
)
TRAINING = (PrivacyEvent("poisson_gaussian", {"sampling_rate": 0.1, "noise_multiplier": 1.2, "count": 40.0}),)
DP = Guarantee(kind="differential-privacy", statement="test")


def by_hand(releases: int, rounds: int) -> float:
    """Releases and DP-SGD steps composed from dp_accounting's PLDs under replace-one."""
    parts = []
    if releases:
        counts = pld.from_discrete_laplace_mechanism(0.8, value_discretization_interval=1e-4).self_compose(2 * 11 * releases)
        sums = pld.from_gaussian_mechanism(2.0 / releases**0.5, sensitivity=2.0, value_discretization_interval=1e-4)
        parts += [counts, sums]
    if rounds:
        step = pld.from_gaussian_mechanism(1.2, sampling_prob=0.1, value_discretization_interval=1e-4,
                                           neighboring_relation=NeighboringRelation.REPLACE_ONE)
        parts.append(step.self_compose(40 * rounds))
    total = parts[0]
    for part in parts[1:]:
        total = total.compose(part)
    return total.get_epsilon_for_delta(DELTA)


def ledger_with_history() -> PrivacyLedger:
    ledger = PrivacyLedger(mechanism="ldp", delta=DELTA)
    for round_index in range(3):
        ledger.record(LedgerEntry(0, round_index, "ldp", DP, RELEASE))
        if round_index > 0:
            ledger.record(LedgerEntry.dp_sgd(0, round_index, TRAINING))
    ledger.record(LedgerEntry(1, 0, "ldp", DP, RELEASE))
    ledger.record(LedgerEntry.dp_sgd(2, 1, TRAINING * 3))
    return ledger


def test_combined_and_each_part_match_dp_accounting():
    ledger = ledger_with_history()
    worst = ledger.worst_case_summary()
    assert worst.client == 0
    assert worst.epsilon == pytest.approx(by_hand(3, 2), rel=0.01)
    releases, dp_sgd = ledger.spent(0, RELEASES), ledger.spent(0, DP_SGD)
    assert releases == pytest.approx(by_hand(3, 0), rel=0.01)
    assert dp_sgd == pytest.approx(by_hand(0, 2), rel=0.01)
    assert worst.epsilon < releases + dp_sgd
    assert worst.dp_sgd_worst == pytest.approx(by_hand(0, 3), rel=0.01)  # client 2 trained more
    assert ledger.worst_case(DP_SGD)[0] == 2
    assert ledger.worst_case(RELEASES) == (0, ledger.spent(0, RELEASES))


def test_early_stop_look_ahead_counts_releases_only():
    ledger = PrivacyLedger(mechanism="ldp", delta=DELTA)
    ledger.record(LedgerEntry(0, 0, "ldp", DP, RELEASE))
    before = ledger.worst_case_after(RELEASE)
    ledger.record(LedgerEntry.dp_sgd(0, 1, TRAINING * 50))
    assert ledger.worst_case_after(RELEASE) == before
    assert ledger.releases(0) == 1


def test_thousands_of_dp_sgd_steps_compose_to_the_accountants_epsilon(tmp_path):
    """Its wall time is benchmarks/accounting_cost.py's (no timing here: a loaded machine would fail it)."""
    ledger = PrivacyLedger(mechanism="kanon", delta=DELTA, path=tmp_path / "ledger.jsonl")
    step = PrivacyEvent("poisson_gaussian", {"sampling_rate": 0.02, "noise_multiplier": 0.9, "count": 250.0})
    ledger.record(LedgerEntry(0, 0, "kanon", Guarantee(kind="k-anonymity", statement="", k=8), ()))
    for round_index in range(1, 21):  # 5000 steps
        ledger.record(LedgerEntry.dp_sgd(0, round_index, (step,)))
    spent = ledger.spent(0)
    acc = pld_privacy_accountant.PLDAccountant(NeighboringRelation.REPLACE_ONE, value_discretization_interval=1e-4)
    acc.compose(dp_event.PoissonSampledDpEvent(0.02, dp_event.GaussianDpEvent(0.9)), 5000)
    assert spent == pytest.approx(acc.get_epsilon(DELTA), rel=2e-3)
    assert ledger.min_k == 8  # k-anonymity stays k, next to the DP-SGD epsilon
    lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
    assert len(lines) == 21 and '"kind": "dp_sgd"' in lines[-1]


def test_events_travel_as_json():
    assert events_from_json(events_to_json(TRAINING + RELEASE)) == TRAINING + RELEASE
    assert events_from_json(events_to_json(())) == ()
