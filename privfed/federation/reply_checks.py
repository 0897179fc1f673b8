"""The server's checks on a client's reply, before anything in it touches the global state or the ledger.

A reply is trusted for nothing it can be checked on: who sent it (the node
the server asked, not the ``client_id`` it claims), which round it answers
(:func:`check_round`), how many examples it stands for (the partition's
planned size), the release's shape, dtype, finiteness, unit norm, count and
total weight (bounded by what the mechanism could honestly send from what
its memory holds: :meth:`ReplyRules.most_reps`), its privacy and DP-SGD
events (exactly the plan's; the server charges its own copy), its metrics
(known keys, values of their type, training metrics only in a run that
reports them) and the model delta: without SecAgg+, its arrays' count,
shapes, dtype, finiteness and size; under SecAgg+, the masked vector's
count, shapes and integer range (:func:`check_masked_vector`). A failing
reply is rejected whole, with a one-line reason; the strategy
(:mod:`privfed.federation.strategy`) drops it and goes on with the others.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

import numpy as np
import torch
from flwr.common import FitRes, bytes_to_ndarray, parameters_to_ndarrays

from mechanisms.base import (
    K_ANONYMITY,
    Guarantee,
    Mechanism,
    PrivacyEvent,
    Release,
    ReleaseMechanism,
    TableRelease,
    TableReleaseMechanism,
    round_releases,
)
from privfed.federation.messages import RELEASE_KEYS, has_release
from privfed.methods import STEP_VALUES
from privfed.orchestra.round_report import Rejection
from privfed.privacy.dp_sgd_plan import poisson_memory_bound
from privfed.privacy.ledger import check_event

if TYPE_CHECKING:
    from privfed.privacy.dp_sgd_plan import DpSgdPlan
    from privfed.run.plan import RunPlan

#: The metric that names the round a reply answers (the instructions' ``round``).
ROUND_KEY = "round"
#: Numeric metrics a client may send (the release and the events travel as bytes and JSON).
NUMERIC_METRICS = frozenset({*STEP_VALUES, "train_seconds", "steps", "release_seconds"})
#: How far a released vector's norm may stray from 1 (float32 normalisation is far closer).
UNIT_NORM_TOLERANCE = 1e-3
#: Longest rejection reason kept (a reason may quote a value the client sent).
MAX_REASON_CHARS = 200
#: Longest JSON text (events, guarantee) a reply may hold: a few events take a few hundred characters.
MAX_JSON_CHARS = 100_000
#: Largest change of one value a delta may carry: local SGD moves weights by far less, and a sum of
#: deltas near float32's limit would overflow the global state in a later round.
MAX_DELTA_MAGNITUDE = 1e4


class RejectedReply(ValueError):
    """A reply the server will not use; the message is the reason (computed from the reply alone, at most
    :data:`MAX_REASON_CHARS` long once :func:`check_reply` raises it)."""


@dataclass(frozen=True)
class ReplyRules:
    """What a reply in this run may hold, from the run's plan (:meth:`of`); ``mechanism`` None: nothing is released."""

    client_sizes: tuple[int, ...]
    dimension: int
    num_centroids: int
    mechanism: type[Mechanism] | None
    mechanism_params: dict[str, Any]
    release_events: tuple[PrivacyEvent, ...]
    min_k: int | None = None
    dp_sgd: DpSgdPlan | None = None
    memory_size: int | None = None
    client_metrics: bool = False
    samples_every_image: bool = False
    num_global_centroids: int = 0
    release_every: int = 1

    def most_reps(self, size: int) -> int:
        """The most representations a client of ``size`` examples hands its mechanism, which bounds its release.

        One per distinct image in its memory (at most ``memory_size``); one per
        image to a mechanism that draws its own secret sample. Under DP-SGD the
        memory is an uncapped Poisson sample, within
        :func:`~privfed.privacy.dp_sgd_plan.poisson_memory_bound` but with
        probability ``MEMORY_BOUND_FAILURE``. A client with 2,000 images would
        otherwise weigh 2,000 where an honest ``kanon`` release weighs at most 128.
        """
        if self.memory_size is None or self.samples_every_image:
            return size
        if self.dp_sgd is not None:
            return poisson_memory_bound(size, self.memory_size)
        return min(size, self.memory_size)

    @classmethod
    def of(cls, plan: RunPlan, mechanism: type[Mechanism] | None) -> ReplyRules:
        config = plan.config
        minimum = plan.privacy.params.get("min_k")
        return cls(
            client_sizes=plan.client_sizes, dimension=config.projection_dim, num_centroids=config.num_local_centroids,
            mechanism=mechanism, mechanism_params=dict(plan.privacy.params),
            release_events=plan.privacy.per_release_events, min_k=None if minimum is None else int(minimum),
            dp_sgd=plan.privacy.dp_sgd, memory_size=config.memory_size, client_metrics=config.report_client_metrics,
            samples_every_image=plan.privacy.rows_sampled, num_global_centroids=config.num_global_centroids,
            release_every=config.release_every,
        )

    def releases_in(self, round_index: int | None, *, train: bool) -> bool:
        """Whether a reply to this round holds a release (``round_index`` None: any training round that releases)."""
        index = (round_index if round_index is not None else 1) if train else 0
        return round_releases(self.mechanism, round_index=index, release_every=self.release_every)

    @functools.cached_property
    def table_mechanism(self) -> TableReleaseMechanism | None:
        """The run's mechanism built from its plan, when it releases tables (which only an instance can read)."""
        if self.mechanism is None or not issubclass(self.mechanism, TableReleaseMechanism):
            return None
        return self.mechanism(**self.mechanism_params)


