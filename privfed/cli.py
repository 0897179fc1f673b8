"""``privfed``: the command-line front door (the only module importing everything)."""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import threading
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

with warnings.catch_warnings():
    # typer re-exports names click 8.2+ deprecates; under PYTHONWARNINGS=error that import alone would kill every
    # command. Only this warning, only here: a user's filters stay as they are everywhere else.
    warnings.filterwarnings("ignore", message="'click.utils.get_[a-z]+_stream' is deprecated", category=DeprecationWarning)
    import typer

from privfed import __version__, api
from privfed.cli_help import CHOICES, HELP_MAX_WIDTH, HelpCommand, RegistryChoice, attack_names
from privfed.cli_progress import ProgressView, RoundProgress
from privfed.cli_streams import forgiving_streams
from privfed.config import (
    DEFAULTS,
    TrainConfig,
    build_config,
    check_seed,
    field_types,
    option_help,
    option_panel,
)
from privfed.durable import FULL_DISK, check_path
from privfed.errors import PrivfedError
from privfed.run.interruption import signals_stop_runs
from privfed.run.stop import INTERRUPTED, run_failed, stop_cause

if TYPE_CHECKING:
    from privfed.run.plan import RunPlan
    from privfed.run.resume import ResumePoint
    from privfed.studies.results import StudyResult, TuneResult

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Privacy-focused federated learning with Orchestra.",
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help (HelpCommand): rich's option tables cut long option names at 80 columns
    context_settings={"max_content_width": HELP_MAX_WIDTH},
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"privfed {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print privfed's version and exit."
    ),
) -> None:
    """Privacy-focused federated learning with Orchestra."""


#: What `privfed train` exits with after a Ctrl-C stopped the run cleanly (the shell's 128 + SIGINT).
INTERRUPTED_EXIT_CODE = 130
#: What every command exits with for bad input (an option, a file, a run directory): one line on stderr.
USAGE_EXIT_CODE = 2
#: What `privfed train` exits with when the run stopped because it could not train (``summary.json``'s ``stop``).
FAILED_RUN_EXIT_CODE = 1


def _option_text(name: str, default: Any, bool_flag: bool) -> str:
    """A field's help with its default, as ``--help`` shows it (a --config file may change the default)."""
    info = option_help(name)
    flag = name.replace("_", "-")
    if info.default_text is not None:
        shown: Any = info.default_text
    elif bool_flag:
        shown = flag if default else f"no-{flag}"
    else:
        shown = default
    return info.help if shown is None else f"{info.help} [default: {shown}]"


def _declarations(name: str, *, boolean: bool) -> tuple[str, ...]:
    """A field's flags: ``--name`` and its short aliases, or ``--name/--no-name`` for a switch."""
    flag = "--" + name.replace("_", "-")
    return (f"{flag}/--no-{flag[2:]}",) if boolean else (flag, *option_help(name).flags)


def with_config_options(command: Callable[..., None]) -> Callable[..., None]:
    """Adds one ``--option`` per :class:`TrainConfig` field, unset (``None``) unless given; ``command`` receives them
    as ``**options``."""
    own = inspect.signature(command).parameters.values()
    parameters = [p for p in own if p.kind is not inspect.Parameter.VAR_KEYWORD]
    for field_, hint in zip(dataclasses.fields(TrainConfig), field_types().values()):
        kind = next(t for t in getattr(hint, "__args__", (hint,)) if t is not type(None))
        declarations = _declarations(field_.name, boolean=kind is bool)
        help_text = _option_text(field_.name, field_.default, kind is bool)
        parameters.append(
            inspect.Parameter(
                field_.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=typer.Option(
                    None, *declarations, help=help_text, show_default=False, click_type=CHOICES.get(field_.name),
                    rich_help_panel=option_panel(field_.name),
                ),
                annotation=kind | None,
            )
        )
    command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    return command


