"""``privfed train --runtime local``: Flower's ServerApp and ClientApp in one process, without Ray.

The apps are the Ray path's (:mod:`privfed.federation.simulation`): :class:`LocalGrid`
implements Flower's ``Grid`` and hands each message straight to the ClientApp,
so Flower's workflows (SecAgg+ included) run unchanged, and a client's exception
becomes an error reply, as a crashed node's would. Ray costs more than a small
run's rounds (docs/flower.md).
"""

from __future__ import annotations

import copy
import functools
import logging
import random
import secrets
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Context, Error, Message, RecordDict
from flwr.app.message_type import MessageType
from flwr.client import ClientApp
from flwr.common.constant import (
    NUM_PARTITIONS_KEY,
    PARTITION_ID_KEY,
    SUPERLINK_NODE_ID,
    ErrorCode,
)
from flwr.server import ServerApp
from flwr.serverapp.grid import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from privfed.config import TrainConfig
from privfed.device import resolve_device
from privfed.federation.client_app import FIT_CONFIG_RECORD, Mod, make_client_app
from privfed.federation.cohort_round import AdmittedToCohort, CohortRound, answering_with, current_cohort
from privfed.federation.local_workers import ClientWorkers, worker_count
from privfed.federation.reply_store import forget_replies
from privfed.federation.server_app import make_server_app
from privfed.orchestra.cohort_training import trains_in_cohort
from privfed.orchestra.local_training import LocalTrainingConfig
from privfed.run.driver import ProgressCallback
from privfed.run.interruption import StopRequest, run_stop_request
from privfed.run.plan import RunPlan
from privfed.run.resume import ResumePoint

logger = logging.getLogger(__name__)

#: The run key of every simulated client's guard, on either runtime: the ledgers live in the run's own directory, so
#: a resumed run is the same run to them (Flower's run id is new in every process).
SIMULATED_RUN_KEY = 0


@dataclass(frozen=True)
class SimulatedRun:
    """What either runtime runs: a planned training, and how ``privfed train`` or a library call asked for it.

    Both runtimes build the same apps from it. ``outer_mods`` and ``inner_mods``
    are :func:`privfed.federation.client_app.make_client_app`'s.
    """

    plan: RunPlan
    progress: ProgressCallback | None = None
    verbose: bool = False
    outer_mods: Sequence[Mod] = ()
    inner_mods: Sequence[Mod] = ()
    resume: ResumePoint | None = None

    def client_app(self) -> ClientApp:
        """The ClientApp of every simulated node: held to the declared run, its ledger and SecAgg+ identity in the run
        directory."""
        return make_client_app(
            declared=self.plan.config, state_dir=self.plan.run_dir.client_ledgers, run_key=SIMULATED_RUN_KEY,
            outer_mods=self.outer_mods, inner_mods=self.inner_mods,
        )

    def server_app(self, outcome: dict[str, Any], stop: StopRequest) -> ServerApp:
        """The ServerApp, which leaves the summary (or its error) in ``outcome``."""
        progress = forgetting_replies(self.progress, self.plan.run_dir.client_ledgers)
        return make_server_app(self.plan, progress, outcome, stop=stop, resume=self.resume)


def run_locally(run: SimulatedRun) -> dict[str, Any]:
    """Runs a planned training with ``num_clients`` in-process nodes; returns the summary.

    Ctrl-C behaves as on Ray (:func:`privfed.federation.simulation.simulate_on_ray`), and
    a run may be resumed on either runtime (:data:`SIMULATED_RUN_KEY`). Raises whatever the ServerApp raised.
    """
    config = run.plan.config
    outcome: dict[str, Any] = {}
    client_app = run.client_app()
    cohort = cohort_of(config)
    grid = LocalGrid(
        client_app, config.num_clients, cohort=cohort, workers=1 if cohort is not None else worker_count(config),
        partition_sizes=run.plan.split.client_sizes(),
    )
    with flower_logging(run.verbose), superlink_identity(grid.run.run_id), run_stop_request() as stop, closing(grid):
        server_app = run.server_app(outcome, stop)
        server_app(grid, Context(grid.run.run_id, 0, {}, RecordDict(), {}))
    return summary_of(outcome)


