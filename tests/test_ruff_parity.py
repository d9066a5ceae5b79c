"""What a ruff user reaches for (issue 33): suppression comments, per-file-ignores, CI exit codes, the
machine-readable formats (ruff's flat json, SARIF 2.1.0, github annotations with ranges), selection (ALL,
--extend-select, --extend-ignore), --show-settings / --show-files, the engine's own codes as rule pages,
--safe-only; through the library and the real console script."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import pytest
from helpers import CUDA_SCRIPT, ROOT, run_cli

from xla_migrate import migrate

# Two findings (XLA902 for the apex import line 2, XLA103 for the CUDA stream line 5) and CUDA to migrate.
FINDINGS_SCRIPT = '''import torch
import apex
model = torch.nn.Linear(4, 2).cuda()
y = torch.zeros(2).cuda()
s = torch.cuda.Stream()
'''


def _codes(records):
    return sorted((r.line, r.code) for r in records)


# Suppressions -----------------------------------------------------------------------------------------------
def test_noqa_keeps_its_line_and_its_finding_out():
    plain = migrate(FINDINGS_SCRIPT)
    assert (3, "XLA101") in _codes(plain.changes) and (5, "XLA103") in _codes(plain.findings)
    kept = FINDINGS_SCRIPT.replace(".cuda()\ny", ".cuda()  # noqa: XLA101\ny").replace(
        "Stream()\n", "Stream()  # noqa: XLA103\n")
    result = migrate(kept)
    lines = result.code.splitlines()
    assert "model = torch.nn.Linear(4, 2).cuda()  # noqa: XLA101" in lines  # the line as it is
    assert "y = torch.zeros(2).to(device)" in lines  # the next line still migrates
    assert (3, "XLA101") not in [(c.line, c.code) for c in result.changes if c.column > 1]
    assert (5, "XLA103") not in _codes(result.findings)
    assert not [f for f in result.findings if f.code == "XLA002"]  # both suppressions were used


def test_a_bare_noqa_keeps_every_rule_out_and_other_tools_codes_keep_nothing():
    bare = migrate(FINDINGS_SCRIPT.replace("import apex\n", "import apex  # noqa\n"))
    assert (2, "XLA902") not in _codes(bare.findings)
    flake8 = migrate(FINDINGS_SCRIPT.replace("import apex\n", "import apex  # noqa: F401\n"))
    assert (2, "XLA902") in _codes(flake8.findings)
    assert not [f for f in flake8.findings if f.code == "XLA002"]  # F401 is not ours to report


def test_unused_and_unknown_noqa_codes_are_reported_as_xla002():
    script = "import torch\nx = 1  # noqa: XLA501\ny = 2  # noqa:XLA999,E501\n"
    result = migrate(script)
    unused = [f for f in result.findings if f.code == "XLA002"]
    assert [(f.line, f.column) for f in unused] == [(2, 8), (3, 8)]
    assert "unused suppression `# noqa: XLA501`" in unused[0].message
    assert "unknown code" in unused[1].message and "XLA999" in unused[1].message
    assert unused[0].end_column == 8 + len("# noqa: XLA501")
    assert not [f for f in migrate(script, ignore="XLA002").findings if f.code == "XLA002"]
    # A rule left out of the run: its noqa is not called unused (ruff's RUF100 does the same).
    assert not [f for f in migrate(script, select="XLA1").findings if "XLA501" in f.message]


def test_skip_file_and_off_on_blocks():
    skipped = migrate("# xla-migrate: skip-file\n" + FINDINGS_SCRIPT)
    assert not skipped.changed and skipped.changes == [] and skipped.findings == []
    block = FINDINGS_SCRIPT.replace("model =", "# xla-migrate: off\nmodel =").replace("y =", "# xla-migrate: on\ny =")
    result = migrate(block)
    assert "model = torch.nn.Linear(4, 2).cuda()" in result.code  # inside the block: kept
    assert "y = torch.zeros(2).to(device)" in result.code  # after it: migrated
    assert result.changed


def test_suppressions_through_the_cli_and_per_file_ignores(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.xla-migrate]\nper-file-ignores = { "scripts/*.py" = ["XLA9"] }\n')
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "eval.py").write_text(FINDINGS_SCRIPT)
    (tmp_path / "train.py").write_text(FINDINGS_SCRIPT.replace(".cuda()\ny", ".cuda()  # noqa: XLA101\ny"))
    tree = run_cli(".", "--check", "--output-format", "json", cwd=tmp_path)
    data = json.loads(tree.stdout)
    by_file = {(Path(d["filename"]).as_posix(), d["code"]) for d in data if d["kind"] == "finding"}
    assert ("scripts/eval.py", "XLA902") not in by_file and ("train.py", "XLA902") in by_file
    assert ("scripts/eval.py", "XLA103") in by_file  # XLA9 only
    single = run_cli("scripts/eval.py", "--check", "--output-format", "json", cwd=tmp_path)
    assert "XLA902" not in {d["code"] for d in json.loads(single.stdout)}
    train_changes = [d for d in data if d["filename"].endswith("train.py") and d["kind"] == "change"]
    assert not [d for d in train_changes if d["location"]["row"] == 3 and d["message"].startswith(".cuda()")]
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "pyproject.toml").write_text('[tool.xla-migrate]\nper-file-ignores = { "x.py" = ["XLA777"] }\n')
    (bad / "x.py").write_text(CUDA_SCRIPT)
    refused = run_cli("x.py", "--check", cwd=bad)
    assert refused.returncode == 2 and b"unknown rule code or prefix: XLA777" in refused.stderr


# CI -----------------------------------------------------------------------------------------------------------
def test_exit_non_zero_on_findings_flag_and_config(tmp_path):
    (tmp_path / "train.py").write_text(FINDINGS_SCRIPT)
    (tmp_path / "clean.py").write_text("import torch\nx = torch.zeros(2)\n")
    migrated = run_cli("train.py", "--out", "out.py", cwd=tmp_path)
    assert migrated.returncode == 0  # findings alone do not fail a run by default
    strict = run_cli("train.py", "--out", "out.py", "--exit-non-zero-on-findings", cwd=tmp_path)
    assert strict.returncode == 1
    assert run_cli("clean.py", "--check", "--exit-non-zero-on-findings", cwd=tmp_path).returncode == 0
    tree = run_cli(".", "--diff", "--exit-non-zero-on-findings", "--extend-exclude", "out.py", cwd=tmp_path)
    assert tree.returncode == 1
    (tmp_path / "pyproject.toml").write_text("[tool.xla-migrate]\nexit-non-zero-on-findings = true\n")
    assert run_cli("train.py", "--out", "out.py", cwd=tmp_path).returncode == 1


def test_github_annotations_on_stdout_with_ranges(tmp_path):
    (tmp_path / "train.py").write_text(FINDINGS_SCRIPT)
    done = run_cli("train.py", "--check", "--format", "github", cwd=tmp_path)
    lines = done.stdout.decode().splitlines()
    stream = [line for line in lines if ",title=XLA103::" in line]
    assert stream == ["::warning file=train.py,line=5,col=5,endLine=5,endColumn=22,title=XLA103::"
                      + stream[0].split("::", 2)[2]]
    assert not any(line.startswith("::") for line in done.stderr.decode().splitlines())
    refused = run_cli("train.py", "--diff", "--format", "github", cwd=tmp_path)
    assert refused.returncode == 2 and b"--report PATH" in refused.stderr


# Machine-readable formats -----------------------------------------------------------------------------------
def test_output_format_json_is_rufflike(tmp_path):
    (tmp_path / "train.py").write_text(FINDINGS_SCRIPT)
    (tmp_path / "other.py").write_text(CUDA_SCRIPT)
    done = run_cli(".", "--check", "--output-format", "json", cwd=tmp_path)
    assert done.returncode == 1
    data = json.loads(done.stdout)
    # What a ruff consumer does with ruff's --output-format json.
    filenames = [d["filename"] for d in data]
    assert {Path(f).name for f in filenames} == {"train.py", "other.py"}
    stream = next(d for d in data if d["code"] == "XLA103")
    assert stream["location"] == {"row": 5, "column": 5} and stream["end_location"] == {"row": 5, "column": 22}
    assert stream["kind"] == "finding" and stream["fix"]["applicability"] == "manual"
    assert stream["url"].startswith("xla-migrate rule XLA103")
    assert {d["kind"] for d in data} == {"finding", "change"}
    assert set(stream) >= {"filename", "location", "end_location", "code", "message", "fix", "url"}
    # The nested report is json-report (today's), and the alias --format takes the same names.
    nested = json.loads(run_cli(".", "--check", "--format", "json-report", cwd=tmp_path).stdout)
    assert nested["schema"] == "xla-migrate-report" and len(nested["files"]) == 2


def _structural_sarif_check(log: dict) -> None:
    """The parts of SARIF 2.1.0 a code-scanning upload reads, checked without the official schema."""
    schema = {
        "type": "object", "required": ["version", "runs"],
        "properties": {
            "version": {"const": "2.1.0"},
            "runs": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["tool", "results"],
                "properties": {
                    "tool": {"type": "object", "required": ["driver"], "properties": {"driver": {
                        "type": "object", "required": ["name", "rules"],
                        "properties": {"rules": {"type": "array", "items": {
                            "type": "object", "required": ["id", "shortDescription"]}}}}}},
                    "results": {"type": "array", "items": {
                        "type": "object", "required": ["message", "locations", "level"],
                        "properties": {
                            "level": {"enum": ["none", "note", "warning", "error"]},
                            "kind": {"enum": ["notApplicable", "pass", "fail", "review", "open", "informational"]},
                            "message": {"type": "object", "required": ["text"]},
                            "locations": {"type": "array", "items": {"type": "object", "properties": {
                                "physicalLocation": {"type": "object", "required": ["artifactLocation"],
                                                     "properties": {"region": {"type": "object", "properties": {
                                                         "startLine": {"type": "integer", "minimum": 1},
                                                         "startColumn": {"type": "integer", "minimum": 1},
                                                         "endLine": {"type": "integer", "minimum": 1},
                                                         "endColumn": {"type": "integer", "minimum": 1}}}}}}}},
                        }}},
                }}},
        },
    }
    jsonschema.validate(log, schema)


OFFICIAL_SARIF_SCHEMA = Path(__file__).parent / "data" / "sarif" / "sarif-schema-2.1.0.json"  # OASIS's; NOTICE.md


def _official_sarif_check(log: dict) -> None:
    """Against the official SARIF 2.1.0 schema (Errata 01, vendored unmodified with OASIS's notice)."""
    schema = json.loads(OFFICIAL_SARIF_SCHEMA.read_text(encoding="utf-8"))
    validator = jsonschema.validators.validator_for(schema)
    validator(schema, format_checker=validator.FORMAT_CHECKER).validate(log)


def test_sarif_output_validates(tmp_path):
    """SARIF 2.1.0: the parts a code-scanning upload reads, and the whole log against the official OASIS
    schema; a script, a file that cannot be parsed and a notebook (results by cell) in one run."""
    import nbformat

    (tmp_path / "train.py").write_text(FINDINGS_SCRIPT)
    (tmp_path / "bad.py").write_text("import torch\nx = (\n")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import torch\nx = torch.zeros(2).cuda()\n!nvidia-smi")]
    nbformat.write(nb, str(tmp_path / "nb.ipynb"))
    done = run_cli(".", "--check", "--output-format", "sarif", cwd=tmp_path)
    assert done.returncode == 2  # bad.py
    log = json.loads(done.stdout)
    _structural_sarif_check(log)
    _official_sarif_check(log)
    (run,) = log["runs"]
    rule_ids = [rule["id"] for rule in run["tool"]["driver"]["rules"]]
    assert "XLA103" in rule_ids and "XLA101" in rule_ids and "XLA003" in rule_ids
    stream = next(r for r in run["results"] if r.get("ruleId") == "XLA103")
    assert stream["level"] == "warning" and rule_ids[stream["ruleIndex"]] == "XLA103"
    assert stream["locations"][0]["physicalLocation"]["region"] == {
        "startLine": 5, "startColumn": 5, "endLine": 5, "endColumn": 22}
    assert any(r["level"] == "error" and "bad.py" in r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
               for r in run["results"])
    assert any(r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "nb.ipynb" for r in run["results"])
    # A clean run is a valid log too, and stdin's results carry --stdin-filename.
    clean = run_cli("-", "--check", "--output-format", "sarif", "--stdin-filename", "src/t.py", cwd=tmp_path,
                    stdin=CUDA_SCRIPT.encode())
    clean_log = json.loads(clean.stdout)
    _official_sarif_check(clean_log)
    assert {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
            for r in clean_log["runs"][0]["results"]} == {"src/t.py"}
    # The schema does reject what is not SARIF (so the checks above can fail).
    broken = json.loads(done.stdout)
    broken["runs"][0]["results"][0]["level"] = "severe"
    with pytest.raises(jsonschema.ValidationError):
        _official_sarif_check(broken)
    with pytest.raises(jsonschema.ValidationError):
        _official_sarif_check({**log, "version": "2.0.0"})


# Selection ----------------------------------------------------------------------------------------------------
def test_all_extend_select_and_extend_ignore():
    every = migrate(FINDINGS_SCRIPT, select="ALL")
    assert _codes(every.changes) == _codes(migrate(FINDINGS_SCRIPT).changes)
    assert migrate(FINDINGS_SCRIPT, ignore="ALL").changes == []
    assert not migrate(FINDINGS_SCRIPT, ignore="ALL").findings


def test_extend_options_on_the_command_line_and_in_the_config(tmp_path):
    (tmp_path / "train.py").write_text(FINDINGS_SCRIPT)

    def codes(*args):
        done = run_cli("train.py", "--check", "--output-format", "json", *args, cwd=tmp_path)
        assert done.returncode in (0, 1), done.stderr
        return {d["code"] for d in json.loads(done.stdout)}

    assert codes("--select", "XLA1") == {"XLA101", "XLA103"}
    assert codes("--select", "XLA1", "--extend-select", "XLA902") == {"XLA101", "XLA103", "XLA902"}
    assert "XLA103" not in codes("--extend-ignore", "XLA103")
    assert codes("--select", "ALL") == codes()
    (tmp_path / "pyproject.toml").write_text('[tool.xla-migrate]\nselect = ["XLA1"]\nextend-select = ["XLA902"]\n'
                                             'extend-ignore = ["XLA103"]\n')
    assert codes() == {"XLA101", "XLA902"}
    bad = run_cli("train.py", "--check", "--extend-select", "XLA777", cwd=tmp_path)
    assert bad.returncode == 2 and b"unknown rule code or prefix: XLA777" in bad.stderr


def test_show_settings_show_files_and_verbose_config(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.xla-migrate]\ntarget = "2.9"\nextend-exclude = ["gen/"]\n')
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text(CUDA_SCRIPT)
    (tmp_path / "src" / "notes.txt").write_text("x")
    (tmp_path / "gen").mkdir()
    (tmp_path / "gen" / "made.py").write_text(CUDA_SCRIPT)
    shown = run_cli(".", "--show-settings", "--safe-only", cwd=tmp_path)
    assert shown.returncode == 0
    settings = dict(line.split(" = ", 1) for line in shown.stdout.decode().splitlines())
    assert json.loads(settings["config"]) == str(tmp_path / "pyproject.toml")
    assert json.loads(settings["target"]) == "2.9" and json.loads(settings["fix-safety"]) == "safe"
    assert json.loads(settings["extend-exclude"]) == ["gen/"]
    files = run_cli(".", "--show-files", cwd=tmp_path)
    assert files.returncode == 0 and files.stdout.decode().splitlines() == ["src/train.py"]
    assert (tmp_path / "src" / "train.py").read_text() == CUDA_SCRIPT  # nothing migrated
    verbose = run_cli("src/train.py", "--check", "-v", cwd=tmp_path)
    assert f"configuration: {tmp_path / 'pyproject.toml'} [tool.xla-migrate]" in verbose.stderr.decode()


def test_underscore_table_is_an_error_not_ignored(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.xla_migrate]\ntarget = "2.9"\n')
    (tmp_path / "train.py").write_text(CUDA_SCRIPT)
    done = run_cli("train.py", "--check", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.decode().strip().endswith(
        "[tool.xla_migrate] is not read: the table is [tool.xla-migrate] (a hyphen)")


# Codes ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("code", ["XLA000", "XLA001", "XLA002", "XLA003", "XLA004"])
def test_engine_codes_are_rule_pages(code, tmp_path):
    page = run_cli("rule", code, cwd=tmp_path)
    assert page.returncode == 0 and page.stdout.decode().startswith(f"# {code} ")
    assert (ROOT / "docs" / "rules" / f"{code}.md").is_file()
    assert code in run_cli("--list-rules", cwd=tmp_path).stdout.decode()
    (tmp_path / "train.py").write_text(CUDA_SCRIPT)
    for option in ("--ignore", "--select"):
        assert run_cli("train.py", "--check", option, code, cwd=tmp_path).returncode in (0, 1)


def test_ignoring_an_engine_code_drops_its_findings(tmp_path):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import torch\nx = torch.zeros(2).cuda()"),
                nbformat.v4.new_code_cell("y = torch.zeros(2).cuda(\nz = (1,")]
    nbformat.write(nb, str(tmp_path / "nb.ipynb"))
    found = json.loads(run_cli("nb.ipynb", "--check", "--output-format", "json", cwd=tmp_path).stdout)
    assert [(d["code"], d["cell"]) for d in found if d["kind"] == "finding"] == [("XLA001", 2)]
    ignored = json.loads(run_cli("nb.ipynb", "--check", "--output-format", "json", "--ignore", "XLA001",
                                 cwd=tmp_path).stdout)
    assert not [d for d in ignored if d["code"] == "XLA001"]


# --safe-only ------------------------------------------------------------------------------------------------
def test_safe_only_edits_with_safe_rules_and_reports_the_others(tmp_path):
    script = "import torch\nx = torch.zeros(2).cuda()\ntorch.cuda.synchronize()\n"
    result = migrate(script, fix_safety="safe")
    assert "x = torch.zeros(2).to(device)" in result.code and "torch.cuda.synchronize()" in result.code
    (reported,) = [f for f in result.findings if f.code == "XLA102"]
    assert reported.message.startswith("not applied (fix safety: review)") and reported.line == 3
    assert "torch.cuda.synchronize()" not in migrate(script).code  # removed when every fix is allowed
    with pytest.raises(ValueError, match="fix_safety"):
        migrate(script, fix_safety="unsafe")
    (tmp_path / "t.py").write_text(script)
    done = run_cli("t.py", "--out", "-", "--safe-only", cwd=tmp_path)
    assert b"torch.cuda.synchronize()" in done.stdout and b"XLA102 not applied" in done.stderr
    (tmp_path / "pyproject.toml").write_text('[tool.xla-migrate]\nfix-safety = "safe"\n')
    assert b"torch.cuda.synchronize()" in run_cli("t.py", "--out", "-", cwd=tmp_path).stdout
    (tmp_path / "pyproject.toml").write_text('[tool.xla-migrate]\nfix-safety = "some"\n')
    assert run_cli("t.py", "--out", "-", cwd=tmp_path).returncode == 2


# Completion, --verify --python, verify --help ---------------------------------------------------------------
def test_shell_completion_through_typer(tmp_path):
    for instruction in ("bash_source", "source_bash"):  # click's order, and typer's
        script = run_cli(cwd=tmp_path, env={"_XLA_MIGRATE_COMPLETE": instruction})
        assert script.returncode == 0 and b"_xla_migrate_completion()" in script.stdout
    completed = run_cli(cwd=tmp_path, env={"_XLA_MIGRATE_COMPLETE": "bash_complete",
                                          "COMP_WORDS": "xla-migrate --output-f", "COMP_CWORD": "1"})
    assert completed.stdout.decode().split() == ["--output-format"]
    assert b"--install-completion" in run_cli("--help", cwd=tmp_path).stdout


def test_verify_takes_python_and_its_help_has_no_type_tags(tmp_path):
    (tmp_path / "train.py").write_text(CUDA_SCRIPT)
    done = run_cli("train.py", "--out", "train_xla.py", "--verify", "--python", str(tmp_path / "nope"), cwd=tmp_path)
    assert done.returncode == 2 and (tmp_path / "train_xla.py").is_file()
    assert done.stderr.decode().splitlines()[-1] == f"error: --python {tmp_path / 'nope'}: no such interpreter"
    alone = run_cli("train.py", "--out", "other.py", "--python", "python3", cwd=tmp_path)
    assert alone.returncode == 2 and b"pass --verify too" in alone.stderr and not (tmp_path / "other.py").exists()
    help_text = run_cli("verify", "--help", cwd=tmp_path).stdout.decode()
    assert help_text.startswith("Usage: xla-migrate verify [OPTIONS] SCRIPT [-- SCRIPT ARGS...]\n")
    assert "<str>" not in help_text and "<list" not in help_text and "{SCRIPT}" not in help_text


# Notebooks: CUDA in IPython lines -----------------------------------------------------------------------------
def test_cuda_in_magics_and_shell_lines_is_reported_with_cell_and_line(tmp_path):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import torch\nx = torch.zeros(2).cuda()\n%timeit torch.cuda.synchronize()"),
                nbformat.v4.new_markdown_cell("text"),
                nbformat.v4.new_code_cell("!nvidia-smi\n!ls"),
                nbformat.v4.new_code_cell("%%bash\necho hi\nnvidia-smi -L")]
    nbformat.write(nb, str(tmp_path / "nb.ipynb"))
    data = json.loads(run_cli("nb.ipynb", "--check", "--output-format", "json", cwd=tmp_path).stdout)
    found = [(d["cell"], d["location"]["row"], d["location"]["column"]) for d in data if d["code"] == "XLA003"]
    assert found == [(1, 3, 15), (3, 1, 2), (4, 3, 1)]
    text = run_cli("nb.ipynb", "--check", cwd=tmp_path).stderr.decode()
    assert "nb.ipynb:cell 3:line 1: XLA003 CUDA in an IPython line" in text and "`!nvidia-smi`" in text
    # A notebook with CUDA only in shell lines is still reported; --ignore XLA003 drops them.
    nb.cells = nb.cells[2:]
    nbformat.write(nb, str(tmp_path / "shell.ipynb"))
    shell = run_cli("shell.ipynb", "--check", "--exit-non-zero-on-findings", cwd=tmp_path)
    assert shell.returncode == 1 and shell.stderr.decode().count(": XLA003 ") == 2
    quiet = run_cli("shell.ipynb", "--check", "--exit-non-zero-on-findings", "--ignore", "XLA003", cwd=tmp_path)
    assert quiet.returncode == 0 and b"XLA003" not in quiet.stderr


