"""positions.py gives every node libcst's PositionProvider range, and the module's code, from one render."""

from __future__ import annotations

import inspect
from pathlib import Path

import libcst as cst
import pytest
from libcst._nodes.base import CSTNode
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from xla_migrate.syntax.positions import Positions, render, render_in_pieces, render_module

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = sorted((ROOT / "fixtures").rglob("*.py"))

# Every kind of node libcst records a syntactic position for (the test below checks that it stays so).
SYNTAX = '''\
from __future__ import annotations
import a.b as c, d
from . import (e, f as g)
from .h import *
lazy import lazy_module
lazy from lazy_package import name
@decorator(arg, *args, key=1, **kw)
class K(Base, metaclass=M):
    x: int = 1
    y += 2; z -= 3
    async def f(self, /, a, *args, b=2, **kw) -> "K":
        global g
        nonlocal q
        fn = lambda q, *r, s=1: q
        async with ctx() as (u, v), other():
            async for i in aiter():
                yield i
                yield from j
        await thing
        try:
            pass
        except* ValueError as e:
            raise RuntimeError from e
        else:
            del a[1:2, ::3], b.c
        finally:
            return f"{a!r:>{width}} {b=}"
def g[T: int, *Ts, **P](x: T) -> T:
    match x:
        case [1, *rest] | {"k": _, **others} if rest:
            pass
        case Point(x=0, y=y) as p:
            pass
        case None | True | -1 | 1 + 2j | "s" "t":
            pass
        case (a, b, *_):
            pass
    while (n := next(it)) is not None:
        if n > 1 and not n or n < -1:
            break
        elif n in x or n not in y or n is y:
            continue
        else:
            assert x, "msg"
    for k in range(10): print(k)
    type Alias = list[int]
    try:
        pass
    except (ValueError, TypeError) as error:
        raise
    except Exception:
        pass
    return {k: v for k, v in x.items() if k} or [y async for y in z] or {*s} or (a if b else c) or ...
v = {**a, "k": 1, **b}
w = a @ b // c % d ** -e << f >> g & h | i ^ ~j
u = (a - b * c / d, a == b != c <= d >= e > f < g, +a)
w @= 1; w //= 2; w %= 3; w **= 4; w <<= 5; w >>= 6; w &= 7; w |= 8; w ^= 9; w *= 1; w /= 2
t = a[1], b[::], c[x:y:z], (1,), [], {}, (), print(*a, **b), x.y.z
s = """triple
quoted""" + 'implicit' 'join' + rb"raw" + f"{x}"
x = 1 if y else \\
    2
'''

# Layouts libcst's positions must agree with: line breaks, tabs, characters past ASCII, form feeds, ends.
LAYOUTS = {
    "crlf": "import torch\r\ndef f(x):\r\n    return x.cuda()\r\n\r\n# done\r\n",
    "lone cr": "import torch\rdef f(x):\r    return x.cuda()\r\r# done\r",
    "mixed breaks": "a = 1\r\nb = 2\rc = 3\nif a:\r\n    b = (1,\r        2)\n",
    "crlf in a string": 'x = """one\r\ntwo\rthree"""\ny = 1\n',
    "tabs": "def f(x):\n\tif x:\n\t\treturn x  # tab\tcomment\n\treturn\t(1,\n\t\t2)\n",
    "non-ascii": "# résumé ✓ 😀\nnom = 'été 😀'; x = nom  # ünïcode\nπ = 3.14 + len('😀😀')\n",
    "form feeds": "import os\n\f\ndef f():\n    pass\n\f# page\n\fx = 1\n",
    "form feed in indentation": "if x:\n\f    y = 1\n    z = 2\n",
    "empty": "",
    "one newline": "\n",
    "comments only": "# one\n\n# two\n",
    "no final newline": "import torch\nx = torch.zeros(3).cuda()",
    "no final newline after a comment": "x = 1\n# last",
    "no final newline, crlf": "x = 1\r\ny = 2",
    "no final newline in a block": "def f():\n    return 1",
    "final lone cr": "x = 1\ry = 2\r",
    "backslash continuation": "x = 1 + \\\n    2\nif a and \\\r\n   b:\r\n    pass\r\n",
    "blank lines with spaces": "x = 1\n    \n\t\ny = 2\n   ",
    "semicolons and suites": "if a: b; c\nelse: d\nwhile x: pass\nclass C: pass\n",
    "nested blocks and dedent comments": "def f():\n    if a:\n        b\n    # inner\n# outer\n    return\n",
}