@contextmanager
def flower_logging(verbose: bool) -> Iterator[None]:
    """Flower's INFO lines and Ray's FutureWarnings off for a run unless ``verbose``; both (and the ``flwr`` logger's
    handlers, which Flower's ``verbose_logging`` changes) as they were after it."""
    flwr_logger = logging.getLogger("flwr")
    level, propagate = flwr_logger.level, flwr_logger.propagate
    handlers = [(handler, handler.level, handler.formatter) for handler in flwr_logger.handlers]
    with warnings.catch_warnings():
        if not verbose:
            flwr_logger.setLevel(logging.ERROR)
            # Flower 1.41 marks run_simulation deprecated (docs/flower.md says why privfed train keeps it).
            warnings.filterwarnings("ignore", category=FutureWarning, module="ray")
        try:
            yield
        finally:
            flwr_logger.setLevel(level)
            flwr_logger.propagate = propagate
            for handler, handler_level, formatter in handlers:
                handler.setLevel(handler_level)
                handler.setFormatter(formatter)


@contextmanager
def superlink_identity(run_id: int) -> Iterator[None]:
    """This process's Flower task identity (stamped on the ServerApp's messages) as the SuperLink's, in the block."""
    saved = TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, run_id, SUPERLINK_NODE_ID
    try:
        yield
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


def cohort_of(config: TrainConfig) -> Callable[[], CohortRound] | None:
    """How a round's clients train together (None: one at a time); ``clients_per_step`` 0 batches them on CUDA only,
    as on a CPU the batched step is slower (docs/performance.md)."""
    device = resolve_device(config.device)
    local = LocalTrainingConfig.from_run(config)
    automatic = config.clients_per_step == 0
    slots = (config.num_clients if device.type == "cuda" else 1) if automatic else config.clients_per_step
    if slots < 2 or config.dp_sgd or trains_in_cohort(local) is not None:
        return None
    return functools.partial(CohortRound, config, local, device, slots)


class LocalGrid(Grid):
    """A Flower ``Grid`` whose nodes live in this process: ``pull_messages`` runs each pending message's ClientApp.

    With a ``cohort`` a round's clients train in one batched computation
    (:mod:`privfed.federation.cohort_round`); otherwise, with ``workers``
    above 1, messages run as pushed in forked processes, the largest
    partitions first (:mod:`privfed.federation.local_workers`).
    """

    def __init__(
        self, client_app: ClientApp, num_nodes: int, run_id: int | None = None, *, workers: int = 1,
        partition_sizes: Sequence[int] = (), cohort: Callable[[], CohortRound] | None = None,
    ) -> None:
        self._app = client_app
        self._run = Run.create_empty(run_id if run_id is not None else secrets.randbits(63))
        nodes = node_ids(num_nodes)
        self._contexts = {  # each node's own, kept across its messages, as Flower's simulation registers it
            node: Context(self._run.run_id, node, {PARTITION_ID_KEY: i, NUM_PARTITIONS_KEY: num_nodes}, RecordDict(), {})
            for i, node in enumerate(nodes)
        }
        self._pending: dict[str, Message] = {}
        self._new_cohort = cohort
        self._cohort: CohortRound | None = None
        self._workers_wanted = workers if cohort is None else 1
        sizes = dict(enumerate(partition_sizes))
        self._node_sizes = {node: sizes.get(partition, 0) for partition, node in enumerate(nodes)}
        self._workers: ClientWorkers | None = None

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None
    ) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self._contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Queues each message under a new id; a message to an unknown node is dropped, as the SuperLink drops it."""
        ids = []
        for message in messages:
            if message.metadata.dst_node_id not in self._contexts:
                logger.error("no node %s in this run: message dropped", message.metadata.dst_node_id)
                continue
            message.metadata.__dict__["_message_id"] = uuid.uuid4().hex  # Flower's Metadata has no setter
            self._pending[message.metadata.message_id] = message
            ids.append(message.metadata.message_id)
        training = [self._pending[i] for i in ids if trains(self._pending[i])]
        if self._new_cohort is not None and len(training) > 1:
            self._cohort = self._admit_together(training, self._new_cohort())
        if self._workers_wanted > 1 and ids:
            if self._workers is None:  # forked at the first message, inside the run's logging settings
                self._workers = ClientWorkers(self._answer, self._contexts, self._workers_wanted, self._node_sizes)
            self._workers.submit([(message_id, self._pending[message_id]) for message_id in ids])
        return ids

    def _admit_together(self, messages: list[Message], cohort: CohortRound) -> CohortRound:
        """The first pass: each client is checked and charged up to training; then the admitted ones train together."""
        with answering_with(cohort):
            for message in messages:
                try:
                    self._deliver(message, quiet=True)  # its reply (a refusal, a replay) comes again in the second pass
                except AdmittedToCohort:
                    pass
        cohort.train()
        return cohort

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """The reply to the first pending message among ``message_ids``: one per pull, so SecAgg+ sums each masked
        vector before the next exists."""
        if self._workers is not None:
            pending = [message_id for message_id in message_ids if message_id in self._pending]
            if not pending:
                return []
            done, reply = self._workers.take(pending)
            del self._pending[done]
            return [reply]
        for message_id in message_ids:
            if message_id in self._pending:
                return [self._deliver(self._pending.pop(message_id))]
        return []

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Every reply (none is late), in the order of ``messages``, so the server's float sums add in one order."""
        ids = list(self.push_messages(messages))
        replies: list[Message] = []
        while pulled := list(self.pull_messages(ids)):
            replies.extend(pulled)
        order = {message_id: i for i, message_id in enumerate(ids)}
        return sorted(replies, key=lambda reply: order[reply.metadata.reply_to_message_id])

    def close(self) -> None:
        """Ends the worker processes, if any were started."""
        if self._workers is not None:
            self._workers.close()
            self._workers = None

    def _answer(self, message: Message, context: Context) -> tuple[Message, Context]:
        """In a worker: the node's reply to ``message`` given its latest ``context``, and that context after it."""
        self._contexts[message.metadata.dst_node_id] = context
        return self._deliver(message), context

    def _deliver(self, message: Message, *, quiet: bool = False) -> Message:
        """The node's reply to its own copy of ``message`` (the server may send one content object to many nodes).

        ``quiet``: a cohort's first pass, on a copy of the node's context
        (the second pass changes it) and logging no failure (the second pass will).
        """
        context = self._contexts[message.metadata.dst_node_id]
        if quiet:
            context = copy.deepcopy(context)
        received = copy.deepcopy(message)
        try:
            with own_process_state(), answering_with(current_cohort() if quiet else self._cohort):
                reply = self._app(received, context)
        except Exception as err:  # a failing client is a dropped node, not a failed run
            if not quiet:
                logger.warning("node %s (partition %s) failed: %r", context.node_id, context.node_config[PARTITION_ID_KEY], err)
            reply = Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, f"{type(err).__name__}: {err}"), reply_to=received)
        reply.metadata.__dict__["_message_id"] = uuid.uuid4().hex
        return reply


