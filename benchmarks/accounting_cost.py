"""Wall time of privacy accounting and noise sampling that a run pays up front or per round.

These were once timed inside tests, which then failed on a loaded machine;
the tests keep the functional checks and the timing lives here. Each line
gives the median and range of ``--repeats`` calls and the time the call is
expected to stay under on an idle core (the bound the tests used to assert),
each call with the accounting's memoised results emptied first:

- ``calibrate DP-SGD``: :func:`privfed.privacy.dp_sgd_plan.plan_dp_sgd` for
  seven client sizes over 12 rounds of 2 epochs (the noise search);
- ``PLD, 5000 DP-SGD steps``: a 1e-3-grid PLD of 5000 Poisson-sampled Gaussian
  steps, the grid a ledger of DP-SGD steps composes on;
- ``ledger spent, 5000 steps``: :meth:`privfed.privacy.ledger.PrivacyLedger.spent`
  over 20 rounds of 250 DP-SGD steps;
- ``10^4 noise samples``: :func:`mechanisms.noise.discrete_laplace` and
  :func:`~mechanisms.noise.discrete_gaussian` from the secure source.

    python benchmarks/accounting_cost.py --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation

from mechanisms import accounting
from mechanisms.base import Guarantee, PrivacyEvent
from mechanisms.noise import discrete_gaussian, discrete_laplace
from privfed.privacy import dp_sgd_plan
from privfed.privacy import ledger as ledger_module
from privfed.privacy.dp_sgd_plan import plan_dp_sgd
from privfed.privacy.ledger import LedgerEntry, PrivacyLedger


def calibrate() -> None:
    plan_dp_sgd(client_sizes=[7, 33, 40, 120, 250, 250, 1233], delta=1e-4, max_grad_norm=1.0, batch_size=32, epochs=2,
                rounds=12, target_epsilon=3.0)


def pld_steps() -> None:
    acc = pld_privacy_accountant.PLDAccountant(NeighboringRelation.REPLACE_ONE, value_discretization_interval=1e-3)
    acc.compose(dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(0.8)), 5000)
    acc.get_epsilon(1e-5)


def ledger_spent(folder: Path) -> Callable[[], object]:
    ledger = PrivacyLedger(mechanism="kanon", delta=1e-5, path=folder / "ledger.jsonl")
    step = PrivacyEvent("poisson_gaussian", {"sampling_rate": 0.02, "noise_multiplier": 0.9, "count": 250.0})
    ledger.record(LedgerEntry(0, 0, "kanon", Guarantee(kind="k-anonymity", statement="", k=8), ()))
    for round_index in range(1, 21):
        ledger.record(LedgerEntry.dp_sgd(0, round_index, (step,)))

    def spent() -> float:
        ledger._epsilon_cache.clear()  # the ledger's own memo of what each client spent
        return ledger.spent(0)

    return spent


def noise_samples() -> None:
    discrete_laplace(10_000, parameter=0.1)
    discrete_gaussian(10_000, sigma=1000.0)


def cold_caches() -> None:
    """Empties the accounting's memoised results, so each call computes as a run's first one does."""
    for module in (accounting, dp_sgd_plan, ledger_module):
        for value in vars(module).values():
            if callable(getattr(value, "cache_clear", None)):
                value.cache_clear()


def timed(call: Callable[[], object]) -> float:
    cold_caches()
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        calls: dict[str, tuple[Callable[[], object], float]] = {
            "calibrate DP-SGD": (calibrate, 5.0),
            "PLD, 5000 DP-SGD steps": (pld_steps, 2.0),
            "ledger spent, 5000 steps": (ledger_spent(Path(folder)), 2.0),
            "10^4 noise samples": (noise_samples, 0.5),
        }
        print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; seconds, median [min-max] of {args.repeats}")
        print(f"{'':>26} {'wall s':>20} {'expected under':>15}")
        for name, (call, bound) in calls.items():
            walls = [timed(call) for _ in range(args.repeats)]
            spread = f"{statistics.median(walls):.3f} [{min(walls):.3f}-{max(walls):.3f}]"
            over = "  over" if statistics.median(walls) > bound else ""
            print(f"{name:>26} {spread:>20} {bound:>15.1f}{over}")


if __name__ == "__main__":
    main()
