"""The rule contract: unique codes and names, required metadata and doc sections, fixtures for every
target, and generated docs pages that match what the generator writes now."""

from __future__ import annotations

import re

import gen_docs
import pytest
from goldens import FIXTURES

from xla_migrate.engine.registry import all_rules
from xla_migrate.engine.targets import TARGETS

RULES = all_rules()


def test_there_are_rules_and_codes_and_names_are_unique():
    assert RULES
    codes = [r.code for r in RULES]
    names = [r.name for r in RULES]
    assert len(set(codes)) == len(codes), codes
    assert len(set(names)) == len(names), names


@pytest.mark.parametrize("rule", RULES, ids=[r.code for r in RULES])
def test_rule_metadata(rule):
    assert re.fullmatch(r"XLA[1-9]\d\d", rule.code)
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)+", rule.name)
    assert rule.summary and "\n" not in rule.summary
    assert rule.fix_safety in ("safe", "review")
    assert rule.targets and set(rule.targets) <= set(TARGETS)
    import sys

    doc = sys.modules[rule.__module__].__doc__ or ""
    assert doc.startswith(f"{rule.code} {rule.name}:"), "module docstring starts with 'CODE name: summary'"
    for section in ("What it does:", "Why:", "Example:"):
        assert f"\n{section}\n" in doc, f"docstring lacks the {section!r} section"


@pytest.mark.parametrize("rule", RULES, ids=[r.code for r in RULES])
def test_rule_has_golden_fixtures_for_each_target(rule):
    folder = FIXTURES / rule.code
    inputs = sorted(folder.glob("*.in.py"))
    assert inputs, f"no fixtures under fixtures/{rule.code}/"
    for source in inputs:
        for target in rule.targets:
            expected = source.with_name(source.name.replace(".in.py", f".out-{target}.py"))
            assert expected.exists(), f"{expected.name} missing"
        if rule.code.startswith("XLA4"):
            # Distributed cases also have the data-parallel form auto did not choose (tests/goldens.py collects
            # it and test_goldens checks it exists): one such file per target at most, never both forms.
            for target in rule.targets:
                others = [source.with_name(source.name.replace(".in.py", f".out-{target}-{form}.py"))
                          for form in ("ddp", "xm")]
                assert sum(p.exists() for p in others) <= 1, f"{source.name}: both {others}"


def test_docs_pages_are_generated_and_current():
    for path, text in gen_docs.pages().items():
        assert path.exists(), f"{path.name} missing: run python tools/gen_docs.py"
        assert path.read_text() == text, f"{path.name} is stale: run python tools/gen_docs.py"
    pages = {p.name for p in gen_docs.DOCS.glob("*.md")}
    assert pages == {p.name for p in gen_docs.pages()}, "stale pages in docs/rules"
