"""patterns.string_value reads a literal's value off its text where it can: always libcst's evaluated value."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from xla_migrate.engine import pipeline as engine
from xla_migrate.syntax import patterns

ROOT = Path(__file__).resolve().parent.parent
LITERALS = ["''", '""""""', "u'a'", "R'a\\\\b'", "r'a\\nb'", "'a\\nb'", "rb'a'", "BR'a'", "b''", "'''a\"b'''",
            '"""a\r\nb"""', '"""a\rb"""', "'\\N{BULLET}'", "'é 😀'", 'U"q"', "'a\\\nb'", "'\\x41'"]


def _evaluated(node: cst.SimpleString) -> str | None:
    value = node.evaluated_value
    return value if isinstance(value, str) else None


class _Strings(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[cst.SimpleString] = []

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        self.found.append(node)


@pytest.mark.parametrize("literal", LITERALS)
def test_a_literal_has_libcsts_evaluated_value(literal):
    node = cst.parse_expression(literal)
    assert patterns.string_value(node) == _evaluated(node)


def test_every_string_of_every_fixture_has_libcsts_evaluated_value():
    strings = _Strings()
    for path in sorted((ROOT / "fixtures").rglob("*.py")):
        text = engine.check_input(path.read_bytes())
        if isinstance(text, str):
            try:
                cst.parse_module(text).visit(strings)
            except cst.ParserSyntaxError:
                continue
    assert len(strings.found) > 1000
    assert [n.value for n in strings.found if patterns.string_value(n) != _evaluated(n)] == []


def test_parsed_expression_parses_each_text_once():
    first = patterns.parsed_expression("xm.xla_device()")
    assert patterns.parsed_expression("xm.xla_device()") is first  # shared by every edit that puts it in
    assert patterns.code_of(first) == "xm.xla_device()" and isinstance(first, cst.Call)
    assert patterns.parsed_expression("device") is not first


def test_parsed_statement_parses_each_text_once_and_reads_no_module_config():
    first = patterns.parsed_statement("xm.mark_step()")
    assert patterns.parsed_statement("xm.mark_step()") is first
    assert isinstance(first, cst.SimpleStatementLine)
    # Why no config is passed: libcst parses a statement the same whatever the module's layout.
    compound = "for a, b in zip(x, y):\n    a.copy_(b)\n"
    for layout in ("x = 1\n", "if a:\n\tx = 1\r\n", "# -*- coding: latin-1 -*-\nx = 1", "if a:\n  b\n"):
        config = cst.parse_module(layout).config_for_parsing
        for code in ("xm.mark_step()", compound):
            assert cst.parse_statement(code, config=config).deep_equals(patterns.parsed_statement(code))
