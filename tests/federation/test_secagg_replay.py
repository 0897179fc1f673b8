"""A round replayed under SecAgg+ is unmasked again only for the clients it was unmasked for the first time.

A client asked again for a round it answered sends its stored reply, masked
afresh (:mod:`privfed.federation.reply_store`). Were the replay unmasked for
fewer clients, the difference of the two sums would be the missing clients'
updates. So each node records the survivor set it signed per run key and
round, by identity (:class:`privfed.secagg.client_trust.SignedRounds`), and
signs no other. The nodes are real ClientApps on a :class:`LocalGrid`, driven
by privfed's SecAgg+ workflow with a stand-in strategy that sends each chosen
node the real server's instructions; the last test goes through a real kill
and ``--resume`` of a simulated run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import flwr.compat.common.recorddict_compat as compat
import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.common import FitIns
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.server import LegacyContext
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey

import privfed.secagg.workflow as workflow_module
from benchmarks.secagg_harness import StandInStrategy
from privfed.config import build_config
from privfed.federation.client_app import make_client_app
from privfed.federation.local_runtime import SIMULATED_RUN_KEY, LocalGrid, superlink_identity
from privfed.federation.partitions import discover_partitions
from privfed.federation.simulation import simulate
from privfed.run.plan import RunPlan, plan_resume, plan_run
from privfed.secagg.client_trust import SIGNED_FILE
from privfed.secagg.identity import CONSISTENCY_STAGE, IDENTITY_FILE, PEERS_FILE, load_identity
from privfed.secagg.workflow import _CapturingSecAggPlusWorkflow
from tests.federation import honest_round
from tests.run.test_kill_window import KILLED_ROUND, Killed, dying_at

RUN_KEY = 7
#: Four clients: with every one sampled the threshold is 3, so three survivors can still be unmasked.
CLIENTS = 4
REFUSAL = "already signed another survivor set for round 1"


@dataclass
class Delivery:
    """One message as a node received it (its SecAgg+ stage) and what the server got back."""

    partition: int
    stage: str | None
    reply: Message | None = None
    refused: str | None = None

    @property
    def answered(self) -> bool:
        return self.reply is not None and not self.reply.has_error()


def watching(deliveries: list[Delivery]) -> Callable:
    """Outer mod: records each delivery, and the node's refusal (the exception its mods raised) or its reply."""

    def mod(msg: Message, context: Context, call_next: Callable) -> Message:
        configs = msg.content.config_records.get(RECORD_KEY_CONFIGS)
        stage = None if configs is None or Key.STAGE not in configs else str(configs[Key.STAGE])
        seen = Delivery(int(context.node_config["partition-id"]), stage)
        deliveries.append(seen)
        try:
            seen.reply = call_next(msg, context)
        except Exception as err:
            seen.refused = f"{type(err).__name__}: {err}"
            raise
        return seen.reply

    return mod


def losing(lost: dict[int, str]) -> Callable:
    """Outer mod: the masked vector of each partition in ``lost`` never counts: the node drops before sending it
    (``"drops"``), or it sends it and the server throws it away (``"discarded"``, inside the mod chain: the node's
    SecAgg+ has answered, the server gets an error)."""

    def mod(msg: Message, context: Context, call_next: Callable) -> Message:
        how = lost.get(int(context.node_config["partition-id"]))
        configs = msg.content.config_records.get(RECORD_KEY_CONFIGS)
        if how is None or configs is None or configs.get(Key.STAGE) != Stage.COLLECT_MASKED_VECTORS:
            return call_next(msg, context)
        if how == "drops":
            raise ConnectionError("dropped before sending its masked vector")
        reply = call_next(msg, context)
        assert not reply.has_error(), reply.error
        raise ConnectionError("the server discards this masked vector")

    return mod


@dataclass
class Instructed(StandInStrategy):
    """The harness's stand-in strategy, sending each of its nodes the real server's instructions ``ins``."""

    ins: FitIns | None = None

    def configure_fit(self, server_round: int, parameters, client_manager) -> list:
        return [(_Proxy(node), self.ins) for node in self.node_ids]


