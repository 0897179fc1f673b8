"""One SecAgg+ round in-process: privfed's workflow against privfed's real client mod, over a grid that delivers directly.

The SecAgg+ benchmarks time and measure it, and the SecAgg+ tests drive it
(their fixture and dropping clients are in
``tests/secagg/harness.py``); it lives here because benchmarks
import nothing from tests.

No Ray and no simulation: each message goes straight to the node's
SecAgg+ mod (:func:`privfed.secagg.client_mod.privfed_secaggplus_mod`,
by default) with a fit that returns the node's fixed update. A node's
``behaviour`` may replace or tamper with its honest reply, so tests can drop
clients at any stage or send hostile replies, and read what the server
aggregated. The strategy is a small stand-in with the workflow's interface
(:class:`privfed.secagg.workflow.RoundCloser`).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import flwr.compat.common.recorddict_compat as compat
import numpy as np
from flwr.app import Context, Error, Message, RecordDict
from flwr.common import (
    Code,
    ConfigRecord,
    FitIns,
    FitRes,
    Status,
    bytes_to_ndarray,
    ndarray_to_bytes,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.server import LegacyContext
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey

from privfed.secagg.client_mod import privfed_secaggplus_mod
from privfed.secagg.client_trust import NodeTrust, SignedRounds
from privfed.secagg.identity import simulated_identities
from privfed.secagg.masking import SHARE_KEY
from privfed.secagg.workflow import _CapturingSecAggPlusWorkflow

#: ``behaviour(stage, honest_reply) -> reply``: raise to drop out, or return a (tampered) reply.
Behaviour = Callable[[str, Callable[[], Message]], Message]


class _Proxy:
    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.cid = str(node_id)


class _ClientManager:
    def __init__(self, count: int) -> None:
        self.count = count

    def num_available(self) -> int:
        return self.count


@dataclass
class StandInStrategy:
    """Samples every node, records the aggregate; ``reject`` plays the strategy's masked-reply check."""

    node_ids: list[int]
    reject: Callable[[int], str | None] = lambda node_id: None
    aggregate: list[np.ndarray] | None = None
    aggregated_from: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    next_round_trains: bool = True
    carries_share: bool = False
    secure_sum: tuple[np.ndarray, int] | None = None
    results: list = field(default_factory=list)

    def configure_fit(self, server_round: int, parameters: Any, client_manager: Any) -> list[tuple[_Proxy, FitIns]]:
        return [(_Proxy(n), FitIns(parameters, {"round": server_round})) for n in self.node_ids]

    def aggregate_fit(self, server_round: int, results: list, failures: list) -> tuple[None, dict]:
        self.aggregate = parameters_to_ndarrays(results[0][1].parameters)
        self.results = list(results)
        self.aggregated_from = sorted(proxy.node_id for proxy, _ in results)
        return None, {}

    def check_masked_reply(self, node_id: int, res: FitRes | None, masked: list[np.ndarray] | None) -> str | None:
        reason = self.reject(node_id)
        if reason is not None:
            self.rejected.append(node_id)
        return reason

    def note_replies(self, results: list) -> None:
        pass

    def note_secure_sum(self, total: np.ndarray, *, num_summed: int, nodes: Collection[int] = ()) -> None:
        self.secure_sum = (total, num_summed)

    def close_round_without_aggregate(self, server_round: int) -> None:
        pass  # called by OrchestraFitWorkflow, which the harness does not run


