"""A client asked again for a round it answered sends the same reply, and nothing is charged twice (issue 28, item 4).

The mechanism is ``ldp``: its noise comes from a secure source, so only a stored reply, never a recomputed one, can
be the same message again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
import torch
import torch.nn.functional as F
from flwr.common import FitIns, Parameters

from privfed.federation.client import ClientRoundFailed
from privfed.federation.messages import tensor_to_bytes
from privfed.federation.reply_store import ReplyStore, forget_replies, instructions_digest, reply_file
from privfed.privacy.client_guard import ClientGuard, RoundRefused, declared_budget
from privfed.run.plan import plan_run
from tests.federation.test_declared_run import PARTITION, client, instructions

RUN = 1  # the Context's run id in test_declared_run.client


@pytest.fixture
def plan(tiny_config, tmp_path):
    return plan_run(tiny_config.replace(mechanism="ldp", epsilon=2.0, out=str(tmp_path / "run")))


def ledger_rounds(tmp_path) -> list[int]:
    path = tmp_path / "state" / f"privfed-ledger-partition-{PARTITION}.jsonl"
    return [json.loads(line)["round"] for line in path.read_text().splitlines()]


def test_a_replayed_round_gets_the_same_reply_and_no_second_charge(plan, tmp_path):
    ins = instructions(plan)
    first = client(plan, tmp_path).fit(ins)
    again = client(plan, tmp_path).fit(ins)  # a new client process, as after a resume: only the files remain
    assert again.parameters.tensors == first.parameters.tensors and again.num_examples == first.num_examples
    assert again.metrics == first.metrics and "release_vectors" in first.metrics
    assert ledger_rounds(tmp_path) == [1]


def test_other_instructions_for_an_answered_round_are_refused(plan, tmp_path):
    ins = instructions(plan)
    client(plan, tmp_path).fit(ins)
    other = F.normalize(torch.randn(plan.config.num_global_centroids, plan.config.projection_dim), dim=1)
    with pytest.raises(RoundRefused, match="round 1 of run 1 was answered already, for other instructions"):
        client(plan, tmp_path).fit(dataclasses.replace(ins, config={**ins.config, "centroids": tensor_to_bytes(other)}))
    assert ledger_rounds(tmp_path) == [1]


def test_a_round_charged_but_killed_before_its_reply_is_computed_again_without_a_second_charge(plan, tmp_path):
    """What a kill while the client computed leaves: the round begun and charged, no reply stored (so none left)."""
    ins = instructions(plan)
    state = tmp_path / "state"
    state.mkdir()
    ReplyStore(state / f"privfed-reply-partition-{PARTITION}.npz").begin(RUN, 1, instructions_digest(ins))
    size = plan.client_sizes[PARTITION]
    guard = ClientGuard(declared_budget(plan.config, size), state / f"privfed-ledger-partition-{PARTITION}.jsonl")
    guard.admit(run=RUN, round_index=1, train=True)
    res = client(plan, tmp_path).fit(ins)
    assert res.metrics["round"] == 1 and "release_vectors" in res.metrics
    assert ledger_rounds(tmp_path) == [1]


def test_without_a_record_of_the_round_an_answered_round_is_still_refused(plan, tmp_path):
    """A ledger that charged the round but no stored reply nor begun record (e.g. written by an older privfed)."""
    ins = instructions(plan)
    client(plan, tmp_path).fit(ins)
    (tmp_path / "state" / f"privfed-reply-partition-{PARTITION}.npz").unlink()
    with pytest.raises(RoundRefused, match="comes after round 1 was answered"):
        client(plan, tmp_path).fit(ins)
    assert ledger_rounds(tmp_path) == [1]


def test_replies_no_resume_can_replay_are_forgotten(plan, tmp_path):
    """A simulation's clients keep their replies in the run directory: each is a model-sized file."""
    ins = instructions(plan)
    reply = client(plan, tmp_path).fit(ins)
    folder = tmp_path / "replies"
    folder.mkdir()
    for partition, round_index in [(0, 1), (1, 2), (2, 2)]:
        ReplyStore(reply_file(folder, partition)).answer(RUN, round_index, instructions_digest(ins), reply)
    forget_replies(folder, before=2)
    assert sorted(path.name for path in folder.iterdir()) == [reply_file(folder, p).name for p in (1, 2)]
    assert ReplyStore(reply_file(folder, 1)).get(RUN, 2).reply.parameters.tensors == reply.parameters.tensors
    forget_replies(folder)
    assert not list(folder.iterdir())


