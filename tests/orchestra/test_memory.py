import pytest
import torch

from privfed.orchestra.memory import RepresentationMemory, first_kept_batch


def test_memory_keeps_the_most_recent_vectors_oldest_first():
    memory = RepresentationMemory(capacity=5, dim=1)
    for start in range(0, 12, 3):
        memory.push(torch.arange(start, start + 3, dtype=torch.float32)[:, None], torch.arange(start, start + 3))
    assert len(memory) == 5
    assert memory.contents().squeeze(1).tolist() == [7, 8, 9, 10, 11]


def test_partially_filled_memory_returns_only_what_was_pushed():
    memory = RepresentationMemory(capacity=10, dim=2)
    memory.push(torch.ones(3, 2), torch.arange(3))
    assert memory.contents().shape == (3, 2)


def test_push_larger_than_capacity_keeps_the_tail():
    memory = RepresentationMemory(capacity=4, dim=1)
    memory.push(torch.arange(10, dtype=torch.float32)[:, None], torch.arange(10))
    assert memory.contents().squeeze(1).tolist() == [6, 7, 8, 9]


def test_zero_capacity_is_rejected():
    with pytest.raises(ValueError):
        RepresentationMemory(capacity=0, dim=3)


def test_several_views_of_one_image_count_once_and_the_latest_is_kept():
    """4 images seen over 10 epochs fill a memory of 40 with 10 views each: it holds 4 images, not 40."""
    memory = RepresentationMemory(capacity=40, dim=1)
    for epoch in range(10):
        order = torch.randperm(4, generator=torch.Generator().manual_seed(epoch))
        memory.push((100 * epoch + order).float()[:, None], order)
    assert len(memory) == 40
    kept = memory.contents().squeeze(1)
    assert kept.shape == (4,)
    assert sorted(int(v) % 100 for v in kept) == [0, 1, 2, 3]
    assert all(int(v) // 100 == 9 for v in kept)  # every image's view from the last epoch


def test_examples_must_match_the_representations():
    memory = RepresentationMemory(capacity=4, dim=2)
    with pytest.raises(ValueError, match="example indices"):
        memory.push(torch.ones(3, 2), torch.arange(2))


@pytest.mark.parametrize("capacity", [1, 5, 8, 13, 40])
def test_batches_before_the_first_kept_one_change_nothing(capacity):
    """Local training skips pushing them: the memory ends the same, views and all."""
    generator = torch.Generator().manual_seed(capacity)
    sizes = [4, 4, 3, 4, 1, 4, 2, 4, 4]
    batches = [torch.randint(0, 12, (size,), generator=generator) for size in sizes]
    every, tail = RepresentationMemory(capacity, dim=2), RepresentationMemory(capacity, dim=2)
    kept_from = first_kept_batch(sizes, capacity)
    for position, examples in enumerate(batches):
        reps = torch.randn(len(examples), 2, generator=generator)
        every.push(reps, examples)
        if position >= kept_from:
            tail.push(reps, examples)
    assert torch.equal(every.contents(), tail.contents()) and torch.equal(every.examples(), tail.examples())
    assert kept_from == 0 or sum(sizes[kept_from:]) >= capacity > sum(sizes[kept_from + 1 :])
