"""A node's checks against a deviating server (privfed/secagg/client_agreement.py), stage by stage.

Real privfed client mods answer a server played here step by step
(:class:`Cohort`): it sets the nodes up and relays their keys, shares and
signatures honestly, and each test deviates at one step, the way a server
that does not follow the protocol could. Every refusal is
raised before the node answers, so nothing of that stage leaves it:
:class:`AgreementRefused`, or a ``ValueError`` for a missing entry and an
``IdentityError`` from the node's durable record of signed sets.
"""

from __future__ import annotations

import flwr.compat.common.recorddict_compat as compat
import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.app.message_type import MessageType
from flwr.client.mod.secure_aggregation.secaggplus_mod import SecAggPlusState
from flwr.common import Code, FitRes, Status, bytes_to_ndarray, ndarrays_to_parameters
from flwr.common.secure_aggregation.crypto.shamir import combine_shares
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, RECORD_KEY_STATE, Key, Stage
from flwr.supercore.primitives.asymmetric import generate_key_pairs, public_key_to_bytes

from privfed.secagg import identity as ids
from privfed.secagg.client_agreement import AgreementRefused
from privfed.secagg.client_mod import FIT_CONFIG, privfed_secaggplus_mod
from privfed.secagg.client_trust import SECAGG_IDENTITY, SECAGG_MAX_CORRUPT, SECAGG_PEERS, NodeTrust, SignedRounds
from privfed.secagg.masking import decode_weighted_mean, pairwise_seed, unmask_sum
from privfed.secagg.masks import PROTOCOL_KEY, PROTOCOL_VERSION
from tests.secagg.harness import in_process_secagg  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("in_process_secagg")

RUN, LABEL, FIT_ROUND = 1, "1", 1
CLIPPING, LEVELS, MODULUS = 8.0, 2**22, 2**32


def setup_configs(sample: int, shares: int, threshold: int) -> dict:
    return {Key.STAGE: Stage.SETUP, Key.SAMPLE_NUMBER: sample, Key.SHARE_NUMBER: shares, Key.THRESHOLD: threshold,
            Key.CLIPPING_RANGE: CLIPPING, Key.TARGET_RANGE: LEVELS, Key.MOD_RANGE: MODULUS, Key.MAX_WEIGHT: 100.0,
            PROTOCOL_KEY: PROTOCOL_VERSION}


def server_keys() -> list[bytes]:
    """Two round keys the server makes itself, to pose as a node."""
    return [public_key_to_bytes(generate_key_pairs()[1]) for _ in range(2)]


def stranger() -> ids.NodeIdentity:
    """An identity no node pins (the server's own)."""
    return ids.simulated_identities(1)[0]