# stdin ------------------------------------------------------------------------------------------------------
def _notebook(cells: list[str]) -> bytes:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nbformat.writes(nb).encode()


def test_stdin_alone_is_a_filter_to_stdout(tmp_path):
    done = run_cli("-", cwd=tmp_path, stdin=CUDA_SCRIPT.encode())
    assert done.returncode == 0 and done.stdout.decode() == migrate(CUDA_SCRIPT).code
    assert list(tmp_path.iterdir()) == []  # nothing written anywhere
    assert done.stderr.decode().startswith("stdin: ")
    # --stdin-filename alone reads stdin too (ruff's); another input with it is refused.
    named = run_cli("--stdin-filename", "t.py", cwd=tmp_path, stdin=CUDA_SCRIPT.encode())
    assert named.returncode == 0 and named.stdout == done.stdout and named.stderr.decode().startswith("t.py: ")
    (tmp_path / "other.py").write_text(CUDA_SCRIPT)
    both = run_cli("other.py", "--stdin-filename", "t.py", cwd=tmp_path, stdin=CUDA_SCRIPT.encode())
    assert both.returncode == 2 and b"cannot be combined with other inputs" in both.stderr
    # --check and --diff keep their meaning; a stdout report needs a mode that leaves stdout free.
    check = run_cli("-", "--check", cwd=tmp_path, stdin=CUDA_SCRIPT.encode())
    assert check.returncode == 1 and check.stdout == b""
    clean = run_cli("-", "--check", cwd=tmp_path, stdin=b"import torch\nx = torch.zeros(2)\n")
    assert clean.returncode == 0
    report = run_cli("-", "--output-format", "json", cwd=tmp_path, stdin=CUDA_SCRIPT.encode())
    assert report.returncode == 2 and b"pass --check for the report alone" in report.stderr
    assert report.stdout == b""
    checked = run_cli("-", "--check", "--output-format", "json", "--stdin-filename", "src/t.py", cwd=tmp_path,
                      stdin=CUDA_SCRIPT.encode())
    assert checked.returncode == 1 and {d["filename"] for d in json.loads(checked.stdout)} == {"src/t.py"}


