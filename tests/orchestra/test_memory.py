import pytest
import torch

from privfed.orchestra.memory import RepresentationMemory


def test_memory_keeps_the_most_recent_vectors_oldest_first():
    memory = RepresentationMemory(capacity=5, dim=1)
    for start in range(0, 12, 3):
        memory.push(torch.arange(start, start + 3, dtype=torch.float32)[:, None])
    assert len(memory) == 5
    assert memory.contents().squeeze(1).tolist() == [7, 8, 9, 10, 11]


def test_partially_filled_memory_returns_only_what_was_pushed():
    memory = RepresentationMemory(capacity=10, dim=2)
    memory.push(torch.ones(3, 2))
    assert memory.contents().shape == (3, 2)


def test_push_larger_than_capacity_keeps_the_tail():
    memory = RepresentationMemory(capacity=4, dim=1)
    memory.push(torch.arange(10, dtype=torch.float32)[:, None])
    assert memory.contents().squeeze(1).tolist() == [6, 7, 8, 9]


def test_zero_capacity_is_rejected():
    with pytest.raises(ValueError):
        RepresentationMemory(capacity=0, dim=3)
