"""A node's side of the checks that hold SecAgg+ against a deviating server (docs/privacy.md, "SecAgg+ against a
deviating server").

Bonawitz et al. (CCS 2017, §4) make SecAgg actively secure with signed key
advertisements and a consistency check. privfed's node does both and binds
each round to one cohort:

1. **Setup:** it refuses a sparse graph and a threshold ``t`` with
   ``2t <= n + c`` (``n`` shares, ``c`` its ``secagg-max-corrupt``), and
   signs its round keys with its identity.
2. **Share keys:** it accepts only neighbours whose advertisement a pinned
   identity signed, each identity once; it signs the view (every
   neighbour's id, identity and keys).
3. **Masked vector:** it stores a neighbour's key shares only if that
   neighbour signed the same view.
4. **Consistency:** it signs the survivor set the server announces only if
   it is among them, every survivor sent it shares, they number at least
   ``t``, and it signed no other set for this round (also across a replay).
5. **Unmask:** it reveals only for the set it signed, with at least ``t``
   survivors' valid signatures on it, and exactly the seed shares of the
   survivors and the key shares of the rest.

With at most ``c`` corrupt clients, two sets cannot both gather ``t``
signatures (``2(t - c) > n - c``), so no node's two secrets are both revealed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from flwr.app import ConfigRecord, Context, Message
from flwr.client.mod.secure_aggregation.secaggplus_mod import SecAggPlusState
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_STATE, Key, Stage

from privfed.records import record_item, record_list
from privfed.secagg import identity as ids
from privfed.secagg.client_trust import NodeTrust, SignedSurvivors

#: The node's record of the SecAgg+ round it is in (privfed's, beside Flower's own state).
ROUND_RECORD = "privfed_secagg_round"


class AgreementRefused(ValueError):
    """A request that a server following privfed's SecAgg+ would never send: the node answers nothing."""


@dataclass
class RoundView:
    """What this node saw of the round so far, kept in its context between stages."""

    run_id: int
    round_label: str
    sample: int
    shares: int
    threshold: int
    nodes: list[int] = field(default_factory=list)
    identities: list[bytes] = field(default_factory=list)
    digest: bytes = b""
    sources: list[int] = field(default_factory=list)
    fit_round: int = -1
    survivors: list[int] = field(default_factory=list)

    @staticmethod
    def load(context: Context) -> RoundView:
        record = context.state.config_records.get(ROUND_RECORD)
        if record is None:
            raise AgreementRefused("a SecAgg+ request before this node set the round up")
        read_int = {name: record_item(record[name], int) for name in ("run_id", "sample", "shares", "threshold", "fit_round")}
        return RoundView(
            **read_int, round_label=str(record["round_label"]), nodes=record_list(record["nodes"], int),
            identities=record_list(record["identities"], bytes), digest=record_item(record["digest"], bytes),
            sources=record_list(record["sources"], int), survivors=record_list(record["survivors"], int),
        )

    def save(self, context: Context) -> None:
        # Each list copied once; dataclasses.asdict would deep-copy every identity at every stage.
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        record = {name: list(value) if isinstance(value, list) else value for name, value in values.items()}
        context.state.config_records[ROUND_RECORD] = ConfigRecord(record)

    def identities_of(self, nodes: list[int]) -> list[bytes]:
        """Each node's identity in this view, in the order given (one lookup table, not a search per node)."""
        by_node = dict(zip(self.nodes, self.identities))
        try:
            return [by_node[node] for node in nodes]
        except KeyError as missing:
            raise AgreementRefused(f"node {missing} is not in the cohort this node shared its keys with") from None


def check_threshold_rule(configs: ConfigRecord, max_corrupt: int) -> None:
    """Refuses a sparse graph, and a threshold that two survivor sets could both reach (``2t <= n + c``)."""
    sample, shares, threshold = (record_item(configs[k], int) for k in (Key.SAMPLE_NUMBER, Key.SHARE_NUMBER, Key.THRESHOLD))
    if shares != sample:
        raise AgreementRefused(
            f"the server asks for {shares} shares among {sample} clients: privfed's SecAgg+ shares with every "
            "sampled client (a sparse graph is the server's to choose)"
        )
    if threshold < 2:
        raise AgreementRefused(f"threshold {threshold}: one share alone would rebuild this node's secrets")
    if 2 * threshold <= shares + max_corrupt:
        raise AgreementRefused(
            f"threshold {threshold} of {shares} shares: against a deviating server with up to {max_corrupt} corrupt "
            f"clients this node needs 2t > n + {max_corrupt}, t >= {(shares + max_corrupt) // 2 + 1}"
        )


