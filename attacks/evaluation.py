"""``privfed attack``: run an attack on recorded rounds and score it against the recomputed truth.

The only module that imports both the attackers and the scoring; the null
reconstruction is docs/attacks.md's ("Scores").
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attacks.attackers.aux_releases import aux_releases, aux_views_and_representations
from attacks.base import AttackTarget, Inversion, ProgressCallback
from attacks.figure import save_attack_figure
from attacks.registry import get_attack_class
from attacks.scoring.ground_truth import VERIFIED, ClientMemory, VectorTruth, recorded_truth, training_images
from attacks.scoring.report import summarize
from attacks.scoring.vector_scores import best_member, score_client_vectors
from mechanisms import get_mechanism_class
from privfed.config import TrainConfig
from privfed.data import cached_dataset
from privfed.data.augment import to_float
from privfed.device import resolve_device
from privfed.errors import PrivfedError
from privfed.methods import build_network, get_method
from privfed.orchestra.model_state import load_shared_state
from privfed.run.directory import RunDirectory
from privfed.run.recording import RecordedRound, read_round, recorded_rounds

#: Auxiliary images held out of the attack's training as re-identification distractors, and as many for the null.
DEFAULT_DISTRACTORS = 128
NULL_DEFINITION = (
    "the same attack applied to a random vector the same mechanism released from memories of held-out auxiliary "
    "images (neither the attack's training images nor the distractors)"
)


@dataclass(frozen=True)
class Inverted:
    """One round's attacked vectors (``(release, vector)`` picks), their reconstructions and the nulls (the
    attack on auxiliary releases), made before any truth is looked at."""

    picks: list[tuple[int, int]]
    reconstructions: torch.Tensor
    nulls: torch.Tensor


@dataclass(frozen=True)
class ReleaseTruth:
    """One release's client data and the members behind each of its vectors (scoring side)."""

    memory: ClientMemory
    truths: list[VectorTruth]


def attack_target(
    config: TrainConfig,
    recorded: RecordedRound,
    device: torch.device,
    *,
    mechanism: str | None = None,
    mechanism_params: dict[str, Any] | None = None,
) -> AttackTarget:
    """The round as the server knows it (another mechanism may stand in for a comparison)."""
    network = build_network(config)
    load_shared_state(network, recorded.model_state)
    return AttackTarget(
        round=recorded.round,
        encoder=get_method(config.method).encoder(network),
        mechanism=mechanism or recorded.mechanism,
        mechanism_params=recorded.mechanism_params if mechanism_params is None else mechanism_params,
        centroids=recorded.centroids,
        num_local_centroids=config.num_local_centroids,
        memory_size=config.memory_size,
        batch_size=config.batch_size,
        device=device,
    )


def load_auxiliary(config: TrainConfig, spec: str | None) -> tuple[torch.Tensor, str]:
    """Auxiliary images: ``spec``'s test split, by default the run's own (no client holds it).

    Raises:
        PrivfedError: the images overlap the clients' data, or their shape differs.
    """
    name = spec or config.test_dataset or config.dataset
    images = cached_dataset(name, "test", config.data_dir, config.download).to_tensor()
    train = training_images(config)
    if images.shape[1:] != train.shape[1:]:
        raise PrivfedError(f"auxiliary images are {tuple(images.shape[1:])}, the run's are {tuple(train.shape[1:])}")
    shared = len(_fingerprints(images) & _fingerprints(train))
    if shared:
        raise PrivfedError(f"the auxiliary data {name} shares {shared} images with the clients' data; use disjoint images")
    return images, f"{name} (test split)"


@dataclass(frozen=True)
class AuxiliarySplit:
    """Disjoint auxiliary images: to fit on, for the null releases (unseen by the attack, so a null is as out of
    sample as a client's vector), and re-identification distractors."""

    fit: torch.Tensor
    null: torch.Tensor
    distractors: torch.Tensor


