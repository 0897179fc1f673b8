"""``privfed``: the command-line front door (the only module importing everything)."""

from __future__ import annotations

import dataclasses
import sys
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import typer

from privfed.config import TrainConfig, build_config
from privfed.errors import PrivfedError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Privacy-focused federated learning with Orchestra.",
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: rich's option tables cut long option names at 80 columns
)

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig)}


def _help(text: str, name: str) -> str:
    """Help text with the built-in default (a --config file may change it)."""
    return f"{text} [default: {_DEFAULTS[name]}]"


class Protocol(str, Enum):
    knn = "knn"
    linear = "linear"


def _print_progress(event: dict[str, Any]) -> None:
    kind = event["event"]
    if kind == "start":
        typer.echo(f"untrained encoder: kNN accuracy {event['knn_accuracy_init']:.4f}")
    elif kind == "round":
        parts = [
            f"round {event['round']:>3}",
            f"clients {event['clients_completed']}/{event['clients_sampled']}",
        ]
        if event.get("loss") is not None:
            parts.append(f"loss {event['loss']:.4f}")
        if event.get("knn_accuracy") is not None:
            parts.append(f"kNN {event['knn_accuracy']:.4f}")
        if event.get("privacy_epsilon") is not None:
            parts.append(f"eps {event['privacy_epsilon']:.3f}")
        parts.append(f"{event['round_seconds']:.1f}s")
        typer.echo("  ".join(parts))
    elif kind == "stop":
        typer.echo(f"stopping: {event['reason']}")
    elif kind == "finish":
        typer.echo(
            f"done: kNN accuracy {event['knn_accuracy']:.4f} (untrained {event['knn_accuracy_init']:.4f}) "
            f"after {event['rounds']} rounds in {event['wall_seconds']:.0f}s -> {event['run_dir']}"
        )


