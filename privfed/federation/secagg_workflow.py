"""SecAgg+ for Orchestra's encoder updates: the fit step of every Flower round.

Only model deltas are summed securely. The released centroids are not a sum
(the server clusters every client's release separately), so they travel as
their own message content next to the masked vector, protected by the
release mechanism.

Round 0 only initialises: clients send no update, so it runs Flower's plain
fit workflow instead of a key exchange over nothing.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Protocol

import flwr.compat.common.recorddict_compat as compat
import numpy as np
from flwr.common import Context, Error, FitRes, Message, bytes_to_ndarray
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.common.secure_aggregation.secaggplus_constants import Key as SecAggKey
from flwr.server import Grid, LegacyContext
from flwr.server.client_proxy import ClientProxy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, Key
from flwr.server.workflow.default_workflows import default_fit_workflow

from privfed.secagg_settings import SecAggPlusSettings

logger = logging.getLogger(__name__)

#: Error code of a reply the server rejected (Flower's own codes are small integers).
REJECTED_REPLY = 4001


#: Set on Flower's round state once the key exchange is over (see :meth:`_CapturingSecAggPlusWorkflow._check_threshold`).
_KEYS_SHARED = "privfed_keys_shared"


class RoundCloser(Protocol):
    """What the workflow needs from the strategy (:class:`privfed.federation.strategy.OrchestraStrategy`)."""

    @property
    def next_round_trains(self) -> bool: ...

    def note_replies(self, results: list[tuple[ClientProxy, FitRes]]) -> None: ...

    def check_masked_reply(self, node_id: int, res: FitRes | None, masked: list[np.ndarray] | None) -> str | None: ...

    def close_round_without_aggregate(self, server_round: int) -> None: ...


class _ScreeningGrid:
    """A grid whose masked replies pass the strategy's checks first; a rejected one comes back as an error.

    The error keeps the reply out of the masked sum. The workflow then halts
    the round (:meth:`_CapturingSecAggPlusWorkflow.collect_masked_vectors_stage`):
    its sender's masked vector reached the server, and unmasking the others
    would reveal that sender's pairwise key, leaving its update behind only
    its self-mask.
    """

    def __init__(self, grid: Grid, strategy: RoundCloser) -> None:
        self._grid = grid
        self._strategy = strategy
        self.rejected: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return [self._screened(reply) for reply in self._grid.send_and_receive(messages, timeout=timeout)]

    def _screened(self, reply: Message) -> Message:
        if reply.has_error():
            return reply
        try:
            res: FitRes | None = compat.recorddict_to_fitres(reply.content, keep_input=True)
        except Exception:  # a reply Flower cannot even read as a FitRes
            res = None
        try:
            masked: list[np.ndarray] | None = [
                bytes_to_ndarray(b) for b in reply.content.config_records[RECORD_KEY_CONFIGS][SecAggKey.MASKED_PARAMETERS]
            ]
        except Exception:  # no masked vector, or not arrays
            masked = None
        reason = self._strategy.check_masked_reply(reply.metadata.src_node_id, res, masked)
        if reason is None:
            return reply
        self.rejected.append(reply.metadata.src_node_id)
        return Message(metadata=reply.metadata, error=Error(code=REJECTED_REPLY, reason=f"rejected by the server: {reason}"))


def forget_nodes_without_shares(state: Any) -> None:
    """Drops the nodes that left before sharing their keys from the round's SecAgg+ state.

    Flower 1.41 keeps every sampled node as a candidate dropout to unmask. A
    node that left during setup or the key exchange gave no neighbour shares
    of its secrets, so its neighbours fail on the request for them, and one
    such node halts the whole round. It also never entered anyone's pairwise
    masks (clients mask only with neighbours whose shares they received), so
    there is nothing of it to remove: as in Bell et al. (2020), the dropouts
    to unmask are those that shared keys but sent no masked vector.
    """
    keyed = set(state.active_node_ids)
    state.sampled_node_ids = keyed
    state.nid_to_neighbours = {
        nid: neighbours & keyed for nid, neighbours in state.nid_to_neighbours.items() if nid in keyed
    }
    setattr(state, _KEYS_SHARED, True)


class _CapturingSecAggPlusWorkflow(SecAggPlusWorkflow):
    """Flower's SecAgg+, made to survive dropouts and hostile clients, handing the replies' plaintext to the strategy.

    - Clients that leave before the key exchange completes are forgotten
      (:func:`forget_nodes_without_shares`), and the threshold is checked
      only where a secret may still be needed (:meth:`_check_threshold`).
    - Masked replies pass the strategy's checks (:class:`_ScreeningGrid`);
      a rejected one halts the round.
    - A client's reply that breaks a stage (e.g. unknown node ids, shares
      that do not combine) halts the round instead of crashing the run.

    The releases and metrics in the masked replies reached the server
    whether or not the protocol completes; if it halts, the strategy still
    accounts for them.
    """

    def __init__(self, strategy: RoundCloser, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.strategy = strategy

    def setup_stage(self, grid: Grid, context: LegacyContext, state: Any) -> bool:
        return self._halting_on_errors(super().setup_stage, grid, context, state)

    def share_keys_stage(self, grid: Grid, context: LegacyContext, state: Any) -> bool:
        proceed = self._halting_on_errors(super().share_keys_stage, grid, context, state)
        forget_nodes_without_shares(state)
        return proceed

    def collect_masked_vectors_stage(self, grid: Grid, context: LegacyContext, state: Any) -> bool:
        screening = _ScreeningGrid(grid, self.strategy)
        proceed = self._halting_on_errors(super().collect_masked_vectors_stage, screening, context, state)  # type: ignore[arg-type]
        self.strategy.note_replies(list(state.legacy_results))
        if screening.rejected:
            logger.warning(
                "secure aggregation halted: the server rejected %d masked repl%s, which cannot be left out of the "
                "sum without exposing them", len(screening.rejected), "y" if len(screening.rejected) == 1 else "ies",
            )
            return False
        return proceed

    def unmask_stage(self, grid: Grid, context: LegacyContext, state: Any) -> bool:
        return self._halting_on_errors(super().unmask_stage, grid, context, state)

    def _check_threshold(self, state: Any) -> bool:
        """Flower's check that every node keeps ``threshold`` live neighbours, for the nodes that matter.

        Before the key exchange ends, only live nodes do: a node that left has
        shared no secret. Afterwards every node that shared keys does, since
        a dropout's pairwise key must be rebuilt from its neighbours' shares.
        Flower checks every sampled node throughout, so in a round with
        partial neighbourhoods early dropouts halted rounds that could finish.
        """
        nodes = state.sampled_node_ids if getattr(state, _KEYS_SHARED, False) else state.active_node_ids
        for node_id in nodes:
            if len(state.nid_to_neighbours[node_id] & state.active_node_ids) < state.threshold:
                logger.warning("secure aggregation halted: a client has fewer live neighbours than the threshold")
                return False
        return True

    def _halting_on_errors(self, stage: Callable[..., bool], grid: Grid, context: LegacyContext, state: Any) -> bool:
        """Runs one of Flower's stages; an error from handling a client's reply halts the round.

        An error raised by privfed's own server code on the way (the strategy
        sampling clients or aggregating, the driver logging the round) is the
        run's to handle and goes on up.
        """
        try:
            return stage(grid, context, state)
        except Exception as err:
            if _raised_by_privfed(err):
                raise
            logger.warning("secure aggregation halted: a client's reply broke the protocol (%s: %s)", type(err).__name__, err)
            return False


def _raised_by_privfed(err: BaseException) -> bool:
    """Whether privfed's server code (other than this module's wrappers) is on the error's traceback."""
    frame = err.__traceback__
    while frame is not None:
        module = str(frame.tb_frame.f_globals.get("__name__", ""))
        if module.split(".")[0] in ("privfed", "mechanisms") and module != __name__:
            return True
        frame = frame.tb_next
    return False


class OrchestraFitWorkflow:
    """The fit step of each Flower round: plain for round 0, SecAgg+ afterwards."""

    def __init__(self, settings: SecAggPlusSettings, strategy: RoundCloser, num_sampled: int) -> None:
        self.strategy = strategy
        self._secure = _CapturingSecAggPlusWorkflow(strategy, **settings.workflow_arguments(num_sampled))

    def __call__(self, grid: Grid, context: Context) -> None:
        if not isinstance(context, LegacyContext):
            raise TypeError(f"expected a LegacyContext, got {type(context).__name__}")
        if not self.strategy.next_round_trains:
            default_fit_workflow(grid, context)
            return
        current_round = int(context.state.config_records[MAIN_CONFIGS_RECORD][Key.CURRENT_ROUND])
        self._secure(grid, context)
        self.strategy.close_round_without_aggregate(current_round)
