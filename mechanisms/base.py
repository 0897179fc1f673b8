"""The two mechanism interfaces, and what they exchange with privfed.

A mechanism decides what a client's representations turn into before they
leave the client: a :class:`Release` the server reads
(:class:`ReleaseMechanism`), or a share it reads only inside SecAgg+'s sum
(:class:`SecureSumMechanism`). A new mechanism needs no change outside its own module.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np
import torch

from mechanisms.planning import PlanRequest


@dataclass(frozen=True)
class Guarantee:
    """What a release protects, stated so a user can quote it.

    Attributes:
        kind: One of :data:`GUARANTEE_KINDS`.
        statement: One sentence describing the guarantee.
        k: Anonymity-set size for k-anonymous releases.
        epsilon: Per-release epsilon for DP releases.
        delta: Per-release delta for DP releases.
    """

    kind: str
    statement: str
    k: int | None = None
    epsilon: float | None = None
    delta: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class PrivacyEvent:
    """One noise-adding step, recorded so an accountant can compose it later.

    Attributes:
        name: Event family, e.g. ``"gaussian"`` or ``"discrete_laplace"``.
        params: Parameters the accountant needs (noise scale, sensitivity...).
    """

    name: str
    params: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Release:
    """Everything a client sends the server about its representations.

    Attributes:
        vectors: ``[m, D]`` released points (centroids, or raw representations
            for mechanisms without privacy).
        weights: ``[m]`` how many representations each point stands for; the
            server uses them to weigh releases of different sizes consistently.
        guarantee: The protection this particular release carries.
        events: Privacy events for the accountant (empty if not DP).
        metrics: Diagnostics that are safe to publish (no data-derived values
            beyond what the guarantee already covers).
    """

    vectors: torch.Tensor
    weights: torch.Tensor
    guarantee: Guarantee
    events: tuple[PrivacyEvent, ...] = ()
    metrics: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.vectors.ndim != 2:
            raise ValueError(f"release vectors must be [m, D], got shape {tuple(self.vectors.shape)}")
        if self.weights.shape != (self.vectors.shape[0],):
            raise ValueError(
                f"release weights must have shape ({self.vectors.shape[0]},), "
                f"got {tuple(self.weights.shape)}"
            )

    @property
    def num_vectors(self) -> int:
        return int(self.vectors.shape[0])


@dataclass(frozen=True)
class TableRelease(Release):
    """A release that is a noisy table over public cells: the server adds a round's tables up.

    Attributes:
        table: ``[cells, D + 1]`` int64: each cell's noisy sum, then its noisy count, in the mechanism's integer
            units, over the centres the client partitioned by (the global centroids it was sent; round 0: its own).
            ``vectors`` and ``weights`` are its :meth:`TableReleaseMechanism.table_view`.
    """

    table: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 1, dtype=torch.int64))

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.table.ndim != 2 or self.table.dtype != torch.int64:
            raise ValueError(f"a release table must be an int64 [cells, D + 1] tensor, got {self.table.dtype} "
                             f"{tuple(self.table.shape)}")


@dataclass(frozen=True)
class MechanismPlan:
    """A mechanism's answer: the parameters every client builds it with and what one release costs.

    Attributes:
        params: JSON-able constructor arguments.
        events: Privacy events of one release (empty unless DP).
        mechanism: The mechanism built from ``params``.
    """

    params: dict[str, Any]
    events: tuple[PrivacyEvent, ...]
    mechanism: Mechanism


#: How many times its size a DP mechanism's noisy weights may total, unless it bounds its noise itself.
DP_WEIGHT_ROOM = 1000.0

#: :attr:`Guarantee.kind` and :attr:`Mechanism.guarantee_kind` values.
DIFFERENTIAL_PRIVACY = "differential-privacy"
K_ANONYMITY = "k-anonymity"
NO_GUARANTEE = "none"
GUARANTEE_KINDS = (DIFFERENTIAL_PRIVACY, K_ANONYMITY, NO_GUARANTEE)


def _refusing_non_finite(method: Any) -> Any:
    """``method`` (a release or share), preceded by :func:`check_representations` on its ``reps``."""
    if getattr(method, "_refuses_non_finite", False):
        return method

    @functools.wraps(method)
    def checked(self: Mechanism, reps: torch.Tensor, **kwargs: Any) -> Any:
        check_representations(reps)
        return method(self, reps, **kwargs)

    checked._refuses_non_finite = True  # type: ignore[attr-defined]
    return checked


def check_representations(reps: torch.Tensor) -> None:
    """Refuses what no release may be computed from: anything but a floating ``[n, D]`` tensor of finite values.

    A NaN survives clipping, and rounding it to an integer gives -2**63,
    which wraps the noisy sums it joins and can reveal exact counts; an
    infinite row has no direction to average.

    Raises:
        ValueError: naming the problem; the client then fails its round
            instead of sending anything.
    """
    if not isinstance(reps, torch.Tensor) or reps.ndim != 2 or not reps.is_floating_point():
        shape = tuple(reps.shape) if isinstance(reps, torch.Tensor) else type(reps).__name__
        raise ValueError(f"representations must be a floating [n, D] tensor, got {getattr(reps, 'dtype', '')} {shape}")
    bad = int((~torch.isfinite(reps)).any(dim=1).sum())
    if bad:
        raise ValueError(f"{bad} of {reps.shape[0]} representations hold NaN or Inf; nothing is released")


class Mechanism(abc.ABC):
    """What every mechanism tells privfed: its guarantee, what a round costs, and its own plan.

    There are two kinds, each an interface of its own: a
    :class:`ReleaseMechanism` sends each client's :class:`Release` to the
    server, a :class:`SecureSumMechanism` sends a share that the server reads
    only inside SecAgg+'s sum. Subclasses set ``name``, ``description`` and
    ``guarantee_kind``; constructor arguments are keyword-only, so a plan's
    parameters build the mechanism with ``cls(**params)``.

    A differentially private mechanism implements :meth:`calibrate` and
    :meth:`privacy_events`; its guarantee holds for replacing one row of the
    representations it is handed by another (replace-one, as
    :mod:`mechanisms.accounting` composes), the unit privfed's ledger
    composes. privfed hands it at most one row per image of the client.
    What privfed checks of a mechanism and what it trusts: docs/privacy.md,
    "What a mechanism promises".
    """

    name: ClassVar[str]
    description: ClassVar[str]
    #: One of :data:`GUARANTEE_KINDS`: what every release carries (default: nothing).
    guarantee_kind: ClassVar[str] = NO_GUARANTEE
    #: True when what is sent holds client representations themselves (no protection at all).
    releases_raw_data: ClassVar[bool] = False
    #: The settings a run may give the mechanism (``privfed train``'s mechanism flags), with their defaults.
    settings: ClassVar[Mapping[str, Any]] = MappingProxyType({})

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Makes every :meth:`ReleaseMechanism.release`, ``release_with_members`` and :meth:`SecureSumMechanism.share`
        a subclass defines in its body refuse non-finite input (:func:`check_representations`)."""
        super().__init_subclass__(**kwargs)
        for name in ("release", "release_with_members", "share"):
            method = cls.__dict__.get(name)
            if callable(method) and not getattr(method, "__isabstractmethod__", False):
                setattr(cls, name, _refusing_non_finite(method))

    @classmethod
    @abc.abstractmethod
    def releases_in(cls, *, train: bool) -> bool:
        """Whether a client sends anything of its representations in a round (``train`` False: an initialisation round)."""

    @classmethod
    def max_releases(cls, rounds: int, *, release_every: int = 1) -> int:
        """Releases one client makes when sampled in every round of a run of ``rounds`` training rounds that releases
        in every ``release_every``-th (:func:`round_releases`)."""
        check_release_every(release_every)
        return -(-rounds // release_every) + int(cls.releases_in(train=False))

    @classmethod
    def is_differentially_private(cls) -> bool:
        return cls.guarantee_kind == DIFFERENTIAL_PRIVACY

    @classmethod
    def calibrate(cls, *, epsilon: float, delta: float, num_releases: int) -> dict[str, Any]:
        """Constructor arguments whose ``num_releases`` releases compose to at most ``(epsilon, delta)``.

        JSON-able, with every noise scale explicit: clients build the
        mechanism from them and never re-calibrate. Only DP mechanisms have it.
        """
        raise NotImplementedError(f"mechanism {cls.name!r} is not differentially private: it has no budget")

    @classmethod
    def calibration_options(cls, request: PlanRequest, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Keyword arguments :meth:`calibrate` takes besides the budget (none by default)."""
        return {}

    @classmethod
    def checked_settings(cls, given: Mapping[str, Any]) -> dict[str, Any]:
        """The class's :attr:`settings` with ``given`` over them; refuses one it does not take or of another type.

        Raises:
            ValueError: naming the setting.
        """
        unknown = sorted(set(given) - set(cls.settings))
        if unknown:
            takes = ", ".join(sorted(cls.settings)) or "none"
            raise ValueError(f"mechanism {cls.name} takes no setting {unknown[0]!r} (it takes: {takes})")
        for key, value in given.items():
            if type(value) is not type(cls.settings[key]):
                raise ValueError(f"mechanism {cls.name}'s {key} must be {type(cls.settings[key]).__name__}, got {value!r}")
        return {**cls.settings, **given}

    @classmethod
    def planned_parameters(cls, request: PlanRequest, settings: Mapping[str, Any]) -> dict[str, Any]:
        """The constructor arguments every client builds the mechanism with: a DP one's calibration to the budget."""
        if not cls.is_differentially_private():
            return {}
        if request.epsilon is None:
            raise ValueError("it is differentially private and needs an epsilon")
        params = cls.calibrate(
            epsilon=request.epsilon, delta=request.delta, num_releases=request.num_releases,
            **cls.calibration_options(request, settings),
        )
        try:
            return json.loads(json.dumps(params))
        except (TypeError, ValueError) as err:
            raise ValueError(f"its calibrated parameters are not JSON: {err}") from None

    @classmethod
    def plan(cls, request: PlanRequest) -> MechanismPlan:
        """The run's parameters for this mechanism and what one release costs.

        Building the mechanism here refuses noise its samplers cannot draw
        before any round is charged.

        Raises:
            ValueError: when the request does not fit the mechanism.
        """
        mechanism = cls(**(params := cls.planned_parameters(request, cls.checked_settings(request.settings))))
        return MechanismPlan(params=params, events=mechanism.privacy_events(), mechanism=mechanism)

    def privacy_events(self) -> tuple[PrivacyEvent, ...]:
        """What one release costs, for the run's ledger (empty when not differentially private)."""
        return ()

    @property
    def input_sampling_rate(self) -> float:
        """Chance that a row handed to the mechanism enters its output; below 1, privfed hands it one row per image."""
        return 1.0

    def rows_per_vector(self, *, rows: int, dim: int, num_centroids: int) -> float | None:
        """Fewest representations a vector must stand for to rise above the noise (None: no floor); the plan prints it."""
        return None

    @abc.abstractmethod
    def guarantee(self, *, num_reps: int, num_centroids: int) -> Guarantee:
        """The guarantee what is sent from ``num_reps`` representations carries."""

    def observe_global_centroids(self, centroids: torch.Tensor) -> None:  # noqa: B027 (optional hook)
        """Sees the public global centroids before a round (no-op by default): public, data-independent context."""


class ReleaseMechanism(Mechanism):
    """Each client sends the server a :class:`Release` in every round it takes part in, round 0 included.

    The bounds below (:meth:`max_vectors`, :meth:`max_total_weight`,
    :meth:`max_k`) take ``num_reps``, the most rows privfed can hand
    :meth:`release`; the server rejects a release beyond them, so a large
    client weighs no more than an honest one could.
    """

    @classmethod
    def releases_in(cls, *, train: bool) -> bool:
        return True

    @abc.abstractmethod
    def release(self, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator) -> Release:
        """Computes the release for one client.

        Args:
            reps: ``[n, D]`` L2-normalised representations, one per distinct image.
            num_centroids: ``L``, how many centroids the protocol expects.
            generator: Randomness for non-private choices; DP noise must come from a secure source.
        """

    def release_with_members(
        self, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator
    ) -> tuple[Release, torch.Tensor | None]:
        """:meth:`release`, and which released vector each row fed (``-1``: none; None: the mechanism cannot say).

        The members never leave a client: only replays that score an
        inversion attack ask for them (:mod:`attacks.scoring`).
        """
        return self.release(reps, num_centroids=num_centroids, generator=generator), None

    @classmethod
    def max_vectors(cls, *, num_reps: int, num_centroids: int) -> int:
        """The most vectors an honest release holds."""
        return num_centroids

    @classmethod
    def max_total_weight(cls, *, num_reps: int, params: dict[str, Any]) -> float:
        """The largest total weight an honest release carries.

        Weights count representations, so ``num_reps`` by default; a DP
        mechanism's noisy weights get :data:`DP_WEIGHT_ROOM` times that unless
        it bounds its own noise, as ``ldp`` does.
        """
        if cls.is_differentially_private():
            return DP_WEIGHT_ROOM * max(num_reps, 1)
        return float(num_reps)

    @classmethod
    def max_k(cls, *, num_reps: int, num_vectors: int, params: dict[str, Any]) -> int | None:
        """The largest anonymity set an honest k-anonymous release has (None: not k-anonymous, or no vectors).

        Vectors average disjoint sets of rows, so by default ``num_reps // num_vectors``.
        """
        if cls.guarantee_kind != K_ANONYMITY or num_vectors <= 0:
            return None
        return num_reps // num_vectors


class TableReleaseMechanism(ReleaseMechanism):
    """A client sends a noisy table of per-cell sums and counts (:class:`TableRelease`), which the server adds up.

    Only the table travels; the server reads its vectors and weights through
    :meth:`table_view`. In a training round every client's cells are the
    global centroids it was sent, so the server moves them from the sum of
    the round's tables (:meth:`combine_tables`), as a
    :class:`SecureSumMechanism` does from its secure sum. Round 0's cells are
    each client's own, so its views are clustered like any release.
    """

    @abc.abstractmethod
    def table_view(self, table: torch.Tensor, *, num_centroids: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The unit vectors and weights a table stands for (post-processing): what clustering and attacks read."""

    @abc.abstractmethod
    def check_table(self, table: torch.Tensor, *, num_reps: int, num_cells: int, dim: int) -> None:
        """Refuses (ValueError) a table no honest client of ``num_reps`` rows sends, so none outweighs an honest one."""

    @abc.abstractmethod
    def combine_tables(self, tables: Sequence[torch.Tensor], *, centroids: torch.Tensor) -> torch.Tensor:
        """The server's side: the new global centroids from the sum of a round's tables over their cells."""


class SecureSumMechanism(Mechanism):
    """Clients send a :meth:`share` inside SecAgg+'s sum; the server reads only the sum, through :meth:`combine`.

    The constructor takes keyword-only ``min_shares`` (the fewest shares every
    sum holds: the run's SecAgg+ reconstruction threshold) and ``modulus``
    (SecAgg+'s), which :meth:`planned_parameters` adds. Round 0 has no secure
    sum, so nothing is sent then; the server starts from random centroids.
    """

    @classmethod
    def releases_in(cls, *, train: bool) -> bool:
        return train

    @classmethod
    def planned_parameters(cls, request: PlanRequest, settings: Mapping[str, Any]) -> dict[str, Any]:
        if request.secure_sum is None:
            raise ValueError("it sends its shares inside SecAgg+'s sum: drop --no-secagg")
        sums = request.secure_sum
        return {**super().planned_parameters(request, settings), "min_shares": sums.threshold, "modulus": sums.modulus}

    @classmethod
    def plan(cls, request: PlanRequest) -> MechanismPlan:
        """:meth:`Mechanism.plan`, refusing a run whose sums could wrap the modulus."""
        plan = super().plan(request)
        assert request.secure_sum is not None and isinstance(plan.mechanism, SecureSumMechanism)  # planned_parameters
        plan.mechanism.check_sum_capacity(
            max_summed=request.secure_sum.max_summed, max_rows=max(request.client_sizes, default=0),
            num_cells=request.num_global_centroids, dim=request.dim,
        )
        return plan

    @abc.abstractmethod
    def share(self, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator) -> np.ndarray:
        """This client's contribution to the secure sum: integers mod the protocol's modulus."""

    @abc.abstractmethod
    def share_length(self, *, num_cells: int, dim: int) -> int:
        """How many integers :meth:`share` returns with ``num_cells`` global centroids of dimension ``dim``."""

    @abc.abstractmethod
    def check_secure_sum(self, *, threshold: int, modulus: int) -> None:
        """Refuses (ValueError) a round's SecAgg+ setup that would not hold this share's noise; a client asks first."""

    def check_sum_capacity(self, *, max_summed: int, max_rows: int, num_cells: int, dim: int) -> None:
        """Refuses (ValueError) a run whose sum of ``max_summed`` shares could wrap the modulus (no-op by default)."""

    @abc.abstractmethod
    def combine(self, total: np.ndarray, *, centroids: torch.Tensor, num_summed: int) -> torch.Tensor:
        """The server's side: the new global centroids from the sum of ``num_summed`` shares."""

    def decode(self, total: np.ndarray, *, num_cells: int, dim: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """What the server reads from the sum, as ``[num_cells, dim]`` vectors and their ``[num_cells]`` weights, for
        ``--record-releases`` (None, the default: the mechanism does not say, and nothing of the sum is recorded)."""
        return None


def round_releases(
    mechanism: type[Mechanism] | Mechanism | None, *, round_index: int, release_every: int = 1
) -> bool:
    """Whether round ``round_index`` sends anything of the clients' representations: the one place privfed asks (of
    the class, so an instance cannot answer otherwise).

    Round 0 sends when the mechanism's kind does; training rounds 1, 1 + k, 1 + 2k, ... for a cadence of
    ``k = release_every``, so the first training round always releases. In the other rounds the centroids stay.
    """
    check_release_every(release_every)
    if mechanism is None:
        return False
    kind = mechanism if isinstance(mechanism, type) else type(mechanism)
    if round_index == 0:
        return kind.releases_in(train=False)
    return kind.releases_in(train=True) and (round_index - 1) % release_every == 0


def check_release_every(release_every: int) -> None:
    """Refuses (ValueError) a cadence that is not a positive integer."""
    if isinstance(release_every, bool) or not isinstance(release_every, int) or release_every < 1:
        raise ValueError(f"release_every must be a positive integer, got {release_every!r}")


def replace_one_dp_guarantee(epsilon: float, delta: float, *, accounting: str, covers: str) -> Guarantee:
    """The guarantee of one replace-one DP release of a client's representations, as its statement quotes it."""
    return Guarantee(
        kind=DIFFERENTIAL_PRIVACY,
        epsilon=epsilon,
        delta=delta,
        statement=(
            f"This release is ({epsilon:.3g}, {delta:.3g})-differentially private with respect to replacing any "
            f"one of the client's representations by another ({accounting}). It covers {covers}, not the encoder "
            "update; repeated releases compose in the ledger."
        ),
    )


def checked_release(mechanism: ReleaseMechanism, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator) -> Release:
    """``mechanism.release``, refusing non-finite input and malformed output.

    Every caller in privfed releases through this, so a third-party
    mechanism gets the same output checks as a built-in one. Non-finite
    input is refused before any mechanism sees it (every mechanism's own
    ``release`` refuses it too: :meth:`Mechanism.__init_subclass__`).

    Raises:
        ValueError: naming the problem; the client then fails its round
            instead of sending anything.
    """
    check_representations(reps)
    release = mechanism.release(reps, num_centroids=num_centroids, generator=generator)
    _check_output(mechanism, reps, release)
    return release


def checked_release_with_members(
    mechanism: ReleaseMechanism, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator
) -> tuple[Release, torch.Tensor | None]:
    """``mechanism.release_with_members`` with :func:`checked_release`'s checks (for replays that score attacks)."""
    check_representations(reps)
    release, members = mechanism.release_with_members(reps, num_centroids=num_centroids, generator=generator)
    _check_output(mechanism, reps, release)
    if members is not None and members.shape != (reps.shape[0],):
        raise ValueError(f"mechanism {mechanism.name} named members for {tuple(members.shape)} of {reps.shape[0]} rows")
    return release, members


def _check_output(mechanism: ReleaseMechanism, reps: torch.Tensor, release: Release) -> None:
    if release.num_vectors and release.vectors.shape[1] != reps.shape[1]:
        raise ValueError(
            f"mechanism {mechanism.name} released {release.vectors.shape[1]}-dimensional vectors "
            f"from {reps.shape[1]}-dimensional representations"
        )
    if not bool(torch.isfinite(release.vectors).all()) or not bool(torch.isfinite(release.weights).all()):
        raise ValueError(f"mechanism {mechanism.name} released NaN or Inf values")
    if bool((release.weights < 0).any()):
        raise ValueError(f"mechanism {mechanism.name} released negative weights")
    if isinstance(release, TableRelease) and release.table.shape[1] != reps.shape[1] + 1:
        raise ValueError(f"mechanism {mechanism.name} released a table of {release.table.shape[1]} columns, not D + 1")
