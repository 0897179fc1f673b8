"""FIFO memory of the most recent target representations a client produced."""

from __future__ import annotations

import torch


class RepresentationMemory:
    """Keeps the last ``capacity`` vectors pushed, each with the index of the example it came from.

    This is what a client's mechanism clusters at the end of local training;
    it never leaves the client except through that mechanism, and the example
    indices never leave it at all. They are kept because a memory larger than
    one epoch holds several augmented views of the same image: :meth:`contents`
    keeps only the latest view of each example, so that an anonymity set (or
    a per-representation privacy unit) counts images, not views of one image.
    """

    def __init__(self, capacity: int, dim: int) -> None:
        if capacity < 1:
            raise ValueError("memory capacity must be positive")
        self.capacity = capacity
        self._buffer = torch.zeros(capacity, dim)
        self._examples = torch.full((capacity,), -1, dtype=torch.long)
        self._next = 0
        self._size = 0

    def push(self, reps: torch.Tensor, examples: torch.Tensor) -> None:
        """Stores ``reps[i]``, a view of the client's example ``examples[i]``."""
        if examples.shape != reps.shape[:1]:
            raise ValueError(f"{reps.shape[0]} representations but {tuple(examples.shape)} example indices")
        reps = reps.detach().to(self._buffer)[-self.capacity :]
        examples = examples.detach().to(self._examples)[-self.capacity :]
        n = reps.shape[0]
        positions = (torch.arange(n) + self._next) % self.capacity
        self._buffer[positions] = reps
        self._examples[positions] = examples
        self._next = (self._next + n) % self.capacity
        self._size = min(self._size + n, self.capacity)

    def __len__(self) -> int:
        """How many vectors are stored, views of the same example counted apiece."""
        return self._size

    def contents(self) -> torch.Tensor:
        """``[m, D]`` copy of the latest stored view of each distinct example, oldest first."""
        return self._buffer[self._latest_positions()].clone()

    def examples(self) -> torch.Tensor:
        """``[m]`` the example each row of :meth:`contents` is a view of."""
        return self._examples[self._latest_positions()].clone()

    def _latest_positions(self) -> torch.Tensor:
        order = torch.arange(self._size) if self._size < self.capacity else (torch.arange(self.capacity) + self._next) % self.capacity
        examples = self._examples[order].tolist()
        latest = {example: position for position, example in enumerate(examples)}  # later views overwrite earlier ones
        return order[sorted(latest.values())]
