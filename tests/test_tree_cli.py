"""Whole trees through the CLI: mirrors, in place, diffs and checks over many files, .gitignore and
--exclude, globs, bad files among good ones, symlink loops, parallel workers and the pre-filter."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
import subprocess

import pytest
from helpers import CUDA_SCRIPT, NO_CUDA_SCRIPT, run_cli, tree_snapshot
from typer.testing import CliRunner

from xla_migrate import cli
from xla_migrate import migrate

runner = CliRunner()
SYNTAX_ERROR = b"import torch\n\ndef f(:\n    pass\n"
LATIN1 = 'import torch\nx = "caf\u00e9".cuda()\n'.encode("latin-1")
OTHER_CUDA = "import torch\n\ndef load(x):\n    return x.cuda()\n"


def invoke(*args: str):
    return runner.invoke(cli.app, list(args))


def migrated(source: str | bytes, **kw) -> bytes:
    return migrate(source, **kw).output_bytes


@pytest.fixture
def project(tmp_path):
    """src/ with CUDA scripts, an unchanged one, a README, an ignored folder and two broken files."""
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "build").mkdir()
    (src / "train.py").write_text(CUDA_SCRIPT)
    (src / "pkg" / "model.py").write_text(OTHER_CUDA)
    (src / "pkg" / "clean.py").write_text(NO_CUDA_SCRIPT)
    (src / "README.md").write_text("# readme\n")
    (src / "build" / "generated.py").write_text(CUDA_SCRIPT)
    (src / ".gitignore").write_text("build/\n")
    return src


@pytest.fixture
def broken(project):
    (project / "pkg" / "bad_syntax.py").write_bytes(SYNTAX_ERROR)
    (project / "pkg" / "latin.py").write_bytes(LATIN1)
    return project


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


# --in DIR --out DIR ------------------------------------------------------------------------------------------
def test_mirror_writes_migrated_scripts_and_copies_the_rest(project, tmp_path):
    before = tree_snapshot(project)
    out = tmp_path / "out"
    result = invoke("--in", str(project), "--out", str(out))
    assert result.exit_code == 0, result.stderr
    assert tree_snapshot(out) == {
        ".gitignore": b"build/\n",
        "README.md": b"# readme\n",
        "train.py": migrated(CUDA_SCRIPT),
        "pkg/model.py": migrated(OTHER_CUDA),
        "pkg/clean.py": NO_CUDA_SCRIPT.encode(),
    }  # build/ is ignored by .gitignore: neither migrated nor copied
    assert tree_snapshot(project) == before
    assert "3 files: 2 changed" in result.stderr and result.stdout == ""


def test_mirror_only_changed(project, tmp_path):
    out = tmp_path / "out"
    result = invoke("--in", str(project), "--out", str(out), "--only-changed")
    assert result.exit_code == 0
    assert sorted(tree_snapshot(out)) == ["pkg/model.py", "train.py"]


def test_mirror_keeps_the_file_mode(project, tmp_path):
    os.chmod(project / "train.py", 0o755)
    invoke("--in", str(project), "--out", str(tmp_path / "out"))
    assert (tmp_path / "out" / "train.py").stat().st_mode & 0o777 == 0o755


def test_no_gitignore_and_exclude(project, tmp_path):
    result = invoke("--in", str(project), "--out", str(tmp_path / "a"), "--no-gitignore", "--exclude", "pkg/",
                    "--exclude", "*.md")
    assert result.exit_code == 0
    assert sorted(tree_snapshot(tmp_path / "a")) == [".gitignore", "build/generated.py", "train.py"]
    assert (tmp_path / "a" / "build" / "generated.py").read_bytes() == migrated(CUDA_SCRIPT)


def test_out_folder_inside_the_input_is_not_walked(project):
    result = invoke("--in", str(project), "--out", str(project / "xla"))
    assert result.exit_code == 0
    assert (project / "xla" / "train.py").read_bytes() == migrated(CUDA_SCRIPT)
    again = invoke("--in", str(project), "--out", str(project / "xla"))
    assert again.exit_code == 0 and not (project / "xla" / "xla").exists()


def test_gitignore_from_the_repository_root_applies(tmp_path):
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / ".gitignore").write_text("legacy_*.py\n")
    (repo / "code").mkdir()
    (repo / "code" / "legacy_train.py").write_text(CUDA_SCRIPT)
    (repo / "code" / "train.py").write_text(CUDA_SCRIPT)
    result = invoke("--in", str(repo / "code"), "--in-place")
    assert result.exit_code == 0
    assert (repo / "code" / "legacy_train.py").read_text() == CUDA_SCRIPT
    assert (repo / "code" / "train.py").read_bytes() == migrated(CUDA_SCRIPT)


# Bad files among good ones -----------------------------------------------------------------------------------
def test_bad_files_are_reported_and_the_others_still_migrate(broken, tmp_path):
    out = tmp_path / "out"
    result = invoke("--in", str(broken), "--out", str(out))
    assert result.exit_code == 2
    assert error_lines(result.stderr) == [
        f"error: {broken}/pkg/bad_syntax.py:3:7: cannot parse: invalid syntax",
        f"error: {broken}/pkg/latin.py:2:9: not valid utf-8: byte 0xe9 cannot be decoded",
    ]
    assert (out / "train.py").read_bytes() == migrated(CUDA_SCRIPT)
    assert (out / "pkg" / "model.py").read_bytes() == migrated(OTHER_CUDA)
    # A mirror keeps a file it cannot migrate as it was, so the tree stays whole.
    assert (out / "pkg" / "bad_syntax.py").read_bytes() == SYNTAX_ERROR
    assert (out / "pkg" / "latin.py").read_bytes() == LATIN1


def test_in_place_rewrites_only_what_changes(broken):
    clean = broken / "pkg" / "clean.py"
    os.utime(clean, (1_000_000, 1_000_000))
    result = invoke("--in", str(broken), "--in-place")
    assert result.exit_code == 2
    assert len(error_lines(result.stderr)) == 2
    assert (broken / "train.py").read_bytes() == migrated(CUDA_SCRIPT)
    assert (broken / "pkg" / "model.py").read_bytes() == migrated(OTHER_CUDA)
    assert clean.stat().st_mtime == 1_000_000
    assert (broken / "pkg" / "bad_syntax.py").read_bytes() == SYNTAX_ERROR
    assert (broken / "pkg" / "latin.py").read_bytes() == LATIN1
    assert (broken / "build" / "generated.py").read_text() == CUDA_SCRIPT  # ignored
    assert not list(broken.rglob("*.tmp"))


def test_in_place_through_a_symlink_keeps_the_link(tmp_path):
    """A link to a file inside the folder is written through (the link stays); one that leaves the folder is
    not followed at all (issue 34: in place changes nothing outside the folder named)."""
    folder = tmp_path / "d"
    folder.mkdir()
    inside = folder / "real.py"
    inside.write_text(CUDA_SCRIPT)
    outside = tmp_path / "outside.py"
    outside.write_text(CUDA_SCRIPT)
    (folder / "link.py").symlink_to(inside)
    (folder / "out_link.py").symlink_to(outside)
    result = invoke("--in", str(folder), "--in-place")
    assert result.exit_code == 0
    assert (folder / "link.py").is_symlink() and (folder / "out_link.py").is_symlink()
    assert inside.read_bytes() == migrated(CUDA_SCRIPT)
    assert outside.read_text() == CUDA_SCRIPT
    assert f"warning: {folder / 'out_link.py'}: skipped: a link to outside the folder" in result.stderr


# --diff and --check over trees -------------------------------------------------------------------------------
def test_tree_diff_is_one_patch_git_applies(broken, tmp_path):
    before = tree_snapshot(broken)
    done = run_cli("--in", "src", "--diff", cwd=tmp_path, env={"NO_COLOR": "1"})
    assert done.returncode == 2  # the two bad files
    assert tree_snapshot(broken) == before
    patch = done.stdout
    assert patch.count(b"diff --git ") == 2
    assert patch.index(b"a/src/pkg/model.py") < patch.index(b"a/src/train.py")  # sorted
    (tmp_path / "p.diff").write_bytes(patch)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    applied = subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, capture_output=True)
    assert applied.returncode == 0, applied.stderr
    assert (broken / "train.py").read_bytes() == migrated(CUDA_SCRIPT)
    assert (broken / "pkg" / "model.py").read_bytes() == migrated(OTHER_CUDA)


def test_mirror_diff_describes_copies(project, tmp_path):
    result = invoke("--in", str(project), "--out", str(tmp_path / "out"), "--diff")
    assert result.exit_code == 0
    assert not (tmp_path / "out").exists()
    rel = str(project).lstrip("/")
    assert f"copy from {rel}/train.py\ncopy to {str(tmp_path).lstrip('/')}/out/train.py" in result.stdout


def test_tree_diff_file(project, tmp_path):
    result = invoke("--in", str(project), "--diff-file", str(tmp_path / "all.diff"))
    assert result.exit_code == 0
    text = (tmp_path / "all.diff").read_text()
    assert text == (migrate(OTHER_CUDA, path=f"{project}/pkg/model.py").diff
                    + migrate(CUDA_SCRIPT, path=f"{project}/train.py").diff)


def test_tree_check_exit_codes(project, tmp_path):
    before = tree_snapshot(project)
    assert invoke("--in", str(project), "--check").exit_code == 1
    assert tree_snapshot(project) == before
    assert invoke("--in", str(project / "pkg" / "clean.py"), str(project / "README.md"), "--check").exit_code == 0
    (project / "pkg" / "bad.py").write_bytes(SYNTAX_ERROR)
    assert invoke("--in", str(project), "--check").exit_code == 2  # an error wins over changes


# Several inputs, globs ---------------------------------------------------------------------------------------
def test_several_inputs_and_globs(project, tmp_path):
    extra = tmp_path / "extra.py"
    extra.write_text(CUDA_SCRIPT)
    result = invoke("--in", f"{project}/**/model.py", str(extra), "--in-place")
    assert result.exit_code == 0, result.stderr
    assert extra.read_bytes() == migrated(CUDA_SCRIPT)
    assert (project / "pkg" / "model.py").read_bytes() == migrated(OTHER_CUDA)
    assert (project / "train.py").read_text() == CUDA_SCRIPT  # not matched by the glob
    assert "2 files: 2 changed" in result.stderr


def test_glob_depth_follows_the_pattern(project):
    result = invoke("--in", f"{project}/*.py", "--check")
    assert result.exit_code == 1 and "1 file: 1 would change" in result.stderr


def test_repeated_in_and_the_same_file_twice(project):
    path = str(project / "train.py")
    result = invoke("--in", path, "--in", path, "--in-place")
    assert result.exit_code == 0 and "1 file: 1 changed" in result.stderr


def test_named_files_are_excluded_only_with_force_exclude(project):
    named = [str(project / "train.py"), str(project / "pkg" / "model.py")]
    # As in ruff: a file named on the command line is migrated even when an exclude pattern matches it...
    result = invoke(*named, "--exclude", "model.py", "--in-place")
    assert result.exit_code == 0
    assert (project / "pkg" / "model.py").read_bytes() == migrated(OTHER_CUDA)
    (project / "pkg" / "model.py").write_text(OTHER_CUDA)
    (project / "train.py").write_text(CUDA_SCRIPT)
    # ...unless --force-exclude says the excludes apply to it too.
    result = invoke(*named, "--exclude", "model.py", "--force-exclude", "--in-place")
    assert result.exit_code == 0 and result.stderr.startswith(f"{project / 'train.py'}: 3 changes")
    assert (project / "pkg" / "model.py").read_text() == OTHER_CUDA
    assert (project / "train.py").read_bytes() == migrated(CUDA_SCRIPT)


def test_force_exclude_with_one_named_file_and_the_default_excludes(tmp_path):
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "gen.py").write_text(CUDA_SCRIPT)
    done = run_cli("build/gen.py", "--check", cwd=tmp_path)
    assert done.returncode == 1  # named: checked
    done = run_cli("build/gen.py", "--check", "--force-exclude", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout == b""
    assert done.stderr == b"0 files: every path given is excluded (--force-exclude)\n"


@pytest.mark.parametrize("where, pattern, expected", [
    ("cli", "!", "--exclude: '!' is not a valid gitignore pattern"),
    ("cli-extend", "\\", "--extend-exclude: '\\\\' is not a valid gitignore pattern"),
    ("config", "!", "exclude in {config}: '!' is not a valid gitignore pattern")])
def test_a_bad_exclude_pattern_is_one_line_and_exit_2(tmp_path, where, pattern, expected):
    (tmp_path / "train.py").write_text(CUDA_SCRIPT)
    args = [".", "--out", "out"]
    if where == "cli":
        args += ["--exclude", "ok/", "--exclude", pattern]
    elif where == "cli-extend":
        args += ["--extend-exclude", pattern]
    else:
        (tmp_path / "pyproject.toml").write_text(f"[tool.xla-migrate]\nexclude = [\"ok/\", \"{pattern}\"]\n")
    done = run_cli(*args, cwd=tmp_path)
    config = tmp_path / "pyproject.toml"
    assert (done.returncode, done.stdout) == (2, b"")
    assert done.stderr.decode() == f"error: {expected.format(config=config)}\n"
    assert not (tmp_path / "out").exists()


VENDORED = [".venv/lib/python3.11/site-packages/pkg/core.py", "venv/lib/x.py", "env/x.py", "node_modules/a/b.py",
            "build/lib/train.py", "dist/train.py", "pkg/__pycache__/x.py", ".tox/py311/x.py", ".nox/x.py",
            ".eggs/x.py", "site-packages/x.py", "pkg.egg-info/x.py", ".ipynb_checkpoints/nb-checkpoint.py"]


@pytest.fixture
def vendored(tmp_path):
    """A project with its own script and copies of CUDA code where ruff and black never look."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text(CUDA_SCRIPT)
    for name in VENDORED:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(CUDA_SCRIPT)
    (tmp_path / "build.py").write_text(CUDA_SCRIPT)  # a file named like a default folder is not excluded
    (tmp_path / "env" / "pyvenv.cfg").write_text("home = /usr/bin\n")  # env/ is skipped as a virtual environment
    return tmp_path


