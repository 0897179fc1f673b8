"""A server that withholds key shares from target clients, speaking protocol v4 to real privfed client mods.

:func:`play` runs one round: setup and key sharing as an honest server
would (adverts forwarded, view signatures forwarded with the shares), except
that each target gets the shares of the holders alone; then the consistency
stage with whatever survivor sets a strategy shows each node, and unmask
requests carrying the signatures gathered. A node's refusal is what a real
server would see: an error reply, recorded here with its exception.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import flwr.compat.common.recorddict_compat as compat
import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.app.message_type import MessageType
from flwr.common import Code, FitRes, Status, bytes_to_ndarray, ndarrays_to_parameters
from flwr.common.secure_aggregation.crypto.shamir import combine_shares
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage

from privfed.federation.client_app import SECAGG_MIN_CLIENTS, check_secagg_round
from privfed.secagg import identity as ids
from privfed.secagg.client_mod import FIT_CONFIG, privfed_secaggplus_mod
from privfed.secagg.client_trust import NodeTrust, SignedRounds
from privfed.secagg.masking import decode_weighted_mean, pairwise_seed, unmask_sum
from privfed.secagg.masks import PROTOCOL_KEY, PROTOCOL_VERSION
from privfed.secagg.settings import default_threshold

CLIPPING, LEVELS, MODULUS = 8.0, 2**22, 2**32
ROUND_LABEL, FIT_ROUND = "1", 1

#: ``shown(node) -> the survivor sets the server shows it, in turn`` (a node signs at most one).
Strategy = Callable[[int], list[frozenset[int]]]


class Nodes:
    """Real privfed client mods, each with its own identity pinning all of the round's, and its strictest settings."""

    def __init__(self, updates: dict[int, np.ndarray]) -> None:
        self.updates = updates
        minimum = {SECAGG_MIN_CLIENTS: len(updates)}
        self.contexts = {
            n: Context(run_id=1, node_id=n, node_config=minimum, state=RecordDict(), run_config={}) for n in updates
        }
        self.identities = dict(zip(updates, ids.simulated_identities(len(updates))))

    def trust_of(self, context: Context) -> NodeTrust:
        return NodeTrust(self.identities[context.node_id], max_corrupt=0, signed=SignedRounds(None, context), run_key=1)

    def ask(self, node: int, configs: dict, *, fit_round: int | None = None) -> ConfigRecord:
        """The node's reply to one request; raises what the node raises when it refuses."""
        content = RecordDict({RECORD_KEY_CONFIGS: ConfigRecord(configs)})
        if fit_round is not None:
            content[FIT_CONFIG] = ConfigRecord({"round": fit_round})
        message = Message(content, dst_node_id=node, message_type=MessageType.TRAIN, group_id=ROUND_LABEL)
        context = self.contexts[node]
        # check_secagg_round reads every share-keys entry but the stage as a node id: it is shown Flower's entries.
        flowers = {k: v for k, v in configs.items() if not str(k).startswith("privfed_")}
        check_secagg_round(flowers if configs.get(Key.STAGE) == Stage.SHARE_KEYS else configs, context)
        reply = privfed_secaggplus_mod(message, context, self._fit(node), trust_of=self.trust_of)
        assert not reply.has_error(), reply.error
        return reply.content.config_records[RECORD_KEY_CONFIGS]

    def _fit(self, node: int):
        def fit(message: Message, context: Context) -> Message:
            res = FitRes(Status(Code.OK, "ok"), ndarrays_to_parameters([self.updates[node]]), 100, {})
            return Message(compat.fitres_to_recorddict(res, keep_input=True), reply_to=message)

        return fit


