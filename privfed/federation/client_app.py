"""Flower ClientApp: wires privfed's client and Flower's SecAgg+ mod together.

Kept light: in deployment Flower starts a ClientApp process for every
message, key exchanges included, so torch and the mechanisms are imported
only when a client is built (:mod:`privfed.federation.client`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import Message
from flwr.app.message_type import MessageType
from flwr.client import Client, ClientApp
from flwr.common import Context
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, RECORD_KEY_STATE, Key, Stage

from privfed.records import record_item
from privfed.secagg.client_mod import FITRES_METRICS, privfed_secaggplus_mod
from privfed.secagg.client_trust import STATE_DIR, TrustOf, max_corrupt_of, node_trust
from privfed.secagg.masking import SHARE_KEY
from privfed.secagg.settings import ENCODING_IN_FLOWER_STATE

if TYPE_CHECKING:
    from privfed.config import TrainConfig

logger = logging.getLogger(__name__)



def make_client_fn(
    declared: TrainConfig | None = None, state_dir: Path | None = None, run_key: int | None = None
) -> Callable[[Context], Client]:
    """``client_fn`` for a run declared as ``declared`` (None: the run config Flower hands the node).

    Each client's guard (:mod:`privfed.privacy.client_guard`) keeps its ledger
    and last reply (:mod:`privfed.federation.reply_store`) in the node's
    ``state-dir`` (or ``state_dir``), so they survive restarts and later runs;
    without one they last one message. It answers each round of a run once:
    ``run_key`` names the run (default: Flower's run id, new for every
    ``flwr run``), so a resume passes the key of the run it continues.
    """

    def client_fn(context: Context) -> Client:
        """Builds the client for this node's partition (``partition-id`` in the node config)."""
        from privfed.durable import make_folder
        from privfed.errors import PrivfedError
        from privfed.federation.client import DeclaredRun, OrchestraClient, SecureSumSetup
        from privfed.federation.reply_store import reply_file
        from privfed.privacy.client_guard import node_cap_from

        node = context.node_config
        partition = int(node["partition-id"])
        folder = Path(str(node[STATE_DIR])) if node.get(STATE_DIR) else state_dir
        ledger = replies = None
        if folder is None:
            logger.warning("partition %d keeps its privacy ledger in memory only: set the node config %s", partition, STATE_DIR)
        else:
            make_folder(folder)  # its name on disk too: a crash must not take the ledger away with a new folder
            ledger = folder / f"privfed-ledger-partition-{partition}.jsonl"
            replies = reply_file(folder, partition)  # its last reply, for a replayed round
        key = int(context.run_id) if run_key is None else run_key
        config = declared_config(declared, context)
        if int(node["num-partitions"]) != config.num_clients or not 0 <= partition < config.num_clients:
            raise PrivfedError(
                f"this node holds partition {partition} of {node['num-partitions']}, but the run has "
                f"num_clients={config.num_clients}: start one SuperNode per client, partitions 0..{config.num_clients - 1}"
            )
        try:
            run = DeclaredRun.of(config, partition, key=key, ledger=ledger, replies=replies, node_cap=node_cap_from(node))
        except (ValueError, PrivfedError) as err:
            # A cut-short ledger names the node's state path; a bad cap names the node's own cap.
            logger.error("partition %d cannot hold the server to its budget: %s", partition, err)
            raise NodeGuardFailed("this node cannot check its privacy budget; the reason is in its log") from None
        setup = context.state.config_records.get(RECORD_KEY_STATE)  # this round's SecAgg+ setup, if it has one
        floor = int(node.get(SECURE_SUM_MIN_SHARES, 2))
        if floor < 2:
            raise NodeGuardFailed(f"{SECURE_SUM_MIN_SHARES} must be at least 2, got {floor}")
        secure_sum = None if setup is None else SecureSumSetup(
            record_item(setup["threshold"], int), record_item(setup["mod_range"], int), node_min_shares=floor,
            max_corrupt=max_corrupt_of(node),
        )
        return OrchestraClient(partition, run, secure_sum=secure_sum)

    return client_fn


def declared_config(declared: TrainConfig | None, context: Context) -> TrainConfig:
    """The node's declared run: ``declared``, or else the run config Flower hands the node."""
    if declared is not None:
        return declared
    from privfed.config import config_from_run_config

    if not context.run_config:
        raise RuntimeError("this ClientApp has no declared run: start it with `flwr run` or privfed train")
    return config_from_run_config(dict(context.run_config))


