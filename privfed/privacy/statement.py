"""The privacy statement of a finished run: what its guarantee covers, and what it does not.

One function builds it for every combination of release mechanism and
DP-SGD on or off, from the ledger's numbers, so that ``summary.json`` never
claims more than the accounting supports. It asks the mechanism's class what
kind of guarantee it gives and whether it releases raw data, so a
third-party mechanism is described as accurately as a built-in one.

Each clause comes twice: a short form, one clause a person reads in
``covers`` and ``not_covered`` (docs/privacy.md quotes each word for word),
and the run's full clause, with its numbers, in the long text. A headline
of at most :data:`HEADLINE_LIMIT` characters says what is protected, by
what, at what epsilon or k; it never claims more than the long text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from typing import TYPE_CHECKING, Any

from mechanisms import get_mechanism_class
from mechanisms.base import K_ANONYMITY, Mechanism, PrivacyEvent, SecureSumMechanism, TableReleaseMechanism
from mechanisms.ddp_sums import DdpSumsMechanism
from privfed.methods import ORCHESTRA, Method
from privfed.privacy.ledger import WorstCase, composed_epsilon
from privfed.secagg.masks import MASK_PRG, PROTOCOL_VERSION

if TYPE_CHECKING:
    from privfed.privacy.budget import PrivacyPlan

#: The privacy unit of DP-SGD, and of DP releases under DP-SGD.
EXAMPLE_UNIT = "replacing one training example of a client by another (replace-one: its dataset size is public)"


#: The longest headline: short enough to be read, in summary.json and a study's results.md.
HEADLINE_LIMIT = 300

#: Where the long text of every mode's statement lives; :attr:`PrivacyStatement.details` links a section of it.
DOCS = "docs/privacy.md"

#: docs/privacy.md's section for what every mode leaves out (the clauses no release kind owns).
EVERY_MODE_ANCHOR = "statement-every-mode"


@dataclass(frozen=True)
class Item:
    """One clause: ``short`` for people (quoted in docs/privacy.md), ``long`` the run's full clause."""

    short: str
    long: str


@dataclass(frozen=True)
class PrivacyStatement:
    """A quotable statement: a headline, what is covered and what is not, and where the long text lives.

    Attributes:
        headline: At most :data:`HEADLINE_LIMIT` characters: what is protected, by what, at what epsilon or k.
        lead: The headline's long form, first in :attr:`text`.
        covered: What the guarantee protects, one item each.
        uncovered: What it does not protect, one item each.
        details: The docs/privacy.md section with this mode's long text (``docs/privacy.md#statement-...``).
    """

    headline: str
    lead: str
    covered: tuple[Item, ...] = field(default_factory=tuple)
    uncovered: tuple[Item, ...] = field(default_factory=tuple)
    details: str = f"{DOCS}#{EVERY_MODE_ANCHOR}"

    @property
    def covers(self) -> tuple[str, ...]:
        return tuple(item.short for item in self.covered)

    @property
    def not_covered(self) -> tuple[str, ...]:
        return tuple(item.short for item in self.uncovered)

    @property
    def long_not_covered(self) -> tuple[str, ...]:
        return tuple(item.long for item in self.uncovered)

    @property
    def text(self) -> str:
        """The whole statement with the run's numbers: the long text, which summary.json carries once."""
        covered = f" Covered: {'; '.join(item.long for item in self.covered)}." if self.covered else ""
        return f"{self.lead}{covered} Not covered: {'; '.join(self.long_not_covered)}. Details: {self.details}."

    def to_dict(self) -> dict[str, Any]:
        """``summary.json``'s words: the headline and the short lists, the long text once (``statement``)."""
        return {
            "headline": self.headline,
            "covers": list(self.covers),
            "not_covered": list(self.not_covered),
            "details": self.details,
            "statement": self.text,
        }