def advertise(reply: ConfigRecord, msg: Message, context: Context, configs: ConfigRecord, trust: NodeTrust) -> None:
    """Signs the round keys Flower's setup made and starts this node's record of the round."""
    state = SecAggPlusState(**context.state.config_records[RECORD_KEY_STATE])
    view = RoundView(
        run_id=int(context.run_id), round_label=str(msg.metadata.group_id),
        sample=record_item(configs[Key.SAMPLE_NUMBER], int), shares=record_item(configs[Key.SHARE_NUMBER], int),
        threshold=record_item(configs[Key.THRESHOLD], int),
    )
    reply[ids.IDENTITY_KEY] = trust.identity.public
    reply[ids.ADVERT_SIGNATURE_KEY] = trust.identity.sign(_advert(view, state.nid, state.pk1, state.pk2))
    view.save(context)


def _advert(view: RoundView, node: int, pk1: bytes, pk2: bytes) -> bytes:
    return ids.advert_message(
        run_id=view.run_id, round_label=view.round_label, node_id=node, sample=view.sample, shares=view.shares,
        threshold=view.threshold, pk1=pk1, pk2=pk2,
    )


def accept_view(configs: ConfigRecord, context: Context, trust: NodeTrust) -> None:
    """Checks every neighbour's signed advertisement (and removes privfed's entries, which Flower would read as
    neighbours); records the view."""
    view = RoundView.load(context)
    nodes = record_list(configs.pop(ids.ADVERT_NODES_KEY, None), int)
    identities = record_list(configs.pop(ids.ADVERT_IDENTITIES_KEY, None), bytes)
    signatures = record_list(configs.pop(ids.ADVERT_SIGNATURES_KEY, None), bytes)
    keys = {int(node): value for node, value in configs.items() if node != Key.STAGE}
    if not (len(nodes) == len(identities) == len(signatures)) or sorted(nodes) != sorted(keys):
        raise AgreementRefused("the server's advertisements do not match the neighbours it lists")
    if len(set(identities)) != len(identities):
        raise AgreementRefused("two neighbours carry one identity")
    if len(keys) > view.shares:
        raise AgreementRefused(f"the server lists {len(keys)} neighbours for {view.shares} shares")
    state = SecAggPlusState(**context.state.config_records[RECORD_KEY_STATE])
    for node, identity, signature in zip(nodes, identities, signatures):
        if identity not in trust.identity.pinned:
            raise AgreementRefused(f"neighbour {node}'s identity is not one this node pins")
        pk1, pk2 = record_list(keys[node], bytes)
        if node == state.nid and (identity, pk1, pk2) != (trust.identity.public, state.pk1, state.pk2):
            raise AgreementRefused("the server shows this node's own advertisement altered")
        try:
            ids.verify(identity, signature, _advert(view, node, pk1, pk2))
        except ids.IdentityError:
            raise AgreementRefused(f"neighbour {node}'s advertisement is not signed by the identity it names") from None
    order = sorted(range(len(nodes)), key=lambda i: nodes[i])
    view.nodes = [nodes[i] for i in order]
    view.identities = [identities[i] for i in order]
    pairs = {node: record_list(keys[node], bytes) for node in view.nodes}
    view.digest = ids.view_digest({n: (i, pairs[n][0], pairs[n][1]) for n, i in zip(view.nodes, view.identities)})
    view.save(context)


def sign_view(reply: ConfigRecord, context: Context, trust: NodeTrust) -> None:
    reply[ids.VIEW_SIGNATURE_KEY] = trust.identity.sign(ids.view_message(RoundView.load(context).digest))


