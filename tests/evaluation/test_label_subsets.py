"""Labelled subsets: the asked fraction of every class, the same draw for the same seed."""

from __future__ import annotations

import numpy as np
import pytest

from privfed.evaluation.label_subsets import class_balanced_subset

LABELS = np.repeat(np.arange(10), 500)  # 5,000 examples, 500 per class


@pytest.mark.parametrize(("fraction", "per_class"), [(0.01, 5), (0.1, 50), (1.0, 500)])
def test_every_class_gets_the_fraction(fraction, per_class):
    subset = class_balanced_subset(LABELS, fraction, seed=0)
    assert np.bincount(LABELS[subset], minlength=10).tolist() == [per_class] * 10
    assert len(set(subset.tolist())) == subset.size and np.all(np.diff(subset) > 0)


def test_the_seed_fixes_the_draw():
    assert np.array_equal(class_balanced_subset(LABELS, 0.01, seed=3), class_balanced_subset(LABELS, 0.01, seed=3))
    assert not np.array_equal(class_balanced_subset(LABELS, 0.01, seed=3), class_balanced_subset(LABELS, 0.01, seed=4))


def test_a_rare_class_keeps_one_labelled_example():
    labels = np.concatenate([np.zeros(1000, int), np.ones(20, int)])
    subset = class_balanced_subset(labels, 0.01, seed=0)
    assert np.bincount(labels[subset]).tolist() == [10, 1]


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5])
def test_a_fraction_outside_zero_to_one_is_refused(fraction):
    with pytest.raises(ValueError, match="fraction"):
        class_balanced_subset(LABELS, fraction, seed=0)