@app.command()
def train(
    config: Optional[Path] = typer.Option(None, "--config", help="TOML preset (see configs/); flags override it."),
    dataset: Optional[str] = typer.Option(None, help=_help("Training data: shapes (embedded, offline), cifar10, cifar100 or arrays:PATH.npz.", "dataset")),
    test_dataset: Optional[str] = typer.Option(None, help="Data for the kNN monitor's queries (its test split); defaults to --dataset's test split."),
    data_dir: Optional[str] = typer.Option(None, help=_help("Where torchvision datasets live.", "data_dir")),
    download: Optional[bool] = typer.Option(None, "--download/--no-download", help="Allow downloading CIFAR-10/100 into --data-dir (needs a network). [default: no-download]"),
    num_clients: Optional[int] = typer.Option(None, "--num-clients", "-K", help=_help("Number of federated clients K.", "num_clients")),
    participation: Optional[float] = typer.Option(None, "--participation", "-R", help=_help("Fraction of clients sampled per round, in (0, 1].", "participation")),
    alpha: Optional[float] = typer.Option(None, help=_help("Dirichlet concentration of the non-IID split (smaller = more skewed).", "alpha")),
    method: Optional[str] = typer.Option(None, help=_help("Federated learning method.", "method")),
    backbone: Optional[str] = typer.Option(None, help=_help("resnet8 / resnet20 (CPU-sized) or resnet18 (paper).", "backbone")),
    projection_dim: Optional[int] = typer.Option(None, help=_help("Projector output dimension D.", "projection_dim")),
    rounds: Optional[int] = typer.Option(None, "--rounds", "-C", help=_help("Training rounds C (after the initialisation round 0).", "rounds")),
    local_epochs: Optional[int] = typer.Option(None, "--local-epochs", "-E", help=_help("Local epochs E per round.", "local_epochs")),
    batch_size: Optional[int] = typer.Option(None, help=_help("Local batch size.", "batch_size")),
    lr: Optional[float] = typer.Option(None, help=_help("Local SGD learning rate.", "lr")),
    momentum: Optional[float] = typer.Option(None, help=_help("Local SGD momentum.", "momentum")),
    weight_decay: Optional[float] = typer.Option(None, help=_help("Local SGD weight decay.", "weight_decay")),
    temperature: Optional[float] = typer.Option(None, help=_help("Softmax temperature of the cluster loss (paper: 0.1; CPU-scale runs need more, see docs/architecture.md).", "temperature")),
    ema_decay: Optional[float] = typer.Option(None, help=_help("EMA decay m of the target encoder.", "ema_decay")),
    memory_size: Optional[int] = typer.Option(None, help=_help("Target representations each client keeps (and clusters).", "memory_size")),
    num_local_centroids: Optional[int] = typer.Option(None, "--num-local-centroids", "-L", help=_help("Local centroids L released per client.", "num_local_centroids")),
    num_global_centroids: Optional[int] = typer.Option(None, "--num-global-centroids", "-G", help=_help("Global centroids G.", "num_global_centroids")),
    mechanism: Optional[str] = typer.Option(None, help=_help("Release mechanism: kanon, ldp, reps (see `privfed mechanisms`).", "mechanism")),
    epsilon: Optional[float] = typer.Option(None, help="ldp: total epsilon ONE client may spend over the whole run (all its releases composed with the PLD accountant; every release is calibrated for the worst case of rounds+1 participations)."),
    delta: Optional[float] = typer.Option(None, help="ldp: delta of that budget. [default: 1/(10 n) for the largest client's n samples, so below 1/n for every client]"),
    epsilon_per_release: Optional[float] = typer.Option(None, help="ldp: fix the epsilon of each single release instead; with --epsilon too, a run whose releases would exceed it is refused."),
    secagg: Optional[bool] = typer.Option(None, "--secagg/--no-secagg", help="Aggregate encoder updates with Flower's SecAgg+, so the server only sees their sum. [default: secagg]"),
    secagg_shares: Optional[int] = typer.Option(None, help="SecAgg+: shares each client's key is split into (its neighbours, itself included). [default: every sampled client up to 20, then an odd ~3 log2 of them]"),
    secagg_threshold: Optional[int] = typer.Option(None, help="SecAgg+: shares needed to reconstruct a key; shares - threshold neighbours may drop out. [default: a strict majority of the shares]"),
    secagg_clipping_range: Optional[float] = typer.Option(None, help=_help("SecAgg+: values are clipped to +-this before quantisation (privfed rescales updates so nothing is clipped).", "secagg_clipping_range")),
    secagg_timeout: Optional[float] = typer.Option(None, help="SecAgg+: seconds to wait for the replies of each protocol stage (set it for real deployments). [default: wait for all]"),
    dp_sgd: Optional[bool] = typer.Option(None, "--dp-sgd/--no-dp-sgd", help="Train clients with DP-SGD (Opacus: per-sample clipping and Gaussian noise). [default: no-dp-sgd]"),
    max_grad_norm: Optional[float] = typer.Option(None, help=_help("DP-SGD: per-sample gradient clipping norm.", "max_grad_norm")),
    dp_sgd_noise_multiplier: Optional[float] = typer.Option(None, help="DP-SGD: noise std / max-grad-norm. [default: calibrated from --dp-sgd-epsilon]"),
    dp_sgd_epsilon: Optional[float] = typer.Option(None, help="DP-SGD: epsilon the encoder updates of ONE client may spend over the whole run (at --delta). [default: 8 when neither this nor --dp-sgd-noise-multiplier is given]"),
    seed: Optional[int] = typer.Option(None, help=_help("Seed for partition, model init, sampling and augmentation.", "seed")),
    device: Optional[str] = typer.Option(None, help=_help("auto, cpu or cuda.", "device")),
    out: Optional[str] = typer.Option(None, help="Run directory. [default: runs/<time>-<method>-<mechanism>-seed<seed>]"),
    eval_every: Optional[int] = typer.Option(None, help=_help("Run the kNN monitor every N rounds (and after the last).", "eval_every")),
    knn_k: Optional[int] = typer.Option(None, help=_help("Neighbours of the kNN monitor.", "knn_k")),
    knn_temperature: Optional[float] = typer.Option(None, help=_help("Vote temperature of the kNN monitor.", "knn_temperature")),
    client_cpus: Optional[float] = typer.Option(None, help=_help("CPU cores reserved per simulated client (sets how many run in parallel).", "client_cpus")),
    client_gpus: Optional[float] = typer.Option(None, help=_help("GPU fraction reserved per simulated client.", "client_gpus")),
    verbose: bool = typer.Option(False, "--verbose", help="Show Flower's and Ray's own logs."),
) -> None:
    """Train Orchestra on simulated federated clients with Flower."""
    overrides = {k: v for k, v in locals().items() if k in _DEFAULTS}
    resolved = build_config(config, **overrides)
    if resolved.out is None:
        from privfed.runs import default_run_dir

        resolved = resolved.replace(out=str(default_run_dir(resolved)))
    from privfed.federation.simulation import simulate
    from privfed.training import preflight

    plan = preflight(resolved)

    typer.echo(
        f"privfed: Orchestra on {resolved.dataset}, {resolved.num_clients} clients "
        f"({resolved.clients_per_round} per round), {resolved.rounds} rounds, mechanism {resolved.mechanism}"
    )
    for line in plan.describe():
        typer.echo(line)
    if plan.is_dp:
        if plan.may_stop_early:
            typer.echo(
                f"privacy: the budget covers {plan.fitting_releases} releases per client; training stops "
                "cleanly before any client would exceed it"
            )
    simulate(resolved, _print_progress, verbose=verbose)


