"""Engine behaviour no single rule shows: name resolution through aliases, overlapping edits reported
(never dropped), statement removal keeping comments, imports added once and dead ones removed."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from xla_migrate import migrate
from xla_migrate.engine import pipeline as engine
from xla_migrate.analysis.facts import is_cuda_device_expr
from xla_migrate.engine.rule import Rule
from xla_migrate.engine.targets import get_target


def run(source: str, *rules: type[Rule], target: str = "sagemaker"):
    module = engine.parse(source.encode())
    assert isinstance(module, cst.Module)
    return engine.run_pipeline(module, get_target(target), list(rules))


def test_qualified_names_resolve_through_aliases():
    seen: list[str] = []

    class Probe(Rule):
        code, name, summary = "XLA998", "probe-names", "test probe"

        def visit_Call(self, node):
            seen.append(",".join(sorted(self.ctx.qualnames(node.func))))

    run("import torch as T\nfrom torch import cuda\nimport torch.cuda.amp as amp\n"
        "from torch.optim import AdamW as W\nT.device('cuda')\ncuda.synchronize()\namp.autocast()\nW(p)\n", Probe)
    assert seen == ["torch.device", "torch.cuda.synchronize", "torch.cuda.amp.autocast", "torch.optim.AdamW"]


def test_cuda_device_expressions():
    module = cst.parse_module("")
    wrapper_qualnames = lambda node: {"torch.device"}  # noqa: E731
    for code, expected in [('"cuda"', True), ('"cuda:1"', True), ('f"cuda:{r}"', True), ('"cpu"', False),
                           ('"cuda" if ok else "cpu"', True), ('torch.device("cuda", 0)', True),
                           ('torch.device("cpu")', False), ('"cudax"', False)]:
        assert is_cuda_device_expr(cst.parse_expression(code), wrapper_qualnames) is expected, code
    assert module.code == ""


class ReplaceOneWithTwo(Rule):
    code, name, summary = "XLA996", "replace-one-with-two", "test rule"

    def visit_Integer(self, node):
        if node.value == "1":
            self.replace(node, cst.Integer("2"), "1 -> 2")


class ReplaceOneWithThree(Rule):
    code, name, summary = "XLA997", "replace-one-with-three", "test rule"

    def visit_Integer(self, node):
        if node.value == "1":
            self.replace(node, cst.Integer("3"), "1 -> 3")


class ReplaceCallFixed(Rule):
    code, name, summary = "XLA995", "replace-call-fixed", "test rule"

    def visit_Call(self, node):
        self.replace(node, cst.parse_expression("g()"), "f(...) -> g()")


def test_two_edits_of_one_node_apply_one_and_report_the_other():
    out = run("x = 1\n", ReplaceOneWithTwo, ReplaceOneWithThree)
    assert out.code == "x = 2\n"
    assert [(c.code, c.message) for c in out.changes] == [("XLA996", "1 -> 2")]
    (finding,) = out.findings
    assert finding.code == "XLA997" and finding.line == 1
    assert finding.message == "not applied: overlaps another edit by XLA996: 1 -> 3"


def test_fixed_replacement_over_an_edited_subtree_is_reported_not_applied():
    out = run("y = f(1)\n", ReplaceOneWithTwo, ReplaceCallFixed)
    assert out.code == "y = f(2)\n"
    assert [f.code for f in out.findings] == ["XLA995"]
    assert "overlaps another edit inside it" in out.findings[0].message
    assert [c.code for c in out.changes] == ["XLA996"]


class RemoveCudnnFlag(Rule):
    code, name, summary = "XLA994", "remove-flag", "test rule"

    def visit_SimpleStatementLine(self, node):
        if "cudnn" in cst.Module([]).code_for_node(node):
            self.remove(node, "removed")


def test_removal_keeps_comments_and_fills_empty_blocks():
    source = ("def f():\n    # tune\n    torch.backends.cudnn.benchmark = True\n    return 1\n\n"
              "def g():\n    torch.backends.cudnn.benchmark = True\n")
    out = run(source, RemoveCudnnFlag)
    assert out.code == "def f():\n    # tune\n    return 1\n\ndef g():\n    pass\n"


def test_removing_the_last_statement_of_a_file_takes_its_blank_lines_with_it():
    # The file does not end with blank lines; comments stay. (Inside a block they stay: rules that insert
    # after a function count them, see XLA407.)
    flag = "torch.backends.cudnn.benchmark = True\n"
    assert run(f"x = 1\n\nif x:\n    y = 2\n\n{flag}", RemoveCudnnFlag).code == "x = 1\n\nif x:\n    y = 2\n"
    assert run(f"x = 1\n\n# tune\n{flag}", RemoveCudnnFlag).code == "x = 1\n\n# tune\n"


class RemoveCudnnAssignment(Rule):
    code, name, summary = "XLA992", "remove-assignment", "test rule"

    def visit_Assign(self, node):
        if "cudnn" in cst.Module([]).code_for_node(node):
            self.remove(node, "removed")


def test_removing_one_small_statement_keeps_its_neighbours():
    out = run("a = 1; torch.backends.cudnn.enabled = False; b = 2\n", RemoveCudnnAssignment)
    assert out.code == "a = 1; b = 2\n"


class UsesXm(Rule):
    code, name, summary = "XLA993", "uses-xm", "test rule"

    def visit_Expr(self, node):
        if isinstance(node.value, cst.Name) and node.value.value == "GradScaler":
            self.replace(node.value, cst.parse_expression(self.ctx.spell("device")), "use xm")
            self.import_may_be_dead("torch.cuda.amp", "GradScaler")


def test_imports_added_once_in_place_and_dead_ones_removed():
    source = '"""Doc."""\nfrom __future__ import annotations\nimport os\nfrom torch.cuda.amp import GradScaler\n\nGradScaler\nGradScaler\n'
    out = run(source, UsesXm)
    assert out.code == ('"""Doc."""\nfrom __future__ import annotations\nimport os\n'
                        "import torch_xla.core.xla_model as xm\n\nxm.xla_device()\nxm.xla_device()\n")


def test_existing_alias_is_reused():
    out = run("import torch_xla.core.xla_model as xla\nGradScaler\n", UsesXm)
    assert out.code == "import torch_xla.core.xla_model as xla\nxla.xla_device()\n"


@pytest.mark.parametrize(("source", "name"), [
    ("xm = 3\nGradScaler\n", "xla_model"),  # a module-level variable
    ("def f():\n    xm = 1\nGradScaler\n", "xla_model"),  # a local in some function
    ("for xm in range(3):\n    pass\nGradScaler\n", "xla_model"),  # a loop variable
    ("from utils import *\nprint(xm)\nGradScaler\n", "xla_model"),  # read, bound by nothing visible
    ("xm = 3\nxla_model = 4\nGradScaler\n", "xm_2"),
    ("import torch_xla.core.xla_model as xm\nxm = None\nGradScaler\n", "xla_model"),  # rebound
])
def test_new_imports_take_names_the_script_does_not_use(source, name):
    out = run(source, UsesXm)
    assert f"import torch_xla.core.xla_model as {name}\n" in out.code
    assert out.code.endswith(f"{name}.xla_device()\n")


def test_a_try_import_further_down_is_reused_and_imported_at_the_top_only_when_read_earlier():
    """The half-migrated idiom: ``try: import torch_xla... as xm / except ImportError: xm = None``. Its name
    is reused; an import at the top is added only when something above the try may read it."""
    try_import = "try:\n    import torch_xla.core.xla_model as xm\nexcept ImportError:\n    xm = None\n"
    used_later = run("import os\n" + try_import + "def f():\n    GradScaler\n", UsesXm)
    assert used_later.code == "import os\n" + try_import + "def f():\n    xm.xla_device()\n"
    used_above = run("import os\nGradScaler\n" + try_import, UsesXm)
    assert used_above.code == "import os\nimport torch_xla.core.xla_model as xm\nxm.xla_device()\n" + try_import
    called_above = run("import os\ndef f():\n    GradScaler\nf()\n" + try_import, UsesXm)
    assert "import os\nimport torch_xla.core.xla_model as xm\n" in called_above.code
    # An import that may not run (under an if, in an except branch) is no binding to count on.
    for maybe in ("if USE_XLA:\n    import torch_xla.core.xla_model as xm\n",
                  "try:\n    import foo\nexcept ImportError:\n    import torch_xla.core.xla_model as xm\n"):
        guarded = run("import os\n" + maybe + "def f():\n    GradScaler\n", UsesXm)
        assert guarded.code.startswith("import os\nimport torch_xla.core.xla_model as xm\n" + maybe), maybe


def test_written_targets_are_never_replaced():
    """Reads are rewritten, writes are not: the rule contract skips a replacement of a written target."""
    import libcst as cst

    from xla_migrate.engine.context import MigrationContext
    from xla_migrate.engine.targets import get_target

    code = ("os.environ['A'] = 1\na, os.environ['B'] = 1, 2\ndel os.environ['C']\nos.environ['D'] += 'x'\n"
            "for os.environ['E'] in v: pass\nwith f() as os.environ['F']: pass\n"
            "x[os.environ['G']] = os.environ['H']\nos.environ['I'].y = 1\n")
    module = cst.parse_module(code)
    ctx = MigrationContext(cst.MetadataWrapper(module, unsafe_skip_copy=True), get_target("2.9"))
    subscripts = {}

    class Collect(cst.CSTVisitor):
        def visit_Subscript(self, node):
            key = node.slice[0].slice.value
            if isinstance(key, cst.SimpleString):
                subscripts[key.evaluated_value] = node

    module.visit(Collect())
    written = sorted(k for k, node in subscripts.items() if ctx.is_write_target(node))
    assert written == ["A", "B", "C", "D", "E", "F"]


def test_migrate_pauses_the_cyclic_collector_and_restores_it(monkeypatch):
    """The migration runs without cyclic collections (they scanned the whole tree again and again: 45% of
    the time on a 1 MB script); the collector's own state comes back afterwards, on or off."""
    import gc

    from xla_migrate import api
    from xla_migrate.engine import pipeline as engine

    seen: list[bool] = []
    original = engine.run_pipeline

    def recording(*args, **kwargs):
        seen.append(gc.isenabled())
        return original(*args, **kwargs)

    monkeypatch.setattr(engine, "run_pipeline", recording)
    assert gc.isenabled()
    assert api.migrate("import torch\nx = torch.zeros(2).cuda()\n").changes
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        api.migrate("import torch\nx = torch.zeros(2).cuda()\n")
        assert seen == [False, False] and not gc.isenabled()
    finally:
        gc.enable()


