"""SecAgg+ for Orchestra's encoder updates: the fit step of every Flower round.

Only model deltas are summed securely. The released centroids are not a sum
(the server clusters each release separately): they travel next to the
masked vector, protected by the release mechanism. Flower's workflow runs
the message flow; privfed states its protocol version at setup and unmasks
the sum itself (:mod:`privfed.secagg.masks`). Round 0 sends no update, so it
runs Flower's plain fit workflow.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import flwr.compat.common.recorddict_compat as compat
import numpy as np
from flwr.app import ConfigRecord, RecordDict
from flwr.app.message_type import MessageType
from flwr.common import Context, Error, FitRes, Message, bytes_to_ndarray, ndarrays_to_parameters
from flwr.common.secure_aggregation.crypto.shamir import combine_shares
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Stage
from flwr.common.secure_aggregation.secaggplus_constants import Key as SecAggKey
from flwr.server import Grid, LegacyContext
from flwr.server.client_proxy import ClientProxy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key
from flwr.server.workflow.default_workflows import default_fit_workflow

import privfed.records
from privfed.records import record_item, record_list
from privfed.secagg import identity as ids
from privfed.secagg import mask_pool, masking
from privfed.secagg import masks as secagg_masks
from privfed.secagg.masking import decode_weighted_mean, pairwise_seed, split_share, unmask_sum
from privfed.secagg.masks import PROTOCOL_KEY, PROTOCOL_VERSION
from privfed.secagg.settings import SecAggPlusSettings

logger = logging.getLogger(__name__)

#: Error code of a reply the server rejected (Flower's own codes are small integers).
REJECTED_REPLY = 4001
#: Error code of a setup reply from a client that does not run the server's protocol version.
OTHER_PROTOCOL = 4002

#: Seconds between pulls while no reply has arrived (Flower's in-memory grid waits 0.1 s).
PULL_INTERVAL = 0.1

#: Set on Flower's round state once the key exchange is over (see :meth:`_CapturingSecAggPlusWorkflow._check_threshold`).
_KEYS_SHARED = "privfed_keys_shared"
#: Flower's round state also holds the round's signatures (:class:`SignedRound`).
_SIGNED = "privfed_signed"


class RoundCloser(Protocol):
    """What the workflow needs from the strategy (:class:`privfed.federation.strategy.OrchestraStrategy`)."""

    @property
    def next_round_trains(self) -> bool: ...

    def note_replies(self, results: list[tuple[ClientProxy, FitRes]]) -> None: ...

    def check_masked_reply(self, node_id: int, res: FitRes | None, masked: list[np.ndarray] | None) -> str | None: ...

    def close_round_without_aggregate(self, server_round: int) -> None: ...

    @property
    def carries_share(self) -> bool: ...

    def note_secure_sum(self, total: np.ndarray, *, num_summed: int, nodes: Collection[int] = ()) -> None: ...


class MaskedSum:
    """The masked vectors' sum mod the modulus, added to as each arrives, so the server holds one vector at a time.

    Every vector must have the first one's shapes (numpy would broadcast a hostile one). The int64 total is
    exact for up to 2^31 vectors, each first reduced below the modulus (at most 2^32).
    """

    def __init__(self, modulus: int) -> None:
        self.modulus = modulus
        self.count = 0
        self._total: list[np.ndarray] | None = None

    def add(self, vector: list[np.ndarray] | None) -> None:
        if vector is None:
            raise ValueError("a reply without a readable masked vector cannot join the sum")
        if self._total is None:
            self._total = [np.zeros(array.shape, dtype=np.int64) for array in vector]
        if [array.shape for array in vector] != [total.shape for total in self._total]:
            raise ValueError("a masked vector's arrays differ in number or shape from the others'")
        for total, array in zip(self._total, vector):
            np.add(total, np.remainder(array, self.modulus), out=total)  # a float array fails the cast
        self.count += 1

    def total(self) -> list[np.ndarray] | None:
        """The sum mod the modulus (None: nothing was added); reduced in place, so call it once all are in."""
        for total in self._total or []:
            np.remainder(total, self.modulus, out=total)
        return self._total


@dataclass
class SignedRound:
    """What the server keeps of the signatures in one SecAgg+ round, to check each itself: a client whose signature
    does not verify is left out like a dropout, where every honest node would refuse the request carrying it."""

    run_id: int
    adverts: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)  # node -> (identity, advert signature)
    view_digests: dict[int, bytes] = field(default_factory=dict)  # node -> digest of the view forwarded to it
    view_signatures: dict[int, bytes] = field(default_factory=dict)

    def signed_by(self, node: int, signature: object, message: bytes) -> bool:
        if not isinstance(signature, bytes) or node not in self.adverts:
            return False
        try:
            ids.verify(self.adverts[node][0], signature, message)
        except ids.IdentityError:
            return False
        return True


class _ProtocolGrid:
    """A grid that states privfed's protocol version at setup and leaves out clients on another protocol, or whose
    advertisement does not verify, whose masks would spoil the sum (having shared no keys, they are forgotten like
    early dropouts). It keeps each advertisement in ``signed``, for the neighbours to check."""

    def __init__(self, grid: Grid, signed: SignedRound) -> None:
        self._grid = grid
        self._signed = signed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        stamped = list(messages)
        for message in stamped:
            message.content.config_records[RECORD_KEY_CONFIGS][PROTOCOL_KEY] = PROTOCOL_VERSION
        setups = {message.metadata.dst_node_id: message for message in stamped}
        return [self._checked(reply, setups) for reply in self._grid.send_and_receive(stamped, timeout=timeout)]

    def _checked(self, reply: Message, setups: dict[int, Message]) -> Message:
        if reply.has_error():
            return reply
        node = reply.metadata.src_node_id
        configs = reply.content.config_records.get(RECORD_KEY_CONFIGS, ConfigRecord())
        runs = configs.get(PROTOCOL_KEY)
        if runs != PROTOCOL_VERSION:
            logger.warning("a client runs SecAgg+ protocol %r, not %r: it is left out of the round", runs, PROTOCOL_VERSION)
            return left_out(reply, OTHER_PROTOCOL, f"runs SecAgg+ protocol {runs!r}")
        identity, signature = configs.get(ids.IDENTITY_KEY), configs.get(ids.ADVERT_SIGNATURE_KEY)
        taken = {known for known, _ in self._signed.adverts.values()}
        if isinstance(identity, bytes) and node in setups and identity not in taken:
            self._signed.adverts[node] = (identity, b"")
            if self._signed.signed_by(node, signature, _advert_of(setups[node], configs, self._signed.run_id, node)):
                self._signed.adverts[node] = (identity, signature)  # type: ignore[assignment]
                return reply
            del self._signed.adverts[node]
        logger.warning("a client's SecAgg+ advertisement does not verify (or repeats an identity): it is left out")
        return left_out(reply, OTHER_PROTOCOL, "advertised keys without a valid signature of an identity of its own")


def _advert_of(setup: Message, reply: ConfigRecord, run_id: int, node: int) -> bytes:
    """The advertisement a node signed at setup, as the server rebuilds it from its request and the node's reply."""
    asked = setup.content.config_records[RECORD_KEY_CONFIGS]
    pk1, pk2 = reply.get(SecAggKey.PUBLIC_KEY_1), reply.get(SecAggKey.PUBLIC_KEY_2)
    if not (isinstance(pk1, bytes) and isinstance(pk2, bytes)):
        return b""
    return ids.advert_message(
        run_id=run_id, round_label=str(setup.metadata.group_id), node_id=node,
        sample=record_item(asked[SecAggKey.SAMPLE_NUMBER], int), shares=record_item(asked[SecAggKey.SHARE_NUMBER], int),
        threshold=record_item(asked[SecAggKey.THRESHOLD], int), pk1=pk1, pk2=pk2,
    )


