"""large_files.py: a large file parsed in pieces gives the tree the whole text parses to, node for node,
and the gate checks a large output a piece at a time with the whole file's verdicts."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from test_positions import LAYOUTS, SYNTAX
from xla_migrate.engine import pipeline as engine, gate
from xla_migrate.syntax import large_files, nesting
from xla_migrate import migrate
from xla_migrate.engine.gate import OutputGate
from xla_migrate.syntax.positions import render_in_pieces

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = sorted((ROOT / "fixtures").rglob("*.py"))

# Layouts that cutting gets wrong unless it takes care (large_files.py says how).
CUT_LAYOUTS = {
    "indentation changes between functions": "def f():\n  return 1\n\ndef g():\n    return 2\n\ndef h():\n\treturn 3\n",
    "first block indented later": "import os\nx = 1\n\nclass C:\n   y = 2\n",
    "crlf": "import os\r\n\r\ndef f():\r\n    return 1\r\n\r\nx = 2\r\n",
    "lf first, crlf later": "import os\n\ndef f():\r\n    return 1\r\n\r\nx = 2\r\n",
    "blank line and comment after a block": "def f():\n    x = 1\n\n# about g\n\ndef g():\n    pass\n",
    "indented comment after a block": "def f():\n    x = 1\n\n    # about f\nx = 2\n\n# about g\n\ndef g():\n    pass\n",
    "comments and blank lines between": "x = 1\n\n# one\n\n\n# two\ny = 2\n",
    "decorators": "@a\n@b(1)\ndef f():\n    pass\n@c\nclass C:\n    pass\n",
    "top-level clauses": "if a:\n    x = 1\nelif b:\n    x = 2\nelse:\n    x = 3\ntry:\n    y\nexcept E:\n    pass\n"
                         "else:\n    z\nfinally:\n    w\nfor i in r:\n    pass\nelse:\n    q\n",
    "no final newline": "x = 1\ny = 2",
    "no final newline, crlf": "x = 1\r\ny = 2",
    "form feeds": "x = 1\n\f\ny = 2\n\fz = 3\n",
    "backslash continuations": "x = 1 + \\\n    2\ny = \\\n    3\n",
    "semicolons": "a = 1; b = 2\nc = 3; d = 4\n",
    "strings that look like code": 'x = """\n\n# not a comment\n    \ndef not_a_def():\n"""\ny = 1\n',
}


def _whole_and_pieces(text: str, piece_chars: int = 1) -> tuple[cst.Module, cst.Module | None]:
    deep, top_level = nesting.scan(text)
    assert deep is None and top_level is not None
    return cst.parse_module(text), large_files.parse_in_pieces(text, top_level, "utf-8", piece_chars)


def _assert_same_tree(text: str) -> bool:
    """The pieces' module equals the whole text's (and prints the same code); False when it was not cut."""
    whole, pieces = _whole_and_pieces(text)
    if pieces is None:
        return False
    assert pieces.deep_equals(whole)
    assert (pieces.default_indent, pieces.default_newline, pieces.has_trailing_newline, pieces.encoding) == \
        (whole.default_indent, whole.default_newline, whole.has_trailing_newline, whole.encoding)
    assert pieces.code == whole.code
    return True


def _fixture_texts() -> list[str]:
    """The fixtures' texts, decoded as Python would; the ones libcst cannot parse left out."""
    texts = []
    for path in FIXTURES:
        text = engine.check_input(path.read_bytes())
        if isinstance(text, str) and nesting.scan(text)[1] is not None:
            try:
                cst.parse_module(text)
            except cst.ParserSyntaxError:
                continue
            texts.append(text)
    return texts


def test_every_fixture_cut_at_every_top_level_statement_parses_to_the_whole_files_tree():
    cut = [_assert_same_tree(text) for text in _fixture_texts()]
    # Almost every fixture has a place to cut (the ones with one statement, or none, do not).
    assert sum(cut) >= 0.9 * len(cut)


@pytest.mark.parametrize("name", [*CUT_LAYOUTS, "syntax sample"])
def test_layouts_chosen_to_break_the_cut_parse_to_the_whole_texts_tree(name):
    assert _assert_same_tree(SYNTAX if name == "syntax sample" else CUT_LAYOUTS[name])


LONE_CR = ["lone cr", "mixed breaks", "final lone cr"]


@pytest.mark.parametrize("name", [name for name in LAYOUTS if name not in LONE_CR])
def test_the_position_layouts_parse_to_the_whole_texts_tree(name):
    _assert_same_tree(LAYOUTS[name])  # the ones with a place to cut; "empty" has none


@pytest.mark.parametrize("name", LONE_CR)
def test_a_text_with_a_lone_cr_is_not_cut(name):
    assert _whole_and_pieces(LAYOUTS[name])[1] is None


def test_a_cut_is_made_only_after_blank_lines_and_column_0_comments():
    # A whitespace-only line, or an indented comment, before y and before z: no cut.
    assert _whole_and_pieces("x = 1\n\n\n    \n\ny = 2\n  # c\nz = 3\n")[1] is None
    assert _assert_same_tree("x = 1\n\n# c\ny = 2\n    \nz = 3\n")


def test_a_piece_that_does_not_parse_leaves_the_whole_parse_to_report_it():
    text = "x = 1\ny = = 2\n"
    deep, top_level = nesting.scan(text)
    assert top_level.statement_lines == [1, 2]
    assert large_files.parse_in_pieces(text, top_level, "utf-8", 1) is None


