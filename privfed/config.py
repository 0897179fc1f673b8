"""Run configuration: one flat, typed record, loadable from TOML.

This is the one place every run option is written down. Each field carries
its ``privfed train`` help text and short flags in its metadata
(:func:`option`); the CLI generates ``train``'s options from it,
``[tool.flwr.app.config]`` in ``pyproject.toml`` must list exactly these
names and defaults (a test checks it), and the narrower records that
clients and local training receive are built from it. Precedence is
defaults < ``--config`` file < command line.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any, get_type_hints

from privfed.errors import PrivfedError

DEVICES = ("auto", "cpu", "cuda")
#: How ``privfed train`` carries Flower's messages (:func:`privfed.federation.simulation.simulate`).
RUNTIMES = ("local", "ray")
GLOBAL_CLUSTERINGS = ("kmeans", "official")

#: Key of an option's :class:`OptionHelp` in a field's metadata.
OPTION_METADATA = "option"


@dataclass(frozen=True)
class OptionHelp:
    """How a field appears on the command line.

    Attributes:
        help: One or two sentences for ``--help``.
        flags: Short aliases besides ``--field-name`` (e.g. ``("-K",)``).
        default_text: How ``--help`` states a default that is not a plain
            value (``None`` defaults that the run derives); ``None`` shows the
            field's default itself, or nothing when that is ``None``.
    """

    help: str
    flags: tuple[str, ...] = ()
    default_text: str | None = None


def option(default: Any, help: str, *, flags: tuple[str, ...] = (), default_text: str | None = None) -> Any:
    """A dataclass field that is also a documented command-line option."""
    return field(default=default, metadata={OPTION_METADATA: OptionHelp(help, flags, default_text)})


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a training run (``privfed train --help`` shows each field's help)."""

    # data
    dataset: str = option("shapes", "Training data: shapes (embedded, offline), cifar10, cifar100 or arrays:PATH.npz.")
    test_dataset: str | None = option(
        None, "Data for the kNN monitor's queries (its test split); defaults to --dataset's test split."
    )
    data_dir: str = option("data", "Where torchvision datasets live.")
    download: bool = option(False, "Allow downloading CIFAR-10/100 into --data-dir (needs a network).")
    num_clients: int = option(10, "Number of federated clients K.", flags=("-K",))
    participation: float = option(0.5, "Fraction of clients sampled per round, in (0, 1].", flags=("-R",))
    alpha: float = option(0.1, "Dirichlet concentration of the non-IID split (smaller = more skewed).")
    # model
    method: str = option(
        "orchestra",
        "Training method: orchestra, or an ablation: rotpred (rotation prediction only), orchestra-no-rotation, "
        "orchestra-no-target, orchestra-fixed-centroids (random global centroids, never updated). rotpred and "
        "orchestra-fixed-centroids release nothing, so --mechanism does not apply to them. The paper's federated "
        "SSL baselines: simclr, simsiam, byol, specloss (FedAvg of the model, nothing released; simclr uses "
        "--temperature, byol --ema-decay; no DP-SGD); and supervised (FedAvg on the clients' labels, the upper "
        "reference).",
    )
    backbone: str = option("resnet8", "resnet8 / resnet20 (CPU-sized) or resnet18 (paper).")
    projection_dim: int = option(32, "Projector output dimension D.")
    projection_hidden_dim: int | None = option(
        None, "Width of the projector's hidden layer (the authors' code: 512).", default_text="D"
    )
    # Orchestra
    rounds: int = option(12, "Training rounds C (after the initialisation round 0).", flags=("-C",))
    local_epochs: int = option(2, "Local epochs E per round.", flags=("-E",))
    batch_size: int = option(32, "Local batch size.")
    lr: float = option(0.03, "Local SGD learning rate.")
    momentum: float = option(0.9, "Local SGD momentum.")
    weight_decay: float = option(1e-4, "Local SGD weight decay.")
    temperature: float = option(
        0.3,
        "Softmax temperature of the cluster loss (paper: 0.1; CPU-scale runs need more, see docs/architecture.md).",
    )
    ema_decay: float = option(0.99, "EMA decay m of the target encoder.")
    memory_size: int = option(128, "Target representations each client keeps (and clusters).")
    num_local_centroids: int = option(8, "Local centroids L released per client.", flags=("-L",))
    num_global_centroids: int = option(16, "Global centroids G.", flags=("-G",))
    global_clustering: str = option(
        "kmeans",
        "How the server clusters the releases into G centroids: kmeans (equal-mass Sinkhorn k-means, warm-started; "
        "puts the centroids on the data) or official (the authors' code: 500 SGD steps matching softmax to Sinkhorn "
        "assignments at --temperature; the centroids stay near their random start).",
    )
    # release mechanism and privacy budget
    mechanism: str = option("kanon", "Release mechanism (see `privfed mechanisms`).")
    epsilon: float | None = option(
        None,
        "Differentially private mechanisms: total epsilon ONE client may spend over the whole run (all its releases "
        "composed with the PLD accountant; every release is calibrated for the worst case: sampled in every round that releases).",
    )
    delta: float | None = option(
        None,
        "DP mechanisms and DP-SGD: delta of that budget.",
        default_text="min(1e-6, 1/(100 n)) for the largest client's n samples, so n * delta <= 1% for every client",
    )
    epsilon_per_release: float | None = option(
        None,
        "DP mechanisms: fix the epsilon of each single release instead; with --epsilon too, a run whose releases "
        "would exceed it is refused.",
    )
    release_every: int = option(
        1,
        "Centroid releases only every N-th training round (rounds 1, 1+N, 1+2N, ..., and round 0 where the mechanism "
        "releases then); in the others clients train against the centroids, which stay, and are charged nothing. "
        "The budget is calibrated for the releases that happen.",
    )
    secret_sample: bool | None = option(
        None,
        "Mechanisms that take it (ldp-sums, ddp-sums): each release uses a secret Poisson sample of the client's "
        "images, drawn from the OS CSPRNG at rate memory_size / (median client size), and the ledger counts the "
        "amplification. Off: the release uses the memory, with no amplification.",
        default_text="the mechanism's: on",
    )
    centroid_momentum: float | None = option(
        None,
        "Mechanisms that take it (ldp-sums, ddp-sums): the server's EMA over rounds of each centroid it moves from "
        "the summed tables, in [0, 1) (post-processing: no privacy cost).",
        default_text="the mechanism's: 0.75",
    )
    kanon_min_k: int | None = option(
        None,
        "Mechanisms that take it (kanon): fewest distinct images a released centroid may average. A client with "
        "fewer than L*k images releases fewer centroids, one with fewer than k releases none.",
        default_text="the mechanism's: 5",
    )
    # secure aggregation of model updates (Flower SecAgg+)
    secagg: bool = option(
        True,
        "Aggregate encoder updates with SecAgg+ (Flower's message flow, masks from AES-256-CTR, signed keys and a "
        "consistency check), so the server sees only their sum (docs/privacy.md, \"SecAgg+ against a deviating server\").",
    )
    secagg_shares: int | None = option(
        None,
        "SecAgg+: shares each client's key is split into; must be the number of sampled clients (every client shares "
        "keys with all others).",
        default_text="every sampled client",
    )
    secagg_threshold: int | None = option(
        None,
        "SecAgg+: shares needed to reconstruct a key, a strict majority of them; shares - threshold clients may drop "
        "out.",
        default_text="the smallest strict majority of the shares",
    )
    secagg_clipping_range: float = option(
        8.0, "SecAgg+: values are clipped to +-this before quantisation (privfed rescales updates so nothing is clipped)."
    )
    secagg_timeout: float | None = option(
        None,
        "SecAgg+: seconds to wait for the replies of each protocol stage (set it for real deployments).",
        default_text="wait for all",
    )
    # what clients report besides their update and release
    report_client_metrics: bool = option(
        False,
        "Clients also send their per-round training metrics (losses, target entropy, centroid cosine, step counts, "
        "timings) for metrics.jsonl and curves.png. Off by default: under SecAgg+ the server gets each round's means, "
        "and over rounds whose cohorts change it can solve these for every client's own values (up to one common "
        "offset); without SecAgg+ they travel per client in plaintext. Under DP-SGD only step counts and timings "
        "are ever sent. Clients follow the declared run's value and refuse a server that sets another.",
    )
    # DP-SGD on clients (Opacus)
    dp_sgd: bool = option(False, "Train clients with DP-SGD (Opacus: per-sample clipping and Gaussian noise).")
    max_grad_norm: float = option(1.0, "DP-SGD: per-sample gradient clipping norm.")
    dp_sgd_noise_multiplier: float | None = option(
        None, "DP-SGD: noise std / max-grad-norm.", default_text="calibrated from --dp-sgd-epsilon"
    )
    dp_sgd_epsilon: float | None = option(
        None,
        "DP-SGD: epsilon the encoder updates of ONE client may spend over the whole run (at --delta).",
        default_text="8 when neither this nor --dp-sgd-noise-multiplier is given",
    )
    # run
    seed: int = option(
        0,
        "Seed for the partition, model init, client sampling, augmentations, mechanisms' non-private choices and "
        "SecAgg+ rounding: on CPU one seed gives one run. Not repeated by design: DP noise (ldp, DP-SGD draw it from "
        "the OS). Not controlled: CUDA kernels' own nondeterminism.",
    )
    device: str = option("auto", "Where to compute: auto picks cuda when there is one, else cpu.")
    out: str | None = option(
        None,
        "Run directory.",
        default_text="runs/<time>-<method>-<mechanism>-seed<seed> (no mechanism for a method that releases nothing)",
    )
    record_releases: bool = option(
        False,
        "Keep what the server received each round (every client's release) and the model the clients started "
        "from, in RUN_DIR/releases/, for `privfed attack`. Costs one model state per round (0.65 MB for resnet8 "
        "at D=32, about 90 MB for resnet18) plus 4*D bytes per released vector.",
    )
    checkpoint_every: int = option(
        1,
        "Save everything the server needs to continue (RUN_DIR/checkpoints/resume.pt) every N rounds, at an early "
        "stop and at the end; `privfed train --resume RUN_DIR` continues from it. 0: only at a stop and the end.",
    )
    eval_every: int = option(1, "Run the kNN monitor every N rounds (and after the last).")
    knn_k: int = option(200, "Neighbours of the kNN monitor.")
    knn_temperature: float = option(0.1, "Vote temperature of the kNN monitor.")
    runtime: str = option(
        "local",
        "local: no Ray; on CPU a round's clients train in parallel worker processes forked from this one; ray: in "
        "parallel Ray workers (pip install 'privfed[ray]'). Same seed, same run on either (docs/flower.md measures both).",
    )
    client_cpus: float = option(
        1.0,
        "CPU cores of each simulated client: its torch threads, and how many clients train at once (cores / this). "
        "From 2 up, or on a GPU, the local runtime trains them one after another instead.",
    )
    client_gpus: float = option(0.0, "Ray: GPU fraction reserved per simulated client.")
    clients_per_step: int = option(
        0,
        "Local runtime: clients trained together, as one batched step (the same computation as one at a time). "
        "0: every client of a round on a CUDA device, one at a time elsewhere (a CPU gains nothing); 1: one at a time.",
    )

    @property
    def release_mechanism(self) -> str | None:
        """The mechanism clients release with; None when the method releases nothing (``mechanism`` does not apply)."""
        from privfed.methods import get_method  # loads torch: only when asked

        return self.mechanism if get_method(self.method).releases else None

    @property
    def mechanism_settings(self) -> dict[str, Any]:
        """The release mechanism's settings this run gives (:attr:`mechanisms.base.Mechanism.settings`; unset: its default)."""
        return {setting: getattr(self, name) for name, setting in MECHANISM_SETTINGS.items() if getattr(self, name) is not None}

    @property
    def cluster_head_outputs(self) -> int | None:
        """SpecLoss's cluster head width (one output per global centroid, as in the authors' code); None for other methods."""
        from privfed.methods import get_method

        return self.num_global_centroids if get_method(self.method).heads.clusters else None

    @property
    def classifier_outputs(self) -> int | None:
        """Supervised FedAvg's classifier width: the classes of the training data; None for other methods."""
        from privfed.methods import get_method

        if not get_method(self.method).heads.classes:
            return None
        from privfed.data.federated import FederatedSplit  # loads torch: only when a method needs it

        return len(FederatedSplit.of(self).train_data().classes)

    @property
    def clients_per_round(self) -> int:
        """Clients sampled each round: ``max(1, round(R * K))``."""
        return max(1, round(self.participation * self.num_clients))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)