_TORCH_BINDINGS = [
    "import torch\nfrom torch import cuda as c\nimport torch.cuda.amp\nimport torch.nn as nn\n"
    "def f(torch):\n    return torch.cuda.Stream(), c.Event(), nn.Linear\nx = torch.cuda.FloatTensor\n",
    "def torch():\n    cuda = 1\n    return cuda\nclass K:\n    torch = 2\ntorch.cuda.synchronize()\n",
    "class torch:\n    class cuda:\n        Stream = 1\n    x = cuda.Stream\ntorch.cuda.Stream\n",
    "torch = object()\ntorch.cuda.memory_allocated()\n[torch.cuda for torch in range(3)]\n",
    "def g():\n    import torch.cuda as tc\n    from torch.cuda import amp\n    return tc.Stream, amp.autocast\n"
    "tc = 3\ntc.Stream\n(1).real\n'x'.join([])\nx[0].cuda()\n",
    "from . import torch\nfrom .torch import cuda\ntorch.cuda\ncuda.Stream\nfrom torch.cuda import *\nStream()\n",
]


@pytest.mark.parametrize("source", [*_TORCH_BINDINGS, *(
    p.read_bytes() for p in sorted(
        (Path(__file__).resolve().parent.parent / "fixtures" / "realistic").glob("*.py")))])
