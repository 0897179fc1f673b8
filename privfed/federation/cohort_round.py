"""A round's clients admitted one by one, then trained together, on the local runtime.

In the first pass (:class:`privfed.federation.local_runtime.LocalGrid`)
each client runs its fit up to training (every check, the guard's charge,
the "begun" record), hands its training to the :class:`CohortRound` and
stops as a killed client would; a refused client is neither trained nor
charged. The cohort trains every admitted client at once; in the second
pass each client finds its round begun (as after a kill) and takes its training.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch

from privfed.config import TrainConfig
from privfed.methods import build_network
from privfed.orchestra.cohort_training import CohortMember, TrainedMember, train_cohort
from privfed.orchestra.local_training import LocalTrainingConfig
from privfed.orchestra.model_state import StateDict

logger = logging.getLogger(__name__)

#: (partition, run, round, digest of the instructions): one client's round.
ClientRound = tuple[int, int, int, str]


class AdmittedToCohort(BaseException):
    """A client handed its training to the round's cohort; not an ``Exception``, so that, like a kill, no handler
    records the round as failed."""


@dataclass(frozen=True)
class CohortJob:
    """What one admitted client trains on: its images and its round seed (the rest is the round's)."""

    images: torch.Tensor
    seed: int


@dataclass
class CohortRound:
    """The clients of one round that train together (one cohort per set of equal instructions), and their trainings."""

    config: TrainConfig
    local: LocalTrainingConfig
    device: torch.device
    slots: int
    collecting: bool = True
    jobs: dict[ClientRound, CohortJob] = field(default_factory=dict)
    models: dict[str, tuple[StateDict, torch.Tensor | None]] = field(default_factory=dict)
    trained: dict[ClientRound, TrainedMember] = field(default_factory=dict)

    def admit(self, key: ClientRound, job: CohortJob, global_state: StateDict, centroids: torch.Tensor | None) -> None:
        """Records an admitted client's training; ends its first pass."""
        self.jobs[key] = job
        self.models.setdefault(key[3], (global_state, centroids))
        raise AdmittedToCohort

    def train(self) -> None:
        """Trains every admitted client, one cohort per set of instructions; a failed cohort's clients train alone later."""
        self.collecting = False
        for digest, (global_state, centroids) in self.models.items():
            keys = [key for key in self.jobs if key[3] == digest]
            members = [CohortMember(self.jobs[key].images, torch.Generator().manual_seed(self.jobs[key].seed)) for key in keys]
            threads = torch.get_num_threads()
            torch.set_num_threads(max(1, int(self.config.client_cpus)))  # as each client trains alone: reductions follow it
            try:
                trained = train_cohort(
                    build_network(self.config), global_state, centroids, members, self.local, device=self.device, slots=self.slots
                )
            except Exception as err:  # e.g. out of device memory: each client then trains alone, as without a cohort
                logger.warning("%d clients could not train together (%r); each trains alone", len(keys), err)
                continue
            finally:
                torch.set_num_threads(threads)
            logger.info("round %d: partitions %s trained together", keys[0][2], sorted(key[0] for key in keys))
            self.trained.update(zip(keys, trained))
        self.jobs.clear()
        self.models.clear()

    def take(self, key: ClientRound) -> TrainedMember | None:
        """A client's finished training, handed over once (None: it trains alone)."""
        return self.trained.pop(key, None)


_current: ContextVar[CohortRound | None] = ContextVar("privfed_cohort_round", default=None)


def current_cohort() -> CohortRound | None:
    """The cohort of the round this process's local runtime is answering (None: every client trains alone)."""
    return _current.get()


@contextmanager
def answering_with(cohort: CohortRound | None) -> Iterator[None]:
    """Clients answered inside the block see ``cohort``."""
    token = _current.set(cohort)
    try:
        yield
    finally:
        _current.reset(token)