def test_default_excludes(vendored):
    before = tree_snapshot(vendored)
    done = run_cli(".", "--in-place", "--no-gitignore", cwd=vendored)
    assert done.returncode == 0, done.stderr
    after = tree_snapshot(vendored)
    assert sorted(name for name in after if after[name] != before[name]) == ["build.py", "src/train.py"]


@pytest.mark.parametrize(("how", "expect_vendored"), [
    ("config-empty", True), ("config-extend", False), ("cli-exclude", True), ("cli-extend", False)])
def test_default_excludes_are_overridable(vendored, how, expect_vendored):
    args = [".", "--check", "-v"]
    if how == "config-empty":
        (vendored / "pyproject.toml").write_text("[tool.xla-migrate]\nexclude = []\n")
    elif how == "config-extend":
        (vendored / "pyproject.toml").write_text("[tool.xla-migrate]\nextend-exclude = [\"src/\"]\n")
    elif how == "cli-exclude":
        args += ["--exclude", "src/"]  # replaces the defaults, as ruff's --exclude does
    else:
        args += ["--extend-exclude", "src/"]
    result = invoke(*[str(vendored) if a == "." else a for a in args])
    reported = {line.split(":")[0] for line in result.stderr.splitlines() if "would change" in line}
    reported = {os.path.relpath(path, vendored) for path in reported if path.startswith(str(vendored))}
    assert ("src/train.py" in reported) is (how in ("config-empty",))
    assert all((name in reported) is expect_vendored for name in VENDORED if not name.startswith(".ipynb"))


