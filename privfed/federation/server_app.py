"""Flower ServerApp: runs Orchestra's rounds through ``DefaultWorkflow``.

``DefaultWorkflow`` with a legacy strategy is the shape Flower's SecAgg+
needs: with ``secagg`` on (the default) its ``fit_workflow`` runs SecAgg+ in
every training round (:mod:`privfed.federation.secure_aggregation`).

Two entry points: :func:`make_server_app` for ``privfed train`` (the
configuration comes from the CLI), and the module-level ``app`` for
``flwr run .`` (the configuration comes from ``[tool.flwr.app.config]``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flwr.common import Context
from flwr.server import Grid, LegacyContext, ServerApp, ServerConfig
from flwr.server.workflow import DefaultWorkflow

from privfed.config import TrainConfig, build_config
from privfed.federation.secure_aggregation import OrchestraFitWorkflow
from privfed.runs import RunDirectory, default_run_dir
from privfed.training import ProgressCallback, TrainingRun


def run_orchestra(grid: Grid, context: Context, config: TrainConfig, progress: ProgressCallback | None = None) -> dict[str, Any]:
    """Initial evaluation, ``rounds + 1`` Flower rounds (round 0 initialises), summary."""
    run = TrainingRun(config, RunDirectory(Path(config.out or default_run_dir(config))), progress)
    strategy = run.start()
    legacy = LegacyContext(
        context=context,
        config=ServerConfig(num_rounds=config.rounds + 1),
        strategy=strategy,
    )
    fit_workflow = None if run.secagg is None else OrchestraFitWorkflow(run.secagg, strategy, config.clients_per_round)
    DefaultWorkflow(fit_workflow=fit_workflow)(grid, legacy)
    return run.finish()


def make_server_app(config: TrainConfig, progress: ProgressCallback | None = None, outcome: dict[str, Any] | None = None) -> ServerApp:
    """A ServerApp bound to one configuration; ``outcome`` receives the summary or the error."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            summary = run_orchestra(grid, context, config, progress)
        except BaseException as err:  # surfaced to the caller, who owns the process
            if outcome is None:
                raise
            outcome["error"] = err
            return
        if outcome is not None:
            outcome["summary"] = summary

    return app


def config_from_run_config(run_config: dict[str, Any]) -> TrainConfig:
    """``[tool.flwr.app.config]`` keys use dashes; empty strings mean "not set"."""
    values = {k.replace("-", "_"): (None if v == "" else v) for k, v in run_config.items()}
    return build_config(**values)


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    run_orchestra(grid, context, config_from_run_config(dict(context.run_config)))
