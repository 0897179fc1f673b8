"""A training run around its rounds: the plan, the server-side driver, resuming, recording and the run directory."""