def config_option(name: str) -> Any:
    """A ``typer.Option`` sharing a :class:`TrainConfig` field's flag, help and default (for other commands)."""
    default = getattr(DEFAULTS, name)
    declarations = _declarations(name, boolean=isinstance(default, bool))
    return typer.Option(default, *declarations, help=option_help(name).help, click_type=CHOICES.get(name))


@app.command(cls=HelpCommand)
@with_config_options
def train(
    config: Path | None = typer.Option(None, "--config", help=(
        "A shipped preset by name (quick, cpu-cifar10, ...; configs/ in a checkout) or a TOML file; "
        "flags override it."
    )),
    verbose: bool = typer.Option(False, "--verbose", help="Show Flower's and Ray's own logs."),
    resume: Path | None = typer.Option(
        None, "--resume", help="Continue this stopped run from its last resume point (only --rounds and --runtime may change)."
    ),
    **options: Any,
) -> None:
    """Train Orchestra on simulated federated clients with Flower."""
    if resume is not None and config is not None:
        raise PrivfedError("--resume continues the recorded configuration; drop --config")
    planned = build_config(config, **options) if resume is None else None
    with api.claimed_run(planned, resume=resume, overrides=options) as (plan, point):
        if point is not None:
            typer.echo(f"privfed: resuming {resume} after round {point.round}")
        try:
            summary = _train(plan, point, verbose)
        except OSError as err:
            if err.errno not in FULL_DISK:
                raise
            raise _full_disk(err, plan) from None
    code = train_exit_code(summary)
    if code == FAILED_RUN_EXIT_CODE:
        typer.echo(f"error: the run failed: {summary['stopped_early']} (see {plan.run_dir.path / 'summary.json'})", err=True)
    if code:
        raise typer.Exit(code)


def _full_disk(err: OSError, plan: RunPlan) -> PrivfedError:
    """What a run stopped by a full disk says: how to go on, as the run's files allow (each was written whole)."""
    from privfed.run.resume import check_resumable, has_resume_point, read_resume_point

    run_dir = plan.run_dir
    full = f"cannot write in {run_dir.path}: {err.strerror}; "
    if not has_resume_point(run_dir):
        return PrivfedError(f"{full}make room, then remove {run_dir.path} and train again (it stopped before its first resume point)")
    try:
        check_resumable(run_dir, read_resume_point(run_dir), plan.config)
    except PrivfedError as refused:
        return PrivfedError(f"{full}the run cannot be resumed: {refused}")
    return PrivfedError(f"{full}make room, then `privfed train --resume {run_dir.path}` continues it from its last resume point")


def train_exit_code(summary: dict[str, Any]) -> int:
    """What `privfed train` exits with for a run that ended with ``summary``: 0, or why it did not finish."""
    if stop_cause(summary) == INTERRUPTED:
        return INTERRUPTED_EXIT_CODE
    if run_failed(summary):
        return FAILED_RUN_EXIT_CODE
    return 0


def _train(plan: RunPlan, point: ResumePoint | None, verbose: bool) -> dict[str, Any]:
    """Says what the run will do, then trains it."""
    from privfed.federation.simulation import simulate

    resolved, privacy = plan.config, plan.privacy
    releases = f"mechanism {privacy.mechanism}" if privacy.mechanism is not None else "no releases"
    typer.echo(
        f"privfed: {resolved.method} on {resolved.dataset}, {resolved.num_clients} clients "
        f"({resolved.clients_per_round} per round), {resolved.rounds} rounds, {releases}"
    )
    for line in privacy.describe():
        typer.echo(line)
    for warning in plan.warnings:
        typer.echo(f"warning: {warning}", err=True)
    if privacy.is_dp and privacy.may_stop_early:
        typer.echo(
            f"privacy: the budget covers {privacy.fitting_releases} releases per client; training stops "
            "cleanly before any client would exceed it"
        )
    view = ProgressView()
    try:
        return simulate(plan, RoundProgress(view, rounds_done=0 if point is None else point.round), verbose=verbose, resume=point)
    finally:
        view.close()


