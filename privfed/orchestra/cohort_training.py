"""Several clients' local training as one batched computation: the same steps each would take alone.

A small client's GPU step is bound by kernel launches (docs/performance.md), so
clients' states are stacked on a "slot" axis and ``torch.func.vmap`` runs the
step over them. Each keeps its own batches, augmentations, BatchNorm
statistics, momentum and memory; a freed slot takes the next client with zero
momentum (SGD's first step). Batches of different sizes step in separate
calls: padding would change BatchNorm's statistics.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.func import functional_call, vmap

from privfed.data.augment import view_draws
from privfed.methods import get_method
from privfed.methods.base import Method, StepOutput
from privfed.models.network import OrchestraNetwork, ema_update_tensors
from privfed.orchestra.local_training import (
    LocalTrainingConfig,
    LocalTrainingResult,
    augmentation_generator,
    normalised_centroids,
    shuffled_batches,
    step_means,
)
from privfed.orchestra.memory import RepresentationMemory, first_kept_batch
from privfed.orchestra.model_state import StateDict, load_shared_state

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class CohortMember:
    """One client of a cohort: its uint8 images and its round generator (seeded as for :func:`train_locally`)."""

    images: torch.Tensor
    generator: torch.Generator


@dataclass(frozen=True)
class TrainedMember:
    """A client's network state (CPU), result and generator state after a cohort, as :func:`train_locally`'s."""

    state: StateDict
    result: LocalTrainingResult
    generator_state: torch.Tensor


def trains_in_cohort(config: LocalTrainingConfig) -> str | None:
    """Why ``config`` cannot train in a cohort (None: it can)."""
    if config.dp_sgd is not None:
        return "DP-SGD trains one client at a time (per-sample clipping and Poisson batches)"
    method = get_method(config.method)
    if method.view_draw_count is None or method.reads_labels:
        return f"method {config.method} does not declare a batched step"
    return None


def train_cohort(
    network: OrchestraNetwork,
    global_state: StateDict,
    centroids: torch.Tensor | None,
    members: Sequence[CohortMember],
    config: LocalTrainingConfig,
    *,
    device: torch.device,
    slots: int,
) -> list[TrainedMember]:
    """Trains ``members`` from ``global_state``, up to ``slots`` per call; one :class:`TrainedMember` each, in order.

    Raises:
        ValueError: a configuration :func:`trains_in_cohort` refuses, or fewer than one slot.
    """
    refusal = trains_in_cohort(config)
    if refusal is not None:
        raise ValueError(refusal)
    if slots < 1:
        raise ValueError(f"a cohort needs at least one slot, got {slots}")
    start = time.perf_counter()
    load_shared_state(network, global_state)
    network.to(device).train()
    cohort = _Cohort(network, get_method(config.method), config, normalised_centroids(centroids, device), device)
    plans = [_ClientPlan.of(member, config, network.projection_dim, device) for member in members]
    queue = sorted(range(len(plans)), key=lambda i: -len(plans[i].schedule))  # largest first; stable among equals
    active = queue[:slots]
    del queue[:slots]
    cohort.start([plans[i] for i in active])
    trained: dict[int, TrainedMember] = {}
    while active:
        while not any(plans[i].done for i in active):
            cohort.step([plans[i] for i in active])
        freed: list[int] = []
        for slot in range(len(active)):
            while plans[active[slot]].done and slot not in freed:
                trained[active[slot]] = cohort.finish(plans[active[slot]], slot)
                if queue:  # the freed slot takes the next client
                    active[slot] = queue.pop(0)
                    cohort.reset(slot)
                else:
                    freed.append(slot)
        if freed:  # no client left to take these slots
            active = [i for slot, i in enumerate(active) if slot not in freed]
            cohort.drop(freed)
    share = (time.perf_counter() - start) / max(1, len(plans))  # each client's part of the time: clients x mean = the cohort's
    return [dataclasses.replace(trained[i], result=dataclasses.replace(trained[i].result, seconds=share)) for i in range(len(plans))]


@dataclass
class _ClientPlan:
    """A client's schedule, drawn up front as :func:`train_locally` draws it, and its running values."""

    member: CohortMember
    images: torch.Tensor
    aug_generator: torch.Generator
    schedule: list[torch.Tensor]
    on_device: Sequence[torch.Tensor]
    kept_from: int
    memory: RepresentationMemory
    position: int = 0
    totals: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, member: CohortMember, config: LocalTrainingConfig, dim: int, device: torch.device) -> _ClientPlan:
        n = int(member.images.shape[0])
        aug_generator = augmentation_generator(member.generator, device)  # drawn first, as train_locally does
        schedule = [index for _ in range(config.epochs) for index in shuffled_batches(n, config.batch_size, member.generator)]
        sizes = [len(index) for index in schedule]
        on_device = torch.cat(schedule).to(device).split(sizes) if schedule else ()
        memory = RepresentationMemory(config.memory_size, dim)
        return cls(member, member.images.to(device), aug_generator, schedule, on_device, first_kept_batch(sizes, memory.capacity), memory)

    @property
    def done(self) -> bool:
        return self.position >= len(self.schedule)

    @property
    def batch_size(self) -> int:
        return len(self.schedule[self.position])


