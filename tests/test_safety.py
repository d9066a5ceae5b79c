"""Nothing written or read outside what the user named (issues 34 and 37): outputs that would overwrite an
input or each other, links out of a tree, hostile file names and configurations, in-place writes that keep
what the file is, stale temp files, start-up interrupts and ``python -m`` from a hostile folder."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import CUDA_SCRIPT, run_cli
from typer.testing import CliRunner

from xla_migrate import cli, migrate

runner = CliRunner()
MIGRATED = migrate(CUDA_SCRIPT).output_bytes


def invoke(*args: str, cwd: Path | None = None):
    if cwd is None:
        return runner.invoke(cli.app, list(args))
    here = os.getcwd()
    os.chdir(cwd)
    try:
        return runner.invoke(cli.app, list(args))
    finally:
        os.chdir(here)


def checksum(folder: Path) -> dict[str, tuple]:
    """Everything under ``folder`` as it is on disk: each entry's kind, mode, owner, link target or
    content hash and link count (links not followed)."""
    entries = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                what = ("link", os.readlink(path))
            elif stat.S_ISREG(info.st_mode):
                what = ("file", hashlib.sha256(Path(path).read_bytes()).hexdigest(), info.st_nlink)
            else:
                what = ("other",)
            entries[os.path.relpath(path, folder)] = (*what, stat.S_IMODE(info.st_mode), info.st_uid)
    return entries


def one_error(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: "), lines
    return lines[0]


# 1. No output overwrites an input or another output (issue 37.1) --------------------------------------------
SINGLE_CLASHES = {
    "diff-file is the input": (["t.py", "--diff", "--diff-file", "t.py"], "--diff-file t.py is the input file t.py"),
    "report is the input": (["t.py", "--check", "--report", "t.py"], "--report t.py is the input file t.py"),
    "report is the input in place": (["t.py", "--in-place", "--report", "t.py"], "--report t.py is the input file"),
    "diff-file is the input in place": (["t.py", "--in-place", "--diff-file", "t.py"], "--diff-file t.py is the input"),
    "out and diff-file": (["t.py", "--out", "o.py", "--diff-file", "o.py"], "--diff-file o.py and --out o.py name"),
    "out and report": (["t.py", "--out", "o.py", "--report", "o.py"], "--report o.py and --out o.py name the same"),
    "report and diff-file": (["t.py", "--out", "o.py", "--diff-file", "r", "--report", "r"], "--report r and "),
    "report through a symlink": (["t.py", "--out", "o.py", "--report", "link.py"], "--report link.py is the input"),
    "diff-file through a hard link": (["t.py", "--out", "o.py", "--diff-file", "hard.py"], "is the input file t.py"),
    "report is the configuration": (["t.py", "--check", "--report", "pyproject.toml"], "the configuration file"),
    "report into a folder": (["t.py", "--check", "--report", "sub"], "--report sub: is a directory"),
    "stdin, report over the config": (["-", "--out", "-", "--report", "pyproject.toml"], "the configuration"),
}


@pytest.mark.parametrize("case", sorted(SINGLE_CLASHES))
def test_an_output_never_overwrites_an_input_or_another_output(tmp_path, case):
    args, message = SINGLE_CLASHES[case]
    (tmp_path / "t.py").write_text(CUDA_SCRIPT)
    (tmp_path / "link.py").symlink_to("t.py")
    os.link(tmp_path / "t.py", tmp_path / "hard.py")
    (tmp_path / "sub").mkdir()
    (tmp_path / "pyproject.toml").write_text('[tool.xla-migrate]\ntarget = "sagemaker"\n')
    before = checksum(tmp_path)
    done = run_cli(*args, cwd=tmp_path, stdin=CUDA_SCRIPT.encode())
    assert done.returncode == 2, done.stderr
    assert message in one_error(done.stderr.decode())
    assert done.stdout == b""
    assert checksum(tmp_path) == before


TREE_CLASHES = {
    "diff-file names a file of the tree": (["d", "--diff", "--diff-file", "d/t.py"], "--diff-file d/t.py is the input"),
    "report names a file of the tree": (["d", "--in-place", "--report", "d/sub/u.py"], "--report d/sub/u.py is the"),
    "report names a mirrored file": (["d", "--out", "m", "--report", "m/t.py"], "--report m/t.py and the mirror's"),
    "a mirror over its own input": (["d", "--out", "."], "the mirror's file ./d/t.py is the input file d/t.py"),
    "report is the requirements file": (["d", "--in-place", "--requirements", "--report", "d/requirements.txt"],
                                        "the requirements file"),
    "report names a notebook's output": (["nb.ipynb", "--out", "o.ipynb", "--report", "o.ipynb"], "name the same"),
}


@pytest.mark.parametrize("case", sorted(TREE_CLASHES))
def test_a_tree_run_checks_every_output_before_writing(tmp_path, case):
    args, message = TREE_CLASHES[case]
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "d").mkdir()
    (tmp_path / "d" / "t.py").write_text(CUDA_SCRIPT)
    (tmp_path / "d" / "d" / "t.py").write_text(CUDA_SCRIPT)
    (tmp_path / "d" / "sub" / "u.py").write_text(CUDA_SCRIPT)
    (tmp_path / "d" / "requirements.txt").write_text("torch\n")
    (tmp_path / "nb.ipynb").write_text(notebook(["import torch\nx = torch.zeros(1).cuda()\n"]))
    before = checksum(tmp_path)
    result = invoke(*args, cwd=tmp_path)
    assert result.exit_code == 2, result.output
    assert message in one_error(result.stderr)
    assert checksum(tmp_path) == before


def test_streams_are_not_clashes(tmp_path):
    (tmp_path / "t.py").write_text(CUDA_SCRIPT)
    done = run_cli("t.py", "--out", "/dev/null", "--diff-file", "/dev/null", "--report", "/dev/null", cwd=tmp_path)
    assert done.returncode == 0, done.stderr


def test_migrate_file_refuses_an_out_that_is_the_input(tmp_path):
    from xla_migrate import migrate_file

    (tmp_path / "t.py").write_text(CUDA_SCRIPT)
    (tmp_path / "link.py").symlink_to("t.py")
    result = migrate_file(tmp_path / "t.py", out=tmp_path / "link.py")
    assert result.error is not None and "is the input file" in result.error.message
    assert (tmp_path / "t.py").read_text() == CUDA_SCRIPT


# 2. Links and hostile names in trees (issue 34) ---------------------------------------------------------
HOSTILE_NAMES = ["x.py\n+++ b/owned.py", "\x1b[31mred.py", "tab\there.py", 'quote"back\\slash.py', "caf\u00e9.py"]


def hostile_tree(base: Path) -> tuple[Path, Path]:
    """``base/tree`` (links out of it, hostile names, a FIFO) and ``base/outside`` (what must not change)."""
    outside, tree = base / "outside", base / "tree"
    (outside / "pkg").mkdir(parents=True)
    (tree / "sub").mkdir(parents=True)
    (outside / "secret.py").write_text(CUDA_SCRIPT)
    (outside / "pkg" / "helper.py").write_text(CUDA_SCRIPT)
    (tree / "train.py").write_text(CUDA_SCRIPT)
    (tree / "sub" / "model.py").write_text(CUDA_SCRIPT)
    (tree / "secret.py").symlink_to(outside / "secret.py")  # a file link out
    (tree / "pkg").symlink_to(outside / "pkg")  # a folder link out
    (tree / "relative.py").symlink_to("../outside/secret.py")
    (tree / "inside.py").symlink_to("train.py")  # a link that stays inside: followed
    (tree / "broken.py").symlink_to("nowhere.py")
    os.mkfifo(tree / "fifo.py")
    for name in HOSTILE_NAMES:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)  # "x.py\n+++ b" is a folder
        (tree / name).write_text(CUDA_SCRIPT)
    return tree, outside


@pytest.mark.parametrize("mode", ["--out", "--in-place", "--diff"])
def test_a_tree_with_links_out_and_hostile_names_changes_nothing_outside(tmp_path, mode):
    tree, outside = hostile_tree(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[tool.xla-migrate]\nextend-exclude = ["../outside/", "/etc/"]\n')
    before = checksum(outside)
    args = ["tree", mode, "mirror"] if mode == "--out" else ["tree", mode]
    done = run_cli(*args, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert checksum(outside) == before
    stderr = done.stderr.decode()
    for name in ("secret.py", "pkg", "relative.py"):
        assert f"warning: tree/{name}: skipped: a link to outside the folder" in stderr
    assert "warning: tree/broken.py: skipped: a broken link" in stderr
    assert "warning: tree/fifo.py: skipped: not a regular file" in stderr
    assert "\x1b" not in stderr and "tree/x.py\\n+++ b/owned.py: " in stderr  # names escaped, one line each
    if mode == "--out":
        mirror = tmp_path / "mirror"
        assert not any(os.path.islink(os.path.join(d, n)) for d, ds, fs in os.walk(mirror) for n in ds + fs)
        assert not (mirror / "secret.py").exists() and not (mirror / "pkg").exists()
        assert (mirror / "inside.py").read_bytes() == MIGRATED
        for name in HOSTILE_NAMES:
            assert (mirror / name).read_bytes() == MIGRATED
    elif mode == "--in-place":
        assert (tree / "train.py").read_bytes() == MIGRATED and (tree / "inside.py").is_symlink()
        for name in HOSTILE_NAMES:
            assert (tree / name).read_bytes() == MIGRATED


def test_a_mirror_never_writes_through_a_link_it_holds(tmp_path):
    tree, outside = hostile_tree(tmp_path)
    mirror = tmp_path / "mirror"
    (mirror / "sub").mkdir(parents=True)
    (mirror / "train.py").symlink_to(outside / "secret.py")  # left by an earlier copy (cp -as)
    before = checksum(outside)
    done = run_cli("tree", "--out", "mirror", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert checksum(outside) == before
    assert not (mirror / "train.py").is_symlink() and (mirror / "train.py").read_bytes() == MIGRATED
    # A folder of the mirror that is a link out of it: its files are refused, nothing written there.
    import shutil

    shutil.rmtree(mirror / "sub")
    (mirror / "sub").symlink_to(outside / "pkg")
    done = run_cli("tree", "--out", "mirror", cwd=tmp_path)
    assert done.returncode == 2
    assert "error: mirror/sub/model.py: cannot write: " in done.stderr.decode()
    assert "outside the mirror" in done.stderr.decode()
    assert checksum(outside) == before


def test_git_apply_of_a_hostile_name_writes_only_that_file(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    name = "x.py\n+++ b/owned.py"  # a folder "x.py\n+++ b" holding owned.py: "--- a/x.py\n+++ b/owned.py"
    (repo / name).parent.mkdir()
    (repo / name).write_text(CUDA_SCRIPT)
    (repo / "owned.py").write_text("keep\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    done = run_cli(".", "--diff", cwd=repo, env={"NO_COLOR": "1"})
    assert done.returncode == 0, done.stderr
    patch = done.stdout
    assert b'diff --git "a/x.py\\n+++ b/owned.py" "b/x.py\\n+++ b/owned.py"\n' in patch
    assert b"\n+++ b/owned.py\n" not in patch  # no forged header line
    (tmp_path / "p.diff").write_bytes(patch)
    applied = subprocess.run(["git", "apply", str(tmp_path / "p.diff")], cwd=repo, capture_output=True)
    assert applied.returncode == 0, applied.stderr
    assert (repo / name).read_bytes() == MIGRATED
    assert (repo / "owned.py").read_text() == "keep\n"


def test_a_name_that_is_not_utf8_works_with_every_output(tmp_path):
    folder = os.fsencode(tmp_path)
    with open(folder + b"/bad\xff.py", "wb") as handle:
        handle.write(CUDA_SCRIPT.encode())
    name = os.fsdecode(b"bad\xff.py")
    done = run_cli(name, "--diff", cwd=tmp_path, env={"NO_COLOR": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(b'diff --git "a/bad\\377.py" "b/bad\\377.py"\n')
    done = run_cli(name, "--check", "--format", "json-report", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["files"][0]["path"] == name
    done = run_cli(name, "--check", "--report", "r.json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert json.loads((tmp_path / "r.json").read_text())["files"][0]["path"] == name
    done = run_cli(".", "--diff", cwd=tmp_path, env={"NO_COLOR": "1"})  # a tree run
    assert done.returncode == 0 and b'"a/bad\\377.py"' in done.stdout, done.stderr


# 3. Configurations, whatever they hold (issue 34.3) ------------------------------------------------------
HOSTILE_CONFIGS = {
    "3,000 nested arrays": b"[tool.xla-migrate]\nselect = " + b"[" * 3000 + b"]" * 3000 + b"\n",
    "3,000 nested tables": b"[tool.xla-migrate]\nx = " + b"{a = " * 3000 + b"1" + b"}" * 3000 + b"\n",
    "tool is a string": b'tool = "xla-migrate"\n',
    "the table is a number": b"[tool]\nxla-migrate = 3\n",
    "not UTF-8": b'[tool.xla-migrate]\ntarget = "\xff"\n',
    "a bad exclude pattern": b'[tool.xla-migrate]\nexclude = ["[z-a]"]\n',
    "a NUL": b'[tool.xla-migrate]\ntarget = "2.9"\0\n',
    "nested lists of codes": b"[tool.xla-migrate]\nselect = [[\"XLA1\"]]\n",
}


@pytest.mark.parametrize("case", sorted(HOSTILE_CONFIGS))
def test_a_hostile_configuration_is_one_line_and_exit_2(tmp_path, case):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "t.py").write_text(CUDA_SCRIPT)
    (tmp_path / "pyproject.toml").write_bytes(HOSTILE_CONFIGS[case])
    before = checksum(tmp_path)
    for args in (["d", "--out", "m"], ["d", "--in-place"], ["d/t.py", "--in-place"]):
        done = run_cli(*args, cwd=tmp_path)
        assert done.returncode == 2, (args, done.stderr)
        assert "pyproject.toml" in one_error(done.stderr.decode()) or "exclude" in done.stderr.decode()
        assert "internal error" not in done.stderr.decode()
        assert checksum(tmp_path) == before


# 4. In place keeps what the file is (issue 37.6) ----------------------------------------------------------
@pytest.mark.parametrize("how", ["single", "tree"])
def test_in_place_keeps_mode_hard_links_and_owner(tmp_path, how):
    (tmp_path / "d").mkdir()
    script = tmp_path / "d" / "t.py"
    script.write_text(CUDA_SCRIPT)
    script.chmod(0o751)
    os.link(script, tmp_path / "other_name.py")
    owner = None
    if os.geteuid() == 0:  # root rewriting another user's file keeps its owner
        os.chown(script, 1234, 1234)
        owner = (1234, 1234)
    inode = script.stat().st_ino
    done = run_cli("d/t.py" if how == "single" else "d", "--in-place", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    info = script.stat()
    assert script.read_bytes() == MIGRATED
    assert (tmp_path / "other_name.py").read_bytes() == MIGRATED  # one file under two names
    assert (info.st_ino, info.st_nlink, stat.S_IMODE(info.st_mode)) == (inode, 2, 0o751)
    if owner is not None:
        assert (info.st_uid, info.st_gid) == owner
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["t.py"]  # the temp copy is gone


def test_in_place_of_a_plain_file_is_an_atomic_replace(tmp_path):
    script = tmp_path / "t.py"
    script.write_text(CUDA_SCRIPT)
    script.chmod(0o640)
    done = run_cli("t.py", "--in-place", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert script.read_bytes() == MIGRATED and stat.S_IMODE(script.stat().st_mode) == 0o640


def test_a_failed_write_through_puts_the_original_back(tmp_path, monkeypatch):
    from xla_migrate.report import files

    script = tmp_path / "t.py"
    script.write_text(CUDA_SCRIPT)
    os.link(script, tmp_path / "hard.py")
    real_fsync = os.fsync
    calls = []

    def failing(fd):
        calls.append(fd)
        if len(calls) == 2:  # the temp copy syncs; the write into the file itself fails
            raise OSError(28, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError):
        files.write_atomically(script, MIGRATED, original=CUDA_SCRIPT.encode())
    assert script.read_text() == CUDA_SCRIPT and (tmp_path / "hard.py").read_text() == CUDA_SCRIPT
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hard.py", "t.py"]


def test_in_place_on_a_fifo_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "f.py")
    for target in ("f.py", "."):
        done = run_cli(target, "--in-place", cwd=tmp_path, timeout=30)
        if target == ".":  # in a tree, a FIFO is skipped like any file that is not a regular file
            assert done.returncode == 0 and "warning: ./f.py: skipped: not a regular file" in done.stderr.decode()
            continue
        assert done.returncode == 2
        assert one_error(done.stderr.decode()) == ("error: --in-place f.py: is a FIFO; only a regular file can be "
                                                   "rewritten in place (use --out)")


def test_a_killed_runs_temp_file_is_removed_by_the_next_run(tmp_path):
    """SIGKILL can land between the temp file's write and its rename: the next run removes what such a run
    left (its PID is gone), and never a live run's."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    (tmp_path / "t.py").write_text(CUDA_SCRIPT)
    stale = tmp_path / f".t.py.{dead_pid}.abcd1234.xla-migrate.tmp"
    stale.write_bytes(b"half")
    live = tmp_path / f".t.py.{os.getpid()}.efgh5678.xla-migrate.tmp"  # this process is alive
    live.write_bytes(b"in progress")
    done = run_cli("t.py", "--in-place", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not stale.exists() and live.exists()
    assert (tmp_path / "t.py").read_bytes() == MIGRATED


def test_a_notebook_that_cannot_be_read_writes_nothing_with_out(tmp_path):
    for content in (b"{not json", b"", b'{"nbformat": 3, "cells": []}', b"\xff\xfe"):
        (tmp_path / "nb.ipynb").write_bytes(content)
        done = run_cli("nb.ipynb", "--out", "out.ipynb", cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert not (tmp_path / "out.ipynb").exists()


def notebook(cells: list[str]) -> str:
    return json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {},
                       "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None,
                                  "outputs": [], "source": source} for i, source in enumerate(cells)]})


