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

from attacks.attackers.aux_releases import aux_releases, aux_views_and_representations, released_again, summed_again
from attacks.attackers.cross_round import slot_vectors
from attacks.base import Attack, AttackTarget, CrossRoundAttack, Estimates, Inversion, ProgressCallback, ReleaseHistory
from attacks.figure import save_attack_figure
from attacks.registry import get_attack_class
from attacks.scoring.ground_truth import VERIFIED, ClientMemory, VectorTruth, recorded_truth, training_images
from attacks.scoring.report import mean_interval, summarize
from attacks.scoring.vector_recovery import matched_cosine
from attacks.scoring.vector_scores import best_member, score_client_vectors
from mechanisms import get_mechanism_class
from privfed.config import TrainConfig
from privfed.data import cached_dataset
from privfed.data.augment import to_float
from privfed.data.federated import FederatedSplit
from privfed.device import resolve_device
from privfed.errors import PrivfedError
from privfed.methods import build_network, get_method
from privfed.orchestra.model_state import StateDict, load_shared_state
from privfed.run.directory import RunDirectory
from privfed.run.recording import RecordedRound, client_state, read_round, recorded_rounds

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
    state: StateDict | None = None,
) -> AttackTarget:
    """The round as the server knows it (another mechanism may stand in for a comparison; ``state``, a client's
    model after its local training, for the round's)."""
    network = build_network(config)
    load_shared_state(network, recorded.model_state if state is None else state)
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


@dataclass(frozen=True, eq=False)
class RoundModel:
    """A model the attack inverts with, and its inversion (the round's, or one client's after local training)."""

    target: AttackTarget
    inversion: Inversion


def invert_round(
    models: list[RoundModel],
    releases: list[tuple[torch.Tensor, torch.Tensor]],
    *,
    null_images: torch.Tensor,
    max_vectors: int,
    generator: torch.Generator,
    null_vectors_of: Callable[[AttackTarget, int], torch.Tensor] | None = None,
    log: Callable[[str], None] | None = None,
) -> Inverted:
    """Inverts up to ``max_vectors`` released vectors (``(vectors, weights)`` per release, each with its model) and
    as many nulls, each made and inverted under its vector's model (by default :func:`null_vectors`).

    Raises:
        PrivfedError: no released vector carries weight.
    """
    picks = selected_vectors([w for _, w in releases], max_vectors, generator)
    round_index = models[0].target.round
    if not picks:
        raise PrivfedError(f"round {round_index} has no released vector with weight to attack")
    make_nulls = null_vectors_of or (lambda target, count: null_vectors(target, null_images, count, generator))
    if log is not None:
        log(f"round {round_index}: inverting {len(picks)} released vectors, then as many null vectors")
    reconstructions: dict[int, torch.Tensor] = {}
    nulls: dict[int, torch.Tensor] = {}
    for model in dict.fromkeys(models[r] for r, _ in picks):  # each model once, in the order first picked
        mine = [i for i, (r, _) in enumerate(picks) if models[r] is model]
        vectors = torch.stack([releases[picks[i][0]][0][picks[i][1]].float() for i in mine])
        reconstructions.update(zip(mine, model.inversion(vectors)))
        nulls.update(zip(mine, model.inversion(make_nulls(model.target, len(mine)))))
    order = range(len(picks))
    return Inverted(picks, torch.stack([reconstructions[i] for i in order]), torch.stack([nulls[i] for i in order]))


