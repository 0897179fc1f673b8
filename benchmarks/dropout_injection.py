"""Clients that fail on purpose at chosen SecAgg+ stages: for testing how rounds survive dropouts.

A :class:`DropoutPlan` decides, from a seed alone, which client fails in
which Flower round and at which stage of the protocol. :func:`dropout_mod`
turns it into a ClientApp mod (give it to
:func:`privfed.federation.simulation.simulate` as an outer mod): the chosen
client raises when the stage's message arrives, so Flower answers the server
with an error, as it would for a node that crashed or lost its connection.
The plan is pure, so a test can predict what each round should have done.

The stages a client can fail at, in protocol order:

- ``setup``: before anything (no keys, no training, nothing released);
- ``share_keys``: after sending its public keys, before sharing its secrets
  (it entered nobody's masks);
- ``collect_masked_vectors``: after the key exchange, before training (its
  neighbours' masks for it must be removed);
- ``privfed_consistency``: after it sent its masked update, before it signs
  the survivor set (it is in the sum, and signs and shares nothing more);
- ``unmask``: after it trained, released and sent its masked update (it is
  in the sum; it only withholds the shares others need).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from flwr.app import Message
from flwr.common import Context
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage

from privfed.federation.client_app import Mod
from privfed.secagg.identity import CONSISTENCY_STAGE

#: Where a client can fail, in protocol order (see the module docstring).
FAILURE_STAGES = (Stage.SETUP, Stage.SHARE_KEYS, Stage.COLLECT_MASKED_VECTORS, CONSISTENCY_STAGE, Stage.UNMASK)


class InjectedDropout(RuntimeError):
    """Raised by a client that the :class:`DropoutPlan` makes fail."""


@dataclass(frozen=True)
class DropoutPlan:
    """Each sampled client fails with probability ``rate`` in a training round, at a uniformly chosen stage.

    Args:
        rate: Chance that a client fails in a given round, in [0, 1].
        seed: The plan's seed; the same seed fails the same clients at the same stages.
        stages: The stages a failing client can fail at (a subset of :data:`FAILURE_STAGES`).
    """

    rate: float
    seed: int = 0
    stages: tuple[str, ...] = FAILURE_STAGES

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"the dropout rate must be in [0, 1], got {self.rate}")
        unknown = [s for s in self.stages if s not in FAILURE_STAGES]
        if unknown or not self.stages:
            raise ValueError(f"stages must be a non-empty subset of {FAILURE_STAGES}, got {self.stages}")

    def failing_stage(self, flower_round: int, partition: int) -> str | None:
        """The stage at which ``partition`` fails in ``flower_round`` (Flower counts rounds from 1), or None."""
        digest = hashlib.sha256(f"{self.seed}:{flower_round}:{partition}".encode()).digest()
        draw = int.from_bytes(digest[:8], "big") / 2**64
        if draw >= self.rate:
            return None
        return self.stages[int.from_bytes(digest[8:16], "big") % len(self.stages)]


def dropout_mod(plan: DropoutPlan) -> Mod:
    """A ClientApp mod that fails the clients ``plan`` chooses (outermost, so nothing of theirs runs)."""

    def mod(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
        configs = msg.content.config_records.get(RECORD_KEY_CONFIGS)
        stage = None if configs is None else configs.get(Key.STAGE)
        if stage is not None:
            partition = int(context.node_config["partition-id"])
            if plan.failing_stage(int(msg.metadata.group_id), partition) == stage:
                raise InjectedDropout(f"partition {partition} fails at SecAgg+ stage {stage!r} (injected)")
        return call_next(msg, context)

    return mod


@dataclass(frozen=True)
class ExpectedRound:
    """What a SecAgg+ round should do under a :class:`DropoutPlan` (complete neighbourhoods).

    Attributes:
        released: Clients whose reply, and with it their release, reaches the server.
        survivors: Clients that answer every stage.
        completes: Whether enough survivors remain to unmask the sum; otherwise SecAgg+ halts.
    """

    released: frozenset[int]
    survivors: int
    completes: bool


def expected_round(plan: DropoutPlan, flower_round: int, sampled: list[int], threshold: int) -> ExpectedRound:
    """The outcome a training round should have when every sampled client neighbours every other.

    After setup and again after the key exchange, at least ``threshold``
    clients must remain, or the round halts before anyone trains: nothing
    is released. Otherwise every client that did not fail before masking
    replies (and releases); one that fails at the consistency stage or at unmask
    has already replied.
    Unmasking needs ``threshold`` shares from the clients still answering,
    so the round completes exactly when at least ``threshold`` never fail.
    """
    stages = {client: plan.failing_stage(flower_round, client) for client in sampled}
    survivors = sum(stage is None for stage in stages.values())
    remaining = len(sampled)
    for early in (Stage.SETUP, Stage.SHARE_KEYS):
        remaining -= sum(stage == early for stage in stages.values())
        if remaining < threshold:
            return ExpectedRound(released=frozenset(), survivors=survivors, completes=False)
    released = frozenset(c for c, stage in stages.items() if stage in (None, CONSISTENCY_STAGE, Stage.UNMASK))
    return ExpectedRound(released=released, survivors=survivors, completes=survivors >= threshold)
