"""The privacy statement says what is covered and what is not, for every mechanism x DP-SGD."""

import numpy as np
import pytest

from mechanisms import get_mechanism_class
from privfed.privacy.ledger import WorstCase
from privfed.privacy.statement import privacy_statement, rounded_up

DELTA = 1e-4


def long_covers(statement) -> tuple[str, ...]:
    """The full clauses of what the statement covers, with the run's numbers."""
    return tuple(item.long for item in statement.covered)


def worst(releases: float, dp_sgd: float, combined: float) -> WorstCase:
    return WorstCase(client=2, epsilon=combined, delta=DELTA, releases_worst=releases, dp_sgd_worst=dp_sgd)


def test_ldp_with_dp_sgd_covers_everything_a_client_sends_per_example():
    s = privacy_statement(mechanism=get_mechanism_class("ldp"), dp_sgd=True, worst=worst(2.0, 8.0, 8.9), k=None)
    assert s.text.startswith("Encoder updates and released centroids together are (8.9, 0.0001)")
    assert "replace-one" in s.text and "dataset size is public" in s.text
    assert "replacing one training example of a client by another" in s.text
    assert len(long_covers(s)) == 2 and any("DP-SGD" in c for c in long_covers(s)) and any("ldp" in c for c in long_covers(s))
    assert any("amplification" in n for n in s.long_not_covered)
    assert any("dataset size" in n for n in s.long_not_covered)


def test_ldp_without_dp_sgd_is_per_representation_and_leaves_updates_out():
    s = privacy_statement(mechanism=get_mechanism_class("ldp"), dp_sgd=False, worst=worst(2.0, 0.0, 2.0), k=None)
    assert "replacing one of its representations by another" in s.text and "Encoder updates are not covered" in s.text
    assert any("not a per-example one" in n for n in s.long_not_covered)


@pytest.mark.parametrize("dp_sgd", [False, True])
def test_ldp_sums_is_stated_as_releasing_its_noisy_tables_not_centroids(dp_sgd):
    """An ``ldp-sums`` client sends its whole noisy table (all of it inside the epsilon), not a few centroids."""
    s = privacy_statement(mechanism=get_mechanism_class("ldp-sums"), dp_sgd=dp_sgd, worst=worst(2.0, 8.0, 8.9), k=None)
    assert "released tables" in s.text and "released centroids" not in s.text
    assert any(c.startswith("released tables (ldp-sums): epsilon 2") for c in long_covers(s))


@pytest.mark.parametrize("mechanism", ["kanon", "reps"])
def test_non_dp_releases_are_never_inside_the_dp_sgd_epsilon(mechanism):
    s = privacy_statement(mechanism=get_mechanism_class(mechanism), dp_sgd=True, worst=worst(0.0, 7.5, 7.5), k=6)
    assert s.text.startswith("Encoder updates are (7.5, 0.0001)-differentially private")
    assert len(long_covers(s)) == 1 and "DP-SGD" in long_covers(s)[0]
    assert any(mechanism in n and "not in the epsilon" in n for n in s.long_not_covered)
    if mechanism == "kanon":
        assert "6-anonymous" in s.text
    else:
        assert "no per-example guarantee holds for the run as a whole" in s.text


def test_without_any_dp_nothing_is_claimed():
    kanon = privacy_statement(mechanism=get_mechanism_class("kanon"), dp_sgd=False, worst=None, k=4)
    assert "at least 4" in kanon.text and "not differential privacy" in kanon.text and long_covers(kanon) == ()
    reps = privacy_statement(mechanism=get_mechanism_class("reps"), dp_sgd=False, worst=None, k=None)
    assert reps.text.startswith("No guarantee") and any("SecAgg+" in n for n in reps.long_not_covered)
    with pytest.raises(ValueError):
        privacy_statement(mechanism=get_mechanism_class("ldp"), dp_sgd=False, worst=None, k=None)