def test_stdin_filename_names_the_diff_and_keys_the_config(tmp_path):
    import subprocess

    (tmp_path / "pyproject.toml").write_text(
        '[tool.xla-migrate]\ntarget = "2.9"\nextend-exclude = ["gen/"]\n'
        'per-file-ignores = { "scripts/*.py" = ["XLA9"] }\n')
    diff = run_cli("-", "--diff", "--stdin-filename", "train.py", cwd=tmp_path, stdin=CUDA_SCRIPT.encode())
    assert diff.returncode == 0
    assert diff.stdout.decode().startswith("diff --git a/train.py b/train.py\n--- a/train.py\n+++ b/train.py\n")
    assert "torch_xla.device()" in diff.stdout.decode()  # the config's target 2.9, found from the name
    (tmp_path / "train.py").write_text(CUDA_SCRIPT)  # the diff applies to the file it names
    # NAME an existing file of the project: migrated as the file run migrates it (project index and all).
    named = run_cli("-", "--diff", "--stdin-filename", "train.py", cwd=tmp_path, stdin=CUDA_SCRIPT.encode())
    assert named.stdout == run_cli("train.py", "--diff", cwd=tmp_path).stdout
    subprocess.run(["git", "apply", "-"], cwd=tmp_path, input=named.stdout, check=True)
    assert (tmp_path / "train.py").read_bytes() == run_cli(
        "-", "--stdin-filename", "train.py", cwd=tmp_path, stdin=CUDA_SCRIPT.encode()).stdout
    # per-file-ignores keyed on the name: XLA902 (apex) is ignored in scripts/ only.
    codes = {}
    for name in ("scripts/eval.py", "eval.py"):
        done = run_cli("-", "--check", "--output-format", "json", "--stdin-filename", name, cwd=tmp_path,
                       stdin=FINDINGS_SCRIPT.encode())
        codes[name] = {d["code"] for d in json.loads(done.stdout)}
    assert "XLA902" not in codes["scripts/eval.py"] and "XLA902" in codes["eval.py"]
    # The config is found from the name's folder: a project below with its own target.
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "pyproject.toml").write_text('[tool.xla-migrate]\ntarget = "sagemaker"\n')
    below = run_cli("-", "--stdin-filename", "sub/t.py", "-v", cwd=tmp_path, stdin=CUDA_SCRIPT.encode())
    assert b"xm.xla_device()" in below.stdout
    assert f"configuration: {tmp_path / 'sub' / 'pyproject.toml'}" in below.stderr.decode()
    # --force-exclude with an excluded name: stdin comes back unchanged, as ruff format does.
    for name in ("gen/made.py", "build/x.py"):
        passed = run_cli("-", "--force-exclude", "--stdin-filename", name, cwd=tmp_path, stdin=CUDA_SCRIPT.encode())
        assert passed.returncode == 0 and passed.stdout == CUDA_SCRIPT.encode()
        assert b"passed through unchanged" in passed.stderr
    unforced = run_cli("-", "--stdin-filename", "gen/made.py", cwd=tmp_path, stdin=CUDA_SCRIPT.encode())
    assert unforced.stdout != CUDA_SCRIPT.encode()  # as in ruff, excludes bind a named input only when forced