@pytest.mark.parametrize("case", ["out-dash", "out-is-file", "two-dirs-out", "only-changed", "glob-none", "missing",
                                  "stdin-mixed", "nothing-to-do", "same-dir", "jobs-zero", "out-named-like-a-script",
                                  "out-named-like-a-notebook"])
def test_tree_usage_errors(project, tmp_path, case):
    args = {
        "out-dash": ["--in", str(project), "--out", "-"],
        "out-is-file": ["--in", str(project), "--out", str(project / "train.py")],
        "two-dirs-out": ["--in", str(project), str(project / "pkg"), "--out", str(tmp_path / "o")],
        "only-changed": ["--in", str(project), "--in-place", "--only-changed"],
        "glob-none": ["--in", f"{project}/*.nothing", "--check"],
        "missing": ["--in", str(project), str(tmp_path / "nope"), "--check"],
        "stdin-mixed": ["--in", "-", str(project), "--check"],
        "nothing-to-do": ["--in", str(project)],
        "same-dir": ["--in", str(project), "--out", str(project)],
        "jobs-zero": ["--in", str(project), "--check", "-j", "0"],
        "out-named-like-a-script": ["--in", str(project), "--out", str(tmp_path / "new.py")],
        "out-named-like-a-notebook": [str(project), "--out", str(tmp_path / "new.ipynb")],
    }[case]
    before = tree_snapshot(tmp_path)
    result = invoke(*args)
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: "), result.stderr
    assert tree_snapshot(tmp_path) == before


