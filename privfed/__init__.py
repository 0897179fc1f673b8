"""privfed: privacy-focused federated learning around Orchestra.

The training core lives here (data, models, Orchestra, evaluation, the Flower
apps and the CLI); centroid-release mechanisms live in the sibling package
:mod:`mechanisms` and inversion attacks in :mod:`attacks`.
"""

__version__ = "0.1.0"
