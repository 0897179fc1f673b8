"""SecAgg+ rounds with dropouts at every stage and hostile replies, in-process (tests/secagg/harness.py).

privfed's real client mod masks and Flower's exchanges keys; privfed's
workflow runs the server side. Flower's own mask expansion is replaced by
one that raises (tests/secagg/flower_prg.py), so every round here also
shows that no code path calls it. Each test states when the round must
complete (and with what sum) or halt, and that it never crashes.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.client.mod.secure_aggregation.secaggplus_mod import SecAggPlusState
from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, RECORD_KEY_STATE, Key, Stage
from flwr.supercore.primitives.asymmetric import bytes_to_private_key, bytes_to_public_key

from benchmarks.secagg_harness import mean_of, run_round
from privfed.secagg.identity import (
    ADVERT_SIGNATURE_KEY,
    CONSISTENCY_STAGE,
    SURVIVORS_SIGNATURE_KEY,
    VIEW_SIGNATURE_KEY,
)
from privfed.secagg.masking import decode_weighted_mean
from tests.secagg.harness import drops_at, in_process_secagg  # noqa: F401 (fixture)
from tests.secagg.test_masks import spec_mask

TOLERANCE = 1e-3  # fixed-point error of the secure sum at these sizes is about 1e-5


pytestmark = pytest.mark.usefixtures("in_process_secagg")


def updates(count: int, seed: int = 0) -> dict[int, tuple[list[np.ndarray], int]]:
    rng = np.random.default_rng(seed)
    return {100 + i: ([rng.uniform(-1, 1, 4)], 50 + 10 * i) for i in range(count)}


def test_dropouts_at_every_stage_leave_the_mean_of_the_clients_that_sent_a_masked_vector():
    """Eleven clients, threshold 6 (a strict majority): five may leave, one at each stage, and the round completes."""
    clients = updates(11)
    behaviours = {101: drops_at(Stage.SETUP), 102: drops_at(Stage.SHARE_KEYS),
                  103: drops_at(Stage.COLLECT_MASKED_VECTORS), 104: drops_at(CONSISTENCY_STAGE),
                  105: drops_at(Stage.UNMASK)}
    outcome = run_round(clients, shares=11, threshold=6, behaviours=behaviours)
    assert outcome.completed
    # 104 and 105 left after sending their masked vectors: both are in the sum, 104 without signing the survivors.
    in_sum = [100, 104, 105, 106, 107, 108, 109, 110]
    assert outcome.strategy.aggregated_from == in_sum
    assert np.abs(outcome.mean - mean_of(clients, in_sum)).max() < TOLERANCE


def test_a_sparse_neighbourhood_is_refused_at_setup_before_any_node_makes_a_key():
    """SecAgg+'s logarithmic neighbourhoods are the server's to choose: every node refuses shares < sampled clients."""
    clients = updates(25)
    outcome = run_round(clients, shares=7, threshold=4, seed=5)
    assert not outcome.completed
    assert set(outcome.grid.stages) == {Stage.SETUP}
    assert not any(RECORD_KEY_STATE in c.state.config_records for c in outcome.grid.contexts.values())


def test_early_dropouts_do_not_halt_a_round_on_the_complete_graph():
    clients = updates(9)
    dropped = {101: drops_at(Stage.SETUP), 104: drops_at(Stage.SETUP), 105: drops_at(Stage.SHARE_KEYS),
               108: drops_at(Stage.SHARE_KEYS)}
    outcome = run_round(clients, shares=9, threshold=5, behaviours=dropped)  # five live: each keeps 5 of its 9
    assert outcome.completed
    assert np.abs(outcome.mean - mean_of(clients, [n for n in clients if n not in dropped])).max() < TOLERANCE


def test_dropouts_at_the_consistency_stage_below_the_threshold_halt_the_round_before_any_share_is_asked_for():
    """The survivors sent masked vectors, but fewer than ``t`` signed them: nobody is asked to unmask."""
    clients = updates(5)
    behaviours = {n: drops_at(CONSISTENCY_STAGE) for n in (100, 101, 102)}
    outcome = run_round(clients, shares=5, threshold=3, behaviours=behaviours)
    assert not outcome.completed
    assert outcome.grid.stages.count(CONSISTENCY_STAGE) == 5 and Stage.UNMASK not in outcome.grid.stages


def test_too_few_survivors_halt_the_round_without_an_error():
    clients = updates(5)
    outcome = run_round(clients, shares=5, threshold=4, behaviours={100: drops_at(Stage.UNMASK), 101: drops_at(Stage.UNMASK)})
    assert not outcome.completed


def test_a_rejected_masked_reply_halts_the_round_before_any_key_is_rebuilt():
    clients = updates(6)
    outcome = run_round(clients, shares=6, threshold=4, reject=lambda node: "hostile" if node == 103 else None)
    assert outcome.strategy.rejected == [103] and not outcome.completed
    assert Stage.UNMASK not in outcome.grid.stages  # nobody is asked for shares of 103's keys


def tamper(stage: str, change):
    def behaviour(current, honest):
        reply = honest()
        if current == stage:
            change(reply.content.config_records[RECORD_KEY_CONFIGS])
        return reply

    return behaviour


HOSTILE_STAGE_REPLIES = [
    ("a share for an unknown node", Stage.UNMASK,
     lambda c: (c.__setitem__(Key.NODE_ID_LIST, [*c[Key.NODE_ID_LIST], 999]), c.__setitem__(Key.SHARE_LIST, [*c[Key.SHARE_LIST], b"x"]))),
    ("shares that do not combine", Stage.UNMASK,
     lambda c: c.__setitem__(Key.SHARE_LIST, [b"\x00" * len(s) for s in c[Key.SHARE_LIST]])),
]


@pytest.mark.parametrize(("case", "stage", "change"), HOSTILE_STAGE_REPLIES, ids=[c[0] for c in HOSTILE_STAGE_REPLIES])
def test_a_reply_that_breaks_a_stage_halts_the_round_instead_of_the_run(case, stage, change):
    clients = updates(5)
    behaviours = {101: tamper(stage, change), 104: drops_at(Stage.COLLECT_MASKED_VECTORS)}
    outcome = run_round(clients, shares=5, threshold=3, behaviours=behaviours)  # raised before: the run crashed
    assert not outcome.completed


@pytest.mark.parametrize("change", [
    lambda c: c.__setitem__(Key.DESTINATION_LIST, [*c[Key.DESTINATION_LIST], 100]),
    lambda c: (c.__setitem__(Key.DESTINATION_LIST, []), c.__setitem__(Key.CIPHERTEXT_LIST, [])),
], ids=["an extra destination", "no destination"])
def test_a_client_that_does_not_share_its_keys_with_each_neighbour_once_is_left_out(change):
    """The server sees the destinations it forwards: such a client is left out at key sharing, as a dropout, since
    every honest node would refuse a survivor set naming a node that shared nothing with it."""
    clients = updates(5)
    behaviours = {101: tamper(Stage.SHARE_KEYS, change), 104: drops_at(Stage.COLLECT_MASKED_VECTORS)}
    outcome = run_round(clients, shares=5, threshold=3, behaviours=behaviours)
    assert outcome.completed and outcome.strategy.aggregated_from == [100, 102, 103]
    assert np.abs(outcome.mean - mean_of(clients, [100, 102, 103])).max() < TOLERANCE


def garbles(key: str):
    return lambda configs: configs.__setitem__(key, b"\x00" * 64)


#: A client's own bad signature makes it no signer (or no neighbour): the server checks each itself, since every
#: node would refuse a request that carries one.
BAD_SURVIVORS_SIGNATURES = [
    pytest.param(lambda c: c.pop(SURVIVORS_SIGNATURE_KEY), id="missing"),
    pytest.param(lambda c: c.__setitem__(SURVIVORS_SIGNATURE_KEY, 5), id="not bytes"),
    pytest.param(garbles(SURVIVORS_SIGNATURE_KEY), id="does not verify"),
]


@pytest.mark.parametrize("change", BAD_SURVIVORS_SIGNATURES)
def test_a_client_that_does_not_sign_the_survivors_properly_is_no_signer_and_the_round_completes(change):
    """103 sent its masked vector, so it is in the sum; four others signed, and the threshold is 3."""
    clients = updates(5)
    outcome = run_round(clients, shares=5, threshold=3, behaviours={103: tamper(CONSISTENCY_STAGE, change)})
    assert outcome.completed
    assert np.abs(outcome.mean - mean_of(clients, list(clients))).max() < TOLERANCE


@pytest.mark.parametrize(
    "stage, key", [(Stage.SETUP, ADVERT_SIGNATURE_KEY), (Stage.SHARE_KEYS, VIEW_SIGNATURE_KEY)], ids=["advert", "view"]
)
def test_a_client_whose_signature_does_not_verify_is_left_out_and_the_others_are_summed(stage, key):
    """The server can check both itself: the identity is in the setup reply, the view is what it forwarded."""
    clients = updates(5)
    outcome = run_round(clients, shares=5, threshold=3, behaviours={103: tamper(stage, garbles(key))})
    assert outcome.completed and 103 not in outcome.strategy.aggregated_from
    assert np.abs(outcome.mean - mean_of(clients, [100, 101, 102, 104])).max() < TOLERANCE


def test_an_error_raised_by_privfeds_own_server_code_is_not_taken_for_a_client_fault(monkeypatch):
    from benchmarks.secagg_harness import StandInStrategy
    from privfed.federation.reply_checks import RejectedReply, check_masked_vector

    def failing_aggregate(self, server_round, results, failures):
        check_masked_vector([], [(1,)], modulus=2)  # privfed code raising while the server aggregates

    monkeypatch.setattr(StandInStrategy, "aggregate_fit", failing_aggregate)
    with pytest.raises(RejectedReply):
        run_round(updates(4), shares=4, threshold=3)


def test_a_masked_vector_is_the_update_under_the_specified_masks_and_neither_mask_alone_undoes_it():
    """Masks computed here from the node's own secrets, with the protocol's PRG written from its spec."""
    clients = updates(4)
    outcome = run_round(clients, shares=4, threshold=3)
    node = 101
    state = SecAggPlusState(**outcome.grid.contexts[node].state.config_records[RECORD_KEY_STATE])
    masked = np.concatenate([a.ravel() for a in outcome.grid.masked[node]]).astype(np.int64)
    private = spec_mask(state.rd_seed, masked.size)
    pairwise = sum(
        (1 if node > other else -1) * spec_mask(
            generate_shared_key(bytes_to_private_key(state.sk1), bytes_to_public_key(state.public_keys_dict[other][0])),
            masked.size,
        )
        for other in clients if other != node
    )

    def error_after_removing(masks: np.ndarray) -> float:
        left = np.mod(masked - masks, 2**32)
        decoded = decode_weighted_mean([left[:1], left[1:]], num_summed=1, clipping_range=8.0, quantization_range=2**22)
        return float(np.abs(decoded[0] - clients[node][0][0]).max())

    assert error_after_removing(private + pairwise) < TOLERANCE
    assert error_after_removing(private) > 1 and error_after_removing(pairwise) > 1
