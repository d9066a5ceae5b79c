"""The output gate: no output that does not compile, or that reads a name the input bound and the output
no longer binds, is ever returned or written; the edits responsible are withdrawn and reported (XLA000),
the rest of the migration is kept.

Deliberately broken rules, registered only here, make the bad edits; every way in (the library, a file,
stdin, a tree, in place, a notebook) must keep them out."""

from __future__ import annotations

import json

import libcst as cst
import nbformat
import pytest
from typer.testing import CliRunner

from xla_migrate import migrate
from xla_migrate.engine import registry
from xla_migrate.cli import app
from xla_migrate.engine.gate import CODE, OutputGate
from xla_migrate.engine.rule import Rule

SCRIPT = """import os
import torch


def setup(rank):
    os.environ["LOCAL_RANK"] = str(rank)
    model = torch.nn.Linear(2, 2).cuda()
    return model
"""


class AssignsToACall(Rule):
    """Broken on purpose: turns the assignment ``os.environ[...] = v`` into ``local_rank() = v`` (a
    SyntaxError). It replaces the whole assignment, so the rule contract's own guard (targets are never
    replaced) does not stop it."""

    code = "XLA991"
    name = "test-assigns-to-a-call"
    summary = "test only"

    def visit_Assign(self, node: cst.Assign) -> None:
        if isinstance(node.targets[0].target, cst.Subscript):
            broken = node.with_changes(targets=[cst.AssignTarget(cst.parse_expression("local_rank()"))])
            self.replace(node, broken, "environ write -> call (broken)")


class RemovesTorchImport(Rule):
    """Broken on purpose: removes ``import torch`` although the script still reads ``torch``."""

    code = "XLA992"
    name = "test-removes-torch-import"
    summary = "test only"

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        first = node.body[0]
        if isinstance(first, cst.Import) and first.names[0].evaluated_name == "torch":
            self.remove(node, "removed import torch (broken)")


@pytest.fixture
def broken_rules(monkeypatch):
    rules = registry.all_rules() + (AssignsToACall, RemovesTorchImport)
    monkeypatch.setattr(registry, "all_rules", lambda: rules)


def _withdrawn(findings):
    return sorted(f.message.split(":")[0] for f in findings if f.code == CODE)


def test_broken_edits_are_withdrawn_and_the_rest_is_kept(broken_rules):
    result = migrate(SCRIPT, target="2.9")
    compile(result.code, "out.py", "exec")
    assert _withdrawn(result.findings) == ["rewrite withdrawn (XLA991", "rewrite withdrawn (XLA992"]
    messages = {f.message for f in result.findings if f.code == CODE}
    assert any("does not compile (cannot assign to function call" in m for m in messages)
    assert any("an undefined name 'torch'" in m for m in messages)
    # The good edits stay: the device rewrite, and the withdrawn ones leave no change record behind.
    assert ".to(device)" in result.code and "import torch\n" in result.code
    assert 'os.environ["LOCAL_RANK"] = str(rank)' in result.code
    assert not {c.code for c in result.changes} & {"XLA991", "XLA992"}
    assert "XLA101" in {c.code for c in result.changes}


def test_withdrawn_edit_points_at_its_input_line(broken_rules):
    result = migrate(SCRIPT, target="2.9")
    lines = {f.message.split(":")[0]: f.line for f in result.findings if f.code == CODE}
    assert lines == {"rewrite withdrawn (XLA991": 6, "rewrite withdrawn (XLA992": 2}


def test_an_output_that_only_fails_through_a_broken_edit_is_the_input(broken_rules):
    source = "import torch\nx = torch.zeros(1)\n"
    result = migrate(source, target="2.9", select=["XLA992"])
    assert result.code == source and result.changes == []
    assert _withdrawn(result.findings) == ["rewrite withdrawn (XLA992"]


def test_every_way_in_keeps_broken_output_out(broken_rules, tmp_path):
    runner = CliRunner()
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "train_xla.py"
    done = runner.invoke(app, ["--in", str(script), "--out", str(out), "--target", "2.9"])
    assert done.exit_code == 0, done.output
    compile(out.read_text(), "out.py", "exec")
    assert "XLA000" in done.output

    done = runner.invoke(app, ["--in", "-", "--out", "-", "--target", "2.9"], input=SCRIPT)
    assert done.exit_code == 0
    compile(done.stdout, "stdout.py", "exec")

    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "a.py").write_text(SCRIPT)
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(SCRIPT)]
    nbformat.write(notebook, tree / "nb.ipynb")
    mirror = tmp_path / "mirror"
    done = runner.invoke(app, ["--in", str(tree), "--out", str(mirror), "--target", "2.9", "-j", "1"])
    assert done.exit_code == 0, done.output
    compile((mirror / "pkg" / "a.py").read_text(), "a.py", "exec")
    cell = nbformat.read(mirror / "nb.ipynb", as_version=4).cells[0].source
    compile(cell, "cell", "exec")
    assert ".to(device)" in cell

    done = runner.invoke(app, ["--in", str(tree), "--in-place", "--target", "2.9", "-j", "1"])
    assert done.exit_code == 0, done.output
    compile((tree / "pkg" / "a.py").read_text(), "a.py", "exec")


def test_the_json_report_carries_the_withdrawn_edits(broken_rules, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    report = tmp_path / "report.json"
    done = CliRunner().invoke(app, ["--in", str(script), "--diff", "--target", "2.9", "--report", str(report)])
    assert done.exit_code == 0, done.output
    codes = [f["code"] for f in json.loads(report.read_text())["files"][0]["findings"]]
    assert codes.count(CODE) == 2


# The gate itself -------------------------------------------------------------------------------------------
def test_gate_passes_what_compiles_and_binds_what_the_input_bound():
    gate = OutputGate("import torch\nx = torch.zeros(1)\n")
    assert gate.problem("import torch\nimport torch_xla\nx = torch.zeros(1, device=torch_xla.device())\n") is None
    assert "does not compile" in gate.problem("import torch\ntorch.zeros(1) = x\n")
    assert gate.problem("x = torch.zeros(1)\n") == "an undefined name 'torch' (output line 1)"


def test_gate_does_not_blame_what_the_input_already_lacked():
    # A notebook cell reads names an earlier cell bound; get_ipython() is IPython's.
    source = "get_ipython().run_line_magic('time', '')\nmodel.cuda()\n"
    gate = OutputGate(source)
    assert gate.problem("get_ipython().run_line_magic('time', '')\nmodel.to(device)\n") == \
        "an undefined name 'device' (output line 2)"
    assert gate.problem("get_ipython().run_line_magic('time', '')\nmodel.to('xla')\n") is None
    # One more read of a name the input already lacked is still a new problem.
    assert gate.problem("model.cuda()\nmodel.eval()\nget_ipython()\n") is not None


def test_gate_sees_a_local_read_before_it_is_assigned():
    gate = OutputGate("device = 1\ndef f():\n    device = 2\n    return device\n")
    problem = gate.problem("device = 1\ndef f():\n    m = device\n    device = 2\n    return device\n")
    assert problem == "'device' read before it is assigned (output line 3)"


def test_gate_only_asks_for_compiling_output_when_the_input_compiled():
    source = "def f():\n    nonlocal x\n"  # parses, but does not compile
    assert OutputGate(source).problem("def f():\n    nonlocal x\n    y = 1\n") is None
    assert OutputGate("x = 1\n").problem("def f():\n    nonlocal x\n") is not None
