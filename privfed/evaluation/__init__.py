"""Representation quality: kNN monitor and linear probe on frozen features."""

from privfed.evaluation.features import extract_features
from privfed.evaluation.knn import knn_accuracy, knn_predict
from privfed.evaluation.linear_probe import linear_probe_accuracy
from privfed.evaluation.monitor import KnnMonitor

__all__ = ["KnnMonitor", "extract_features", "knn_accuracy", "knn_predict", "linear_probe_accuracy"]
