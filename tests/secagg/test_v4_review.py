"""Review of protocol v4 as a deviating server would attack it (real privfed client mods, as in deviating_server.py).

Each test plays one attack the nodes stop, or shows the limit a claim states
(a sum holds t - c honest clients, not t).
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Context
from flwr.common import bytes_to_ndarray
from flwr.common.secure_aggregation.crypto.shamir import combine_shares
from flwr.common.secure_aggregation.secaggplus_constants import Key, Stage
from flwr.supercore.task_identity import TaskIdentity

from privfed.secagg import identity as ids
from privfed.secagg.client_agreement import AgreementRefused
from privfed.secagg.client_trust import NodeTrust, SignedRounds
from privfed.secagg.masking import decode_weighted_mean, pairwise_seed, unmask_sum
from privfed.secagg.masks import PROTOCOL_KEY, PROTOCOL_VERSION
from tests.secagg.deviating_server import CLIPPING, FIT_ROUND, LEVELS, MODULUS, Nodes


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    for name, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, name, value, raising=False)


class Cohort(Nodes):
    """Nodes with a chosen secagg-max-corrupt, whose contexts (and so their in-memory signed rounds) last across
    protocol instances, as a SuperNode's do."""

    def __init__(self, count: int, *, max_corrupt: int = 0) -> None:
        rng = np.random.default_rng(count)
        super().__init__({100 + i: rng.uniform(-1, 1, 6) for i in range(count)})
        self.max_corrupt = max_corrupt
        for context in self.contexts.values():
            context.node_config.clear()  # no secagg-min-clients: the rule under test is the node's 2t > n + c

    def trust_of(self, context: Context) -> NodeTrust:
        return NodeTrust(self.identities[context.node_id], self.max_corrupt, SignedRounds(None, context), run_key=1)


class Instance:
    """One protocol instance (setup, key sharing, masked vectors) over ``members``, every share forwarded."""

    def __init__(self, cohort: Cohort, members: list[int], threshold: int, *, thresholds: dict[int, int] | None = None):
        self.cohort, self.members, self.threshold = cohort, sorted(members), threshold
        n = len(members)
        self.setup_replies = {}
        for m in self.members:
            t = (thresholds or {}).get(m, threshold)
            self.setup_replies[m] = cohort.ask(m, {
                Key.STAGE: Stage.SETUP, Key.SAMPLE_NUMBER: n, Key.SHARE_NUMBER: n, Key.THRESHOLD: t,
                Key.CLIPPING_RANGE: CLIPPING, Key.TARGET_RANGE: LEVELS, Key.MOD_RANGE: MODULUS, Key.MAX_WEIGHT: 100.0,
                PROTOCOL_KEY: PROTOCOL_VERSION})
        self.public = {m: (r[Key.PUBLIC_KEY_1], r[Key.PUBLIC_KEY_2]) for m, r in self.setup_replies.items()}

    def share_keys_request(self) -> dict:
        r = self.setup_replies
        return {Key.STAGE: Stage.SHARE_KEYS, **{str(m): list(self.public[m]) for m in self.members},
                ids.ADVERT_NODES_KEY: self.members,
                ids.ADVERT_IDENTITIES_KEY: [r[m][ids.IDENTITY_KEY] for m in self.members],
                ids.ADVERT_SIGNATURES_KEY: [r[m][ids.ADVERT_SIGNATURE_KEY] for m in self.members]}

    def share(self) -> None:
        self.sent = {m: [] for m in self.members}
        self.views = {}
        for m in self.members:
            shared = self.cohort.ask(m, self.share_keys_request())
            self.views[m] = shared[ids.VIEW_SIGNATURE_KEY]
            for dst, ciphertext in zip(shared[Key.DESTINATION_LIST], shared[Key.CIPHERTEXT_LIST]):
                self.sent[dst].append((m, ciphertext))

    def collect_request(self, node: int, views: dict[int, bytes] | None = None) -> dict:
        views = self.views if views is None else views
        sources = [s for s, _ in self.sent[node]]
        return {Key.STAGE: Stage.COLLECT_MASKED_VECTORS, Key.SOURCE_LIST: sources,
                Key.CIPHERTEXT_LIST: [c for _, c in self.sent[node]],
                ids.VIEW_SIGNATURES_KEY: [views[s] for s in sources]}

    def collect(self, fit_round: int = FIT_ROUND) -> None:
        self.masked = {}
        for m in self.members:
            reply = self.cohort.ask(m, self.collect_request(m), fit_round=fit_round)
            self.masked[m] = [bytes_to_ndarray(b) for b in reply[Key.MASKED_PARAMETERS]]

    def sign(self, node: int, survivors: list[int]) -> bytes:
        reply = self.cohort.ask(node, {Key.STAGE: ids.CONSISTENCY_STAGE, ids.SURVIVORS_KEY: sorted(survivors)})
        return reply[ids.SURVIVORS_SIGNATURE_KEY]

    def unmask_request(self, node: int, survivors: list[int], signatures: dict[int, bytes]) -> dict:
        sources = {s for s, _ in self.sent[node]} | {node}
        return {Key.STAGE: Stage.UNMASK, Key.ACTIVE_NODE_ID_LIST: sorted(survivors),
                Key.DEAD_NODE_ID_LIST: sorted(sources - set(survivors)), ids.SURVIVORS_KEY: sorted(survivors),
                ids.SIGNERS_KEY: sorted(signatures), ids.SIGNATURES_KEY: [signatures[s] for s in sorted(signatures)]}


