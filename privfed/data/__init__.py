"""Everything a run needs before the model sees a batch: datasets from a spec, non-IID client splits, augmented views."""

from privfed.data.arrays import ImageArrays, load_npz
from privfed.data.augment import (
    OrchestraViews,
    color_jitter,
    gaussian_blur,
    normalize,
    orchestra_views,
    random_grayscale,
    random_resized_crop_flip,
    rotate_quarter_turns,
    solarize,
    to_float,
)
from privfed.data.datasets import DATASET_NAMES, describe_datasets, load_dataset
from privfed.data.federated import FederatedSplit, cached_dataset
from privfed.data.partition import HeterogeneityStats, dirichlet_partition, heterogeneity_stats
from privfed.data.shapes import SHAPE_CLASSES, make_shapes

__all__ = [
    "DATASET_NAMES",
    "SHAPE_CLASSES",
    "FederatedSplit",
    "HeterogeneityStats",
    "ImageArrays",
    "OrchestraViews",
    "cached_dataset",
    "color_jitter",
    "describe_datasets",
    "dirichlet_partition",
    "gaussian_blur",
    "heterogeneity_stats",
    "load_dataset",
    "load_npz",
    "make_shapes",
    "normalize",
    "orchestra_views",
    "random_grayscale",
    "random_resized_crop_flip",
    "rotate_quarter_turns",
    "solarize",
    "to_float",
]
