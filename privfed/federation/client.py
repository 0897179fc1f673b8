"""A client's side of every Orchestra round, as a Flower ``Client``.

Each ``fit`` computes from the client's declared run (:class:`DeclaredRun`),
never from the server's word (:mod:`privfed.federation.messages`), runs
:func:`~privfed.orchestra.client_update.run_client_round` and replies with the
model delta and the release, never the memory. Between rounds the client keeps
only its ledger and its last reply. Under SecAgg+ it rescales the delta
(:mod:`privfed.secagg.client_encoding`) before privfed's SecAgg+ mod masks it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from flwr.client import Client
from flwr.common import (
    Code,
    FitIns,
    FitRes,
    GetPropertiesIns,
    GetPropertiesRes,
    Status,
    ndarray_to_bytes,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)

from mechanisms import Mechanism, SecureSumMechanism, create_mechanism
from privfed.config import TrainConfig
from privfed.data.federated import FederatedSplit
from privfed.device import resolve_device
from privfed.federation.cohort_round import CohortJob, current_cohort
from privfed.federation.messages import arrays_to_state, bytes_to_tensor, encode_release, state_to_arrays
from privfed.federation.partitions import PARTITION_KEY
from privfed.federation.reply_store import ReplyStore, StoredReply, instructions_digest
from privfed.methods import build_network, get_method
from privfed.orchestra.client_update import run_client_round
from privfed.orchestra.cohort_training import TrainedMember, trains_in_cohort
from privfed.orchestra.local_training import LocalTrainingConfig
from privfed.orchestra.model_state import StateDict, shared_keys
from privfed.privacy.client_guard import ClientGuard, RoundRefused, declared_budget
from privfed.privacy.ledger import events_to_json
from privfed.records import record_item
from privfed.secagg.client_encoding import check_secagg_encoding, prepare_for_secagg
from privfed.secagg.encoding import encode_metrics
from privfed.secagg.masking import SHARE_KEY
from privfed.secagg.settings import SecAggPlusSettings, secagg_settings

logger = logging.getLogger(__name__)


#: What the server learns of a failed round: nothing about why.
ROUND_FAILED = "this client's round failed; the reason is logged on the client only, since it may depend on its data"


class ClientRoundFailed(RuntimeError):
    """A client's round failed; the message the server sees says nothing about the client's data."""


def client_seed(run_seed: int, round_index: int, client_id: int) -> int:
    """Independent, reproducible 64-bit seed per (run, round, client): 32 bits would repeat within a million."""
    return int(np.random.SeedSequence([run_seed, round_index, client_id]).generate_state(1, dtype=np.uint64)[0])


@dataclass(frozen=True)
class SecureSumSetup:
    """This node's SecAgg+ round setup (kept in the node's state), with its own floor ``secure-sum-min-shares`` and
    its bound on clients colluding with the server (``secagg-max-corrupt``)."""

    threshold: int
    modulus: int
    node_min_shares: int = 0
    max_corrupt: int = 0

    @property
    def honest_shares(self) -> int:
        """The fewest honest clients' shares a sum unmasked under this setup holds."""
        return self.threshold - self.max_corrupt


