"""The ClientApp's mods: a training update never leaves a node unmasked when SecAgg+ is expected."""

from __future__ import annotations

import pytest
from flwr.app import ConfigRecord, Context, Message, Metadata, RecordDict
from flwr.app.message_type import MessageType

from privfed.federation.client_app import (
    FIT_CONFIG_RECORD,
    REQUIRE_SECAGG,
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
