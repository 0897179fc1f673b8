"""The ClientApp's mods: a training update never leaves a node unmasked when SecAgg+ is expected."""

from __future__ import annotations

import pytest
from flwr.app import ConfigRecord, Context, Message, Metadata, RecordDict
from flwr.app.message_type import MessageType

from privfed.federation.client_app import (
    FIT_CONFIG_RECORD,
    REQUIRE_SECAGG,
    SECAGG_MIN_CLIENTS,
    UnmaskedRoundRefused,
    secaggplus_when_requested,
)


def fit_message(**config) -> Message:
    content = RecordDict({FIT_CONFIG_RECORD: ConfigRecord(config)})
    metadata = Metadata(run_id=1, message_id="m", src_node_id=0, dst_node_id=1, reply_to_message_id="", group_id="1",
                        created_at=0.0, ttl=60.0, message_type=MessageType.TRAIN)
    return Message(metadata=metadata, content=content)


def context(**node_config) -> Context:
    return Context(run_id=1, node_id=1, node_config={"partition-id": 0, **node_config}, state=RecordDict(), run_config={})


class Recorder:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, msg: Message, ctx: Context) -> Message:
        self.calls += 1
        return msg


def test_a_secagg_round_without_secaggs_records_is_refused_before_the_client_trains():
    """A server that drops SecAgg+'s records from a SecAgg+ round would otherwise get the update in the clear."""
    client = Recorder()
    with pytest.raises(UnmaskedRoundRefused):
        secaggplus_when_requested(fit_message(task="train", secagg_scales=b"\x00"), context(), client)
    assert client.calls == 0


@pytest.mark.parametrize("flag", [True, "true"])
def test_a_node_that_requires_secagg_refuses_any_unmasked_training_round(flag):
    client = Recorder()
    with pytest.raises(UnmaskedRoundRefused):
        secaggplus_when_requested(fit_message(task="train"), context(**{REQUIRE_SECAGG: flag}), client)
    assert client.calls == 0


@pytest.mark.parametrize(
    "config,node",
    [({"task": "init"}, {REQUIRE_SECAGG: True}), ({"task": "train"}, {}), ({"task": "train"}, {REQUIRE_SECAGG: False})],
)
def test_round_zero_and_runs_without_secagg_go_through(config, node):
    client = Recorder()
    secaggplus_when_requested(fit_message(**config), context(**node), client)
    assert client.calls == 1


def secagg_message(**configs) -> Message:
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS

    content = RecordDict({RECORD_KEY_CONFIGS: ConfigRecord(configs)})  # only the collect stage carries the fit
    metadata = Metadata(run_id=1, message_id="m", src_node_id=0, dst_node_id=1, reply_to_message_id="", group_id="1",
                        created_at=0.0, ttl=60.0, message_type=MessageType.TRAIN)
    return Message(metadata=metadata, content=content)


def setup(sample: int, shares: int, threshold: int) -> Message:
    from privfed.secagg.masks import PROTOCOL_KEY, PROTOCOL_VERSION

    return secagg_message(stage="setup", sample_num=sample, share_num=shares, threshold=threshold, clipping_range=8.0,
                          target_range=2**22, mod_range=2**32, max_weight=100.0, **{PROTOCOL_KEY: PROTOCOL_VERSION})


@pytest.mark.parametrize("sample,shares,threshold", [(1, 1, 1), (5, 5, 1), (5, 5, 2), (2, 2, 2), (6, 6, 3)])
def test_a_node_with_a_minimum_refuses_a_secagg_round_that_cannot_hide_its_update(sample, shares, threshold):
    """A server running SecAgg+ with the node alone and threshold 1 would get the only share of its mask seed."""
    with pytest.raises(UnmaskedRoundRefused):
        secaggplus_when_requested(setup(sample, shares, threshold), context(**{SECAGG_MIN_CLIENTS: 3}), Recorder())


def test_a_node_with_a_minimum_refuses_too_few_neighbours_at_key_sharing():
    keys = {str(i): [b"a%d" % i, b"b%d" % i] for i in range(2)}
    with pytest.raises(UnmaskedRoundRefused, match="at least 3 neighbours, got 2"):
        secaggplus_when_requested(secagg_message(stage="share_keys", **keys), context(**{SECAGG_MIN_CLIENTS: 3}),
                                  Recorder())


