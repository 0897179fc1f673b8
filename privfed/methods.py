"""Orchestra, its ablations and the paper's federated SSL baselines, each a named method a run can choose.

A method says two things: which loss trains the encoder
(:class:`Objective`), and where the global centroids come from
(:data:`CENTROID_SOURCES`). Everything else (data, rounds, sampling, secure
aggregation, evaluation, the summary) is the same pipeline for every method,
so their kNN accuracies compare like for like.

The ablations answer "does the clustering matter?": ``rotpred`` learns from
rotation prediction alone (the paper's RotPred baseline), and
``orchestra-fixed-centroids`` trains against centroids drawn at random once
and never updated, which keeps the cluster loss but switches the clustering
off. Methods that do not cluster release nothing: their clients send model
updates only.

The baselines (``simclr``, ``simsiam``, ``byol``, ``specloss``) are the
paper's f-SimCLR, f-SimSiam, f-BYOL and f-SpecLoss: stateless clients train
the baseline's loss on their own data (:mod:`privfed.baselines`) and the
server averages the models (FedAvg, under SecAgg+ like every method).
``supervised`` is supervised FedAvg on the clients' labels, the paper's
upper reference.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Global centroids from clustering the clients' releases every round (Orchestra).
CLUSTERED = "clustered"
#: Global centroids drawn at random on the unit sphere once, then fixed; no releases.
FIXED_RANDOM = "fixed-random"
#: No centroids and no releases: the cluster loss is off.
NO_CENTROIDS = "none"
CENTROID_SOURCES = (CLUSTERED, FIXED_RANDOM, NO_CENTROIDS)


#: The loss of Orchestra and its ablations: the cluster and/or the rotation term.
ORCHESTRA_LOSS = "orchestra"
#: The federated SSL baselines' losses (:mod:`privfed.baselines.losses`), trained on two views per image.
BASELINE_LOSSES = ("simclr", "simsiam", "byol", "specloss")
#: Cross-entropy on the clients' labels: supervised FedAvg, the paper's upper reference.
SUPERVISED_LOSS = "supervised"
#: Losses in which one sample's value depends on the other samples of its batch (negatives):
#: DP-SGD's per-sample clipping cannot bound one example's influence on them.
BATCH_COUPLED_LOSSES = ("simclr", "specloss")


@dataclass(frozen=True)
class Objective:
    """Which loss trains the encoder: Orchestra's terms, or a baseline's loss.

    Attributes:
        loss: :data:`ORCHESTRA_LOSS`, one of :data:`BASELINE_LOSSES` or :data:`SUPERVISED_LOSS`.
        cluster_loss: Orchestra: train the online encoder to predict the target's cluster assignment.
        rotation_loss: Orchestra: train it to predict the quarter turn of a rotated view.
        ema_targets: An EMA target encoder makes the targets (Orchestra's
            cluster targets and memory, BYOL's regression targets); False
            uses the online encoder itself (without gradient).
    """

    loss: str = ORCHESTRA_LOSS
    cluster_loss: bool = True
    rotation_loss: bool = True
    ema_targets: bool = True

    def __post_init__(self) -> None:
        if self.loss == ORCHESTRA_LOSS:
            if not (self.cluster_loss or self.rotation_loss):
                raise ValueError("an objective needs the cluster loss, the rotation loss or both")
            return
        losses = (ORCHESTRA_LOSS, *BASELINE_LOSSES, SUPERVISED_LOSS)
        if self.loss not in losses:
            raise ValueError(f"unknown loss {self.loss!r} (choose from {', '.join(losses)})")
        if self.cluster_loss or self.rotation_loss:
            raise ValueError(f"the {self.loss} loss has no cluster or rotation term")
        if self.ema_targets != (self.loss == "byol"):
            raise ValueError("of the baselines, BYOL and only BYOL regresses onto an EMA target network")

    @classmethod
    def baseline(cls, loss: str) -> Objective:
        """A baseline's objective: its loss alone (BYOL's with its EMA target)."""
        return cls(loss=loss, cluster_loss=False, rotation_loss=False, ema_targets=loss == "byol")

    @property
    def uses_labels(self) -> bool:
        """Whether clients train on their labels (supervised FedAvg only)."""
        return self.loss == SUPERVISED_LOSS

    @property
    def couples_batch(self) -> bool:
        """Whether one sample's loss depends on the rest of its batch (then DP-SGD cannot train it)."""
        return self.loss in BATCH_COUPLED_LOSSES


@dataclass(frozen=True)
class Method:
    """A named training method: an objective and a source of global centroids."""

    name: str
    description: str
    objective: Objective
    centroids: str = CLUSTERED

    def __post_init__(self) -> None:
        if self.centroids not in CENTROID_SOURCES:
            raise ValueError(f"unknown centroid source {self.centroids!r} (choose from {', '.join(CENTROID_SOURCES)})")
        if self.objective.cluster_loss != (self.centroids != NO_CENTROIDS):
            raise ValueError("the cluster loss needs global centroids, and global centroids need the cluster loss")

    @property
    def releases(self) -> bool:
        """Whether clients release anything about their representations (only to cluster them)."""
        return self.centroids == CLUSTERED


_METHODS: dict[str, Method] = {}


def register_method(method: Method) -> Method:
    """Adds a method under its name; a name is registered once."""
    if method.name in _METHODS:
        raise ValueError(f"method {method.name!r} is already registered")
    _METHODS[method.name] = method
    return method


def get_method(name: str) -> Method:
    try:
        return _METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r} (choose from {', '.join(_METHODS)})") from None


def available_methods() -> dict[str, Method]:
    return dict(_METHODS)


ORCHESTRA = register_method(
    Method("orchestra", "Orchestra: clustering-based federated self-supervised learning", Objective())
)
register_method(
    Method(
        "rotpred",
        "ablation: rotation prediction only, no centroids, nothing released (the paper's RotPred)",
        Objective(cluster_loss=False),
        centroids=NO_CENTROIDS,
    )
)
register_method(
    Method("orchestra-no-rotation", "ablation: Orchestra without the rotation head's loss", Objective(rotation_loss=False))
)
register_method(
    Method(
        "orchestra-no-target",
        "ablation: Orchestra without the target network (the online encoder makes the cluster targets)",
        Objective(ema_targets=False),
    )
)
register_method(
    Method(
        "orchestra-fixed-centroids",
        "control: Orchestra against global centroids drawn at random once (clustering off, nothing released)",
        Objective(),
        centroids=FIXED_RANDOM,
    )
)

_BASELINES = {
    "simclr": "f-SimCLR: NT-Xent contrast of two views against the batch's other images (FedAvg, nothing released)",
    "simsiam": "f-SimSiam: a predictor chases the other view's stop-gradient projection (FedAvg, nothing released)",
    "byol": "f-BYOL: a predictor chases an EMA target network's projection of the other view (FedAvg, nothing released)",
    "specloss": "f-SpecLoss: spectral contrastive loss on a linear cluster head (FedAvg, nothing released)",
}
for _name, _description in _BASELINES.items():
    register_method(Method(_name, _description, Objective.baseline(_name), centroids=NO_CENTROIDS))
register_method(
    Method(
        "supervised",
        "supervised FedAvg: cross-entropy on the clients' own labels, the upper reference (nothing released)",
        Objective.baseline(SUPERVISED_LOSS),
        centroids=NO_CENTROIDS,
    )
)
