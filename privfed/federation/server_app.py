"""Flower ServerApp: runs Orchestra's rounds through ``DefaultWorkflow``, the shape Flower's SecAgg+ needs.

Two entry points: :func:`make_server_app` for ``privfed train``, and the
module-level ``app`` for ``flwr run .`` (configured in ``[tool.flwr.app.config]``).
The strategy is built here with the driver's round hook: the driver never sees Flower.
"""

from __future__ import annotations

from typing import Any

from flwr.common import Context
from flwr.server import Grid, LegacyContext, ServerApp, ServerConfig
from flwr.server.workflow import DefaultWorkflow

from privfed.config import config_from_run_config
from privfed.federation.partitions import discover_partitions
from privfed.federation.reply_checks import ReplyRules
from privfed.federation.strategy import NODE_WAIT_SECONDS, OrchestraStrategy
from privfed.run.driver import ProgressCallback, RunDriver
from privfed.run.interruption import StopRequest
from privfed.run.plan import RunPlan, plan_run
from privfed.run.resume import ResumePoint
from privfed.secagg.workflow import OrchestraFitWorkflow


def build_strategy(plan: RunPlan, driver: RunDriver, partition_of: dict[int, int]) -> OrchestraStrategy:
    """The strategy for a planned run, reporting every round to ``driver``; ``partition_of`` maps nodes to partitions."""
    config = plan.config
    return OrchestraStrategy(
        driver.start(),
        driver.on_round_end,
        clients_per_round=config.clients_per_round,
        seed=config.seed,
        partition_of=partition_of,
        reply_rules=ReplyRules.of(plan, driver.mechanism_class),
        secagg=plan.secagg,
        first_round=0 if driver.resume is None else driver.resume.round + 1,
        keep_updates=config.record_releases,
    )


def run_orchestra(
    grid: Grid,
    context: Context,
    plan: RunPlan,
    progress: ProgressCallback | None = None,
    stop: StopRequest | None = None,
    resume: ResumePoint | None = None,
) -> dict[str, Any]:
    """Initial evaluation, ``rounds + 1`` Flower rounds (round 0 initialises; after ``resume``, only the rounds after
    it), summary; ``stop`` ends it early."""
    driver = RunDriver(plan, progress, stop=stop, resume=resume)
    partition_of = discover_partitions(grid, plan.config.num_clients, timeout=NODE_WAIT_SECONDS)
    strategy = build_strategy(plan, driver, partition_of)
    if resume is not None:
        strategy.restore_runtime_state(resume.runtime)
    legacy = LegacyContext(
        context=context,
        config=ServerConfig(num_rounds=plan.config.rounds - strategy.first_round + 1),
        strategy=strategy,
    )
    secagg = plan.secagg
    fit_workflow = None if secagg is None else OrchestraFitWorkflow(secagg, strategy, plan.config.clients_per_round)
    DefaultWorkflow(fit_workflow=fit_workflow)(grid, legacy)
    return driver.finish(secure_aggregation=strategy.secure_aggregation_summary())


def make_server_app(
    plan: RunPlan,
    progress: ProgressCallback | None = None,
    outcome: dict[str, Any] | None = None,
    *,
    stop: StopRequest | None = None,
    resume: ResumePoint | None = None,
) -> ServerApp:
    """A ServerApp bound to one planned run (continued from ``resume``); ``outcome`` receives the summary or the error."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            summary = run_orchestra(grid, context, plan, progress, stop, resume)
        except BaseException as err:  # surfaced to the caller, who owns the process
            if outcome is None:
                raise
            outcome["error"] = err
            return
        if outcome is not None:
            outcome["summary"] = summary

    return app


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    run_orchestra(grid, context, plan_run(config_from_run_config(dict(context.run_config))))