@dataclass
class DeclaredRun:
    """The run as its user declared it: the client computes every round from it, never from the server's word.

    Attributes:
        config: In deployment, the run config the server's operator submits.
        local: Local training hyperparameters (without DP-SGD settings: those are the guard's).
        secagg: None: ``--no-secagg``; else a training round must use SecAgg+ with exactly these encodings.
        guard: The client's own calibration and ledger (:mod:`privfed.privacy.client_guard`).
        run: The run the node's ledger charges rounds to (Flower's run id, or the key a simulation passes).
        replies: The client's last reply, sent again for a replayed round (:mod:`privfed.federation.reply_store`).
    """

    config: TrainConfig
    split: FederatedSplit
    local: LocalTrainingConfig
    secagg: SecAggPlusSettings | None
    guard: ClientGuard
    run: int
    replies: ReplyStore = field(default_factory=ReplyStore)

    @classmethod
    def of(
        cls, run: TrainConfig, partition: int, *, key: int, ledger: Path | None = None, replies: Path | None = None,
        node_cap: tuple[float, float] | None = None,
    ) -> DeclaredRun:
        """Partition ``partition``'s view of the declared ``run``, charged to run ``key``; calibrated here, once."""
        split = FederatedSplit.of(run)
        sizes = split.client_sizes()
        guard = ClientGuard(declared_budget(run, sizes[partition], node_cap=node_cap), ledger)
        local = LocalTrainingConfig.from_run(run)
        return cls(run, split, local, secagg_settings(run, sizes), guard, key, ReplyStore(replies))

    def accepted_keys(self, *, train: bool) -> set[str]:
        """What a fit instruction may carry: what varies by round, and in a SecAgg+ training round its scales and encoding."""
        return ROUND_KEYS | ({"secagg_scales", *self.secagg.encoding_config()} if self.secagg is not None and train else set())


#: The fit-config keys of every round: the task, the round index and the public centroids (absent in round 0).
ROUND_KEYS = {"task", "round", "centroids"}