class Cohort:
    """Nodes 100, 101, ... on real privfed client mods, and an honest server's steps, each one callable alone.

    Every node pins every cohort identity and one more, ``outsider``: a
    pinned client that is not in this round (its key is at hand here, as a
    corrupt client's would be to the server).
    """

    def __init__(self, count: int = 5) -> None:
        self.nodes = [100 + i for i in range(count)]
        self.threshold = count // 2 + 1  # the smallest strict majority
        *cohort, self.outsider = ids.simulated_identities(count + 1)
        self.identities = dict(zip(self.nodes, cohort))
        rng = np.random.default_rng(count)
        self.updates = {n: rng.uniform(-1, 1, 6) for n in self.nodes}
        self.contexts = {n: Context(run_id=RUN, node_id=n, node_config={}, state=RecordDict(), run_config={})
                         for n in self.nodes}

    def trust_of(self, context: Context) -> NodeTrust:
        identity = self.identities[context.node_id]
        return NodeTrust(identity, max_corrupt=0, signed=SignedRounds(None, context), run_key=RUN)

    def ask(self, node: int, configs: dict, *, fit_round: int | None = None) -> ConfigRecord:
        content = RecordDict({RECORD_KEY_CONFIGS: ConfigRecord(configs)})
        if fit_round is not None:
            content.config_records[FIT_CONFIG] = ConfigRecord({"round": fit_round})
        message = Message(content, dst_node_id=node, message_type=MessageType.TRAIN, group_id=LABEL)
        reply = privfed_secaggplus_mod(message, self.contexts[node], self._fit(node), trust_of=self.trust_of)
        assert not reply.has_error(), reply.error
        return reply.content.config_records[RECORD_KEY_CONFIGS]

    def _fit(self, node: int):
        def fit(message: Message, context: Context) -> Message:
            res = FitRes(Status(Code.OK, "ok"), ndarrays_to_parameters([self.updates[node]]), 100, {})
            return Message(compat.fitres_to_recorddict(res, keep_input=True), reply_to=message)

        return fit

    # The honest server, one stage at a time.
    def set_up(self) -> Cohort:
        count = len(self.nodes)
        self.setup = {n: self.ask(n, setup_configs(count, count, self.threshold)) for n in self.nodes}
        self.shares: dict[int, dict[int, bytes]] = {n: {} for n in self.nodes}  # destination -> source -> ciphertext
        self.views: dict[int, bytes] = {}
        self.masked: dict[int, list[np.ndarray]] = {}
        return self

    def keys_of(self, node: int) -> list[bytes]:
        return [self.setup[node][Key.PUBLIC_KEY_1], self.setup[node][Key.PUBLIC_KEY_2]]

    def advert(self, node: int, identity: ids.NodeIdentity, keys: list[bytes], **changed) -> bytes:
        """``identity``'s signature on ``node``'s advertisement of ``keys`` in this round (``changed``: other fields)."""
        count = len(self.nodes)
        fields = dict(run_id=RUN, round_label=LABEL, node_id=node, sample=count, shares=count, threshold=self.threshold,
                      pk1=keys[0], pk2=keys[1])
        return identity.sign(ids.advert_message(**{**fields, **changed}))

    def share_keys_request(self, node: int) -> dict:
        configs = {Key.STAGE: Stage.SHARE_KEYS, **{str(m): self.keys_of(m) for m in self.setup}}
        configs[ids.ADVERT_NODES_KEY] = sorted(self.setup)
        configs[ids.ADVERT_IDENTITIES_KEY] = [self.setup[m][ids.IDENTITY_KEY] for m in sorted(self.setup)]
        configs[ids.ADVERT_SIGNATURES_KEY] = [self.setup[m][ids.ADVERT_SIGNATURE_KEY] for m in sorted(self.setup)]
        return configs

    def share_keys(self) -> Cohort:
        for node in self.nodes:
            reply = self.ask(node, self.share_keys_request(node))
            for destination, ciphertext in zip(reply[Key.DESTINATION_LIST], reply[Key.CIPHERTEXT_LIST]):
                self.shares[destination][node] = ciphertext
            self.views[node] = reply[ids.VIEW_SIGNATURE_KEY]
        return self

    def masked_request(self, node: int, sources: list[int] | None = None) -> dict:
        sources = sorted(self.shares[node]) if sources is None else sources
        return {Key.STAGE: Stage.COLLECT_MASKED_VECTORS, Key.SOURCE_LIST: sources,
                Key.CIPHERTEXT_LIST: [self.shares[node][s] for s in sources],
                ids.VIEW_SIGNATURES_KEY: [self.views[s] for s in sources]}

    def send_masked(self, nodes: list[int] | None = None) -> Cohort:
        for node in self.nodes if nodes is None else nodes:
            reply = self.ask(node, self.masked_request(node), fit_round=FIT_ROUND)
            self.masked[node] = [bytes_to_ndarray(b) for b in reply[Key.MASKED_PARAMETERS]]
        return self

    def sign(self, node: int, survivors: list[int]) -> bytes:
        reply = self.ask(node, {Key.STAGE: ids.CONSISTENCY_STAGE, ids.SURVIVORS_KEY: survivors})
        return reply[ids.SURVIVORS_SIGNATURE_KEY]

    def unmask_request(self, survivors: list[int], signatures: dict[int, bytes]) -> dict:
        """Seed shares of the survivors, key shares of the others (all shared their keys), and who signed."""
        signers = sorted(signatures)
        return {Key.STAGE: Stage.UNMASK, Key.ACTIVE_NODE_ID_LIST: sorted(survivors),
                Key.DEAD_NODE_ID_LIST: sorted(set(self.nodes) - set(survivors)), ids.SURVIVORS_KEY: sorted(survivors),
                ids.SIGNERS_KEY: signers, ids.SIGNATURES_KEY: [signatures[s] for s in signers]}

    def view_digest(self) -> bytes:
        return ids.view_digest({n: (self.setup[n][ids.IDENTITY_KEY], *self.keys_of(n)) for n in self.setup})

    def survivors_signature(self, identity: ids.NodeIdentity, survivors: list[int]) -> bytes:
        return identity.sign(ids.survivors_message(self.view_digest(), survivors))

    def secrets(self, node: int) -> tuple[bytes, bytes]:
        state = SecAggPlusState(**self.contexts[node].state.config_records[RECORD_KEY_STATE])
        return state.rd_seed, state.sk1


