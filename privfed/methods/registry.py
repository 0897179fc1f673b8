"""Name → method registry (plug-ins: :func:`register_method`, or the ``privfed.methods`` entry-point group naming a
:class:`~privfed.methods.base.Method`), and the network a run's method declares::

    [project.entry-points."privfed.methods"]
    mymethod = "mypkg.mymethod:METHOD"
"""

from __future__ import annotations

from typing import Protocol

from mechanisms.registry import load_plugins
from privfed.methods.base import Method
from privfed.methods.baselines import BASELINES
from privfed.methods.orchestra import ORCHESTRA_METHODS
from privfed.models.network import OrchestraNetwork, network_norm

ENTRY_POINT_GROUP = "privfed.methods"

_METHODS: dict[str, Method] = {}


def register_method(method: Method) -> Method:
    """Adds a method under its name; a name is registered once."""
    if not isinstance(method, Method):
        raise TypeError(f"{method!r} is not a privfed.methods.Method")
    if _METHODS.get(method.name, method) is not method:
        raise ValueError(f"method {method.name!r} is already registered")
    _METHODS[method.name] = method
    return method


def get_method(name: str) -> Method:
    load_plugins(ENTRY_POINT_GROUP, _METHODS, register_method, ValueError)
    try:
        return _METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r} (choose from {', '.join(_METHODS)})") from None


def available_methods() -> dict[str, Method]:
    """Installed methods, built-ins first, in registration order."""
    load_plugins(ENTRY_POINT_GROUP, _METHODS, register_method, ValueError)
    return dict(_METHODS)


class NetworkSpec(Protocol):
    """What fixes the architecture: a run's :class:`~privfed.config.TrainConfig` or a client's configuration."""

    @property
    def method(self) -> str: ...
    @property
    def backbone(self) -> str: ...
    @property
    def projection_dim(self) -> int: ...
    @property
    def projection_hidden_dim(self) -> int | None: ...
    @property
    def cluster_head_outputs(self) -> int | None: ...
    @property
    def classifier_outputs(self) -> int | None: ...
    @property
    def dp_sgd(self) -> bool: ...


def build_network(config: NetworkSpec) -> OrchestraNetwork:
    """The run's network, as server, clients and checkpoint loading all build it: heads from the method,
    normalisation from ``config.dp_sgd``."""
    return OrchestraNetwork(
        config.backbone, config.projection_dim, projection_hidden_dim=config.projection_hidden_dim,
        norm=network_norm(dp_sgd=config.dp_sgd), heads=get_method(config.method).heads,
        num_clusters=config.cluster_head_outputs, num_classes=config.classifier_outputs,
    )


for _method in (*ORCHESTRA_METHODS, *BASELINES):
    register_method(_method)
