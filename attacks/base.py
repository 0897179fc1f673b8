"""The inversion-attack interface, and the one object an attacker is handed.

An attack is the semi-honest server's: it knows every model it sent and every
release it received, and holds public auxiliary images disjoint from the
clients', never a client's images or memory. :class:`AttackTarget` is all it
gets of a round; what it learns from data comes from the auxiliary images
given to :meth:`Attack.fit`.
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from privfed.data.augment import normalize

#: Reconstructs images in [0, 1] (``[m, 3, H, W]``) from released vectors (``[m, D]``).
Inversion = Callable[[torch.Tensor], torch.Tensor]
#: Progress reports: (stage, done, total, figures such as the current loss).
ProgressCallback = Callable[[str, int, int, dict[str, float]], None]


@dataclass(frozen=True)
class AttackTarget:
    """What the server knows of one round: the model it sent and how clients were told to release.

    ``encoder`` (whose normalised outputs clients released, as the round
    started) must not change: :meth:`frozen_encoder` copies it.
    """

    round: int
    encoder: nn.Module
    mechanism: str
    mechanism_params: dict[str, Any]
    centroids: torch.Tensor | None
    num_local_centroids: int
    memory_size: int
    batch_size: int
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def frozen_encoder(self) -> nn.Module:
        """A copy of the encoder on :attr:`device`, without gradients for its parameters."""
        encoder = copy.deepcopy(self.encoder).to(self.device)
        for p in encoder.parameters():
            p.requires_grad_(False)
        return encoder


def represent(encoder: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """What a client would release of ``images`` (float in [0, 1]): the normalised encoder output."""
    return F.normalize(encoder(normalize(images)), dim=1)


def check_settings(
    *, counts: dict[str, Any] | None = None, rates: dict[str, Any] | None = None, weights: dict[str, Any] | None = None
) -> None:
    """Refuses (ValueError) a setting that would quietly weaken an attack: counts must be whole numbers >= 1,
    rates numbers > 0, weights numbers >= 0 (a bool or a string is none of these)."""
    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    for name, value in (counts or {}).items():
        if not (number(value) and float(value).is_integer() and value >= 1):
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    for name, value in (rates or {}).items():
        if not (number(value) and value > 0):
            raise ValueError(f"{name} must be a number > 0, got {value!r}")
    for name, value in (weights or {}).items():
        if not (number(value) and value >= 0):
            raise ValueError(f"{name} must be a number >= 0, got {value!r}")


class Attack(abc.ABC):
    """Learns, from public information only, to turn released vectors into images; subclasses set ``name`` and
    ``description``, take keyword-only settings (a fixed budget) and implement :meth:`fit`."""

    name: ClassVar[str]
    description: ClassVar[str]
    #: Whether :meth:`fit` depends on the mechanism (else one fit serves every mechanism's releases of a round).
    uses_mechanism: ClassVar[bool] = False

    def __init__(self, *, seed: int = 0) -> None:
        self.seed = seed

    def settings(self) -> dict[str, Any]:
        """The attack's budget and settings, recorded next to its scores."""
        return {"seed": self.seed}

    @abc.abstractmethod
    def fit(
        self, target: AttackTarget, aux_images: torch.Tensor, *, progress: ProgressCallback | None = None
    ) -> Inversion:
        """Prepares the attack on one round's model from uint8 auxiliary images; returns the inversion."""


@dataclass(frozen=True)
class ReleaseHistory:
    """What the server received from one client up to the attacked round: per round it took part in, oldest
    first and the attacked round last, the ``[m, D]`` vectors and ``[m]`` weights of its release."""

    client: int
    rounds: tuple[int, ...]
    vectors: tuple[torch.Tensor, ...]
    weights: tuple[torch.Tensor, ...]
    #: What the server sent in each of those rounds (its model, centroids and mechanism); empty: not given.
    targets: tuple[AttackTarget, ...] = ()

    def __post_init__(self) -> None:
        if not self.rounds or not len(self.rounds) == len(self.vectors) == len(self.weights):
            raise ValueError("a release history needs one (vectors, weights) pair per round, and at least one round")
        if self.targets and [t.round for t in self.targets] != list(self.rounds):
            raise ValueError("a release history's targets must be those of its rounds, in order")


@dataclass(frozen=True)
class Estimates:
    """Vectors a cross-round attack inverts, and for each the attacked round's released vector it is read from
    (its members are the truth it is scored against)."""

    vectors: torch.Tensor
    source: torch.Tensor


class CrossRoundAttack(Attack):
    """An attack that reads a client's whole history before inverting: :meth:`estimate` turns it into vectors
    (estimates of single representations under the attacked round's model); :meth:`fit` inverts them."""

    #: How many rounds back, the attacked one included, the history it is handed reaches.
    window: int

    @abc.abstractmethod
    def estimate(self, history: ReleaseHistory, aux_images: torch.Tensor) -> Estimates:
        """The vectors to invert from one client's history, with the same uint8 auxiliary images as :meth:`fit`."""
