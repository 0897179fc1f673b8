"""The resume point at a round's end: its last write (docs/flower.md, "Resuming a run").

After the round's charges and metrics line, so a point never stands ahead of the ledger and ``metrics.jsonl``; a
kill between them replays the round.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from privfed.config import TrainConfig
from privfed.orchestra.server import OrchestraServer
from privfed.run.directory import RunDirectory
from privfed.run.observers.base import FinishedRound, RoundObserver
from privfed.run.resume import ResumePoint, write_resume_point


class SaveResumePoint(RoundObserver):
    """Writes ``checkpoints/resume.pt`` when ``--checkpoint-every`` says so, when the run stops, and at the last round."""

    def __init__(
        self,
        run_dir: RunDirectory,
        server: OrchestraServer,
        config: TrainConfig,
        *,
        stopping: Callable[[], bool],
        figures: Callable[[], dict[str, Any]],
        mechanism_params: dict[str, Any],
    ) -> None:
        """``stopping`` says whether the run stops after this round; ``figures`` are the driver's running figures;
        ``mechanism_params`` the plan's, kept in the point."""
        self.mechanism_params = mechanism_params
        self.run_dir = run_dir
        self.server = server
        self.config = config
        self.stopping = stopping
        self.figures = figures

    def due(self, round_index: int) -> bool:
        every = self.config.checkpoint_every
        return (every > 0 and round_index % every == 0) or self.stopping() or round_index >= self.config.rounds

    def after_metrics(self, finished: FinishedRound) -> None:
        report = finished.report
        if not self.due(report.round):
            return
        server = self.server
        write_resume_point(
            self.run_dir,
            ResumePoint(
                round=report.round,
                network={k: v.detach().cpu().clone() for k, v in server.network.state_dict().items()},
                centroids=server.centroids,
                initialised=server.initialised,
                server_generator=server.generator_state(),
                runtime=report.runtime_state,
                driver=self.figures(),
                mechanism_params=self.mechanism_params,
            ),
        )