def rounded_up(value: float, digits: int) -> str:
    """``value`` to ``digits`` significant digits, rounded up: a stated epsilon or delta is never below the true one."""
    if not math.isfinite(value) or value <= 0:
        return f"{value:.{digits}g}"
    exact = Decimal(repr(value))
    step = Decimal(1).scaleb(exact.adjusted() - digits + 1)
    return f"{float(exact.quantize(step, rounding=ROUND_CEILING)):.{digits}g}"


def _eps(value: float) -> str:
    return rounded_up(value, 3)


def _delta(value: float) -> str:
    return rounded_up(value, 2)


def _k(k: int | None) -> str:
    return "?" if k is None else str(k)


Parts = tuple[list[Item], list[Item]]  # (covered, uncovered)

#: docs/privacy.md's section on SecAgg+'s threat model, which the clauses below cite.
SECAGG_THREAT_MODEL = "docs/privacy.md, \"SecAgg+ against a deviating server\""

#: What SecAgg+ holds against a server that deviates from it: the v4 threat model, in one clause.
SECAGG_AGAINST_DEVIATION = (
    f"SecAgg+ ({PROTOCOL_VERSION}) holds within a round against a server that deviates from it, with up to c "
    "clients colluding (c: a node's secagg-max-corrupt, default 0), where nodes pin each other's identities (a "
    "simulation keeps every identity in its run folder, so there the keys only exercise the protocol): a node "
    "checks signed keys and unmasks only for the one survivor set it signed, once t of its survivors (t: the "
    "threshold) signed it, so the server unmasks no sum but that of all the honest clients of a signed set, at "
    f"least t - c of them ({SECAGG_THREAT_MODEL})"
)

#: Every guarantee assumes the server follows the run's plan (docs/privacy.md, trust model).
DEVIATING_SERVER = Item(
    "a server that deviates from the run's plan beyond what clients check (e.g. it chooses the cohorts and "
    "differences SecAgg+ sums across rounds)",
    "a server that deviates from the run's plan beyond what clients check: each client refuses a configuration other "
    "than the declared run's, mechanism or DP-SGD parameters other than its own calibration (noisier ones too), "
    "SecAgg+ encodings or "
    "scales other than the declared ones, a round index it was charged for already in the same run "
    "(except the last one, asked again with the same "
    "instructions: it gets the stored reply again, or the same computation again when a kill cut it short before any "
    "reply), and rounds past "
    "the budget in its own ledger; but in deployment the declared run is the run config the SuperLink delivers (a "
    "node's own privacy-epsilon caps it), a node's ledger outlives a round only in its state-dir, its caps compose "
    "the runs that share that ledger, and a node's privacy-epsilon the mix of releases and trainings the server "
    "chooses, as if that sequence had been fixed in advance (a PLD filter is not proven for choices made in view of "
    "earlier results), and the server still "
    "chooses the model and centroids clients compute on, which clients it samples within their budgets, and how "
    "many (secagg-min-clients sets a node's floor); "
    f"{SECAGG_AGAINST_DEVIATION}; a node signs no second survivor set for a round it signed (a record kept "
    "in its state-dir), so a round replayed to other clients is not unmasked, but the server can get the same "
    "answer again under a new run id or a slightly changed model, and two "
    "SecAgg+ sums over cohorts that differ by one client reveal that "
    "client's update (up to augmentation noise); only DP-SGD bounds "
    "what these reveal",
)


#: k-anonymity holds per release only (docs/privacy.md, "k-anonymity across releases").
KANON_DIFFERENCING = Item(
    "k-anonymity across releases: it does not compose, and two releases whose memories differ by one image reveal it",
    "k-anonymity across releases: it does not compose, and two releases whose memories differ by one image reveal "
    "that image; what stands in the way today is a server that follows the plan (each round a new model, and a memory the "
    "client recomputes from fresh augmentations); on recorded CPU-preset runs (3 seeds, a server that followed the "
    "plan), one attack reading a client's releases together (up to 16, older rounds down-weighted) came on average no "
    "closer to its images (PSNR) than that round's release alone, and re-identified a member at most 1.3 points more "
    "often, mean over seeds (docs/attacks.md); that bounds nothing, and it did not test two memories that differ by "
    "one image; a "
    "server that deviates may craft models to set it up, and nothing in kanon or the client refuses that",
)