Mod = Callable[[Message, Context, Callable[[Message, Context], Message]], Message]


#: Node config key (``--node-config "require-secagg=true"``): this node never trains without SecAgg+.
REQUIRE_SECAGG = "require-secagg"
#: Node config key (``--node-config "secagg-min-clients=5"``): the smallest SecAgg+ round this node joins.
SECAGG_MIN_CLIENTS = "secagg-min-clients"
#: Node config key (``--node-config "secure-sum-min-shares=20"``): the fewest shares a secure-sum mechanism's
#: secure sum must hold for this node to share into it, whatever K_min the run declares.
SECURE_SUM_MIN_SHARES = "secure-sum-min-shares"


class NodeGuardFailed(RuntimeError):
    """The node cannot build its privacy guard (its ledger or its cap is unusable); it answers no round."""


class UnmaskedRoundRefused(RuntimeError):
    """A training message asks for an update without SecAgg+ although the run or the node requires it."""


def secaggplus_when_requested(
    msg: Message, context: Context, call_next: Callable[[Message, Context], Message], *, trust_of: TrustOf = node_trust
) -> Message:
    """privfed's SecAgg+ client mod (:mod:`privfed.secagg.client_mod`), for the messages of a SecAgg+ round only.

    A training round without SecAgg+'s records would send the update unmasked:
    it is refused when its message carries SecAgg+ scales or the node sets
    ``require-secagg``. A SecAgg+ training round must carry privfed's SecAgg+
    settings (docs/privacy.md, "What clients also refuse").
    """
    if msg.metadata.message_type != MessageType.TRAIN:
        return call_next(msg, context)
    fit: Mapping[str, Any] = msg.content.config_records.get(FIT_CONFIG_RECORD, {})
    trains = fit.get("task") == "train"
    if RECORD_KEY_CONFIGS in msg.content.config_records:
        check_secagg_round(msg.content.config_records[RECORD_KEY_CONFIGS], context)
        if trains:
            if "secagg_scales" not in fit:
                raise UnmaskedRoundRefused("a SecAgg+ training round without privfed's SecAgg+ settings")
            check_encoding_matches_setup(fit, context.state.config_records.get(RECORD_KEY_STATE))
        reply = privfed_secaggplus_mod(msg, context, call_next, trust_of=trust_of)
        np.random.seed()  # fresh OS entropy: the rounding seed must not predict later draws in this process
        return reply
    required = str(context.node_config.get(REQUIRE_SECAGG, False)).lower() in ("true", "1", "yes")
    if trains and ("secagg_scales" in fit or required):
        raise UnmaskedRoundRefused("this node sends training updates only through SecAgg+, and the round has none")
    reply = call_next(msg, context)
    if not reply.has_error() and SHARE_KEY in reply.content.config_records.get(FITRES_METRICS, {}):
        raise UnmaskedRoundRefused("a share of the secure sum leaves this node only inside SecAgg+")
    return reply


def check_secagg_round(configs: Mapping[str, Any], context: Context) -> None:
    """Refuses a SecAgg+ round too small to hide this node's update, by the node's own ``secagg-min-clients``.

    Flower's mod accepts whatever the server sets (alone, with threshold 1, the
    node would hand back its mask seed's only share). With the minimum set it
    refuses fewer clients, shares or neighbours, or a threshold below 2 or short
    of a strict majority; whatever the minimum, an unmask request that lists a
    node as both surviving and dropped, or itself as dropped. Invented
    neighbours and withheld shares are for :mod:`privfed.secagg.client_agreement`
    (docs/privacy.md, "SecAgg+ against a deviating server").
    """
    stage = configs.get(Key.STAGE)
    if stage == Stage.UNMASK:
        # Shares of both secrets of one node remove its masks: an honest server never asks for both.
        active, dead = set(configs.get(Key.ACTIVE_NODE_ID_LIST, [])), set(configs.get(Key.DEAD_NODE_ID_LIST, []))
        if active & dead or context.node_id in dead:
            raise UnmaskedRoundRefused("the server lists a node as both surviving and dropped")
    minimum = context.node_config.get(SECAGG_MIN_CLIENTS)
    if minimum is None:
        return
    minimum = int(minimum)
    if stage == Stage.SETUP:
        sample, shares, threshold = (int(configs[k]) for k in (Key.SAMPLE_NUMBER, Key.SHARE_NUMBER, Key.THRESHOLD))
        if sample < minimum or shares < minimum or threshold < 2 or 2 * threshold <= shares:
            raise UnmaskedRoundRefused(
                f"this node joins SecAgg+ rounds of at least {minimum} clients with a strict-majority threshold; "
                f"the server asked for {sample} clients, {shares} shares, threshold {threshold}"
            )
    elif stage == Stage.SHARE_KEYS:
        # Flower's entries are each one node's public keys, keyed by its id; privfed's advertisements sit beside them.
        neighbours = len({int(node) for node in configs if node != Key.STAGE and not node.startswith("privfed_")})
        if neighbours < minimum:
            raise UnmaskedRoundRefused(f"this node shares keys with at least {minimum} neighbours, got {neighbours}")