@dataclass(frozen=True)
class _Proxy:
    node_id: int

    @property
    def cid(self) -> str:
        return str(self.node_id)


class _Nodes:
    def __init__(self, count: int) -> None:
        self.count = count

    def num_available(self) -> int:
        return self.count


@dataclass
class Federation:
    """Four real privfed ClientApps keeping their ledgers, replies and signed sets in ``state``; ``lost``: see
    :func:`losing`."""

    plan: RunPlan
    state: Path
    deliveries: list[Delivery] = field(default_factory=list)
    lost: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.app = make_client_app(
            declared=self.plan.config, state_dir=self.state, run_key=RUN_KEY,
            outer_mods=[watching(self.deliveries), losing(self.lost)],
        )
        self.ins = honest_round.instructions(self.plan.config)  # made once: a replay sends the very same instructions

    def round(self, partitions: list[int]) -> Instructed:
        """One SecAgg+ round (training round 1) with ``partitions`` sampled, on new nodes (new node ids, new
        contexts: as after a restart, only the state folder remains); every share with every sampled client, the
        strict-majority threshold."""
        grid = LocalGrid(self.app, CLIENTS)
        self.deliveries.clear()
        with superlink_identity(grid.run.run_id):
            node_of = {p: n for n, p in discover_partitions(grid, CLIENTS, timeout=10).items()}
            strategy = Instructed([node_of[p] for p in partitions], ins=self.ins)
            n, declared = len(partitions), self.plan.secagg
            assert declared is not None
            settings = dataclasses.replace(declared, num_shares=n, reconstruction_threshold=n // 2 + 1)
            secure = _CapturingSecAggPlusWorkflow(strategy, **settings.workflow_arguments(n))
            context = Context(run_id=grid.run.run_id, node_id=0, node_config={}, state=RecordDict(), run_config={})
            context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: 2})
            parameters = compat.parameters_to_arrayrecord(self.ins.parameters, True)
            context.state.array_records[MAIN_PARAMS_RECORD] = parameters
            legacy = LegacyContext(context, strategy=strategy, client_manager=_Nodes(CLIENTS))  # type: ignore[arg-type]
            secure(grid, legacy)
        return strategy

    def at(self, stage: str) -> list[Delivery]:
        return [d for d in self.deliveries if d.stage == stage]

    def signed(self, partition: int) -> dict:
        return json.loads((self.state / SIGNED_FILE.format(partition)).read_text())

    def identities(self, partitions: list[int]) -> list[str]:
        return sorted(identity_of(self.state, p) for p in partitions)


def identity_of(folder: Path, partition: int) -> str:
    """A simulated node's identity, from the key the simulation wrote for it."""
    return load_identity(folder / IDENTITY_FILE.format(partition), folder / PEERS_FILE).public.decode()


@pytest.fixture
def federation(tmp_path) -> Federation:
    config = honest_round.small_round_config(
        num_clients=CLIENTS, participation=1.0, secagg=True, mechanism="ldp", epsilon=2.0, out=str(tmp_path / "run"),
    )
    return Federation(plan_run(config), tmp_path / "state")


@pytest.fixture
def first(federation) -> Instructed:
    """Training round 1, answered and unmasked for all four clients."""
    strategy = federation.round(list(range(CLIENTS)))
    assert strategy.aggregate is not None and len(strategy.aggregated_from) == CLIENTS
    return strategy


def signed_record(run: int, round_index: int, identities: list[str]) -> dict:
    """A node's record after it signed only this round: the digest of the survivors' sorted identities."""
    digest = hashlib.sha256("\n".join(sorted(identities)).encode()).hexdigest()
    return {"format": 2, "rounds": {f"{run}:{round_index}": digest}}


def assert_signed_all(federation: Federation) -> None:
    """Every node's record: it signed all four, by identity, for round 1 under the run key."""
    everyone = federation.identities(list(range(CLIENTS)))
    for partition in range(CLIENTS):
        assert federation.signed(partition) == signed_record(RUN_KEY, 1, everyone)