def split_auxiliary(images: torch.Tensor, distractors: int, generator: torch.Generator) -> AuxiliarySplit:
    """``distractors`` (at most a quarter) and as many null images (at most a quarter) held out; the rest to fit."""
    order = torch.randperm(images.shape[0], generator=generator)
    held_out = min(distractors, images.shape[0] // 4)
    return AuxiliarySplit(
        fit=images[order[2 * held_out :]],
        null=images[order[held_out : 2 * held_out]],
        distractors=images[order[:held_out]],
    )


def _fingerprints(images: torch.Tensor) -> set[bytes]:
    return {hashlib.blake2b(image.numpy().tobytes(), digest_size=16).digest() for image in images}


def selected_vectors(
    weights: list[torch.Tensor], max_vectors: int, generator: torch.Generator
) -> list[tuple[int, int]]:
    """(release, vector) pairs to attack: vectors that carry weight, at most ``max_vectors`` drawn uniformly."""
    pairs = [(r, j) for r, w in enumerate(weights) for j in range(w.shape[0]) if w[j] > 0]
    if len(pairs) > max_vectors:
        keep = torch.randperm(len(pairs), generator=generator)[:max_vectors].sort().values
        pairs = [pairs[i] for i in keep.tolist()]
    return pairs


def null_vectors(
    target: AttackTarget, aux_images: torch.Tensor, count: int, generator: torch.Generator
) -> torch.Tensor:
    """``count`` vectors drawn from the mechanism's releases of auxiliary memories (docs/attacks.md's null);
    auxiliary representations when every release is padding."""
    reps, image_of_rep = aux_views_and_representations(target, aux_images, generator=generator)
    memories = max(1, math.ceil(count / max(1, target.num_local_centroids)))
    released = aux_releases(target, reps, image_of_rep, aux_images, num_memories=min(memories, 64), generator=generator)
    pool = released.vectors if released.vectors.shape[0] else reps
    return pool[torch.randint(pool.shape[0], (count,), generator=generator)]


def invert_round(
    inversion: Inversion,
    target: AttackTarget,
    releases: list[tuple[torch.Tensor, torch.Tensor]],
    *,
    null_images: torch.Tensor,
    max_vectors: int,
    generator: torch.Generator,
    log: Callable[[str], None] | None = None,
) -> Inverted:
    """Inverts up to ``max_vectors`` released vectors (``(vectors, weights)`` per release) and as many nulls.

    Raises:
        PrivfedError: no released vector carries weight.
    """
    picks = selected_vectors([w for _, w in releases], max_vectors, generator)
    if not picks:
        raise PrivfedError(f"round {target.round} has no released vector with weight to attack")
    vectors = torch.stack([releases[r][0][j].float() for r, j in picks])
    if log is not None:
        log(f"round {target.round}: inverting {len(picks)} released vectors, then as many null vectors")
    reconstructions = inversion(vectors)
    nulls = inversion(null_vectors(target, null_images, len(picks), generator))
    return Inverted(picks, reconstructions, nulls)


def score_round(
    inverted: Inverted, truth: list[ReleaseTruth], *, distractors: torch.Tensor, single_source: bool
) -> tuple[dict[str, Any], list[tuple[torch.Tensor, ...]]]:
    """Scores every attacked vector and its null against the truth behind it: the round's summary and, per
    vector, (private image, reconstruction, best-matching member, null) for the figure."""
    rows: list[dict[str, float | None]] = []
    figure: list[tuple[torch.Tensor, ...]] = []
    for r, release in enumerate(truth):
        mine = [i for i, (owner, _) in enumerate(inverted.picks) if owner == r]
        if not mine:
            continue
        truths = [release.truths[inverted.picks[i][1]] for i in mine]
        images = release.memory.images
        rows += score_client_vectors(
            inverted.reconstructions[mine], inverted.nulls[mine], truths, images, distractors,
            single_source=single_source,
        )
        for i, vector_truth in zip(mine, truths):
            reconstruction = inverted.reconstructions[i]
            figure.append((
                _private_image(vector_truth, images), reconstruction,
                best_member(reconstruction, vector_truth, images), inverted.nulls[i],
            ))
    return summarize(rows), figure


def _private_image(truth: VectorTruth, client_images: torch.Tensor) -> torch.Tensor:
    """What the vector stands for: its source image, or its members' mean image (unknown members: a blank)."""
    images = to_float(client_images)
    if truth.members is None or truth.members.numel() == 0:
        return torch.zeros_like(images[0])
    return images[truth.members].mean(dim=0)


def attack_run(
    run_dir: Path,
    *,
    method: str,
    aux: str | None = None,
    rounds: list[int] | None = None,
    device: str = "auto",
    seed: int = 0,
    max_vectors: int = 200,
    distractors: int = DEFAULT_DISTRACTORS,
    attack_settings: dict[str, Any] | None = None,
    progress: ProgressCallback | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Attacks a recorded run's rounds; writes ``attack.json`` and ``attack.png`` into the run directory.

    Raises:
        PrivfedError: an unknown attack, a run recorded without ``--record-releases``,
            a round not recorded or without anything to attack, overlapping auxiliary data.
    """
    attack_class = get_attack_class(method)
    run = RunDirectory(run_dir)
    config = run.config()
    run.check_writable("attack.json", "attack.png")  # before a minute of attacking, not after
    if config.release_mechanism is None:
        raise PrivfedError(f"method {config.method} releases nothing: there is nothing to attack")
    available = recorded_rounds(run.releases)
    if not available:
        raise PrivfedError(f"{run_dir} holds no recorded releases: train with --record-releases to attack a run")
    chosen = rounds or _default_rounds(available)
    missing = [r for r in chosen if r not in available]
    if missing:
        raise PrivfedError(f"rounds {missing} were not recorded (recorded: {available[0]}..{available[-1]})")
    attack = attack_class(seed=seed, **(attack_settings or {}))
    torch_device = resolve_device(device)
    say = log or (lambda _: None)
    say(f"attacking {run_dir} with {method}, round(s) {', '.join(map(str, chosen))}: loading the auxiliary data")
    aux_images, aux_name = load_auxiliary(config, aux)
    generator = torch.Generator().manual_seed(seed)
    split = split_auxiliary(aux_images, distractors, generator)
    single_source = get_mechanism_class(config.release_mechanism).releases_raw_data
    results, figure_rows, params = [], [], {}
    for round_index in chosen:
        start = time.perf_counter()
        recorded = read_round(run.releases, round_index)
        params = recorded.mechanism_params
        if not recorded.releases or all(r.vectors.shape[0] == 0 for r in recorded.releases):
            raise PrivfedError(f"round {round_index} holds no released vectors")
        # The attacker's part: the round's public target, auxiliary images and the releases, nothing else.
        target = attack_target(config, recorded, torch_device)
        say(f"round {round_index}: fitting {method} on {split.fit.shape[0]} auxiliary images ({aux_name})")
        inversion = attack.fit(target, split.fit, progress=progress)
        fit_seconds = time.perf_counter() - start
        inverted = invert_round(
            inversion, target, [(r.vectors, r.weights) for r in recorded.releases],
            null_images=split.null, max_vectors=max_vectors, generator=generator, log=log,
        )
        # Only now the truth: each client whose vectors were attacked is replayed.
        say(f"round {round_index}: replaying the attacked clients for the ground truth")
        attacked = {r for r, _ in inverted.picks}
        truth, statuses = [], {}
        for r, release in enumerate(recorded.releases):
            if r in attacked:
                memory, truths, status = recorded_truth(config, recorded, release)
                statuses[release.client] = status
            else:
                memory, truths = ClientMemory(release.client, aux_images[:0], None, None), []
            truth.append(ReleaseTruth(memory, truths))
        if any(s != VERIFIED for s in statuses.values()):
            say(f"round {round_index}: members unknown for {sum(s != VERIFIED for s in statuses.values())} "
                f"of {len(statuses)} clients ({', '.join(sorted(set(statuses.values())))}): member scores cover the rest")
        summary, figure = score_round(inverted, truth, distractors=split.distractors, single_source=single_source)
        results.append({
            "round": round_index,
            "membership": {str(client): status for client, status in sorted(statuses.items())},
            **summary,
            "vectors_released": sum(r.vectors.shape[0] for r in recorded.releases),
            "vectors_with_weight": sum(int((r.weights > 0).sum()) for r in recorded.releases),
            "fit_seconds": fit_seconds,
            "seconds": time.perf_counter() - start,
        })
        figure_rows = figure
    payload = {
        "run_dir": str(run_dir),
        "attack": {"method": method, **attack.settings()},
        "mechanism": {"name": config.release_mechanism, "params": params},
        "privacy_statement": _statement(run),
        "auxiliary": {
            "data": aux_name, "fit_images": int(split.fit.shape[0]), "null_images": int(split.null.shape[0]),
            "distractors": int(split.distractors.shape[0]), "no_exact_duplicates_of_client_images": True,
        },
        "null": NULL_DEFINITION,
        "rounds": results,
    }
    run.write_json("attack.json", payload)
    save_attack_figure(run.path / "attack.png", figure_rows, title=f"{method} on {config.release_mechanism}, round {chosen[-1]}", seed=seed)
    return payload


def attack_last_round(
    run_dir: Path, *, method: str, attack_settings: dict[str, Any] | None = None, progress: ProgressCallback | None = None
) -> dict[str, Any]:
    """The figures of a run's last recorded round, as a study reports them (``attack.json`` holds that round only);
    a round of padding only (a DP mechanism at a small ε) scores no vectors instead of failing."""
    run = RunDirectory(run_dir)
    available = recorded_rounds(run.releases) if run.config().release_mechanism is not None else []
    if available:
        recorded = read_round(run.releases, available[-1])
        if not any(bool((release.weights > 0).any()) for release in recorded.releases):
            released = sum(release.vectors.shape[0] for release in recorded.releases)
            return {"round": available[-1], "vectors": 0, "vectors_released": released, "vectors_with_weight": 0}
    rounds = available[-1:] or None  # none recorded: attack_run says why
    return attack_run(run_dir, method=method, rounds=rounds, attack_settings=attack_settings, progress=progress)["rounds"][-1]


def _default_rounds(available: list[int]) -> list[int]:
    """The first training round and the last recorded one."""
    training = [r for r in available if r > 0] or available
    return sorted({training[0], available[-1]})


def _statement(run: RunDirectory) -> Any:
    try:
        return run.read_json("summary.json")["privacy"]["statement"]
    except (OSError, KeyError, ValueError):
        return None