@app.command(cls=HelpCommand)
def evaluate(
    run_dir: Path = typer.Argument(..., help="A run directory written by `privfed train`."),
    train_data: str | None = typer.Option(None, help=(
        "Labelled data the probe learns from (its train split; a file named only here is used "
        "whole). [default: the run's dataset]"
    )),
    test_data: str | None = typer.Option(None, help=(
        "Data the probe is scored on (its test split; a file named only here is used whole). "
        "[default: the run's test dataset]"
    )),
    protocol: str = typer.Option("knn", click_type=click.Choice(["knn", "linear", "finetune", "tsne"]), help=(
        "knn (see --knn-k, --knn-temperature), linear (probe on frozen features), finetune (the "
        "whole backbone and a linear head on --label-fraction of the labels) or tsne (a 2-D picture "
        "of the test representations by class)."
    )),
    label_fraction: float = typer.Option(0.1, help=(
        "finetune: the fraction of labelled train images, class-balanced (the paper: 0.01 and 0.1)."
    )),
    seed: int = typer.Option(0, help="finetune: seeds the labelled subset, the head and the schedule's draws."),
    checkpoint: str = typer.Option("final", help="initial, final, or a path to a checkpoint file."),
    data_dir: str | None = typer.Option(None, "--data-dir", help="Where torchvision datasets live. [default: the run's]"),
    download: bool = config_option("download"),
    device: str = config_option("device"),
    knn_k: int = config_option("knn_k"),
    knn_temperature: float = config_option("knn_temperature"),
) -> None:
    """Re-evaluate a saved encoder on any labelled datasets, or draw its representations; appends to RUN_DIR/evaluation.json."""
    view = ProgressView()
    try:
        result = api.evaluate(
            run_dir,
            train_data=train_data,
            test_data=test_data,
            protocol=protocol,
            label_fraction=label_fraction,
            seed=seed,
            checkpoint=checkpoint,
            data_dir=data_dir,
            download=download,
            device=device,
            knn_k=knn_k,
            knn_temperature=knn_temperature,
            progress=view.step,
        )
    finally:
        view.close()
    for warning in result.get("warnings", []):
        typer.echo(f"warning: {warning}", err=True)
    if result["accuracy"] is None:
        typer.echo(f"wrote {result['picture']} ({result['num_test']} test images, {result['checkpoint']})")
    else:
        typer.echo(
            f"{result['protocol']} accuracy: {result['accuracy']:.4f} ({result['checkpoint']}, "
            f"{result['test_data']})"
        )