@dataclass(frozen=True)
class CheckedReply:
    """The parts of a reply that passed every check, decoded; a k-anonymous release's ``k`` is what the server
    credits, and ``delta`` is None in round 0 and under SecAgg+ (only the sum is readable)."""

    client: int
    num_examples: int
    release: Release | None
    metrics: dict[str, float]
    training_events: tuple[PrivacyEvent, ...]
    delta: list[np.ndarray] | None


def check_reply(
    res: FitRes, *, client: int, rules: ReplyRules, train: bool, delta_shapes: Sequence[tuple[int, ...]] | None,
    round_index: int | None = None,
) -> CheckedReply:
    """Checks one reply from the node that holds partition ``client``.

    ``delta_shapes`` is None where the parameters are not one client's (SecAgg+
    rounds, checked by the secure aggregation); ``round_index`` None leaves the
    round unchecked (library use outside a run).

    Raises:
        RejectedReply: naming the first check that failed, or the error a malformed reply raised (never anything else).
    """
    try:
        if round_index is not None:
            check_round(dict(res.metrics), round_index)
        try:
            metrics = dict(res.metrics)
        except (TypeError, ValueError) as err:
            raise RejectedReply(f"metrics are not a mapping: {err}") from None
        claimed = metrics.get("client_id")
        if not _is_int(claimed):
            raise RejectedReply(f"client_id is missing or not an integer ({claimed!r})")
        if claimed != client:
            raise RejectedReply(f"client_id {claimed} is not the partition {client} this node was asked for")
        size = rules.client_sizes[client]
        if not _is_int(res.num_examples) or res.num_examples != size:
            raise RejectedReply(f"num_examples {res.num_examples!r} is not the client's {size} examples")
        numeric = _numeric_metrics(metrics, reported=rules.client_metrics)
        training_events = _training_events(metrics, rules=rules, size=size, train=train)
        released = rules.releases_in(round_index, train=train)
        release = _release(metrics, rules=rules, size=size, train=train, released=released)
        delta = None if delta_shapes is None else _delta(res, delta_shapes, train=train)
        return CheckedReply(client, size, release, numeric, training_events, delta)
    except RejectedReply as err:
        reason = str(err)  # may quote the client's value: kept short, as it goes into logs and run files
        raise RejectedReply(reason if len(reason) <= MAX_REASON_CHARS else reason[: MAX_REASON_CHARS - 1] + "…") from None
    except Exception as err:  # e.g. JSON nested too deep, numbers too long: still a rejection, never a crash
        raise RejectedReply(f"unreadable reply ({type(err).__name__})") from None