def test_a_round_that_meets_the_minimum_goes_on_to_secagg(tmp_path):
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key

    from privfed.secagg.client_trust import SECAGG_IDENTITY, SECAGG_PEERS
    from privfed.secagg.identity import IDENTITY_FILE, PEERS_FILE, write_simulated_identities

    write_simulated_identities(tmp_path, 5)
    identity = {SECAGG_IDENTITY: str(tmp_path / IDENTITY_FILE.format(0)), SECAGG_PEERS: str(tmp_path / PEERS_FILE)}
    reply = secaggplus_when_requested(setup(5, 5, 3), context(**{SECAGG_MIN_CLIENTS: 3}, **identity), Recorder())
    assert not reply.has_error() and Key.PUBLIC_KEY_1 in reply.content.config_records[RECORD_KEY_CONFIGS]



@pytest.mark.parametrize("active,dead", [([1, 2, 3], [3]), ([2, 3], [1])])
def test_an_unmask_request_for_both_secrets_of_a_node_is_refused_whatever_the_node_config(active, dead):
    """Listing a node as surviving and dropped asks its neighbours for both of its secrets, which unmasks it."""
    message = secagg_message(stage="unmask", active_nids=active, dead_nids=dead)
    with pytest.raises(UnmaskedRoundRefused, match="both surviving and dropped"):
        secaggplus_when_requested(message, context(), Recorder())


def test_a_secagg_training_round_without_privfeds_settings_is_refused():
    """Without them the client would send its metrics beside the masked update, in plaintext."""
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS

    content = RecordDict({RECORD_KEY_CONFIGS: ConfigRecord({"stage": "collect_masked_vectors"}),
                          FIT_CONFIG_RECORD: ConfigRecord({"task": "train"})})
    metadata = Metadata(run_id=1, message_id="m", src_node_id=0, dst_node_id=1, reply_to_message_id="", group_id="1",
                        created_at=0.0, ttl=60.0, message_type=MessageType.TRAIN)
    with pytest.raises(UnmaskedRoundRefused, match="without privfed's SecAgg"):
        secaggplus_when_requested(Message(metadata=metadata, content=content), context(), Recorder())


def test_neighbours_are_counted_by_node_not_by_spelling():
    keys = {"7": [b"a", b"b"], "07": [b"c", b"d"], "8": [b"e", b"f"]}
    with pytest.raises(UnmaskedRoundRefused, match="got 2"):
        secaggplus_when_requested(secagg_message(stage="share_keys", **keys), context(**{SECAGG_MIN_CLIENTS: 3}),
                                  Recorder())


def collect_message(**fit) -> Message:
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS

    content = RecordDict({RECORD_KEY_CONFIGS: ConfigRecord({"stage": "collect_masked_vectors"}),
                          FIT_CONFIG_RECORD: ConfigRecord({"task": "train", "secagg_scales": b"\x00", **fit})})
    metadata = Metadata(run_id=1, message_id="m", src_node_id=0, dst_node_id=1, reply_to_message_id="", group_id="1",
                        created_at=0.0, ttl=60.0, message_type=MessageType.TRAIN)
    return Message(metadata=metadata, content=content)


SET_UP = {"max_weight": 100.0, "clipping_range": 8.0, "target_range": 2**22, "mod_range": 2**32}
ENCODED = {"secagg_max_weight": 100.0, "secagg_clipping_range": 8.0, "secagg_quantization_range": 2**22,
           "secagg_modulus_range": 2**32}


@pytest.mark.parametrize("key", sorted(ENCODED))
def test_a_fit_encoding_other_than_the_one_secagg_was_set_up_with_is_refused(key):
    """A client divides its flags by its weight ratio at the fit's max_weight; Flower multiplies at its own.
    If they differ a raised flag no longer adds exactly 1, and the sum names the client."""
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_STATE

    ctx = context()
    ctx.state.config_records[RECORD_KEY_STATE] = ConfigRecord(dict(SET_UP))
    with pytest.raises(UnmaskedRoundRefused, match=key):
        secaggplus_when_requested(collect_message(**{**ENCODED, key: ENCODED[key] * 2}), ctx, Recorder())
    with pytest.raises(UnmaskedRoundRefused, match="before SecAgg"):
        secaggplus_when_requested(collect_message(**ENCODED), context(), Recorder())
