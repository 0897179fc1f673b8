"""The privacy statement of a finished run: what its guarantee covers, and what it does not.

One function builds it for every combination of release mechanism (``kanon``,
``reps``, ``ldp``, or a third-party one) and DP-SGD on or off, from the
ledger's numbers, so that ``summary.json`` never claims more than the
accounting supports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from privfed.privacy.ledger import WorstCase


@dataclass(frozen=True)
class PrivacyStatement:
    """A quotable statement, split into what is covered and what is not.

    Attributes:
        text: The whole statement, for people.
        covers: What the guarantee protects, one item each.
        not_covered: What it does not protect, one item each.
    """

    text: str
    covers: tuple[str, ...] = field(default_factory=tuple)
    not_covered: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {"statement": self.text, "covers": list(self.covers), "not_covered": list(self.not_covered)}


def _eps(value: float) -> str:
    return f"{value:.3g}"


def privacy_statement(
    *,
    mechanism: str,
    mechanism_is_dp: bool,
    dp_sgd: bool,
    worst: WorstCase | None,
    k: int | None,
    secagg: bool = True,
) -> PrivacyStatement:
    """Builds the statement for one run.

    Args:
        mechanism: The release mechanism's name.
        mechanism_is_dp: Whether its releases carry privacy events (``ldp``).
        dp_sgd: Whether clients trained with DP-SGD.
        worst: The ledger's :meth:`~privfed.privacy.ledger.PrivacyLedger.worst_case_summary`
            (None when nothing in the run is DP).
        k: Smallest anonymity-set size of k-anonymous releases, if any.
        secagg: Whether encoder updates went through secure aggregation.
    """
    if (dp_sgd or mechanism_is_dp) and worst is None:
        raise ValueError("a run with a DP part needs the ledger's worst case")
    covers: list[str] = []
    not_covered: list[str] = []
    delta = worst.delta if worst is not None else None
    unit = "one training example of a client (add/remove)"

    if dp_sgd:
        covers.append(
            f"encoder updates (online and target encoders, rotation head): DP-SGD, epsilon {_eps(worst.dp_sgd_worst)} "
            f"at delta {delta:.2g} for the worst-off client alone, per {unit}; with Poisson-subsampling "
            "amplification, which relies on each client's batch sampling staying secret"
        )
    else:
        protection = "SecAgg+ shows the server only their sum, which is not a DP bound" if secagg else "sent in the clear"
        not_covered.append(f"encoder updates: no DP-SGD ({protection})")

    if mechanism_is_dp:
        releases = f"released centroids ({mechanism}): epsilon {_eps(worst.releases_worst)} at delta {delta:.2g} alone"
        if dp_sgd:
            covers.append(f"{releases}, per {unit}: each example gives at most one representation to the memory")
        else:
            covers.append(f"{releases}, per representation in a client's memory")
            not_covered.append(
                "examples, as opposed to representations: one example can give several representations to the memory "
                "(it holds the last training batches) and BatchNorm mixes every batch, so the release guarantee is "
                "not a per-example one"
            )
        not_covered.append(
            "subsampling amplification for releases: none is claimed (the memory is not a secret Poisson sample)"
        )
    elif mechanism == "kanon":
        not_covered.append(
            f"released centroids ({mechanism}): k-anonymity (each the mean of at least {k if k is not None else '?'} of a client's "
            "representations), not differential privacy; they are not in the epsilon"
        )
    else:
        not_covered.append(
            f"released vectors ({mechanism}): no guarantee"
            + (", representations are sent in the clear" if mechanism == "reps" else "")
            + "; they are not in the epsilon"
        )

    not_covered.append("each client's dataset size (public: it weighs the FedAvg average) and which rounds it took part in")
    if dp_sgd:
        not_covered.append("wall-clock timings clients report (their losses are not reported)")

    if dp_sgd and mechanism_is_dp:
        head = (
            f"Everything a client sends, encoder updates and released centroids, is ({_eps(worst.epsilon)}, {delta:.2g})-"
            f"differentially private with respect to {unit}, for the worst-off client (client {worst.client}): "
            "DP-SGD and the releases composed with the PLD accountant."
        )
    elif dp_sgd:
        release_note = (
            f"Released centroids are only {k if k is not None else '?'}-anonymous and are not covered."
            if mechanism == "kanon"
            else f"What the {mechanism} mechanism releases is NOT covered"
            + (" (raw representations), so no per-example guarantee holds for the run as a whole." if mechanism == "reps" else ".")
        )
        head = (
            f"Encoder updates are ({_eps(worst.epsilon)}, {delta:.2g})-differentially private with respect to {unit} "
            f"(DP-SGD, PLD accountant, worst-off client). {release_note}"
        )
    elif mechanism_is_dp:
        head = (
            f"Every client's released centroids over the whole run are ({_eps(worst.epsilon)}, {delta:.2g})-"
            "differentially private with respect to one of its representations (PLD accountant, no subsampling "
            "amplification). Encoder updates are not covered."
        )
    elif mechanism == "kanon":
        head = (
            f"Every released centroid is the mean of at least {k if k is not None else '?'} of a client's "
            "representations (k-anonymity, not differential privacy). Encoder updates are not covered."
        )
    elif mechanism == "reps":
        head = "No guarantee: clients release their representations in the clear. Encoder updates are not covered."
    else:
        head = f"No guarantee: what the {mechanism} mechanism releases is not protected. Encoder updates are not covered."
    text = head + " Not covered: " + "; ".join(not_covered) + "."
    return PrivacyStatement(text=text, covers=tuple(covers), not_covered=tuple(not_covered))