@dataclass
class Keyed:
    """A round after setup and key sharing."""

    nodes: Nodes
    public: dict[int, tuple[bytes, bytes]]
    sent: dict[int, list[tuple[int, bytes]]]  # destination -> (source, ciphertext)
    views: dict[int, bytes]  # node -> its signature on its view

    @property
    def everyone(self) -> list[int]:
        return sorted(self.nodes.updates)

    @property
    def threshold(self) -> int:
        return default_threshold(len(self.everyone))

    def collect(self, node: int, forwarded: list[tuple[int, bytes]]) -> list[np.ndarray]:
        """The node's masked vector, given these neighbours' shares (each with its sender's view signature)."""
        sources = [s for s, _ in forwarded]
        reply = self.nodes.ask(
            node,
            {Key.STAGE: Stage.COLLECT_MASKED_VECTORS, Key.SOURCE_LIST: sources,
             Key.CIPHERTEXT_LIST: [c for _, c in forwarded], ids.VIEW_SIGNATURES_KEY: [self.views[s] for s in sources]},
            fit_round=FIT_ROUND,
        )
        return [bytes_to_ndarray(b) for b in reply[Key.MASKED_PARAMETERS]]


def keyed(count: int) -> Keyed:
    """``count`` nodes (ids 100, 101, ...) set up, with every advert forwarded to every node and keys shared."""
    rng = np.random.default_rng(count)
    nodes = Nodes({100 + i: rng.uniform(-1, 1, 6) for i in range(count)})
    everyone = sorted(nodes.updates)
    setup = {Key.STAGE: Stage.SETUP, Key.SAMPLE_NUMBER: count, Key.SHARE_NUMBER: count,
             Key.THRESHOLD: default_threshold(count), Key.CLIPPING_RANGE: CLIPPING, Key.TARGET_RANGE: LEVELS,
             Key.MOD_RANGE: MODULUS, Key.MAX_WEIGHT: 100.0, PROTOCOL_KEY: PROTOCOL_VERSION}
    replies = {n: nodes.ask(n, dict(setup)) for n in everyone}
    public = {n: (reply[Key.PUBLIC_KEY_1], reply[Key.PUBLIC_KEY_2]) for n, reply in replies.items()}
    share_keys = {Key.STAGE: Stage.SHARE_KEYS, **{str(m): list(public[m]) for m in everyone},
                  ids.ADVERT_NODES_KEY: everyone,
                  ids.ADVERT_IDENTITIES_KEY: [replies[m][ids.IDENTITY_KEY] for m in everyone],
                  ids.ADVERT_SIGNATURES_KEY: [replies[m][ids.ADVERT_SIGNATURE_KEY] for m in everyone]}
    sent: dict[int, list[tuple[int, bytes]]] = {n: [] for n in everyone}
    views = {}
    for n in everyone:
        shared = nodes.ask(n, dict(share_keys))
        views[n] = shared[ids.VIEW_SIGNATURE_KEY]
        for destination, ciphertext in zip(shared[Key.DESTINATION_LIST], shared[Key.CIPHERTEXT_LIST]):
            sent[destination].append((n, ciphertext))
    return Keyed(nodes, public, sent, views)


@dataclass
class Take:
    """What the server got."""

    threshold: int
    signatures: dict[frozenset[int], dict[int, bytes]] = field(default_factory=dict)  # set -> signer -> signature
    answered: dict[int, frozenset[int]] = field(default_factory=dict)  # node -> the set it revealed shares for
    seed_shares: dict[int, list[bytes]] = field(default_factory=dict)  # owner -> shares of its private seed
    key_shares: dict[int, list[bytes]] = field(default_factory=dict)  # owner -> shares of its first private key
    refusals: list[tuple[int, str, Exception]] = field(default_factory=list)  # node, stage, what it raised
    errors: dict[int, float] = field(default_factory=dict)  # target -> max error of the server's best rebuild

    def rebuilt(self, shares: dict[int, list[bytes]]) -> dict[int, bytes]:
        return {owner: combine_shares(s) for owner, s in shares.items() if len(s) >= self.threshold}

    def summary(self) -> str:
        signed = {tuple(sorted(u)): len(s) for u, s in self.signatures.items() if s}
        seeds, keys = sorted(self.rebuilt(self.seed_shares)), sorted(self.rebuilt(self.key_shares))
        return f"signers {signed}; answered {len(self.answered)}; seeds {seeds}; keys {keys}; errors {self.errors}"


