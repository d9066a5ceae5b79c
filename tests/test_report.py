"""The JSON report (validated against the checked-in schema) and GitHub annotations."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jsonschema
from helpers import CUDA_SCRIPT

from xla_migrate import migrate
from xla_migrate.engine.records import Finding
from xla_migrate.report.formats import github_annotations, json_report

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "docs" / "report.schema.json").read_text())


def test_json_report_matches_the_schema_and_the_result():
    ok = migrate(CUDA_SCRIPT, path="train.py", out_path="train_xla.py", target="2.9")
    bad = migrate("def f(:\n", path="broken.py")
    report = json.loads(json.dumps(json_report([ok, bad])))
    jsonschema.validate(report, SCHEMA)
    first, second = report["files"]
    assert first["path"] == "train.py" and first["out_path"] == "train_xla.py"
    assert first["target"] == "2.9" and first["changed"] is True
    assert first["runs_on"] == {"text": "torch_xla >= 2.3", "min": "2.3", "below": None}
    assert report["version"] == 2
    assert first["changes"][0] == {"line": 3, "column": 10, "code": "XLA101",
                                   "message": ok.changes[0].message, "cell": None}
    assert first["diff_stats"] == {"files": 1, "hunks": 1, "added": 4, "removed": 3}
    assert second["error"]["message"].startswith("cannot parse") and second["error"]["line"] == 1
    assert second["changed"] is False


def test_schema_rejects_a_wrong_report():
    report = json_report([migrate(CUDA_SCRIPT)])
    report["files"][0]["changes"][0]["code"] = "E501"
    try:
        jsonschema.validate(report, SCHEMA)
    except jsonschema.ValidationError:
        return
    raise AssertionError("the schema accepted a non-XLA code")


def test_github_annotations():
    result = migrate(CUDA_SCRIPT, path="src/train,v2.py")
    result.findings.append(Finding(4, 1, "XLA900", "left: 100% cuda\nline", "do it"))
    lines = github_annotations(result)
    assert lines[0] == ("::warning file=src/train%2Cv2.py,line=4,col=1,title=XLA900::"
                        "left: 100%25 cuda%0Aline (fix: do it)")
    # The change's range, as ruff's annotations give it (the finding appended above has no end: its start).
    assert lines[1].startswith("::notice file=src/train%2Cv2.py,line=3,col=10,endLine=3,endColumn=70,"
                               "title=XLA101::torch.device(")
    assert len(lines) == 1 + len(result.changes)
    error = github_annotations(migrate("x = (\n", path="bad.py"))
    assert error == ["::error file=bad.py,line=1,col=5,title=xla-migrate::cannot parse: '(' was never closed"]


def test_notebook_records_name_their_cell():
    result = migrate(CUDA_SCRIPT, path="nb.ipynb")
    result.findings = [Finding(2, 5, "XLA900", "left", "do it", cell=3)]
    result.changes = [replace(result.changes[0], cell=2, line=1)]
    report = json.loads(json.dumps(json_report([result])))
    jsonschema.validate(report, SCHEMA)
    assert report["files"][0]["findings"][0]["cell"] == 3 and report["files"][0]["changes"][0]["cell"] == 2
    # GitHub would place line= on the .ipynb file's JSON lines: the cell and line go into the message.
    assert github_annotations(result) == ["::warning file=nb.ipynb,title=XLA900::cell 3, line 2: left (fix: do it)",
                                          f"::notice file=nb.ipynb,title=XLA101::cell 2, line 1: {result.changes[0].message}"]
    report["files"][0]["findings"][0]["cell"] = 0
    try:
        jsonschema.validate(report, SCHEMA)
    except jsonschema.ValidationError:
        return
    raise AssertionError("the schema accepted cell 0 (cells count from 1)")