#: The options that give the release mechanism a setting, and the setting each gives.
MECHANISM_SETTINGS = {"secret_sample": "secret_sample", "centroid_momentum": "momentum", "kanon_min_k": "min_k"}

#: The built-in defaults, for commands (``evaluate``) and functions that share an option with training.
DEFAULTS = TrainConfig()


def option_help(name: str) -> OptionHelp:
    """The command-line description of one :class:`TrainConfig` field."""
    return {f.name: f.metadata[OPTION_METADATA] for f in fields(TrainConfig)}[name]


#: ``privfed train --help``'s panels, each naming its fields once (a test checks every field is in exactly one).
OPTION_PANELS: dict[str, tuple[str, ...]] = {
    "Data": ("dataset", "test_dataset", "data_dir", "download", "num_clients", "participation", "alpha"),
    "Model and method": (
        "method", "backbone", "projection_dim", "projection_hidden_dim", "rounds", "local_epochs", "batch_size", "lr",
        "momentum", "weight_decay", "temperature", "ema_decay", "memory_size", "num_local_centroids",
        "num_global_centroids", "global_clustering",
    ),
    "Privacy": (
        "mechanism", "epsilon", "delta", "epsilon_per_release", "release_every", "secret_sample", "centroid_momentum",
        "kanon_min_k", "report_client_metrics",
    ),
    "Secure aggregation": ("secagg", "secagg_shares", "secagg_threshold", "secagg_clipping_range", "secagg_timeout"),
    "DP-SGD": ("dp_sgd", "max_grad_norm", "dp_sgd_noise_multiplier", "dp_sgd_epsilon"),
    "Run and output": (
        "seed", "device", "out", "record_releases", "checkpoint_every", "eval_every", "knn_k", "knn_temperature",
        "runtime", "client_cpus", "client_gpus", "clients_per_step",
    ),
}