class DirectGrid:
    """Delivers each message to the node's client stack and records which stages each node reached.

    ``send_and_receive`` answers every message at once, like a grid's;
    ``pull_messages`` delivers one pushed message per call, so replies
    arrive one by one as from a real link, and each is built only when the
    server asks for the next. ``record_masked`` keeps every masked vector
    sent (for tests that read them; off where memory is measured).
    """

    def __init__(
        self,
        updates: dict[int, tuple[list[np.ndarray], int]],
        behaviours: dict[int, Behaviour],
        client_mods: dict[int, Any],
        shares: dict[int, np.ndarray] | None = None,
        record_masked: bool = True,
    ) -> None:
        self.updates = updates
        self.shares = shares or {}
        self.behaviours = behaviours
        self.client_mods = client_mods
        self.record_masked = record_masked
        self.contexts = {n: Context(run_id=1, node_id=n, node_config={}, state=RecordDict(), run_config={}) for n in updates}
        self.identities = dict(zip(updates, simulated_identities(len(updates))))
        self.stages: list[str] = []
        self.reached: dict[int, list[str]] = {}  # node -> the stages it was asked for
        self.masked: dict[int, list[np.ndarray]] = {}  # node -> the masked vector it sent
        self.pulls = 0  # calls of pull_messages
        self._pushed: dict[str, Message] = {}  # message id -> a pushed message not yet answered
        self._ids = itertools.count(1)

    def get_node_ids(self) -> list[int]:
        return list(self.updates)

    def push_messages(self, messages: Any) -> list[str]:
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = str(next(self._ids))  # as Flower's grids do on push
            self._pushed[message.metadata.message_id] = message
            ids.append(message.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Any) -> list[Message]:
        self.pulls += 1
        waiting = [i for i in message_ids if i in self._pushed]
        return [self._deliver(self._pushed.pop(waiting[0]))] if waiting else []

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> list[Message]:
        return [self._deliver(self._pushed.pop(i)) for i in self.push_messages(messages)]

    def _deliver(self, message: Message) -> Message:
        node = message.metadata.dst_node_id
        stage = str(message.content.config_records[RECORD_KEY_CONFIGS][Key.STAGE])
        self.stages.append(stage)
        self.reached.setdefault(node, []).append(stage)
        own = Message(  # the workflow reuses one content object for several nodes
            RecordDict({k: ConfigRecord(dict(v)) for k, v in message.content.config_records.items()}),
            dst_node_id=node, message_type=message.metadata.message_type, group_id=message.metadata.group_id,
        )
        own.metadata.__dict__["_message_id"] = message.metadata.message_id
        mod = self.client_mods.get(node) or partial(privfed_secaggplus_mod, trust_of=self.trust_of)

        def honest() -> Message:
            return mod(own, self.contexts[node], self._fit(node))

        behaviour = self.behaviours.get(node)
        try:
            reply = behaviour(stage, honest) if behaviour else honest()
        except Exception as err:
            reply = Message(Error(code=1, reason=repr(err)), reply_to=own)
        if self.record_masked and stage == Stage.COLLECT_MASKED_VECTORS and not reply.has_error():
            self.masked[node] = [bytes_to_ndarray(b) for b in reply.content.config_records[RECORD_KEY_CONFIGS][Key.MASKED_PARAMETERS]]
        return reply

    def trust_of(self, context: Context) -> NodeTrust:
        """A node's trust: its identity among the round's, its signed rounds in its context."""
        return NodeTrust(self.identities[context.node_id], max_corrupt=0, signed=SignedRounds(None, context), run_key=1)

    def _fit(self, node: int) -> Callable[[Message, Context], Message]:
        def fit(message: Message, context: Context) -> Message:
            arrays, num_examples = self.updates[node]
            metrics = {SHARE_KEY: ndarray_to_bytes(self.shares[node])} if node in self.shares else {}
            res = FitRes(
                status=Status(Code.OK, "ok"), parameters=ndarrays_to_parameters(arrays), num_examples=num_examples,
                metrics=metrics,
            )
            return Message(compat.fitres_to_recorddict(res, keep_input=True), reply_to=message)

        return fit


@dataclass
class RoundOutcome:
    strategy: StandInStrategy
    grid: DirectGrid

    @property
    def completed(self) -> bool:
        return self.strategy.aggregate is not None

    @property
    def mean(self) -> np.ndarray:
        """The aggregate as Flower hands it over: the weighted mean update (one array)."""
        assert self.strategy.aggregate is not None
        return self.strategy.aggregate[0]


def run_round(
    updates: dict[int, tuple[list[np.ndarray], int]],
    *,
    shares: int,
    threshold: int,
    behaviours: dict[int, Behaviour] | None = None,
    reject: Callable[[int], str | None] = lambda node_id: None,
    seed: int = 0,
    client_mods: dict[int, Any] | None = None,
    client_shares: dict[int, np.ndarray] | None = None,
    record_masked: bool = True,
) -> RoundOutcome:
    """One SecAgg+ round over ``updates`` (node id -> (arrays, num_examples)), every node sampled.

    ``client_mods`` replaces privfed's SecAgg+ client mod at some nodes (e.g. with Flower's own).
    ``client_shares`` gives nodes an aggregated mechanism's share (integers mod 2^32) to send in their masked vector.
    """
    random.seed(seed)  # Flower shuffles the nodes into its neighbour ring with the global generator
    strategy = StandInStrategy(list(updates), reject=reject, carries_share=client_shares is not None)
    workflow = _CapturingSecAggPlusWorkflow(
        strategy, num_shares=shares / len(updates), reconstruction_threshold=threshold / shares,
        clipping_range=8.0, quantization_range=2**22, modulus_range=2**32, max_weight=1000.0,
    )
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: 1})
    context.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(
        ndarrays_to_parameters([np.zeros(3)]), True
    )
    grid = DirectGrid(updates, behaviours or {}, client_mods or {}, client_shares, record_masked)
    workflow(grid, LegacyContext(context, strategy=strategy, client_manager=_ClientManager(len(updates))))  # type: ignore[arg-type]
    return RoundOutcome(strategy, grid)


def mean_of(updates: dict[int, tuple[list[np.ndarray], int]], nodes: list[int]) -> np.ndarray:
    """The FedAvg mean of some nodes' single-array updates."""
    total = sum(updates[n][1] for n in nodes)
    return sum(updates[n][0][0] * (updates[n][1] / total) for n in nodes)