def check_encoding_matches_setup(fit: Mapping[str, Any], state: Mapping[str, Any] | None) -> None:
    """Refuses privfed's SecAgg+ encoding when it differs from the one Flower's mod set up the round with.

    Otherwise a raised indicator would no longer add exactly 1, and the sum would name the client.
    """
    if state is None:
        raise UnmaskedRoundRefused("a SecAgg+ training round before SecAgg+ was set up on this node")
    for name, setup_key in ENCODING_IN_FLOWER_STATE.items():
        fit_key = f"secagg_{name}"
        if fit_key not in fit or float(fit[fit_key]) != float(state.get(setup_key, float("nan"))):
            raise UnmaskedRoundRefused(
                f"privfed's SecAgg+ {fit_key} {fit.get(fit_key)!r} differs from the {setup_key} "
                f"{state.get(setup_key)!r} SecAgg+ was set up with"
            )


#: Config record of a legacy fit message (Flower's compat encoding of ``FitIns.config``).
FIT_CONFIG_RECORD = "fitins.config"


def rounding_seed(run_seed: int, round_index: int, partition: int) -> list[int]:
    """Seed of one client's SecAgg+ rounding in one round (a stream apart from its training seed): 64 bits, as the
    two 32-bit words :func:`numpy.random.seed` takes."""
    return [int(word) for word in np.random.SeedSequence([run_seed, round_index, partition, 0x5EC]).generate_state(2)]


def seeded_secagg_rounding(declared: TrainConfig | None) -> Mod:
    """A mod that makes SecAgg+'s stochastic rounding reproducible from the declared run's seed.

    The rounding (:mod:`privfed.secagg.quantization`) draws from NumPy's global
    generator right after the client replies; :func:`secaggplus_when_requested`
    reseeds it from the OS after SecAgg+, so later draws are not predictable from the public seed.
    The rounding need only be unbiased, not secret; the masks do not use it.
    """

    def mod(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
        reply = call_next(msg, context)
        config = msg.content.config_records.get(FIT_CONFIG_RECORD)
        if config is not None and RECORD_KEY_CONFIGS in msg.content.config_records and not reply.has_error():
            partition = int(context.node_config["partition-id"])
            seed = declared_config(declared, context).seed
            np.random.seed(rounding_seed(seed, record_item(config["round"], int), partition))
        return reply

    return mod


def make_client_app(
    *,
    declared: TrainConfig | None = None,
    state_dir: Path | None = None,
    run_key: int | None = None,
    outer_mods: Sequence[Mod] = (),
    inner_mods: Sequence[Mod] = (),
) -> ClientApp:
    """The ClientApp for a declared run (see :func:`make_client_fn`), optionally with extra mods.

    An inner mod sees the client's plaintext reply before it is masked; an
    outer mod sees what the server receives. Mods see every message, not
    only fits (e.g. the ``get_properties`` asking a node's partition).
    """
    return ClientApp(
        client_fn=make_client_fn(declared, state_dir, run_key),
        mods=[
            *outer_mods,
            partial(secaggplus_when_requested, trust_of=partial(node_trust, state_dir=state_dir, run_key=run_key)),
            seeded_secagg_rounding(declared),
            *inner_mods,
        ],
    )


app = make_client_app()