def option_panel(name: str) -> str:
    """The ``--help`` panel of one :class:`TrainConfig` field."""
    return next(panel for panel, names in OPTION_PANELS.items() if name in names)


def field_types() -> dict[str, Any]:
    """Each field's resolved type (``int``, ``float | None``, ...)."""
    hints = get_type_hints(TrainConfig)
    return {f.name: hints[f.name] for f in fields(TrainConfig)}


def _coerce(name: str, value: Any, hint: Any) -> Any:
    """Checks a TOML value against the field's type (ints are accepted for floats)."""
    allowed = getattr(hint, "__args__", (hint,))
    if value is None and type(None) in allowed:
        return None
    for kind in allowed:
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if kind is not type(None) and type(value) is kind:
            return value
    names = " or ".join(getattr(k, "__name__", str(k)) for k in allowed)
    raise PrivfedError(f"config key {name!r} must be {names}, got {value!r}")


def read_text(path: Path) -> str:
    """A text file privfed reads (a preset, a run's records), as UTF-8.

    Raises:
        PrivfedError: naming the file when it cannot be read or is not UTF-8 text.
    """
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise PrivfedError(f"{path} is not UTF-8 text (byte {err.start}); the file is damaged or not a text file") from None
    except OSError as err:
        raise PrivfedError(f"cannot read {path}: {err.strerror}") from None


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file holding one object (``config.json``, ``summary.json``, ...).

    Raises:
        PrivfedError: naming the file when it cannot be read or holds no JSON object.
    """
    try:
        value = json.loads(read_text(path))
    except json.JSONDecodeError as err:
        raise PrivfedError(f"{path} is not valid JSON ({err.msg}, line {err.lineno}); the file is damaged") from None
    if not isinstance(value, dict):
        raise PrivfedError(f"{path} holds no JSON object; the file is damaged")
    return value


def read_toml(path: Path, *, kind: str) -> dict[str, Any]:
    """A TOML file's table; a missing or malformed file is a one-line error naming ``kind`` ("config file", ...)."""
    if not path.is_file():
        raise PrivfedError(f"{kind} not found: {path}")
    try:
        return tomllib.loads(read_text(path))
    except tomllib.TOMLDecodeError as err:
        raise PrivfedError(f"{kind} {path} is not valid TOML: {' '.join(str(err).split())}") from None


