"""Same seeded noise, same output: a digest of every built-in mechanism's output on fixed data.

The end-to-end runs of ``same_seed_metrics.py`` do not repeat for ``ldp-sums``
and ``ddp-sums`` (not even twice on one checkout), so for them this script
passes each mechanism a seeded ``noise_source`` and prints digests of its
calibration, its release (with members) or its shares and their combined
centroids. Compare two checkouts:

    PYTHONPATH=<before> python benchmarks/mechanism_outputs.py > before.json
    PYTHONPATH=<after> python benchmarks/mechanism_outputs.py | cmp - before.json
"""

from __future__ import annotations

import hashlib
import json
import random

import numpy as np
import torch
import torch.nn.functional as F

from mechanisms import create_mechanism
from mechanisms.ddp_sums import DdpSumsMechanism
from mechanisms.ldp_sums import LdpSumsMechanism

MODULUS = 2**32


def digest(*arrays: object) -> str:
    hashed = hashlib.sha256()
    for array in arrays:
        hashed.update(np.ascontiguousarray(np.asarray(array, dtype=np.float64)).tobytes())
    return hashed.hexdigest()[:16]


def outputs() -> dict[str, object]:
    generator = torch.Generator().manual_seed(0)
    reps = F.normalize(torch.randn(120, 16, generator=generator), dim=1)
    centres = F.normalize(torch.randn(8, 16, generator=generator), dim=1)
    found: dict[str, object] = {}
    for rate in (1.0, 0.4):
        params = LdpSumsMechanism.calibrate(epsilon=5.0, delta=1e-6, num_releases=3, sampling_rate=rate)
        sums = LdpSumsMechanism(**params, noise_source=random.Random(1))
        sums.observe_global_centroids(centres)
        release, members = sums.release_with_members(reps, num_centroids=4, generator=torch.Generator().manual_seed(2))
        found[f"ldp-sums q={rate}"] = [params, digest(release.vectors, release.weights, members)]
        shared = DdpSumsMechanism(**params, min_shares=3, modulus=MODULUS, noise_source=random.Random(3))
        shared.observe_global_centroids(centres)
        shares = [shared.share(reps[i::3], num_centroids=4, generator=torch.Generator().manual_seed(i)) for i in range(3)]
        combined = shared.combine(np.mod(sum(shares), MODULUS), centroids=centres, num_summed=3)
        found[f"ddp-sums q={rate}"] = [digest(*shares), digest(combined)]
    for name, params in (("ldp", {"epsilon": 2.0, "noise_source": random.Random(4)}), ("kanon", {"min_k": 5}), ("reps", {})):
        release = create_mechanism(name, **params).release(reps, num_centroids=4, generator=torch.Generator().manual_seed(5))
        found[name] = digest(release.vectors, release.weights)
    return found


if __name__ == "__main__":
    print(json.dumps(outputs(), sort_keys=True, default=str))