class _Cohort:
    """The stacked state of the clients in the slots, and one step of theirs."""

    def __init__(
        self, network: OrchestraNetwork, method: Method, config: LocalTrainingConfig, centroids: torch.Tensor | None,
        device: torch.device,
    ) -> None:
        self.network, self.method, self.config, self.centroids, self.device = network, method, config, centroids, device
        self.initial = {name: tensor.detach().clone() for name, tensor in _named_state(network).items()}
        self.trained = _trained_names(network)
        self.ema_pairs = _ema_pairs(network)
        self.module = _StepModule(network, method)
        self.stack: Tensors = {}
        self.momentum: Tensors = {}

    @property
    def size(self) -> int:
        return len(next(iter(self.stack.values())))

    def start(self, plans: list[_ClientPlan]) -> None:
        """Stacks a slot per client, each with the round's model and zero momentum."""
        count = len(plans)
        self._restack({name: tensor.unsqueeze(0).repeat(count, *[1] * tensor.dim()) for name, tensor in self.initial.items()})
        self.momentum = {name: torch.zeros_like(self.stack[name]) for name in self.trained}

    def _restack(self, stack: Tensors) -> None:
        """The trained parameters' stacks stay leaves: a step reads their gradients and moves them in place."""
        self.stack = {name: tensor.detach().requires_grad_(name in self.trained) for name, tensor in stack.items()}

    @torch.no_grad()
    def reset(self, slot: int) -> None:
        """The slot's new client starts from the round's model with a fresh optimizer (zero momentum)."""
        for name, tensor in self.initial.items():
            self.stack[name][slot] = tensor
        for tensor in self.momentum.values():
            tensor[slot] = 0

    @torch.no_grad()
    def drop(self, slots: list[int]) -> None:
        """Removes finished clients' slots that no client is left to take."""
        kept = torch.tensor([slot for slot in range(self.size) if slot not in slots], dtype=torch.long, device=self.device)
        self._restack({name: tensor[kept] for name, tensor in self.stack.items()})
        self.momentum = {name: tensor[kept] for name, tensor in self.momentum.items()}

    def step(self, plans: list[_ClientPlan]) -> None:
        """One step of every client in the slots: one batched call per batch size."""
        sizes: dict[int, list[int]] = {}
        for slot, plan in enumerate(plans):
            sizes.setdefault(plan.batch_size, []).append(slot)
        for slot_group in sorted(sizes.values()):
            self._step_group(slot_group, [plans[slot] for slot in slot_group])

    def _step_group(self, slot_group: list[int], plans: list[_ClientPlan]) -> None:
        """One step of the clients in ``slot_group``: in place for every slot, else on a gathered copy put back after."""
        whole = len(slot_group) == self.size
        # Only a part of the slots needs an index (a host-to-device copy): the common whole step goes without.
        index = None if whole else torch.tensor(slot_group, dtype=torch.long, device=self.device)
        with torch.no_grad():
            stack = self.stack if whole else {
                name: tensor[index].requires_grad_(name in self.trained) for name, tensor in self.stack.items()
            }
            momentum = self.momentum if whole else {name: tensor[index] for name, tensor in self.momentum.items()}
        out = self._batched_step(stack, plans)
        out.loss.sum().backward()
        with torch.no_grad():
            stepped = [name for name in self.trained if stack[name].grad is not None]  # as SGD skips a parameter without one
            grads = [stack[n].grad for n in stepped]
            _sgd([stack[n] for n in stepped], grads, [momentum[n] for n in stepped], self.config)  # type: ignore[arg-type]
            for name in stepped:
                stack[name].grad = None
            ema_update_tensors([stack[t] for t, _ in self.ema_pairs], [stack[o] for _, o in self.ema_pairs], self.config.ema_decay)
            if index is not None:
                for name, tensor in stack.items():
                    self.stack[name][index] = tensor
                for name, tensor in momentum.items():
                    self.momentum[name][index] = tensor
        for row, plan in enumerate(plans):
            self._record(plan, out, row)

    def _batched_step(self, stack: Tensors, plans: list[_ClientPlan]) -> StepOutput:
        """Every client's views in one transform, then its step through ``vmap`` over the slots."""
        count = self.method.view_draw_count
        assert count is not None  # trains_in_cohort
        batch = [plan.on_device[plan.position] for plan in plans]
        draws = torch.cat([view_draws(len(rows), count, generator=plan.aug_generator) for rows, plan in zip(batch, plans)])
        views = self.method.views_from(torch.cat([plan.images[rows] for rows, plan in zip(batch, plans)]), draws)
        leaves, rebuild = _flatten(views)
        stacked = [leaf.view(len(plans), -1, *leaf.shape[1:]) for leaf in leaves]

        def one_client(state: Tensors, client_leaves: list[torch.Tensor]) -> tuple[torch.Tensor, Tensors, torch.Tensor]:
            args = (rebuild(client_leaves), self.centroids, self.config.temperature)
            out = functional_call(self.module, {f"network.{name}": tensor for name, tensor in state.items()}, args)
            reps = out.target_reps if out.target_reps is not None else torch.zeros(0, device=out.loss.device)
            return out.loss, out.values, reps

        loss, values, reps = vmap(one_client)(stack, stacked)
        return StepOutput(loss, values, reps)

    def _record(self, plan: _ClientPlan, out: StepOutput, row: int) -> None:
        """The client's memory and step values after its step, as :func:`train_locally` keeps them."""
        if out.target_reps is not None and out.target_reps[row].numel() and plan.position >= plan.kept_from:
            plan.memory.push(out.target_reps[row], plan.on_device[plan.position])
        for name, value in out.values.items():
            value = value[row].detach()
            plan.totals[name] = plan.totals[name] + value if name in plan.totals else value
        plan.position += 1

    def finish(self, plan: _ClientPlan, slot: int) -> TrainedMember:
        """A done client's state, memory and step means, read from its slot."""
        state = {name: tensor[slot].detach().cpu().clone() for name, tensor in self.stack.items()}
        steps = len(plan.schedule)
        result = LocalTrainingResult(
            memory=plan.memory.contents(), memory_examples=plan.memory.examples(), num_samples=int(plan.images.shape[0]),
            num_steps=steps, step_means=step_means(plan.totals, steps), seconds=0.0,
        )
        return TrainedMember(state, result, plan.member.generator.get_state())


