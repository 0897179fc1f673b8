"""The linear probe learns a linearly separable problem, gives one answer per input, and is at chance on noise."""

from __future__ import annotations

import torch

from privfed.evaluation.linear_probe import linear_probe_accuracy, linear_probe_predictions


def separable(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(n, 16, generator=generator)
    features[:, :2] += 0.5 * torch.sign(features[:, :2])  # a margin of 1 around both boundaries
    labels = (features[:, 0] > 0).long() + 2 * (features[:, 1] > 0).long()  # four quadrants: linear boundaries
    return features, labels


def test_a_separable_problem_is_learnt_almost_perfectly():
    (x_train, y_train), (x_test, y_test) = separable(800, 0), separable(400, 1)
    assert linear_probe_accuracy(x_train, y_train, x_test, y_test) >= 0.99


def test_features_on_any_scale_are_standardised_first():
    (x_train, y_train), (x_test, y_test) = separable(800, 0), separable(400, 1)
    scale = torch.logspace(-4, 4, 16)  # the deciding features tiny, the noise huge: unscaled, C would swamp them
    assert linear_probe_accuracy(x_train * scale, y_train, x_test * scale, y_test) >= 0.99


def test_the_same_input_gives_identical_predictions_and_random_labels_give_chance():
    (x_train, y_train), (x_test, y_test) = separable(400, 0), separable(400, 1)
    first = linear_probe_predictions(x_train, y_train, x_test)
    assert torch.equal(first, linear_probe_predictions(x_train, y_train, x_test))
    shuffled = y_train[torch.randperm(400, generator=torch.Generator().manual_seed(0))]
    assert linear_probe_accuracy(x_train, shuffled, x_test, y_test) < 0.4  # four classes: chance 0.25


def test_labels_missing_from_training_are_never_predicted_and_score_as_wrong():
    (x_train, y_train), (x_test, y_test) = separable(800, 0), separable(400, 1)
    kept = y_train != 3
    predicted = linear_probe_predictions(x_train[kept], y_train[kept], x_test)
    assert set(predicted.tolist()) <= {0, 1, 2}
    accuracy = linear_probe_accuracy(x_train[kept], y_train[kept], x_test, y_test)
    assert accuracy <= 1 - float((y_test == 3).double().mean()) + 1e-9


def test_a_single_training_class_is_predicted_everywhere():
    (x_train, _), (x_test, y_test) = separable(50, 0), separable(40, 1)
    predicted = linear_probe_predictions(x_train, torch.full((50,), 2), x_test)
    assert predicted.tolist() == [2] * 40
    assert linear_probe_accuracy(x_train, torch.full((50,), 2), x_test, y_test) == float((y_test == 2).double().mean())
