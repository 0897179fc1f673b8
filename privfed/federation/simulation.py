"""``privfed train``'s runtime: Flower's simulation engine on this machine."""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any, Sequence

from flwr.simulation import run_simulation

from privfed.federation.client_app import Mod, make_client_app
from privfed.federation.server_app import make_server_app
from privfed.interruption import stop_on_signals
from privfed.resume import ResumePoint
from privfed.run_driver import ProgressCallback
from privfed.run_plan import RunPlan


#: The run key of every simulated client's guard. Each simulated run keeps its clients' ledgers in its own
#: directory, so to them the run, resumed or not, is one run: a round answered before a kill is not answered
#: again after a resume. (Flower draws a new run id for every process, which made a resume a new run.)
SIMULATED_RUN_KEY = 0


def simulate(
    plan: RunPlan,
    progress: ProgressCallback | None = None,
    *,
    verbose: bool = False,
    outer_mods: Sequence[Mod] = (),
    inner_mods: Sequence[Mod] = (),
    resume: ResumePoint | None = None,
) -> dict[str, Any]:
    """Runs a planned training with ``num_clients`` virtual SuperNodes; returns the summary.

    The first Ctrl-C (SIGINT or SIGTERM) stops the run after the current
    round, with its summary and final checkpoint; a second one stops it at
    once (:mod:`privfed.interruption`). With ``resume`` it continues the
    planned run from that point (:mod:`privfed.resume`).

    Each virtual node holds the server to the planned run's configuration,
    as the user declared it, and keeps its own privacy ledger in the run
    directory (:mod:`privfed.privacy.client_guard`). ``outer_mods`` and
    ``inner_mods`` go into the ClientApp
    (:func:`privfed.federation.client_app.make_client_app`).

    Raises:
        Whatever the ServerApp raised, re-raised in this process.
    """
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    if not verbose:
        # Flower 1.41 marks run_simulation deprecated (in favour of `flwr run`, which
        # privfed also supports; docs/flower.md says why privfed train stays here).
        logging.getLogger("flwr").setLevel(logging.ERROR)
        warnings.filterwarnings("ignore", category=FutureWarning, module="ray")
    config = plan.config
    outcome: dict[str, Any] = {}
    resources: dict[str, Any] = {"num_cpus": config.client_cpus, "num_gpus": config.client_gpus}
    with stop_on_signals() as stop:
        run_simulation(
            server_app=make_server_app(plan, progress, outcome, stop=stop, resume=resume),
            client_app=make_client_app(
                declared=config, state_dir=plan.run_dir.client_ledgers, run_key=SIMULATED_RUN_KEY,
                outer_mods=outer_mods, inner_mods=inner_mods,
            ),
            num_supernodes=config.num_clients,
            backend_config={
                "client_resources": resources, "init_args": {"logging_level": "WARNING", "log_to_driver": verbose}
            },
            verbose_logging=verbose,
        )
    if "error" in outcome:
        raise outcome["error"]
    if "summary" not in outcome:
        raise RuntimeError("the simulation ended without a result (see the log above)")
    return outcome["summary"]
