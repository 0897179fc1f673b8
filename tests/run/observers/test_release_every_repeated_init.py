"""Review of ``--release-every``: an initialisation repeated at a round the cadence skips.

The strategy sends ``task: init`` until some reply of round 0 is applied (``fit_instructions``), so a run whose
rounds 0 and 1 have no usable reply sends ``init`` at round 2. Every client's guard counts an ``init`` as round 0
(``ClientBudget.releases_in``) and so releases and charges itself; the server's ledger must count it the same way
(``ChargeReleases.charge`` reads the report's ``train``), though at ``--release-every 2`` round 2 trains without a
release.
"""

from __future__ import annotations

import json

from mechanisms import get_mechanism_class, round_releases
from privfed.orchestra.round_report import Rejection, RoundReport
from privfed.privacy.client_guard import declared_budget
from privfed.run.observers.ledger_charge import ChargeReleases
from privfed.run.plan import plan_run
from tests.run.observers.small_run import finished, ledger_of, mechanism_of


def test_a_client_counts_an_init_at_a_skipped_round_as_round_0(tiny_config, tmp_path):
    config = tiny_config.replace(mechanism="ldp-sums", epsilon=4.0, rounds=4, release_every=2, out=str(tmp_path / "run"))
    plan = plan_run(config)
    client = declared_budget(config, plan.client_sizes[1])
    assert client.releases_in(round_index=2, train=False)  # the client releases and charges itself
    assert not round_releases(get_mechanism_class("ldp-sums"), round_index=2, release_every=2)  # the server's test


def test_a_rejected_reply_to_an_init_at_a_skipped_round_is_charged_on_the_servers_ledger(tiny_config, tmp_path):
    config = tiny_config.replace(mechanism="ldp-sums", epsilon=4.0, rounds=4, release_every=2, out=str(tmp_path / "run"))
    plan = plan_run(config)
    charge = ChargeReleases(ledger_of(plan), plan, mechanism_of(plan), killed_round=None)
    report = RoundReport(round=2, completed=0, failures=1, seconds=0.1, server_stats={}, sampled_clients=(1,),
                         rejected=[Rejection(1, "bad")], train=False)
    charge.after_round(finished(report))
    path = plan.run_dir.path / "ledger.jsonl"
    charged = [json.loads(line)["client"] for line in path.read_text().splitlines()] if path.exists() else []
    assert charged == [1]  # client 1 charged itself this release (above), and so does the server's ledger
