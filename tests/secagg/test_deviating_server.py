"""What a server that deviates from SecAgg+ can do within one round: the disclosure docs/privacy.md makes.

The server here speaks privfed's protocol to real privfed client mods, and
every request it sends passes each node's own checks at its strictest
setting (``secagg-min-clients`` = all clients, a strict-majority threshold).
It forwards client X the shares of only ``threshold - 1`` neighbours (S),
so X masks with S alone, as if the others had dropped; then it tells every
other node that S dropped. Nobody is asked for both secrets of one node,
yet the server holds X's private seed and every pairwise key X used:
X's update comes out of X's masked vector alone. Stopping this needs
clients to agree on who survived (signed views, as in Bonawitz et al.,
2017), which Flower's SecAgg+ does not have.
"""

from __future__ import annotations

import flwr.compat.common.recorddict_compat as compat
import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.app.message_type import MessageType
from flwr.common import Code, FitRes, Status, bytes_to_ndarray, ndarrays_to_parameters
from flwr.common.secure_aggregation.crypto.shamir import combine_shares
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.supercore.task_identity import TaskIdentity

from privfed.federation.client_app import SECAGG_MIN_CLIENTS, check_secagg_round
from privfed.secagg.client_mod import privfed_secaggplus_mod
from privfed.secagg.masking import decode_weighted_mean, pairwise_seed, unmask_sum
from privfed.secagg.masks import PROTOCOL_KEY, PROTOCOL_VERSION
from privfed.secagg.settings import default_threshold

CLIPPING, LEVELS, MODULUS = 8.0, 2**22, 2**32


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    for name, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, name, value, raising=False)


class Nodes:
    """Real privfed client mods, each node checking every request with its strictest settings first."""

    def __init__(self, updates: dict[int, np.ndarray]) -> None:
        self.updates = updates
        minimum = {SECAGG_MIN_CLIENTS: len(updates)}
        self.contexts = {n: Context(run_id=1, node_id=n, node_config=minimum, state=RecordDict(), run_config={}) for n in updates}

    def ask(self, node: int, configs: dict) -> ConfigRecord:
        message = Message(RecordDict({RECORD_KEY_CONFIGS: ConfigRecord(configs)}), dst_node_id=node,
                          message_type=MessageType.TRAIN, group_id="1")
        context = self.contexts[node]
        check_secagg_round(message.content.config_records[RECORD_KEY_CONFIGS], context)
        reply = privfed_secaggplus_mod(message, context, self._fit(node))
        assert not reply.has_error(), reply.error
        return reply.content.config_records[RECORD_KEY_CONFIGS]

    def _fit(self, node: int):
        def fit(message: Message, context: Context) -> Message:
            res = FitRes(Status(Code.OK, "ok"), ndarrays_to_parameters([self.updates[node]]), 100, {})
            return Message(compat.fitres_to_recorddict(res, keep_input=True), reply_to=message)

        return fit


def keyed(count: int) -> tuple[Nodes, dict[int, np.ndarray], dict, dict[int, list[tuple[int, bytes]]]]:
    """Nodes after setup and key sharing; returns them, their updates, public keys and the shares sent to each."""
    rng = np.random.default_rng(count)
    updates = {100 + i: rng.uniform(-1, 1, 6) for i in range(count)}
    nodes, everyone = Nodes(updates), sorted(updates)
    setup = {Key.STAGE: Stage.SETUP, Key.SAMPLE_NUMBER: count, Key.SHARE_NUMBER: count,
             Key.THRESHOLD: default_threshold(count), Key.CLIPPING_RANGE: CLIPPING, Key.TARGET_RANGE: LEVELS,
             Key.MOD_RANGE: MODULUS, Key.MAX_WEIGHT: 100.0, PROTOCOL_KEY: PROTOCOL_VERSION}
    replies = {n: nodes.ask(n, dict(setup)) for n in everyone}
    public = {n: (reply[Key.PUBLIC_KEY_1], reply[Key.PUBLIC_KEY_2]) for n, reply in replies.items()}
    sent: dict[int, list[tuple[int, bytes]]] = {n: [] for n in everyone}  # destination -> (source, ciphertext)
    for n in everyone:
        shared = nodes.ask(n, {Key.STAGE: Stage.SHARE_KEYS, **{str(m): list(public[m]) for m in everyone}})
        for destination, ciphertext in zip(shared[Key.DESTINATION_LIST], shared[Key.CIPHERTEXT_LIST]):
            sent[destination].append((n, ciphertext))
    return nodes, updates, public, sent


