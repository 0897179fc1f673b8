"""Orchestra as a legacy Flower ``Strategy``: the interface SecAgg+ (inside ``DefaultWorkflow``) talks to.

A thin adapter: sampling and message packing here, the update rule in
:class:`privfed.orchestra.server.OrchestraServer`. Flower round ``r`` is
Orchestra round ``r - 1`` (round 0 initialises: no training).

Under SecAgg+ every reply's parameters are the same securely aggregated mean,
and the strategy reads that one; without it, it forms FedAvg itself. A
secure-sum mechanism's shares ride in the same masked vectors, after the
update; the workflow hands their sum over (:meth:`OrchestraStrategy.note_secure_sum`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from typing import Any

import numpy as np
import torch
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    ndarray_to_bytes,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from privfed.federation.messages import arrays_to_state, state_to_arrays, tensor_to_bytes
from privfed.federation.reply_checks import (
    CheckedReply,
    RejectedReply,
    ReplyRules,
    check_masked_vector,
    check_reply,
    screen_replies,
)
from privfed.orchestra.model_state import StateDict, shared_keys, weighted_mean
from privfed.orchestra.round_report import Rejection, RoundReport
from privfed.orchestra.server import OrchestraServer, SecureSum
from privfed.secagg.encoding import (
    ImplausibleAggregate,
    decode_aggregate,
    decode_metrics,
    initial_scales,
    max_useful_scale,
    next_scales,
    secagg_weight_ratio,
    secure_sum_shapes,
)
from privfed.secagg.masks import MASK_PRG, PROTOCOL_VERSION
from privfed.secagg.settings import SecAggPlusSettings

logger = logging.getLogger(__name__)

#: How long a round waits for every partition's SuperNode to connect.
NODE_WAIT_SECONDS = 300
#: The driver's round hook: returns a reason to stop training, or None to go on.
RoundHook = Callable[[RoundReport], str | None]
#: An accepted reply: its proxy, the reply as received, and what the checks decoded (in client order).
Accepted = tuple[ClientProxy, FitRes, CheckedReply]


class OrchestraStrategy(Strategy):
    """Samples clients, ships the global state and folds their replies back in."""

    def __init__(
        self, server: OrchestraServer, on_round_end: RoundHook, *, clients_per_round: int, seed: int,
        partition_of: dict[int, int] | None = None, reply_rules: ReplyRules | None = None,
        secagg: SecAggPlusSettings | None = None, first_round: int = 0, keep_updates: bool = False,
    ) -> None:
        """``keep_updates``: hand each client's delta to the round hook (:attr:`RoundReport.updates`) where the server
        sees it in the clear (no SecAgg+); off, only their mean outlives the aggregation."""
        self.server = server
        self.keep_updates = keep_updates and secagg is None
        self.first_round = first_round
        self.secagg = secagg
        self.clients_per_round = clients_per_round
        self.on_round_end = on_round_end
        self._keys = shared_keys(server.network)
        #: The driver's reason to stop (its round hook's answer); once set, no further round is configured.
        self.stop_reason: str | None = None
        self._rng = np.random.default_rng(seed)
        self.partition_of = partition_of
        self.reply_rules = reply_rules
        state = server.network.state_dict()  # references, not copies: only the shapes are read
        self._shapes = [tuple(state[k].shape) for k in self._keys]
        self._rejected: list[Rejection] = []
        self._round_started = 0.0
        self._sampled_ids: tuple[int, ...] = ()
        self.scales = initial_scales(self._keys)
        self._pending: list[tuple[ClientProxy, FitRes]] = []
        self._closed_round = 0
        self._configured_round = 0
        self.halted_rounds = 0
        self.overflow_rounds = 0
        self.rejected_tensor_updates = 0
        self._secure_sum: SecureSum | None = None
        self._updates: dict[int, StateDict] | None = None

    def orchestra_round(self, server_round: int) -> int:
        """Flower counts from 1 in every run; a resumed run's first Flower round is Orchestra round ``first_round``."""
        return server_round - 1 + self.first_round

    def runtime_state(self) -> dict[str, Any]:
        """What a resumed run needs of the strategy: the sampling generator and SecAgg+'s scales and counts."""
        return {
            "sampling": self._rng.bit_generator.state,
            "scales": torch.from_numpy(self.scales.copy()),  # a tensor, so resume points load with weights_only
            "halted_rounds": self.halted_rounds,
            "overflow_rounds": self.overflow_rounds,
            "rejected_tensor_updates": self.rejected_tensor_updates,
        }

    def restore_runtime_state(self, state: dict[str, Any]) -> None:
        self._rng.bit_generator.state = state["sampling"]
        self.scales = state["scales"].numpy().copy()
        self.halted_rounds = int(state["halted_rounds"])
        self.rejected_tensor_updates = int(state["rejected_tensor_updates"])
        self.overflow_rounds = int(state.get("overflow_rounds", 0))  # resume points written before it was counted

    @property
    def next_round_trains(self) -> bool:
        """False while round 0 (initialisation, no model update) is still to come."""
        return self.server.initialised

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return ndarrays_to_parameters(state_to_arrays(self.server.global_state(), self._keys))

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        self._pending = []
        self._rejected = []
        self._secure_sum = None
        self._updates = None
        if self.stop_reason is not None:
            return []  # DefaultWorkflow skips the remaining rounds
        self._round_started = time.perf_counter()
        if self.partition_of is None:
            raise RuntimeError("the strategy samples partitions: give it partition_of (see privfed.federation.partitions)")
        node_of = {partition: node for node, partition in self.partition_of.items()}
        client_manager.num_available()  # Flower's DefaultWorkflow registers the grid's nodes on this call, else every 5 s
        if not client_manager.wait_for(len(node_of), timeout=NODE_WAIT_SECONDS):
            raise RuntimeError(
                f"round {self.orchestra_round(server_round)} samples from {len(node_of)} partitions but only "
                f"{client_manager.num_available()} SuperNodes are connected after {NODE_WAIT_SECONDS}s"
            )
        proxies = {proxy.node_id: proxy for proxy in client_manager.all().values()}
        chosen = sorted(int(p) for p in self._rng.choice(len(node_of), size=self.clients_per_round, replace=False))
        missing = [p for p in chosen if node_of[p] not in proxies]
        if missing:
            raise RuntimeError(f"round {self.orchestra_round(server_round)}: the nodes of partitions {missing} left")
        self._sampled_ids = tuple(chosen)
        self._configured_round = server_round
        ins = self.fit_instructions(server_round, parameters)
        return [(proxies[node_of[p]], ins) for p in chosen]

    def fit_instructions(self, server_round: int, parameters: Parameters) -> FitIns:
        """What every sampled client receives: only what varies by round (:mod:`privfed.federation.messages`)."""
        config: dict[str, Scalar] = {
            "task": "train" if self.server.initialised else "init",
            "round": self.orchestra_round(server_round),
        }
        if self.server.centroids is not None:
            config["centroids"] = tensor_to_bytes(self.server.centroids)
        if self.server.initialised and self.secagg is not None:
            config["secagg_scales"] = ndarray_to_bytes(self.scales)
            config.update(self.secagg.encoding_config())
        return FitIns(parameters, config)

    def aggregate_fit(
        self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        accepted, rejected = self._screen(server_round, results, secure=self.secagg is not None and self.next_round_trains)
        self._rejected.extend(rejected)
        if not accepted:
            # Nothing to apply: the round is logged and charged (the rejected replies reached the server), the
            # model stays as it was, and the driver stops the run with a summary that says why.
            reason = self._unusable_reason(server_round, len(failures))
            logger.warning("%s", reason)
            self._close_round(server_round, [], None, {}, unusable=reason)
            return ndarrays_to_parameters(state_to_arrays(self.server.global_state(), self._keys)), {}
        trains, dropped = self.next_round_trains, None
        try:
            mean_delta, aggregation_stats = self._mean_delta(server_round, accepted)
        except ImplausibleAggregate as err:
            # The model stays as it was; the releases that arrived are recorded and charged as in a halted round.
            logger.warning("round %d: %s; the model is unchanged", self.orchestra_round(server_round), err)
            self.halted_rounds += 1
            mean_delta, aggregation_stats = None, {"secagg_halted": 1.0, "secagg_implausible": 1.0}
            dropped = f"the secure sum is implausible: {err}"
        if trains and mean_delta is None and dropped is None:
            dropped = f"{int(aggregation_stats['secagg_rejected_tensors'])} aggregated tensors overflowed SecAgg+'s clipping range"
        self._close_round(server_round, accepted, mean_delta, aggregation_stats, dropped=dropped)
        return ndarrays_to_parameters(state_to_arrays(self.server.global_state(), self._keys)), {}

    def check_masked_reply(self, node_id: int, res: FitRes | None, masked: list[np.ndarray] | None) -> str | None:
        """Why a SecAgg+ reply must not join the secure sum (None: it may); ``res``, ``masked``: None if unreadable.

        A rejection halts the round (:mod:`privfed.secagg.workflow`): leaving the vector out would have the
        protocol reveal its sender's pairwise key. Its form, plaintext release and metrics are checked.
        """
        if self.secagg is None:
            raise RuntimeError("masked replies arrive only under SecAgg+")
        client = (self.partition_of or {}).get(int(node_id))
        if client is None or client not in self._sampled_ids:
            reason, client = f"node {node_id} was not asked for a reply this round", None
        elif res is None:
            reason = "the reply is not a readable fit result"
        elif masked is None:
            reason = "the reply carries no readable masked vector"
        else:
            try:
                round_index = self.orchestra_round(self._configured_round)
                check_reply(res, client=client, rules=self._rules, train=True, delta_shapes=None, round_index=round_index)
                check_masked_vector(masked, self.masked_vector_shapes(), modulus=self.secagg.modulus_range)
                return None
            except RejectedReply as err:
                reason = str(err)
        self._rejected.append(Rejection(client, reason))
        return reason

    def masked_vector_shapes(self) -> list[tuple[int, ...]]:
        """A SecAgg+ masked vector's arrays: Flower's weight factor, the encoded update's (and metrics'), the share."""
        shapes = [(1,), *secure_sum_shapes(self._shapes, metrics=self._rules.client_metrics)]
        aggregator = self.server.aggregator
        if aggregator is not None and self.carries_share:
            assert self.server.centroids is not None  # drawn in round 0
            cells, dim = self.server.centroids.shape
            shapes.append((aggregator.share_length(num_cells=cells, dim=dim),))
        return shapes

    @property
    def carries_share(self) -> bool:
        """Whether each masked vector ends with a secure-sum mechanism's share (not in a round the cadence skips)."""
        return self.server.aggregator is not None and self.round_releases

    @property
    def round_releases(self) -> bool:
        """Whether the round configured last has clients release (or share) anything of their representations."""
        return self._rules.releases_in(self.orchestra_round(self._configured_round), train=self.next_round_trains)

    def note_secure_sum(self, total: np.ndarray, *, num_summed: int, nodes: Collection[int] = ()) -> None:
        """The unmasked sum of the round's shares (the workflow splits it off the update's sum), from ``nodes``."""
        partition_of = self.partition_of or {}
        clients = tuple(sorted(partition_of[int(n)] for n in nodes if int(n) in partition_of))
        self._secure_sum = SecureSum(total, num_summed, clients)

    def note_replies(self, results: list[tuple[ClientProxy, FitRes]]) -> None:
        """Replies that reached the server during secure aggregation (their releases are disclosed)."""
        self._pending = list(results)

    def close_round_without_aggregate(self, server_round: int) -> None:
        """Accounts for a round whose secure aggregation halted (too few clients left, a rejected or a broken reply).

        The releases that reached the server are recorded and clustered; the model stays. A round that halted
        before any reply is logged too, so every sampled round appears once in the run's log.
        """
        if self._closed_round == server_round or self._configured_round != server_round:
            return  # aggregated already, or no client was asked (the run is stopping)
        self.halted_rounds += 1
        logger.warning("round %d: secure aggregation halted; the model is unchanged", self.orchestra_round(server_round))
        accepted, rejected = self._screen(server_round, self._pending, secure=True)
        self._rejected.extend(rejected)
        dropped = "secure aggregation halted" if self.next_round_trains else None
        self._close_round(server_round, accepted, None, {"secagg_halted": 1.0}, dropped=dropped)

    def secure_aggregation_summary(self) -> dict[str, Any]:
        """Whether the server saw only sums of encoder updates, and the protocol's parameters (for ``summary.json``)."""
        if self.secagg is None:
            return {"enabled": False, "protocol": None}
        return {
            "enabled": True,
            "protocol": PROTOCOL_VERSION,
            "mask_prg": MASK_PRG,
            **self.secagg.to_dict(),
            "halted_rounds": self.halted_rounds,
            "overflow_rounds": self.overflow_rounds,
            "rejected_tensor_updates": self.rejected_tensor_updates,
            "final_max_scale": float(self.scales.max()),
        }

    @property
    def _rules(self) -> ReplyRules:
        if self.reply_rules is None:
            raise RuntimeError("the strategy checks every reply: give it reply_rules (see privfed.federation.reply_checks)")
        return self.reply_rules

    def _screen(
        self, server_round: int, results: list[tuple[ClientProxy, FitRes]], *, secure: bool
    ) -> tuple[list[Accepted], list[Rejection]]:
        """The round's replies checked against the plan (:mod:`privfed.federation.reply_checks`)."""
        accepted, rejected = screen_replies(
            results, client_of_node=self.partition_of or {}, sampled=self._sampled_ids, rules=self._rules,
            train=self.next_round_trains, delta_shapes=None if secure else self._shapes,
            round_index=self.orchestra_round(server_round),
        )
        for rejection in rejected:
            logger.warning("client %s's reply was rejected: %s", rejection.client, rejection.reason)
        return accepted, rejected

    def _unusable_reason(self, server_round: int, failed: int) -> str:
        """Why a round had no usable reply: how many replies failed or were rejected, and the first reasons."""
        rejected = self._rejected
        reasons = "; ".join(f"client {r.client}: {r.reason}" for r in rejected[:3])
        more = f"; and {len(rejected) - 3} more" if len(rejected) > 3 else ""
        return (
            f"round {self.orchestra_round(server_round)}: no usable reply ({failed} failed, {len(rejected)} rejected"
            f"{': ' + reasons + more if rejected else ''}); the model is unchanged and the run stops"
        )

    def _mean_delta(self, server_round: int, results: list[Accepted]) -> tuple[StateDict | None, dict[str, float]]:
        """The round's mean model delta (None in round 0) and statistics about forming it."""
        if not self.next_round_trains:
            return None, {}
        if self.secagg is None:
            # The checked arrays were read from the replies for this check alone; FedAvg only reads them.
            deltas = [arrays_to_state(checked.delta or [], self._keys, copy=False) for _, _, checked in results]
            if self.keep_updates:  # the very tensors FedAvg reads, for this round's hook only
                self._updates = {
                    checked.client: {k: v.to(torch.float32) for k, v in delta.items()}
                    for (_, _, checked), delta in zip(results, deltas)
                }
            return weighted_mean(deltas, [float(checked.num_examples) for _, _, checked in results]), {}
        first = parameters_to_ndarrays(results[0][1].parameters)
        # SecAgg+ gave every reply the same aggregate; no single client's update exists here.
        weight_ratios = [
            secagg_weight_ratio(
                res.num_examples, max_weight=self.secagg.max_weight, quantization_range=self.secagg.quantization_range
            )
            for _, res, _ in results
        ]
        # With --report-client-metrics the last array is the clients' training metrics (encode_metrics).
        metrics = self._rules.client_metrics
        decoded = decode_aggregate(
            first[:-1] if metrics else first, self.scales, weight_ratios=weight_ratios,
            clipping_range=self.secagg.clipping_range,
        )
        rejected = [k for k, bad in zip(self._keys, decoded.overflow) if bad]
        if rejected:
            # A clipped tensor's mean is wrong. Applying the others alone would leave, e.g., a BatchNorm layer's
            # statistics out of step with the weights that feed it, so the whole model stays as it was.
            logger.warning(
                "round %d: %d aggregated tensors overflowed SecAgg+'s clipping range (e.g. %s), so the round's model "
                "update was not applied; their scales grow for the next round",
                self.orchestra_round(server_round), len(rejected), rejected[0],
            )
            self.overflow_rounds += 1
        self.rejected_tensor_updates += len(rejected)
        self.scales = next_scales(self.scales, decoded, max_scale=max_useful_scale(self.secagg.quantization_range))
        stats = {
            "secagg_rejected_tensors": float(len(rejected)),
            "secagg_max_scale": float(self.scales.max()),
            **(decode_metrics(first[-1]) if metrics else {}),
        }
        return (None if rejected else arrays_to_state(decoded.mean, self._keys)), stats

    def _close_round(
        self, server_round: int, results: list[Accepted], mean_delta: StateDict | None,
        aggregation_stats: dict[str, float], *, unusable: str | None = None, dropped: str | None = None,
    ) -> None:
        checked = [c for _, _, c in results]
        releases = [(c.client, c.release) for c in checked if c.release is not None]
        trains = self.next_round_trains  # before the round is applied: False for an initialisation
        # With no usable reply the global state stays as it was; the round is still logged and charged.
        stats = (
            self.server.apply_round(
                mean_delta, [release for _, release in releases], self._secure_sum, released=self.round_releases
            ) if checked else {}
        )
        rejected, self._rejected = self._rejected, []
        updates, self._updates = self._updates, None
        stop_reason = self.on_round_end(
            RoundReport(
                round=self.orchestra_round(server_round),
                sampled_clients=self._sampled_ids,
                completed=len(results),
                # Flower's SecAgg+ can list one dropout twice; count what is missing instead.
                failures=len(self._sampled_ids) - len(results),
                seconds=time.perf_counter() - self._round_started,
                server_stats={**stats, **aggregation_stats},
                client_metrics=[c.metrics for c in checked],
                releases=releases,
                training_events=[(c.client, c.training_events) for c in checked],
                rejected=rejected,
                runtime_state=self.runtime_state(),
                unusable=unusable,
                update_dropped=dropped,
                train=trains,
                updates=updates,
                secure_sum=self._secure_sum if checked else None,
            )
        )
        if stop_reason is not None:
            self.stop_reason = stop_reason
        self._closed_round = server_round

    # Evaluation happens on the server, in the training driver's round hook.
    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        return []

    def aggregate_evaluate(
        self, server_round: int, results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        return None, {}

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        return None
