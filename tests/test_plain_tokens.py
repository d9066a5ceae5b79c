"""plain_tokens gives tokenize's tokens (Python before 3.12, where tokenize runs in Python), and the nesting
guard's verdicts are the same with either."""

from __future__ import annotations

import io
import sys
import token
import tokenize
from pathlib import Path

import pytest

from xla_migrate.syntax import nesting, plain_tokens

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(sys.version_info >= (3, 12),
                                reason="Python 3.12 tokenizes in C: nesting.py uses tokenize itself there")

_LEFT_OUT = {token.NL, token.COMMENT, token.ENDMARKER}

EDGE_CASES = {
    "empty": "",
    "only a comment, no newline": "# x",
    "no final newline": "x = 1",
    "blank last line without a newline": "x = 1\n   ",
    "blocks and dedents": "if a:\n    b\n    if c:\n        d\ne\n",
    "tabs and spaces": "if a:\n\tb\n\tif c:\n\t    d\n",
    "a dedent to no outer level": "if a:\n        b\n    c\n",
    "comments and blank lines in blocks": "def f():\n    # c\n\n    x = 1  # d\n        # deeper comment\n    y\n",
    "backslash continuation": "x = 1 + \\\n    2\ny = 3\n",
    "a backslash at the end of the text": "x = 1 + \\",
    "a stray backslash": "x = \\ 1\n",
    "brackets across lines": "x = [\n    1,\n\n    # c\n    (2,\n 3)]\nif y:\n    z\n",
    "a bracket left open": "x = (1,\n",
    "stray closing brackets": "x = 1)\n  y = 2\nz\n",
    "triple-quoted strings": "x = '''a\nb''' + \"\"\"c\"\"\"\ny = r'''d\n\\'''\n'''\n",
    "an unterminated triple-quoted string": "x = '''a\nb\n",
    "a single-quoted string continued by a backslash": "x = 'a\\\nb' + \"c\\\n\\\nd\"\n",
    "a continued string that ends without its backslash": "x = 'a\\\nb\ny = 2\n",
    "an unterminated string": "x = 'abc\ny = \"d\n",
    "string prefixes": "x = rb'a' + Rb'b' + BR\"c\" + u'd' + f'{e}' + fr'{g}' + rf\"h\" + b'''i''' + F'j'\n",
    "names that are not prefixes": "x = xb'a' + rbx'b' + ab\"c\" + r + b + f\n",
    "f-strings with brackets": "x = f'{a[1]:{w}}' f\"{ {'k': (1, 2)}['k'] }\"\n",
    "numbers": "x = 1 + .5 + 1e5 + 0x_ff + 1j + 0o7 + 0b1 + 1_000.0e-3 + 3.\ny = ...\nz = a.b\n",
    "operators": "def f(a) -> int:\n    a **= 2; a //= 3; a >>= 1; a @= b\n    return (y := a != b <= c)\n",
    "unicode names": "é = 1\nnäme = é + 名前\n",
    "a combining mark first": "x = \u0301abc\n",
    "error characters": "x = $ + ? + `a`\n",
    "decorators": "@d\n@e(1)\ndef f():\n    pass\nclass C:\n    @property\n    def p(self): ...\n",
    "elif chains and clauses": ("if a:\n    pass\nelif b:\n    pass\nelse:\n    pass\n"
                                "try:\n    x\nexcept E:\n    y\nfinally:\n    z\n"),
    "match statement": "match x:\n    case [1, *rest]:\n        pass\n    case {'k': v}:\n        pass\n",
    "semicolons and one-line blocks": "if a: b; c\nwhile d: e\n",
    "vertical tab and other breaks inside a line": "x = 1 \x0b+ 2\ny = '\u2028'\n",
    "deep brackets": "x = " + "[" * 80 + "]" * 80 + "\n",
    "a long chain": "x = a" + " + a" * 250 + "\n",
}


def _tokenize_tokens(text: str) -> tuple[list, str | None]:
    found = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type not in _LEFT_OUT:
                found.append((tok.type, tok.string, tok.start))
    except (tokenize.TokenError, SyntaxError) as error:
        return found, type(error).__name__
    while found and (found[-1][0] == token.DEDENT or found[-1][:2] == (token.NEWLINE, "")):
        found.pop()  # what tokenize adds at the end
    return found, None


def _plain_tokens(text: str) -> tuple[list, str | None]:
    found = []
    try:
        for tok in plain_tokens.tokens(text):
            found.append(tok)
    except (tokenize.TokenError, SyntaxError) as error:
        return found, type(error).__name__
    return found, None


def _texts() -> list[tuple[str, str]]:
    files = [*sorted((ROOT / "fixtures").rglob("*.py")), *sorted((ROOT / "src").rglob("*.py")),
             *sorted((ROOT / "transforms").rglob("*.py")), *sorted((ROOT / "tests").glob("*.py"))]
    texts = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if plain_tokens.is_plain(text):
            texts.append((str(path.relative_to(ROOT)), text))
    return texts


@pytest.mark.parametrize("case", sorted(EDGE_CASES))
def test_an_edge_case_has_tokenizes_tokens_and_errors(case):
    text = EDGE_CASES[case]
    assert plain_tokens.is_plain(text)
    assert _plain_tokens(text) == _tokenize_tokens(text)


def test_every_plain_file_of_the_repository_has_tokenizes_tokens():
    texts = _texts()
    assert len(texts) > 500
    assert [name for name, text in texts if _plain_tokens(text) != _tokenize_tokens(text)] == []


def test_carriage_returns_and_form_feeds_are_not_plain():
    assert not plain_tokens.is_plain("x = 1\r\n")
    assert not plain_tokens.is_plain("x = 1\ry = 2\n")
    assert not plain_tokens.is_plain("\fx = 1\n")
    assert plain_tokens.is_plain("x = '\\r'\n")


def _scans(text: str, monkeypatch) -> tuple:
    with monkeypatch.context() as patched:
        patched.setattr(nesting, "_TOKENIZES_IN_PYTHON", False)
        by_tokenize = nesting.scan(text)
    return nesting.scan(text), by_tokenize


@pytest.mark.parametrize("case", sorted(EDGE_CASES))
def test_the_nesting_guard_gives_the_same_verdict_with_either(case, monkeypatch):
    lean, by_tokenize = _scans(EDGE_CASES[case], monkeypatch)
    assert lean == by_tokenize


def test_the_nesting_guard_refuses_at_the_same_token_with_either(monkeypatch):
    for text in ("x = " + "[" * 70 + "]" * 70 + "\n", "if a:\n    x = b" + ".c" * 300 + "\n",
                 "x = (\n" + "  a +\n" * 250 + "  a)\n", "x = 'a' " + "'b' " * 300 + "\n"):
        lean, by_tokenize = _scans(text, monkeypatch)
        assert lean[0] is not None and lean == by_tokenize


def _equal(first: tuple, second: tuple) -> bool:
    return first == second  # TopLevel is a dataclass: equal fields, equal scans


def test_the_nesting_guard_finds_the_same_top_level_statements_in_every_file(monkeypatch):
    texts = _texts()
    differ = [name for name, text in texts if not _equal(*_scans(text, monkeypatch))]
    assert differ == []
    assert sum(nesting.scan(text)[1] is not None for _, text in texts) > 500
