"""FIFO memory of the most recent target representations a client produced."""

from __future__ import annotations

from collections.abc import Sequence

import torch


class RepresentationMemory:
    """Keeps the last ``capacity`` vectors pushed, each with the index of the example it came from.

    It leaves the client only through its mechanism; the indices never do.
    :meth:`contents` keeps only each example's latest view, so an anonymity set
    (or a per-representation unit) counts images. The buffer lives with the
    first pushed vectors: on a GPU a push never waits.
    """

    def __init__(self, capacity: int, dim: int) -> None:
        if capacity < 1:
            raise ValueError("memory capacity must be positive")
        self.capacity = capacity
        self.dim = dim
        self._buffer: torch.Tensor | None = None
        self._examples: torch.Tensor | None = None
        self._next = 0
        self._size = 0

    def push(self, reps: torch.Tensor, examples: torch.Tensor) -> None:
        """Stores ``reps[i]``, a view of the client's example ``examples[i]``."""
        if examples.shape != reps.shape[:1]:
            raise ValueError(f"{reps.shape[0]} representations but {tuple(examples.shape)} example indices")
        if self._buffer is None or self._examples is None:
            self._buffer = torch.zeros(self.capacity, self.dim, dtype=reps.dtype, device=reps.device)
            self._examples = torch.full((self.capacity,), -1, dtype=torch.long, device=reps.device)
        reps = reps.detach().to(self._buffer)[-self.capacity :]
        examples = examples.detach().to(self._examples)[-self.capacity :]
        n = reps.shape[0]
        positions = (torch.arange(n, device=self._buffer.device) + self._next) % self.capacity
        self._buffer[positions] = reps
        self._examples[positions] = examples
        self._next = (self._next + n) % self.capacity
        self._size = min(self._size + n, self.capacity)

    def __len__(self) -> int:
        """Vectors stored, views of one example counted apiece."""
        return self._size

    def contents(self) -> torch.Tensor:
        """``[m, D]`` copy on the CPU of the latest stored view of each distinct example, oldest first."""
        if self._buffer is None:
            return torch.zeros(0, self.dim)
        return self._buffer.cpu()[self._latest_positions()]

    def examples(self) -> torch.Tensor:
        """``[m]`` the example each row of :meth:`contents` is a view of (on the CPU)."""
        if self._examples is None:
            return torch.zeros(0, dtype=torch.long)
        return self._examples.cpu()[self._latest_positions()]

    def _latest_positions(self) -> torch.Tensor:
        assert self._examples is not None  # only called once something was pushed
        order = torch.arange(self._size) if self._size < self.capacity else (torch.arange(self.capacity) + self._next) % self.capacity
        examples = self._examples.cpu()[order].tolist()
        latest = {example: position for position, example in enumerate(examples)}  # later views overwrite earlier ones
        return order[sorted(latest.values())]


def first_kept_batch(sizes: Sequence[int], capacity: int) -> int:
    """The first of batches of ``sizes`` rows, pushed in order, with a row among the last ``capacity``: earlier ones need no push."""
    after = 0
    for index in range(len(sizes) - 1, -1, -1):
        if after >= capacity:
            return index + 1
        after += sizes[index]
    return 0