def test_a_notebook_on_stdin_is_migrated_as_a_notebook(tmp_path):
    import nbformat

    data = _notebook(["import torch", "x = torch.zeros(2).cuda()\n%timeit torch.cuda.synchronize()"])
    (tmp_path / "nb.ipynb").write_bytes(data)
    as_file = run_cli("nb.ipynb", "--out", "nb_xla.ipynb", cwd=tmp_path)
    assert as_file.returncode == 0
    expected = (tmp_path / "nb_xla.ipynb").read_bytes()
    named = run_cli("-", "--stdin-filename", "nb.ipynb", cwd=tmp_path, stdin=data)
    assert named.returncode == 0 and named.stdout == expected  # the same notebook a file run writes
    cells = [cell.source for cell in nbformat.reads(named.stdout.decode(), as_version=4).cells]
    assert "xm.xla_device()" in cells[0] and "x = torch.zeros(2).to(device)" in cells[1]
    assert "nb.ipynb:cell 2:line 2: XLA003" in named.stderr.decode()  # the magic, reported with its cell
    # Without a name, recognised by its content, not read as a Python dict literal with nothing to change.
    unnamed = run_cli("-", cwd=tmp_path, stdin=data)
    assert unnamed.returncode == 0 and unnamed.stdout == expected
    diff = run_cli("-", "--diff", "--stdin-filename", "nb.ipynb", cwd=tmp_path, stdin=data)
    assert diff.stdout.decode().startswith("diff --git a/nb.ipynb b/nb.ipynb\n")
    check = run_cli("-", "--check", "--stdin-filename", "nb.ipynb", cwd=tmp_path, stdin=data)
    assert check.returncode == 1 and check.stdout == b""
    # A notebook under a Python name is refused, not a silent no-op; a broken one writes nothing.
    misnamed = run_cli("-", "--stdin-filename", "nb.py", cwd=tmp_path, stdin=data)
    assert misnamed.returncode == 2 and b"stdin holds a Jupyter notebook" in misnamed.stderr
    assert misnamed.stdout == b""
    broken = run_cli("-", "--stdin-filename", "nb.ipynb", "--out", "broken.ipynb", cwd=tmp_path, stdin=data[:40])
    assert broken.returncode == 2 and b"nb.ipynb: not a valid notebook" in broken.stderr
    assert broken.stdout == b"" and not (tmp_path / "broken.ipynb").exists()


