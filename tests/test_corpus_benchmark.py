"""benchmarks/corpus.py finds each kind of failure it reports, and finds none in a script the suite passes.

A stand-in command line (a small script that acts on markers in its input) produces every failure on purpose:
a crash, an input error, an output that does not compile, one that changes again when migrated again, an edit
withdrawn by the gate, a removed import whose name is still used, an already-XLA file changed, a CUDA call
left without a finding. The real command line then runs over a realistic fixture and a small notebook.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import corpus  # noqa: E402

FAKE_CLI = '''\
import json, sys, traceback
args = sys.argv[1:]
def value(flag):
    return args[args.index(flag) + 1] if flag in args else None
source = open(value("--in")).read()
if "CRASH" in source:
    traceback.print_stack()
    sys.exit(1)
if "BADINPUT" in source:
    print("error: " + value("--in") + ":1:1: cannot parse: invalid syntax", file=sys.stderr)
    sys.exit(2)
output, findings = source, []
if "BROKEN" in source:
    output = source + "def (:\\n"
if "GROW" in source:
    output = source + "grown = 1\\n"
if "UNDEF" in source:
    output = source.replace("import os\\n", "")
if "import torch_xla" in source and "# migrated" not in source:
    output = source + "# migrated\\n"
if "WITHDRAW" in source:
    findings.append({"line": 1, "column": 1, "code": "XLA000", "message": "rewrite withdrawn: it would have broken"})
if "COVERED" in source:
    findings.append({"line": 2, "column": 1, "code": "XLA900", "message": "CUDA call left"})
if "--check" in args:
    if output != source:
        print("--- a\\n+++ b\\n@@ -1 +1 @@\\n+grown = 1")
        sys.exit(1)
    sys.exit(0)
open(value("--out"), "w").write(output)
code = "XLA904" if "UPGRADE" in source else "XLA101"
changes = [{"line": 1, "column": 1, "code": code, "message": "edited"}] if output != source else []
report = {"files": [{"path": value("--in"), "changes": changes, "findings": findings}]}
open(value("--report"), "w").write(json.dumps(report))
'''

CASES = {
    "crash.py": "# CRASH\n",
    "bad_input.py": "# BADINPUT\n",
    "broken.py": "# BROKEN\n",
    "grow.py": "# GROW\n",
    "withdraw.py": "# WITHDRAW\nx = 1\n",
    "undef.py": "# UNDEF\nimport os\nprint(os.sep)\n",
    "already_xla.py": "import torch_xla\nx = 1\n",
    "upgraded_xla.py": "# UPGRADE\nimport torch_xla\nx = 1\n",
    "cuda_left.py": "import torch\nx = torch.zeros(1).cuda()\n",
    "cuda_covered.py": "# COVERED\nx = torch.zeros(1).cuda()\n",
    "clean.py": "x = 1\n",
}


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fake")
    cli = folder / "fake-xla-migrate"
    cli.write_text(f"#!{sys.executable}\n" + FAKE_CLI)
    cli.chmod(cli.stat().st_mode | stat.S_IXUSR)
    tree = folder / "corpus" / "owner+repo"
    tree.mkdir(parents=True)
    for name, text in CASES.items():
        (tree / name).write_text(text)
    (folder / "corpus" / ".hidden").mkdir()
    (folder / "corpus" / ".hidden" / "skipped.py").write_text("x = 1\n")
    saved = folder / "results.json"
    code = corpus.main([str(folder / "corpus"), "--targets", "2.9", "-j", "2", "--cli", str(cli),
                        "--json", str(saved), "--only-failures", "--keep", str(folder / "kept")])
    assert (folder / "kept" / "2.9" / "owner+repo" / "grow.py").read_text() == "# GROW\ngrown = 1\n"
    data = json.loads(saved.read_text())
    return code, data, {Path(r["rel"]).name: r for r in data["files"]}


def test_every_kind_of_failure_is_found(fake_run):
    code, data, by_name = fake_run
    assert code == 1  # crashes, a file that does not compile, ...: the bars do not hold
    assert sorted(by_name) == sorted(CASES)  # the hidden folder is skipped
    assert by_name["crash.py"]["status"] == "crash" and "traceback" in by_name["crash.py"]["traceback"].lower()
    assert by_name["bad_input.py"]["status"] == "input-error"
    assert "cannot parse" in by_name["bad_input.py"]["error"]
    assert by_name["broken.py"]["compile_error"].startswith("SyntaxError")
    assert by_name["grow.py"]["not_idempotent"]
    assert by_name["withdraw.py"]["withdrawn"] == ["line 1: rewrite withdrawn: it would have broken"]
    assert [u.split(": ")[1].split(" |")[0] for u in by_name["undef.py"]["new_undefined"]] == ["'os'"]
    assert by_name["already_xla.py"]["already_xla"] and by_name["already_xla.py"]["xla_changed"]
    assert by_name["already_xla.py"]["change_codes"] == {"XLA101": 1}
    # XLA904 alone renames what the target's torch_xla removed: counted apart, not against the bar.
    upgraded = by_name["upgraded_xla.py"]
    assert upgraded["already_xla"] and upgraded["xla_upgraded"] and not upgraded["xla_changed"]
    assert corpus.FileResult(**upgraded).problems() == []
    assert len(by_name["cuda_left.py"]["uncovered"]) == 1 and by_name["cuda_left.py"]["cuda_in"] == 1
    assert by_name["cuda_covered.py"]["uncovered"] == [] and by_name["cuda_covered.py"]["cuda_in"] == 1
    clean = corpus.FileResult(**by_name["clean.py"])
    assert clean.problems() == [] and clean.status == "ok"
    summary = data["summary"]["2.9"]
    assert summary["already_xla_changed_by_xla1xx_only"] == 1  # the stand-in's only change code is XLA101
    assert (summary["already_xla"], summary["already_xla_upgraded"]) == (2, 1)
    assert (summary["crashes"], summary["input_errors"], summary["not_compiling"], summary["not_idempotent"],
            summary["withdrawn_edits"], summary["already_xla_changed"], summary["new_undefined_names"],
            summary["cuda_constructs_in_inputs"], summary["cuda_left_without_finding"]) == (1, 1, 1, 1, 1, 1, 1, 2, 1)


def test_the_table(fake_run):
    _, data, _ = fake_run
    text = corpus.table(data["summary"])
    assert "already-XLA files changed" in text and "1 of 2" in text
    assert text.splitlines()[-1].split()[-1] == "NO"


NOTEBOOK = {
    "cells": [
        {"cell_type": "markdown", "metadata": {}, "source": ["# Train"]},
        {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
         "source": ["!pip install torch\n", "import torch\n",
                    "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n",
                    "model = torch.nn.Linear(2, 2).to(device)\n"]},
    ],
    "metadata": {"kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}},
    "nbformat": 4, "nbformat_minor": 5,
}


def test_a_script_the_suite_passes_has_no_problem(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    script = ROOT / "fixtures" / "realistic" / "mp_spawn_ddp.py"
    (folder / script.name).write_bytes(script.read_bytes())
    (folder / "train.ipynb").write_text(json.dumps(NOTEBOOK))
    (folder / "py2.py").write_text('print "hello"\n')
    saved = tmp_path / "results.json"
    code = corpus.main([str(folder), "--json", str(saved)])
    results = [corpus.FileResult(**r) for r in json.loads(saved.read_text())["files"]]
    assert code == 0
    assert {(r.rel, r.target) for r in results} == {(n, t) for n in (script.name, "train.ipynb", "py2.py")
                                                    for t in ("sagemaker", "2.9")}
    for result in results:
        if result.rel == "py2.py":
            assert result.status == "input-error" and "cannot parse" in result.error
            continue
        assert result.problems() == [], (result.rel, result.target, result.problems())
        assert result.changed and result.cuda_in > 0


def test_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        corpus.main([str(tmp_path / "missing")])
    assert exit_info.value.code == 2
    assert "not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        corpus.main([str(tmp_path)])
    assert "no .py or .ipynb files" in capsys.readouterr().err



def test_a_crash_names_the_exception_and_the_rule():
    traceback = """Traceback (most recent call last):
  File "/site-packages/xla_migrate/engine/pipeline.py", line 134, in run_pipeline
    module.visit(rules)
  File "/repo/transforms/distributed/spawn_entry_point.py", line 159, in _entry_point
    mp_fn = cst.parse_statement(text)
  File "/site-packages/libcst/_parser/entrypoints.py", line 47, in _parse
    return parse(source_str)
libcst._exceptions.ParserSyntaxError: Syntax Error @ 2:23.
parser error: error at 1:22: expected one of ), *, **, /
"""
    assert corpus._raised(traceback) == [
        'File "/repo/transforms/distributed/spawn_entry_point.py", line 159, in _entry_point',
        "libcst._exceptions.ParserSyntaxError: Syntax Error @ 2:23."]
    assert corpus._raised("no traceback here\nlast line") == ["last line"]
