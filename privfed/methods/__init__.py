"""Orchestra, its ablations and the paper's federated SSL baselines: named methods behind one interface (:mod:`.base`)."""

from privfed.methods.base import CLUSTERED, FIXED_RANDOM, NO_CENTROIDS, STEP_VALUES, Batch, Method, StepOutput
from privfed.methods.orchestra import ORCHESTRA, Orchestra
from privfed.methods.registry import available_methods, build_network, get_method, register_method

__all__ = [
    "CLUSTERED", "FIXED_RANDOM", "NO_CENTROIDS", "ORCHESTRA", "STEP_VALUES", "Batch",
    "Method", "Orchestra", "StepOutput", "available_methods", "build_network", "get_method", "register_method",
]
