"""Orchestra and its ablations, each a named method a run can choose.

A method says two things: which terms of the objective train the encoder
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


@dataclass(frozen=True)
class Objective:
    """Which loss terms train the encoder, and which encoder makes the cluster targets.

    Attributes:
        cluster_loss: Train the online encoder to predict the target's cluster assignment.
        rotation_loss: Train it to predict the quarter turn of a rotated view.
        ema_targets: The EMA target encoder makes the cluster targets and the
            memory; False uses the online encoder itself (without gradient).
    """

    cluster_loss: bool = True
    rotation_loss: bool = True
    ema_targets: bool = True

    def __post_init__(self) -> None:
        if not (self.cluster_loss or self.rotation_loss):
            raise ValueError("an objective needs the cluster loss, the rotation loss or both")


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