class RecordedRun:
    """A run's recorded rounds, each file read once: its releases per client and its target (the model is kept: a
    cross-round attack reads every client's history under the same models)."""

    def __init__(self, directory: Path, config: TrainConfig, device: torch.device) -> None:
        self.directory, self.config, self.device = directory, config, device
        self.available = recorded_rounds(directory)
        self._rounds: dict[int, tuple[dict[int, tuple[torch.Tensor, torch.Tensor]], AttackTarget]] = {}

    def _load(self, round_index: int) -> tuple[dict[int, tuple[torch.Tensor, torch.Tensor]], AttackTarget]:
        if round_index not in self._rounds:
            recorded = read_round(self.directory, round_index)
            releases = {r.client: (r.vectors, r.weights) for r in recorded.releases}
            self._rounds[round_index] = releases, attack_target(self.config, recorded, self.device)
        return self._rounds[round_index]

    def releases(self, round_index: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        return self._load(round_index)[0]

    def target(self, round_index: int) -> AttackTarget:
        """The round as the server sent it."""
        return self._load(round_index)[1]

    def history(self, client: int, up_to: int, window: int) -> ReleaseHistory:
        """The client's releases in the recorded rounds ``(up_to - window, up_to]`` it took part in."""
        rounds = [r for r in self.available if up_to - window < r <= up_to and client in self.releases(r)]
        pairs = [self.releases(r)[client] for r in rounds]
        return ReleaseHistory(
            client, tuple(rounds), tuple(v for v, _ in pairs), tuple(w for _, w in pairs),
            tuple(self.target(r) for r in rounds),
        )


def estimate_across_rounds(
    attack: CrossRoundAttack,
    run: RecordedRun,
    recorded: RecordedRound,
    *,
    fit_images: torch.Tensor,
    null_images: torch.Tensor,
    generator: torch.Generator,
) -> tuple[list[Estimates], list[Estimates]]:
    """Per release of the attacked round, the attack's estimates from its client's history, and the same attack's
    estimates from a null history: a client of held-out auxiliary images released through the same rounds."""
    histories = [run.history(r.client, recorded.round, attack.window) for r in recorded.releases]
    size = min(run.config.memory_size, null_images.shape[0])
    null_sets = [null_images[torch.randperm(null_images.shape[0], generator=generator)[:size]] for _ in histories]
    null_releases: list[dict[int, tuple[torch.Tensor, torch.Tensor]]] = [{} for _ in histories]
    for round_index in sorted({r for h in histories for r in h.rounds}):  # each round's model built once
        target = run.target(round_index)
        for i, history in enumerate(histories):
            if round_index in history.rounds:
                null_releases[i][round_index] = released_again(target, null_sets[i], generator=generator)
    estimates, nulls = [], []
    for history, made in zip(histories, null_releases):
        estimates.append(attack.estimate(history, fit_images))
        null_history = ReleaseHistory(
            history.client, history.rounds, tuple(made[r][0] for r in history.rounds),
            tuple(made[r][1] for r in history.rounds), history.targets,
        )
        null = attack.estimate(null_history, fit_images)
        if null.vectors.shape[0] == 0:  # nothing with weight: the null inverts what the mechanism released anyway
            null = Estimates(null_history.vectors[-1], torch.full((null_history.vectors[-1].shape[0],), -1))
        nulls.append(null)
    return estimates, nulls


def invert_estimates(
    inversion: Inversion,
    round_index: int,
    estimates: list[Estimates],
    nulls: list[Estimates],
    *,
    max_vectors: int,
    generator: torch.Generator,
    log: Callable[[str], None] | None = None,
) -> Inverted:
    """Inverts up to ``max_vectors`` estimates, and for each one of its client's null estimates.

    Raises:
        PrivfedError: the attack estimated nothing.
    """
    picks = selected_vectors([torch.ones(e.vectors.shape[0]) for e in estimates], max_vectors, generator)
    if not picks:
        raise PrivfedError(f"round {round_index}: the attack estimated no vector to invert")
    vectors = torch.stack([estimates[r].vectors[j] for r, j in picks])
    pools = [n.vectors for n in nulls]
    chosen_nulls = torch.stack([
        pools[r][torch.randint(pools[r].shape[0], (1,), generator=generator)][0] if pools[r].shape[0]
        else torch.zeros_like(vectors[0])
        for r, _ in picks
    ])
    if log is not None:
        log(f"round {round_index}: inverting {len(picks)} cross-round estimates, then as many null estimates")
    return Inverted(picks, inversion(vectors), inversion(chosen_nulls))


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



def by_client_size(
    inverted: Inverted, truth: list[ReleaseTruth], memory_size: int, **scoring: Any
) -> dict[str, dict[str, Any]]:
    """:func:`score_round`'s summary for the vectors of clients with fewer images than ``memory_size`` (their
    memory holds every image, every round) and for the rest."""
    out = {}
    for name, keep in (("fewer_images_than_memory", True), ("at_least_memory_images", False)):
        mine = [i for i, (r, _) in enumerate(inverted.picks) if (truth[r].memory.images.shape[0] < memory_size) == keep]
        if mine:
            part = Inverted([inverted.picks[i] for i in mine], inverted.reconstructions[mine], inverted.nulls[mine])
            out[name] = score_round(part, truth, **scoring)[0]
    return out


def recovery_figures(
    recorded: RecordedRound, truth: list[ReleaseTruth], estimates: list[Estimates], nulls: list[Estimates]
) -> dict[str, Any]:
    """Matched cosine (:mod:`attacks.scoring.vector_recovery`) to each replayed memory of the cross-round
    estimates, of the round's own release (each vector repeated by its weight: what one round gives) and of the
    null estimates, with each client's figures (and its number of images); clients whose memory is not known are
    left out."""
    names = ("matched_cosine", "single_round_matched_cosine", "null_matched_cosine")
    clients: list[dict[str, float]] = []
    for release, known, estimate, null in zip(recorded.releases, truth, estimates, nulls):
        memory = known.memory.memory
        single = release.vectors[slot_vectors(release.weights)]
        if memory is None or not all(x.shape[0] for x in (memory, estimate.vectors, single, null.vectors)):
            continue
        values = (matched_cosine(v, memory) for v in (estimate.vectors, single, null.vectors))
        clients.append({"client": release.client, "images": known.memory.images.shape[0], **dict(zip(names, values))})
    if not clients:
        return {}
    out: dict[str, Any] = {"n_matched_cosine": len(clients)}
    for name in names:
        out[name], out[f"{name}_ci95"] = mean_interval([c[name] for c in clients])
    return {**out, "matched_cosine_per_client": clients}


def _private_image(truth: VectorTruth, client_images: torch.Tensor) -> torch.Tensor:
    """What the vector stands for: its source image, or its members' mean image (unknown members: a blank)."""
    images = to_float(client_images)
    if truth.members is None or truth.members.numel() == 0:
        return torch.zeros_like(images[0])
    return images[truth.members].mean(dim=0)


def fitted_client_models(
    attack: Attack,
    config: TrainConfig,
    recorded: RecordedRound,
    round_model: RoundModel,
    fit_images: torch.Tensor,
    *,
    progress: ProgressCallback | None,
    say: Callable[[str], None],
) -> list[RoundModel]:
    """Per release, the attack fitted to the model its client ended the round with.

    Raises:
        PrivfedError: the round kept no client's update (SecAgg+, round 0, or a recording from before updates).
    """
    if not recorded.updates or not any(r.client in recorded.updates for r in recorded.releases):
        raise PrivfedError(
            f"round {recorded.round} kept no client's update (trained under SecAgg+, round 0, or recorded before "
            "updates were kept): client models need a --no-secagg run recorded with --record-releases"
        )
    models = []
    for release in recorded.releases:
        state = client_state(recorded, release.client)
        if state is None:  # no update from this client: the model it started from is all the server knows
            models.append(round_model)
            continue
        say(f"round {recorded.round}: fitting on client {release.client}'s model after its local training")
        target = attack_target(config, recorded, round_model.target.device, state=state)
        models.append(RoundModel(target, attack.fit(target, fit_images, progress=progress)))
    return models


def replayed_truths(
    config: TrainConfig, recorded: RecordedRound, attacked: set[int], *, empty: torch.Tensor
) -> tuple[list[ReleaseTruth], dict[int, str]]:
    """Each release's truth (the attacked ones replayed, the rest empty) and how each replayed one's was found."""
    truth, statuses = [], {}
    for r, release in enumerate(recorded.releases):
        if r in attacked:
            memory, truths, statuses[release.client] = recorded_truth(config, recorded, release)
        else:
            memory, truths = ClientMemory(release.client, empty, None, None), []
        truth.append(ReleaseTruth(memory, truths))
    return truth, statuses


#: How membership is known for a secure sum's vectors.
SUMMED = "unknown: a secure sum mixes every summed client's rows"


def _attack_secure_sum(
    round_model: RoundModel,
    recorded: RecordedRound,
    config: TrainConfig,
    split: AuxiliarySplit,
    *,
    max_vectors: int,
    generator: torch.Generator,
    log: Callable[[str], None] | None,
) -> tuple[dict[str, Any], list[tuple[torch.Tensor, ...]], dict[str, str]]:
    """The decoded secure sum attacked as one release; scored against every summed client's images, and its null
    the sum of as many simulated clients holding memories of the held-out auxiliary images."""
    summed = recorded.secure_sum
    assert summed is not None  # the caller's check
    size = min(config.memory_size, split.null.shape[0])

    def null_pool(target: AttackTarget, count: int) -> torch.Tensor:
        memories = [split.null[torch.randperm(split.null.shape[0], generator=generator)[:size]] for _ in summed.clients]
        vectors, weights = summed_again(target, memories, generator=generator)
        pool = vectors[weights > 0] if bool((weights > 0).any()) else vectors
        return pool[torch.randint(pool.shape[0], (count,), generator=generator)]

    inverted = invert_round(
        [round_model], [(summed.vectors, summed.weights)], null_images=split.null, max_vectors=max_vectors,
        generator=generator, null_vectors_of=null_pool, log=log,
    )
    federated = FederatedSplit.of(config)
    images = torch.cat([federated.client_images(c) for c in summed.clients])
    memory = ClientMemory(-1, images, None, None)
    truths = [VectorTruth(-1, None) for _ in range(summed.vectors.shape[0])]
    summary, figure = score_round(inverted, [ReleaseTruth(memory, truths)], distractors=split.distractors, single_source=False)
    return summary, figure, {f"secure sum of clients {', '.join(map(str, summed.clients))}": SUMMED}


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
    client_models: bool = False,
    progress: ProgressCallback | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Attacks a recorded run's rounds; writes ``attack.json`` and ``attack.png`` into the run directory.

    ``client_models`` inverts each release with its client's model after local training (fitting the attack once
    per client), where the recording kept the client's update (``--no-secagg``). A cross-round attack also reports
    the single-round attack with the same fit (``single_round``); a secure sum (``ddp-sums``) is attacked as one
    release of the summed clients.

    Raises:
        PrivfedError: an unknown attack, a run recorded without ``--record-releases``,
            a round not recorded or without anything to attack, overlapping auxiliary data,
            ``client_models`` with a cross-round attack or on a round without recorded updates.
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
    if client_models and isinstance(attack, CrossRoundAttack):
        raise PrivfedError(f"{method} estimates in the round model's space: it cannot invert with client models")
    torch_device = resolve_device(device)
    say = log or (lambda _: None)
    say(f"attacking {run_dir} with {method}, round(s) {', '.join(map(str, chosen))}: loading the auxiliary data")
    aux_images, aux_name = load_auxiliary(config, aux)
    generator = torch.Generator().manual_seed(seed)
    split = split_auxiliary(aux_images, distractors, generator)
    single_source = get_mechanism_class(config.release_mechanism).releases_raw_data
    archive = RecordedRun(run.releases, config, torch_device)
    results, figure_rows, params = [], [], {}
    for round_index in chosen:
        start = time.perf_counter()
        recorded = read_round(run.releases, round_index)
        params = recorded.mechanism_params
        summed = recorded.secure_sum is not None and not recorded.releases
        if not summed and (not recorded.releases or all(r.vectors.shape[0] == 0 for r in recorded.releases)):
            raise PrivfedError(f"round {round_index} holds no released vectors")
        if summed and isinstance(attack, CrossRoundAttack):
            raise PrivfedError(f"{config.release_mechanism} releases nothing per client to read across rounds: "
                               "attack its secure sum with a single-round method")
        # The attacker's part: the round's public target, auxiliary images and the releases, nothing else.
        target = attack_target(config, recorded, torch_device)
        say(f"round {round_index}: fitting {method} on {split.fit.shape[0]} auxiliary images ({aux_name})")
        round_model = RoundModel(target, attack.fit(target, split.fit, progress=progress))
        fit_seconds = time.perf_counter() - start
        releases = [(r.vectors, r.weights) for r in recorded.releases]
        models = [round_model] * len(releases)
        if client_models:
            models = fitted_client_models(attack, config, recorded, round_model, split.fit, progress=progress, say=say)
        extra: dict[str, Any] = {}
        counted = releases
        if recorded.secure_sum is not None and summed:
            counted = [(recorded.secure_sum.vectors, recorded.secure_sum.weights)]
            summary, figure, statuses = _attack_secure_sum(
                round_model, recorded, config, split, max_vectors=max_vectors, generator=generator, log=log
            )
        else:
            single = invert_round(
                models, releases, null_images=split.null, max_vectors=max_vectors, generator=generator, log=log
            )
            estimated: tuple[Inverted, list[Estimates], list[Estimates]] | None = None
            if isinstance(attack, CrossRoundAttack):
                say(f"round {round_index}: estimating from each client's releases in the last {attack.window} rounds")
                estimates, nulls = estimate_across_rounds(
                    attack, archive, recorded, fit_images=split.fit, null_images=split.null, generator=generator
                )
                inverted = invert_estimates(
                    round_model.inversion, round_index, estimates, nulls,
                    max_vectors=max_vectors, generator=generator, log=log,
                )
                estimated = inverted, estimates, nulls
            # Only now the truth: each client whose vectors were attacked is replayed.
            say(f"round {round_index}: replaying the attacked clients for the ground truth")
            attacked = {r for r, _ in single.picks} | ({r for r, _ in estimated[0].picks} if estimated else set())
            truth, replayed = replayed_truths(config, recorded, attacked, empty=aux_images[:0])
            statuses = {str(client): status for client, status in sorted(replayed.items())}
            summary, figure = score_round(single, truth, distractors=split.distractors, single_source=single_source)
            summary["by_client_size"] = by_client_size(
                single, truth, config.memory_size, distractors=split.distractors, single_source=single_source
            )
            if estimated is not None:
                inverted, estimates, nulls = estimated
                read_from = [  # an estimate's truth is the members of the released vector it was read from
                    ReleaseTruth(t.memory, [t.truths[j] if j >= 0 else VectorTruth(t.memory.client, None)
                                            for j in e.source.tolist()] if t.truths else [])
                    for t, e in zip(truth, estimates)
                ]
                extra["single_round"] = summary
                summary, figure = score_round(inverted, read_from, distractors=split.distractors, single_source=single_source)
                summary["by_client_size"] = by_client_size(
                    inverted, read_from, config.memory_size, distractors=split.distractors, single_source=single_source
                )
                summary.update(recovery_figures(recorded, read_from, estimates, nulls))
        if any(s != VERIFIED for s in statuses.values()):
            say(f"round {round_index}: members unknown for {sum(s != VERIFIED for s in statuses.values())} "
                f"of {len(statuses)} clients ({', '.join(sorted(set(statuses.values())))}): member scores cover the rest")
        results.append({
            "round": round_index,
            "membership": statuses,
            **summary,
            **extra,
            "models": "each client's own after local training, where its update was recorded" if client_models
            else "the round's, as the server sent it",
            "vectors_released": sum(int(v.shape[0]) for v, _ in counted),
            "vectors_with_weight": sum(int((w > 0).sum()) for _, w in counted),
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
