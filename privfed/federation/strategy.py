"""Orchestra as a legacy Flower ``Strategy``.

A legacy strategy because Flower's secure aggregation (SecAgg+) runs inside
``DefaultWorkflow`` and only talks to this interface. The strategy is a thin
adapter: sampling and message packing here, the update rule in
:class:`privfed.orchestra.server.OrchestraServer`.

Flower round 1 is Orchestra's round 0 (initialisation: no training, clients
only release centroids); Flower round ``r`` is Orchestra round ``r - 1``.

Under secure aggregation every reply's parameters are the same securely
aggregated mean (Flower's SecAgg+ overwrites them), and the strategy reads
only that one; without it the strategy forms FedAvg itself.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable

import numpy as np
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

from mechanisms.base import Release
from privfed.federation.client_config import ClientConfig
from privfed.federation.messages import (
    arrays_to_state,
    decode_release,
    has_release,
    scalar_metrics,
    state_to_arrays,
    tensor_to_bytes,
)
from privfed.federation.update_encoding import (
    decode_aggregate,
    decode_metrics,
    initial_scales,
    next_scales,
    secagg_weight_ratio,
)
from privfed.orchestra.model_state import StateDict, shared_keys, weighted_mean
from privfed.orchestra.round_report import RoundReport
from privfed.orchestra.server import OrchestraServer
from privfed.privacy.dp_sgd_plan import DpSgdSettings
from privfed.privacy.ledger import events_from_json
from privfed.secagg_settings import SecAggPlusSettings

logger = logging.getLogger(__name__)


NODE_WAIT_SECONDS = 300

#: The driver's round hook: returns a reason to stop training, or None to go on.
RoundHook = Callable[[RoundReport], str | None]


def by_client_id(results: list[tuple[ClientProxy, FitRes]]) -> list[tuple[ClientProxy, FitRes]]:
    """Replies in client order, whatever order they arrived in, so a seeded run folds them in the same way."""
    return sorted(results, key=lambda result: int(result[1].metrics["client_id"]))


class OrchestraStrategy(Strategy):
    """Samples clients, ships the global state and folds their replies back in."""

    def __init__(
        self,
        server: OrchestraServer,
        client_config: ClientConfig,
        on_round_end: RoundHook,
        *,
        clients_per_round: int,
        seed: int,
        partition_of: dict[int, int] | None = None,
        mechanism_params: dict[str, Any] | None = None,
        secagg: SecAggPlusSettings | None = None,
        dp_sgd: DpSgdSettings | None = None,
    ) -> None:
        self.server = server
        self.secagg = secagg
        self.client_config = client_config
        self.clients_per_round = clients_per_round
        self.seed = seed
        self.on_round_end = on_round_end
        self._keys = shared_keys(server.network)
        self._client_config = client_config.to_json()
        self._mechanism_params = json.dumps(mechanism_params or {})
        self._dp_sgd = None if dp_sgd is None else dp_sgd.to_json()
        self.stop_reason: str | None = None
        self._rng = np.random.default_rng(seed)
        self.partition_of = partition_of
        self._round_started = 0.0
        self._sampled_ids: tuple[int, ...] = ()
        self.scales = initial_scales(self._keys)
        self._pending: list[tuple[ClientProxy, FitRes]] = []
        self._closed_round = 0
        self.halted_rounds = 0
        self.rejected_tensor_updates = 0

    def __repr__(self) -> str:
        return f"OrchestraStrategy(mechanism={self.client_config.mechanism!r})"

    @staticmethod
    def orchestra_round(server_round: int) -> int:
        return server_round - 1

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
        if self.stop_reason is not None:
            return []  # DefaultWorkflow skips the remaining rounds
        self._round_started = time.perf_counter()
        if self.partition_of is None:
            raise RuntimeError("the strategy samples partitions: give it partition_of (see privfed.federation.partitions)")
        node_of = {partition: node for node, partition in self.partition_of.items()}
        if not client_manager.wait_for(len(node_of), timeout=NODE_WAIT_SECONDS):
            raise RuntimeError(
                f"round {self.orchestra_round(server_round)} samples from {len(node_of)} partitions but only "
                f"{client_manager.num_available()} SuperNodes are connected after {NODE_WAIT_SECONDS}s"
            )
        proxies = {proxy.node_id: proxy for proxy in client_manager.all().values()}  # type: ignore[attr-defined]
        chosen = sorted(int(p) for p in self._rng.choice(len(node_of), size=self.clients_per_round, replace=False))
        missing = [p for p in chosen if node_of[p] not in proxies]
        if missing:
            raise RuntimeError(f"round {self.orchestra_round(server_round)}: the nodes of partitions {missing} left")
        self._sampled_ids = tuple(chosen)
        ins = self.fit_instructions(server_round, parameters)
        return [(proxies[node_of[p]], ins) for p in chosen]

    def fit_instructions(self, server_round: int, parameters: Parameters) -> FitIns:
        """The message every sampled client receives (see :mod:`privfed.federation.messages`)."""
        config: dict[str, Scalar] = {
            "task": "train" if self.server.initialised else "init",
            "round": self.orchestra_round(server_round),
            "seed": self.seed,
            "client_config": self._client_config,
            "mechanism_params": self._mechanism_params,
        }
        if self._dp_sgd is not None:
            config["dp_sgd"] = self._dp_sgd
        if self.server.centroids is not None:
            config["centroids"] = tensor_to_bytes(self.server.centroids)
        if self.server.initialised and self.secagg is not None:
            config["secagg_scales"] = ndarray_to_bytes(self.scales)
            config.update(self.secagg.encoding_config())
        return FitIns(parameters, config)

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        if not results:
            raise RuntimeError(f"round {self.orchestra_round(server_round)}: every sampled client failed: {failures}")
        results = by_client_id(results)
        mean_delta, aggregation_stats = self._mean_delta(server_round, results)
        self._close_round(server_round, results, mean_delta, aggregation_stats)
        return ndarrays_to_parameters(state_to_arrays(self.server.global_state(), self._keys)), {}

    def note_replies(self, results: list[tuple[ClientProxy, FitRes]]) -> None:
        """Replies that reached the server during secure aggregation (their releases are disclosed)."""
        self._pending = by_client_id(results)

    def close_round_without_aggregate(self, server_round: int) -> None:
        """Accounts for a round whose secure aggregation halted after clients replied.

        Their releases reached the server, so they are recorded and clustered;
        the model stays as it was, since no aggregate exists.
        """
        if self._closed_round == server_round or not self._pending:
            return
        self.halted_rounds += 1
        logger.warning("round %d: secure aggregation halted; the model is unchanged", self.orchestra_round(server_round))
        self._close_round(server_round, self._pending, None, {"secagg_halted": 1.0})

    def stop(self, reason: str) -> None:
        """Ends training cleanly: no further round is configured."""
        self.stop_reason = reason

    def secure_aggregation_summary(self) -> dict[str, Any]:
        """Whether the server saw only sums of encoder updates, and the protocol's parameters (for ``summary.json``)."""
        if self.secagg is None:
            return {"enabled": False, "protocol": None}
        return {
            "enabled": True,
            "protocol": "SecAgg+ (Flower)",
            **self.secagg.to_dict(),
            "halted_rounds": self.halted_rounds,
            "rejected_tensor_updates": self.rejected_tensor_updates,
            "final_max_scale": float(self.scales.max()),
        }

    def _mean_delta(
        self, server_round: int, results: list[tuple[ClientProxy, FitRes]]
    ) -> tuple[StateDict | None, dict[str, float]]:
        """The round's mean model delta (None in round 0) and statistics about forming it."""
        first = parameters_to_ndarrays(results[0][1].parameters)
        if not first:
            return None, {}
        if self.secagg is None:
            deltas = [arrays_to_state(parameters_to_ndarrays(res.parameters), self._keys) for _, res in results]
            return weighted_mean(deltas, [float(res.num_examples) for _, res in results]), {}
        # SecAgg+ gave every reply the same aggregate; no single client's update exists here.
        weight_ratios = [
            secagg_weight_ratio(
                res.num_examples, max_weight=self.secagg.max_weight, quantization_range=self.secagg.quantization_range
            )
            for _, res in results
        ]
        # The last array is the clients' training metrics (encode_metrics), summed like the update.
        decoded = decode_aggregate(first[:-1], self.scales, weight_ratios=weight_ratios)
        rejected = [k for k, bad in zip(self._keys, decoded.overflow) if bad]
        if rejected:
            logger.warning(
                "round %d: %d aggregated tensors overflowed SecAgg+'s clipping range and were not applied "
                "(e.g. %s); their scales grow for the next round",
                self.orchestra_round(server_round), len(rejected), rejected[0],
            )
        self.rejected_tensor_updates += len(rejected)
        self.scales = next_scales(self.scales, decoded)
        stats = {
            "secagg_rejected_tensors": float(len(rejected)),
            "secagg_max_scale": float(self.scales.max()),
            **decode_metrics(first[-1]),
        }
        return arrays_to_state(decoded.mean, self._keys), stats

    def _close_round(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        mean_delta: StateDict | None,
        aggregation_stats: dict[str, float],
    ) -> None:
        client_ids = [int(res.metrics["client_id"]) for _, res in results]
        releases = self._releases(client_ids, results)
        stats = self.server.apply_round(mean_delta, [release for _, release in releases])
        stop_reason = self.on_round_end(
            RoundReport(
                round=self.orchestra_round(server_round),
                sampled_clients=self._sampled_ids,
                completed=len(results),
                # Flower's SecAgg+ can list one dropout twice; count what is missing instead.
                failures=len(self._sampled_ids) - len(results),
                seconds=time.perf_counter() - self._round_started,
                server_stats={**stats, **aggregation_stats},
                client_metrics=[scalar_metrics(res.metrics) for _, res in results],
                releases=releases,
                training_events=[
                    (cid, events_from_json(str(res.metrics.get("dp_sgd_events", "[]"))))
                    for cid, (_, res) in zip(client_ids, results)
                ],
            )
        )
        if stop_reason is not None:
            self.stop(stop_reason)
        self._closed_round = server_round

    def _releases(self, client_ids: list[int], results: list[tuple[ClientProxy, FitRes]]) -> list[tuple[int, Release]]:
        """Every reply's release, by client; none for a method that releases nothing (a reply that has one is refused)."""
        if self.server.method.releases:
            return [(cid, decode_release(res.metrics)) for cid, (_, res) in zip(client_ids, results)]
        unexpected = [cid for cid, (_, res) in zip(client_ids, results) if has_release(res.metrics)]
        if unexpected:
            raise RuntimeError(f"clients {unexpected} sent releases, but method {self.server.method.name} makes none")
        return []

    # Evaluation happens on the server, in the training driver's round hook.
    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        return []

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        return None, {}

    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        return None
