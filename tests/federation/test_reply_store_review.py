"""Review: the reply store reads another round's reply by its header alone; damaged files are never replies.

The store's contract (privfed/federation/reply_store.py): what is stored for
a round is read back exactly or not at all, and an unreadable file is
"treated as nothing stored, so the round is refused, never answered twice".
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from flwr.common import Code, FitRes, Parameters, Status

from privfed.federation.reply_store import ReplyStore, forget_replies, instructions_digest, reply_file, stored_round
from privfed.run.plan import plan_run
from tests.federation.test_declared_run import PARTITION, client, instructions

RUN = 1  # the Context's run id in test_declared_run.client
PAYLOAD = bytes(range(256)) * 40


def _reply(marker: bytes = b"") -> FitRes:
    return FitRes(Status(Code.OK, "ok"), Parameters([PAYLOAD + marker, b"abc" * 100], "numpy.ndarray"), 10,
                  {"round": 1, "blob": b"\x00\x01", "loss": 0.5, "flag": True, "name": "x"})


def test_a_stored_reply_reads_back_exactly_for_its_round_and_as_nothing_for_any_other(tmp_path):
    store = ReplyStore(reply_file(tmp_path, 0))
    store.answer(RUN, 3, "digest-3", _reply(b"3"))
    again = ReplyStore(reply_file(tmp_path, 0)).get(RUN, 3)  # a new process: only the file remains
    assert again is not None and again.digest == "digest-3" and not again.failed
    assert again.reply.parameters.tensors == _reply(b"3").parameters.tensors
    assert again.reply.metrics == _reply(b"3").metrics and again.reply.num_examples == 10
    assert all(type(again.reply.metrics[k]) is type(v) for k, v in _reply().metrics.items())
    for run, round_index in [(RUN, 2), (RUN, 4), (RUN + 1, 3), (0, 3)]:
        assert store.get(run, round_index) is None
    assert stored_round(reply_file(tmp_path, 0)) == 3


def test_a_reply_whose_bytes_were_damaged_is_never_read_back_as_a_reply(tmp_path):
    path = reply_file(tmp_path, 0)
    store = ReplyStore(path)
    store.answer(RUN, 1, "digest", _reply())
    raw = bytearray(path.read_bytes())
    raw[raw.find(PAYLOAD) + 1000] ^= 0xFF  # one byte of the stored update
    path.write_bytes(bytes(raw))
    try:
        got = store.get(RUN, 1)
    except Exception:  # refusing to read it is as good as nothing stored
        got = None
    assert got is None or got.reply is None
    assert store.get(RUN, 2) is None  # another round's check reads the header only, which is intact


def test_a_cut_short_reply_file_reads_as_nothing_stored_and_is_forgotten(tmp_path):
    path = reply_file(tmp_path, 0)
    ReplyStore(path).answer(RUN, 1, "digest", _reply())
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert ReplyStore(path).get(RUN, 1) is None and ReplyStore(path).get(RUN, 2) is None
    forget_replies(tmp_path, before=5)
    assert not path.exists()


@pytest.fixture
def plan(tiny_config, tmp_path):
    return plan_run(tiny_config.replace(mechanism="ldp", epsilon=2.0, rounds=3, out=str(tmp_path / "run")))


def _ledger_rounds(tmp_path) -> list[int]:
    path = tmp_path / "state" / f"privfed-ledger-partition-{PARTITION}.jsonl"
    return [json.loads(line)["round"] for line in path.read_text().splitlines()]


def test_a_damaged_reply_for_the_asked_round_is_never_answered_again_nor_charged_again(plan, tmp_path):
    ins = instructions(plan)
    first = client(plan, tmp_path).fit(ins)
    path = reply_file(tmp_path / "state", PARTITION)
    raw = bytearray(path.read_bytes())
    tensor = first.parameters.tensors[0]
    raw[raw.find(tensor[:64]) + 80] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(Exception):  # noqa: B017 - refused or failed: never a new computation nor the damaged bytes
        client(plan, tmp_path).fit(ins)
    assert _ledger_rounds(tmp_path) == [1]


def test_a_cut_short_reply_file_does_not_stop_the_node_from_answering_the_next_round(plan, tmp_path):
    ins = instructions(plan)
    client(plan, tmp_path).fit(ins)
    path = reply_file(tmp_path / "state", PARTITION)
    path.write_bytes(path.read_bytes()[:100])
    nxt = dataclasses.replace(ins, config={**ins.config, "round": 2})
    assert client(plan, tmp_path).fit(nxt).metrics["round"] == 2
    assert _ledger_rounds(tmp_path) == [1, 2]


def test_the_digest_binds_the_model_the_config_and_their_types(plan):
    """Two instructions that differ only in a value's type, or in where the model's bytes are cut, digest apart."""
    ins = instructions(plan)
    base = instructions_digest(ins)
    assert instructions_digest(dataclasses.replace(ins, config={**ins.config, "round": "1"})) != base
    assert instructions_digest(dataclasses.replace(ins, config={**ins.config, "round": 1.0})) != base
    tensors = ins.parameters.tensors
    moved = [tensors[0] + tensors[1][:1], tensors[1][1:], *tensors[2:]]
    assert instructions_digest(dataclasses.replace(ins, parameters=Parameters(moved, ins.parameters.tensor_type))) != base