def _assert_libcsts_positions(module: cst.Module) -> None:
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    expected = wrapper.resolve(PositionProvider)
    positions = Positions(module)
    assert positions.code == module.code
    assert {node: positions.range(node) for node in expected} == dict(expected)
    for node, code_range in expected.items():
        assert positions.start(node) == (code_range.start.line, code_range.start.column)
        assert positions.end(node) == (code_range.end.line, code_range.end.column)
    # The parents come from the same render: every node's, as libcst's provider gives them.
    assert positions.parents == dict(wrapper.resolve(ParentNodeProvider))


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: str(p.relative_to(ROOT / "fixtures")))
def test_every_node_of_every_fixture_has_libcsts_position(path):
    try:
        module = cst.parse_module(path.read_bytes())
    except cst.ParserSyntaxError:
        pytest.skip("not Python libcst parses")
    _assert_libcsts_positions(module)


def test_the_syntax_sample_has_libcsts_positions():
    _assert_libcsts_positions(cst.parse_module(SYNTAX))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_layouts_have_libcsts_positions(layout):
    module = cst.parse_module(LAYOUTS[layout])
    _assert_libcsts_positions(module)


def test_layouts_from_bytes_have_libcsts_positions():
    for layout in ("crlf", "non-ascii", "lone cr"):
        _assert_libcsts_positions(cst.parse_module(LAYOUTS[layout].encode("utf-8")))


def test_columns_count_characters_not_bytes():
    module = cst.parse_module("s = '😀é'; t = 1\n")
    assignment = module.body[0].body[1]
    assert Positions(module).start(assignment) == (1, 10)


def test_a_node_not_in_the_module_has_no_position():
    positions = Positions(cst.parse_module("x = 1\n"))
    stranger = cst.Name("x")
    assert positions.range(stranger) is None
    assert positions.start(stranger) is None and positions.end(stranger) is None


def test_the_syntax_sample_holds_every_node_with_a_syntactic_position():
    """The sample is what tests the hoisting of syntactic positions (start_node/end_node) and their
    precedence over the whitespace-inclusive ones: it must hold every node type whose code generation
    records one, so a libcst release that adds one fails here."""
    recording = {t.__name__ for t in _subclasses(CSTNode)
                 if not inspect.isabstract(t) and not t.__name__.startswith("_")
                 and "record_syntactic_position" in inspect.getsource(t._codegen_impl)}
    assert len(recording) > 60
    seen: set[str] = set()

    class Types(cst.CSTVisitor):
        def on_visit(self, node: CSTNode) -> bool:
            seen.add(type(node).__name__)
            return True

    cst.parse_module(SYNTAX).visit(Types())
    assert recording - seen == set()


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


@pytest.mark.parametrize("path", FIXTURES[::7], ids=lambda p: str(p.relative_to(ROOT / "fixtures")))
def test_render_gives_libcsts_code_for_modules_and_their_statements(path):
    """positions.render (the engine's output render and code_of) is libcst's code_for_node, token for token."""
    module = cst.parse_module(path.read_bytes())
    assert render(module) == module.code
    for statement in module.body[:20]:
        assert render(statement, module) == module.code_for_node(statement)
        assert render(statement) == cst.Module(body=[]).code_for_node(statement)


def _rearranged(module: cst.Module) -> list[cst.Module]:
    """Outputs as the edits make them: top-level statements kept (the same objects), moved, added, changed."""
    body = list(module.body)
    added = cst.parse_statement("import torch_xla.core.xla_model as xm\n")
    outputs = [module, module.with_changes(body=[added, *body]), module.with_changes(body=[*body, added])]
    if len(body) > 1:
        # The last statement in the middle (without a final newline, its text lacked one); one changed.
        outputs.append(module.with_changes(body=[body[-1], *body[:-1]]))
        outputs.append(module.with_changes(body=[body[0].deep_clone(), *body[1:]]))
    return outputs


# With the layouts above: no final newline, a header and a footer, tabs and CRLF, empty modules.
OUTPUT_LAYOUTS = ["x = 1\ny = 2", "# header\n\nx = 1\n\n\ny = 2\n# footer\n", "if a:\n\tb = 1\r\nc = 2\r\n",
                  "", "\n\n", "x = 1  # no newline at the end", "def f():\n  return 1\n\n\nclass C:\n  pass\n"]


@pytest.mark.parametrize("source", [*OUTPUT_LAYOUTS, *(LAYOUTS[name] for name in sorted(LAYOUTS)),
                                    *(p.read_bytes() for p in FIXTURES[::5])],
                         ids=lambda s: repr(s[:20]) if isinstance(s, str) else None)
def test_an_output_render_reusing_the_inputs_text_is_libcsts_code(source):
    module = cst.parse_module(source)
    input_text = Positions(module).input_text
    assert input_text.code == module.code
    for output in _rearranged(module):
        assert render_module(output, input_text) == output.code
        assert render_in_pieces(output, 40, input_text)[0] == output.code
    # A layout the input does not have (another indentation) renders every statement again.
    other = module.with_changes(default_indent="        ")
    assert render_module(other, input_text) == other.code