def shipped_presets(kind: str = "config") -> dict[str, Path]:
    """The presets privfed ships (``privfed/presets``, shown as ``configs/`` in a checkout), by name.

    ``kind`` "config" lists the training presets, "study" the study files.
    """
    folder = Path(str(resources.files("privfed") / "presets"))
    if kind == "study":
        folder = folder / "studies"
    return {path.stem: path for path in sorted(folder.glob("*.toml"))}


def resolve_preset(path: Path | str, *, kind: str = "config", relative_to: Path | None = None) -> Path:
    """A preset argument as a file: a bare name (no ``/``, no suffix) is a shipped preset, anything else a path.

    A path is taken relative to ``relative_to`` (a study's own folder) or the
    working directory. A bare name that is not shipped may still be a file
    without a suffix; otherwise the error lists the shipped names.

    Raises:
        PrivfedError: for a bare name that is neither shipped nor a file.
    """
    text = str(path)
    given = Path(text).expanduser()
    if relative_to is not None and not given.is_absolute():
        given = relative_to / given
    if "/" in text or "\\" in text or Path(text).suffix:
        return given
    shipped = shipped_presets(kind)
    if text in shipped:
        return shipped[text]
    if given.is_file():
        return given
    raise PrivfedError(
        f"no shipped {'preset' if kind == 'config' else kind} named {text!r} (shipped: {', '.join(shipped)}); "
        "give a path to use your own file"
    )