class OrchestraClient(Client):
    """Answers the server's fit instructions for partition ``client_id`` of its declared run."""

    def __init__(self, client_id: int, declared: DeclaredRun, *, secure_sum: SecureSumSetup | None = None) -> None:
        self.client_id = client_id
        self.declared = declared
        self.secure_sum = secure_sum

    def get_properties(self, ins: GetPropertiesIns) -> GetPropertiesRes:
        """Which partition this node holds: the server samples partitions, not node IDs."""
        return GetPropertiesRes(status=Status(code=Code.OK, message="ok"), properties={PARTITION_KEY: self.client_id})

    def fit(self, ins: FitIns) -> FitRes:
        if ins.config.get("task") not in ("init", "train"):
            raise RoundRefused(f"the task is 'init' or 'train', not {ins.config.get('task')!r}")
        unexpected = sorted(set(ins.config) - self.declared.accepted_keys(train=ins.config["task"] == "train"))
        if unexpected:
            raise RoundRefused(f"unexpected key {unexpected[0]!r}: the client reads all but the round's values from its declared run")
        round_index, digest = int(ins.config["round"]), instructions_digest(ins)
        # One computation per partition at a time: a second message for the round waits, then gets the stored reply.
        with self.declared.replies.computing(self.declared.run, round_index, digest):
            return self._fit(ins, round_index, digest)

    def _fit(self, ins: FitIns, round_index: int, digest: str) -> FitRes:
        declared = self.declared
        config, budget, split = declared.config, declared.guard.budget, declared.split
        torch.set_num_threads(max(1, int(config.client_cpus)))
        network = build_network(config)  # GroupNorm under DP-SGD
        keys = shared_keys(network)
        global_state = arrays_to_state(parameters_to_ndarrays(ins.parameters), keys, copy=False)  # fresh arrays, ours alone
        train = ins.config["task"] == "train"
        centroids = bytes_to_tensor(record_item(ins.config["centroids"], bytes)) if "centroids" in ins.config else None
        # Before anything is charged: the client's own mechanism, and the sum that must hold a secure-sum one's noise.
        mechanism = self._mechanism(train, round_index)
        stored = declared.replies.get(declared.run, round_index)  # read once: the last reply may be model-sized
        replayed = self._replayed(stored, round_index, digest, shares=train and isinstance(mechanism, SecureSumMechanism))
        if replayed is not None:
            return replayed
        # Before anything touches the data: the round is checked and charged, or refused.
        scales = check_secagg_encoding(ins.config, declared.secagg, keys) if train and declared.secagg is not None else None
        self._admit(stored, round_index, train, digest)
        images = split.client_images(self.client_id)
        labels = split.client_labels(self.client_id) if get_method(config.method).reads_labels else None
        if centroids is not None and mechanism is not None:
            mechanism.observe_global_centroids(centroids)
        trained = self._cohort_training(round_index, digest, train, images, global_state, centroids)
        try:
            update, _ = run_client_round(
                network,
                global_state,
                centroids,
                images,
                train=train,
                config=declared.local.replace(dp_sgd=budget.dp_sgd),
                mechanism=mechanism,
                num_local_centroids=config.num_local_centroids,
                seed=client_seed(config.seed, round_index, self.client_id),
                device=resolve_device(config.device),
                labels=labels,
                trained=trained,
            )
            if update.delta is not None and not all(is_finite(v) for v in update.delta.values()):
                raise ValueError("the model delta holds NaN or Inf")  # FedAvg or SecAgg+ would spread it to everyone
        except Exception as err:
            # Flower forwards an exception's text to the server in plaintext, and a failed
            # check can depend on the data (e.g. how many representations were NaN).
            logger.error("client %d, round %s: update failed: %s", self.client_id, round_index, err)
            raise ClientRoundFailed(ROUND_FAILED) from None
        arrays = [] if update.delta is None else state_to_arrays(update.delta, keys)
        share: dict[str, bytes] = {}
        if update.share is not None:
            if "secagg_scales" not in ins.config:
                raise RoundRefused("a share of the secure sum leaves this node only inside SecAgg+")
            share = {SHARE_KEY: ndarray_to_bytes(update.share)}  # the SecAgg+ mod masks it and takes it out
        report = config.report_client_metrics
        metrics = reported_metrics(update.metrics, report=report)
        if arrays and declared.secagg is not None and scales is not None:
            arrays = prepare_for_secagg(arrays, scales, declared.secagg, update.num_samples)
            if report:
                # The training metrics join the masked sum, which shows the server their round means.
                arrays.append(encode_metrics(metrics, clipping_range=declared.secagg.clipping_range))
            # Under SecAgg+ no training metric travels in plaintext: one the masked sum has no slot for
            # (a plug-in method's own value) stays home.
            metrics = {}
        res = FitRes(
            status=Status(code=Code.OK, message="ok"),
            parameters=ndarrays_to_parameters(arrays),
            num_examples=update.num_samples,
            metrics={
                **metrics,
                "client_id": self.client_id,
                "round": round_index,  # the server refuses a reply for another round
                **({} if update.release is None else encode_release(update.release)),
                "dp_sgd_events": events_to_json(update.privacy_events),
                **share,
            },
        )
        # Kept before it leaves: a reply that reached anyone can always be sent again instead of a new one.
        # A share is not kept: it is never sent again (see _replayed), so it need not lie on disk.
        kept = FitRes(res.status, res.parameters, res.num_examples, {k: v for k, v in res.metrics.items() if k != SHARE_KEY})
        declared.replies.answer(declared.run, round_index, digest, kept)
        return res

    def _cohort_training(
        self, round_index: int, digest: str, train: bool, images: torch.Tensor, global_state: StateDict,
        centroids: torch.Tensor | None,
    ) -> TrainedMember | None:
        """This admitted round's training, done in the local runtime's cohort (None: the client trains alone).

        The runtime's first pass hands the round to the cohort (:mod:`privfed.federation.cohort_round`). Only a
        client that keeps its state on disk joins: the second pass must find the round begun, or charge it again.
        """
        cohort = current_cohort()
        if cohort is None or not train or self.declared.replies.path is None:
            return None
        key = (self.client_id, self.declared.run, round_index, digest)
        if not cohort.collecting:
            return cohort.take(key)
        if trains_in_cohort(self.declared.local.replace(dp_sgd=self.declared.guard.budget.dp_sgd)) is None:
            seed = client_seed(self.declared.config.seed, round_index, self.client_id)
            cohort.admit(key, CohortJob(images, seed), global_state, centroids)
        return None

    def _mechanism(self, train: bool, round_index: int) -> Mechanism | None:
        """The declared mechanism from the client's own calibration (None: nothing is released this round); refuses a
        round it cannot serve (a secure-sum mechanism's training round whose SecAgg+ setup would not hold its noise)."""
        budget = self.declared.guard.budget
        name, params = budget.mechanism, budget.params
        if name is None or not budget.releases_in(round_index=round_index, train=train):
            return None
        try:
            built = create_mechanism(name, **params)
        except (TypeError, ValueError) as err:
            raise RoundRefused(f"the declared {name} parameters do not build the mechanism: {err}") from None
        if not (train and isinstance(built, SecureSumMechanism)):
            return built
        if self.secure_sum is None:
            raise RoundRefused(f"{name} trains only in SecAgg+ rounds, and this round set none up")
        honest = self.secure_sum.honest_shares
        if honest < self.secure_sum.node_min_shares:
            raise RoundRefused(
                f"this round's SecAgg+ sums hold {honest} honest shares (threshold {self.secure_sum.threshold} less "
                f"{self.secure_sum.max_corrupt} corrupt), below this node's secure-sum-min-shares "
                f"{self.secure_sum.node_min_shares}"
            )
        try:
            # Corrupt clients' shares hold noise the server knows: only the honest ones count towards K_min.
            built.check_secure_sum(threshold=honest, modulus=self.secure_sum.modulus)
        except ValueError as err:
            raise RoundRefused(f"this round's secure sum, counting its {honest} honest shares: {err}") from None
        return built

    def _replayed(self, stored: StoredReply | None, round_index: int, digest: str, *, shares: bool = False) -> FitRes | None:
        """The reply this client already sent for this round of this run (``stored``), when asked again.

        A resumed run replays the round a kill interrupted: the same
        instructions get the same message, so nothing is released or charged
        twice. Other instructions for an answered round are refused, and so is
        any replay of a round that ``shares`` into a secure sum: the same share
        in a second sum over other survivors would let the server difference
        the two sums and read this client's share, which holds only part of the noise.
        """
        declared = self.declared
        if stored is None or (stored.reply is None and not stored.failed):
            return None
        if stored.digest != digest:
            raise RoundRefused(f"round {round_index} of run {declared.run} was answered already, for other instructions")
        if stored.failed:
            raise ClientRoundFailed(ROUND_FAILED)
        if shares:
            raise RoundRefused(f"round {round_index}'s share went into one secure sum already; it is never sent again")
        logger.info("client %d, round %d: sending the reply it sent before again", self.client_id, round_index)
        return stored.reply

    def _admit(self, begun: StoredReply | None, round_index: int, train: bool, digest: str) -> None:
        """Charges the round to the guard, or refuses it past the budget (:class:`RoundRefused`). A round charged (so
        recorded as begun) but never answered, killed mid-computation, is admitted again without a second charge."""
        declared = self.declared
        unreleased = begun is not None and begun.reply is None and not begun.failed and begun.digest == digest
        declared.guard.admit(
            run=declared.run, round_index=round_index, train=train, unreleased=unreleased,
            on_charge=lambda: declared.replies.begin(declared.run, round_index, digest),
        )


def reported_metrics(metrics: dict[str, float], *, report: bool) -> dict[str, float]:
    """The training metrics a client sends: none unless its declared run reports them.

    Off by default, with or without SecAgg+: Orchestra needs no client's loss,
    and means over changing cohorts let the server solve for each client's
    values. Step counts (public: from the sizes) and timings (a release's
    time depends on the data) stay home too.
    """
    return dict(metrics) if report else {}


def is_finite(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` holds no NaN or Inf: its extremes are finite (both propagate NaN); one reduction, with
    no model-sized mask (``torch.isfinite``), takes about half the time at ResNet-18 size."""
    if not tensor.numel() or not tensor.is_floating_point():
        return True
    low, high = torch.aminmax(tensor)
    return math.isfinite(float(low)) and math.isfinite(float(high))
