"""privfed: privacy-focused federated learning around Orchestra.

The training core lives here (data, models, Orchestra, evaluation, the Flower
apps and the CLI); centroid-release mechanisms live in the sibling package
:mod:`mechanisms` and inversion attacks in :mod:`attacks`.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("privfed")  # pyproject.toml's, the one place it is written
except PackageNotFoundError:  # sources used without installing them
    __version__ = "0+unknown"