# Symlink loops, parallel workers, the pre-filter -------------------------------------------------------------
def test_symlink_loop_does_not_hang(project, tmp_path):
    (project / "pkg" / "loop").symlink_to(project, target_is_directory=True)
    (project / "self").symlink_to(".", target_is_directory=True)
    done = run_cli("--in", "src", "--check", cwd=tmp_path)  # run_cli has a 60 s timeout
    assert done.returncode == 1
    assert b"3 files: 2 would change" in done.stderr


def make_many(folder, count=24):
    for i in range(count):
        sub = folder / f"m{i % 3}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"s{i:02}.py").write_text(CUDA_SCRIPT if i % 2 else OTHER_CUDA + f"# {i}\n")
    (folder / "m1" / "bad.py").write_bytes(SYNTAX_ERROR)


def test_parallel_results_match_serial_in_sorted_order(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    make_many(a)
    shutil.copytree(a, b)
    serial = run_cli("--in", "a", "--in-place", "-j", "1", "-v", cwd=tmp_path)
    parallel = run_cli("--in", "b", "--in-place", "-j", "3", "-v", cwd=tmp_path)
    assert serial.returncode == parallel.returncode == 2
    assert tree_snapshot(a) == tree_snapshot(b)
    assert serial.stderr.replace(b"a/", b"X/") == parallel.stderr.replace(b"b/", b"X/")
    lines = [line.split(b":")[0] for line in parallel.stderr.splitlines() if line.startswith(b"b/")]
    assert lines == sorted(lines) and len(lines) > 24
    assert b"\x1b[" not in parallel.stderr and b"migrating" not in parallel.stderr  # piped: no progress bar


def test_parallel_diff_is_stable(tmp_path):
    make_many(tmp_path / "a")
    first = run_cli("--in", "a", "--diff", "-j", "2", cwd=tmp_path)
    second = run_cli("--in", "a", "--diff", "-j", "1", cwd=tmp_path)
    assert first.stdout == second.stdout and first.stdout.count(b"diff --git") == 24


def test_prefilter_skips_files_without_trigger_names(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "numpy_only.py").write_text("import os\nrank = int(os.environ['RANK'])\nfor i in range(3):\n"
                                          "    opt.step()\n")
    (folder / "t.py").write_text(CUDA_SCRIPT)
    result = invoke("--in", str(folder), "--out", str(tmp_path / "o"))
    assert result.exit_code == 0, result.stderr
    # Nothing to migrate: copied as it is (not rewritten), as migrate() and a single-file run leave it.
    assert (tmp_path / "o" / "numpy_only.py").read_bytes() == (folder / "numpy_only.py").read_bytes()
    # Broken, even without a trigger name: refused as a script that needs migrating is (issue 37: the same
    # answer for the same file), and still copied by the mirror.
    (folder / "notes.py").write_bytes(b"def f(:\n")
    result = invoke("--in", str(folder), "--out", str(tmp_path / "o2"))
    assert result.exit_code == 2
    assert f"error: {folder / 'notes.py'}:1:7: cannot parse: invalid syntax" in result.stderr
    assert (tmp_path / "o2" / "notes.py").read_bytes() == b"def f(:\n"


def test_prefilter_triggers_are_in_one_place():
    from xla_migrate.engine.triggers import mentions_a_trigger

    assert mentions_a_trigger(b"x.cuda()") and mentions_a_trigger(b"from transformers import Trainer")
    assert not mentions_a_trigger(b"import numpy as np\n")


# --format and --report ---------------------------------------------------------------------------------------
def test_json_report_on_stdout_and_in_a_file(broken, tmp_path):
    import json

    report_path = tmp_path / "report.json"
    result = invoke("--in", str(broken), "--check", "--format", "json-report", "--report", str(report_path))
    assert result.exit_code == 2
    printed = json.loads(result.stdout)  # on stdout, as ruff's --output-format json
    assert printed == json.loads(report_path.read_text())
    assert printed["schema"] == "xla-migrate-report" and printed["version"] == 2
    files = {Path(f["path"]).relative_to(broken).as_posix(): f for f in printed["files"]}
    assert sorted(files) == ["pkg/bad_syntax.py", "pkg/clean.py", "pkg/latin.py", "pkg/model.py", "train.py"]
    assert files["train.py"]["changed"] is True and files["train.py"]["diff_stats"]["files"] == 1
    assert files["pkg/clean.py"]["changed"] is False and files["pkg/clean.py"]["error"] is None
    assert files["pkg/bad_syntax.py"]["error"] == {"message": "cannot parse: invalid syntax", "line": 3, "column": 7,
                                                   "cell": None}
    assert "error: " in result.stderr  # errors still say so on stderr
    assert not result.stderr.lstrip().startswith("{")


def test_json_with_diff_needs_a_report_file(project, tmp_path):
    import json

    refused = run_cli("src", "--diff", "--format", "json-report", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stdout == b""
    assert refused.stderr.decode().strip() == (
        "error: --format json-report prints the report on stdout, where --diff puts its output: "
        "write the report to a file with --report PATH instead")
    both = run_cli("src", "--diff", "--report", "r.json", cwd=tmp_path)
    assert both.returncode == 0 and both.stdout.startswith(b"diff --git")
    assert {Path(f["path"]).name for f in json.loads((tmp_path / "r.json").read_text())["files"]} >= {"train.py"}


def test_report_file_with_the_text_format(project, tmp_path):
    import json

    result = invoke("--in", str(project / "train.py"), "--diff", "--report", str(tmp_path / "r.json"))
    assert result.exit_code == 0 and result.stdout.startswith("diff --git")
    assert "changes" in result.stderr  # the text report is still there
    (entry,) = json.loads((tmp_path / "r.json").read_text())["files"]
    assert entry["path"] == str(project / "train.py") and entry["changed"] is True


def test_github_annotations(project, tmp_path):
    (project / "pkg" / "bad.py").write_bytes(SYNTAX_ERROR)
    result = invoke("--in", str(project), "--check", "--format", "github")
    assert result.exit_code == 2
    lines = result.stdout.splitlines()  # on stdout, as ruff's; the summary line stays on stderr
    assert f"::error file={project}/pkg/bad.py,line=3,col=7,title=xla-migrate::cannot parse: invalid syntax" in lines
    assert any(line.startswith(f"::notice file={project}/train.py,line=3,") for line in lines)
    assert not any(line.startswith("::") for line in result.stderr.splitlines())
    single = invoke("--in", str(project / "train.py"), "--check", "--format", "github")
    assert single.exit_code == 1 and single.stdout.startswith(f"::notice file={project}/train.py,line=")


def test_unknown_format(project):
    result = invoke("--in", str(project), "--check", "--format", "xml")
    assert result.exit_code == 2 and result.stderr.strip() == "error: --format xml: expected one of text, json, json-report, sarif, github"


# Ctrl-C --------------------------------------------------------------------------------------------------------
EXAMPLE = (Path(__file__).resolve().parent.parent / "fixtures" / "examples" / "train_cuda.py").read_bytes()


@pytest.mark.parametrize(("jobs", "whole_group"), [("1", False), ("2", False), ("2", True)],
                         ids=["serial", "workers-kill-parent", "workers-terminal-ctrl-c"])
def test_ctrl_c_stops_a_tree_run_and_says_what_was_not_reached(tmp_path, jobs, whole_group):
    """SIGINT to xla-migrate alone (kill -INT), or to its whole process group as a terminal's Ctrl-C sends it."""
    import re
    import signal
    import sys
    import time

    folder = tmp_path / "a"
    folder.mkdir()
    count = 150
    for i in range(count):
        (folder / f"s{i:03}.py").write_bytes(EXAMPLE)
    expected = migrated(EXAMPLE)
    executable = Path(sys.executable).with_name("xla-migrate")
    process = subprocess.Popen([str(executable), "a", "--in-place", "-j", jobs, "-v"], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)

    def written() -> set[str]:
        done = set()
        for path in folder.iterdir():
            try:  # a write's temp file is renamed away while we look
                if not path.name.startswith(".") and path.read_bytes() == expected:
                    done.add(path.name)
            except FileNotFoundError:
                pass
        return done

    deadline = time.monotonic() + 120
    while len(written()) < 3 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process.poll() is None, "the run ended before it could be interrupted"
    sent = time.monotonic()
    if whole_group:
        os.killpg(process.pid, signal.SIGINT)
    else:
        process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    stopped_after = time.monotonic() - sent
    stderr = stderr.decode()
    assert process.returncode == 130, stderr
    assert stopped_after < 10, stopped_after  # promptly: no file is started after the interrupt
    after = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert len(after) == count  # no temp file left behind
    assert all(data in (EXAMPLE, expected) for data in after.values())  # each file whole: old or new
    done = {name for name, data in after.items() if data == expected}
    match = re.search(r"^interrupted: (\d+) files? written, (\d+) files? not reached", stderr, re.M)
    assert match, stderr
    assert "error" not in stderr, [line for line in stderr.splitlines() if "error" in line]
    assert int(match.group(1)) == len(done) and int(match.group(2)) == count - len(done)
    assert 3 <= len(done) < count
    not_reached = {line.split("not reached: a/")[1] for line in stderr.splitlines() if "  not reached: " in line}
    assert not_reached == set(after) - done  # -v lists every one
    changes = len(migrate(EXAMPLE).changes)  # the example's own count (rules that join change it)
    assert {line.split(":")[0][2:] for line in stderr.splitlines()
            if line.endswith(f"changed ({changes} changes)")} == done
    time.sleep(0.5)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == after  # nothing changes after the exit
    assert "Traceback" not in stderr