def _unit(dp_sgd: bool) -> str:
    """The short form of the privacy unit (the neighbouring relation the accountant composes under)."""
    return "training example replaced by another (replace-one)" if dp_sgd else "representation replaced by another (replace-one)"


def _encoder_update_clauses(*, dp_sgd: bool, worst: WorstCase | None, secagg: bool) -> Parts:
    """What protects the encoder updates: DP-SGD, or nothing that is a DP bound."""
    if dp_sgd:
        assert worst is not None  # privacy_statement refuses a DP run without it
        return [Item(
            f"model updates: DP-SGD, in the epsilon, per {_unit(True)}, amplified by secret Poisson batches",
            f"encoder updates (online and target encoders, rotation head): DP-SGD, epsilon {_eps(worst.dp_sgd_worst)} "
            f"at delta {_delta(worst.delta)} for the worst-off client alone, per {EXAMPLE_UNIT}; with Poisson-subsampling "
            "amplification, which relies on each client's batch sampling staying secret",
        )], []
    protection = (
        f"SecAgg+ with masks from {MASK_PRG} shows the server only sums of updates, over cohorts it chooses, also "
        f"when it deviates from SecAgg+ within its threat model ({SECAGG_THREAT_MODEL}); a sum is not a DP bound, and "
        "a server can leave SecAgg+ out of a round (a node refuses if the round or its own config says SecAgg+)"
        if secagg
        else "sent in the clear"
    )
    short = (
        "model updates: no DP-SGD; SecAgg+ shows an honest-but-curious server only their sum, which is not DP"
        if secagg
        else "model updates: no DP-SGD, sent in the clear"
    )
    return [], [Item(
        short,
        f"encoder updates: no DP-SGD ({protection}); their BatchNorm running statistics are averages of the "
        "client's representations",
    )]


def _sample_clause(rate: float) -> str:
    """How the release's epsilon counts the secret sample (``rate`` 1: there is none)."""
    if rate < 1:
        return (
            f"amplified by a secret Poisson sample, at rate {rate:.3g}, of the representations of each client's images "
            "(client-side OS CSPRNG), which relies on the sample and its size staying secret"
        )
    return "no subsampling amplification"


def _secure_sum_clause(min_shares: int | None) -> str:
    """The trust a secure-sum mechanism's epsilon rests on (its noise is split over the clients of a secure sum)."""
    return (
        f"the guarantee for the secure sums holds against a server that sees only the secure sums, if each sum holds "
        f"the shares of at least {_k(min_shares)} clients that do not collude with the server (a node shares only if "
        "the SecAgg+ threshold less its secagg-max-corrupt reaches that); "
        f"{PROTOCOL_VERSION} shows it only such sums also when it deviates from SecAgg+, where nodes pin each other's "
        f"identities ({SECAGG_THREAT_MODEL}); each share alone carries only part of the noise"
    )


#: What a secure-sum mechanism's epsilon rests on: the threat model, stated where the guarantee is.
SECURE_SUM_TRUST_SHORT = (
    "the secure sums' epsilon assumes each sum the server sees holds at least K_min clients' shares, none colluding "
    "with it (the threshold less secagg-max-corrupt), also if it deviates from SecAgg+"
)

#: The short form of what a secure-sum mechanism's epsilon does not cover.
SECURE_SUM_TRUST_SHORT_UNCOVERED = (
    "a server that colludes with clients or sees their shares (a break of SecAgg+): each share holds only part of "
    "the noise"
)


@dataclass(frozen=True)
class LeakedShares:
    """What ``ddp-sums``'s shares would cost seen one by one: what a break of SecAgg+ would cost.

    A share carries noise of ``z * unit / sqrt(K_min)``, so each is the release's event at multiplier
    ``z / sqrt(K_min)``, composed by the ledger's accountant at the run's delta (releases only, DP-SGD apart).
    """

    noise_multiplier: float
    min_shares: int
    releases: int
    delta: float
    one: float
    run: float


