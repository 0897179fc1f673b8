"""Orchestra as a legacy Flower ``Strategy``.

A legacy strategy because Flower's secure aggregation (SecAgg+) runs inside
``DefaultWorkflow`` and only talks to this interface. The strategy is a thin
adapter: sampling and message packing here, the update rule in
:class:`privfed.orchestra.server.OrchestraServer`.

Flower round 1 is Orchestra's round 0 (initialisation: no training, clients
only release centroids); Flower round ``r`` is Orchestra round ``r - 1``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from mechanisms.base import Release
from privfed.config import TrainConfig
from privfed.federation.messages import (
    arrays_to_state,
    decode_release,
    scalar_metrics,
    state_to_arrays,
    tensor_to_bytes,
)
from privfed.orchestra.model_state import shared_keys
from privfed.orchestra.server import OrchestraServer, ReceivedUpdate


NODE_WAIT_SECONDS = 300


@dataclass(frozen=True)
class RoundReport:
    """What one finished round hands to the training driver."""

    round: int
    sampled: int
    completed: int
    failures: int
    seconds: float
    server_stats: dict[str, float]
    client_metrics: list[dict[str, float]] = field(default_factory=list)
    releases: list[tuple[int, Release]] = field(default_factory=list)


class OrchestraStrategy(Strategy):
    """Samples clients, ships the global state and folds their replies back in."""

    def __init__(
        self,
        server: OrchestraServer,
        config: TrainConfig,
        on_round_end: Callable[[RoundReport], None],
        *,
        mechanism_params: dict[str, Any] | None = None,
    ) -> None:
        self.server = server
        self.config = config
        self.on_round_end = on_round_end
        self._keys = shared_keys(server.network)
        self._run_config = json.dumps(config.to_dict())
        self._mechanism_params = json.dumps(mechanism_params or {})
        self.stop_reason: str | None = None
        self._rng = np.random.default_rng(config.seed)
        self._round_started = 0.0
        self._sampled = 0

    def __repr__(self) -> str:
        return f"OrchestraStrategy(mechanism={self.config.mechanism!r})"

    @staticmethod
    def orchestra_round(server_round: int) -> int:
        return server_round - 1

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return ndarrays_to_parameters(state_to_arrays(self.server.global_state(), self._keys))

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        if self.stop_reason is not None:
            return []  # DefaultWorkflow skips the remaining rounds
        self._round_started = time.perf_counter()
        wanted = self.config.clients_per_round
        if not client_manager.wait_for(wanted, timeout=NODE_WAIT_SECONDS):
            raise RuntimeError(
                f"round {self.orchestra_round(server_round)} needs {wanted} clients but only "
                f"{client_manager.num_available()} SuperNodes connected within {NODE_WAIT_SECONDS}s"
            )
        clients = client_manager.all()
        ids = sorted(clients)
        chosen = [ids[i] for i in sorted(self._rng.choice(len(ids), size=wanted, replace=False))]
        self._sampled = len(chosen)
        ins = self.fit_instructions(server_round, parameters)
        return [(clients[cid], ins) for cid in chosen]

    def fit_instructions(self, server_round: int, parameters: Parameters) -> FitIns:
        """The message every sampled client receives (see :mod:`privfed.federation.messages`)."""
        config: dict[str, Scalar] = {
            "task": "init" if self.server.centroids is None else "train",
            "round": self.orchestra_round(server_round),
            "seed": self.config.seed,
            "run_config": self._run_config,
            "mechanism_params": self._mechanism_params,
        }
        if self.server.centroids is not None:
            config["centroids"] = tensor_to_bytes(self.server.centroids)
        return FitIns(parameters, config)

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        if not results:
            raise RuntimeError(f"round {self.orchestra_round(server_round)}: every sampled client failed: {failures}")
        updates = [self._received(res) for _, res in results]
        stats = self.server.apply_round(updates)
        client_ids = [int(res.metrics["client_id"]) for _, res in results]
        report = RoundReport(
            round=self.orchestra_round(server_round),
            sampled=self._sampled,
            completed=len(results),
            failures=len(failures),
            seconds=time.perf_counter() - self._round_started,
            server_stats=stats,
            client_metrics=[scalar_metrics(res.metrics) for _, res in results],
            releases=[(cid, u.release) for cid, u in zip(client_ids, updates)],
        )
        self.on_round_end(report)
        new_state = state_to_arrays(self.server.global_state(), self._keys)
        return ndarrays_to_parameters(new_state), {}

    def stop(self, reason: str) -> None:
        """Ends training cleanly: no further round is configured."""
        self.stop_reason = reason

    def _received(self, res: FitRes) -> ReceivedUpdate:
        arrays = parameters_to_ndarrays(res.parameters)
        delta = arrays_to_state(arrays, self._keys) if arrays else None
        return ReceivedUpdate(delta=delta, release=decode_release(res.metrics), num_samples=res.num_examples)

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