@pytest.mark.parametrize("secagg", [True, False])
@pytest.mark.parametrize("mechanism", ["ldp", "kanon", "reps"])
def test_by_default_no_training_metric_is_named_as_revealed(mechanism, secagg):
    """Clients send none unless the run sets --report-client-metrics."""
    for dp_sgd in (False, True):
        s = privacy_statement(mechanism=get_mechanism_class(mechanism), dp_sgd=dp_sgd, worst=worst(2.0, 7.5, 8.0),
                              k=4, secagg=secagg)
        facts = " ".join(s.long_not_covered)
        assert "training metrics" not in facts and "weighted means" not in facts and "timings" not in facts
        assert "release time" not in facts


@pytest.mark.parametrize("mechanism", ["ldp", "kanon", "reps"])
def test_reported_training_metrics_are_named_as_uncovered_unless_dp_sgd_keeps_them_home(mechanism):
    needs_worst = mechanism == "ldp"
    plain = privacy_statement(mechanism=get_mechanism_class(mechanism), dp_sgd=False, secagg=False, report_metrics=True,
                              worst=worst(2.0, 0.0, 2.0) if needs_worst else None, k=4)
    assert any("training metrics" in n and "each client reports in plaintext" in n for n in plain.long_not_covered)
    private = privacy_statement(mechanism=get_mechanism_class(mechanism), dp_sgd=True, worst=worst(2.0, 7.5, 8.0),
                                k=4, report_metrics=True)
    assert not any("training metrics" in n for n in private.long_not_covered)
    assert any("step counts and wall-clock timings" in n for n in private.long_not_covered)


def test_reported_metric_means_under_secagg_are_said_to_reveal_each_clients_own_values_across_rounds():
    """tests/secagg/test_encoding.py::test_metric_means_over_changing_cohorts_reveal_each_clients_own_loss_up_to_one_offset
    backs the claim."""
    s = privacy_statement(mechanism=get_mechanism_class("kanon"), dp_sgd=False, worst=None, k=4, report_metrics=True)
    (means,) = [n for n in s.long_not_covered if "weighted means" in n]
    assert "over rounds whose cohorts change" in means and "estimate each client's own level" in means
    assert "no client's own values" not in s.text


@pytest.mark.parametrize("report_metrics", [False, True])
def test_overflow_counts_are_said_to_be_attributable_to_clients_across_rounds(report_metrics):
    """tests/secagg/test_encoding.py::test_overflow_counts_over_changing_cohorts_name_the_client_whose_update_overflows
    backs the claim."""
    s = privacy_statement(mechanism=get_mechanism_class("kanon"), dp_sgd=False, worst=None, k=4,
                          report_metrics=report_metrics)
    (counts,) = [n for n in s.long_not_covered if "overflowed or ran high" in n]
    assert "across rounds whose cohorts change the counts can be attributed to clients" in counts
    clear = privacy_statement(mechanism=get_mechanism_class("kanon"), dp_sgd=False, worst=None, k=4, secagg=False)
    assert not any("overflowed" in n for n in clear.long_not_covered)  # no SecAgg+, no indicators


def test_the_secagg_weakness_is_named_where_updates_are_not_covered():
    s = privacy_statement(mechanism=get_mechanism_class("kanon"), dp_sgd=False, worst=None, k=4, secagg=True)
    assert any("SecAgg+ with masks from HKDF-SHA256 -> AES-256-CTR" in n for n in s.long_not_covered)
    assert not any("32-bit" in n for n in s.long_not_covered)
    clear = privacy_statement(mechanism=get_mechanism_class("kanon"), dp_sgd=False, worst=None, k=4, secagg=False)
    assert any("sent in the clear" in n for n in clear.long_not_covered)