#: Events whose ``noise_multiplier`` is a Gaussian's std over its sensitivity: a share's is ``1/sqrt(K_min)`` of it.
_GAUSSIAN_EVENTS = ("gaussian", "poisson_gaussian")


def leaked_share_cost(plan: PrivacyPlan) -> LeakedShares | None:
    """The epsilon of a client's ``ddp-sums`` shares each seen alone, from the run's plan (None for any other run).

    Only ``ddp-sums`` is known to split its noise ``K_min`` ways; a plug-in's shares are left unstated.
    """
    if plan.mechanism is None or not plan.is_dp or plan.delta is None:
        return None
    if not issubclass(get_mechanism_class(plan.mechanism), DdpSumsMechanism):
        return None
    events = plan.per_release_events
    if not events or any(e.name not in _GAUSSIAN_EVENTS for e in events):
        return None
    min_shares = int(plan.params["min_shares"])
    shares = tuple(
        PrivacyEvent(e.name, {**e.params, "noise_multiplier": e.params["noise_multiplier"] / math.sqrt(min_shares)})
        for e in events
    )
    releases = plan.max_releases
    return LeakedShares(
        noise_multiplier=shares[0].params["noise_multiplier"],
        min_shares=min_shares,
        releases=releases,
        delta=plan.delta,
        # On the grids the plan quotes one release and the run on.
        one=composed_epsilon(shares, plan.delta, reference_epsilon=plan.reference_epsilon / max(releases, 1)),
        run=composed_epsilon(shares * releases, plan.delta, reference_epsilon=plan.reference_epsilon),
    )


def _secure_sum_trust(leaked: LeakedShares | None) -> Item:
    """What a secure-sum mechanism's epsilon does not cover, with what a leaked share would cost where it is known."""
    cost = ""
    if leaked is not None:
        cost = (
            f"; what a leaked share would cost (a break of SecAgg+): each share carries noise multiplier "
            f"{leaked.noise_multiplier:.3g} (z / sqrt(K_min), K_min {leaked.min_shares}), so a client's shares seen "
            f"alone are epsilon {_eps(leaked.run)} over the run's at most {leaked.releases} releases (epsilon "
            f"{_eps(leaked.one)} "
            f"for one share) at delta {_delta(leaked.delta)}, releases alone, against the secure sums' epsilon"
        )
    return Item(
        SECURE_SUM_TRUST_SHORT_UNCOVERED,
        "a server that colludes with clients or sees their shares: the noise of a secure sum is accounted only for "
        "the sum as a whole, colluding clients' shares hold noise it knows, and a server that colludes with more "
        f"clients than a node's secagg-max-corrupt is outside SecAgg+'s threat model{cost}",
    )


def _released(mechanism: type[Mechanism]) -> str:
    """What a client releases in the clear: a table mechanism's noisy tables (sums and counts per cell), or centroids."""
    return "released tables" if issubclass(mechanism, TableReleaseMechanism) else "released centroids"


