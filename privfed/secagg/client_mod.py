"""The client's side of privfed's SecAgg+: Flower's key exchange, privfed's masks and agreement checks.

Flower's ``secaggplus_mod`` runs the stages that exchange keys and shares;
the stage that masks the update is privfed's (:func:`_masked_vectors_stage`),
so Flower's 32-bit mask expansion is never called. Around every stage the
node runs the checks of :mod:`privfed.secagg.client_agreement` (signed keys,
one view, one signed survivor set), and adds the consistency stage. At
setup, before making any key, the node refuses a server that does not state
:data:`~privfed.secagg.masks.PROTOCOL_VERSION`, and answers with it.
"""

from __future__ import annotations

from collections.abc import Callable

import flwr.compat.common.recorddict_compat as compat
import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.client.mod.secure_aggregation.secaggplus_mod import (
    SecAggPlusState,
    check_configs,
    check_stage,
    secaggplus_mod,
)
from flwr.common import bytes_to_ndarray, ndarray_to_bytes, parameters_to_ndarrays
from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, RECORD_KEY_STATE, Key, Stage
from flwr.common.secure_aggregation.secaggplus_utils import share_keys_plaintext_separate

from privfed.records import record_item, record_list
from privfed.secagg import client_agreement as agreement
from privfed.secagg.client_trust import TrustOf, node_trust
from privfed.secagg.identity import CONSISTENCY_STAGE
from privfed.secagg.masking import SHARE_KEY, encode_update, mask_update, pairwise_seed
from privfed.secagg.masks import PROTOCOL_KEY, PROTOCOL_VERSION

CallNext = Callable[[Message, Context], Message]

#: Where Flower's legacy compat layer keeps a fit reply's metrics, and a fit request's configuration.
FITRES_METRICS = "fitres.metrics"
FIT_CONFIG = "fitins.config"


class MaskProtocolRefused(RuntimeError):
    """The server runs a SecAgg+ protocol other than this node's (e.g. Flower's 32-bit masks): nothing is sent."""


def privfed_secaggplus_mod(
    msg: Message, context: Context, call_next: CallNext, *, trust_of: TrustOf = node_trust
) -> Message:
    """One SecAgg+ stage of a training message, with privfed's masks and checks (``trust_of``: the node's trust)."""
    configs = msg.content.config_records[RECORD_KEY_CONFIGS]
    stage = configs.get(Key.STAGE)
    if stage == Stage.SETUP:
        check_protocol(configs)
        del configs[PROTOCOL_KEY]  # Flower's setup reads only its own keys
        trust = trust_of(context)  # before any key is made: a node without an identity takes no part
        agreement.check_threshold_rule(configs, trust.max_corrupt)
        reply = secaggplus_mod(msg, context, call_next)
        if not reply.has_error():
            answer = reply.content.config_records[RECORD_KEY_CONFIGS]
            answer[PROTOCOL_KEY] = PROTOCOL_VERSION
            agreement.advertise(answer, msg, context, configs, trust)
        return reply
    if stage == Stage.SHARE_KEYS:
        trust = trust_of(context)
        agreement.accept_view(configs, context, trust)
        reply = secaggplus_mod(msg, context, call_next)
        if not reply.has_error():
            agreement.sign_view(reply.content.config_records[RECORD_KEY_CONFIGS], context, trust)
        return reply
    if stage == Stage.COLLECT_MASKED_VECTORS:
        return _masked_vectors_stage(msg, context, call_next)
    if stage == CONSISTENCY_STAGE:
        signature = agreement.sign_survivors(configs, context, trust_of(context))
        return Message(RecordDict({RECORD_KEY_CONFIGS: signature}), reply_to=msg)
    if stage == Stage.UNMASK:
        agreement.check_unmask(configs, context)
    return secaggplus_mod(msg, context, call_next)


def check_protocol(configs: ConfigRecord) -> None:
    """Refuses a setup whose server does not state this node's protocol version."""
    stated = configs.get(PROTOCOL_KEY)
    if stated != PROTOCOL_VERSION:
        raise MaskProtocolRefused(
            f"the server runs SecAgg+ protocol {stated!r}; this node masks only under {PROTOCOL_VERSION!r} "
            "(unstated: Flower's own masks, whose 32-bit seeds a server can search)"
        )