def test_a_method_that_releases_nothing_claims_no_protection_for_it():
    plain = privacy_statement(mechanism=None, dp_sgd=False, worst=None, k=None)
    assert plain.text.startswith("No guarantee: the method runs no release mechanism")
    assert long_covers(plain) == ()  # sending nothing is not a protection of what is sent
    assert any("encoder updates: no DP-SGD" in n and "BatchNorm running statistics" in n for n in plain.long_not_covered)
    reported = privacy_statement(mechanism=None, dp_sgd=False, worst=None, k=None, report_metrics=True)
    assert any("step counts and timings" in n for n in reported.long_not_covered)
    private = privacy_statement(mechanism=None, dp_sgd=True, worst=worst(0.0, 7.5, 7.5), k=None)
    assert private.text.startswith("Encoder updates are (7.5, 0.0001)-differentially private")
    assert "replacing one training example" in private.text and "replace-one" in private.text
    assert len(long_covers(private)) == 1 and "DP-SGD" in long_covers(private)[0]
    assert any("dataset size" in n for n in private.long_not_covered)
    with pytest.raises(ValueError):
        privacy_statement(mechanism=None, dp_sgd=True, worst=None, k=None)


@pytest.mark.parametrize("dp_sgd", [False, True])
def test_kanon_is_stated_as_distinct_images_per_centroid_and_never_as_differential_privacy(dp_sgd):
    s = privacy_statement(mechanism=get_mechanism_class("kanon"), dp_sgd=dp_sgd,
                          worst=worst(0.0, 7.5, 7.5) if dp_sgd else None, k=6)
    kanon_parts = [s.text, *(n for n in s.long_not_covered if "kanon" in n)]
    assert any("at least 6 distinct images" in part for part in kanon_parts)
    assert not any("kanon" in c for c in long_covers(s))  # k-anonymity is never inside an (epsilon, delta)
    if not dp_sgd:
        assert "not differential privacy" in s.text and "differentially private" not in s.text


EVERY_MODE = pytest.mark.parametrize(
    "mechanism,dp_sgd", [(m, d) for m in (None, "kanon", "ldp", "ldp-sums", "reps") for d in (False, True)]
)


def statement_of_mode(mechanism: str | None, dp_sgd: bool, **options):
    """The statement of a run with this mechanism (None: a method that releases nothing) and DP-SGD setting."""
    cls = None if mechanism is None else get_mechanism_class(mechanism)
    is_dp = dp_sgd or (cls is not None and cls.is_differentially_private())
    worst_case = worst(2.0, 7.5, 8.0) if is_dp else None
    return privacy_statement(mechanism=cls, dp_sgd=dp_sgd, worst=worst_case, k=6, **options), is_dp


@EVERY_MODE
def test_every_differential_privacy_claim_names_replace_one_and_never_add_remove(mechanism, dp_sgd):
    """The accountant composes under replace-one: a statement quoting add/remove would claim a smaller epsilon than holds."""
    s, is_dp = statement_of_mode(mechanism, dp_sgd)
    everything = " ".join([s.text, *long_covers(s), *s.long_not_covered])
    assert "add/remove" not in everything and "adding or removing" not in everything
    if is_dp:
        assert "differentially private with respect to replacing one" in s.text


@EVERY_MODE
def test_every_statement_says_it_assumes_a_server_that_follows_the_plan(mechanism, dp_sgd):
    s, _ = statement_of_mode(mechanism, dp_sgd)
    assert any("deviates from the run's plan" in n for n in s.long_not_covered)
    assert "deviates from the run's plan" in s.text


@EVERY_MODE
def test_what_travels_in_plaintext_under_secagg_is_named_and_only_what_travels(mechanism, dp_sgd):
    """Release times go in plaintext only in initialisation rounds of a method that releases, with reported metrics;
    overflow counts, failures and refusals are named in every mode."""
    s, _ = statement_of_mode(mechanism, dp_sgd)
    facts = " ".join(s.long_not_covered)
    assert "release time" not in facts  # no metric is sent by default
    reported, _ = statement_of_mode(mechanism, dp_sgd, report_metrics=True)
    assert ("release time in plaintext" in " ".join(reported.long_not_covered)) == (mechanism is not None)
    assert "how many clients' updates overflowed" in facts
    assert "whether its round failed or was refused" in facts