def trains(message: Message) -> bool:
    """Whether ``message`` asks a client for a training round (the message that carries the fit instructions)."""
    fit = message.content.config_records.get(FIT_CONFIG_RECORD)
    return message.metadata.message_type == MessageType.TRAIN and fit is not None and fit.get("task") == "train"


def node_ids(count: int) -> list[int]:
    """``count`` distinct random node ids, never the SuperLink's: as in Flower, an id says nothing of its partition."""
    ids: list[int] = []
    while len(ids) < count:
        drawn = secrets.randbits(63)
        if drawn != SUPERLINK_NODE_ID and drawn not in ids:
            ids.append(drawn)
    return ids


def summary_of(outcome: dict[str, Any]) -> dict[str, Any]:
    """The summary a ServerApp left in ``outcome``; its error, re-raised here, if it failed."""
    if "error" in outcome:
        raise outcome["error"]
    if "summary" not in outcome:
        raise RuntimeError("the simulation ended without a result (see the log above)")
    return outcome["summary"]


def forgetting_replies(progress: ProgressCallback | None, folder: Path) -> ProgressCallback:
    """``progress``, after removing the stored replies no resume can replay (:func:`forget_replies`)."""

    def hook(event: dict[str, Any]) -> None:
        if event["event"] == "round":
            forget_replies(folder, before=int(event["round"]))
        elif event["event"] == "finish":
            forget_replies(folder)
        if progress is not None:
            progress(event)

    return hook


@contextmanager
def own_process_state() -> Iterator[None]:
    """Runs the block as if in a process of its own: Python's, NumPy's and torch's generators and thread count come
    back after: a client's seeding never reaches the server (as on Ray), nor a library call's run its caller's."""
    saved = random.getstate(), np.random.get_state(), torch.get_rng_state(), torch.get_num_threads()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.set_rng_state(saved[2])
        torch.set_num_threads(saved[3])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
