"""The stop cause is read from summary.json's ``stop`` field; summaries written before it by their message's words."""

from __future__ import annotations

import pytest

from privfed.cli import FAILED_RUN_EXIT_CODE, INTERRUPTED_EXIT_CODE, train_exit_code
from privfed.run.stop import (
    BUDGET,
    INTERRUPTED,
    NO_UPDATES,
    RUNTIME_ENDED,
    UNKNOWN,
    UNUSABLE_ROUND,
    Stop,
    run_failed,
    stop_cause,
)

#: What the previous version wrote in ``stopped_early``, and no ``stop`` beside it.
OLD_MESSAGES = {
    "interrupted by SIGINT; stopped after round 2": INTERRUPTED,
    "privacy budget: another release would bring a client to epsilon 2.100 > 2.0 (delta 1e-06); stopped after round 1":
        BUDGET,
    "round 1: no usable reply (0 failed, 2 rejected: client 0: bad); the model is unchanged and the run stops":
        UNUSABLE_ROUND,
    "the runtime ended after round 2 of 5": RUNTIME_ENDED,
    "a stop this version has no words for": UNKNOWN,
}


@pytest.mark.parametrize(("message", "cause"), OLD_MESSAGES.items())
def test_an_old_summary_has_its_cause_read_from_its_message(message, cause):
    assert stop_cause({"stopped_early": message}) == cause


def test_the_field_decides_whatever_the_message_says():
    summary = {"stopped_early": "interrupted, as it happens", "stop": Stop(NO_UPDATES, 3, "interrupted, as it happens").to_dict()}
    assert stop_cause(summary) == NO_UPDATES and run_failed(summary)
    assert train_exit_code(summary) == FAILED_RUN_EXIT_CODE  # the text alone said "interrupted": 130 before
    assert stop_cause({"stopped_early": None, "stop": None}) is None and train_exit_code({"stop": None}) == 0


def test_the_exit_code_of_an_old_summary_is_the_one_it_had():
    assert train_exit_code({"stopped_early": "interrupted by SIGTERM; stopped after round 1"}) == INTERRUPTED_EXIT_CODE
    assert train_exit_code({"stopped_early": "round 0: no usable reply from its 2 sampled clients"}) == FAILED_RUN_EXIT_CODE
    assert train_exit_code({"stopped_early": None}) == 0
