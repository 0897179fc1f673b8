"""The centroid-release interface every mechanism implements.

A mechanism decides what a client's representations turn into before they
leave the client. The training core only sees :class:`Release` objects, so a
new mechanism never needs changes outside its own module.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch


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


#: How many times its size a DP mechanism's noisy weights may total, unless it bounds its noise itself.
DP_WEIGHT_ROOM = 1000.0

#: :attr:`Guarantee.kind` and :attr:`Mechanism.guarantee_kind` values.
DIFFERENTIAL_PRIVACY = "differential-privacy"
K_ANONYMITY = "k-anonymity"
NO_GUARANTEE = "none"
GUARANTEE_KINDS = (DIFFERENTIAL_PRIVACY, K_ANONYMITY, NO_GUARANTEE)


class Mechanism(abc.ABC):
    """Turns a client's representations into what the server may see.

    Subclasses set ``name``, ``description`` and ``guarantee_kind`` (and
    ``releases_raw_data`` if they send representations as they are), and
    implement :meth:`release` and :meth:`guarantee`. Constructor arguments
    must be keyword-only so that configs can build mechanisms by name with
    ``**params``.

    A mechanism also describes its own privacy, so that privfed can budget
    and state it without knowing its name: a differentially private one
    implements :meth:`calibrate` (a total budget turned into constructor
    arguments) and :meth:`privacy_events` (what one release costs). Its
    guarantee must hold with respect to replacing one row of the ``reps``
    it releases from by another (one representation, replace-one, as
    :mod:`mechanisms.accounting` composes its events): that is the unit
    privfed's ledger composes and its privacy statement quotes. privfed
    hands a mechanism at most one row per image of the client (the latest
    view of the images in its memory; of every image when the mechanism
    samples its input, :attr:`secret_sampling`). A k-anonymous mechanism
    takes a keyword-only ``min_k``, the run's smallest anonymity set, and
    never releases a vector that averages fewer rows.

    What privfed checks and what it trusts: the server recomposes the events
    of a calibrated mechanism with its own accountant, charges every release
    the events it planned, and refuses a release whose events or guarantee
    kind differ from the plan and the class. Each client, in turn, accepts
    only the parameters of its own calibration, builds the mechanism from
    them (so the constructor must refuse noise its samplers cannot draw)
    and charges their :meth:`privacy_events`. Neither can
    see inside :meth:`release`: that the noise drawn there is the noise
    :meth:`privacy_events` declares, and that the sensitivity is what the
    events assume, is the mechanism's own promise.
    """

    name: ClassVar[str]
    description: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Makes every :meth:`release` and :meth:`release_with_members` a subclass defines refuse non-finite input.

        The check sits here, not in each mechanism, so that a direct caller
        of any mechanism that defines these in its class body, built-in or
        third-party, gets it (see :func:`check_representations`). One taken
        from a class outside :class:`Mechanism`, a classmethod, or one set
        after the class is made escapes it; :func:`checked_release` does not.
        """
        super().__init_subclass__(**kwargs)
        for name in ("release", "release_with_members"):
            method = cls.__dict__.get(name)
            if callable(method) and not getattr(method, "__isabstractmethod__", False):
                setattr(cls, name, _refusing_non_finite(method))

    #: One of :data:`GUARANTEE_KINDS`: what every release of this mechanism carries.
    #: A mechanism that does not say is taken to guarantee nothing.
    guarantee_kind: ClassVar[str] = NO_GUARANTEE
    #: True when the release contains client representations themselves (no protection at all).
    releases_raw_data: ClassVar[bool] = False
    #: True when :meth:`calibrate` takes ``sampling_rate`` and a mechanism built with it below 1 releases from a
    #: secret Poisson sample of its input, drawn in :meth:`release` (see :attr:`input_sampling_rate`).
    secret_sampling: ClassVar[bool] = False
    #: True when clients send a :meth:`share` inside the secure sum instead of a :meth:`release`, and the
    #: server reads only the sum, through :meth:`combine` (distributed DP).
    aggregated: ClassVar[bool] = False

    @property
    def input_sampling_rate(self) -> float:
        """Chance that a row handed to :meth:`release` enters it; below 1, privfed hands it one row per image of the client."""
        return 1.0

    @classmethod
    def is_differentially_private(cls) -> bool:
        """Whether releases carry privacy events that compose into an (epsilon, delta)."""
        return cls.guarantee_kind == DIFFERENTIAL_PRIVACY

    @classmethod
    def calibrate(cls, *, epsilon: float, delta: float, num_releases: int) -> dict[str, Any]:
        """Constructor arguments whose ``num_releases`` releases compose to at most ``(epsilon, delta)``.

        The server calls this once per run and sends the result to every
        client, so it must be JSON-able and fix every noise scale
        explicitly: clients build the mechanism with ``cls(**params)`` and
        must not re-calibrate. ``num_releases=1`` gives a per-release budget.
        Only differentially private mechanisms implement it.

        Raises:
            NotImplementedError: for mechanisms that are not differentially private.
        """
        raise NotImplementedError(f"mechanism {cls.name!r} is not differentially private: it has no budget")

    def privacy_events(self) -> tuple[PrivacyEvent, ...]:
        """What one release costs, for the run's ledger (empty when not differentially private)."""
        return ()

    def rows_per_vector(self, *, rows: int, dim: int, num_centroids: int) -> float | None:
        """Fewest representations a released vector must stand for to rise above the noise (None: no such floor).

        privfed prints it before training (``privfed train``'s plan), next to
        the rows clients hold: a client with fewer rows releases padding.
        """
        return None

    # The three bounds below bound one client's pull on the server: each takes ``num_reps``, the most rows the
    # caller can hand :meth:`release` (privfed: one per image in the client's memory, so the smaller of its size
    # and the memory's; its size under DP-SGD, whose Poisson memory has no cap). The server rejects a release
    # beyond them, so a large client weighs no more than an honest one of the same mechanism could.

    @classmethod
    def max_vectors(cls, *, num_reps: int, num_centroids: int) -> int:
        """The most vectors an honest release from at most ``num_reps`` representations holds (the server rejects more)."""
        return num_centroids

    @classmethod
    def max_total_weight(cls, *, num_reps: int, params: dict[str, Any]) -> float:
        """The largest total weight an honest release from at most ``num_reps`` representations carries.

        Weights count representations, so by default they total at most
        ``num_reps`` (the server rejects heavier releases, which would let
        one client outweigh the others in the global clustering). A
        differentially private mechanism's weights carry noise the base
        class cannot bound, so by default they may total
        :data:`DP_WEIGHT_ROOM` times ``num_reps`` (at least that many, for a
        tiny client); such a mechanism should override this with a bound on
        its own noise, as ``ldp`` does.
        """
        if cls.is_differentially_private():
            return DP_WEIGHT_ROOM * max(num_reps, 1)
        return float(num_reps)

    @classmethod
    def max_k(cls, *, num_reps: int, num_vectors: int, params: dict[str, Any]) -> int | None:
        """The largest anonymity set an honest release of ``num_vectors`` vectors from at most ``num_reps`` representations has.

        None for a mechanism that is not k-anonymous (it states no k). A
        k-anonymous release averages disjoint sets of at least ``k`` rows
        per vector (rows are distinct images), so by default ``k`` is at most
        ``num_reps // num_vectors``; the server credits no larger ``k``
        whatever the release claims. A release of no vectors has no ``k``.
        """
        if cls.guarantee_kind != K_ANONYMITY or num_vectors <= 0:
            return None
        return num_reps // num_vectors

    @abc.abstractmethod
    def release(
        self, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator
    ) -> Release:
        """Computes the release for one client.

        Args:
            reps: ``[n, D]`` L2-normalised representations held by the client,
                one per distinct image.
            num_centroids: ``L``, how many centroids the protocol expects.
            generator: Source of randomness for non-private choices
                (initialisation); DP noise must come from a secure source.
        """

    @abc.abstractmethod
    def guarantee(self, *, num_reps: int, num_centroids: int) -> Guarantee:
        """The guarantee a release of ``num_reps`` representations would carry."""

    def release_with_members(
        self, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator
    ) -> tuple[Release, torch.Tensor | None]:
        """:meth:`release`, and which released vector each row of ``reps`` fed, where the mechanism knows it.

        The members never leave a client: privfed asks for them only when it
        replays a recorded round to score an inversion attack
        (:mod:`attacks.scoring`), so that a reconstruction can be compared
        with the images behind the vector it came from.

        Returns:
            ``(release, members)``: ``members[i]`` is the index of the
            released vector row ``i`` contributed to, ``-1`` for none; None
            when the mechanism cannot say (the default).
        """
        return self.release(reps, num_centroids=num_centroids, generator=generator), None

    # An aggregated mechanism (:attr:`aggregated`) takes keyword-only ``min_shares`` (the fewest shares every
    # secure sum holds: the run's SecAgg+ reconstruction threshold) and ``modulus`` (SecAgg+'s), which privfed adds
    # to its calibration, as it adds ``min_k`` for a k-anonymous one. Its clients release nothing in round 0,
    # which has no secure sum; the server starts from random centroids instead.

    def share(self, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator) -> np.ndarray:
        """An aggregated mechanism's contribution to the secure sum: integers mod the protocol's modulus."""
        raise NotImplementedError(f"mechanism {self.name!r} releases per client; it has no share for a secure sum")

    def share_length(self, *, num_cells: int, dim: int) -> int:
        """How many integers :meth:`share` returns with ``num_cells`` global centroids of dimension ``dim``."""
        raise NotImplementedError(f"mechanism {self.name!r} releases per client; it has no share for a secure sum")

    def check_secure_sum(self, *, threshold: int, modulus: int) -> None:
        """Refuses (ValueError) a secure sum whose reconstruction threshold or modulus would not hold this share's noise.

        A client calls it with the SecAgg+ settings the round was set up with,
        before it computes anything.
        """
        raise NotImplementedError(f"mechanism {self.name!r} releases per client; it joins no secure sum")

    def check_sum_capacity(self, *, max_summed: int, max_rows: int, num_cells: int, dim: int) -> None:  # noqa: B027 (optional hook)
        """Refuses (ValueError) a run whose secure sum of ``max_summed`` shares could wrap the modulus (no-op by default).

        ``max_rows`` is the most representations one client holds.
        """

    def combine(self, total: np.ndarray, *, centroids: torch.Tensor, num_summed: int) -> torch.Tensor:
        """An aggregated mechanism's server side: the new global centroids from the sum of ``num_summed`` shares."""
        raise NotImplementedError(f"mechanism {self.name!r} releases per client; it combines no secure sum")

    def observe_global_centroids(self, centroids: torch.Tensor) -> None:  # noqa: B027 (optional hook)
        """Sees the public global centroids before a release (no-op by default).

        Lets a mechanism use public, data-independent context, such as a
        hashing centre, without widening :meth:`release`.
        """


