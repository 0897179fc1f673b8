"""Why a run ended before its last round: ``summary.json``'s ``stop`` (:class:`Stop`, null when every round ran),
for programs, beside ``stopped_early``, its message. Readers decide on :func:`stop_cause` alone.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

#: Ctrl-C or SIGTERM stopped the run after a round; ``--resume`` continues it.
INTERRUPTED = "interrupted"
#: Another release could take a client past its privacy budget; the run cannot go on.
BUDGET = "budget"
#: A round brought no usable reply (every sampled client failed or was rejected).
UNUSABLE_ROUND = "unusable-round"
#: :data:`NO_UPDATE_LIMIT` training rounds in a row applied no model update (every one dropped).
NO_UPDATES = "no-updates"
#: The FL runtime ended before the last round without anyone deciding to stop.
RUNTIME_ENDED = "runtime-ended"
#: A stop the summary names in words this version does not know (a summary from another version).
UNKNOWN = "unknown"

#: Causes of a run that failed: it trained nothing usable, and ``privfed train`` exits non-zero.
FAILED_CAUSES = frozenset({UNUSABLE_ROUND, NO_UPDATES})

#: Training rounds in a row without an applied model update after which a run stops: one dropped round is
#: ordinary (a SecAgg+ overflow grows the scales and the next round fits), three in a row are not.
NO_UPDATE_LIMIT = 3

#: How a budget stop's message begins (and how summaries before the ``stop`` field say it).
BUDGET_STOP = "privacy budget"
#: How the messages of older summaries begin, by cause: the only place the text is read.
_LEGACY_MESSAGES = (
    (INTERRUPTED, re.compile(r"interrupted")),
    (BUDGET, re.compile(re.escape(BUDGET_STOP))),
    (UNUSABLE_ROUND, re.compile(r"round \d+: no usable reply")),
    (RUNTIME_ENDED, re.compile(r"the runtime ended")),
)


@dataclass(frozen=True)
class Stop:
    """Why a run ended early: one of this module's causes, the last round that ran, and the message for people."""

    cause: str
    round: int
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def stop_cause(summary: dict[str, Any]) -> str | None:
    """The cause of a summary's stop (None when every round ran), from ``stop`` or, in an older summary, its message."""
    stop = summary.get("stop")
    if isinstance(stop, dict) and isinstance(stop.get("cause"), str):
        return stop["cause"]
    message = summary.get("stopped_early")
    if not isinstance(message, str) or not message:
        return None
    return next((cause for cause, opening in _LEGACY_MESSAGES if opening.match(message)), UNKNOWN)


def run_failed(summary: dict[str, Any]) -> bool:
    """Whether the run stopped because it could not train (:data:`FAILED_CAUSES`)."""
    return stop_cause(summary) in FAILED_CAUSES