def _parse_rounds(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise PrivfedError(f"--rounds takes comma-separated round numbers, e.g. 1,40; got {text!r}") from None


@app.command(cls=HelpCommand)
def attack(
    run_dir: Path = typer.Argument(..., help="A run directory trained with --record-releases."),
    method: str = typer.Option(..., "--method", click_type=RegistryChoice("attack", attack_names), help=(
        "Attack: decoder, decoder-releases (mechanism-aware), optimization, or cross-round "
        "(reads every round's releases; see `privfed attacks`)."
    )),
    aux: str | None = typer.Option(None, "--aux", help=(
        "Auxiliary data the server holds (its test split); must share no image with the clients. "
        "[default: the run's test split]"
    )),
    rounds: str | None = typer.Option(None, "--rounds", help=(
        "Comma-separated recorded rounds to attack. [default: the first training round and the "
        "last]"
    )),
    device: str = config_option("device"),
    seed: int = typer.Option(0, "--seed", help="Seed of the attack (vector choice, auxiliary split, training)."),
    max_vectors: int = typer.Option(200, "--max-vectors", min=1, help=(
        "Released vectors attacked per round, drawn at random among those with weight."
    )),
    steps: int | None = typer.Option(None, "--steps", min=1, help=(
        "The attack's step budget: decoder training steps, or optimisation steps per vector. "
        "[default: the attack's own, 2000 / 200]"
    )),
    client_models: bool = typer.Option(False, "--client-models", help=(
        "Invert each release with its client's model after local training (one fit per client), "
        "from the updates a --no-secagg run recorded."
    )),
) -> None:
    """Invert a run's recorded releases as a semi-honest server would; writes RUN_DIR/attack.json and attack.png."""
    check_seed("--seed", seed)
    view = ProgressView()
    try:
        result = api.attack(
            run_dir, method=method, aux=aux, rounds=_parse_rounds(rounds), device=device, seed=seed,
            max_vectors=max_vectors, steps=steps, client_models=client_models, progress=view.attack_step,
            log=view.echo,
        )
    finally:
        view.close()
    for row in result["rounds"]:
        parts = [f"round {row['round']}: {row['vectors']} vectors"]
        for name in ("psnr_source", "psnr_best_member", "psnr_best_client", "reid_rate"):
            if name in row:
                parts.append(f"{name} {row[name]:.3f} (null {row['null_' + name]:.3f})")
        if "matched_cosine" in row:
            parts.append(f"matched_cosine {row['matched_cosine']:.3f} (one round {row['single_round_matched_cosine']:.3f}, "
                         f"null {row['null_matched_cosine']:.3f})")
        typer.echo("  ".join(parts))
    typer.echo(f"wrote {run_dir / 'attack.json'} and {run_dir / 'attack.png'}")


@app.command(cls=HelpCommand)
def plot(
    run_dirs: list[Path] = typer.Argument(..., help="Run directories written by `privfed train`."),
    out: Path = typer.Option(Path("curves-compared.png"), "--out", "-o", help="Where to write the PNG."),
) -> None:
    """Overlay several runs' curves (kNN, losses, epsilon spent, round time) in one PNG."""
    from privfed.run.curves import RunCurves, plot_curves

    for run_dir in run_dirs:
        check_path(run_dir, "a run directory")
    missing = [str(d) for d in run_dirs if not (d / "metrics.jsonl").is_file()]
    if missing:
        raise PrivfedError(f"not a privfed run directory (no metrics.jsonl): {', '.join(missing)}")
    typer.echo(f"wrote {plot_curves([RunCurves.of(d) for d in run_dirs], out)}")


# The options `privfed study` and `privfed tune` share.
STUDY_OUT = typer.Option(None, "--out", help="The study directory. [default: studies/<file name>]")
STUDY_REUSE_STALE = typer.Option(False, "--reuse-stale", help=(
    "Keep finished cells whose configuration changed since they ran (or predates the hash privfed keeps); without "
    "it the study refuses to run and names them."
))
STUDY_DATASET = typer.Option(None, "--dataset", help=(
    "Train every cell on this data instead of the study's (e.g. arrays:PATH offline); a change makes finished cells stale."
))
STUDY_DATA_DIR = typer.Option(None, "--data-dir", help="Where torchvision datasets live. [default: the study's]")
STUDY_DOWNLOAD = typer.Option(None, "--download/--no-download", show_default=False, help=(
    "Allow downloading CIFAR-10/100 into --data-dir for every cell (needs a network)."
))


@app.command(cls=HelpCommand)
def study(
    study_file: Path = typer.Argument(..., help=(
        "A shipped study by name (privacy-cpu-cifar10, ...; configs/studies/ in a checkout) or a study TOML file."
    )),
    out: Path | None = STUDY_OUT,
    report: bool = typer.Option(False, "--report", help="Run nothing: write the tables and plots of the runs recorded so far."),
    reuse_stale: bool = STUDY_REUSE_STALE,
    dataset: str | None = STUDY_DATASET,
    data_dir: str | None = STUDY_DATA_DIR,
    download: bool | None = STUDY_DOWNLOAD,
) -> None:
    """Run every cell of a study (train, evaluate, attack), skipping finished ones; write results.csv and results.md."""
    _echo_written(_studied(api.study, study_file, out=out, report=report, reuse_stale=reuse_stale, dataset=dataset,
                           data_dir=data_dir, download=download))


@app.command(cls=HelpCommand)
def tune(
    study_file: Path = typer.Argument(..., help=(
        "A study by name or TOML file whose grid holds the candidates, e.g. lr and ema_decay "
        "(tune-cpu-cifar10)."
    )),
    out: Path | None = STUDY_OUT,
    reuse_stale: bool = STUDY_REUSE_STALE,
    dataset: str | None = STUDY_DATASET,
    data_dir: str | None = STUDY_DATA_DIR,
    download: bool | None = STUDY_DOWNLOAD,
) -> None:
    """Rank hyperparameters without labels by Align + 0.2 Unif (paper §5), with the label-based accuracy beside it; writes tuning.md."""
    result = _studied(api.tune, study_file, out=out, reuse_stale=reuse_stale, dataset=dataset, data_dir=data_dir,
                      download=download)
    _echo_written(result.study)
    typer.echo(result.ranking)
    typer.echo(f"wrote {result.path}")


Studied = TypeVar("Studied", "StudyResult", "TuneResult")


def _studied(call: Callable[..., Studied], study_file: Path, **options: Any) -> Studied:
    """``privfed.study`` or ``privfed.tune`` with its progress drawn; Ctrl-C exits 130 after naming what it wrote."""
    from privfed.studies.results import StudyStopped  # not at the top: the studies' modules would add ~0.1 s to --help

    view = ProgressView()  # inside a cell: bars on a terminal, nothing in a log (its lines are the cells')

    def line(text: str) -> None:
        view.close()  # the study's lines come between cells: the bars of the cell before go
        view.echo(text)

    try:
        result = call(study_file, log=line, run_progress=lambda name: RoundProgress(view, lines=False, label=f"{name} rounds"),
                      progress=view.step, **options)
    except StudyStopped as stop:
        view.close()
        typer.echo(f"study stopped ({stop}); the same command continues it", err=True)
        _echo_written(stop.result)
        raise typer.Exit(INTERRUPTED_EXIT_CODE) from None
    finally:
        view.close()
    return result


def _echo_written(result: StudyResult) -> None:
    """The ``wrote ...`` line: the study's tables and plots, and how many runs they hold (nothing when none)."""
    if not result.written:
        return
    written = ", ".join(str(path) for path in result.written)
    partial = f" of the study's {result.cells}" if len(result.records) < result.cells else ""
    typer.echo(f"wrote {written} ({len(result.records) - result.failed} runs{partial}, {result.failed} failed)")


@app.command(name="attacks", cls=HelpCommand)
def list_attacks() -> None:
    """List the installed inversion attacks."""
    from attacks import available_attacks

    for name, description in available_attacks().items():
        typer.echo(f"{name:<17} {description}")


@app.command(cls=HelpCommand)
def mechanisms() -> None:
    """List the installed release mechanisms."""
    from mechanisms import MechanismRegistrationError, available_mechanisms

    try:
        installed = available_mechanisms()
    except MechanismRegistrationError as err:
        raise PrivfedError(str(err)) from None
    for name, description in installed.items():
        typer.echo(f"{name:<10} {description}")


@app.command(cls=HelpCommand)
def datasets() -> None:
    """List the dataset names `--dataset` accepts."""
    from privfed.data import describe_datasets

    for name, description in describe_datasets().items():
        typer.echo(f"{name:<14} {description}")


#: The longest certificate validity ``privfed certs`` writes (100 years; X.509 dates end in 9999).
MAX_CERTIFICATE_DAYS = 36500
#: The most SuperNode key pairs one ``privfed certs`` creates (each takes a few milliseconds and two files).
MAX_SUPERNODE_KEYS = 10_000


@app.command(cls=HelpCommand)
def certs(
    out_dir: Path = typer.Option(Path("certificates"), "--out-dir", "-o", help="Directory to write the keys and certificates to."),
    supernodes: int = typer.Option(2, "--supernodes", "-n", min=0, max=MAX_SUPERNODE_KEYS, help=(
        "SuperNode authentication key pairs to create: supernode-0 ... supernode-(N-1), one per "
        "partition, each also the node's SecAgg+ identity; supernode-peers.pub lists their public keys."
    )),
    host: list[str] | None = typer.Option(None, "--host", help=(
        "DNS name or IP address SuperNodes and the flwr CLI use to reach the SuperLink "
        "(repeatable); localhost, 127.0.0.1 and ::1 are always included."
    )),
    port: int = typer.Option(8000, min=1, max=65535, help="SuperLink port used in the printed commands."),
    days: int = typer.Option(365, min=1, max=MAX_CERTIFICATE_DAYS, help="Validity of the certificates in days."),
    force: bool = typer.Option(False, "--force", help="Replace existing files (all of them: a new CA invalidates the old certificates)."),
) -> None:
    """Create a CA, a SuperLink TLS certificate and SuperNode authentication keys for a Flower deployment."""
    from privfed.deployment.certs import generate_credentials, next_steps, write_credentials

    hosts = list(host or [])
    credentials = generate_credentials(supernodes, hosts, valid_days=days)
    try:
        paths = write_credentials(credentials, out_dir, force=force)
    except FileExistsError as err:
        raise PrivfedError(f"cannot write the certificates into {out_dir}: {err.filename} is in the way") from None
    except OSError as err:
        raise PrivfedError(f"cannot write the certificates into {out_dir}: {err.strerror} ({err.filename})") from None
    private = set(paths.private_files())
    typer.echo(f"wrote {len(paths.all_files())} files to {paths.directory}:")
    for path in paths.all_files():
        typer.echo(f"  {path.name}{'  (private key, mode 600)' if path in private else ''}")
    typer.echo(f"the SuperLink certificate is valid for {', '.join(credentials.hosts)} for {days} days\n")
    typer.echo(next_steps(paths, superlink_host=hosts[0] if hosts else "127.0.0.1", port=port))


def _one_line(text: str) -> str:
    """A message on one line (a path or a quoted value may carry newlines)."""
    return " ".join(str(text).split())


def _exit_after_a_bug(code: int) -> None:
    """Exits after an unexpected error, without waiting for threads a runtime left behind (they can wait forever)."""
    sys.stdout.flush()
    sys.stderr.flush()
    current = threading.current_thread()
    if any(t.is_alive() and not t.daemon and t is not current for t in threading.enumerate()):
        os._exit(code)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: bad input becomes one line on stderr and exit code 2."""
    # Before torch loads (commands import it lazily): torch's OpenMP threads then sleep while they wait instead of
    # spinning, which on a machine other jobs share made the server's kNN evaluation 3 to 4 times slower (docs/flower.md).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    with forgiving_streams():  # a closed or full stdout/stderr stops the printing, not the command
        _run(argv)


def _run(argv: list[str] | None) -> None:
    """Runs one command; every way it can end becomes an exit code (and one line on stderr for bad input)."""
    try:
        with signals_stop_runs():  # only the command line lets Ctrl-C stop a run after its round
            code = app(args=argv, prog_name="privfed", standalone_mode=False)  # a typer.Exit's code is returned
    except PrivfedError as err:
        typer.echo(f"error: {_one_line(str(err))}", err=True)
        sys.exit(USAGE_EXIT_CODE)
    except (KeyboardInterrupt, click.exceptions.Abort):  # Abort: click's own Ctrl-C
        typer.echo("interrupted", err=True)
        sys.exit(INTERRUPTED_EXIT_CODE)
    except typer.Exit as exit_:
        sys.exit(exit_.exit_code)
    except click.ClickException as err:  # usage errors: an unknown option, a value of the wrong type
        command = err.ctx.command_path if isinstance(err, click.UsageError) and err.ctx is not None else "privfed"
        typer.echo(f"error: {_one_line(err.format_message())} (see {command} --help)", err=True)
        sys.exit(err.exit_code)
    except OSError as err:
        if err.errno not in FULL_DISK:
            traceback.print_exc()
            _exit_after_a_bug(1)
        where = f" {err.filename}" if err.filename else ""
        typer.echo(f"error: cannot write{where}: {err.strerror}", err=True)
        sys.exit(USAGE_EXIT_CODE)
    except Exception:
        traceback.print_exc()
        _exit_after_a_bug(1)
    if isinstance(code, int) and code:
        sys.exit(code)


if __name__ == "__main__":
    main()