def test_torch_names_are_the_qualified_names_in_torch_for_every_node(source):
    """ctx.torch_names skips the scopes for nodes whose root no import binds: it must still give exactly the
    torch part of what the scopes give, for every node, however ``torch`` is bound."""
    from libcst.metadata import MetadataWrapper

    from xla_migrate.engine.context import MigrationContext
    from xla_migrate.syntax.positions import Positions

    module = cst.parse_module(source)
    ctx = MigrationContext(MetadataWrapper(module, unsafe_skip_copy=True), get_target("2.9"))
    nodes = list(Positions(module).parents)
    in_torch = 0
    for node in nodes:
        expected = {n for n in ctx.qualnames(node) if n == "torch" or n.startswith("torch.")}
        assert ctx.torch_names(node) == expected, (type(node).__name__, patterns_code(node))
        in_torch += bool(expected)
    assert len(nodes) > 20
    if source in _TORCH_BINDINGS[:5]:
        assert in_torch  # the cases where something does resolve into torch


def patterns_code(node):
    from xla_migrate.syntax.patterns import code_of

    return code_of(node)


def test_torch_names_only_methods_run_for_torch_rooted_nodes_only_in_their_order():
    calls = []

    class _Method:
        def __init__(self, name, marked):
            self.name, self.torch_names_only = name, marked

        def __call__(self, node):
            calls.append(self.name)

    first, marked, last = _Method("first", False), _Method("marked", True), _Method("last", False)
    visits = {cst.Name: [first, marked, last], cst.Attribute: [marked], cst.Call: [first]}
    dispatched = engine._with_torch_root_dispatch(visits, frozenset({"torch", "amp"}))
    assert dispatched[cst.Call] == [first]
    for node, expected in [(cst.Name("torch"), ["first", "marked", "last"]), (cst.Name("model"), ["first", "last"]),
                           (cst.parse_expression("amp.autocast().x"), ["marked"]),
                           (cst.parse_expression("model.cuda"), []), (cst.parse_expression("'a'.join"), [])]:
        calls.clear()
        for method in dispatched[type(node)]:
            method(node)
        assert calls == expected
    # A script that binds torch itself: every method runs on every node.
    assert engine._with_torch_root_dispatch(visits, None) is visits