@pytest.mark.parametrize("data, encoding", [
    (b"\xef\xbb\xbfimport os\n\ndef f():\n    return 1\n", "utf-8-sig"),
    (b"# -*- coding: latin-1 -*-\nx = '\xe9'\n\ndef f():\n    return x\n", "iso-8859-1"),
])
def test_bytes_are_cut_with_the_encoding_libcst_detects(monkeypatch, data, encoding):
    monkeypatch.setattr(large_files, "LARGE_FILE_CHARS", 1)
    monkeypatch.setattr(large_files, "PIECE_CHARS", 1)
    cut = []
    original = large_files.parse_in_pieces
    monkeypatch.setattr(large_files, "parse_in_pieces", lambda *args: cut.append(1) or original(*args))
    module = engine.parse(data)
    assert cut and module.encoding == encoding
    assert module.deep_equals(cst.parse_module(data)) and module.bytes == data


def test_the_engine_parses_a_large_text_in_pieces(monkeypatch):
    text = (ROOT / "fixtures" / "examples" / "train_cuda.py").read_text()
    monkeypatch.setattr(large_files, "LARGE_FILE_CHARS", len(text))
    monkeypatch.setattr(large_files, "PIECE_CHARS", 200)
    calls = []
    monkeypatch.setattr(cst, "parse_module", lambda source, *a, **k: calls.append(len(source)) or
                        _parse_module(source, *a, **k))
    assert engine.parse(text).deep_equals(_parse_module(text))
    assert len(calls) > 3 and max(calls) < len(text)  # pieces only, never the whole text


_parse_module = cst.parse_module


def test_render_in_pieces_is_the_modules_code_cut_before_top_level_statements():
    for text in [SYNTAX, *CUT_LAYOUTS.values(), *_fixture_texts()[::7]]:
        module = cst.parse_module(text)
        code, starts = render_in_pieces(module, 1)
        assert code == module.code
        assert starts[0] == 0 and starts == sorted(set(starts))
        assert len(starts) == max(1, len(module.body))  # every statement after the first starts a piece
        assert all(code[start - 1] in "\r\n" for start in starts[1:])
        assert render_in_pieces(module, 10 ** 9)[1] == [0]


PIECED_SOURCE = """\
from __future__ import annotations
import os
import torch

def f():
    return os.getcwd(), torch.zeros(1)

x = undefined_before
"""


@pytest.mark.parametrize("output, problem", [
    (PIECED_SOURCE, None),
    # A use in one piece of a name another piece binds is no problem...
    (PIECED_SOURCE + "\ny = os.sep + f()[0]\n", None),
    # ...an import removed while a later piece reads it is, on the line of the read.
    (PIECED_SOURCE.replace("import os\n", ""), "an undefined name 'os' (output line 5)"),
    (PIECED_SOURCE + "\nz = new_name\n", "an undefined name 'new_name' (output line 10)"),
    # A name already undefined in the input is not blamed on the output.
    (PIECED_SOURCE.replace("x = undefined_before", "x = 2\nz = undefined_before"), None),
    (PIECED_SOURCE + "\ndef g():\n    return (\n", "code that does not compile ('(' was never closed, output line 11)"),
    (PIECED_SOURCE.replace("from __future__ import annotations\n", "") + "from __future__ import annotations\n",
     "code that does not compile (from __future__ imports must occur at the beginning of the file, output line 8)"),
])
@pytest.mark.parametrize("halves", ["forked", "in this process", "child failed"])
def test_the_gate_in_pieces_gives_the_whole_files_verdicts(monkeypatch, output, problem, halves):
    """The second half of the pieces is checked in a child process (forked), here too when that is not
    possible, or when the child gives nothing back."""
    children = []
    in_child = gate._in_child
    monkeypatch.setattr(gate, "_may_fork", lambda spans: halves != "in this process" and len(spans) > 1)
    monkeypatch.setattr(gate, "_in_child", lambda function: children.append(1) or (
        in_child(function) if halves == "forked" else (lambda: None)))
    whole = OutputGate(PIECED_SOURCE).problem(output)
    in_pieces = OutputGate(PIECED_SOURCE, lambda: _statement_starts(PIECED_SOURCE)).problem(
        output, _statement_starts(output))
    assert in_pieces == whole == problem
    assert bool(children) == (halves != "in this process")


def _statement_starts(code: str) -> list[int]:
    """Offsets of the lines that start at column 0 with code: a piece per top-level statement of these
    outputs (one does not parse, so libcst cannot cut it)."""
    starts, offset = [], 0
    for line in code.splitlines(keepends=True):
        if line[:1].strip() and not line.startswith("#"):
            starts.append(offset)
        offset += len(line)
    return [0, *starts[1:]]


def test_a_large_file_migrates_to_what_the_whole_file_migrates_to(monkeypatch):
    """The pipeline on files parsed and gated in pieces (every file "large", pieces of one statement)
    writes the same output, changes and findings as on the whole files."""
    paths = sorted((ROOT / "fixtures" / "realistic").glob("*.py")) + [ROOT / "fixtures" / "examples" / "train_cuda.py"]
    whole = [migrate(path.read_bytes()) for path in paths]
    monkeypatch.setattr(large_files, "LARGE_FILE_CHARS", 1)
    monkeypatch.setattr(large_files, "PIECE_CHARS", 1)
    pieced = [migrate(path.read_bytes()) for path in paths]
    for path, one, other in zip(paths, whole, pieced):
        assert (other.code, other.changes, other.findings) == (one.code, one.changes, one.findings), path.name
