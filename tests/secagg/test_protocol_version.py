"""The SecAgg+ protocol version: privfed's server and nodes run only privfed-secagg+/4 with each other.

Flower's own mask expansion is left as it is here, so a node on Flower's
own mod could take part if the server let it: the tests show it does not.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.app.message_type import MessageType
from flwr.client.mod.secure_aggregation.secaggplus_mod import secaggplus_mod
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, RECORD_KEY_STATE, Key, Stage
from flwr.supercore.task_identity import TaskIdentity

from benchmarks.secagg_harness import mean_of, run_round
from privfed.secagg.client_mod import MaskProtocolRefused, privfed_secaggplus_mod
from privfed.secagg.client_trust import SECAGG_IDENTITY, SECAGG_PEERS
from privfed.secagg.identity import IDENTITY_FILE, IDENTITY_KEY, PEERS_FILE, load_peers, write_simulated_identities
from privfed.secagg.masks import PROTOCOL_KEY, PROTOCOL_VERSION

TOLERANCE = 1e-3


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    for name, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, name, value, raising=False)


def updates(count: int, seed: int = 0) -> dict[int, tuple[list[np.ndarray], int]]:
    rng = np.random.default_rng(seed)
    return {100 + i: ([rng.uniform(-1, 1, 4)], 50 + 10 * i) for i in range(count)}


def test_a_client_on_flowers_own_masks_is_left_out_at_setup_and_the_others_are_summed():
    clients = updates(5)
    outcome = run_round(clients, shares=5, threshold=3, client_mods={101: secaggplus_mod})
    assert outcome.grid.reached[101] == [Stage.SETUP]  # never asked for shares or a masked vector
    assert outcome.completed and 101 not in outcome.strategy.aggregated_from
    assert np.abs(outcome.mean - mean_of(clients, [100, 102, 103, 104])).max() < TOLERANCE


def setup_message(protocol: str | None) -> Message:
    configs = {Key.STAGE: Stage.SETUP, Key.SAMPLE_NUMBER: 3, Key.SHARE_NUMBER: 3, Key.THRESHOLD: 2,
               Key.CLIPPING_RANGE: 8.0, Key.TARGET_RANGE: 2**22, Key.MOD_RANGE: 2**32, Key.MAX_WEIGHT: 100.0}
    if protocol is not None:
        configs[PROTOCOL_KEY] = protocol
    return Message(RecordDict({RECORD_KEY_CONFIGS: ConfigRecord(configs)}), dst_node_id=7, message_type=MessageType.TRAIN)


@pytest.mark.parametrize(
    "protocol",
    [None, "privfed-secagg+/1", "privfed-secagg+/2", "privfed-secagg+/3", "flower"],
    ids=["unstated", "older", "v2", "v3", "unknown"],
)
def test_a_node_refuses_a_server_on_another_protocol_before_it_makes_any_key(protocol):
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
    with pytest.raises(MaskProtocolRefused, match="masks only under"):
        privfed_secaggplus_mod(setup_message(protocol), context, lambda msg, ctx: pytest.fail("trained"))
    assert RECORD_KEY_STATE not in context.state.config_records  # no key pair was made, nothing to send


def test_a_node_answers_privfeds_setup_with_its_keys_and_its_protocol(tmp_path):
    """The node's identity comes from its node config, as in a deployment (files written as a simulation's are)."""
    write_simulated_identities(tmp_path, 3)
    node_config = {SECAGG_IDENTITY: str(tmp_path / IDENTITY_FILE.format(0)), SECAGG_PEERS: str(tmp_path / PEERS_FILE)}
    context = Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(), run_config={})
    reply = privfed_secaggplus_mod(setup_message(PROTOCOL_VERSION), context, lambda msg, ctx: pytest.fail("trained"))
    answered = reply.content.config_records[RECORD_KEY_CONFIGS]
    assert answered[PROTOCOL_KEY] == PROTOCOL_VERSION and Key.PUBLIC_KEY_1 in answered
    assert answered[IDENTITY_KEY] in load_peers(tmp_path / PEERS_FILE)
