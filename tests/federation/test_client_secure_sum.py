"""A ``ddp-sums`` client shares only into a SecAgg+ sum that holds its noise, as its own declared run says."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, RecordDict
from flwr.client.mod.secure_aggregation.secaggplus_mod import SecAggPlusState
from flwr.common import FitIns, bytes_to_ndarray, ndarrays_to_parameters
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_STATE

from privfed.federation.client_app import make_client_fn
from privfed.orchestra.model_state import shared_keys
from privfed.privacy.client_guard import RoundRefused
from privfed.secagg.masking import SHARE_KEY
from tests.federation.honest_round import honest_round, small_round_config

#: Four clients, all sampled: SecAgg+ shares among 4 with threshold 3, so K_min is 3.
CONFIG = small_round_config(
    secagg=True, mechanism="ddp-sums", epsilon=10.0, participation=1.0, rounds=2, num_local_centroids=4
)


@pytest.fixture(scope="module")
def instructions(tmp_path_factory) -> FitIns:
    round_ = honest_round(CONFIG, tmp_path_factory.mktemp("ins") / "run", sampled=(0, 1, 2, 3))
    server = round_.strategy.server
    state = ndarrays_to_parameters([server.global_state()[k].numpy() for k in shared_keys(server.network)])
    return round_.strategy.fit_instructions(round_.server_round, state)


def client(tmp_path, setup: dict | None, **node_config):
    context = Context(
        run_id=1, node_id=1, node_config={"partition-id": 0, "num-partitions": 4, **node_config}, state=RecordDict(),
        run_config={},
    )
    if setup is not None:
        context.state.config_records[RECORD_KEY_STATE] = ConfigRecord(SecAggPlusState(**setup).to_dict())
    return make_client_fn(CONFIG, state_dir=tmp_path, run_key=0)(context)


def ledger_lines(tmp_path) -> int:
    return sum(len(f.read_text().splitlines()) for f in tmp_path.glob("privfed-ledger-*.jsonl"))


def test_the_clients_own_calibration_takes_k_min_from_the_secagg_threshold(tmp_path):
    params = client(tmp_path, None).declared.guard.budget.params
    assert params["min_shares"] == 3 and params["modulus"] == 2**32


def test_a_client_shares_under_a_setup_whose_threshold_holds_its_noise(tmp_path, instructions):
    res = client(tmp_path, {"threshold": 3, "mod_range": 2**32}).fit(instructions)
    share = bytes_to_ndarray(res.metrics[SHARE_KEY])  # handed to its SecAgg+ mod, which masks it
    assert share.shape == (CONFIG.num_global_centroids * (CONFIG.projection_dim + 1),)
    assert share.dtype == np.int64 and share.min() >= 0 and share.max() < 2**32
    assert not any(key.startswith("release_") for key in res.metrics)
    assert ledger_lines(tmp_path) == 1  # charged once, for this round


@pytest.mark.parametrize("setup", [{"threshold": 2, "mod_range": 2**32}, {"threshold": 3, "mod_range": 2**31}, None],
                         ids=["threshold below K_min", "another modulus", "no SecAgg+ setup"])
def test_a_round_whose_sum_could_hold_less_noise_is_refused_before_any_charge(tmp_path, instructions, setup):
    with pytest.raises(RoundRefused):
        client(tmp_path, setup).fit(instructions)
    assert ledger_lines(tmp_path) == 0


def test_a_share_is_never_put_in_a_reply_without_secagg(tmp_path, instructions):
    plain = FitIns(instructions.parameters, {k: v for k, v in instructions.config.items() if not k.startswith("secagg_")})
    with pytest.raises(RoundRefused):
        client(tmp_path, {"threshold": 3, "mod_range": 2**32}).fit(plain)


def test_a_share_is_never_sent_twice_nor_kept_on_disk(tmp_path, instructions):
    setup = {"threshold": 3, "mod_range": 2**32}
    first = client(tmp_path, setup).fit(instructions)
    assert SHARE_KEY in first.metrics
    stored = b"".join(f.read_bytes() for f in tmp_path.glob("privfed-reply-*") if f.suffix != ".lock")
    assert stored and first.metrics[SHARE_KEY] not in stored and SHARE_KEY.encode() not in stored
    # A resumed run asks for the round again: one dropout in that second sum would isolate this share.
    with pytest.raises(RoundRefused, match="never sent again"):
        client(tmp_path, setup).fit(instructions)
    assert ledger_lines(tmp_path) == 1


def test_a_node_can_ask_for_more_shares_than_the_run_declares(tmp_path, instructions):
    setup = {"threshold": 3, "mod_range": 2**32}
    with pytest.raises(RoundRefused, match="secure-sum-min-shares"):
        client(tmp_path, setup, **{"secure-sum-min-shares": 4}).fit(instructions)
    assert ledger_lines(tmp_path) == 0
    assert SHARE_KEY in client(tmp_path, setup, **{"secure-sum-min-shares": 3}).fit(instructions).metrics


@pytest.mark.parametrize("floor", [0, -5])
def test_a_node_floor_below_two_is_refused_not_read_as_no_floor(tmp_path, instructions, floor):
    from privfed.federation.client_app import NodeGuardFailed

    with pytest.raises(NodeGuardFailed, match="secure-sum-min-shares"):
        client(tmp_path, {"threshold": 3, "mod_range": 2**32}, **{"secure-sum-min-shares": floor})


def test_a_node_counts_only_honest_shares_towards_k_min(tmp_path, instructions):
    """With ``secagg-max-corrupt=1`` a sum unmasked at threshold 3 may hold 2 honest shares: below K_min = 3, refused
    (tests/secagg/test_v4_review.py shows the server unmasking such a sum); at threshold 4 it holds 3."""
    with pytest.raises(RoundRefused, match="its 2 honest shares"):
        client(tmp_path, {"threshold": 3, "mod_range": 2**32}, **{"secagg-max-corrupt": 1}).fit(instructions)
    assert ledger_lines(tmp_path) == 0
    reply = client(tmp_path, {"threshold": 4, "mod_range": 2**32}, **{"secagg-max-corrupt": 1}).fit(instructions)
    assert SHARE_KEY in reply.metrics
