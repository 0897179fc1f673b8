"""``--record-releases``: keeps each round as the server saw it, the state it sent and the releases it got, the
clients' updates where it saw them in the clear (``--no-secagg``), and a secure-sum mechanism's decoded sum.

The file format is :mod:`privfed.run.recording`'s; ``privfed attack`` reads it.
"""

from __future__ import annotations

from typing import Any

import torch

from mechanisms.base import Mechanism
from privfed.orchestra.server import OrchestraServer, SecureSum
from privfed.run.directory import RunDirectory
from privfed.run.observers.base import FinishedRound, RoundObserver
from privfed.run.recording import RecordedRound, RecordedSecureSum, write_round


class RecordReleases(RoundObserver):
    """Writes ``RUN_DIR/releases/round-XXXX.pt`` for every round (nothing for a method that releases nothing).

    Round r's clients started from the server's state after round r-1, kept here until the next round ends: build
    this observer once the server holds the state of the first round to come.
    """

    def __init__(
        self, run_dir: RunDirectory, server: OrchestraServer, mechanism: type[Mechanism] | None, params: dict[str, Any]
    ) -> None:
        self.run_dir = run_dir
        self.server = server
        self.mechanism = mechanism
        self.params = params
        self._sent = server.global_state(), server.centroids

    def after_round(self, finished: FinishedRound) -> None:
        state, centroids = self._sent
        report = finished.report
        if self.mechanism is not None:
            recorded = RecordedRound.of(
                report.round,
                model_state=state,
                centroids=centroids,
                mechanism=self.mechanism.name,
                mechanism_params=self.params,
                releases=report.releases,
                updates=report.updates,
                secure_sum=self._decoded(report.secure_sum, centroids),
            )
            write_round(self.run_dir.releases, recorded)
        self._sent = self.server.global_state(), self.server.centroids

    def _decoded(self, secure_sum: SecureSum | None, centroids: torch.Tensor | None) -> RecordedSecureSum | None:
        """The sum as the server's mechanism decodes it for :meth:`~mechanisms.base.SecureSumMechanism.combine`, over
        the cells the round's clients were sent (None: no sum, or a mechanism that does not say what it decodes)."""
        aggregator = self.server.aggregator
        if secure_sum is None or aggregator is None or centroids is None:
            return None
        decoded = aggregator.decode(secure_sum.total, num_cells=centroids.shape[0], dim=centroids.shape[1])
        if decoded is None:
            return None
        vectors, weights = decoded
        return RecordedSecureSum(vectors.detach().cpu(), weights.detach().cpu(), secure_sum.clients)