def test_supervised_fedavg_names_the_labels_and_each_method_only_the_metrics_it_reports():
    from privfed.methods import get_method

    supervised = privacy_statement(mechanism=None, dp_sgd=False, worst=None, k=None,
                                   method=get_method("supervised"))
    assert any("labels" in n and "label distribution" in n for n in supervised.long_not_covered)
    for method in ("simclr", "byol", "rotpred"):
        other = privacy_statement(mechanism=None, dp_sgd=False, worst=None, k=None, method=get_method(method))
        assert not any("labels" in n for n in other.long_not_covered)
        reported = privacy_statement(mechanism=None, dp_sgd=False, worst=None, k=None, report_metrics=True,
                                     method=get_method(method))
        assert not any("target entropy" in n for n in reported.long_not_covered)  # no centroids, no such metric
    orchestra = privacy_statement(mechanism=get_mechanism_class("kanon"), dp_sgd=False, worst=None, k=4,
                                  report_metrics=True)
    assert any("target entropy, centroid cosine" in n for n in orchestra.long_not_covered)


@pytest.mark.parametrize("dp_sgd", [False, True])
def test_kanon_says_it_does_not_compose_across_releases_and_what_stops_differencing(dp_sgd):
    """The claims of tests/mechanisms/test_kanon_differencing.py and tests/privacy/test_kanon_across_rounds.py."""
    s = privacy_statement(mechanism=get_mechanism_class("kanon"), dp_sgd=dp_sgd,
                          worst=worst(0.0, 7.5, 7.5) if dp_sgd else None, k=6)
    (clause,) = [n for n in s.long_not_covered if n.startswith("k-anonymity across releases")]
    assert "does not compose" in clause
    assert "two releases whose memories differ by one image reveal that image" in clause
    assert "server that follows the plan" in clause and "new model" in clause and "fresh augmentations" in clause
    assert "server that deviates may craft models to set it up" in clause
    assert "came on average no closer to its images (PSNR) than that round's release alone" in clause
    assert "that bounds nothing" in clause
    assert clause in s.text
    headline = s.text.split(" Not covered: ")[0]
    if dp_sgd:
        assert "only 6-anonymous, per release (it does not compose)" in headline
    else:
        assert "two releases whose memories differ by one image reveal it" in headline


@pytest.mark.parametrize("mechanism", [None, "ldp", "reps"])
def test_only_kanon_carries_the_differencing_clause(mechanism):
    s, _ = statement_of_mode(mechanism, dp_sgd=False)
    assert not any("k-anonymity across releases" in n for n in s.long_not_covered)


@EVERY_MODE
def test_every_statement_says_clients_accept_only_their_own_calibration_and_what_the_caps_assume(mechanism, dp_sgd):
    """The client guard refuses noisier parameters too (tests/privacy/test_client_guard.py); a cap over several runs,
    or over a mix of releases and trainings the server picks, is PLD composition of a sequence taken as fixed."""
    s, _ = statement_of_mode(mechanism, dp_sgd)
    assert "parameters other than its own calibration (noisier ones too)" in s.text
    assert "weaker than its own calibration" not in s.text
    assert "as if that sequence had been fixed in advance" in s.text


@EVERY_MODE
def test_every_statement_states_the_v4_threat_model_and_no_longer_the_withholding_attack(mechanism, dp_sgd):
    """Under privfed-secagg+/4 a node unmasks only a survivor set t survivors signed (tests/secagg/test_deviating_server.py,
    tests/secagg/test_client_agreement.py); a replay of the last round to other clients is refused
    (tests/federation/test_secagg_replay.py)."""
    s, _ = statement_of_mode(mechanism, dp_sgd)
    assert "withholds" not in s.text and "unmasks that client's update" not in s.text
    assert "invents" not in s.text and "SecAgg+ neighbours" not in s.text  # identities are pinned, the graph complete
    assert "replay a round's stored reply to a smaller cohort" not in s.text
    (clause,) = [n for n in s.long_not_covered if n.startswith("a server that deviates from the run's plan")]
    assert "SecAgg+ (privfed-secagg+/4) holds within a round against a server that deviates from it" in clause
    assert "with up to c clients colluding (c: a node's secagg-max-corrupt, default 0)" in clause
    assert "so there the keys only exercise the protocol" in clause
    assert "no sum but that of all the honest clients of a signed set, at least t - c of them" in clause
    assert "a node signs no second survivor set for a round it signed" in clause
    assert "two SecAgg+ sums over cohorts that differ by one client reveal that client's update" in clause
    assert 'docs/privacy.md, "SecAgg+ against a deviating server"' in clause


