"""Ground truth and scores: what the attacker is measured against, out of its reach.

Only :mod:`attacks.evaluation` (and tests) import this package; nothing
under :mod:`attacks.attackers` may (``tests/attacks/test_layering.py``).
"""