def check_sources(configs: ConfigRecord, context: Context) -> None:
    """Refuses key shares from a neighbour that did not sign this node's view (it shared its keys in another cohort)."""
    view = RoundView.load(context)
    sources = record_list(configs[Key.SOURCE_LIST], int)
    signatures = record_list(configs.pop(ids.VIEW_SIGNATURES_KEY, None), bytes)
    if len(signatures) != len(sources):
        raise AgreementRefused("the server forwards key shares without their senders' views")
    message = ids.view_message(view.digest)
    for source, identity, signature in zip(sources, view.identities_of(sources), signatures):
        try:
            ids.verify(identity, signature, message)
        except ids.IdentityError:
            raise AgreementRefused(f"neighbour {source} shared its keys in a cohort other than this node's") from None


def record_sources(context: Context, sources: list[int], fit_round: int) -> None:
    """Keeps who sent shares, and the training round the masked vector answered (what a replay is known by)."""
    view = RoundView.load(context)
    view.sources, view.fit_round = sorted(sources), fit_round
    view.save(context)


def sign_survivors(configs: ConfigRecord, context: Context, trust: NodeTrust) -> ConfigRecord:
    """The consistency stage: this node's signature on the announced survivor set, if it can stand behind it."""
    flower = SecAggPlusState(**context.state.config_records.get(RECORD_KEY_STATE, ConfigRecord()))
    if flower.current_stage != Stage.COLLECT_MASKED_VECTORS:
        raise AgreementRefused("a survivor set to sign before this node sent its masked vector")
    view = RoundView.load(context)
    survivors = record_list(configs.get(ids.SURVIVORS_KEY), int)
    if len(set(survivors)) != len(survivors):
        raise AgreementRefused("the survivor set names a node twice")
    if view.survivors and sorted(survivors) != view.survivors:
        raise AgreementRefused("this node already signed another survivor set in this round")
    own = flower.nid
    if own not in survivors:
        raise AgreementRefused("the survivor set leaves out this node, which sent its masked vector")
    strangers = set(survivors) - set(view.sources) - {own}
    if strangers:
        raise AgreementRefused(f"the survivor set names {len(strangers)} node(s) that sent this node no key shares")
    if len(survivors) < view.threshold:
        raise AgreementRefused(f"{len(survivors)} survivors; this node unmasks for at least {view.threshold}")
    identities = tuple(sorted(identity.decode() for identity in view.identities_of(survivors)))
    trust.signed.check_and_record(SignedSurvivors(trust.run_key, view.fit_round, identities))
    view.survivors = sorted(survivors)
    view.save(context)
    return ConfigRecord({ids.SURVIVORS_SIGNATURE_KEY: trust.identity.sign(ids.survivors_message(view.digest, survivors))})


def check_unmask(configs: ConfigRecord, context: Context) -> None:
    """Refuses an unmask request unless ``t`` survivors signed the set this node signed, and it asks exactly for
    the survivors' seed shares and the other senders' key shares (privfed's entries are removed for Flower)."""
    view = RoundView.load(context)
    survivors = record_list(configs.pop(ids.SURVIVORS_KEY, None), int)
    signers = record_list(configs.pop(ids.SIGNERS_KEY, None), int)
    signatures = record_list(configs.pop(ids.SIGNATURES_KEY, None), bytes)
    if not view.survivors or sorted(survivors) != view.survivors:
        raise AgreementRefused("the unmask request is for a survivor set this node did not sign")
    if len(signers) != len(signatures) or len(set(signers)) != len(signers) or not set(signers) <= set(survivors):
        raise AgreementRefused("the unmask request's signatures do not come from distinct survivors")
    message = ids.survivors_message(view.digest, survivors)
    for signer, identity, signature in zip(signers, view.identities_of(signers), signatures):
        try:
            ids.verify(identity, signature, message)
        except ids.IdentityError:
            raise AgreementRefused(f"survivor {signer}'s signature on the survivor set does not verify") from None
    if len(signers) < view.threshold:
        raise AgreementRefused(f"{len(signers)} survivors signed the set; this node unmasks after {view.threshold}")
    active = record_list(configs.get(Key.ACTIVE_NODE_ID_LIST), int)
    dead = record_list(configs.get(Key.DEAD_NODE_ID_LIST), int)
    own = SecAggPlusState(**context.state.config_records[RECORD_KEY_STATE]).nid
    senders = set(view.sources) | {own}
    if sorted(active) != view.survivors or sorted(dead) != sorted(senders - set(view.survivors)):
        raise AgreementRefused("the unmask request asks for other shares than the signed survivor set implies")