def _release_clauses(
    mechanism: type[Mechanism] | None,
    *,
    dp_sgd: bool,
    worst: WorstCase | None,
    k: int | None,
    sampling_rate: float,
    min_shares: int | None,
    summed: bool,
) -> Parts:
    """What protects the released vectors, by the kind of guarantee the mechanism gives (``summed``: a secure-sum one)."""
    if mechanism is None:  # nothing released: nothing to protect or to disclaim here
        return [], []
    name = mechanism.name
    if mechanism.is_differentially_private():
        assert worst is not None  # privacy_statement refuses a DP run without it
        what = "secure sums of shares" if summed else _released(mechanism)
        short_what = "secure sums of the clients' shares" if summed else _released(mechanism)
        amplified = ", amplified by a secret Poisson sample of the representations" if sampling_rate < 1 else ""
        short = f"{short_what}: in the epsilon, per {_unit(dp_sgd)}{amplified}"
        releases = f"{what} ({name}): epsilon {_eps(worst.releases_worst)} at delta {_delta(worst.delta)} alone"
        if sampling_rate < 1:
            rows = f"{'computed' if summed else 'released'} from a secret sample of one representation per image"
            sample, amplification = f"; {_sample_clause(sampling_rate)}", []
        else:
            verb = "computed" if summed else "released"
            rows, sample = f"{verb} from at most one representation per image in the memory", ""
            amplification = [Item(
                "subsampling amplification for releases: none is claimed",
                "subsampling amplification for releases: none is claimed (the memory is not a secret Poisson sample)",
            )]
        trust = [Item(SECURE_SUM_TRUST_SHORT, _secure_sum_clause(min_shares))] if summed else []
        if dp_sgd:
            return [Item(short, f"{releases}, per {EXAMPLE_UNIT}, {rows}{sample}"), *trust], amplification
        return [Item(short, f"{releases}, per representation replaced by another, {rows}{sample}"), *trust], [
            Item(
                "examples, as opposed to representations: BatchNorm lets one example move the representations of others",
                "examples, as opposed to representations: BatchNorm mixes every batch, so one example also moves the "
                "representations of others; the release guarantee is not a per-example one",
            ),
            *amplification,
        ]
    if mechanism.guarantee_kind == K_ANONYMITY:
        return [], [
            Item(
                "released centroids: k-anonymity (each the mean of at least k distinct images), not DP, outside the epsilon",
                f"released centroids ({name}): k-anonymity (each the mean of the representations of at least {_k(k)} "
                "distinct images of a client), not differential privacy; they are not in the epsilon",
            ),
            KANON_DIFFERENCING,
        ]
    if mechanism.releases_raw_data:
        return [], [Item(
            "released representations: sent in the clear, outside the epsilon",
            f"released vectors ({name}): no guarantee, representations are sent in the clear; they are not in the epsilon",
        )]
    return [], [Item(
        "released vectors: no guarantee, outside the epsilon",
        f"released vectors ({name}): no guarantee; they are not in the epsilon",
    )]


#: Overflow and high counts of SecAgg+ rounds: a count per round, but the server knows every cohort.
OVERFLOW_COUNTS = Item(
    "per SecAgg+ round, how many clients' updates overflowed or ran high: attributable to clients across rounds",
    "per tensor, how many clients' updates overflowed or ran high in each SecAgg+ round: a count, not which "
    "clients, but the server knows each round's cohort, so a count of 0 or of the whole cohort names every "
    "member's flag, and across rounds whose cohorts change the counts can be attributed to clients",
)

#: What no mode protects: sizes and participation.
PUBLIC_FACTS = Item(
    "each client's dataset size, the rounds it took part in, its failures and refusals, and when its replies arrived",
    "each client's dataset size (public: it weighs the FedAvg average), which rounds it took part in, whether "
    "its round failed or was refused (a refusal for the budget also shows that the client's ledger ran out, "
    "counting every run that shares it), and when its reply arrived",
)

#: Supervised FedAvg trains on labels: its updates carry them.
LABELS = Item(
    "the clients' labels: each supervised update carries its client's label distribution",
    "the clients' labels: supervised FedAvg trains the classifier and the backbone on them, so each "
    "update carries the client's label distribution (e.g. which classes it holds)",
)


def _public_facts(
    *, dp_sgd: bool, secagg: bool, releases: bool, method: Method, report_metrics: bool
) -> list[Item]:
    """What no part of the run protects: sizes and participation, overflow counts, and any metrics clients report."""
    facts = [PUBLIC_FACTS]
    if report_metrics:
        facts.append(_metrics_fact(dp_sgd=dp_sgd, secagg=secagg, releases=releases, method=method))
    if secagg:
        facts.append(OVERFLOW_COUNTS)
    return facts


