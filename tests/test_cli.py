"""The command line, through typer's CliRunner (fast, in-process) and a real subprocess (as users run it)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from helpers import CUDA_SCRIPT, NO_CUDA_SCRIPT, ROOT, run_cli, tree_snapshot
from typer.testing import CliRunner

from xla_migrate import cli
from xla_migrate.cli import output
from xla_migrate import migrate

runner = CliRunner()


def invoke(*args: str, input: bytes | None = None):
    return runner.invoke(cli.app, list(args), input=input)


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(CUDA_SCRIPT)
    return path


def test_out_writes_the_migrated_file_and_a_summary(script, tmp_path):
    out = tmp_path / "train_xla.py"
    result = invoke("--in", str(script), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == migrate(CUDA_SCRIPT).output_bytes
    assert "xm.xla_device()" in out.read_text()
    assert script.read_text() == CUDA_SCRIPT
    assert "changes" in result.stderr and "target sagemaker" in result.stderr
    assert result.stdout == ""


def test_diff_prints_the_diff_and_writes_nothing(script, tmp_path):
    before = tree_snapshot(tmp_path)
    result = invoke("--in", str(script), "--diff")
    assert result.exit_code == 0
    assert result.stdout.startswith(f"diff --git a/{str(script).lstrip('/')}")
    assert "+model = torch.nn.Linear(4, 2).to(device)" in result.stdout
    assert tree_snapshot(tmp_path) == before


def test_diff_file_writes_the_diff(script, tmp_path):
    diff_path = tmp_path / "train.diff"
    result = invoke("--in", str(script), "--diff-file", str(diff_path))
    assert result.exit_code == 0
    assert diff_path.read_text() == migrate(CUDA_SCRIPT, path=str(script)).diff


@pytest.mark.parametrize(("source", "code"), [(CUDA_SCRIPT, 1), (NO_CUDA_SCRIPT, 0)])
def test_check_exit_code(tmp_path, source, code):
    path = tmp_path / "t.py"
    path.write_text(source)
    result = invoke("--in", str(path), "--check")
    assert result.exit_code == code
    assert path.read_text() == source
    assert {p.name for p in tmp_path.iterdir()} == {"t.py"}


def test_stdin_to_stdout():
    result = invoke("--in", "-", "--out", "-", input=CUDA_SCRIPT.encode())
    assert result.exit_code == 0
    assert result.stdout == migrate(CUDA_SCRIPT).code


def test_target_29_uses_current_spellings(script):
    result = invoke("--in", str(script), "--out", "-", "--target", "2.9")
    assert "torch_xla.device()" in result.stdout
    assert "xla_device" not in result.stdout


@pytest.mark.parametrize("args", [("--ignore", "XLA101"), ("--select", "XLA8"), ("--ignore", "XLA1")])
def test_select_and_ignore(script, args):
    result = invoke("--in", str(script), "--out", "-", *args)
    if "--select" in args:  # unknown prefix: a usage error
        assert result.exit_code == 2
        assert "unknown rule code or prefix: XLA8" in result.stderr
    else:
        assert result.exit_code == 0
        assert result.stdout == CUDA_SCRIPT


def test_select_accepts_comma_lists(script):
    result = invoke("--in", str(script), "--out", "-", "--select", "XLA101,XLA1")
    assert result.exit_code == 0 and "xla_device" in result.stdout


def test_list_rules_and_version():
    rules = invoke("--list-rules")
    assert rules.exit_code == 0 and "XLA101" in rules.stdout and "cuda-device-to-xla" in rules.stdout
    version = invoke("--version")
    assert version.exit_code == 0 and version.stdout.startswith("xla-migrate 0.")


def test_quiet_and_verbose(script, tmp_path):
    quiet = invoke("--in", str(script), "--out", str(tmp_path / "o.py"), "-q")
    assert quiet.exit_code == 0 and quiet.stderr == ""
    verbose = invoke("--in", str(script), "--out", str(tmp_path / "o.py"), "-v")
    assert f"{script}:3:10: XLA101" in verbose.stderr


def test_in_place_rewrites_and_leaves_unchanged_files_alone(script, tmp_path):
    result = invoke("--in", str(script), "--in-place")
    assert result.exit_code == 0
    assert "xla_device" in script.read_text()
    clean = tmp_path / "clean.py"
    clean.write_text(NO_CUDA_SCRIPT)
    os.utime(clean, (1_000_000, 1_000_000))
    assert invoke("--in", str(clean), "--in-place").exit_code == 0
    assert clean.stat().st_mtime == 1_000_000


BAD_INPUTS = {
    "syntax": (b"def f(:\n    pass\n", "cannot parse"),
    "python2": (b'print "hello"\n', "cannot parse: Missing parentheses in call to 'print'"),
    "latin1": ('x = "caf\u00e9".cuda()\n'.encode("latin-1"), "not valid utf-8"),
    "binary": (b"\x7fELF\x00\x01\x02", "binary file"),
}


@pytest.mark.parametrize("kind", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, kind):
    data, message = BAD_INPUTS[kind]
    source = tmp_path / "bad.py"
    source.write_bytes(data)
    out = tmp_path / "out.py"
    result = invoke("--in", str(source), "--out", str(out))
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {source}:") and message in lines[0]
    assert not out.exists()
    assert source.read_bytes() == data


def test_syntax_error_names_line_and_column(tmp_path):
    source = tmp_path / "train.py"
    source.write_text("import torch\n\nx = (1,\n")
    result = invoke("--in", str(source), "--diff")
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {source}:3:5: cannot parse:")


@pytest.mark.parametrize("case", ["missing", "directory", "same-file", "nothing-to-do", "out-is-dir", "bad-target",
                                  "in-place-and-out"])
def test_usage_errors(tmp_path, script, case):
    args = {
        "missing": ["--in", str(tmp_path / "nope.py"), "--diff"],
        "directory": ["--in", str(tmp_path), "--out", str(script)],  # a folder mirrors into a folder only
        "same-file": ["--in", str(script), "--out", str(script)],
        "nothing-to-do": ["--in", str(script)],
        "out-is-dir": ["--in", str(script), "--out", str(tmp_path)],
        "bad-target": ["--in", str(script), "--diff", "--target", "1.0"],
        "in-place-and-out": ["--in", str(script), "--in-place", "--out", str(tmp_path / "x.py")],
    }[case]
    before = tree_snapshot(tmp_path)
    result = invoke(*args)
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: ")
    assert tree_snapshot(tmp_path) == before


def test_unwritable_output_folder(tmp_path, script):
    # A parent that is a file cannot hold the output, whoever runs the test (permission bits do not
    # stop root, which CI runs as).
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")
    result = invoke("--in", str(script), "--out", str(blocker / "o.py"))
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: {blocker / 'o.py'}: cannot write: Not a directory"
    assert blocker.read_text() == ""


def test_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path, script, monkeypatch):
    out = tmp_path / "train_xla.py"
    out.write_text("old content\n")

    def broken_replace(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    result = invoke("--in", str(script), "--out", str(out))
    assert result.exit_code == 2 and "No space left on device" in result.stderr
    assert out.read_text() == "old content\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py", "train_xla.py"]


def test_release_warning_names_the_right_target(script, monkeypatch):
    monkeypatch.setattr(output, "_installed_torch_xla", lambda: "2.2.0")
    result = invoke("--in", str(script), "--diff", "--target", "2.9")
    assert ("warning: torch_xla 2.2.0 is installed here, but the 2.9 target's output needs torch_xla >= 2.3; "
            "use --target sagemaker") in result.stderr
    monkeypatch.setattr(output, "_installed_torch_xla", lambda: "2.9.0")
    assert "warning:" not in invoke("--in", str(script), "--diff", "--target", "2.9").stderr


class FakeTty(io.StringIO):
    def isatty(self):
        return True


def test_colour_only_on_a_tty_and_never_with_no_color(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert output._colour(FakeTty()) is True
    assert output._colour(io.StringIO()) is False
    monkeypatch.setenv("NO_COLOR", "1")
    assert output._colour(FakeTty()) is False


# A real process, as a user runs it -----------------------------------------------------------------------
def test_subprocess_end_to_end(tmp_path, script):
    out = tmp_path / "train_xla.py"
    done = run_cli("--in", "train.py", "--out", "train_xla.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == migrate(CUDA_SCRIPT).output_bytes
    assert done.stderr.decode().startswith("train.py -> train_xla.py: ")
    assert done.stdout == b""
    diff = run_cli("--in", "train.py", "--diff", cwd=tmp_path, env={"NO_COLOR": "1"})
    assert diff.returncode == 0 and b"\x1b[" not in diff.stdout
    assert diff.stdout.startswith(b"diff --git a/train.py b/train.py\n--- a/train.py\n+++ b/train.py\n")
    bad = run_cli("--in", "missing.py", "--diff", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr == b"error: missing.py: no such file\n"


def test_python_dash_m_and_version_fast_path(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "xla_migrate", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip().startswith("xla-migrate ")
    # The fast path must not import the CLI framework or libcst.
    probe = subprocess.run([sys.executable, "-c", "import sys; sys.argv=['x','--version']; "
                            "from xla_migrate.__main__ import main; main(); "
                            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('typer','libcst','rich')))"],
                           capture_output=True, text=True)
    assert probe.stdout.strip().splitlines()[-1] == "[]"


# Behaving like ruff and black ------------------------------------------------------------------------------
FINDINGS_SCRIPT = '''import torch
import apex
from torch.utils.cpp_extension import load
model = torch.nn.Linear(4, 2).cuda()
s = torch.cuda.Stream()
'''


@pytest.fixture
def findings_script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(FINDINGS_SCRIPT)
    return path


def test_positional_paths_and_in_both_work(tmp_path, script):
    (tmp_path / "other.py").write_text(CUDA_SCRIPT)
    positional = run_cli("train.py", "--diff", cwd=tmp_path)
    option = run_cli("--in", "train.py", "--diff", cwd=tmp_path)
    assert positional.returncode == option.returncode == 0
    assert positional.stdout == option.stdout and positional.stdout.startswith(b"diff --git a/train.py")
    mixed = run_cli("--check", "other.py", "--in", "train.py", cwd=tmp_path)
    assert mixed.returncode == 1 and b"2 files: 2 would change" in mixed.stderr
    missing = run_cli("--check", cwd=tmp_path)
    assert missing.returncode == 2 and missing.stderr.startswith(b"error: missing PATH")


def test_help_describes_positional_paths_and_the_rule_command(tmp_path):
    done = run_cli("--help", cwd=tmp_path, env={"COLUMNS": "120"})
    text = done.stdout.decode()
    assert done.returncode == 0 and text.startswith("Usage: xla-migrate [OPTIONS] [PATH]...")
    for words in ("xla-migrate rule CODE", "--force-exclude", "--extend-exclude", "--statistics", "-qq"):
        assert words in text, words


def test_rule_command_prints_the_rule_page(tmp_path):
    done = run_cli("rule", "XLA101", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    text = done.stdout.decode()
    page = (ROOT / "docs" / "rules" / "XLA101.md").read_text()
    # The checked-in page, without its generated mark and golden fixtures (not installed with the package).
    assert page.split("\n", 2)[2].split("## Golden fixtures")[0].rstrip() in text
    assert text.rstrip().endswith("docs/rules/XLA101.md in the xla-migrate repository.")
    by_name = run_cli("rule", "cuda-device-to-xla", cwd=tmp_path)
    assert by_name.stdout == done.stdout
    as_json = json.loads(run_cli("rule", "xla101", "--format", "json", cwd=tmp_path).stdout)
    assert as_json["code"] == "XLA101" and as_json["explanation"].startswith("# XLA101 cuda-device-to-xla")
    unknown = run_cli("rule", "XLA999", cwd=tmp_path)
    assert unknown.returncode == 2 and unknown.stdout == b""
    assert unknown.stderr == b"error: unknown rule: XLA999 (xla-migrate --list-rules lists them)\n"
    # python -m goes through the same dispatch.
    module = subprocess.run([sys.executable, "-m", "xla_migrate", "rule", "XLA101"], capture_output=True, cwd=tmp_path)
    assert module.stdout == done.stdout


def test_a_file_named_like_a_subcommand_is_still_migrated(tmp_path):
    (tmp_path / "rule").write_text(CUDA_SCRIPT)
    done = run_cli("./rule", "--check", cwd=tmp_path)
    assert done.returncode == 1 and done.stderr.startswith(b"./rule: 3 changes")


def test_list_rules_as_json(tmp_path):
    done = run_cli("--list-rules", "--format", "json", cwd=tmp_path)
    rules = json.loads(done.stdout)
    from xla_migrate.engine.registry import all_codes, all_rules

    # Every code the tool can print: the engine's own (XLA000-XLA004) first, then the rules'.
    engine_codes = ["XLA000", "XLA001", "XLA002", "XLA003", "XLA004"]
    assert [r["code"] for r in rules] == all_codes() == [*engine_codes, *(r.code for r in all_rules())]
    for engine in rules[:5]:
        assert engine["fix_safety"] == "none" and (ROOT / engine["source"]).is_file()
        assert (ROOT / engine["docs"]).is_file()
    first = rules[5]
    assert set(first) == {"code", "name", "summary", "fix_safety", "targets", "on_xla_code", "source", "docs"}
    assert first["on_xla_code"] is True  # XLA101 migrates CUDA remnants in code already on XLA
    assert first["docs"] == f"docs/rules/{first['code']}.md" and (ROOT / first["docs"]).is_file()
    assert (ROOT / first["source"]).is_file()


def test_each_finding_ends_with_its_rule_and_statistics_count_them(findings_script, tmp_path):
    done = run_cli("train.py", "--check", cwd=tmp_path)
    lines = done.stderr.decode().splitlines()
    findings = [line for line in lines if ": XLA9" in line or ": XLA103" in line]
    assert len(findings) == 3
    for line in findings:
        code = line.split(": ", 2)[1].split()[0]
        assert line.endswith(f" [xla-migrate rule {code}]"), line
    stats = run_cli("train.py", "--check", "--statistics", cwd=tmp_path)
    table = stats.stderr.decode().splitlines()
    assert stats.returncode == 1
    assert table[0].split() == ["2", "XLA101", "cuda-device-to-xla", "2", "changes"]
    assert [row.split()[:2] for row in table[1:4]] == [["1", "XLA103"], ["1", "XLA901"], ["1", "XLA902"]]
    assert table[1].endswith("1 finding") and table[4].startswith("train.py: 2 changes")
    assert len(table) == 5  # the table, then the summary: no finding lines
    tree = run_cli(".", "--check", "--statistics", cwd=tmp_path)
    assert tree.stderr.decode().splitlines()[1].split() == ["2", "XLA101", "cuda-device-to-xla", "2", "changes"]
    refused = run_cli("train.py", "--check", "--statistics", "--format", "json-report", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.startswith(b"error: --statistics is a text report")


def test_quiet_hides_the_summary_and_qq_everything_but_errors(findings_script, tmp_path):
    loud = run_cli("train.py", "--check", cwd=tmp_path).stderr.decode().splitlines()
    quiet = run_cli("train.py", "--check", "-q", cwd=tmp_path).stderr.decode().splitlines()
    assert quiet == loud[:-1] and len(quiet) == 3 and loud[-1].startswith("train.py: 2 changes")
    assert run_cli("train.py", "--check", "-qq", cwd=tmp_path).stderr == b""
    (tmp_path / "bad.py").write_text("import torch\nx = (\n")
    tree_quiet = run_cli(".", "--check", "-q", cwd=tmp_path).stderr.decode().splitlines()
    assert tree_quiet[0].startswith("error: bad.py:2:")
    assert tree_quiet[-1] == "train.py: would change (2 changes)"  # no summary line
    tree_qq = run_cli(".", "--check", "-qq", cwd=tmp_path)
    assert tree_qq.returncode == 2 and tree_qq.stderr.decode().splitlines() == [tree_quiet[0]]


def test_json_report_of_one_script_on_stdout(findings_script, tmp_path):
    done = run_cli("train.py", "--check", "--format", "json-report", cwd=tmp_path)
    assert done.returncode == 1 and done.stderr == b""
    report = json.loads(done.stdout)
    assert report["version"] == 2 and report["files"][0]["path"] == "train.py"
    assert [f["code"] for f in report["files"][0]["findings"]] == ["XLA902", "XLA901", "XLA103"]
    refused = run_cli("train.py", "--out", "-", "--format", "json-report", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stdout == b""
    assert b"--report PATH" in refused.stderr and len(refused.stderr.splitlines()) == 1


def test_the_process_ends_with_all_its_output_written(tmp_path):
    """The console script skips the interpreter's teardown (__main__.console): a diff larger than a pipe's
    buffer still reaches the reader whole, with the run's exit status."""
    source = tmp_path / "many.py"
    source.write_text("import torch\n" + "".join(f"x{i} = torch.zeros({i}).cuda()\n" for i in range(3000)))
    done = run_cli("--in", str(source), "--diff", cwd=tmp_path)
    expected = invoke("--in", str(source), "--diff").stdout
    assert done.returncode == 0 and len(done.stdout) > 200_000
    assert done.stdout.decode() == expected
    failed = run_cli("--in", str(source), "--check", cwd=tmp_path)
    assert failed.returncode == 1 and source.read_text().count(".cuda()") == 3000