def _masked_vectors_stage(msg: Message, context: Context, call_next: CallNext) -> Message:
    """Stores the neighbours' shares, trains, and replies with the masked update (and share) alone."""
    if RECORD_KEY_STATE not in context.state.config_records:
        raise MaskProtocolRefused("a masked-vector request before this node set SecAgg+ up")
    state = SecAggPlusState(**context.state.config_records[RECORD_KEY_STATE])
    configs = msg.content.config_records[RECORD_KEY_CONFIGS]
    check_stage(state.current_stage, configs)
    state.current_stage = str(configs.pop(Key.STAGE))
    agreement.check_sources(configs, context)
    check_configs(state.current_stage, configs)
    neighbours = _store_neighbour_shares(state, configs)
    agreement.record_sources(context, neighbours, _fit_round(msg))

    reply = call_next(msg, context)
    if reply.has_error():
        return reply
    fitres = compat.recorddict_to_fitres(reply.content, keep_input=True)
    share = take_share(reply)
    encoded = encode_update(
        parameters_to_ndarrays(fitres.parameters),
        fitres.num_examples,
        max_weight=state.max_weight,
        clipping_range=state.clipping_range,
        quantization_range=state.target_range,
        share=share,
    )
    masked = mask_update(
        encoded,
        node_id=state.nid,
        private_seed=state.rd_seed,
        pairwise_seeds={n: pairwise_seed(state.sk1, state.public_keys_dict[n][0]) for n in neighbours},
        modulus=state.mod_range,
    )
    for arrays in reply.content.array_records.values():
        arrays.clear()  # the plaintext update never leaves the node
    context.state.config_records[RECORD_KEY_STATE] = ConfigRecord(state.to_dict())
    reply.content.config_records[RECORD_KEY_CONFIGS] = ConfigRecord(
        {Key.MASKED_PARAMETERS: [ndarray_to_bytes(array) for array in masked]}, False
    )
    return Message(reply.content, reply_to=msg)


def _fit_round(msg: Message) -> int:
    """The training round a masked-vector request asks for (a replay is known by it, not by Flower's group id)."""
    fit = msg.content.config_records.get(FIT_CONFIG)
    if fit is None or "round" not in fit:
        raise agreement.AgreementRefused("a masked-vector request without its training round")
    return record_item(fit["round"], int)


def take_share(reply: Message) -> np.ndarray | None:
    """Removes a secure-sum mechanism's share from the reply's plaintext metrics and returns it (None: none)."""
    share = reply.content.config_records[FITRES_METRICS].pop(SHARE_KEY, None)
    if share is None:
        return None
    if not isinstance(share, bytes):
        raise ValueError(f"the client's share is {type(share).__name__}, not bytes")
    return bytes_to_ndarray(share)


def _store_neighbour_shares(state: SecAggPlusState, configs: ConfigRecord) -> list[int]:
    """Decrypts the shares the neighbours sent through the server; returns who sent them: the neighbours to mask with,
    since the server can rebuild only their pairwise keys if they drop."""
    sources = record_list(configs[Key.SOURCE_LIST], int)
    ciphertexts = record_list(configs[Key.CIPHERTEXT_LIST], bytes)
    if len(sources) != len(ciphertexts):
        raise ValueError("the server's share lists differ in length")
    if len(ciphertexts) + 1 < state.threshold:
        raise ValueError(f"{len(ciphertexts)} neighbours' shares arrived; the threshold needs {state.threshold - 1}")
    if len(set(sources)) != len(sources):
        raise ValueError("the server forwarded one neighbour's shares twice")
    for source, ciphertext in zip(sources, ciphertexts):
        if source not in state.ss2_dict:
            raise ValueError(f"node {state.nid} got shares from node {source}, which is not its neighbour")
        sender, receiver, seed_share, key_share = share_keys_plaintext_separate(decrypt(state.ss2_dict[source], ciphertext))
        if sender != source or receiver != state.nid:
            raise ValueError(f"node {state.nid} got node {sender}'s shares for node {receiver} labelled as node {source}'s")
        state.rd_seed_share_dict[source] = seed_share
        state.sk1_share_dict[source] = key_share
    return sources