#: Options whose ``arrays:PATH`` value a file resolves against its own folder.
DATASET_OPTIONS = ("dataset", "test_dataset")


def anchored_dataset(spec: str, folder: Path) -> str:
    """``arrays:PATH`` with a relative PATH made absolute against ``folder`` (the file that names it); others unchanged."""
    name, sep, arg = spec.partition(":")
    target = Path(arg.strip()).expanduser()
    if name.strip().lower() != "arrays" or not sep or not arg.strip() or target.is_absolute():
        return spec
    return f"arrays:{(folder / target).resolve()}"


def load_config_file(path: Path | str) -> dict[str, Any]:
    """Reads a TOML preset (a path, or a shipped preset's name) into config overrides (unknown keys are errors)."""
    path = resolve_preset(path)
    raw = read_toml(path, kind="config file")
    return checked_options(raw, source=f"config file {path}", relative_to=path.parent)


def checked_options(raw: dict[str, Any], *, source: str, relative_to: Path | None = None) -> dict[str, Any]:
    """Options read from a file (a preset, a study), each a known field with a value of its type.

    ``relative_to``: the file's folder, against which its relative
    ``arrays:PATH`` datasets resolve (so a preset works from any directory).

    Raises:
        PrivfedError: naming ``source`` and the unknown keys or the mistyped value.
    """
    if not isinstance(raw, dict):
        raise PrivfedError(f"{source} must be a table of options, got {raw!r}")
    types = field_types()
    unknown = sorted(set(raw) - set(types))
    if unknown:
        raise PrivfedError(f"{source} has unknown keys: {', '.join(unknown)}")
    try:
        options = {key: _coerce(key, value, types[key]) for key, value in raw.items()}
    except PrivfedError as err:
        raise PrivfedError(f"{source}: {err}") from None
    if relative_to is not None:
        for key in DATASET_OPTIONS:
            if isinstance(options.get(key), str):
                options[key] = anchored_dataset(options[key], relative_to)
    return options