def collect(nodes: Nodes, node: int, forwarded: list[tuple[int, bytes]]) -> list[np.ndarray]:
    sources, ciphertexts = zip(*forwarded)
    reply = nodes.ask(node, {Key.STAGE: Stage.COLLECT_MASKED_VECTORS, Key.SOURCE_LIST: list(sources),
                             Key.CIPHERTEXT_LIST: list(ciphertexts)})
    return [bytes_to_ndarray(b) for b in reply[Key.MASKED_PARAMETERS]]


def test_a_node_does_not_mask_with_fewer_neighbours_than_the_threshold_needs():
    """With no pairwise mask its private seed alone, which the threshold of others can rebuild, would unmask it."""
    nodes, _, _, sent = keyed(5)
    with pytest.raises(ValueError, match="neighbours' shares arrived"):
        collect(nodes, 100, sent[100][: default_threshold(5) - 2])


def withhold_and_unmask(count: int, targets: list[int], holders: list[int]) -> dict[int, np.ndarray]:
    """The attack: each target gets only the holders' shares, the holders are then called dropped.

    Returns each target's update as the server rebuilds it.
    """
    nodes, updates, public, sent = keyed(count)
    everyone = sorted(updates)
    forwarded = {n: [(s, c) for s, c in sent[n] if n not in targets or s in holders] for n in everyone}
    masked = {n: collect(nodes, n, forwarded[n]) for n in everyone}

    seed_shares = {t: [] for t in targets}
    key_shares = {s: [] for s in holders}
    for n in everyone:
        if n in targets:
            continue  # a target is not asked
        dead = [s for s in holders if s != n]
        alive = [m for m in everyone if m not in dead]
        answer = nodes.ask(n, {Key.STAGE: Stage.UNMASK, Key.ACTIVE_NODE_ID_LIST: alive, Key.DEAD_NODE_ID_LIST: dead})
        for owner, share in zip(answer[Key.NODE_ID_LIST], answer[Key.SHARE_LIST]):
            if owner in seed_shares:
                seed_shares[owner].append(share)
            elif owner in dead:  # a holder answers for itself as alive: that share is of its seed
                key_shares[owner].append(share)
    threshold = default_threshold(count)
    assert all(len(v) >= threshold for v in [*seed_shares.values(), *key_shares.values()])
    recovered = {}
    for target in targets:
        alone = unmask_sum(
            masked[target],
            private_seeds={target: combine_shares(seed_shares[target])},
            # The target added or took off each pairwise mask; unmask_sum undoes a dropped node's masks in its survivors.
            dropped_pairwise_seeds={
                s: {target: pairwise_seed(combine_shares(key_shares[s]), public[target][0])} for s in holders
            },
            modulus=MODULUS,
        )
        recovered[target] = decode_weighted_mean(alone, num_summed=1, clipping_range=CLIPPING, quantization_range=LEVELS)[0]
    return {t: np.abs(recovered[t] - updates[t]).max() for t in targets}


@pytest.mark.parametrize("count", [5, 7])
def test_a_server_that_withholds_shares_and_calls_the_holders_dropped_recovers_one_update(count):
    everyone = [100 + i for i in range(count)]
    holders = everyone[1 : default_threshold(count)]  # S: the only neighbours the target will mask with
    errors = withhold_and_unmask(count, [everyone[0]], holders)
    assert max(errors.values()) < 1e-4


def test_the_same_holders_unmask_several_clients_in_one_round():
    """docs/privacy.md: one withholding round can expose every client outside the holders and the threshold's helpers."""
    everyone = [100 + i for i in range(7)]
    threshold = default_threshold(7)
    holders, targets = everyone[: threshold - 1], everyone[threshold + 1 :]
    errors = withhold_and_unmask(7, targets, holders)
    assert len(errors) == 2 and max(errors.values()) < 1e-4
