"""Every mode's statement the config allows: a headline of at most 300 characters, and items docs/privacy.md quotes.

A mode is a method (one that releases nothing, or a releasing one with every
registered mechanism), SecAgg+ on or off, DP-SGD on or off, the secret
sample on or off and --report-client-metrics on or off; a combination that
:func:`privfed.config.build_config` or the budget refuses is no mode.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from mechanisms import SecureSumMechanism, available_mechanisms, get_mechanism_class
from privfed.config import TrainConfig, build_config
from privfed.errors import PrivfedError
from privfed.methods import available_methods
from privfed.privacy.budget import plan_request
from privfed.privacy.ledger import WorstCase
from privfed.privacy.statement import EVERY_MODE_ANCHOR, HEADLINE_LIMIT, PrivacyStatement, privacy_statement

DOCS = (Path(__file__).resolve().parents[2] / "docs" / "privacy.md").read_text()
SIZES = [75] * 4  # shapes:300 over 4 clients

#: The longest numbers a headline quotes: epsilon and delta as formatted (.3g, .2g), k and the SecAgg+ threshold.
LONG_NUMBERS = WorstCase(client=3, epsilon=0.000123, delta=1.5e-05, releases_worst=0.000123, dp_sgd_worst=0.000123)


def allowed_configs() -> list[TrainConfig]:
    """Every combination the config allows (one mechanism per releasing method's mode; None releases nothing)."""
    configs = []
    for method, spec in available_methods().items():
        mechanisms = list(available_mechanisms()) if spec.releases else ["kanon"]  # mechanism does not apply
        for mechanism, secagg, dp_sgd, sample in itertools.product(mechanisms, (True, False), (False, True), (None, False)):
            try:
                config = build_config(
                    method=method, mechanism=mechanism, secagg=secagg, dp_sgd=dp_sgd, secret_sample=sample,
                    dataset="shapes:300", num_clients=4, participation=1.0, num_local_centroids=4,
                    num_global_centroids=8, memory_size=32,
                )
            except PrivfedError:
                continue
            if summed(mechanism) and plan_request(config, SIZES, delta=1e-6, releases=1).secure_sum is None:
                continue  # a secure-sum mechanism's plan refuses a run without SecAgg+
            configs.append(config)
    return configs


def summed(mechanism: str | None) -> bool:
    return mechanism is not None and issubclass(get_mechanism_class(mechanism), SecureSumMechanism)


def sampling_rate(config: TrainConfig) -> float:
    """The releases' secret-sample rate, as the mechanism's own plan computes it (1: none)."""
    if config.release_mechanism is None:
        return 1.0
    cls = get_mechanism_class(config.release_mechanism)
    options = cls.calibration_options(plan_request(config, SIZES, delta=1e-6, releases=1), cls.checked_settings(config.mechanism_settings))
    return options.get("sampling_rate", 1.0)


def statement_of(config: TrainConfig, *, report_metrics: bool, k: int = 12345, min_shares: int = 1234) -> PrivacyStatement:
    """The statement of a run of ``config`` with the longest numbers a headline can carry."""
    name = config.release_mechanism
    cls = None if name is None else get_mechanism_class(name)
    is_dp = config.dp_sgd or (cls is not None and cls.is_differentially_private())
    return privacy_statement(
        mechanism=cls, dp_sgd=config.dp_sgd, worst=LONG_NUMBERS if is_dp else None, k=k, secagg=config.secagg,
        method=available_methods()[config.method], report_metrics=report_metrics,
        release_sampling_rate=sampling_rate(config),
        min_shares=min_shares if summed(name) else None,
    )


CONFIGS = allowed_configs()
MODES = [(config, report) for config in CONFIGS for report in (False, True)]


def mode_id(mode: tuple[TrainConfig, bool]) -> str:
    config, report = mode
    return "-".join([config.method, str(config.release_mechanism), "secagg" * config.secagg or "clear",
                     "dpsgd" * config.dp_sgd or "nodpsgd", "sample" * (config.secret_sample is not False) or "nosample",
                     "metrics" * report or "nometrics"])


def test_the_modes_include_every_registered_mechanism_with_and_without_secagg_and_dp_sgd():
    seen = {(c.release_mechanism, c.secagg, c.dp_sgd) for c in CONFIGS}
    for mechanism in available_mechanisms():
        assert (mechanism, True, False) in seen and (mechanism, True, True) in seen
        assert ((mechanism, False, False) in seen) != summed(mechanism)
    assert {(None, True, True), (None, False, False)} <= seen


@pytest.mark.parametrize("mode", MODES, ids=[mode_id(m) for m in MODES])
def test_every_headline_is_short_and_every_item_stands_in_its_section_of_docs_privacy_md(mode):
    config, report_metrics = mode
    s = statement_of(config, report_metrics=report_metrics)
    assert len(s.headline) <= HEADLINE_LIMIT, s.headline
    assert s.not_covered and s.not_covered[-1].startswith("a server that deviates from the run's plan")
    path, anchor = s.details.split("#")
    assert path == "docs/privacy.md"
    sections = [section(anchor), section(EVERY_MODE_ANCHOR)]
    for item in s.covers + s.not_covered:
        assert len(item) <= 200, item  # short: one clause
        assert any(normalised(item) in text for text in sections), f"{item!r} is not in #{anchor} of docs/privacy.md"


@pytest.mark.parametrize("mode", MODES, ids=[mode_id(m) for m in MODES])
def test_the_headline_claims_dp_only_where_the_covers_do_and_names_the_neighbouring_relation(mode):
    """The headline never claims more than the lists: a DP headline has a DP item in covers, with its unit."""
    config, report_metrics = mode
    s = statement_of(config, report_metrics=report_metrics)
    claims_dp = "-DP w.r.t. replacing one" in s.headline
    assert claims_dp == bool(s.covers)
    for item in s.covers:
        if "in the epsilon" in item:
            assert "replaced by another (replace-one)" in item
    if not claims_dp:
        assert s.headline.startswith(("No DP", "No guarantee"))
    if summed(config.release_mechanism):
        assert "honest-but-curious" in s.headline and any("none colluding" in c for c in s.covers)


def test_every_statement_anchor_of_the_docs_is_one_a_statement_links_and_every_link_resolves():
    linked = {statement_of(config, report_metrics=False).details.split("#")[1] for config in CONFIGS}
    anchors = set(re.findall(r'<a id="(statement-[a-z-]+)"></a>', DOCS))
    assert linked | {EVERY_MODE_ANCHOR} <= anchors
    assert anchors - linked - {EVERY_MODE_ANCHOR} <= {"statement-no-guarantee"}  # a plug-in's: no built-in has it
    headings = {slug(h) for h in re.findall(r"^#+ (.+)$", DOCS, flags=re.MULTILINE)}
    for target in re.findall(r"\]\(#([^)]+)\)", DOCS):
        assert target in headings | anchors, f"docs/privacy.md links #{target}, which is no heading or anchor"


def section(anchor: str) -> str:
    """The text from ``<a id="anchor">`` to the next statement anchor (or the next ``## `` heading)."""
    start = DOCS.index(f'<a id="{anchor}"></a>')
    ends = [i for i in (DOCS.find('<a id="statement-', start + 1), DOCS.find("\n## ", start)) if i > 0]
    return normalised(DOCS[start:min(ends)])


def normalised(text: str) -> str:
    return " ".join(text.split())


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