# Defaults -----------------------------------------------------------------------------------------------------
def test_env_folders_are_migrated_unless_they_are_virtual_environments(tmp_path):
    """An RL repository's env/ package is code (ruff does not skip it); a folder with a pyvenv.cfg is a
    virtual environment, whatever its name, and skipped with the default excludes."""
    for folder in ("env", ".env", "pyenv311", "pkg/venv_custom"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "step.py").write_text(CUDA_SCRIPT)
    (tmp_path / "pyenv311" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (tmp_path / "pkg" / "venv_custom" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    files = run_cli(".", "--show-files", cwd=tmp_path).stdout.decode().splitlines()
    assert files == [".env/step.py", "env/step.py"]
    check = run_cli(".", "--check", cwd=tmp_path)
    assert check.returncode == 1 and b"env/step.py: would change" in check.stderr
    assert b"pyenv311" not in check.stderr and b"venv_custom" not in check.stderr
    # A file named inside one: migrated (the user named it), skipped with --force-exclude (pre-commit).
    named = run_cli("pyenv311/step.py", "--check", cwd=tmp_path)
    assert named.returncode == 1
    forced = run_cli("pyenv311/step.py", "--check", "--force-exclude", cwd=tmp_path)
    assert forced.returncode == 0 and b"every path given is excluded" in forced.stderr
    # exclude replaces the defaults, the virtual-environment rule with them (exclude = [] turns all off).
    every = run_cli(".", "--show-files", "--exclude", "nothing/", cwd=tmp_path).stdout.decode().splitlines()
    assert "pyenv311/step.py" in every and "pkg/venv_custom/step.py" in every


def test_the_deliberate_worker_crashes_keep_their_dumps_out_of_the_test_log(tmp_path):
    """tests/test_workers.py segfaults a worker on purpose; the log of a run of those tests (pytest's
    faulthandler on, as in CI) holds no "Fatal Python error" dump, only the tests' results."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_workers.py",
                           "-k", "crash"], cwd=ROOT, capture_output=True, timeout=600)
    log = (done.stdout + done.stderr).decode(errors="replace")
    assert done.returncode == 0, log
    assert " passed" in log and "Fatal Python error" not in log and "Segmentation fault" not in log


# Bad input (issue 33's sweep): a notebook that cannot be read writes nothing, by file or by stdin ---------
@pytest.mark.parametrize("content", [b"{not json", b"", b'{"nbformat": 3, "cells": []}', b"\xff\xfe",
                                     b'{"nbformat": 4, "nbformat_minor": 5, "metadata": {}}',
                                     b'{"nbformat": 4, "cells": "x"}', b"[]", b"null"],
                         ids=["invalid-json", "empty", "nbformat-3", "not-utf8", "no-cells", "cells-not-a-list",
                              "a-list", "null"])
def test_a_notebook_that_cannot_be_read_is_one_line_and_writes_nothing(tmp_path, content):
    (tmp_path / "nb.ipynb").write_bytes(content)
    for args, stdin in ((["nb.ipynb", "--out", "out.ipynb"], None), (["nb.ipynb", "--in-place"], None),
                        (["-", "--stdin-filename", "nb.ipynb", "--out", "out.ipynb"], content),
                        (["-", "--stdin-filename", "nb.ipynb"], content)):
        done = run_cli(*args, cwd=tmp_path, stdin=stdin)
        assert done.returncode == 2, (args, done.stderr)
        errors = [line for line in done.stderr.decode().splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and errors[0].startswith("error: nb.ipynb: "), (args, done.stderr)
        assert "object has no attribute" not in errors[0]  # said in the user's terms
        assert done.stdout == b"" and not (tmp_path / "out.ipynb").exists()
        assert (tmp_path / "nb.ipynb").read_bytes() == content


# Docs true ---------------------------------------------------------------------------------------------------
def test_the_guide_documents_every_option_and_names_every_dependency():
    import re

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    from typer.main import get_command

    from xla_migrate.cli.typer_app import app

    guide = (ROOT / "docs" / "guide.md").read_text(encoding="utf-8")
    options = {name for param in get_command(app).params for name in param.opts if name.startswith("--")}
    assert "--stdin-filename" in options and "--safe-only" in options
    undocumented = sorted(name for name in options if f"`{name}" not in guide)
    assert undocumented == [], f"options missing from docs/guide.md: {undocumented}"
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [re.split(r"[<>=;\[ ]", spec, maxsplit=1)[0] for spec in dependencies]
    install = guide[guide.index("## Install"):guide.index("## Command line")]
    assert [name for name in names if name not in install] == [], install
    assert "Coming from ruff" in guide and "--stdin-filename" in guide[guide.index("### Coming from ruff"):]
