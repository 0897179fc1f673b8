"""Ground truth and scores, out of the attacker's reach: only :mod:`attacks.evaluation` (and tests) import them."""
