"""A client's side of every Orchestra round, as a Flower ``Client``.

Between rounds the client keeps only its privacy ledger and its last reply
(:mod:`privfed.federation.reply_store`, sent again if a resumed run replays
that round): each ``fit`` rebuilds the network from the server's state, runs
:func:`privfed.orchestra.client_update`, and replies with the model delta
and the mechanism's release. The memory of representations is dropped
inside ``client_update`` and never reaches the reply.

When the server runs SecAgg+, privfed's SecAgg+ mod (:mod:`privfed.federation.secagg_client`) masks the delta
before it leaves the node; the client first rescales it so that nothing is
clipped (:mod:`privfed.secagg.encoding`). The client's training
metrics stay on the client unless the declared run reports them
(``--report-client-metrics``, :func:`reported_metrics`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

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
    bytes_to_ndarray,
    ndarray_to_bytes,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)

from mechanisms import Mechanism, create_mechanism, get_mechanism_class
from privfed.device import resolve_device
from privfed.federation.client_config import ClientConfig
from privfed.federation.messages import (
    arrays_to_state,
    bytes_to_tensor,
    encode_release,
    state_to_arrays,
)
from privfed.federation.partitions import PARTITION_KEY
from privfed.federation.records import record_item
from privfed.federation.reply_store import ReplyStore, instructions_digest
from privfed.federation.secagg_masking import SHARE_KEY
from privfed.methods import get_method
from privfed.orchestra.client_update import client_update
from privfed.orchestra.model_state import shared_keys
from privfed.privacy.client_guard import ClientGuard, RoundRefused
from privfed.privacy.dp_sgd_plan import DpSgdSettings
from privfed.privacy.ledger import events_to_json
from privfed.secagg.encoding import (
    SECURE_METRIC_SCALES,
    encode_metrics,
    encode_update,
    initial_scales,
    secagg_weight_ratio,
)
from privfed.secagg.settings import SecAggPlusSettings

logger = logging.getLogger(__name__)


#: What the server learns of a failed round: nothing about why.
ROUND_FAILED = "this client's round failed; the reason is logged on the client only, since it may depend on its data"


class ClientRoundFailed(RuntimeError):
    """A client's round failed; the message the server sees says nothing about the client's data."""


def client_seed(run_seed: int, round_index: int, client_id: int) -> int:
    """Independent, reproducible seed per (run, round, client)."""
    return int(np.random.SeedSequence([run_seed, round_index, client_id]).generate_state(1)[0])


@dataclass(frozen=True)
class SecureSumSetup:
    """What this node's SecAgg+ round was set up with (Flower's mod keeps it in the node's state).

    ``node_min_shares`` is the node's own floor on the shares in a sum
    (``secure-sum-min-shares``): in deployment the run config sets K_min.
    """

    threshold: int
    modulus: int
    node_min_shares: int = 0


@dataclass
class DeclaredRun:
    """The run as its user declared it, which a client holds the server to.

    Attributes:
        client_config: What every fit instruction's client configuration must be.
        secagg: The SecAgg+ settings the declared run plans (None: ``--no-secagg``);
            a training round must use SecAgg+ with exactly these encodings.
        guard: The client's own calibration and ledger (:mod:`privfed.privacy.client_guard`).
        run: The run the node's ledger charges rounds to (Flower's run id, or the key a simulation passes).
        replies: The client's last reply, sent again when the same round of the same run is replayed
            (:mod:`privfed.federation.reply_store`).
    """

    client_config: ClientConfig
    secagg: SecAggPlusSettings | None
    guard: ClientGuard
    run: int
    replies: ReplyStore = field(default_factory=ReplyStore)


class OrchestraClient(Client):
    """Answers the server's fit instructions for one data partition.

    Args:
        client_id: The partition this client holds.
        num_partitions: How many the federation has (None: not checked).
        declared: The declared run the client holds the server to (None
            trusts the server, for library use without a declaration).
    """

    def __init__(
        self,
        client_id: int,
        num_partitions: int | None = None,
        *,
        declared: DeclaredRun | None = None,
        secure_sum: SecureSumSetup | None = None,
    ) -> None:
        self.client_id = client_id
        self.num_partitions = num_partitions
        self.declared = declared
        self.secure_sum = secure_sum

    def get_properties(self, ins: GetPropertiesIns) -> GetPropertiesRes:
        """Which partition this node holds: the server samples partitions, not node IDs."""
        return GetPropertiesRes(status=Status(code=Code.OK, message="ok"), properties={PARTITION_KEY: self.client_id})

    def fit(self, ins: FitIns) -> FitRes:
        if self.declared is None:
            return self._fit(ins, None)
        digest = instructions_digest(ins)
        # One computation per partition at a time: a second message for the round waits, then gets the stored reply.
        with self.declared.replies.computing(self.declared.run, int(ins.config["round"]), digest):
            return self._fit(ins, digest)

    def _fit(self, ins: FitIns, digest: str | None) -> FitRes:
        config = ClientConfig.from_json(str(ins.config["client_config"]))
        if self.num_partitions is not None and self.num_partitions != config.split.num_clients:
            raise ValueError(
                f"this federation has {self.num_partitions} partitions but the run expects "
                f"num_clients={config.split.num_clients}; start as many SuperNodes as clients"
            )
        torch.set_num_threads(config.threads)
        network = config.build_network()  # GroupNorm under DP-SGD
        keys = shared_keys(network)
        global_state = arrays_to_state(parameters_to_ndarrays(ins.parameters), keys)
        train = str(ins.config["task"]) == "train"
        centroids = bytes_to_tensor(record_item(ins.config["centroids"], bytes)) if "centroids" in ins.config else None
        mechanism: Mechanism | None = None
        if get_method(config.method).releases != (config.mechanism is not None):
            raise ValueError(f"method {config.method} and mechanism {config.mechanism} do not go together")
        params = json.loads(str(ins.config.get("mechanism_params", "{}")))
        dp_sgd = DpSgdSettings.from_json(str(ins.config["dp_sgd"])) if "dp_sgd" in ins.config else None
        if config.dp_sgd and dp_sgd is None:
            raise ValueError("the run trains with DP-SGD but the server sent no DP-SGD settings")
        images = config.split.client_images(self.client_id)
        shares = train and config.mechanism is not None and get_mechanism_class(config.mechanism).aggregated
        if shares:
            # Before anything is charged or computed: the sum must hold the noise the share leaves out.
            own = params if self.declared is None else self.declared.guard.own_parameters()[0]
            assert config.mechanism is not None  # shares implies a mechanism
            mechanism = self._secure_sum_mechanism(config.mechanism, own)
        if self.declared is not None and digest is not None:
            replayed = self._replayed(int(ins.config["round"]), digest, shares=shares)
            if replayed is not None:
                return replayed
            # Before anything touches the data: the round is checked and charged, or refused.
            self._admit(ins.config, config, params, dp_sgd, int(images.shape[0]), train, keys, digest)
            # What the server sent matched the client's own calibration; the client computes with its own.
            params, dp_sgd = self.declared.guard.own_parameters()
        labels = config.split.client_labels(self.client_id) if get_method(config.method).reads_labels else None
        if config.mechanism is not None and mechanism is None:
            mechanism = create_mechanism(config.mechanism, **params)
        if centroids is not None and mechanism is not None:
            mechanism.observe_global_centroids(centroids)
        try:
            update = client_update(
                network,
                global_state,
                centroids,
                images,
                train=train,
                config=config.local.replace(dp_sgd=dp_sgd),
                mechanism=mechanism,
                num_local_centroids=config.num_local_centroids,
                seed=client_seed(config.seed, int(ins.config["round"]), self.client_id),
                device=resolve_device(config.device),
                labels=labels,
            )
            if update.delta is not None and not all(bool(torch.isfinite(v).all()) for v in update.delta.values()):
                raise ValueError("the model delta holds NaN or Inf")  # FedAvg or SecAgg+ would spread it to everyone
        except Exception as err:
            # Flower forwards an exception's text to the server in plaintext, and a failed
            # check can depend on the data (e.g. how many representations were NaN).
            logger.error("client %d, round %s: update failed: %s", self.client_id, ins.config["round"], err)
            raise ClientRoundFailed(ROUND_FAILED) from None
        arrays = [] if update.delta is None else state_to_arrays(update.delta, keys)
        share: dict[str, bytes] = {}
        if update.share is not None:
            if "secagg_scales" not in ins.config:
                raise RoundRefused("a share of the secure sum leaves this node only inside SecAgg+")
            share = {SHARE_KEY: ndarray_to_bytes(update.share)}  # the SecAgg+ mod masks it and takes it out
        report = (config if self.declared is None else self.declared.client_config).report_client_metrics
        metrics = reported_metrics(update.metrics, report=report)
        if arrays and "secagg_scales" in ins.config:
            arrays = prepare_for_secagg(arrays, ins.config, update.num_samples)
            if report:
                # The training metrics join the masked sum, which shows the server their round means.
                arrays.append(encode_metrics(metrics, clipping_range=float(ins.config["secagg_clipping_range"])))
                metrics = {k: v for k, v in metrics.items() if k not in SECURE_METRIC_SCALES}
        res = FitRes(
            status=Status(code=Code.OK, message="ok"),
            parameters=ndarrays_to_parameters(arrays),
            num_examples=update.num_samples,
            metrics={
                **metrics,
                "client_id": self.client_id,
                "round": int(ins.config["round"]),  # the server refuses a reply for another round
                **({} if update.release is None else encode_release(update.release)),
                "dp_sgd_events": events_to_json(update.privacy_events),
                **share,
            },
        )
        if self.declared is not None and digest is not None:
            # Kept before it leaves: a reply that reached anyone can always be sent again instead of a new one.
            # A share is not kept: it is never sent again (see _replayed), so it need not lie on disk.
            kept = FitRes(res.status, res.parameters, res.num_examples, {k: v for k, v in res.metrics.items() if k != SHARE_KEY})
            self.declared.replies.answer(self.declared.run, int(ins.config["round"]), digest, kept)
        return res

    def _secure_sum_mechanism(self, mechanism: str, params: dict) -> Mechanism:
        """The aggregated mechanism, built from ``params``; refuses a round whose SecAgg+ setup would not hold its noise.

        ``params`` are the ones the client computes with (its own calibration
        in a declared run), so the same instance serves the round.
        """
        if self.secure_sum is None:
            raise RoundRefused(f"{mechanism} trains only in SecAgg+ rounds, and this round set none up")
        if self.secure_sum.threshold < self.secure_sum.node_min_shares:
            raise RoundRefused(
                f"this round's SecAgg+ threshold {self.secure_sum.threshold} is below this node's "
                f"secure-sum-min-shares {self.secure_sum.node_min_shares}"
            )
        try:
            built = create_mechanism(mechanism, **params)
            built.check_secure_sum(threshold=self.secure_sum.threshold, modulus=self.secure_sum.modulus)
        except ValueError as err:
            raise RoundRefused(f"this round's secure sum: {err}") from None
        return built

    def _replayed(self, round_index: int, digest: str, *, shares: bool = False) -> FitRes | None:
        """The reply this client already sent for this round of this run, when the server asks for it again.

        A resumed run replays the round a kill interrupted; the same
        instructions get the same message, so nothing new is released and
        nothing is charged twice. Other instructions for an answered round are
        refused, and so is any replay of a round that ``shares`` into a secure
        sum: the same share in a second sum over other survivors (one dropout
        is enough) would let the server difference the two sums and read this
        client's share, which holds only part of the noise.
        """
        declared = self.declared
        assert declared is not None
        stored = declared.replies.get(declared.run, round_index)
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

    def _admit(
        self,
        fit: dict,
        config: ClientConfig,
        params: dict,
        dp_sgd: DpSgdSettings | None,
        num_samples: int,
        train: bool,
        keys: list[str],
        digest: str,
    ) -> None:
        """Refuses a round that departs from the declared run or its budget (:class:`RoundRefused`).

        The round is recorded as begun as the guard charges it: a round begun,
        charged and never answered (a kill while the client computed) is
        admitted again without a second charge, since nothing of it left.
        """
        declared = self.declared
        assert declared is not None
        differing = declared.client_config.differences(config)
        if differing:
            raise RoundRefused(f"the server's client configuration differs from the declared run in {', '.join(differing)}")
        if train and declared.secagg is not None:
            check_secagg_encoding(fit, declared.secagg, keys)
        round_index = int(fit["round"])
        begun = declared.replies.get(declared.run, round_index)
        # A begun record exists only for a round the guard charged (it is written as the charge is made).
        unreleased = begun is not None and begun.reply is None and not begun.failed and begun.digest == digest
        declared.guard.admit(
            run=declared.run, round_index=round_index, mechanism=config.mechanism, params=params, dp_sgd=dp_sgd,
            batch_size=config.local.batch_size, epochs=config.local.epochs, num_samples=num_samples, train=train,
            unreleased=unreleased, on_charge=lambda: declared.replies.begin(declared.run, round_index, digest),
        )


def reported_metrics(metrics: dict[str, float], *, report: bool) -> dict[str, float]:
    """The training metrics a client sends: none unless its declared run reports them.

    Off by default, with or without SecAgg+: the server needs no client's
    loss to run Orchestra, and means over cohorts that change from round to
    round let the server solve for each client's own values. Step counts and
    timings stay home too: the counts follow from the public sizes, so the
    server can compute them, and a release's time depends on the data (an
    iterative clustering's convergence).
    """
    return dict(metrics) if report else {}


def check_secagg_encoding(fit: dict, declared: SecAggPlusSettings, keys: list[str]) -> None:
    """Refuses a training round without SecAgg+ or with SecAgg+ encodings other than the declared run's.

    The client divides its overflow indicators by its own weight ratio at the
    declared ``max_weight`` and quantisation; other values would make a
    raised flag count other than 1 and name the client again. The public
    scales must be finite and no smaller than the initial ones (the strategy
    only grows them): a tiny scale would turn a finite update into Inf, and
    the failure of that client's round would tell the server that its update
    passed a threshold the server chose.

    Raises:
        RoundRefused: naming the setting.
    """
    if "secagg_scales" not in fit:
        raise RoundRefused("the run declared SecAgg+; the server asked for an update without it")
    own = declared.encoding_config()
    sent = {key: fit.get(key) for key in own}
    if any(value is None or float(value) != float(own[key]) for key, value in sent.items()):
        raise RoundRefused(f"the server's SecAgg+ encoding {sent} differs from the declared run's {own}")
    scales = bytes_to_ndarray(fit["secagg_scales"])
    smallest = initial_scales(keys)
    if scales.shape != smallest.shape or not (np.isfinite(scales).all() and (scales >= smallest).all()):
        raise RoundRefused("the server's SecAgg+ scales are not finite, or below the initial scales, or of another shape")


def prepare_for_secagg(arrays: list[np.ndarray], config: dict, num_samples: int) -> list[np.ndarray]:
    max_weight = float(config["secagg_max_weight"])
    if num_samples > max_weight:
        raise ValueError(
            f"this client holds {num_samples} samples but the server set SecAgg+'s max_weight to {max_weight:g}; "
            "client and server disagree on the data partition"
        )
    quantization_range = int(config["secagg_quantization_range"])
    weight_ratio = secagg_weight_ratio(num_samples, max_weight=max_weight, quantization_range=quantization_range)
    return encode_update(
        arrays,
        bytes_to_ndarray(config["secagg_scales"]),
        weight_ratio=weight_ratio,
        clipping_range=float(config["secagg_clipping_range"]),
        quantization_range=quantization_range,
    )