def ddp_plan(secret_sample: bool | None):
    from privfed.config import build_config
    from privfed.privacy.budget import plan_privacy

    config = build_config(dataset="shapes:300", num_clients=4, participation=1.0, num_local_centroids=4,
                          num_global_centroids=8, memory_size=32, rounds=3, mechanism="ddp-sums", epsilon=10.0,
                          secret_sample=secret_sample)
    return plan_privacy(config, [75] * 4)


def independent_share_epsilon(plan, releases: int) -> float:
    """``releases`` shares of one client, each alone: the plan's event at z / sqrt(K_min), on dp_accounting's own PLD."""
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant
    from dp_accounting.privacy_accountant import NeighboringRelation

    (event,) = plan.per_release_events
    gaussian = dp_event.GaussianDpEvent(event.params["noise_multiplier"] / np.sqrt(plan.params["min_shares"]))
    if event.name == "poisson_gaussian":
        gaussian = dp_event.PoissonSampledDpEvent(event.params["sampling_rate"], gaussian)
    accountant = pld_privacy_accountant.PLDAccountant(NeighboringRelation.REPLACE_ONE, value_discretization_interval=1e-4)
    accountant.compose(gaussian, releases)
    return accountant.get_epsilon(plan.delta)


@pytest.mark.parametrize("secret_sample", [None, False], ids=["sample", "nosample"])
def test_a_ddp_sums_statement_says_what_a_leaked_share_would_cost_as_the_plan_gives_it(secret_sample):
    from privfed.privacy.statement import leaked_share_cost

    plan = ddp_plan(secret_sample)
    assert plan.params["min_shares"] == 3 and plan.max_releases == 3  # a strict majority of 4; no release in round 0
    leaked = leaked_share_cost(plan)
    run, one = independent_share_epsilon(plan, plan.max_releases), independent_share_epsilon(plan, 1)
    assert run * (1 - 1e-3) <= leaked.run <= run * 1.01 and one * (1 - 1e-3) <= leaked.one <= one * 1.01
    assert leaked.run > plan.planned_epsilon * 1.5  # a third of the noise variance per share: far more than the sums'
    case = WorstCase(client=0, epsilon=plan.planned_epsilon, delta=plan.delta, releases_worst=plan.planned_epsilon,
                     dp_sgd_worst=0.0)
    s = privacy_statement(mechanism=get_mechanism_class("ddp-sums"), dp_sgd=False, worst=case, k=None,
                          min_shares=plan.params["min_shares"], release_sampling_rate=plan.sampling_rate,
                          leaked_shares=leaked)
    (clause,) = [n for n in s.long_not_covered if "what a leaked share would cost" in n]
    z = plan.per_release_events[0].params["noise_multiplier"] / np.sqrt(3)
    assert f"each share carries noise multiplier {z:.3g} (z / sqrt(K_min), K_min 3)" in clause
    assert f"seen alone are epsilon {rounded_up(leaked.run, 3)} over the run's at most 3 releases" in clause
    assert f"(epsilon {rounded_up(leaked.one, 3)} for one share) at delta 1e-06" in clause
    assert clause in s.text
    unstated = privacy_statement(mechanism=get_mechanism_class("ddp-sums"), dp_sgd=False, worst=case, k=None,
                                 min_shares=3, release_sampling_rate=plan.sampling_rate)
    assert "leaked share" not in unstated.text  # no number without the plan


