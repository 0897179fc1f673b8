"""Comparing what two runs recorded: numbers approximately, everything else exactly."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def same(a: Any, b: Any, *, rel: float = 1e-5, abs: float = 1e-6) -> bool:  # math.isclose's names
    """Equal up to float rounding; strings, None and bools must match exactly, and so must nesting."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=rel, abs_tol=abs) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], rel=rel, abs=abs) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y, rel=rel, abs=abs) for x, y in zip(a, b))
    return type(a) is type(b) and a == b