def keyed_cohort() -> Cohort:
    return Cohort().set_up().share_keys()


def test_the_honest_exchange_unmasks_the_survivors_mean():
    """The helper's server, followed to the end: what every other test deviates from is a working round."""
    cohort = keyed_cohort().send_masked([100, 101, 102, 103])  # 104 shared its keys, then dropped
    survivors = [100, 101, 102, 103]
    signatures = {n: cohort.sign(n, survivors) for n in survivors}
    replies = [cohort.ask(n, cohort.unmask_request(survivors, signatures)) for n in survivors]
    shares: dict[int, list[bytes]] = {n: [] for n in cohort.nodes}
    for reply in replies:
        for owner, share in zip(reply[Key.NODE_ID_LIST], reply[Key.SHARE_LIST]):
            shares[owner].append(share)
    secrets = {owner: combine_shares(owner_shares) for owner, owner_shares in shares.items()}
    total = [np.mod(sum(arrays), MODULUS) for arrays in zip(*(cohort.masked[n] for n in survivors))]
    unmasked = unmask_sum(
        total, private_seeds={n: secrets[n] for n in survivors},
        dropped_pairwise_seeds={104: {n: pairwise_seed(secrets[104], cohort.keys_of(n)[0]) for n in survivors}},
        modulus=MODULUS,
    )
    mean = decode_weighted_mean(unmasked, num_summed=4, clipping_range=CLIPPING, quantization_range=LEVELS)[0]
    assert np.abs(mean - np.mean([cohort.updates[n] for n in survivors], axis=0)).max() < 1e-4


# Setup


