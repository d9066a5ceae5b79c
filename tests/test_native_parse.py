"""native_parse.parse_module gives libcst's tree and errors, and leaves libcst validating the nodes built
anywhere else."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from xla_migrate.engine import pipeline as engine
from xla_migrate.syntax import native_parse

ROOT = Path(__file__).resolve().parent.parent


def _fixture_sources() -> list[bytes]:
    return [path.read_bytes() for path in sorted((ROOT / "fixtures").rglob("*.py"))]


def test_every_fixture_parses_to_libcsts_tree():
    compared = 0
    for data in _fixture_sources():
        try:
            expected = cst.parse_module(data)
        except cst.ParserSyntaxError:
            with pytest.raises(cst.ParserSyntaxError):
                native_parse.parse_module(data)
            continue
        parsed = native_parse.parse_module(data)
        assert parsed.deep_equals(expected) and parsed.bytes == data and parsed.encoding == expected.encoding
        compared += 1
    assert compared > 400


def test_nodes_built_after_a_parse_are_validated():
    native_parse.parse_module("x = (1)\n")
    with pytest.raises(cst.CSTValidationError):
        cst.Name("")
    with pytest.raises(cst.CSTValidationError):
        cst.Name("x", lpar=[cst.LeftParen()])  # parentheses that do not balance


def test_a_failed_parse_gives_libcsts_error_and_leaves_validation_on():
    with pytest.raises(cst.ParserSyntaxError) as ours:
        native_parse.parse_module("def f(:\n")
    with pytest.raises(cst.ParserSyntaxError) as libcsts:
        cst.parse_module("def f(:\n")
    assert str(ours.value) == str(libcsts.value)
    with pytest.raises(cst.CSTValidationError):
        cst.Name("")


def test_the_engine_parses_without_validating_each_node(monkeypatch):
    """What the engine's parse saves: no node's ``_validate`` runs (libcst's parse runs one per node)."""
    validated = []
    original = cst.Name._validate
    monkeypatch.setattr(cst.Name, "_validate", lambda self: validated.append(self) or original(self))
    cst.parse_module("x = y + z\n")
    assert len(validated) == 3
    validated.clear()
    module = engine.parse("x = y + z\n")
    assert isinstance(module, cst.Module) and validated == []