def left_out(reply: Message, code: int, reason: str) -> Message:
    """An error reply in place of ``reply``: the client is left out of the round, like a dropout."""
    # Flower's overloads omit the metadata form; the error reply keeps the client's metadata.
    return Message(metadata=reply.metadata, error=Error(code=code, reason=reason))  # type: ignore[call-overload]


class _AdvertisingGrid:
    """The share-keys stage's grid: it hands each node its neighbours' signed advertisements next to their keys, and
    keeps each reply's signature on the view it shared its keys in, if it verifies (else the node is left out)."""

    def __init__(self, grid: Grid, signed: SignedRound) -> None:
        self._grid = grid
        self._signed = signed
        self._neighbours: dict[int, set[int]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        stamped = list(messages)
        adverts = self._signed.adverts
        for message in stamped:
            configs = message.content.config_records[RECORD_KEY_CONFIGS]
            keys = {int(node): record_list(value, bytes) for node, value in configs.items() if node != SecAggKey.STAGE}
            nodes = sorted(keys)
            configs[ids.ADVERT_NODES_KEY] = nodes
            configs[ids.ADVERT_IDENTITIES_KEY] = [adverts[node][0] for node in nodes]
            configs[ids.ADVERT_SIGNATURES_KEY] = [adverts[node][1] for node in nodes]
            view = {node: (adverts[node][0], keys[node][0], keys[node][1]) for node in nodes}
            self._signed.view_digests[message.metadata.dst_node_id] = ids.view_digest(view)
            self._neighbours[message.metadata.dst_node_id] = set(nodes) - {message.metadata.dst_node_id}
        return [self._kept(reply) for reply in self._grid.send_and_receive(stamped, timeout=timeout)]

    def _kept(self, reply: Message) -> Message:
        if reply.has_error():
            return reply
        node = reply.metadata.src_node_id
        signature = reply.content.config_records.get(RECORD_KEY_CONFIGS, ConfigRecord()).get(ids.VIEW_SIGNATURE_KEY)
        digest = self._signed.view_digests.get(node)
        if digest is None or not self._signed.signed_by(node, signature, ids.view_message(digest)):
            return left_out(reply, OTHER_PROTOCOL, "shared keys without a valid signature on its view")
        configs = reply.content.config_records[RECORD_KEY_CONFIGS]
        destinations, ciphertexts = configs.get(SecAggKey.DESTINATION_LIST), configs.get(SecAggKey.CIPHERTEXT_LIST)
        if not (
            isinstance(destinations, list) and isinstance(ciphertexts, list) and len(destinations) == len(ciphertexts)
            and sorted(destinations) == sorted(self._neighbours.get(node, ()))
        ):  # every honest neighbour would refuse a survivor set naming a node that shared nothing with it
            return left_out(reply, OTHER_PROTOCOL, "did not share its keys with exactly each of its neighbours once")
        self._signed.view_signatures[node] = signature  # type: ignore[assignment]
        return reply


def forget_nodes_without_shares(state: Any) -> None:
    """Drops the nodes that left before sharing their keys from the round's SecAgg+ state.

    No neighbour holds their shares (Flower 1.41 halted the round asking for
    them), and they are in nobody's masks: as in Bell et al. (2020), the
    dropouts to unmask are those that shared keys but sent no masked vector.
    """
    keyed = set(state.active_node_ids)
    state.sampled_node_ids = keyed
    state.nid_to_neighbours = {
        nid: neighbours & keyed for nid, neighbours in state.nid_to_neighbours.items() if nid in keyed
    }
    setattr(state, _KEYS_SHARED, True)


class _CapturingSecAggPlusWorkflow(SecAggPlusWorkflow):
    """Flower's SecAgg+, made to survive dropouts and hostile clients, handing the replies' plaintext to the strategy.

    Early dropouts are forgotten, masked replies are screened and summed as
    they arrive, and a reply that breaks a stage halts the round instead of
    the run. The releases and metrics in the masked replies reached the
    server whether or not the protocol completes; the strategy accounts for them.
    """

    def __init__(self, strategy: RoundCloser, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.strategy = strategy

    def setup_stage(self, grid: Grid, context: LegacyContext, state: Any) -> bool:
        setattr(state, _SIGNED, SignedRound(int(context.run_id)))
        protocol_grid = _ProtocolGrid(grid, getattr(state, _SIGNED))
        return self._halting_on_errors(super().setup_stage, protocol_grid, context, state)  # type: ignore[arg-type]

    def share_keys_stage(self, grid: Grid, context: LegacyContext, state: Any) -> bool:
        advertising = _AdvertisingGrid(grid, getattr(state, _SIGNED))
        proceed = self._halting_on_errors(super().share_keys_stage, advertising, context, state)  # type: ignore[arg-type]
        forget_nodes_without_shares(state)
        return proceed

    def collect_masked_vectors_stage(self, grid: Grid, context: LegacyContext, state: Any) -> bool:
        rejected: list[int] = []
        proceed = self._halting_on_errors(partial(self._collect_masked_vectors, rejected=rejected), grid, context, state)
        self.strategy.note_replies(list(state.legacy_results))
        if rejected:
            logger.warning(
                "secure aggregation halted: the server rejected %d masked repl%s, which cannot be left out of the "
                "sum without exposing them", len(rejected), "y" if len(rejected) == 1 else "ies",
            )
            return False
        return proceed

    def _collect_masked_vectors(self, grid: Grid, context: LegacyContext, state: Any, *, rejected: list[int]) -> bool:
        """Flower's stage, summing each masked vector as it arrives, not holding all (9 GB for 50 ResNet-18 clients)."""
        server_round = record_item(context.state.config_records[MAIN_CONFIGS_RECORD][Key.CURRENT_ROUND], int)
        requests = [
            _masked_vector_request(node, state, server_round, getattr(state, _SIGNED).view_signatures)
            for node in state.active_node_ids
        ]
        del state.forward_ciphertexts, state.forward_srcs, state.nid_to_fitins
        masked_sum, replied = MaskedSum(state.mod_range), set[int]()
        for reply in replies_as_they_arrive(grid, requests, timeout=self.timeout):
            self._take_masked_reply(reply, state, masked_sum, replied, rejected)
            del reply  # its masked bytes go before the next reply is pulled
        state.active_node_ids = replied
        if masked_sum.count:
            state.aggregate_ndarrays = masked_sum.total()
        return self._check_threshold(state)

    def _take_masked_reply(
        self, reply: Message, state: Any, masked_sum: MaskedSum, replied: set[int], rejected: list[int]
    ) -> None:
        """Screens one reply; an accepted one joins the sum, its fit result the legacy results.

        One the strategy rejects halts the round: its masked vector reached the
        server, and unmasking the others would leave its update behind its self-mask alone.
        """
        node = reply.metadata.src_node_id
        if reply.has_error():
            if reply.error.code == REJECTED_REPLY:
                rejected.append(node)
            state.failures.append(Exception(reply.error))
            return
        try:
            res: FitRes | None = compat.recorddict_to_fitres(reply.content, keep_input=True)
        except Exception:  # a reply Flower cannot even read as a FitRes
            res = None
        try:
            vector = record_list(reply.content.config_records[RECORD_KEY_CONFIGS][SecAggKey.MASKED_PARAMETERS], bytes)
            masked: list[np.ndarray] | None = [bytes_to_ndarray(b) for b in vector]
        except Exception:  # no masked vector, or not arrays
            masked = None
        reason = self.strategy.check_masked_reply(node, res, masked)
        if reason is not None:
            rejected.append(node)
            state.failures.append(Exception(Error(code=REJECTED_REPLY, reason=f"rejected by the server: {reason}")))
            return
        if res is None:
            raise ValueError(f"node {node} sent a reply that is not a fit result")
        masked_sum.add(masked)
        state.legacy_results.append((state.nid_to_proxies[node], res))
        replied.add(node)

    def unmask_stage(self, grid: Grid, context: LegacyContext, state: Any) -> bool:
        return self._halting_on_errors(self._unmask, grid, context, state)

    def _unmask(self, grid: Grid, context: LegacyContext, state: Any) -> bool:
        """Collects the shares, rebuilds the secrets, takes the masks off the sum and hands the mean to the strategy.

        Survivors are asked for shares of each survivor's private mask seed and
        of each dropout's first private key; never both of one client.
        """
        server_round = record_item(context.state.config_records[MAIN_CONFIGS_RECORD][Key.CURRENT_ROUND], int)
        survivors = set(state.active_node_ids)
        dropped = state.sampled_node_ids - survivors
        signatures = _signatures_on(
            grid, survivors, server_round, getattr(state, _SIGNED), timeout=self.timeout, failures=state.failures
        )
        if len(signatures) < state.threshold:
            logger.warning(
                "secure aggregation halted: %d survivors signed the survivor set, the threshold is %d",
                len(signatures), state.threshold,
            )
            return False
        requests = [
            _share_request(node, state.nid_to_neighbours[node], survivors, dropped, server_round, signatures)
            for node in signatures
        ]
        shares: dict[int, list[bytes]] = {node: [] for node in state.sampled_node_ids}
        responders = set()
        for reply in grid.send_and_receive(requests, timeout=self.timeout):
            if reply.has_error():
                state.failures.append(Exception(reply.error))
                continue
            node = reply.metadata.src_node_id
            _collect_shares(reply, state.nid_to_neighbours[node] & state.sampled_node_ids, shares)
            responders.add(node)
        state.active_node_ids = responders
        short = [node for node, node_shares in shares.items() if len(node_shares) < state.threshold]
        if short:
            logger.warning("secure aggregation halted: %d clients' secrets have fewer shares than the threshold", len(short))
            return False
        secrets = {node: combine_shares(node_shares) for node, node_shares in shares.items()}
        total = unmask_sum(
            state.aggregate_ndarrays,
            private_seeds={node: secrets[node] for node in survivors},
            dropped_pairwise_seeds={
                gone: {
                    survivor: pairwise_seed(secrets[gone], state.nid_to_publickeys[survivor][0])
                    for survivor in state.nid_to_neighbours[gone] & survivors
                }
                for gone in dropped
            },
            modulus=state.mod_range,
        )
        del state.aggregate_ndarrays
        total, share_sum = split_share(total, has_share=self.strategy.carries_share)
        mean = decode_weighted_mean(
            total, num_summed=len(survivors), clipping_range=state.clipping_range,
            quantization_range=state.quantization_range,
        )
        if share_sum is not None:  # only once the update's sum decoded: a halted round moves no centroid either
            self.strategy.note_secure_sum(share_sum, num_summed=len(survivors), nodes=survivors)
        _hand_to_strategy(mean, server_round, context, state)
        return True

    def _check_threshold(self, state: Any) -> bool:
        """Flower's check that every node keeps ``threshold`` live neighbours, for the nodes that matter: before the
        key exchange ends the live ones (a node that left shared no secret), then every node that shared keys."""
        nodes = state.sampled_node_ids if getattr(state, _KEYS_SHARED, False) else state.active_node_ids
        for node_id in nodes:
            if len(state.nid_to_neighbours[node_id] & state.active_node_ids) < state.threshold:
                logger.warning("secure aggregation halted: a client has fewer live neighbours than the threshold")
                return False
        return True

    def _halting_on_errors(self, stage: Callable[..., bool], grid: Grid, context: LegacyContext, state: Any) -> bool:
        """Runs one of Flower's stages; an error from handling a client's reply halts the round, one from privfed's own
        server code (strategy, driver) goes on up."""
        try:
            return stage(grid, context, state)
        except Exception as err:
            if _raised_by_privfed(err):
                raise
            logger.warning("secure aggregation halted: a client's reply broke the protocol (%s: %s)", type(err).__name__, err)
            return False


def replies_as_they_arrive(grid: Grid, messages: list[Message], *, timeout: float | None) -> Iterator[Message]:
    """``Grid.send_and_receive``, one reply at a time, so the caller can drop each before the next is pulled."""
    waiting = set(grid.push_messages(messages))
    deadline = None if timeout is None else time.monotonic() + timeout
    while waiting and (deadline is None or time.monotonic() < deadline):
        arrived = list(grid.pull_messages(list(waiting)))
        waiting.difference_update(reply.metadata.reply_to_message_id for reply in arrived)
        if not arrived:
            time.sleep(PULL_INTERVAL)
        arrived.reverse()
        while arrived:
            yield arrived.pop()  # no reference kept here once handed over


def _masked_vector_request(node: int, state: Any, server_round: int, views: dict[int, bytes]) -> Message:
    """The request for one node's masked vector: its fit instructions and the key shares forwarded to it, each with
    its sender's signature on the view it shared its keys in."""
    content = state.nid_to_fitins[node]
    content.config_records[RECORD_KEY_CONFIGS] = ConfigRecord(
        {
            SecAggKey.STAGE: Stage.COLLECT_MASKED_VECTORS,
            SecAggKey.CIPHERTEXT_LIST: state.forward_ciphertexts[node],
            SecAggKey.SOURCE_LIST: state.forward_srcs[node],
            ids.VIEW_SIGNATURES_KEY: [views[source] for source in state.forward_srcs[node]],
        }
    )
    return Message(content=content, dst_node_id=node, message_type=MessageType.TRAIN, group_id=str(server_round))


def _signatures_on(
    grid: Grid, survivors: set[int], server_round: int, signed: SignedRound, *, timeout: float | None,
    failures: list[BaseException],
) -> dict[int, bytes]:
    """The consistency stage: every survivor is shown the survivor set; returns who signed it validly, and their
    signatures (an invalid one would make every node refuse the unmask request)."""
    requests = [
        Message(
            content=RecordDict({RECORD_KEY_CONFIGS: ConfigRecord(
                {SecAggKey.STAGE: ids.CONSISTENCY_STAGE, ids.SURVIVORS_KEY: sorted(survivors)}
            )}), dst_node_id=node,
            message_type=MessageType.TRAIN, group_id=str(server_round),
        )
        for node in sorted(survivors)
    ]
    signatures: dict[int, bytes] = {}
    for reply in grid.send_and_receive(requests, timeout=timeout):
        if reply.has_error():
            failures.append(Exception(reply.error))
            continue
        node = reply.metadata.src_node_id
        signature = reply.content.config_records.get(RECORD_KEY_CONFIGS, ConfigRecord()).get(ids.SURVIVORS_SIGNATURE_KEY)
        digest = signed.view_digests.get(node, b"")
        message = ids.survivors_message(digest, survivors)
        if node in survivors and isinstance(signature, bytes) and signed.signed_by(node, signature, message):
            signatures[node] = signature
        else:
            failures.append(Exception(f"node {node} did not sign the survivor set validly"))
    return signatures


def _share_request(
    node: int, neighbours: set[int], survivors: set[int], dropped: set[int], server_round: int,
    signatures: dict[int, bytes],
) -> Message:
    """The unmask request to one survivor: which of its neighbours survived and which dropped, with the survivors'
    signatures on that set."""
    signers = sorted(signatures)
    configs = ConfigRecord(
        {
            SecAggKey.STAGE: Stage.UNMASK,
            SecAggKey.ACTIVE_NODE_ID_LIST: sorted(neighbours & survivors),
            SecAggKey.DEAD_NODE_ID_LIST: sorted(neighbours & dropped),
            ids.SURVIVORS_KEY: sorted(survivors),
            ids.SIGNERS_KEY: signers,
            ids.SIGNATURES_KEY: [signatures[signer] for signer in signers],
        }
    )
    return Message(
        content=RecordDict({RECORD_KEY_CONFIGS: configs}), dst_node_id=node,
        message_type=MessageType.TRAIN, group_id=str(server_round),
    )


def _collect_shares(reply: Message, neighbours: set[int], shares: dict[int, list[bytes]]) -> None:
    """Adds one survivor's shares; shares of anyone but its neighbours, or twice of one, break the stage."""
    configs = reply.content.config_records[RECORD_KEY_CONFIGS]
    owners, values = record_list(configs[SecAggKey.NODE_ID_LIST], int), record_list(configs[SecAggKey.SHARE_LIST], bytes)
    if len(owners) != len(values) or len(set(owners)) != len(owners) or not set(owners) <= neighbours:
        raise ValueError(f"node {reply.metadata.src_node_id} sent shares that do not match its neighbours")
    for owner, share in zip(owners, values):
        shares[owner].append(share)


def _hand_to_strategy(mean: list[np.ndarray], server_round: int, context: LegacyContext, state: Any) -> None:
    """Gives the strategy the replies with the mean in place of each update, as Flower's workflow does."""
    parameters = ndarrays_to_parameters(mean)
    for _, res in state.legacy_results:
        res.parameters = parameters
    aggregated, metrics = context.strategy.aggregate_fit(server_round, state.legacy_results, state.failures)
    if aggregated:
        context.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(aggregated, True)
        context.history.add_metrics_distributed_fit(server_round=server_round, metrics=metrics)


#: Modules whose errors while handling replies are the clients' doing (a bad share rebuilds a bad secret).
_REPLY_HANDLING = {
    __name__, masking.__name__, secagg_masks.__name__, mask_pool.__name__, ids.__name__, privfed.records.__name__,
}


def _raised_by_privfed(err: BaseException) -> bool:
    """Whether privfed's server code (other than the reply handling here) is on the error's traceback."""
    modules = (str(frame.f_globals.get("__name__", "")) for frame, _ in traceback.walk_tb(err.__traceback__))
    return any(m.split(".")[0] in ("privfed", "mechanisms") and m not in _REPLY_HANDLING for m in modules)


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
        current_round = record_item(context.state.config_records[MAIN_CONFIGS_RECORD][Key.CURRENT_ROUND], int)
        self._secure(grid, context)
        self.strategy.close_round_without_aggregate(current_round)