def _metrics_fact(*, dp_sgd: bool, secagg: bool, releases: bool, method: Method) -> Item:
    """What the training metrics of ``--report-client-metrics`` reveal."""
    reported = (
        "step counts and wall-clock timings (their losses are not reported)"
        if dp_sgd
        else f"training metrics ({_data_metrics(method)}: averages computed from their data; step counts and "
        "timings)"
    )
    if not secagg:
        return Item(
            "with --report-client-metrics, each client's reported metrics, in plaintext",
            f"with --report-client-metrics, the {reported} each client reports in plaintext every round",
        )
    plain = (
        "; in rounds sent as initialisation (round 0, or any round the server labels so), which have no secure "
        "sum, each client's release time in plaintext"
        if releases
        else ""
    )
    return Item(
        "with --report-client-metrics, the reported metrics' means over each round's cohort, attributable to "
        "clients across rounds" + ("; each client's release time in plaintext in initialisation rounds" if releases else ""),
        f"with --report-client-metrics, the round's weighted means of the clients' {reported}, summed inside "
        "SecAgg+ like the update: not a DP bound, and not hidden per client either, since over rounds whose cohorts change "
        f"the server can estimate each client's own level (up to one offset and a trend common to all){plain}",
    )


def _data_metrics(method: Method) -> str:
    """The metrics a method's clients compute from their data (:func:`privfed.orchestra.local_training.step_means`)."""
    values = method.step_values
    if values == ("loss",):
        return "the loss"
    return "losses, target entropy, centroid cosine" if "target_entropy" in values else "losses"


def _lead(
    mechanism: type[Mechanism] | None,
    *,
    dp_sgd: bool,
    worst: WorstCase | None,
    k: int | None,
    sampling_rate: float,
    summed: bool,
) -> str:
    """The long text's first sentences: the strongest claim the run supports."""
    if mechanism is None:
        if dp_sgd:
            assert worst is not None  # privacy_statement refuses a DP run without it
            return (
                f"Encoder updates are ({_eps(worst.epsilon)}, {_delta(worst.delta)})-differentially private with respect "
                f"to {EXAMPLE_UNIT} (DP-SGD, PLD accountant, worst-off client). "
                "The method runs no release mechanism: clients send no centroids or representations besides "
                "their updates."
            )
        return (
            "No guarantee: the method runs no release mechanism, but encoder updates, which carry averages of "
            "each client's representations, are not covered."
        )
    name = mechanism.name
    is_dp = mechanism.is_differentially_private()
    # A share alone holds only part of the noise: what is private is the secure sum the server sees.
    sums = "the secure sums of the clients' shares (hence the summed tables and the global centroids)"
    if dp_sgd and is_dp:
        assert worst is not None  # privacy_statement refuses a DP run without it
        released = sums if summed else _released(mechanism)
        return (
            f"Encoder updates and {released} together are ({_eps(worst.epsilon)}, {_delta(worst.delta)})-"
            f"differentially private with respect to {EXAMPLE_UNIT}, for the "
            f"worst-off client (client {worst.client}): DP-SGD and the releases composed with the PLD accountant."
        )
    if dp_sgd:
        assert worst is not None  # privacy_statement refuses a DP run without it
        if mechanism.guarantee_kind == K_ANONYMITY:
            release_note = (
                f"Released centroids are only {_k(k)}-anonymous, per release (it does not compose), and are not "
                "covered."
            )
        elif mechanism.releases_raw_data:
            release_note = (
                f"What the {name} mechanism releases is NOT covered (raw representations), so no per-example "
                "guarantee holds for the run as a whole."
            )
        else:
            release_note = f"What the {name} mechanism releases is NOT covered."
        return (
            f"Encoder updates are ({_eps(worst.epsilon)}, {_delta(worst.delta)})-differentially private with respect to "
            f"{EXAMPLE_UNIT} (DP-SGD, PLD accountant, worst-off client). {release_note}"
        )
    if is_dp:
        assert worst is not None  # privacy_statement refuses a DP run without it
        what = f"Over the whole run, {sums} are, for every client," if summed else (
            f"Every client's {_released(mechanism)} over the whole run are"
        )
        return (
            f"{what} ({_eps(worst.epsilon)}, {_delta(worst.delta)})-"
            "differentially private with respect to replacing one of its representations by another (PLD "
            f"accountant, {_sample_clause(sampling_rate)}). Encoder updates are not covered."
        )
    if mechanism.guarantee_kind == K_ANONYMITY:
        return (
            f"Every released centroid is the mean of the representations of at least {_k(k)} distinct images of "
            "a client, one view each (k-anonymity, not differential privacy: an outlying image still moves its "
            "centroid, and two releases whose memories differ by one image reveal it). Encoder updates are not covered."
        )
    if mechanism.releases_raw_data:
        return "No guarantee: clients release their representations in the clear. Encoder updates are not covered."
    return f"No guarantee: what the {name} mechanism releases is not protected. Encoder updates are not covered."


