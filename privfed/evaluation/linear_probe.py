"""Linear probe: multinomial logistic regression (scikit-learn's L-BFGS, no seed) on frozen features
(benchmarks/linear_probe_comparison.py, docs/performance.md)."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from privfed.evaluation.features import StepProgress

#: Inverse L2 strength on the summed loss (scikit-learn's ``C``) after standardising.
DEFAULT_C = 1.0
#: L-BFGS iterations; resnet features converge in well under this.
DEFAULT_MAX_ITER = 1000


def linear_probe_predictions(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    *,
    c: float = DEFAULT_C,
) -> torch.Tensor:
    """The probe's class for each test feature, fitted on training features standardised with their statistics
    (so one ``c`` suits every backbone width, and L-BFGS is well conditioned)."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_limits

    classes = train_labels.unique()
    if len(classes) == 1:  # scikit-learn refuses one class; the only sensible classifier predicts it
        return classes.cpu().expand(test_features.shape[0]).clone()
    x_train = train_features.double().cpu().numpy()
    mean, std = x_train.mean(0), x_train.std(0)
    std[std < 1e-6] = 1.0  # a constant feature stays constant (zero) instead of blowing up
    classifier = LogisticRegression(C=c, max_iter=DEFAULT_MAX_ITER)
    # BLAS keeps to torch's thread count: its own default (every core) was 30x slower on a busy 2-core machine.
    with warnings.catch_warnings(), threadpool_limits(torch.get_num_threads()):
        warnings.simplefilter("ignore", ConvergenceWarning)  # an unconverged fit is still a fit; accuracy says how good
        classifier.fit((x_train - mean) / std, train_labels.cpu().numpy())
    x_test = (test_features.double().cpu().numpy() - mean) / std
    return torch.from_numpy(np.asarray(classifier.predict(x_test), dtype=np.int64))


def linear_probe_accuracy(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    *,
    progress: StepProgress | None = None,
) -> float:
    """The probe's test accuracy; ``progress`` hears once, when the fit is done (L-BFGS has no epochs)."""
    predicted = linear_probe_predictions(train_features, train_labels, test_features)
    if progress is not None:
        progress("linear probe", 1, 1, {})
    return float((predicted == test_labels.cpu()).double().mean())