def assert_nothing_unmasked(federation: Federation, strategy: Instructed, refusing: list[int]) -> None:
    """Each of ``refusing`` sent its masked vector (its stored reply, masked afresh) and refused to sign the
    survivor set; no node was asked to unmask, and the server aggregated nothing."""
    masked = federation.at(Stage.COLLECT_MASKED_VECTORS)
    assert sorted(d.partition for d in masked if d.answered) == sorted(refusing)
    signing = federation.at(CONSISTENCY_STAGE)
    assert sorted(d.partition for d in signing) == sorted(refusing)
    for delivery in signing:
        assert delivery.reply is None and REFUSAL in str(delivery.refused), delivery
    assert federation.at(Stage.UNMASK) == []  # no share of any secret left any node
    assert strategy.aggregate is None


def test_a_round_replayed_to_a_smaller_cohort_is_signed_by_none_of_it(federation, first):
    """The server asks three of the four again, same run key and round: each sends its stored reply, and none
    signs a survivor set other than the four, so the sum of three (the fourth's update, by difference) never forms."""
    smaller = [0, 1, 2]
    replay = federation.round(smaller)
    assert_nothing_unmasked(federation, replay, smaller)
    assert_signed_all(federation)  # the record still names the four


@pytest.mark.parametrize("how", ["drops", "discarded"])
def test_a_replay_announcing_all_but_one_of_the_first_survivors_is_refused(federation, first, how):
    """The same four sampled again; partition 3's masked vector does not count (it drops, or the server throws it
    away), so the server announces the other three, a set above the threshold that each of them would sign within
    one round. Each refuses: it signed the four for this round."""
    federation.lost[3] = how
    replay = federation.round(list(range(CLIENTS)))
    assert [d.partition for d in federation.at(Stage.COLLECT_MASKED_VECTORS) if not d.answered] == [3]
    assert_nothing_unmasked(federation, replay, [0, 1, 2])


def test_a_replay_to_the_same_cohort_on_new_nodes_gives_the_same_aggregate(federation, first):
    """New node ids and new SecAgg+ keys, the same identities: the replay is unmasked, with the first sum."""
    keys = {d.partition: d.reply.content.config_records[RECORD_KEY_CONFIGS][Key.PUBLIC_KEY_1]
            for d in federation.deliveries if d.stage == Stage.SETUP}
    first_nodes = sorted(first.aggregated_from)
    replay = federation.round(list(range(CLIENTS)))
    assert replay.aggregate is not None and len(replay.aggregated_from) == CLIENTS
    assert set(replay.aggregated_from).isdisjoint(first_nodes)
    for delivery in federation.at(Stage.SETUP):
        assert delivery.reply.content.config_records[RECORD_KEY_CONFIGS][Key.PUBLIC_KEY_1] != keys[delivery.partition]
    assert all(np.array_equal(a, b) for a, b in zip(first.aggregate, replay.aggregate))
    assert len(federation.at(Stage.UNMASK)) == CLIENTS
    assert_signed_all(federation)


def test_an_earlier_round_replayed_after_a_later_one_is_not_unmasked_for_a_smaller_cohort(tmp_path):
    config = honest_round.small_round_config(
        num_clients=CLIENTS, participation=1.0, secagg=True, method="simclr", rounds=2, out=str(tmp_path / "run"),
    )
    federation = Federation(plan_run(config), tmp_path / "state")
    round_one = federation.ins
    assert federation.round(list(range(CLIENTS))).aggregate is not None
    federation.ins = FitIns(round_one.parameters, {**round_one.config, "round": 2})
    assert federation.round(list(range(CLIENTS))).aggregate is not None
    federation.ins = round_one
    smaller = [0, 1, 2]
    replay = federation.round(smaller)
    assert federation.at(Stage.UNMASK) == [] and replay.aggregate is None


