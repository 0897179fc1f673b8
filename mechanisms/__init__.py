"""Pluggable centroid-release mechanisms.

A mechanism turns a client's representations into what leaves the client.
Depends only on torch, numpy and scipy, never on :mod:`privfed`.
"""

from mechanisms import ddp_sums as _ddp_sums  # noqa: F401  (registers the built-ins)
from mechanisms import kanon as _kanon  # noqa: F401
from mechanisms import ldp as _ldp  # noqa: F401
from mechanisms import ldp_sums as _ldp_sums  # noqa: F401
from mechanisms import reps as _reps  # noqa: F401
from mechanisms.base import (
    Guarantee,
    Mechanism,
    MechanismPlan,
    PrivacyEvent,
    Release,
    ReleaseMechanism,
    SecureSumMechanism,
    TableRelease,
    TableReleaseMechanism,
    round_releases,
)
from mechanisms.planning import PlanRequest, SecureSumSetup
from mechanisms.registry import (
    MechanismRegistrationError,
    UnknownMechanismError,
    available_mechanisms,
    create_mechanism,
    dp_mechanisms,
    get_mechanism_class,
    register_mechanism,
)

__all__ = [
    "Guarantee",
    "Mechanism",
    "MechanismPlan",
    "MechanismRegistrationError",
    "PlanRequest",
    "PrivacyEvent",
    "Release",
    "ReleaseMechanism",
    "SecureSumMechanism",
    "SecureSumSetup",
    "TableRelease",
    "TableReleaseMechanism",
    "UnknownMechanismError",
    "available_mechanisms",
    "create_mechanism",
    "dp_mechanisms",
    "get_mechanism_class",
    "register_mechanism",
    "round_releases",
]