def build_config(file: Path | str | None = None, **overrides: Any) -> TrainConfig:
    """Defaults, then the file (a path or a shipped preset's name), then explicit overrides (``None`` = not given)."""
    values: dict[str, Any] = {}
    if file is not None:
        values.update(load_config_file(file))
    values.update({k: v for k, v in overrides.items() if v is not None})
    config = TrainConfig(**values)
    validate(config)
    return config


#: The epsilons a DP option may ask for: below the least, the noise a release needs is too large to represent; above
#: the largest, the guarantee means nothing (and calibrating the noise takes minutes).
MIN_EPSILON, MAX_EPSILON = 1e-6, 100.0
#: Below this delta the accountant's discretisation needs gigabytes (1e-30 ran out of memory).
MIN_DELTA = 1e-12
#: The DP-SGD noise multipliers the accountant can work with in reasonable memory (0.01 ran out of it, 1e300
#: overflowed); outside them the guarantee means nothing anyway.
MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER = 0.1, 1e4
#: A SecAgg+ stage timeout beyond this (about 11 days) is no timeout, and Python's waits refuse huge ones.
MAX_TIMEOUT_SECONDS = 1e6
#: Every integer option fits in 32 bits; these also bound what a client allocates up front (its memory buffer
#: is memory_size x projection_dim floats).
MAX_INT = 2**31 - 1
INT_MAXIMA = {"memory_size": 2**20, "projection_dim": 2**16, "projection_hidden_dim": 2**16}
#: Where every float option must lie, as (low, high, low included, high included); a test checks that every float
#: field of :class:`TrainConfig` is here, so a NaN or an infinity never reaches a run.
FLOAT_RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "participation": (0.0, 1.0, False, True),
    "alpha": (0.0, math.inf, False, False),
    "lr": (0.0, math.inf, False, False),
    "momentum": (0.0, 1.0, True, False),
    "weight_decay": (0.0, math.inf, True, False),
    "temperature": (0.0, math.inf, False, False),
    "ema_decay": (0.0, 1.0, True, False),
    "epsilon": (MIN_EPSILON, MAX_EPSILON, True, True),
    "delta": (MIN_DELTA, 1.0, True, False),
    "epsilon_per_release": (MIN_EPSILON, MAX_EPSILON, True, True),
    "centroid_momentum": (0.0, 1.0, True, False),
    "secagg_clipping_range": (0.0, math.inf, False, False),
    "secagg_timeout": (0.0, MAX_TIMEOUT_SECONDS, False, True),
    "max_grad_norm": (0.0, math.inf, False, False),
    "dp_sgd_noise_multiplier": (MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER, True, True),
    "dp_sgd_epsilon": (MIN_EPSILON, MAX_EPSILON, True, True),
    "knn_temperature": (0.0, math.inf, False, False),
    "client_cpus": (0.0, math.inf, False, False),
    "client_gpus": (0.0, math.inf, True, False),
}
#: Seeds feed NumPy, PyTorch and SecAgg+'s rounding; all of them take a 32-bit unsigned seed.
MAX_SEED = 2**32 - 1


def check_float(name: str, value: float | None, low: float, high: float, low_in: bool, high_in: bool) -> None:
    """Refuses a NaN, an infinity or a value outside the interval (``None`` is "not set" and passes)."""
    if value is None:
        return
    inside = (low <= value if low_in else low < value) and (value <= high if high_in else value < high)
    if not (math.isfinite(value) and inside):
        upper = "inf)" if high == math.inf else f"{high:g}{']' if high_in else ')'}"
        raise PrivfedError(f"{name} must be a finite number in {'[' if low_in else '('}{low:g}, {upper}, got {value}")