def _updates_without_dp_sgd(secagg: bool) -> str:
    """The headline's clause for updates that no DP-SGD protects."""
    if secagg:
        return "model updates are not DP (SecAgg+ shows an honest-but-curious server only their sum)"
    return "model updates are not DP and travel in the clear"


def _headline(
    mechanism: type[Mechanism] | None,
    *,
    dp_sgd: bool,
    worst: WorstCase | None,
    k: int | None,
    secagg: bool,
    sampling_rate: float,
    min_shares: int | None,
    name: str,
    summed: bool,
) -> str:
    """At most a few lines: what is protected, by what, at what epsilon or k; never more than the long text claims.

    ``name`` is the mechanism's name as the headline quotes it ("" leaves it out, for a plug-in's long name).
    """
    at = "" if worst is None else f"({_eps(worst.epsilon)}, {_delta(worst.delta)})-DP"
    named = f" ({name})" if name else ""
    sgd_only = (
        f"Each client's model updates are {at} w.r.t. replacing one of its training examples (DP-SGD, worst-off "
        "client)"
    )
    updates = _updates_without_dp_sgd(secagg)
    if mechanism is None:
        if dp_sgd:
            return f"{sgd_only}; the method sends nothing else (but metrics, if reported)."
        return (
            "No DP guarantee: the method sends nothing but model updates (and metrics, if reported), which are not "
            "DP and carry averages "
            "of each client's representations" + ("; SecAgg+ shows an honest-but-curious server only their sum."
                                                  if secagg else ", in the clear.")
        )
    if summed:  # SecAgg+ is required: the trust clause names it, and the updates go inside it too
        trust = f" if an honest-but-curious server sees only SecAgg+ sums over >= {_k(min_shares)} non-colluding clients"
        updates = "model updates are not DP"
    else:
        trust = ""
    if mechanism.is_differentially_private():
        if dp_sgd:
            what = "the secure sums of shares" if summed else _released(mechanism)
            return (
                f"Each client's model updates and {what} are together {at} w.r.t. replacing one of its training "
                f"examples (DP-SGD{' + ' + name if name else ''}, worst-off client){trust}."
            )
        how = ", ".join(part for part in (name, "worst-off client", "secret sample" if sampling_rate < 1 else "") if part)
        what = "The secure sums of shares are, over the run and per client," if summed else (
            f"Each client's {_released(mechanism)} are, over the run,"
        )
        return f"{what} {at} w.r.t. replacing one of its representations ({how}){trust}; {updates}."
    if mechanism.guarantee_kind == K_ANONYMITY:
        if dp_sgd:
            return f"{sgd_only}; released centroids{named} are only {_k(k)}-anonymous, per release, outside the epsilon."
        return (
            f"No DP: each released centroid{named} is the mean of at least {_k(k)} distinct images of a client "
            f"(k-anonymity per release; it does not compose across releases); {updates}."
        )
    if mechanism.releases_raw_data:
        if dp_sgd:
            return (
                f"No guarantee for the run as a whole: clients release raw representations{named}, outside the "
                f"epsilon; only model updates are {at} w.r.t. replacing one training example (DP-SGD, worst-off client)."
            )
        return f"No guarantee: clients release their representations in the clear{named}; {updates}."
    if dp_sgd:
        return f"{sgd_only}; what is released{named} is not covered."
    return f"No guarantee: what is released{named} is not protected; {updates}."