def _is_int(value: Any) -> TypeGuard[int | np.integer]:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _numeric_metrics(metrics: dict[str, Any], *, reported: bool) -> dict[str, float]:
    known = NUMERIC_METRICS | {"client_id", ROUND_KEY, "dp_sgd_events", *RELEASE_KEYS}
    unknown = sorted(k for k in metrics if k not in known)
    if unknown:
        raise RejectedReply(f"unknown metrics {unknown[:5]}")
    unasked = sorted(NUMERIC_METRICS & metrics.keys()) if not reported else []
    if unasked:
        raise RejectedReply(f"training metrics {unasked[:5]}, which this run does not report")
    numeric: dict[str, float] = {}
    for key in NUMERIC_METRICS & metrics.keys():
        value = metrics[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise RejectedReply(f"metric {key} is {value!r}, not a finite number")
        numeric[key] = float(value)
    return numeric


def check_round(metrics: dict[str, Any], round_index: int) -> None:
    """Refuses (:class:`RejectedReply`) a reply that does not name ``round_index`` as the round it answers: one to
    an earlier round, late or replayed, would have its release clustered again and its update misapplied."""
    claimed = metrics.get(ROUND_KEY)
    if not _is_int(claimed):
        raise RejectedReply(f"the round it answers is missing or not an integer ({claimed!r})")
    if claimed != round_index:
        raise RejectedReply(f"it answers round {claimed}, not round {round_index}")


def _json(metrics: dict[str, Any], key: str) -> Any:
    text = metrics.get(key)
    if not isinstance(text, str):
        raise RejectedReply(f"{key} is missing or not text")
    if len(text) > MAX_JSON_CHARS:
        raise RejectedReply(f"{key} is {len(text)} characters long (at most {MAX_JSON_CHARS})")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise RejectedReply(f"{key} is not JSON ({err.msg})") from None


def _events(value: Any, key: str) -> tuple[PrivacyEvent, ...]:
    """JSON events, each a name and finite numeric parameters with a whole positive count."""
    if not isinstance(value, list):
        raise RejectedReply(f"{key} is not a list of events")
    events = []
    for item in value:
        if not (isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("params"), dict)):
            raise RejectedReply(f"{key} holds a malformed event {str(item)[:80]}")
        params = item["params"]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in params.values()):
            raise RejectedReply(f"{key} holds an event with non-numeric parameters")
        event = PrivacyEvent(item["name"], {str(k): float(v) for k, v in params.items()})
        try:
            check_event(event)
        except ValueError as err:
            raise RejectedReply(f"{key}: {err}") from None
        events.append(event)
    return tuple(events)


def _training_events(metrics: dict[str, Any], *, rules: ReplyRules, size: int, train: bool) -> tuple[PrivacyEvent, ...]:
    events = _events(_json(metrics, "dp_sgd_events"), "dp_sgd_events")
    expected = rules.dp_sgd.round_events(size) if rules.dp_sgd is not None and train else ()
    if events != tuple(expected):
        raise RejectedReply(f"DP-SGD costs {[e.name for e in events]} differ from the plan's")
    return events


def _array(metrics: dict[str, Any], key: str) -> np.ndarray:
    data = metrics.get(key)
    if not isinstance(data, bytes):
        raise RejectedReply(f"{key} is missing or not bytes")
    try:
        return bytes_to_ndarray(data)
    except Exception as err:  # numpy raises several types for truncated or foreign bytes
        raise RejectedReply(f"{key} is not a readable array ({type(err).__name__})") from None


