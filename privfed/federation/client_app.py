"""Flower ClientApp: wires privfed's client and Flower's SecAgg+ mod together.

Kept light on purpose: in the deployment runtime Flower starts a fresh
ClientApp process for every message, including SecAgg+'s key-exchange
stages that never train, so torch and the mechanisms are only imported when
a client is actually built (:mod:`privfed.federation.client`).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from flwr.app import Message
from flwr.app.message_type import MessageType
from flwr.client import Client, ClientApp
from flwr.client.mod import secaggplus_mod
from flwr.common import Context
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage


def client_fn(context: Context) -> Client:
    """Builds the client for this node's partition (``partition-id`` in the node config)."""
    from privfed.federation.client import OrchestraClient

    node = context.node_config
    return OrchestraClient(int(node["partition-id"]), int(node["num-partitions"]))


Mod = Callable[[Message, Context, Callable[[Message, Context], Message]], Message]


#: Node config key (``--node-config "require-secagg=true"``): this node never trains without SecAgg+.
REQUIRE_SECAGG = "require-secagg"
#: Node config key (``--node-config "secagg-min-clients=5"``): the smallest SecAgg+ round this node joins.
SECAGG_MIN_CLIENTS = "secagg-min-clients"


class UnmaskedRoundRefused(RuntimeError):
    """A training message asks for an update without SecAgg+ although the run or the node requires it."""


def secaggplus_when_requested(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
    """Flower's SecAgg+ client mod, for the messages of a SecAgg+ round only.

    The same ClientApp then serves round 0 (plain), ``--no-secagg`` runs and
    secure rounds; Flower's mod alone fails on messages without its records.
    A server that leaves SecAgg+'s records out of a training round would
    otherwise get the update unmasked, so the node refuses such a round when
    the message itself says it is a SecAgg+ round (it carries SecAgg+ scales)
    or when the node's own config requires SecAgg+ (``require-secagg``).
    A SecAgg+ training round must also carry privfed's own SecAgg+ settings,
    which put the training metrics into the masked sum. Minimums on the
    round's size are :func:`check_secagg_round`'s.
    """
    if msg.metadata.message_type != MessageType.TRAIN:
        return call_next(msg, context)
    if RECORD_KEY_CONFIGS in msg.content.config_records:
        check_secagg_round(msg.content.config_records[RECORD_KEY_CONFIGS], context)
        fit = msg.content.config_records.get(FIT_CONFIG_RECORD, {})
        if fit.get("task") == "train" and "secagg_scales" not in fit:
            # privfed masks its metrics and indicators only with its own SecAgg+ settings.
            raise UnmaskedRoundRefused("a SecAgg+ training round without privfed's SecAgg+ settings")
        reply = secaggplus_mod(msg, context, call_next)
        np.random.seed()  # fresh OS entropy: the rounding seed must not predict later draws in this process
        return reply
    fit = msg.content.config_records.get(FIT_CONFIG_RECORD, {})
    trains = fit.get("task") == "train"
    if trains and ("secagg_scales" in fit or _node_requires_secagg(context)):
        raise UnmaskedRoundRefused("this node sends training updates only through SecAgg+, and the round has none")
    return call_next(msg, context)


def check_secagg_round(configs, context: Context) -> None:
    """Refuses a SecAgg+ round too small to hide this node's update, by the node's own ``secagg-min-clients``.

    Flower's mod accepts whatever the server sets: with the node alone and a
    threshold of 1 it hands back the only share of its mask seed, and the
    server unmasks the update. With the minimum set, the node refuses at
    setup a round of fewer clients or neighbours, a threshold below 2, or a
    threshold that is not a strict majority of the shares, and at key sharing
    fewer distinct nodes (itself included) than the minimum. Whatever the
    minimum, at unmasking it refuses a request that lists a node as both
    surviving and dropped, or itself as dropped: shares of both of a node's
    secrets remove its masks. Not caught: neighbours the server invents (no
    authenticated node keys), and fit-config SecAgg+ settings that differ
    from the ones Flower set up with.
    """
    stage = configs.get(Key.STAGE)
    if stage == Stage.UNMASK:
        # Shares of both secrets of one node unmask it: an honest server never asks for both.
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
        # Every entry but the stage is one node's public keys, keyed by its id (Flower reads the ids as integers).
        neighbours = len({int(node) for node in configs if node != Key.STAGE})
        if neighbours < minimum:
            raise UnmaskedRoundRefused(f"this node shares keys with at least {minimum} neighbours, got {neighbours}")


def _node_requires_secagg(context: Context) -> bool:
    value = context.node_config.get(REQUIRE_SECAGG, False)
    return value is True or str(value).lower() in ("true", "1", "yes")


#: Config record of a legacy fit message (Flower's compat encoding of ``FitIns.config``).
FIT_CONFIG_RECORD = "fitins.config"


def rounding_seed(run_seed: int, round_index: int, partition: int) -> int:
    """Seed of one client's SecAgg+ rounding in one round (a stream apart from its training seed)."""
    return int(np.random.SeedSequence([run_seed, round_index, partition, 0x5EC]).generate_state(1)[0])


def seeded_secagg_rounding(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
    """Makes SecAgg+'s stochastic rounding reproducible from the run's seed.

    Flower's ``secaggplus_mod`` rounds the client's update stochastically
    with NumPy's global generator right after the client replies, so the
    same seed gave slightly different aggregates on every run. This mod
    sits just inside it and seeds that generator from the round's seed once
    the reply exists; :func:`secaggplus_when_requested` reseeds it from the
    OS as soon as SecAgg+ is done, so nothing drawn later (another mod, a
    plugin) is predictable from the public seed. The rounding only has to be
    unbiased, not secret, and the masks do not use this generator.
    """
    reply = call_next(msg, context)
    config = msg.content.config_records.get(FIT_CONFIG_RECORD)
    if config is not None and RECORD_KEY_CONFIGS in msg.content.config_records and not reply.has_error():
        partition = int(context.node_config["partition-id"])
        np.random.seed(rounding_seed(int(config["seed"]), int(config["round"]), partition))
    return reply


def make_client_app(*, outer_mods: Sequence[Mod] = (), inner_mods: Sequence[Mod] = ()) -> ClientApp:
    """The ClientApp, optionally with extra mods outside or inside SecAgg+'s masking.

    An inner mod sees the client's plaintext reply before it is masked (what
    never leaves the node); an outer mod sees what the server receives. Mods
    see every message, not only fits: before round 0 the server asks each
    node which partition it holds (a legacy ``get_properties`` message).
    """
    return ClientApp(
        client_fn=client_fn, mods=[*outer_mods, secaggplus_when_requested, seeded_secagg_rounding, *inner_mods]
    )


app = make_client_app()
