"""FIFO memory of the most recent target representations a client produced."""

from __future__ import annotations

import torch


class RepresentationMemory:
    """Keeps the last ``capacity`` vectors pushed, oldest first.

    This is what a client's mechanism clusters at the end of local training;
    it never leaves the client except through that mechanism.
    """

    def __init__(self, capacity: int, dim: int) -> None:
        if capacity < 1:
            raise ValueError("memory capacity must be positive")
        self.capacity = capacity
        self._buffer = torch.zeros(capacity, dim)
        self._next = 0
        self._size = 0

    def push(self, reps: torch.Tensor) -> None:
        reps = reps.detach().to(self._buffer)[-self.capacity :]
        n = reps.shape[0]
        positions = (torch.arange(n) + self._next) % self.capacity
        self._buffer[positions] = reps
        self._next = (self._next + n) % self.capacity
        self._size = min(self._size + n, self.capacity)

    def __len__(self) -> int:
        return self._size

    def contents(self) -> torch.Tensor:
        """``[len(self), D]`` copy of the stored vectors, oldest first."""
        if self._size < self.capacity:
            return self._buffer[: self._size].clone()
        return torch.roll(self._buffer, -self._next, dims=0).clone()
