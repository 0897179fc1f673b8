"""The linear probe learns a linearly separable problem, and is deterministic for a seed."""

from __future__ import annotations

import torch

from privfed.evaluation.linear_probe import linear_probe_accuracy


def separable(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(n, 16, generator=generator)
    features[:, :2] += 0.5 * torch.sign(features[:, :2])  # a margin of 1 around both boundaries
    labels = (features[:, 0] > 0).long() + 2 * (features[:, 1] > 0).long()  # four quadrants: linear boundaries
    return features, labels


def test_a_separable_problem_is_learnt_almost_perfectly():
    (x_train, y_train), (x_test, y_test) = separable(800, 0), separable(400, 1)
    assert linear_probe_accuracy(x_train, y_train, x_test, y_test, epochs=30) >= 0.99


def test_the_same_seed_gives_the_same_accuracy_and_random_labels_give_chance():
    (x_train, y_train), (x_test, y_test) = separable(400, 0), separable(400, 1)
    first = linear_probe_accuracy(x_train, y_train, x_test, y_test, epochs=10, seed=3)
    assert first == linear_probe_accuracy(x_train, y_train, x_test, y_test, epochs=10, seed=3)
    shuffled = y_train[torch.randperm(400, generator=torch.Generator().manual_seed(0))]
    assert linear_probe_accuracy(x_train, shuffled, x_test, y_test, epochs=10) < 0.4  # four classes: chance 0.25
