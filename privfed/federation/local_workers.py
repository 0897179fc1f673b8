"""The local runtime's worker processes: a round's clients train side by side, one core each, as on Ray.

Rather than one client at a time on every core: torch's intra-op threads on
small convolutions lose up to 20 times on a shared machine (docs/flower.md).
A client trains with as many threads as it would alone, so the same seed
gives the same run. Workers are forked, inheriting the ClientApp (whose mods
no pickle may carry); that is safe only for a single-threaded client on CPU
(GNU OpenMP's thread pool and CUDA do not survive a fork), else
:func:`worker_count` says 1.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import uuid
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

from flwr.app import Context, Error, Message
from flwr.common.constant import ErrorCode

from privfed.config import TrainConfig

#: What a worker runs for one message: the node's reply and its context after it.
Answer = Callable[[Message, Context], tuple[Message, Context]]


def worker_count(config: TrainConfig, cores: int | None = None) -> int:
    """Clients that train at once: ``cores / client_cpus`` (Ray's count), up to a round's clients; 1 where a fork is unsafe."""
    from privfed.device import resolve_device  # loads torch

    cores = cores or os.cpu_count() or 1
    if int(config.client_cpus) > 1 or resolve_device(config.device).type != "cpu":
        return 1
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return max(1, min(config.clients_per_round, int(cores / config.client_cpus)))


class ClientWorkers:
    """Forked processes that answer nodes' messages; the grid submits each message and takes the replies.

    ``contexts`` is the grid's own map: a message leaves with its node's
    latest context and the worker's copy replaces it, so a node's state
    carries over as in one process. The heaviest nodes (``weights``) start
    first: a large client started last would train alone.
    """

    def __init__(self, answer: Answer, contexts: dict[int, Context], count: int, weights: Mapping[int, float]) -> None:
        self._answer = answer
        self._contexts = contexts
        self._weights = weights
        self._context = multiprocessing.get_context("fork")
        self._idle: list[tuple[BaseProcess, Connection]] = []
        self._busy: dict[Connection, tuple[BaseProcess, str, Message]] = {}
        self._queue: list[tuple[str, Message]] = []
        self._done: dict[str, Message] = {}
        for _ in range(count):
            self._idle.append(self._start())

    def _start(self) -> tuple[BaseProcess, Connection]:
        ours, theirs = self._context.Pipe()
        # The child closes every parent end it inherits, so it reads end-of-file once this process dies.
        parent_ends = [ours, *(conn for _, conn in self._idle), *self._busy]
        process = self._context.Process(target=serve, args=(theirs, self._answer, parent_ends), daemon=True)
        process.start()
        theirs.close()
        return process, ours

    def submit(self, messages: Sequence[tuple[str, Message]]) -> None:
        """Queues each message under its key; each starts as soon as a worker and its node are free."""
        self._queue.extend(messages)
        self._dispatch()

    def take(self, keys: Sequence[str]) -> tuple[str, Message]:
        """The first of ``keys`` whose reply is ready, waiting for one if none is; its reply leaves the store."""
        while True:
            ready = next((key for key in keys if key in self._done), None)
            if ready is not None:
                return ready, self._done.pop(ready)
            if not self._busy:
                raise KeyError(f"none of {list(keys)} was submitted")
            for conn in wait(list(self._busy)):
                self._receive(conn)  # type: ignore[arg-type]
            self._dispatch()

    def _dispatch(self) -> None:
        """Starts queued messages, heaviest node first, on idle workers; a node's next message waits for its last reply."""
        busy_nodes = {message.metadata.dst_node_id for _, _, message in self._busy.values()}
        for key, message in sorted(self._queue, key=lambda task: -self._weights.get(task[1].metadata.dst_node_id, 0)):
            node = message.metadata.dst_node_id
            if not self._idle:
                return
            if node in busy_nodes:
                continue
            self._queue.remove((key, message))
            process, conn = self._idle.pop()
            conn.send((message, self._contexts[node]))
            self._busy[conn] = (process, key, message)
            busy_nodes.add(node)

    def _receive(self, conn: Connection) -> None:
        process, key, message = self._busy.pop(conn)
        try:
            reply, context = conn.recv()
        except (EOFError, OSError):  # the worker died (killed, out of memory): its node is lost, as a crashed node is
            process.join()
            self._done[key] = lost_node_reply(message, process.exitcode)
            self._idle.append(self._start())
            return
        self._contexts[message.metadata.dst_node_id] = context
        self._done[key] = reply
        self._idle.append((process, conn))

    def close(self) -> None:
        """Ends every worker; one still computing a message is stopped."""
        for process, conn in [*self._idle, *((p, c) for c, (p, _, _) in self._busy.items())]:
            conn.close()  # an idle worker reads end-of-file and returns
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
                process.join()
        self._idle, self._busy = [], {}


def serve(conn: Connection, answer: Answer, parent_ends: Sequence[Connection]) -> None:
    """A worker's loop: answer each (message, context) until the parent closes its end or dies; signals are the
    parent's (a first Ctrl-C lets the round finish)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for end in parent_ends:
        end.close()
    import torch

    torch.set_num_threads(1)  # before any torch work: see the module docstring
    while True:
        try:
            message, context = conn.recv()
        except EOFError:
            return
        reply = answer(message, context)  # stored by the client before it is sent, as in one process
        try:
            conn.send(reply)
        except OSError:  # the parent died meanwhile (a second Ctrl-C): a resume replays the stored reply
            return


def lost_node_reply(message: Message, exitcode: int | None) -> Message:
    """The error reply for a message whose worker died before answering."""
    error = Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, f"the node's worker process died (exit code {exitcode})")
    reply = Message(error, reply_to=message)
    reply.metadata.__dict__["_message_id"] = uuid.uuid4().hex  # Flower's Metadata has no setter
    return reply