def _release(metrics: dict[str, Any], *, rules: ReplyRules, size: int, train: bool, released: bool) -> Release | None:
    mechanism = rules.mechanism
    if mechanism is None or not issubclass(mechanism, ReleaseMechanism) or not released:
        if has_release(metrics):
            why = (
                "the run's method releases nothing" if mechanism is None
                else f"{mechanism.name} shares into the secure sum" if not issubclass(mechanism, ReleaseMechanism)
                else f"the run releases only every {rules.release_every} rounds, and not in this one"
            )
            raise RejectedReply(f"it holds a release, but {why}")
        return None
    table = None
    if rules.table_mechanism is not None:
        table, vectors, weights = _table_release(metrics, rules=rules, size=size, train=train)
    else:
        if "release_table" in metrics:
            raise RejectedReply(f"it holds a table, but {mechanism.name} releases vectors")
        vectors, weights = _array(metrics, "release_vectors"), _array(metrics, "release_weights")
    if vectors.dtype != np.float32 or weights.dtype != np.float32:
        raise RejectedReply(f"release arrays are {vectors.dtype}/{weights.dtype}, not float32")
    if vectors.ndim != 2 or (vectors.shape[0] and vectors.shape[1] != rules.dimension):
        raise RejectedReply(f"release vectors have shape {vectors.shape}, not [m, {rules.dimension}]")
    count = vectors.shape[0]
    if count == 0:
        vectors = np.zeros((0, rules.dimension), np.float32)  # an empty release of any width becomes [0, D]
    reps = rules.most_reps(size)
    most = mechanism.max_vectors(num_reps=reps, num_centroids=rules.num_centroids)
    if count > most:
        raise RejectedReply(f"release holds {count} vectors; {mechanism.name} sends at most {most}")
    if weights.shape != (count,):
        raise RejectedReply(f"release weights have shape {weights.shape}, not ({count},)")
    if not (np.isfinite(vectors).all() and np.isfinite(weights).all()):
        raise RejectedReply("release holds NaN or Inf")
    norms = np.linalg.norm(vectors.astype(np.float64), axis=1)
    if count and float(np.abs(norms - 1.0).max()) > UNIT_NORM_TOLERANCE:
        raise RejectedReply("release vectors are not unit-norm")
    heaviest = mechanism.max_total_weight(num_reps=reps, params=rules.mechanism_params)
    if (weights < 0).any() or float(weights.astype(np.float64).sum()) > heaviest:
        raise RejectedReply(f"release weights are negative or total more than {heaviest:g}")
    guarantee = _guarantee(_json(metrics, "release_guarantee"))
    if guarantee.kind != mechanism.guarantee_kind:
        raise RejectedReply(f"release claims {guarantee.kind!r}, but {mechanism.name} declares {mechanism.guarantee_kind!r}")
    events = _events(_json(metrics, "release_events"), "release_events")
    if events != tuple(rules.release_events):
        raise RejectedReply(f"release costs {[e.name for e in events]} differ from the plan's")
    release = (
        Release(torch.from_numpy(vectors.copy()), torch.from_numpy(weights.copy()), guarantee, events)
        if table is None
        else TableRelease(torch.from_numpy(vectors.copy()), torch.from_numpy(weights.copy()), guarantee, events, table=table)
    )
    if mechanism.guarantee_kind == K_ANONYMITY:
        k = _credited_k(release, rules=rules, mechanism=mechanism, num_reps=reps)
        release = dataclasses.replace(release, guarantee=dataclasses.replace(guarantee, k=k))
    return release


def _table_release(
    metrics: dict[str, Any], *, rules: ReplyRules, size: int, train: bool
) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """The table of a table release, checked by its mechanism, and the vectors and weights the server reads from
    it; its cells are the global centroids in a training round, the client's own ``L`` in round 0."""
    mechanism = rules.table_mechanism
    assert mechanism is not None  # the caller asked
    if "release_vectors" in metrics or "release_weights" in metrics:
        raise RejectedReply(f"{mechanism.name} sends its table alone, not vectors or weights")
    array = _array(metrics, "release_table")
    if array.dtype != np.dtype(np.int64):
        raise RejectedReply(f"release table is {array.dtype}, not int64")
    cells = rules.num_global_centroids if train else rules.num_centroids
    table = torch.from_numpy(np.array(array, copy=True))
    try:
        mechanism.check_table(table, num_reps=rules.most_reps(size), num_cells=cells, dim=rules.dimension)
    except ValueError as err:
        raise RejectedReply(f"release table: {err}") from None
    vectors, weights = mechanism.table_view(table, num_centroids=rules.num_centroids)
    return table, vectors.numpy(), weights.numpy()


def _guarantee(value: Any) -> Guarantee:
    fields = {"kind": str, "statement": str, "k": int, "epsilon": float, "delta": float}
    if not isinstance(value, dict) or set(value) - set(fields) or not {"kind", "statement"} <= set(value):
        raise RejectedReply("release_guarantee is not a guarantee")
    for key, kind in fields.items():
        item = value.get(key)
        if item is None:
            continue
        numeric = kind in (int, float) and not isinstance(item, bool)
        if not (isinstance(item, kind) or (kind is float and isinstance(item, int))) or (kind is int and not numeric):
            raise RejectedReply(f"release_guarantee's {key} is {item!r}")
        if kind is float and not (numeric and isinstance(item, (int, float)) and math.isfinite(item)):
            raise RejectedReply(f"release_guarantee's {key} is {item!r}")
    return Guarantee(**value)


