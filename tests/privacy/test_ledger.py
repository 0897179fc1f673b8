"""The ledger composes releases with the PLD accountant; checked against dp_accounting directly."""

import json

import pytest
from dp_accounting.pld import privacy_loss_distribution as pld

from mechanisms.base import Guarantee, PrivacyEvent
from privfed.privacy.ledger import LedgerEntry, PrivacyLedger, merge_events

DELTA = 1e-5
RELEASE = (
    PrivacyEvent("discrete_laplace", {"noise_parameter": 0.8, "sensitivity": 1.0, "count": 11.0}),
    PrivacyEvent("discrete_laplace", {"noise_parameter": 1.5, "sensitivity": 1.0, "count": 1.0}),
    PrivacyEvent("gaussian", {"noise_multiplier": 2.0, "count": 1.0}),
)
DP = Guarantee(kind="differential-privacy", statement="test")


def reference_epsilon(releases: int, grid: float = 1e-4) -> float:
    """The same cost built by hand from dp_accounting's PLDs under replace-one, not through privfed's helpers.

    A replacement moves two counts per count query and a leaf sum by twice the radius.
    """
    tree = pld.from_discrete_laplace_mechanism(0.8, value_discretization_interval=grid).self_compose(2 * 11)
    leaf = pld.from_discrete_laplace_mechanism(1.5, value_discretization_interval=grid).self_compose(2)
    one = tree.compose(leaf)
    total = one.self_compose(releases) if releases > 1 else one
    sums = pld.from_gaussian_mechanism(2.0 / releases**0.5, sensitivity=2.0, value_discretization_interval=grid)
    return total.compose(sums).get_epsilon_for_delta(DELTA)


def test_worst_case_client_is_the_one_with_most_releases():
    ledger = PrivacyLedger(mechanism="ldp", delta=DELTA)
    for round_index in range(3):
        ledger.record(LedgerEntry(0, round_index, "ldp", DP, RELEASE))
    ledger.record(LedgerEntry(1, 0, "ldp", DP, RELEASE))
    client, spent = ledger.worst_case()
    assert client == 0
    assert spent == pytest.approx(reference_epsilon(3), rel=0.01)
    assert ledger.spent(1) == pytest.approx(reference_epsilon(1), rel=0.01)
    assert ledger.spent(1) < spent


def test_composition_is_not_the_sum_of_epsilons():
    ledger = PrivacyLedger(mechanism="ldp", delta=DELTA)
    for round_index in range(10):
        ledger.record(LedgerEntry(0, round_index, "ldp", DP, RELEASE))
    assert ledger.spent(0) < 10 * reference_epsilon(1)


def test_look_ahead_equals_one_more_recorded_release():
    ledger = PrivacyLedger(mechanism="ldp", delta=DELTA)
    ledger.record(LedgerEntry(0, 0, "ldp", DP, RELEASE))
    ahead = ledger.worst_case_after(RELEASE)
    ledger.record(LedgerEntry(0, 1, "ldp", DP, RELEASE))
    assert ahead == pytest.approx(ledger.spent(0), rel=1e-9)


def test_merge_events_sums_counts_of_identical_events():
    merged = merge_events(RELEASE * 4)
    assert len(merged) == 3
    assert sorted(e.params["count"] for e in merged) == [4.0, 4.0, 44.0]


