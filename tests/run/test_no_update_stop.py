"""Runs whose every training round drops its model update stop after three such rounds, exit 1, and say why as a field.

Before the stop rule, ``--lr 1000``, ``--secagg-timeout 0.001`` and a config
with ``lr = 1`` ran every round, ended "done" with exit 0, ``stopped_early:
null`` and the untrained model. Each case here is a real run (the local
runtime, SecAgg+ on, as by default) through ``privfed.cli.main``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flwr.common import FitRes, MessageType, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.compat.common import recorddict_compat as compat

from privfed.cli import FAILED_RUN_EXIT_CODE, main
from privfed.config import build_config
from privfed.federation.simulation import simulate
from privfed.run.plan import plan_run
from privfed.run.stop import NO_UPDATE_LIMIT, NO_UPDATES, run_failed
from privfed.secagg.encoding import secagg_weight_ratio
from privfed.secagg.settings import SecAggPlusSettings

pytestmark = pytest.mark.slow  # three-round SecAgg+ runs, about 15 s each on two cores

TINY = ("--dataset", "shapes:300", "--num-clients", "4", "--rounds", "5", "-L", "4", "-G", "8", "--memory-size", "32",
        "--batch-size", "16", "--local-epochs", "1", "--projection-dim", "16", "--device", "cpu")


def summary_of(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def assert_stopped_for_want_of_updates(summary: dict, why: str) -> None:
    stop = summary["stop"]
    assert stop["cause"] == NO_UPDATES and stop["round"] == NO_UPDATE_LIMIT and summary["rounds"] == NO_UPDATE_LIMIT
    assert stop["message"] == summary["stopped_early"] and why in stop["message"]
    assert run_failed(summary)


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (("--lr", "1000"), "the secure sum is implausible"),
        (("--secagg-timeout", "0.001"), "secure aggregation halted"),
        (("--config", "{lr1}"), "the secure sum is implausible"),
    ],
    ids=["lr-1000", "secagg-timeout", "config-lr-1"],
)
def test_a_run_that_applies_no_update_stops_after_three_rounds_and_exits_1(tmp_path, capsys, args, why):
    config = tmp_path / "lr1.toml"
    config.write_text("lr = 1\n")
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        main(["train", *TINY, *(a.format(lr1=config) for a in args), "--out", str(out)])
    assert exit_.value.code == FAILED_RUN_EXIT_CODE
    summary = summary_of(out)
    assert_stopped_for_want_of_updates(summary, why)
    assert summary["knn_accuracy"] == summary["knn_accuracy_init"]  # it trained nothing, and now says so
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: the run failed: {summary['stopped_early']}")


def raise_overflow_flag(settings: SecAggPlusSettings, client: int):
    """Inner mod: ``client`` raises its overflow flag for the first tensor in every SecAgg+ round, whatever its update.

    The flag is written as an honest one is (divided by the client's weight
    ratio), into the plaintext the client hands to SecAgg+: the server sees
    only the masked sum, so it learns that one client flagged, not which.
    """

    def mod(msg, context, call_next):
        reply = call_next(msg, context)
        if reply.has_error() or msg.metadata.message_type != MessageType.TRAIN:
            return reply
        if int(context.node_config["partition-id"]) != client:
            return reply
        fitres = compat.recorddict_to_fitres(reply.content, keep_input=True)
        arrays = parameters_to_ndarrays(fitres.parameters)
        if not arrays or "secagg_scales" not in compat.recorddict_to_fitins(msg.content, keep_input=True).config:
            return reply  # round 0: no SecAgg+, no flags
        overflow = arrays[-2].copy()  # [*tensors, overflow, high] (no client metrics in this run)
        overflow[0] = 1 / secagg_weight_ratio(
            fitres.num_examples, max_weight=settings.max_weight, quantization_range=settings.quantization_range
        )
        arrays[-2] = overflow
        flagged = FitRes(fitres.status, ndarrays_to_parameters(arrays), fitres.num_examples, fitres.metrics)
        reply.content.array_records["fitres.parameters"] = compat.fitres_to_recorddict(
            flagged, keep_input=True
        ).array_records["fitres.parameters"]
        return reply

    return mod


def test_one_client_that_flags_overflow_every_round_cannot_keep_the_run_going_doing_nothing(tmp_path):
    """Before the stop rule the run went on to its last round, every update dropped, scales ×4 a round."""
    config = build_config(
        dataset="shapes:300", num_clients=4, participation=1.0, projection_dim=16, local_epochs=1, batch_size=16,
        memory_size=32, num_local_centroids=4, num_global_centroids=8, rounds=5, device="cpu",
        out=str(tmp_path / "run"),
    )
    plan = plan_run(config)
    assert plan.secagg is not None
    summary = simulate(plan, inner_mods=[raise_overflow_flag(plan.secagg, client=3)])
    assert_stopped_for_want_of_updates(summary, "1 aggregated tensors overflowed SecAgg+'s clipping range")
    secure = summary["secure_aggregation"]
    assert secure["overflow_rounds"] == NO_UPDATE_LIMIT and secure["final_max_scale"] == 4.0**3  # the stem's weight: 1, ×4 a round
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["secagg_rejected_tensors"] for m in metrics[1:]] == [1.0] * NO_UPDATE_LIMIT