def test_a_refused_round_leaves_no_record_that_buys_an_uncharged_release(plan, tmp_path):
    """helper-4's sequence: a refusal used to write a "begun" record (over the stored reply), which a second ask with
    the same new instructions then passed off as charged-but-killed: a fresh release for no charge, repeatable."""
    ins = instructions(plan)
    first = client(plan, tmp_path).fit(ins)
    other = F.normalize(torch.randn(plan.config.num_global_centroids, plan.config.projection_dim), dim=1)
    elsewhere = dataclasses.replace(ins, config={**ins.config, "centroids": tensor_to_bytes(other)})
    for _ in range(2):
        with pytest.raises(RoundRefused, match="comes after round 1 was answered"):
            client(plan, tmp_path).fit(dataclasses.replace(ins, config={**ins.config, "round": 0}))
        for _ in range(2):
            with pytest.raises(RoundRefused, match="answered already, for other instructions"):
                client(plan, tmp_path).fit(elsewhere)
    assert ledger_rounds(tmp_path) == [1]
    assert client(plan, tmp_path).fit(ins).parameters.tensors == first.parameters.tensors  # the stored reply survived


def test_a_charged_round_that_failed_fails_again_instead_of_drawing_new_noise(plan, tmp_path):
    """A failure can depend on the data or the noise; a free retry would show the server one more bit each time."""
    ins = instructions(plan)
    state = tmp_path / "state"
    state.mkdir()
    store = ReplyStore(reply_file(state, PARTITION))
    store.fail(RUN, 1, instructions_digest(ins))
    with pytest.raises(ClientRoundFailed):
        client(plan, tmp_path).fit(ins)
    assert not (state / f"privfed-ledger-partition-{PARTITION}.jsonl").exists() or ledger_rounds(tmp_path) == []


def test_a_charged_round_whose_computation_fails_is_recorded_and_fails_again(plan, tmp_path):
    """Wherever after the charge it fails (here: centroids of the wrong width), asking again gets the failure."""
    ins = instructions(plan)
    wrong = F.normalize(torch.randn(plan.config.num_global_centroids, plan.config.projection_dim + 1), dim=1)
    broken = dataclasses.replace(ins, config={**ins.config, "centroids": tensor_to_bytes(wrong)})
    with pytest.raises(ClientRoundFailed):
        client(plan, tmp_path).fit(broken)
    assert ReplyStore(reply_file(tmp_path / "state", PARTITION)).get(RUN, 1).failed
    with pytest.raises(ClientRoundFailed):
        client(plan, tmp_path).fit(broken)
    assert ledger_rounds(tmp_path) == [1]