class _StepModule(nn.Module):
    """The method's step as a module's forward, so ``functional_call`` can swap in one client's state."""

    def __init__(self, network: OrchestraNetwork, method: Method) -> None:
        super().__init__()
        self.network = network
        self.method = method

    def forward(self, views: Any, centroids: torch.Tensor | None, temperature: float) -> StepOutput:
        return self.method.step_on_views(self.network, views, centroids, temperature)


def _named_state(network: nn.Module) -> Tensors:
    """Every parameter and buffer by name (BatchNorm's counters included: they are part of each client's state)."""
    return {**dict(network.named_parameters()), **dict(network.named_buffers())}


def _trained_names(network: OrchestraNetwork) -> list[str]:
    """The names of :meth:`OrchestraNetwork.trainable_parameters`, in its order (what plain SGD steps)."""
    names = {id(p): name for name, p in network.named_parameters()}
    return [names[id(p)] for p in network.trainable_parameters()]


def _ema_pairs(network: OrchestraNetwork) -> list[tuple[str, str]]:
    """(target, online) parameter names, paired as :func:`~privfed.models.network.ema_update` pairs them."""
    if network.target is None:
        return []
    targets = [f"target.{name}" for name, _ in network.target.named_parameters()]
    onlines = [f"online.{name}" for name, _ in network.online.named_parameters()]
    return list(zip(targets, onlines, strict=True))


def _sgd(params: list[torch.Tensor], grads: list[torch.Tensor], momenta: list[torch.Tensor], config: LocalTrainingConfig) -> None:
    """``torch.optim.SGD``'s step (no dampening or Nesterov) on stacked tensors; zero momentum gives its first step."""
    if config.weight_decay:
        grads = list(torch._foreach_add(grads, params, alpha=config.weight_decay))
    torch._foreach_mul_(momenta, config.momentum)
    torch._foreach_add_(momenta, grads)
    torch._foreach_add_(params, momenta, alpha=-config.lr)


def _flatten(views: Any) -> tuple[list[torch.Tensor], Callable[[list[torch.Tensor]], Any]]:
    """A method's views (a tensor, a tuple of tensors or a dataclass of tensors) as tensors, and the way back."""
    if isinstance(views, torch.Tensor):
        return [views], lambda leaves: leaves[0]
    if dataclasses.is_dataclass(views) and not isinstance(views, type):
        kind, names = type(views), [f.name for f in dataclasses.fields(views)]
        return [getattr(views, name) for name in names], lambda leaves: kind(**dict(zip(names, leaves)))
    if isinstance(views, tuple):
        return list(views), tuple
    raise TypeError(f"views of type {type(views).__name__} cannot be batched over clients")