# ---------------------------------------------------------------------------------------------------------------
# A real kill and resume of a simulated run.


def kill_config(out: Path):
    """Three clients, all sampled (threshold 2), two rounds: round 2 dies once its secure sum is unmasked."""
    return build_config(
        dataset="shapes:240", num_clients=3, participation=1.0, projection_dim=16, local_epochs=1, batch_size=16,
        memory_size=32, num_local_centroids=4, num_global_centroids=8, rounds=KILLED_ROUND, seed=3, device="cpu",
        mechanism="kanon", checkpoint_every=1, eval_every=KILLED_ROUND, client_cpus=2, out=str(out),
    )


@dataclass
class Attempt:
    """What one process of the run did in round 2: the unmasked mean, the nodes and their round keys."""

    means: dict[int, list[np.ndarray]] = field(default_factory=dict)
    nodes: dict[int, int] = field(default_factory=dict)
    keys: dict[int, bytes] = field(default_factory=dict)

    def mod(self, msg: Message, context: Context, call_next: Callable) -> Message:
        """Outer mod: each partition's node id and SecAgg+ key, as its setup reply sends them (the last: round 2's)."""
        reply = call_next(msg, context)
        answer = {} if reply.has_error() else reply.content.config_records.get(RECORD_KEY_CONFIGS, {})
        if Key.PUBLIC_KEY_1 in answer:
            partition = int(context.node_config["partition-id"])
            self.nodes[partition], self.keys[partition] = context.node_id, answer[Key.PUBLIC_KEY_1]
        return reply


def recording_means(monkeypatch: pytest.MonkeyPatch, attempt: Attempt) -> None:
    """Keeps each unmasked mean the workflow hands the strategy, by training round (observed, then passed on)."""
    hand = workflow_module._hand_to_strategy

    def recorded(mean, server_round, context, state) -> None:
        attempt.means[context.strategy.orchestra_round(server_round)] = [np.array(a, copy=True) for a in mean]
        hand(mean, server_round, context, state)

    monkeypatch.setattr(workflow_module, "_hand_to_strategy", recorded)


@pytest.mark.slow
def test_a_run_killed_after_its_round_was_unmasked_resumes_to_the_same_sum(tmp_path):
    """``privfed train --resume`` after the server died between unmasking round 2 and charging it: the resumed
    run has new nodes and keys, each node signs the same survivors (by identity) again, and the sum is the first."""
    plan = plan_run(kill_config(tmp_path / "run"))
    run, folder = plan.run_dir.path, plan.run_dir.client_ledgers
    killed, resumed = Attempt(), Attempt()
    with pytest.MonkeyPatch.context() as patch:
        recording_means(patch, killed)
        dying_at(patch, run, "before its first charge")
        with pytest.raises(Killed):
            simulate(plan, outer_mods=[killed.mod])
    assert sorted(killed.means) == [1, KILLED_ROUND]
    everyone = sorted(identity_of(folder, p) for p in range(3))
    record = signed_record(SIMULATED_RUN_KEY, KILLED_ROUND, everyone)
    for partition in range(3):
        assert json.loads((folder / SIGNED_FILE.format(partition)).read_text()) == record

    resumed_plan, point = plan_resume(run, {})
    assert point.round == 1
    with pytest.MonkeyPatch.context() as patch:
        recording_means(patch, resumed)
        summary = simulate(resumed_plan, resume=point, outer_mods=[resumed.mod])
    assert summary["rounds"] == KILLED_ROUND
    assert sorted(resumed.means) == [KILLED_ROUND]
    assert all(np.array_equal(a, b) for a, b in zip(killed.means[KILLED_ROUND], resumed.means[KILLED_ROUND]))
    assert sorted(resumed.nodes) == [0, 1, 2] and set(resumed.nodes.values()).isdisjoint(killed.nodes.values())
    assert all(resumed.keys[p] != killed.keys[p] for p in range(3))
    for partition in range(3):
        assert json.loads((folder / SIGNED_FILE.format(partition)).read_text()) == record