def _credited_k(release: Release, *, rules: ReplyRules, mechanism: type[ReleaseMechanism], num_reps: int) -> int | None:
    """The anonymity set the server credits: no more than the claim, the lightest vector, or the mechanism's
    largest honest k from the client's ``num_reps`` representations (:meth:`Mechanism.max_k`)."""
    if release.num_vectors == 0:
        return None
    if release.guarantee.k is None:
        raise RejectedReply("a k-anonymous release without its k")
    bound = mechanism.max_k(num_reps=num_reps, num_vectors=release.num_vectors, params=rules.mechanism_params)
    share = num_reps // release.num_vectors if bound is None else bound
    k = min(release.guarantee.k, int(release.weights.min()), share)
    if rules.min_k is not None and k < rules.min_k:
        raise RejectedReply(f"release holds centroids of {k} images, below the run's min_k {rules.min_k}")
    return k


def _delta(res: FitRes, shapes: Sequence[tuple[int, ...]], *, train: bool) -> list[np.ndarray] | None:
    try:
        arrays = parameters_to_ndarrays(res.parameters)
    except Exception as err:  # truncated or foreign bytes
        raise RejectedReply(f"the model delta is not readable ({type(err).__name__})") from None
    if not train:
        if arrays:
            raise RejectedReply("it sent a model delta in round 0, which does not train")
        return None
    if len(arrays) != len(shapes):
        raise RejectedReply(f"the model delta has {len(arrays)} arrays, not {len(shapes)}")
    for index, (array, shape) in enumerate(zip(arrays, shapes)):
        if array.shape != tuple(shape) or array.dtype != np.dtype(np.float32):
            raise RejectedReply(f"delta array {index} is {array.dtype} {array.shape}, not float32 {tuple(shape)}")
        if not array.size:
            continue
        # Two reductions without temporaries (NaN propagates through max and min) instead of model-sized masks.
        high, low = float(array.max()), float(array.min())
        if not (math.isfinite(high) and math.isfinite(low)):
            raise RejectedReply(f"delta array {index} holds NaN or Inf")
        if max(high, -low) > MAX_DELTA_MAGNITUDE:
            raise RejectedReply(f"delta array {index} moves a value by more than {MAX_DELTA_MAGNITUDE:g}")
    return arrays


def check_masked_vector(arrays: Sequence[np.ndarray], shapes: Sequence[tuple[int, ...]], *, modulus: int) -> None:
    """Refuses (:class:`RejectedReply`) a SecAgg+ masked vector not of one int64 array mod ``modulus`` per summed
    array, each of its shape: a wrong shape would broadcast silently into the sum, a missing array cut it
    short, and uint64 turn it into floats that Flower's modulo cannot take."""
    if len(arrays) != len(shapes):
        raise RejectedReply(f"the masked vector has {len(arrays)} arrays, not {len(shapes)}")
    for index, (array, shape) in enumerate(zip(arrays, shapes)):
        if array.shape != tuple(shape) or array.dtype != np.dtype(np.int64):
            raise RejectedReply(f"masked array {index} is {array.dtype} {array.shape}, not int64 {tuple(shape)}")
        if array.size and (int(array.min()) < 0 or int(array.max()) >= modulus):
            raise RejectedReply(f"masked array {index} holds values outside [0, {modulus})")


def screen_replies(
    results: Sequence[tuple[Any, FitRes]], *, client_of_node: dict[int, int], sampled: Sequence[int],
    rules: ReplyRules, train: bool, delta_shapes: Sequence[tuple[int, ...]] | None, round_index: int | None = None,
) -> tuple[list[tuple[Any, FitRes, CheckedReply]], list[Rejection]]:
    """Every reply (with its proxy: anything with a ``node_id``) checked; the accepted ones in client order, and the
    rejections, which include a node not sampled this round and a second reply for the same client."""
    accepted: dict[int, tuple[Any, FitRes, CheckedReply]] = {}
    rejected: list[Rejection] = []
    seen: set[int] = set()
    for proxy, res in results:
        client = client_of_node.get(int(proxy.node_id))
        if client is None or client not in sampled:
            rejected.append(Rejection(None, f"node {proxy.node_id} was not asked for a reply this round"))
            continue
        if client in seen:
            accepted.pop(client, None)  # neither copy can be told apart as the real one
            rejected.append(Rejection(client, "more than one reply for this client in one round"))
            continue
        seen.add(client)
        try:
            checked = check_reply(res, client=client, rules=rules, train=train, delta_shapes=delta_shapes, round_index=round_index)
            accepted[client] = (proxy, res, checked)
        except RejectedReply as err:
            rejected.append(Rejection(client, str(err)))
    return [accepted[c] for c in sorted(accepted)], rejected