@pytest.mark.parametrize(
    "secret_sample", [None, pytest.param(False, marks=pytest.mark.slow)], ids=["sample", "nosample"]
)
def test_the_leaked_share_cost_docs_privacy_md_quotes(secret_sample):
    """The table of docs/privacy.md, "SecAgg+ against a deviating server": the default config at epsilon 10, delta 1e-6."""
    from pathlib import Path

    from privfed.config import TrainConfig
    from privfed.data.federated import FederatedSplit
    from privfed.privacy.budget import plan_privacy
    from privfed.privacy.statement import leaked_share_cost

    docs = " ".join((Path(__file__).resolve().parents[2] / "docs" / "privacy.md").read_text().split())
    config = TrainConfig(mechanism="ddp-sums", epsilon=10.0, delta=1e-6, secret_sample=secret_sample)
    plan = plan_privacy(config, FederatedSplit.of(config).client_sizes())
    assert (plan.params["min_shares"], plan.max_releases) == (3, 12)
    assert "shapes, 10 clients, 5 a round, so K_min = 3; 12 releases" in docs
    leaked = leaked_share_cost(plan)
    assert leaked.run > plan.planned_epsilon
    z = plan.per_release_events[0].params["noise_multiplier"]
    label = f"secret sample (default, rate {plan.sampling_rate:.3g})" if secret_sample is None else "`--no-secret-sample`"
    row = (f"| {label} | {z:.3g} | {z / np.sqrt(3):.3g} | {rounded_up(plan.planned_epsilon, 3)} | "
           f"{rounded_up(leaked.run, 3)} | {rounded_up(leaked.one, 3)} |")
    assert row in docs


def test_only_ddp_sums_gets_a_leaked_share_cost():
    """ldp-sums sends no share; a plug-in's shares need not split the noise K_min ways, so nothing is stated for them."""
    from privfed.config import build_config
    from privfed.privacy.budget import plan_privacy
    from privfed.privacy.statement import leaked_share_cost

    config = build_config(dataset="shapes:300", num_clients=4, participation=1.0, num_local_centroids=4,
                          num_global_centroids=8, memory_size=32, rounds=3, mechanism="ldp-sums", epsilon=10.0)
    assert leaked_share_cost(plan_privacy(config, [75] * 4)) is None


@pytest.mark.parametrize("dp_sgd", [False, True])
def test_a_secret_sample_is_claimed_with_its_rate_and_no_amplification_disclaimer_remains(dp_sgd):
    s = privacy_statement(mechanism=get_mechanism_class("ldp-sums"), dp_sgd=dp_sgd, worst=worst(2.0, 8.0, 8.9),
                          k=None, release_sampling_rate=0.25)
    release = next(c for c in long_covers(s) if "ldp-sums" in c)
    assert "secret Poisson sample, at rate 0.25, of the representations" in release
    assert "relies on the sample and its size staying secret" in release
    assert "released from a secret sample of one representation per image" in release
    assert not any("amplification" in n for n in s.long_not_covered)
    assert any("not a per-example one" in n for n in s.long_not_covered) != dp_sgd
    unsampled = privacy_statement(mechanism=get_mechanism_class("ldp-sums"), dp_sgd=dp_sgd, worst=worst(2.0, 8.0, 8.9), k=None)
    assert any("amplification" in n for n in unsampled.long_not_covered)


@pytest.mark.parametrize(
    ("value", "digits", "stated"),
    [(0.99912, 3, "1"), (1.2341, 3, "1.24"), (1.23, 3, "1.23"), (1.0000001e-6, 2, "1.1e-06"), (8.0, 3, "8")],
)
def test_a_stated_epsilon_or_delta_is_rounded_up_never_down(value, digits, stated):
    assert rounded_up(value, digits) == stated


def test_no_stated_value_is_below_the_true_one():
    values = np.random.default_rng(0).uniform(-8, 2, size=2000)
    for value in 10.0**values:
        for digits in (2, 3):
            assert float(rounded_up(float(value), digits)) >= value
