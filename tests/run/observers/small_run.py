"""The real pieces an observer works with, for one small planned run: its plan, server ledger and server."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mechanisms import Guarantee, Release, get_mechanism_class
from privfed.config import TrainConfig
from privfed.methods import build_network, get_method
from privfed.orchestra.round_report import RoundReport
from privfed.orchestra.server import OrchestraServer
from privfed.privacy import PrivacyLedger
from privfed.run.observers.base import FinishedRound
from privfed.run.plan import RunPlan


def ledger_of(plan: RunPlan) -> PrivacyLedger:
    """The server's ledger for ``plan``, in its run folder (as the driver opens it)."""
    plan.run_dir.path.mkdir(parents=True, exist_ok=True)
    return PrivacyLedger(mechanism=plan.config.release_mechanism, delta=plan.privacy.delta,
                         path=plan.run_dir.path / "ledger.jsonl")


def server_of(config: TrainConfig) -> OrchestraServer:
    torch.manual_seed(config.seed)
    return OrchestraServer(build_network(config), num_global_centroids=config.num_global_centroids, seed=config.seed,
                           method=get_method(config.method))


def release(k: int | None = None, n: int = 4, dim: int = 16) -> Release:
    vectors = F.normalize(torch.randn(n, dim, generator=torch.Generator().manual_seed(n)), dim=1)
    return Release(vectors, torch.full((n,), 8.0), Guarantee(kind="k-anonymity", statement="", k=k))


def finished(report: RoundReport) -> FinishedRound:
    return FinishedRound(report, {})


def mechanism_of(plan: RunPlan):
    name = plan.config.release_mechanism
    return None if name is None else get_mechanism_class(name)