def test_only_name_and_attribute_visits_are_marked_torch_names_only():
    from xla_migrate.engine.registry import all_rules

    marked = [(rule.__name__, name) for rule in all_rules() for name in dir(rule)
              if getattr(getattr(rule, name, None), "torch_names_only", False)]
    assert len(marked) >= 6
    assert {name for _, name in marked} <= {"visit_Name", "visit_Attribute"}


def test_the_torch_root_dispatch_changes_no_migration(monkeypatch):
    """Every fixture migrates to the same output, changes and findings with the marked methods called on
    every node (the dispatch only skips calls that do nothing)."""
    from xla_migrate import migrate

    root = Path(__file__).resolve().parent.parent / "fixtures"
    paths = sorted((root / "realistic").glob("*.py")) + sorted((root / "examples").glob("*.py"))
    dispatched = [migrate(path.read_bytes()) for path in paths]
    monkeypatch.setattr(engine, "_with_torch_root_dispatch", lambda visits, roots: visits)
    for path, expected in zip(paths, dispatched):
        result = migrate(path.read_bytes())
        assert (result.code, result.changes, result.findings) == \
            (expected.code, expected.changes, expected.findings), path.name


def test_a_function_of_the_script_named_torch_xla_is_no_sign_of_running_on_xla():
    # A hypothesis-mutated helper renamed `torch_xla`: its call made the file "already on XLA", which hid the
    # CUDA gate's branch from the editing rules on the first run only (torchtpu was not idempotent).
    own = ("import torch as th\n\n\ndef torch_xla():\n    if th.cuda.is_available():\n"
           "        return th.device('cuda')\n    return th.device('cpu')\n\n\nprint(torch_xla())\n")
    imported = "import torch\nimport torch_xla\n\nprint(torch_xla.device())\n"
    assert migrate(imported, target="2.9").code == imported
    for target in ("2.9", "torchtpu"):
        first = migrate(own, target=target).code
        assert "'cuda'" not in first, first
        assert migrate(first, target=target).code == first