def play(count: int, targets: list[int], holders: list[int], shown: Strategy) -> Take:
    """The attack: the targets get only the holders' shares; each node is shown ``shown(node)`` at the consistency
    stage; every node is then asked to unmask for each signed set, with its signatures, until one answers."""
    round_ = keyed(count)
    nodes, everyone = round_.nodes, round_.everyone
    forwarded = {n: [(s, c) for s, c in round_.sent[n] if n not in targets or s in holders] for n in everyone}
    sources = {n: {s for s, _ in forwarded[n]} for n in everyone}
    masked = {n: round_.collect(n, forwarded[n]) for n in everyone}
    take = Take(round_.threshold, seed_shares={n: [] for n in everyone}, key_shares={n: [] for n in everyone})

    def attempt(node: int, stage: str, configs: dict) -> ConfigRecord | None:
        try:
            return nodes.ask(node, configs)
        except Exception as err:  # a real server sees an error reply
            take.refusals.append((node, stage, err))
            return None

    for n in everyone:
        for survivors in shown(n):
            shown_set = {Key.STAGE: ids.CONSISTENCY_STAGE, ids.SURVIVORS_KEY: sorted(survivors)}
            reply = attempt(n, ids.CONSISTENCY_STAGE, shown_set)
            if reply is not None:
                take.signatures.setdefault(survivors, {})[n] = reply[ids.SURVIVORS_SIGNATURE_KEY]
    anything = {signer: s for signed in take.signatures.values() for signer, s in signed.items()}
    by_support = sorted(take.signatures.items(), key=lambda item: -len(item[1]))
    for n in everyone:
        # The lists a node accepts are those the set implies for it; the server knows them (it forwarded the shares).
        for survivors, signed in by_support:
            if n not in survivors:
                continue  # outside the set, it is one of the set's dropouts
            active, dead = sorted(survivors), sorted((sources[n] | {n}) - survivors)
            base = {Key.STAGE: Stage.UNMASK, Key.ACTIVE_NODE_ID_LIST: active, Key.DEAD_NODE_ID_LIST: dead,
                    ids.SURVIVORS_KEY: active}
            padded = {s: anything[s] for s in survivors if s in anything}  # with signatures on other sets too
            answer = None
            for signatures in [signed] if padded == signed else [signed, padded]:
                answer = attempt(n, Stage.UNMASK, {**base, ids.SIGNERS_KEY: sorted(signatures),
                                                   ids.SIGNATURES_KEY: [signatures[s] for s in sorted(signatures)]})
                if answer is not None:
                    break
            if answer is not None:
                take.answered[n] = survivors
                owners, shares = answer[Key.NODE_ID_LIST], answer[Key.SHARE_LIST]
                for i, (owner, share) in enumerate(zip(owners, shares)):
                    (take.seed_shares if i < len(active) else take.key_shares)[owner].append(share)
                break
    seeds, keys = take.rebuilt(take.seed_shares), take.rebuilt(take.key_shares)
    for target in targets:
        # The best the server can do with the target's masked vector: take off every mask whose seed it rebuilt.
        pairwise = {}
        for partner in sorted(sources[target]):
            if partner in keys:
                pairwise[partner] = {target: pairwise_seed(keys[partner], round_.public[target][0])}
            elif target in keys:
                pairwise[partner] = {target: pairwise_seed(keys[target], round_.public[partner][0])}
        alone = unmask_sum(masked[target], private_seeds={target: seeds[target]} if target in seeds else {},
                           dropped_pairwise_seeds=pairwise, modulus=MODULUS)
        try:
            rebuilt = decode_weighted_mean(alone, num_summed=1, clipping_range=CLIPPING, quantization_range=LEVELS)[0]
            take.errors[target] = float(np.abs(rebuilt - nodes.updates[target]).max())
        except ValueError:  # the masked weight decodes to no positive weight
            take.errors[target] = float("inf")
    return take