def keyed(cohort: Cohort, members: list[int], threshold: int) -> Instance:
    instance = Instance(cohort, members, threshold)
    instance.share()
    instance.collect()
    return instance


# --- The limit the claims state -----------------------------------------------------------------------------------

def test_with_corrupt_clients_a_signed_sum_holds_threshold_less_corrupt_honest_clients():
    """c = 1, n = 4, t = 3 (2t = 6 > n + c = 5: every node accepts). The server and corrupt node 103 make a
    survivor set {100, 101, 103}: t signers (103 among them), so it is unmasked; taking off 103's own update,
    the server holds the sum of two honest clients: t - c, what docs/privacy.md states. A ddp-sums node therefore
    counts t - c towards K_min (tests/federation/test_client_secure_sum.py)."""
    cohort = Cohort(4, max_corrupt=1)
    honest, corrupt = [100, 101], 103
    everyone = sorted(cohort.updates)
    instance = Instance(cohort, everyone, threshold=3)
    instance.share()
    instance.collect()
    survivors = [*honest, corrupt]
    signatures = {n: instance.sign(n, survivors) for n in survivors}
    seed_shares: dict[int, list[bytes]] = {n: [] for n in everyone}
    key_shares: dict[int, list[bytes]] = {n: [] for n in everyone}
    for n in survivors:
        answer = cohort.ask(n, instance.unmask_request(n, survivors, signatures))
        active = len(survivors)
        for i, (owner, share) in enumerate(zip(answer[Key.NODE_ID_LIST], answer[Key.SHARE_LIST])):
            (seed_shares if i < active else key_shares)[owner].append(share)
    seeds = {o: combine_shares(s) for o, s in seed_shares.items() if len(s) >= 3}
    keys = {o: combine_shares(s) for o, s in key_shares.items() if len(s) >= 3}
    assert set(seeds) == set(survivors) and set(keys) == {102}
    arrays = len(instance.masked[100])
    total = [sum(instance.masked[n][i] for n in survivors) % MODULUS for i in range(arrays)]
    dropped = {102: {n: pairwise_seed(keys[102], instance.public[n][0]) for n in survivors}}
    summed = unmask_sum(total, private_seeds={n: seeds[n] for n in survivors}, dropped_pairwise_seeds=dropped,
                        modulus=MODULUS)
    mean = decode_weighted_mean(summed, num_summed=3, clipping_range=CLIPPING, quantization_range=LEVELS)[0]
    honest_sum = mean * 3 - cohort.updates[corrupt]  # the corrupt node's update is the server's own
    np.testing.assert_allclose(honest_sum, cohort.updates[100] + cohort.updates[101], atol=1e-4)
    assert len(honest) == instance.threshold - 1  # t - c honest clients, and no fewer: that is the claim


