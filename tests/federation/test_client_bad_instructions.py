"""A client handed malformed or hostile fit instructions fails the round at once: an error reply, never a hang."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

import numpy as np
import pytest
from flwr.common import FitIns, ndarray_to_bytes, ndarrays_to_parameters, parameters_to_ndarrays

from privfed.orchestra.model_state import shared_keys
from tests.federation.honest_round import declared_client, honest_round, small_round_config

CONFIG = small_round_config(secagg=True)


@pytest.fixture(scope="module")
def instructions(tmp_path_factory) -> FitIns:
    round_ = honest_round(CONFIG, tmp_path_factory.mktemp("ins") / "run")
    server = round_.strategy.server
    state = ndarrays_to_parameters([server.global_state()[k].numpy() for k in shared_keys(server.network)])
    return round_.strategy.fit_instructions(round_.server_round, state)


def with_config(ins: FitIns, **changes) -> FitIns:
    config = {**ins.config, **changes}
    return FitIns(ins.parameters, {k: v for k, v in config.items() if v is not None})


def with_arrays(ins: FitIns, arrays: list[np.ndarray]) -> FitIns:
    return FitIns(ndarrays_to_parameters(arrays), dict(ins.config))


def nan_centroids(ins: FitIns) -> FitIns:
    return with_config(ins, centroids=ndarray_to_bytes(np.full((8, 16), np.nan, np.float32)))


#: Far beyond the tiny round's second or so: past this, the client is taken to hang.
HANG_SECONDS = 120

BAD_INSTRUCTIONS: list[tuple[str, Callable[[FitIns], FitIns]]] = [
    ("truncated state bytes", lambda ins: FitIns(
        dataclasses.replace(ins.parameters, tensors=[t[:-3] for t in ins.parameters.tensors]), dict(ins.config))),
    ("a state array missing", lambda ins: with_arrays(ins, parameters_to_ndarrays(ins.parameters)[:-1])),
    ("a state of NaN", lambda ins: with_arrays(ins, [np.full_like(a, np.nan) for a in parameters_to_ndarrays(ins.parameters)])),
    ("state arrays of another shape", lambda ins: with_arrays(ins, [a[:1] for a in parameters_to_ndarrays(ins.parameters)])),
    ("NaN centroids", nan_centroids),
    ("centroids of another width", lambda ins: with_config(ins, centroids=ndarray_to_bytes(np.ones((8, 5), np.float32)))),
    ("truncated centroids", lambda ins: with_config(ins, centroids=ins.config["centroids"][:-4])),
    ("round as text", lambda ins: with_config(ins, round="first")),
    ("round missing", lambda ins: with_config(ins, round=None)),
    ("scales as text", lambda ins: with_config(ins, secagg_scales="big")),
    ("mechanism_params garbage", lambda ins: with_config(ins, mechanism_params="[")),  # refused: not a round's value
]


def test_the_untouched_instructions_are_answered(instructions):
    res = declared_client(CONFIG, 0).fit(instructions)
    assert res.num_examples > 0 and "release_vectors" in res.metrics


@pytest.mark.parametrize(("case", "spoil"), BAD_INSTRUCTIONS, ids=[c for c, _ in BAD_INSTRUCTIONS])
def test_bad_instructions_fail_the_round_instead_of_hanging(instructions, case, spoil):
    outcome: list[BaseException | object] = []

    def answer() -> None:
        try:
            outcome.append(declared_client(CONFIG, 0).fit(spoil(instructions)))
        except Exception as err:  # Flower turns any exception into an error reply to the server
            outcome.append(err)

    worker = threading.Thread(target=answer, daemon=True)
    worker.start()
    worker.join(timeout=HANG_SECONDS)
    assert not worker.is_alive(), f"the client still works on {case!r} after {HANG_SECONDS}s"
    assert isinstance(outcome[0], Exception), f"the client answered {case!r}"