def _details(mechanism: type[Mechanism] | None, *, summed: bool) -> str:
    """The docs/privacy.md section with the long text of this kind of release (a plug-in's too: it is by kind)."""
    if mechanism is None:
        anchor = "statement-no-release"
    elif mechanism.is_differentially_private():
        anchor = "statement-secure-sums" if summed else "statement-dp-releases"
    elif mechanism.guarantee_kind == K_ANONYMITY:
        anchor = "statement-k-anonymity"
    elif mechanism.releases_raw_data:
        anchor = "statement-raw-representations"
    else:
        anchor = "statement-no-guarantee"
    return f"{DOCS}#{anchor}"


def privacy_statement(
    *,
    mechanism: type[Mechanism] | None,
    dp_sgd: bool,
    worst: WorstCase | None,
    k: int | None,
    secagg: bool = True,
    method: Method = ORCHESTRA,
    report_metrics: bool = False,
    release_sampling_rate: float = 1.0,
    min_shares: int | None = None,
    leaked_shares: LeakedShares | None = None,
) -> PrivacyStatement:
    """Builds the statement for one run.

    Args:
        mechanism: The release mechanism's class (it says what kind of
            guarantee it gives and whether it releases raw data); None when
            the run's method releases nothing.
        dp_sgd: Whether clients trained with DP-SGD.
        worst: The ledger's :meth:`~privfed.privacy.ledger.PrivacyLedger.worst_case_summary`
            (None when nothing in the run is DP).
        k: Smallest anonymity-set size of k-anonymous releases, if any.
        secagg: Whether encoder updates went through secure aggregation.
        method: The run's method: which metrics its clients compute, and
            whether they train on their labels.
        report_metrics: Whether clients send those metrics (``--report-client-metrics``).
        release_sampling_rate: Rate of the releases' secret Poisson sample (1: none).
        min_shares: A secure-sum mechanism's ``K_min``: the fewest clients' shares in each secure sum.
        leaked_shares: What its shares would cost seen alone (:func:`leaked_share_cost`; None: not stated).
    """
    if (dp_sgd or (mechanism is not None and mechanism.is_differentially_private())) and worst is None:
        raise ValueError("a run with a DP part needs the ledger's worst case")
    summed = mechanism is not None and issubclass(mechanism, SecureSumMechanism)  # the server sees only sums
    covered: list[Item] = []
    uncovered: list[Item] = []
    for part_covers, part_not_covered in (
        _encoder_update_clauses(dp_sgd=dp_sgd, worst=worst, secagg=secagg),
        _release_clauses(
            mechanism, dp_sgd=dp_sgd, worst=worst, k=k, sampling_rate=release_sampling_rate, min_shares=min_shares,
            summed=summed,
        ),
    ):
        covered += part_covers
        uncovered += part_not_covered
    if method.reads_labels and not dp_sgd:
        uncovered.append(LABELS)
    uncovered += _public_facts(
        dp_sgd=dp_sgd, secagg=secagg, releases=mechanism is not None, method=method, report_metrics=report_metrics
    )
    if summed:
        uncovered.append(_secure_sum_trust(leaked_shares))
    uncovered.append(DEVIATING_SERVER)
    def headline(name: str) -> str:
        return _headline(mechanism, dp_sgd=dp_sgd, worst=worst, k=k, secagg=secagg,
                         sampling_rate=release_sampling_rate, min_shares=min_shares, name=name, summed=summed)

    short = headline("" if mechanism is None else mechanism.name)
    if len(short) > HEADLINE_LIMIT:  # only a plug-in's long name can do that
        short = headline("")
    lead = _lead(mechanism, dp_sgd=dp_sgd, worst=worst, k=k, sampling_rate=release_sampling_rate, summed=summed)
    return PrivacyStatement(
        headline=short, lead=lead, covered=tuple(covered), uncovered=tuple(uncovered), details=_details(mechanism, summed=summed)
    )