# --- Attacks the nodes stop -------------------------------------------------------------------------------------

def test_a_second_instance_of_the_same_fit_round_is_signed_only_for_the_same_set():
    """Two instances of fit round 1 over 5 nodes: {100..103} signed in the first, so no node of it signs {100..102}
    or {100..104} in the second, and the two free nodes are fewer than t = 3. An earlier round (not the last one
    signed) is held too: docs/privacy.md "Replays" says the record holds only the last round, the code keeps all."""
    cohort = Cohort(5)
    everyone = sorted(cohort.updates)
    first = keyed(cohort, everyone, threshold=3)
    for n in everyone[:4]:
        first.sign(n, everyone[:4])
    second = Instance(cohort, everyone, threshold=3)
    second.share()
    second.collect(fit_round=2)
    for n in everyone[:3]:
        second.sign(n, everyone[:3])
    third = keyed(cohort, everyone, threshold=3)  # round 1 again
    for survivors in (everyone[:3], everyone):
        for n in set(survivors) & set(everyone[:4]):
            with pytest.raises(Exception, match="already signed another survivor set"):
                third.sign(n, survivors)
    assert third.sign(everyone[0], everyone[:4])  # the same set: an exact resume


def test_an_unmask_request_with_signatures_from_non_survivors_duplicates_or_too_few_is_refused():
    cohort = Cohort(5)
    everyone = sorted(cohort.updates)
    instance = keyed(cohort, everyone, threshold=3)
    survivors = everyone[:3]
    signatures = {n: instance.sign(n, survivors) for n in survivors[:2]}
    outsider = instance.views[everyone[4]]  # some other valid signature of node 104
    asks = [
        {**signatures, everyone[4]: outsider},  # a non-survivor's signature as the third
        {survivors[0]: signatures[survivors[0]], survivors[1]: signatures[survivors[1]]},  # two < t
    ]
    for padded in asks:
        with pytest.raises(AgreementRefused):
            cohort.ask(survivors[0], instance.unmask_request(survivors[0], survivors, padded))
    request = instance.unmask_request(survivors[0], survivors, signatures)
    request[ids.SIGNERS_KEY] = [survivors[0], survivors[1], survivors[0]]
    request[ids.SIGNATURES_KEY] = [signatures[survivors[0]], signatures[survivors[1]], signatures[survivors[0]]]
    with pytest.raises(AgreementRefused):
        cohort.ask(survivors[0], request)


def test_view_signatures_of_another_instance_and_the_node_itself_as_a_source_are_refused():
    cohort = Cohort(4)
    everyone = sorted(cohort.updates)
    old = Instance(cohort, everyone, threshold=3)
    old.share()
    new = Instance(cohort, everyone, threshold=3)  # restarts every node from setup, same round label
    new.share()
    with pytest.raises(AgreementRefused, match="cohort other than"):
        cohort.ask(100, new.collect_request(100, views=old.views), fit_round=FIT_ROUND)
    own = new.collect_request(100)
    own[Key.SOURCE_LIST] = [100, *own[Key.SOURCE_LIST][1:]]  # its own view signature verifies; its shares are not its
    with pytest.raises(ValueError):
        cohort.ask(100, own, fit_round=FIT_ROUND)


def test_a_threshold_shown_to_one_node_alone_makes_its_advertisement_fail_at_the_others():
    """Node 103 is set up with t = 4, the others with t = 3: they refuse its advert, it refuses theirs."""
    cohort = Cohort(4)
    everyone = sorted(cohort.updates)
    instance = Instance(cohort, everyone, threshold=3, thresholds={103: 4})
    for n in everyone:
        with pytest.raises(AgreementRefused, match="not signed by the identity"):
            cohort.ask(n, instance.share_keys_request())