def test_k_anonymity_is_reported_as_k_never_as_epsilon(tmp_path):
    ledger = PrivacyLedger(mechanism="kanon", delta=None, path=tmp_path / "ledger.jsonl")
    ledger.record(LedgerEntry(0, 0, "kanon", Guarantee(kind="k-anonymity", statement="", k=16), ()))
    ledger.record(LedgerEntry(1, 0, "kanon", Guarantee(kind="k-anonymity", statement="", k=9), ()))
    assert ledger.min_k == 9 and not ledger.is_dp
    with pytest.raises(ValueError):
        ledger.spent(0)
    assert len((tmp_path / "ledger.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize(
    "params,problem",
    [({"count": -9.0}, "positive whole number"), ({"count": 1.9}, "positive whole number"),
     ({"count": 2.0, "noise_multiplier": float("nan")}, "non-finite"), ({"noise_multiplier": float("inf")}, "non-finite")],
)
def test_entries_refuse_events_the_accountant_would_misread(params, problem):
    with pytest.raises(ValueError, match=problem):
        LedgerEntry(0, 1, "x", Guarantee(kind="differential-privacy", statement=""), (PrivacyEvent("gaussian", params),))


def test_an_entry_keeps_the_delta_it_was_charged_at_and_a_larger_delta_does_not_reprice_it(tmp_path):
    path = tmp_path / "ledger.jsonl"
    strict = PrivacyLedger(mechanism="ldp", delta=1e-6, path=path)
    strict.record(LedgerEntry(0, 0, "ldp", DP, RELEASE))
    assert LedgerEntry.from_dict(json.loads(path.read_text())).delta == 1e-6
    loose = PrivacyLedger.resume(path, mechanism="ldp", delta=1e-3)
    assert loose.pricing_delta() == 1e-6 and loose.spent(0) == pytest.approx(strict.spent(0), rel=1e-12)
    assert PrivacyLedger.resume(path, mechanism="ldp", delta=1e-8).pricing_delta() == 1e-8  # smaller costs more


def test_a_charge_for_the_same_client_round_and_run_counts_once_even_across_a_resume(tmp_path):
    """A resumed run replays the round a kill interrupted after its charges were written: it must not pay twice."""
    path = tmp_path / "ledger.jsonl"
    ledger = PrivacyLedger(mechanism="ldp", delta=DELTA, path=path)
    ledger.record(LedgerEntry(0, 1, "ldp", DP, RELEASE))
    ledger.record(LedgerEntry(0, 1, "ldp", DP, RELEASE))
    assert ledger.releases(0) == 1 and len(path.read_text().splitlines()) == 1
    resumed = PrivacyLedger.resume(path, mechanism="ldp", delta=DELTA)
    resumed.record(LedgerEntry(0, 1, "ldp", DP, RELEASE))
    assert resumed.spent(0) == pytest.approx(reference_epsilon(1), rel=0.01)
    resumed.record(LedgerEntry(0, 2, "ldp", DP, RELEASE))  # another round, another client, DP-SGD: each counts
    resumed.record(LedgerEntry(1, 1, "ldp", DP, RELEASE))
    resumed.record(LedgerEntry.dp_sgd(0, 1, (PrivacyEvent("gaussian", {"noise_multiplier": 2.0, "count": 1.0}),)))
    assert resumed.releases(0) == 2 and resumed.releases(1) == 1 and len(path.read_text().splitlines()) == 4


def test_a_second_charge_for_a_charged_round_of_other_events_is_refused_and_the_first_stands(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = PrivacyLedger(mechanism="ldp", delta=DELTA, path=path)
    ledger.record(LedgerEntry(0, 1, "ldp", DP, RELEASE))
    other = (PrivacyEvent("gaussian", {"noise_multiplier": 50.0, "count": 1.0}),)
    with pytest.raises(ValueError, match="charged already, for other events"):
        ledger.record(LedgerEntry(0, 1, "ldp", DP, other))
    assert ledger.releases(0) == 1 and ledger.spent(0) == pytest.approx(reference_epsilon(1), rel=0.01)
    assert len(path.read_text().splitlines()) == 1
    unanswered = Guarantee(kind="differential-privacy", statement="charged: the client did not answer the replay")
    ledger.record(LedgerEntry(0, 1, "ldp", unanswered, RELEASE))  # the same cost in other words: counted once
    assert ledger.releases(0) == 1 and len(path.read_text().splitlines()) == 1


def test_a_replayed_charge_recalibrated_to_other_digits_is_the_same_charge(tmp_path, caplog):
    """A resumed process calibrates again, maybe on another machine: the last bits may differ, and the round is paid once."""
    path = tmp_path / "ledger.jsonl"
    PrivacyLedger(mechanism="ldp", delta=DELTA, path=path).record(LedgerEntry(0, 1, "ldp", DP, RELEASE))
    resumed = PrivacyLedger.resume(path, mechanism="ldp", delta=DELTA)
    last = RELEASE[-1]
    nudged = {**last.params, "noise_multiplier": last.params["noise_multiplier"] * (1 - 1e-15)}
    recalibrated = (*RELEASE[:-1], PrivacyEvent(last.name, nudged))
    assert recalibrated != RELEASE
    resumed.record(LedgerEntry(0, 1, "ldp", DP, recalibrated))
    assert "charged already" not in caplog.text
    assert resumed.releases(0) == 1 and len(path.read_text().splitlines()) == 1
    assert resumed.spent(0) == PrivacyLedger.resume(path, mechanism="ldp", delta=DELTA).spent(0)


def test_a_replayed_charge_off_by_more_than_the_tolerance_counts_beside_the_first(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = PrivacyLedger(mechanism="ldp", delta=DELTA, path=path)
    ledger.record(LedgerEntry(0, 1, "ldp", DP, RELEASE))
    last = RELEASE[-1]
    nudged = {**last.params, "noise_multiplier": last.params["noise_multiplier"] * (1 - 1e-6)}
    ledger.record(LedgerEntry(0, 1, "ldp", DP, (*RELEASE[:-1], PrivacyEvent(last.name, nudged))))
    assert ledger.releases(0) == 2 and len(path.read_text().splitlines()) == 2


def test_a_new_ledger_file_is_on_disk_name_and_all_before_the_charge_returns(tmp_path, synced):
    """A crash must not lose a client's ledger, or its budget would start again: the folder is flushed as the file appears."""
    PrivacyLedger(mechanism="ldp", delta=DELTA, path=tmp_path / "ledger.jsonl").record(LedgerEntry(0, 1, "ldp", DP, RELEASE))
    assert [path for path, folder in synced if folder] == [str(tmp_path)]


def test_of_two_charges_of_one_round_at_other_parameters_both_count_in_memory_and_on_reload(tmp_path, caplog):
    """A line added by hand before a replayed round cannot stand in for the round's real charge, however it is priced:
    the ledger composes both, which can only raise epsilon (a charge costlier alone may compose to less)."""
    cheap = (*RELEASE[:-1], PrivacyEvent("gaussian", {"noise_multiplier": 20.0, "count": 1.0}))
    path = tmp_path / "ledger.jsonl"
    path.write_text(json.dumps(LedgerEntry(0, 1, "ldp", DP, cheap, delta=DELTA).to_dict()) + "\n")
    resumed = PrivacyLedger.resume(path, mechanism="ldp", delta=DELTA)
    resumed.record(LedgerEntry(0, 1, "ldp", DP, RELEASE))
    assert "at other parameters: both charges count" in caplog.text
    real = PrivacyLedger(mechanism="ldp", delta=DELTA)
    real.record(LedgerEntry(0, 1, "ldp", DP, RELEASE))
    assert resumed.spent(0) > real.spent(0) and resumed.releases(0) == 2
    reloaded = PrivacyLedger.resume(path, mechanism="ldp", delta=DELTA)
    assert reloaded.spent(0) == pytest.approx(resumed.spent(0)) and reloaded.releases(0) == 2
    resumed.record(LedgerEntry(0, 1, "ldp", DP, cheap))  # the same as a charge it holds: not written, not counted
    assert len(path.read_text().splitlines()) == 2 and resumed.spent(0) == pytest.approx(reloaded.spent(0))


def test_a_second_k_anonymous_charge_of_a_round_with_a_smaller_k_lowers_the_stated_k(tmp_path):
    """A kanon charge has no events: a hand-written line of a larger k must not hide the round's real k."""
    path = tmp_path / "ledger.jsonl"
    large, small = (Guarantee(kind="k-anonymity", statement="", k=k) for k in (1000, 3))
    PrivacyLedger(mechanism="kanon", delta=None, path=path).record(LedgerEntry(0, 1, "kanon", large, ()))
    resumed = PrivacyLedger.resume(path, mechanism="kanon", delta=None)
    resumed.record(LedgerEntry(0, 1, "kanon", small, ()))
    assert resumed.min_k == 3 and PrivacyLedger.resume(path, mechanism="kanon", delta=None).min_k == 3
    resumed.record(LedgerEntry(0, 1, "kanon", small, ()))  # the same charge again: not written
    assert len(path.read_text().splitlines()) == 2