@pytest.mark.parametrize("count", [4, 5, 6, 7])
def test_setup_refuses_a_threshold_that_two_survivor_sets_could_both_reach(count):
    """2t <= n: two disjoint halves could each gather t signatures. The smallest strict majority is accepted."""
    cohort = Cohort(count)
    with pytest.raises(AgreementRefused, match="needs 2t > n"):
        cohort.ask(100, setup_configs(count, count, count // 2))
    assert RECORD_KEY_STATE not in cohort.contexts[100].state.config_records  # no key was made
    assert Key.PUBLIC_KEY_1 in cohort.ask(101, setup_configs(count, count, count // 2 + 1))


def test_setup_refuses_a_threshold_below_two_and_takes_two_clients_at_two():
    """t = 1 passes 2t > n for n = 1, but one share would rebuild a secret; two clients at threshold 2 pass."""
    cohort = Cohort(2)
    with pytest.raises(AgreementRefused, match="one share alone"):
        cohort.ask(100, setup_configs(1, 1, 1))
    assert Key.PUBLIC_KEY_1 in cohort.ask(101, setup_configs(2, 2, 2))


@pytest.mark.parametrize("corrupt, refused, accepted", [(1, 3, 4), (2, 3, 4), (3, 4, 5)])
def test_setup_refuses_a_threshold_that_the_corrupt_clients_of_the_node_config_could_help_reach_twice(
    tmp_path, corrupt, refused, accepted
):
    """With up to c corrupt clients signing both sets, a node needs 2t > n + c (five clients here)."""
    ids.write_simulated_identities(tmp_path, 5)
    config = {SECAGG_IDENTITY: str(tmp_path / ids.IDENTITY_FILE.format(0)), SECAGG_PEERS: str(tmp_path / ids.PEERS_FILE),
              SECAGG_MAX_CORRUPT: corrupt}

    def set_up(threshold: int) -> Message:
        context = Context(run_id=RUN, node_id=100, node_config=config, state=RecordDict(), run_config={})
        message = Message(RecordDict({RECORD_KEY_CONFIGS: ConfigRecord(setup_configs(5, 5, threshold))}),
                          dst_node_id=100, message_type=MessageType.TRAIN, group_id=LABEL)
        return privfed_secaggplus_mod(message, context, lambda msg, ctx: pytest.fail("trained"))

    with pytest.raises(AgreementRefused, match=f"2t > n \\+ {corrupt}"):
        set_up(refused)
    assert not set_up(accepted).has_error()


@pytest.mark.parametrize("sample, shares", [(7, 5), (25, 7), (5, 7)])
def test_setup_refuses_a_sparse_graph(sample, shares):
    """Shares with fewer clients than sampled: neighbourhoods the server chooses (and could make drop)."""
    cohort = Cohort(5)
    with pytest.raises(AgreementRefused, match="shares with every sampled client"):
        cohort.ask(100, setup_configs(sample, shares, shares))
    assert RECORD_KEY_STATE not in cohort.contexts[100].state.config_records


# Share keys: the advertisements


def test_an_advertisement_without_its_signature_is_refused():
    cohort = Cohort().set_up()
    request = cohort.share_keys_request(100)
    for key in (ids.ADVERT_NODES_KEY, ids.ADVERT_IDENTITIES_KEY, ids.ADVERT_SIGNATURES_KEY):
        del request[key][2]  # 102's keys are listed, its identity and signature are not
    with pytest.raises(AgreementRefused, match="do not match the neighbours"):
        cohort.ask(100, request)


def test_a_server_that_forwards_no_advertisement_at_all_is_refused():
    """Flower's own server sends the keys alone."""
    cohort = Cohort().set_up()
    request = {k: v for k, v in cohort.share_keys_request(100).items() if not k.startswith("privfed_")}
    with pytest.raises(ValueError, match="expected a list"):
        cohort.ask(100, request)


def signature_of_102(signature):
    """Puts ``signature(cohort)`` where 102's advertisement signature goes."""
    return lambda cohort, request: request[ids.ADVERT_SIGNATURES_KEY].__setitem__(2, signature(cohort))


WRONG_SIGNATURES = {
    "empty": signature_of_102(lambda c: b""),
    "the node's, on keys the server put in": lambda c, request: request.__setitem__("102", server_keys()),
    "the node's, on other round parameters": signature_of_102(
        lambda c: c.advert(102, c.identities[102], c.keys_of(102), threshold=4)
    ),
    "the node's, for another round": signature_of_102(
        lambda c: c.advert(102, c.identities[102], c.keys_of(102), round_label="2")
    ),
    "another pinned identity's": signature_of_102(lambda c: c.advert(102, c.identities[103], c.keys_of(102))),
}


@pytest.mark.parametrize("case", WRONG_SIGNATURES)
def test_an_advertisement_signed_wrongly_is_refused(case):
    cohort = Cohort().set_up()
    request = cohort.share_keys_request(100)
    WRONG_SIGNATURES[case](cohort, request)
    with pytest.raises(AgreementRefused, match="neighbour 102's advertisement is not signed"):
        cohort.ask(100, request)


def test_the_node_refuses_its_own_advertisement_altered():
    cohort = Cohort().set_up()
    request = cohort.share_keys_request(100)
    keys = server_keys()
    request["100"] = keys
    request[ids.ADVERT_SIGNATURES_KEY][0] = cohort.advert(100, cohort.identities[100], keys)  # even validly signed
    with pytest.raises(AgreementRefused, match="own advertisement altered"):
        cohort.ask(100, request)


def replace_neighbour(request: dict, old: int, new: int, keys: list[bytes], identity: bytes, signature: bytes) -> None:
    """The server lists ``new`` with ``keys`` and an advertisement in place of ``old``."""
    del request[str(old)]
    request[str(new)] = keys
    nodes = request[ids.ADVERT_NODES_KEY]
    at = nodes.index(old)
    nodes[at], request[ids.ADVERT_IDENTITIES_KEY][at], request[ids.ADVERT_SIGNATURES_KEY][at] = new, identity, signature


@pytest.mark.parametrize("node_id", [999, 102], ids=["in place of a neighbour", "under a neighbour's node id"])
def test_an_invented_neighbour_is_refused(node_id):
    """Keys and an advertisement that verifies, under an identity the node does not pin: the server's own."""
    cohort = Cohort().set_up()
    request, impostor, keys = cohort.share_keys_request(100), stranger(), server_keys()
    replace_neighbour(request, 102, node_id, keys, impostor.public, cohort.advert(node_id, impostor, keys))
    with pytest.raises(AgreementRefused, match=f"neighbour {node_id}'s identity is not one this node pins"):
        cohort.ask(100, request)


def test_one_neighbour_more_than_the_shares_is_refused():
    """Even a pinned client, validly signed: the node splits its secrets into exactly ``shares`` shares."""
    cohort = Cohort().set_up()
    request, keys = cohort.share_keys_request(100), server_keys()
    request["999"] = keys
    request[ids.ADVERT_NODES_KEY].append(999)
    request[ids.ADVERT_IDENTITIES_KEY].append(cohort.outsider.public)
    request[ids.ADVERT_SIGNATURES_KEY].append(cohort.advert(999, cohort.outsider, keys))
    with pytest.raises(AgreementRefused, match="6 neighbours for 5 shares"):
        cohort.ask(100, request)


def test_two_node_ids_carrying_one_identity_are_refused():
    """A corrupt client that signs a second advertisement, for a second seat: it would count twice towards t."""
    cohort = Cohort().set_up()
    request, keys, corrupt = cohort.share_keys_request(100), server_keys(), cohort.identities[103]
    replace_neighbour(request, 102, 999, keys, corrupt.public, cohort.advert(999, corrupt, keys))
    with pytest.raises(AgreementRefused, match="two neighbours carry one identity"):
        cohort.ask(100, request)


# Masked vector: the senders' views


def test_a_source_whose_view_signature_is_over_another_view_is_refused():
    """101 signed a cohort in which 104 had other keys: it shared its keys with someone else than 100 did."""
    cohort = keyed_cohort()
    other = {n: (cohort.setup[n][ids.IDENTITY_KEY], *cohort.keys_of(n)) for n in cohort.nodes}
    other[104] = (other[104][0], *server_keys())
    request = cohort.masked_request(100)
    at = request[Key.SOURCE_LIST].index(101)
    request[ids.VIEW_SIGNATURES_KEY][at] = cohort.identities[101].sign(ids.view_message(ids.view_digest(other)))
    with pytest.raises(AgreementRefused, match="neighbour 101 shared its keys in a cohort other than this node's"):
        cohort.ask(100, request, fit_round=FIT_ROUND)


def test_a_source_with_another_nodes_view_signature_is_refused():
    cohort = keyed_cohort()
    request = cohort.masked_request(100)
    at = request[Key.SOURCE_LIST].index(101)
    request[ids.VIEW_SIGNATURES_KEY][at] = cohort.views[102]  # a valid signature on the same view, by 102
    with pytest.raises(AgreementRefused, match="neighbour 101 shared its keys in a cohort"):
        cohort.ask(100, request, fit_round=FIT_ROUND)


def test_key_shares_forwarded_without_the_senders_view_signatures_are_refused():
    cohort = keyed_cohort()
    request = cohort.masked_request(100)
    request[ids.VIEW_SIGNATURES_KEY].pop()
    with pytest.raises(AgreementRefused, match="without their senders' views"):
        cohort.ask(100, request, fit_round=FIT_ROUND)


# Consistency: the survivor set a node signs


def masked_cohort() -> Cohort:
    return keyed_cohort().send_masked()


@pytest.mark.parametrize(
    "survivors, reason",
    [
        ([101, 102, 103, 104], "leaves out this node"),
        ([100, 101, 102, 103, 999], "sent this node no key shares"),
        ([100, 101], "this node unmasks for at least 3"),
        ([100, 101, 101, 102], "names a node twice"),
    ],
    ids=["omits the node", "names a stranger", "smaller than t", "names a node twice"],
)
def test_a_node_refuses_to_sign_a_survivor_set_it_cannot_stand_behind(survivors, reason):
    cohort = masked_cohort()
    with pytest.raises(AgreementRefused, match=reason):
        cohort.sign(100, survivors)
    assert cohort.sign(100, cohort.nodes)  # the set it can sign, it still does


def test_a_node_refuses_to_sign_a_survivor_that_sent_it_no_shares():
    """The server forwarded 100 only 101's and 102's shares, then calls 103 a survivor too: 100 did not mask with it."""
    cohort = keyed_cohort()
    cohort.ask(100, cohort.masked_request(100, sources=[101, 102]), fit_round=FIT_ROUND)
    with pytest.raises(AgreementRefused, match="1 node\\(s\\) that sent this node no key shares"):
        cohort.sign(100, [100, 101, 102, 103])
    assert cohort.sign(100, [100, 101, 102])


def test_a_node_refuses_to_sign_before_it_sent_its_masked_vector():
    cohort = keyed_cohort()
    with pytest.raises(AgreementRefused, match="before this node sent its masked vector"):
        cohort.sign(100, cohort.nodes)


def test_a_node_signs_one_survivor_set_per_round():
    cohort = masked_cohort()
    signed = cohort.sign(100, [100, 101, 102, 103])
    assert cohort.sign(100, [103, 102, 101, 100]) == signed  # the same set again (Ed25519 signs deterministically)
    with pytest.raises(AgreementRefused, match="already signed another survivor set in this round"):
        cohort.sign(100, [100, 101, 102])


def test_a_replayed_round_is_signed_for_the_same_survivors_only():
    """Set up afresh for the same training round (a resumed run): new keys, but the node's record of the set stays."""
    cohort = masked_cohort()
    cohort.sign(100, [100, 101, 102, 103])
    cohort.set_up().share_keys().send_masked()  # a fresh instance: its own view, nothing signed in it yet
    with pytest.raises(ids.IdentityError, match="already signed another survivor set for round 1"):
        cohort.sign(100, [100, 101, 102])
    assert cohort.sign(100, [100, 101, 102, 103])


def test_the_next_training_round_may_have_other_survivors():
    cohort = masked_cohort()
    cohort.sign(100, [100, 101, 102, 103])
    cohort.set_up().share_keys()
    cohort.ask(100, cohort.masked_request(100), fit_round=FIT_ROUND + 1)
    assert cohort.sign(100, [100, 101, 102])


# Unmask: only for the set the node signed, behind t signatures


SURVIVORS = [100, 101, 102, 103]  # 104 shared its keys and sent its masked vector, then was called dropped


def signed_cohort() -> tuple[Cohort, dict[int, bytes]]:
    cohort = masked_cohort()
    return cohort, {n: cohort.sign(n, SURVIVORS) for n in SURVIVORS}


def test_unmask_is_refused_for_a_set_the_node_did_not_sign():
    cohort, _ = signed_cohort()
    other = [100, 101, 102]
    signatures = {n: cohort.survivors_signature(cohort.identities[n], other) for n in other}  # valid, on that set
    with pytest.raises(AgreementRefused, match="a survivor set this node did not sign"):
        cohort.ask(100, cohort.unmask_request(other, signatures))


def test_unmask_is_refused_by_a_node_that_signed_nothing():
    cohort = masked_cohort()
    signatures = {n: cohort.sign(n, SURVIVORS) for n in (101, 102, 103)}
    with pytest.raises(AgreementRefused, match="did not sign"):
        cohort.ask(100, cohort.unmask_request(SURVIVORS, signatures))


@pytest.mark.parametrize(
    "signers, reason",
    [([100, 101], "2 survivors signed the set; this node unmasks after 3"), ([100, 101, 101], "distinct survivors")],
    ids=["two signers", "one signer twice"],
)
def test_unmask_is_refused_with_fewer_than_t_signatures(signers, reason):
    cohort, signatures = signed_cohort()
    request = cohort.unmask_request(SURVIVORS, signatures)
    request[ids.SIGNERS_KEY] = signers
    request[ids.SIGNATURES_KEY] = [signatures[n] for n in signers]
    with pytest.raises(AgreementRefused, match=reason):
        cohort.ask(100, request)


FORGERIES = {
    "another survivor's signature": lambda cohort, signatures: signatures[103],
    "its signature on another set": lambda c, _: c.survivors_signature(c.identities[102], [100, 101, 102]),
    "a pinned non-survivor's": lambda c, _: c.survivors_signature(c.outsider, SURVIVORS),
    "garbage": lambda cohort, signatures: b"\x00" * 64,
}


@pytest.mark.parametrize("case", FORGERIES)
def test_unmask_is_refused_with_a_forged_signature_even_beside_t_valid_ones(case):
    cohort, signatures = signed_cohort()
    signatures[102] = FORGERIES[case](cohort, signatures)
    with pytest.raises(AgreementRefused, match="survivor 102's signature on the survivor set does not verify"):
        cohort.ask(100, cohort.unmask_request(SURVIVORS, signatures))


def test_unmask_is_refused_with_a_signature_of_a_node_outside_the_set():
    cohort, signatures = signed_cohort()
    signatures[104] = cohort.survivors_signature(cohort.identities[104], SURVIVORS)  # as a corrupt 104 would give it
    with pytest.raises(AgreementRefused, match="distinct survivors"):
        cohort.ask(100, cohort.unmask_request(SURVIVORS, signatures))


OTHER_LISTS = {
    "a dropped node also active (both its secrets)": ([*SURVIVORS, 104], [104]),
    "a survivor called dropped": ([100, 101, 102], [103, 104]),
    "a dropped node left out": (SURVIVORS, []),
    "a survivor left out": ([100, 101, 102], [104]),
}


@pytest.mark.parametrize("case", OTHER_LISTS)
def test_unmask_is_refused_when_the_lists_are_not_those_the_signed_set_implies(case):
    cohort, signatures = signed_cohort()
    request = cohort.unmask_request(SURVIVORS, signatures)
    request[Key.ACTIVE_NODE_ID_LIST], request[Key.DEAD_NODE_ID_LIST] = OTHER_LISTS[case]
    with pytest.raises(AgreementRefused, match="other shares than the signed survivor set implies"):
        cohort.ask(100, request)


# Two survivor sets in one round


def test_two_survivor_sets_shown_to_two_halves_get_no_share_revealed():
    """The server shows 100 and 101 one set (100 alive), 102 and 103 another (100 dropped): both secrets of 100.

    Each node signs only a set it is in, and one set per round, so neither set
    reaches t = 3 signatures, and no node reveals a share of anything.
    """
    cohort = masked_cohort()  # 104 sent its masked vector too; the server calls it dropped in both sets
    first, second = [100, 101, 102], [101, 102, 103]
    signatures = {
        tuple(first): {n: cohort.sign(n, first) for n in (100, 101)},
        tuple(second): {n: cohort.sign(n, second) for n in (102, 103)},
    }
    for node, shown in ((101, second), (102, first)):  # the server tries to win each node over to the other set
        with pytest.raises(AgreementRefused, match="already signed another"):
            cohort.sign(node, shown)
    assert all(len(by) < cohort.threshold for by in signatures.values())
    everything = {**signatures[tuple(first)], **signatures[tuple(second)]}
    for node in cohort.nodes:
        for survivors, by in signatures.items():
            for offered in (by, everything):
                with pytest.raises(AgreementRefused):
                    cohort.ask(node, cohort.unmask_request(list(survivors), offered))


def test_a_corrupt_client_beyond_the_declared_bound_gets_both_sets_signed():
    """Why ``secagg-max-corrupt`` matters: at t = 3 of 5 (enough for c = 0) one corrupt client that signs both sets
    gives each set t signatures, and the server rebuilds both secrets of node 100. A node declaring c = 1 refuses
    t = 3 at setup (test above)."""
    cohort = masked_cohort()
    corrupt = cohort.identities[104]
    first, second = [100, 101, 104], [102, 103, 104]  # 100 alive in the first, dropped in the second
    by_first = {**{n: cohort.sign(n, first) for n in (100, 101)}, 104: cohort.survivors_signature(corrupt, first)}
    by_second = {**{n: cohort.sign(n, second) for n in (102, 103)}, 104: cohort.survivors_signature(corrupt, second)}
    seed_shares = [cohort.ask(n, cohort.unmask_request(first, by_first)) for n in (100, 101)]
    key_shares = [cohort.ask(n, cohort.unmask_request(second, by_second)) for n in (102, 103)]
    held_by_104 = SecAggPlusState(**cohort.contexts[104].state.config_records[RECORD_KEY_STATE])

    def of_100(replies: list[ConfigRecord]) -> list[bytes]:
        return [r[Key.SHARE_LIST][r[Key.NODE_ID_LIST].index(100)] for r in replies]

    seed, key = cohort.secrets(100)
    assert combine_shares([*of_100(seed_shares), held_by_104.rd_seed_share_dict[100]]) == seed
    assert combine_shares([*of_100(key_shares), held_by_104.sk1_share_dict[100]]) == key
