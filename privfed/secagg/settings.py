"""SecAgg+ protocol settings for a run: pure values that follow from the configuration and client sizes.

They are fixed once, in the run's plan, and recorded in ``summary.json``;
:mod:`privfed.secagg.workflow` runs the protocol.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

from privfed.config import TrainConfig
from privfed.errors import PrivfedError


def indicators_are_exact(clipping_range: float, quantization_range: int) -> bool:
    """Whether a raised indicator (1 after SecAgg+'s weighting) lands exactly on SecAgg+'s fixed-point grid.

    Flower rounds ``(value + c) * Q / (2c)`` stochastically, from a seed the
    server can compute: off the grid, each client's draw would round a flag
    its own way, and the sum would say which clients raised it. Powers of
    two up to ``Q / 2`` are on the grid.
    """
    position = (Fraction(clipping_range) + 1) * quantization_range / (2 * Fraction(clipping_range))
    return position.denominator == 1


#: The settings a client encodes its update, indicators and metrics with, each sent in the fit config as
#: ``secagg_<name>``, and the key under which Flower's client mod keeps the same value from the round's setup.
ENCODING_IN_FLOWER_STATE = {
    "max_weight": "max_weight",
    "clipping_range": "clipping_range",
    "quantization_range": "target_range",
    "modulus_range": "mod_range",  # a larger modulus would overflow the int64 sums
}


@dataclass(frozen=True)
class SecAggPlusSettings:
    """The SecAgg+ parameters of a run (recorded in ``summary.json``).

    A client's key is split into ``num_shares`` shares (its neighbours, itself
    included), ``reconstruction_threshold`` of which rebuild it. Weights are
    divided by ``max_weight`` (the largest client). ``timeout``: seconds each
    stage waits for replies (None: all replies).
    """

    num_shares: int
    reconstruction_threshold: int
    clipping_range: float
    max_weight: float
    quantization_range: int = 2**22
    modulus_range: int = 2**32
    timeout: float | None = None

    def encoding_config(self) -> dict[str, float | int]:
        """The fit-config entries a client encodes with (see :data:`ENCODING_IN_FLOWER_STATE`)."""
        return {f"secagg_{name}": getattr(self, name) for name in ENCODING_IN_FLOWER_STATE}

    @property
    def tolerated_dropouts(self) -> int:
        return self.num_shares - self.reconstruction_threshold

    def workflow_arguments(self, num_sampled: int) -> dict[str, Any]:
        """Keyword arguments of Flower's ``SecAggPlusWorkflow`` for ``num_sampled`` clients per round.

        Shares and threshold go as fractions, which Flower turns back into these
        counts: it rejects integer shares below 3, which two-client rounds need.
        """
        return {
            "num_shares": self.num_shares / num_sampled,
            "reconstruction_threshold": self.reconstruction_threshold / self.num_shares,
            "max_weight": self.max_weight,
            "clipping_range": self.clipping_range,
            "quantization_range": self.quantization_range,
            "modulus_range": self.modulus_range,
            "timeout": self.timeout,
        }

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tolerated_dropouts": self.tolerated_dropouts}


def default_num_shares(num_sampled: int) -> int:
    """Every sampled client: each shares keys with all others.

    SecAgg+'s logarithmic neighbourhoods (Bell et al., 2020) are the server's
    to choose, and a server that deviates could give a client a neighbourhood
    it can make drop; nodes refuse them (:mod:`privfed.secagg.client_agreement`).
    """
    return num_sampled


def default_threshold(num_shares: int) -> int:
    """The smallest strict majority of the shares (never below 2, which two-client rounds need).

    Against a deviating server, two survivor sets cannot both gather ``t``
    signatures when ``2t > n`` (docs/privacy.md, "SecAgg+ against a deviating server").
    """
    return max(2, num_shares // 2 + 1)


def secagg_settings(config: TrainConfig, client_sizes: list[int]) -> SecAggPlusSettings | None:
    """The run's SecAgg+ parameters, or None when it is off; PrivfedError for settings the protocol cannot run with."""
    if not config.secagg:
        return None
    sampled = config.clients_per_round
    if sampled < 2:
        raise PrivfedError(
            f"secure aggregation needs at least 2 clients per round, this run samples {sampled}; "
            "raise --participation or --num-clients, or pass --no-secagg"
        )
    shares = config.secagg_shares if config.secagg_shares is not None else default_num_shares(sampled)
    if shares != sampled:
        raise PrivfedError(
            f"--secagg-shares must be the number of sampled clients ({sampled}), got {shares}: privfed's SecAgg+ "
            "has every client share keys with all others (nodes refuse sparse neighbourhoods, which the server chooses)"
        )
    threshold = config.secagg_threshold if config.secagg_threshold is not None else default_threshold(shares)
    if not default_threshold(shares) <= threshold <= shares:
        raise PrivfedError(
            f"--secagg-threshold must be a strict majority of the {shares} shares and at most all of them "
            f"({default_threshold(shares)} to {shares}), got {threshold}: nodes refuse a lower one"
        )
    if config.secagg_clipping_range < 1:
        raise PrivfedError(
            f"--secagg-clipping-range must be at least 1 (the overflow indicators travel as ones), "
            f"got {config.secagg_clipping_range}"
        )
    if not indicators_are_exact(config.secagg_clipping_range, SecAggPlusSettings.quantization_range):
        raise PrivfedError(
            f"--secagg-clipping-range {config.secagg_clipping_range:g} puts the overflow indicators off SecAgg+'s "
            "fixed-point grid, where their rounding would say which clients raised them; use a power of two (e.g. 8)"
        )
    if config.secagg_timeout is not None and config.secagg_timeout <= 0:
        raise PrivfedError(f"--secagg-timeout must be > 0, got {config.secagg_timeout}")
    return SecAggPlusSettings(
        num_shares=shares,
        reconstruction_threshold=threshold,
        clipping_range=config.secagg_clipping_range,
        max_weight=float(max(max(client_sizes), 1)),
        timeout=config.secagg_timeout,
    )