def test_a_notebook_line_equal_to_the_internal_markers_is_kept(tmp_path):
    from xla_migrate.syntax.patterns import IPYTHON_PLACEHOLDER_COMMENT

    tricky = [f"pass  {IPYTHON_PLACEHOLDER_COMMENT}0", "pass  # xla-migrate:cell 2", "%matplotlib inline"]
    cells = ["import torch\n" + "\n".join(tricky) + "\nx = torch.zeros(1).cuda()\n", "y = x.cuda()\n" + tricky[1]]
    (tmp_path / "nb.ipynb").write_text(notebook(cells))
    done = run_cli("nb.ipynb", "--out", "out.ipynb", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = json.loads((tmp_path / "out.ipynb").read_text())
    sources = ["".join(cell["source"]) for cell in out["cells"]]
    for line in tricky:
        assert line in sources[0]
    assert tricky[1] in sources[1] and ".cuda()" not in "".join(sources)


# 5. Start-up: interrupts and the current folder (issue 37.6) ------------------------------------------------
def _loaded(pid: int, library: str) -> bool:
    try:
        return library in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc to see the start-up's progress")
@pytest.mark.parametrize("delay", [None, 0.0, 0.1, 0.3, 0.6])
def test_ctrl_c_in_the_first_second_is_one_line_and_130(tmp_path, delay):
    """While the tool starts (its imports: libcst, the rules) and then migrates: counted from the moment
    libcst's native module is loaded, or (``delay`` None) 0.3 s after the process starts. The interpreter's
    own start-up, about 40 ms of site imports before any code of the tool runs, is not the tool's to
    handle."""
    big = "\n".join(CUDA_SCRIPT for _ in range(200))
    (tmp_path / "t.py").write_text(big)
    executable = Path(sys.executable).with_name("xla-migrate")
    process = subprocess.Popen([str(executable), "t.py", "--out", "o.py"], cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    if delay is not None:
        deadline = time.monotonic() + 30
        while not _loaded(process.pid, "libcst") and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(delay)
    else:
        time.sleep(0.3)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    if process.returncode == 0:  # finished before the signal came
        return
    assert process.returncode == 130, stderr
    assert stderr.decode().strip().splitlines() == ["interrupted"], stderr
    assert not (tmp_path / "o.py").exists() or (tmp_path / "o.py").read_text() == migrate(big).code
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "o.py") == ["t.py"]


def test_python_m_does_not_import_from_the_current_folder(tmp_path):
    marker = tmp_path / "imported"
    for module in ("json", "csv", "zipfile", "tomllib", "signal", "typer", "libcst", "difflib", "pathspec"):
        (tmp_path / f"{module}.py").write_text(f"open({str(marker)!r}, 'a').write({module!r})\n")
    (tmp_path / "t.py").write_text(CUDA_SCRIPT)
    (tmp_path / "pyproject.toml").write_text('[tool.xla-migrate]\ntarget = "sagemaker"\n')
    for args in (["t.py", "--check", "--format", "json"], ["t.py", "--diff"], ["--help"], [".", "--check"]):
        done = subprocess.run([sys.executable, "-m", "xla_migrate", *args], cwd=tmp_path, capture_output=True)
        assert done.returncode in (0, 1), done.stderr
        assert not marker.exists(), (args, marker.read_text())


# 6. The nesting guard says what it refuses (issue 37.6) ---------------------------------------------------
def test_the_nesting_limits_in_the_message_are_the_ones_enforced():
    from xla_migrate.syntax import nesting

    def largest(make) -> int:
        size = 1
        while nesting.too_deep_at(make(size + 1)) is None:
            size += 1
        return size

    measured = {
        "nested brackets": largest(lambda n: "x = " + "[" * n + "]" * n + "\n"),
        "nested calls": largest(lambda n: "x = " + "f(" * n + ")" * n + "\n"),
        "nested blocks": largest(lambda n: "".join("    " * i + "if x:\n" for i in range(n)) + "    " * n + "pass\n"),
        "chained operators, attributes or calls": largest(lambda n: "x = " + "+".join(["a"] * n) + "\n"),
    }
    assert measured == nesting.LIMITS
    message = migrate("import torch\nx = " + "[" * 67 + "]" * 67 + "\n").error.message
    assert message == nesting.too_deep_message() and "66 nested brackets" in message
    assert migrate("import torch\nx = " + "[" * 66 + "]" * 66 + "\n").ok