def check_seed(name: str, value: int) -> None:
    """Refuses a seed that NumPy, PyTorch or SecAgg+ cannot take."""
    if not 0 <= value <= MAX_SEED:
        raise PrivfedError(f"{name} must be an integer from 0 to {MAX_SEED}, got {value}")


def validate(config: TrainConfig) -> None:
    """Rejects settings that cannot run, with a message naming the problem."""
    for name, bounds in FLOAT_RANGES.items():
        check_float(name, getattr(config, name), *bounds)
    check_seed("seed", config.seed)
    for name, hint in field_types().items():
        value, most = getattr(config, name), INT_MAXIMA.get(name, MAX_INT)
        is_int = int in getattr(hint, "__args__", (hint,)) and isinstance(value, int) and not isinstance(value, bool)
        if is_int and name != "seed" and value > most:
            raise PrivfedError(f"{name} must be at most {most}, got {value}")
    if not config.secagg:
        given = [n for n in ("secagg_shares", "secagg_threshold", "secagg_timeout") if getattr(config, n) is not None]
        if given:
            flags = ", ".join("--" + n.replace("_", "-") for n in given)
            raise PrivfedError(f"{flags} set{'s' if len(given) == 1 else ''} up SecAgg+, which --no-secagg turns off")
    positive_ints = (
        "num_clients", "rounds", "local_epochs", "batch_size", "memory_size",
        "num_local_centroids", "num_global_centroids", "projection_dim", "projection_hidden_dim", "eval_every", "knn_k",
        "release_every",
    )
    for name in positive_ints:
        if getattr(config, name) is not None and getattr(config, name) < 1:  # projection_hidden_dim may be unset
            raise PrivfedError(f"{name} must be at least 1, got {getattr(config, name)}")
    if config.batch_size < 2:
        raise PrivfedError("batch_size must be at least 2 (BatchNorm needs two samples)")
    if config.clients_per_step < 0:
        raise PrivfedError(f"clients_per_step must be 0 (automatic) or more, got {config.clients_per_step}")
    if config.checkpoint_every < 0:
        raise PrivfedError(f"checkpoint_every must be 0 or more, got {config.checkpoint_every}")
    from privfed.methods import available_methods

    methods = available_methods()
    if config.method not in methods:
        raise PrivfedError(f"unknown method {config.method!r} (choose from {', '.join(methods)})")
    if config.dp_sgd and (refusal := methods[config.method].dp_sgd_refusal):
        raise PrivfedError(refusal)
    if config.release_every > 1 and not methods[config.method].releases:
        raise PrivfedError(f"--release-every spaces out centroid releases, and method {config.method} releases nothing")
    from mechanisms import MechanismRegistrationError, UnknownMechanismError, get_mechanism_class

    try:
        mechanism = get_mechanism_class(config.mechanism)
    except (UnknownMechanismError, MechanismRegistrationError) as err:
        raise PrivfedError(str(err)) from None
    for name, choices in (("global_clustering", GLOBAL_CLUSTERINGS), ("runtime", RUNTIMES), ("device", DEVICES)):
        if getattr(config, name) not in choices:
            raise PrivfedError(f"unknown {name.replace('_', ' ')} {getattr(config, name)!r} (choose from {', '.join(choices)})")
    if config.num_local_centroids > config.memory_size:
        raise PrivfedError(
            f"num_local_centroids ({config.num_local_centroids}) cannot exceed memory_size ({config.memory_size})"
        )
    released = config.clients_per_round * config.num_local_centroids
    # A mechanism that releases the memory itself sends memory_size vectors, not L.
    releasing = methods[config.method].releases
    if config.record_releases and not releasing:
        raise PrivfedError(f"method {config.method} releases nothing, so --record-releases has nothing to record")
    check_mechanism_options(config, releasing=releasing, mechanism=mechanism)
    if releasing and not mechanism.releases_raw_data and released < config.num_global_centroids:
        raise PrivfedError(
            f"{config.clients_per_round} sampled clients x {config.num_local_centroids} local centroids "
            f"= {released} released centroids, fewer than num_global_centroids ({config.num_global_centroids}); "
            "raise participation or num_clients, or lower num_global_centroids"
        )