def test_a_second_message_for_a_round_in_progress_waits_and_gets_the_same_reply(plan, tmp_path, monkeypatch):
    """helper-5's race: the second ClientApp process saw the round begun and unanswered, took it for killed and
    computed a second release for one charge; now it waits for the first and is sent the first's reply."""
    import threading

    import privfed.federation.client as client_module

    started, go = threading.Event(), threading.Event()
    real_update = client_module.run_client_round

    def slow_update(*args, **kwargs):
        started.set()
        assert go.wait(30)
        return real_update(*args, **kwargs)

    monkeypatch.setattr(client_module, "run_client_round", slow_update)
    ins = instructions(plan)
    replies: dict[str, object] = {}
    first = threading.Thread(target=lambda: replies.setdefault("first", client(plan, tmp_path).fit(ins)))
    first.start()
    assert started.wait(30)
    second = threading.Thread(target=lambda: replies.setdefault("second", client(plan, tmp_path).fit(ins)))
    second.start()
    second.join(0.5)
    assert second.is_alive()  # waiting for the first computation, not computing its own
    go.set()
    first.join(60)
    second.join(60)
    assert replies["second"].parameters.tensors == replies["first"].parameters.tensors
    assert replies["second"].metrics == replies["first"].metrics
    assert ledger_rounds(tmp_path) == [1]


def test_a_stored_reply_is_on_disk_under_its_name_before_it_is_sent(plan, tmp_path, synced):
    """After a crash, a round answered but not on disk would be computed again: a second release for one charge."""
    ins = instructions(plan)
    reply = client(plan, tmp_path).fit(ins)
    folder = tmp_path / "replies"
    folder.mkdir()
    synced.clear()
    ReplyStore(reply_file(folder, 0)).answer(RUN, 1, instructions_digest(ins), reply)
    assert [path for path, is_folder in synced if is_folder] == [str(folder)]


def test_a_reply_write_a_kill_interrupted_is_overwritten_by_the_next_and_forgotten(plan, tmp_path):
    """The temporary file holds an unmasked update: the next write replaces it, and forget_replies removes it."""
    ins = instructions(plan)
    reply = client(plan, tmp_path).fit(ins)
    folder = tmp_path / "replies"
    folder.mkdir()
    half = folder / f"{reply_file(folder, 0).name}.tmp"
    half.write_bytes(b"half an earlier reply")
    ReplyStore(reply_file(folder, 0)).answer(RUN, 1, instructions_digest(ins), reply)  # a node's store: never forgotten
    assert [p.name for p in folder.iterdir()] == [reply_file(folder, 0).name]
    half.write_bytes(b"half an earlier reply")
    forget_replies(folder)
    assert not list(folder.iterdir())


def test_the_digest_of_the_same_arrays_is_the_digest_of_their_content_and_the_whole_configuration():
    """The model's hash is reused only for the very same bytes objects; the configuration is always hashed anew."""
    def plain(ins: FitIns) -> str:
        digest = hashlib.sha256()
        for tensor in ins.parameters.tensors:
            digest.update(len(tensor).to_bytes(8, "little"))
            digest.update(tensor)
        for key in sorted(ins.config):
            value = ins.config[key]
            raw = value if isinstance(value, bytes) else repr(value).encode()
            digest.update(f"{key}:{type(value).__name__}:{len(raw)}:".encode())
            digest.update(raw)
        return digest.hexdigest()

    tensors = [bytes(range(7)) * 1000, b"\x01\x02"]
    first = FitIns(Parameters(tensors, "numpy.ndarray"), {"round": 1, "task": "train"})
    other_round = FitIns(Parameters(tensors, "numpy.ndarray"), {"round": 2, "task": "train"})
    for ins in (first, other_round, first, first):  # reused state is copied, never extended in place
        assert instructions_digest(ins) == plain(ins)
    assert instructions_digest(first) != instructions_digest(other_round)
    changed = FitIns(Parameters([tensors[0], b"\x01\x03"], "numpy.ndarray"), {"round": 1, "task": "train"})
    assert instructions_digest(changed) == plain(changed) != plain(first)
    buffer = bytearray(b"\x01\x02")  # mutable: hashed again each time, so a change shows
    mutable = FitIns(Parameters([tensors[0], buffer], "numpy.ndarray"), {"round": 1})  # type: ignore[list-item]
    before = instructions_digest(mutable)
    buffer[1] = 9
    assert instructions_digest(mutable) != before and instructions_digest(mutable) == plain(mutable)