def _refusing_non_finite(method: Any) -> Any:
    """``method`` (a release), preceded by :func:`check_representations` on its ``reps``."""
    if getattr(method, "_refuses_non_finite", False):
        return method

    @functools.wraps(method)
    def release(self: Mechanism, reps: torch.Tensor, **kwargs: Any) -> Any:
        check_representations(reps)
        return method(self, reps, **kwargs)

    release._refuses_non_finite = True  # type: ignore[attr-defined]
    return release


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


def checked_release(mechanism: Mechanism, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator) -> Release:
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
    mechanism: Mechanism, reps: torch.Tensor, *, num_centroids: int, generator: torch.Generator
) -> tuple[Release, torch.Tensor | None]:
    """``mechanism.release_with_members`` with :func:`checked_release`'s checks (for replays that score attacks)."""
    check_representations(reps)
    release, members = mechanism.release_with_members(reps, num_centroids=num_centroids, generator=generator)
    _check_output(mechanism, reps, release)
    if members is not None and members.shape != (reps.shape[0],):
        raise ValueError(f"mechanism {mechanism.name} named members for {tuple(members.shape)} of {reps.shape[0]} rows")
    return release, members


def _check_output(mechanism: Mechanism, reps: torch.Tensor, release: Release) -> None:
    if release.num_vectors and release.vectors.shape[1] != reps.shape[1]:
        raise ValueError(
            f"mechanism {mechanism.name} released {release.vectors.shape[1]}-dimensional vectors "
            f"from {reps.shape[1]}-dimensional representations"
        )
    if not bool(torch.isfinite(release.vectors).all()) or not bool(torch.isfinite(release.weights).all()):
        raise ValueError(f"mechanism {mechanism.name} released NaN or Inf values")
    if bool((release.weights < 0).any()):
        raise ValueError(f"mechanism {mechanism.name} released negative weights")
