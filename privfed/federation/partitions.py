"""Which data partition each Flower node holds, asked once before the first round.

Flower's node IDs are drawn at random, so sampling "the i-th node" would
give another client set on every run with the same seed. The strategy
samples partitions instead, and this map tells it which node holds each:
every node answers a legacy ``get_properties`` message with its ``partition-id``.
"""

from __future__ import annotations

import time

from flwr.app import Message
from flwr.common import GetPropertiesIns, MessageTypeLegacy
from flwr.compat.common import recorddict_compat
from flwr.serverapp.grid import Grid

#: The ``get_properties`` key a client answers with its partition.
PARTITION_KEY = "partition-id"


def wait_for_nodes(grid: Grid, num_nodes: int, *, timeout: float, poll: float = 0.5) -> list[int]:
    """The IDs of ``num_nodes`` connected nodes, waiting up to ``timeout`` seconds for them."""
    deadline = time.monotonic() + timeout
    while len(nodes := sorted(grid.get_node_ids())) < num_nodes:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the run needs {num_nodes} SuperNodes (one per client partition) but only {len(nodes)} "
                f"connected within {timeout:.0f}s"
            )
        time.sleep(poll)
    return nodes


def discover_partitions(grid: Grid, num_partitions: int, *, timeout: float) -> dict[int, int]:
    """Node ID -> partition ID for every connected node.

    Raises:
        RuntimeError: when nodes do not answer, or do not hold ``0 .. num_partitions - 1`` once each.
    """
    nodes = wait_for_nodes(grid, num_partitions, timeout=timeout)
    messages = [
        Message(
            content=recorddict_compat.getpropertiesins_to_recorddict(GetPropertiesIns(config={})),
            dst_node_id=node,
            message_type=MessageTypeLegacy.GET_PROPERTIES,
        )
        for node in nodes
    ]
    partition_of: dict[int, int] = {}
    for reply in grid.send_and_receive(messages, timeout=timeout):
        if reply.has_error():
            raise RuntimeError(f"node {reply.metadata.src_node_id} did not say its partition: {reply.error.reason}")
        properties = recorddict_compat.recorddict_to_getpropertiesres(reply.content).properties
        partition_of[reply.metadata.src_node_id] = int(properties[PARTITION_KEY])
    found = sorted(partition_of.values())
    if found != list(range(num_partitions)):
        raise RuntimeError(
            f"the run expects one node per partition 0..{num_partitions - 1}, the nodes hold partitions {found}"
        )
    return partition_of
