"""``privfed train``'s runtimes: :func:`simulate` picks one; Flower's Ray simulation engine is here.

The ``local`` runtime (:mod:`privfed.federation.local_runtime`) runs the
same apps in this process and holds what both share; ``ray`` runs each
client in a Ray worker. Ray is an optional extra (``pip install 'privfed[ray]'``),
imported only when a run asks for it.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from privfed.errors import PrivfedError
from privfed.federation.client_app import Mod
from privfed.federation.local_runtime import (
    SimulatedRun,
    flower_logging,
    run_locally,
    summary_of,
)
from privfed.run.driver import ProgressCallback
from privfed.run.interruption import STOP_SIGNALS, run_stop_request
from privfed.run.plan import RunPlan
from privfed.run.resume import ResumePoint

#: How the temporary folder Ray runs in for one simulation is named (in the system's temporary directory).
RAY_FOLDER_PREFIX = "privfed-ray-"
#: Environment variables a Ray run sets where the user has not: each log line as it comes, and no
#: CUDA_VISIBLE_DEVICES="" for a client that asks for no GPU.
RAY_ENVIRONMENT = {"RAY_DEDUP_LOGS": "0", "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}


def simulate(
    plan: RunPlan,
    progress: ProgressCallback | None = None,
    *,
    verbose: bool = False,
    outer_mods: Sequence[Mod] = (),
    inner_mods: Sequence[Mod] = (),
    resume: ResumePoint | None = None,
) -> dict[str, Any]:
    """Runs a planned training on the runtime its configuration names (``runtime``); returns the summary.

    The arguments are :class:`~privfed.federation.local_runtime.SimulatedRun`'s.
    Either runtime leaves process-wide state (log levels, warning filters,
    signal handlers) as it found it, so a library call may run it.
    """
    if plan.config.dp_sgd:  # the clients train here: refuse before round 0, not once per client
        from privfed.extras import require

        require("opacus", feature="DP-SGD (--dp-sgd)")

    runner = simulate_on_ray if plan.config.runtime == "ray" else run_locally
    run = SimulatedRun(
        plan, progress, verbose=verbose, outer_mods=tuple(outer_mods), inner_mods=tuple(inner_mods), resume=resume
    )
    return runner(run)


def require_ray() -> None:
    """Refuses the Ray runtime, with the command that installs it, where Ray or Flower's simulation is missing."""
    try:
        with warnings.catch_warnings():
            import flwr.simulation  # noqa: F401
            import ray  # noqa: F401
    except ImportError as err:
        raise PrivfedError(
            f"--runtime ray needs Ray ({err}): pip install 'privfed[ray]', or use --runtime local"
        ) from None


def simulate_on_ray(run: SimulatedRun) -> dict[str, Any]:
    """Runs a planned training with ``num_clients`` virtual SuperNodes; returns the summary.

    Where the CLI asked for it (:func:`privfed.run.interruption.signals_stop_runs`),
    the first Ctrl-C (SIGINT or SIGTERM) stops the run after the current
    round, with its summary and final checkpoint; a second one stops it at
    once, Ray's processes with it. Each virtual node holds the server to the
    declared run and keeps its own privacy ledger in the run directory.

    Raises:
        PrivfedError: where Ray is not installed. Else whatever the ServerApp raised.
    """
    require_ray()
    config, verbose = run.plan.config, run.verbose
    outcome: dict[str, Any] = {}
    resources: dict[str, Any] = {"num_cpus": config.client_cpus, "num_gpus": config.client_gpus}
    init_args: dict[str, Any] = {"logging_level": "WARNING", "log_to_driver": verbose}
    with flower_logging(verbose), ray_settings(), signal_handlers_kept():
        # Imported here: importing it adds a warning filter, which the block takes back.
        from flwr.simulation import run_simulation

        # Ray first: its driver installs a SIGTERM handler that aborts the process, which ours then replace.
        with ray_session(init_args) as ray_dir, run_stop_request(on_exit_now=lambda: end_ray_now(ray_dir)) as stop:
            run_simulation(
                server_app=run.server_app(outcome, stop),
                client_app=run.client_app(),
                num_supernodes=config.num_clients,
                backend_config={"client_resources": resources, "init_args": init_args},
                verbose_logging=verbose,
            )
    return summary_of(outcome)


@contextmanager
def ray_settings() -> Iterator[None]:
    """The environment Ray's processes start with for a run (:data:`RAY_ENVIRONMENT`); as it was after."""
    saved = {name: os.environ.get(name) for name in RAY_ENVIRONMENT}
    for name, value in RAY_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    try:
        yield
    finally:
        for name, previous in saved.items():
            if previous is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = previous


@contextmanager
def signal_handlers_kept() -> Iterator[None]:
    """SIGINT's and SIGTERM's handlers as they were before the block (``ray.init`` replaces SIGTERM's for good)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # no thread but the main one can set a handler, Ray's included
        return
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:  # None: installed from outside Python, which Python cannot put back
                signal.signal(sig, handler)


@contextmanager
def ray_session(init_args: dict[str, Any]) -> Iterator[str]:
    """Starts Ray for a simulation in a temporary directory of its own; shuts it down and removes the directory after.

    Flower then uses this Ray instead of starting its own, which would leave
    a ``/tmp/ray/session_*`` folder behind. The name is short: the paths of
    Ray's Unix sockets inside it are limited to 107 bytes, so it cannot be the
    run directory. Folders a ``kill -9`` left behind are removed first.
    """
    import ray

    remove_abandoned_ray_folders(Path(tempfile.gettempdir()))
    temp_dir = tempfile.mkdtemp(prefix=RAY_FOLDER_PREFIX)
    # Ray's workers import the ClientApp's modules from this process's import path.
    path = os.pathsep.join([*sys.path, *filter(None, [os.environ.get("PYTHONPATH")])])
    try:
        ray.init(
            include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": path}}, _temp_dir=temp_dir, **init_args
        )
        yield temp_dir
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def remove_abandoned_ray_folders(parent: Path) -> list[Path]:
    """Removes the ``privfed-ray-*`` folders in ``parent`` whose Ray session's driver process is gone; returns them.

    Ray names a session folder ``session_<date>_<time>_<pid>``. A folder
    without a session yet (a run starting), or whose driver id is alive, is left alone.
    """
    removed = []
    for folder in parent.glob(f"{RAY_FOLDER_PREFIX}*"):
        sessions = [s for s in folder.glob("session_*") if not s.is_symlink()]
        pids = [s.name.rsplit("_", 1)[-1] for s in sessions]
        if not sessions or not all(pid.isdigit() and not _process_exists(int(pid)) for pid in pids):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def end_ray_now(temp_dir: str) -> None:
    """Before an immediate exit: SIGKILLs every process below this one (Ray's workers would outlive it a while) and
    removes Ray's directory."""
    for pid in descendants(os.getpid()):
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(temp_dir, ignore_errors=True)


def descendants(root: int) -> list[int]:
    """The ids of every living process below ``root``, read from ``/proc`` (empty where there is none)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as stat:
                # The command name (field 2) is in parentheses and may hold spaces; the parent id follows it.
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found: list[int] = []
    frontier = [root]
    while frontier:
        below = children.get(frontier.pop(), [])
        found.extend(below)
        frontier.extend(below)
    return found