@app.command()
def evaluate(
    run_dir: Path = typer.Argument(..., help="A run directory written by `privfed train`."),
    train_data: str = typer.Option(..., help="Labelled data the probe learns from (its train split)."),
    test_data: str = typer.Option(..., help="Data the probe is scored on (its test split)."),
    protocol: Protocol = typer.Option(Protocol.knn, help="knn (k=200, T=0.1) or linear (probe on frozen features)."),
    checkpoint: str = typer.Option("final", help="initial, final, or a path to a checkpoint file."),
    data_dir: str = typer.Option("data", help="Where torchvision datasets live."),
    download: bool = typer.Option(False, "--download/--no-download", help="Allow downloading CIFAR-10/100."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    knn_k: int = typer.Option(200, help="Neighbours for the kNN protocol."),
    knn_temperature: float = typer.Option(0.1, help="Vote temperature for the kNN protocol."),
) -> None:
    """Re-evaluate a saved encoder on any labelled datasets; appends to RUN_DIR/evaluation.json."""
    from privfed.evaluate import evaluate_run

    result = evaluate_run(
        run_dir,
        train_data=train_data,
        test_data=test_data,
        protocol=protocol.value,
        checkpoint=checkpoint,
        data_dir=Path(data_dir),
        download=download,
        device=device,
        knn_k=knn_k,
        knn_temperature=knn_temperature,
    )
    typer.echo(f"{result['protocol']} accuracy: {result['accuracy']:.4f} ({result['checkpoint']}, {test_data})")


@app.command()
def mechanisms() -> None:
    """List the installed release mechanisms."""
    from mechanisms import available_mechanisms

    for name, description in available_mechanisms().items():
        typer.echo(f"{name:<10} {description}")


@app.command()
def datasets() -> None:
    """List the dataset names `--dataset` accepts."""
    from privfed.data import describe_datasets

    for name, description in describe_datasets().items():
        typer.echo(f"{name:<14} {description}")


@app.command()
def certs(
    out_dir: Path = typer.Option(Path("certificates"), "--out-dir", "-o", help="Directory to write the keys and certificates to."),
    supernodes: int = typer.Option(2, "--supernodes", "-n", min=0, help="SuperNode authentication key pairs to create: supernode-0 ... supernode-(N-1), one per partition."),
    host: Optional[list[str]] = typer.Option(None, "--host", help="DNS name or IP address SuperNodes and the flwr CLI use to reach the SuperLink (repeatable); localhost, 127.0.0.1 and ::1 are always included."),
    port: int = typer.Option(8000, min=1, max=65535, help="SuperLink port used in the printed commands."),
    days: int = typer.Option(365, min=1, help="Validity of the certificates in days."),
    force: bool = typer.Option(False, "--force", help="Replace existing files (all of them: a new CA invalidates the old certificates)."),
) -> None:
    """Create a CA, a SuperLink TLS certificate and SuperNode authentication keys for a Flower deployment."""
    from privfed.deployment.certs import generate_credentials, next_steps, write_credentials

    hosts = list(host or [])
    credentials = generate_credentials(supernodes, hosts, valid_days=days)
    paths = write_credentials(credentials, out_dir, force=force)
    private = set(paths.private_files())
    typer.echo(f"wrote {len(paths.all_files())} files to {paths.directory}:")
    for path in paths.all_files():
        typer.echo(f"  {path.name}{'  (private key, mode 600)' if path in private else ''}")
    typer.echo(f"the SuperLink certificate is valid for {', '.join(credentials.hosts)} for {days} days")
    typer.echo("")
    typer.echo(next_steps(paths, superlink_host=hosts[0] if hosts else "127.0.0.1", port=port))


def main() -> None:
    """Console entry point: user errors become one line on stderr and exit code 2."""
    try:
        app(standalone_mode=False)
    except PrivfedError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except typer.Exit as exit_:
        sys.exit(exit_.exit_code)
    except Exception as err:  # click usage errors
        import click

        if isinstance(err, click.ClickException):
            err.show()
            sys.exit(err.exit_code)
        raise


if __name__ == "__main__":
    main()