def check_mechanism_options(config: TrainConfig, *, releasing: bool, mechanism: Any) -> None:
    """Refuses a mechanism option given where it does nothing, so no run records it as if used.

    ``releasing``: whether the method releases anything; ``mechanism``: the
    release mechanism's class, which names the settings it takes. The
    mechanism checks their values when it plans the run.

    Raises:
        PrivfedError: naming the option and why it does not apply.
    """
    from mechanisms import available_mechanisms, get_mechanism_class

    given = [name for name in MECHANISM_SETTINGS if getattr(config, name) is not None]
    changed = (["mechanism"] if config.mechanism != DEFAULTS.mechanism else []) + given
    if not releasing and changed:
        flags = ", ".join(_flag(config, name) for name in changed)
        raise PrivfedError(f"method {config.method} releases nothing, so {flags} {'does' if len(changed) == 1 else 'do'} not apply")
    for name in given:
        setting = MECHANISM_SETTINGS[name]
        if setting not in mechanism.settings:
            takers = ", ".join(m for m in available_mechanisms() if setting in get_mechanism_class(m).settings) or "none"
            raise PrivfedError(f"{_flag(config, name)} applies to mechanisms that take {setting} ({takers}), not {config.mechanism}")


def _flag(config: TrainConfig, name: str) -> str:
    """The command-line flag that set option ``name`` as it is (``--no-secret-sample`` for a switch turned off)."""
    flag = name.replace("_", "-")
    return f"--no-{flag}" if getattr(config, name) is False else f"--{flag}"


def config_from_run_config(run_config: dict[str, Any]) -> TrainConfig:
    """A Flower run config (``[tool.flwr.app.config]`` keys, with dashes; ``""`` means unset) as a TrainConfig."""
    values = {k.replace("-", "_"): (None if v == "" else v) for k, v in run_config.items()}
    return build_config(**values)


#: ``config.json``'s one key that is no option: the run's random id (:meth:`privfed.run.directory.RunDirectory.create`).
RUN_ID_KEY = "run_id"


def load_saved_config(path: Path) -> TrainConfig:
    """Reads a run directory's ``config.json`` back, each value checked against its field's type.

    Raises:
        PrivfedError: naming the file when it is damaged (not JSON, unknown keys, values of the wrong type).
    """
    raw = read_json_object(path)
    raw.pop(RUN_ID_KEY, None)
    return TrainConfig(**checked_options(read_legacy_settings(raw), source=str(path)))


#: What every run recorded for these options before they were left unset unless given.
LEGACY_SETTING_DEFAULTS = {"secret_sample": True, "kanon_min_k": 5}


def read_legacy_settings(values: dict[str, Any]) -> dict[str, Any]:
    """A recorded configuration with those recorded defaults read as unset where no mechanism of the run took them."""
    from mechanisms import MechanismRegistrationError, UnknownMechanismError, get_mechanism_class
    from privfed.methods import available_methods

    method = available_methods().get(str(values.get("method")))
    try:
        takes = get_mechanism_class(str(values.get("mechanism"))).settings if method and method.releases else {}
    except (UnknownMechanismError, MechanismRegistrationError):
        takes = {}  # its run fails where the mechanism is looked up
    legacy = LEGACY_SETTING_DEFAULTS.items()
    return {**values, **{name: None for name, old in legacy if values.get(name) == old and MECHANISM_SETTINGS[name] not in takes}}


def with_legacy_settings(values: dict[str, Any]) -> dict[str, Any]:
    """A configuration as runs recorded it before: its unset mechanism options at the defaults they wrote then."""
    return {**values, **{name: old for name, old in LEGACY_SETTING_DEFAULTS.items() if values.get(name) is None}}
