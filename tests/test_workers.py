"""Tree runs survive a worker that dies (a native crash in libcst's parser), and workers die with their
parent (``kill -9`` of the main process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import CUDA_SCRIPT, tree_snapshot
from typer.testing import CliRunner

from xla_migrate import cli
from xla_migrate.engine import input_checks
from xla_migrate.syntax import nesting

runner = CliRunner()
# libcst's native parser overflows its stack on this (exit 139, no message) when nothing stops it first.
NATIVE_CRASH = "import torch\nx = " + "[" * 3000 + "]" * 3000 + "\n"


def make_project(folder: Path) -> None:
    (folder / "pkg").mkdir(parents=True)
    for name in ("a.py", "b.py", "pkg/c.py", "pkg/d.py", "z.py"):
        (folder / name).write_text(CUDA_SCRIPT)
    (folder / "pkg" / "deep.py").write_text(NATIVE_CRASH)


def test_the_nesting_guard_stops_the_native_crash(tmp_path):
    make_project(tmp_path)
    result = runner.invoke(cli.app, ["--in", str(tmp_path), "--check", "-j", "1"])
    assert result.exit_code == 2
    # Past CPython's own limit: its compile() refuses it before the guard (which stops what CPython takes).
    assert f"error: {tmp_path / 'pkg' / 'deep.py'}:2:205: cannot parse: too many nested parentheses" in result.stderr
    assert "6 files: 5 would change" in result.stderr


@pytest.fixture
def no_crash_dump(request):
    """The workers these tests crash on purpose inherit pytest's faulthandler, whose "Fatal Python error:
    Segmentation fault" dump would land in the test log though nothing is wrong: off for the test (the
    forked workers inherit that), back on pytest's file after."""
    import faulthandler

    faulthandler.disable()
    yield
    try:
        from _pytest.faulthandler import fault_handler_stderr_fd_key

        fd = request.config.stash.get(fault_handler_stderr_fd_key, None)
    except ImportError:  # another pytest: its own stderr
        fd = None
    faulthandler.enable(file=fd if fd is not None else sys.__stderr__)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_worker_crash_costs_only_its_file(tmp_path, monkeypatch, jobs, no_crash_dump):
    """With the guard lifted the parser really segfaults in its worker: that file is one error line, every
    other file is still migrated in place, and the run exits 2 (no BrokenProcessPool, no lost files)."""
    monkeypatch.setattr(nesting, "MAX_DEPTH", 10**9)  # forked workers inherit it
    monkeypatch.setattr(input_checks, "compile_error", lambda *args: None)  # CPython's refusal lifted too
    make_project(tmp_path)
    result = runner.invoke(cli.app, ["--in", str(tmp_path), "--in-place", "-j", jobs])
    assert result.exit_code == 2, result.output
    deep = tmp_path / "pkg" / "deep.py"
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {deep}: xla-migrate crashed on this file (the process migrating it was killed by "
                      "SIGSEGV); the other files were migrated; please report it"]
    assert "6 files: 5 changed" in result.stderr
    assert deep.read_text() == NATIVE_CRASH
    for name in ("a.py", "b.py", "pkg/c.py", "pkg/d.py", "z.py"):
        assert "xm.xla_device()" in (tmp_path / name).read_text(), name


def test_a_mirror_still_copies_the_file_a_worker_crashed_on(tmp_path, monkeypatch, no_crash_dump):
    monkeypatch.setattr(nesting, "MAX_DEPTH", 10**9)
    monkeypatch.setattr(input_checks, "compile_error", lambda *args: None)
    make_project(tmp_path / "src")
    result = runner.invoke(cli.app, ["--in", str(tmp_path / "src"), "--out", str(tmp_path / "out"), "-j", "2"])
    assert result.exit_code == 2
    mirrored = tree_snapshot(tmp_path / "out")
    assert sorted(mirrored) == sorted(tree_snapshot(tmp_path / "src"))
    assert mirrored["pkg/deep.py"] == NATIVE_CRASH.encode()


def _children(pid: int) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_exit_when_the_main_process_is_killed(tmp_path):
    """kill -9 of the main process while two workers migrate: both are gone within seconds (they used to
    be re-parented, migrate a few more files and then wait forever for work)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from large_file import generate

    big = generate(120_000)  # several seconds a file
    for index in range(6):
        (tmp_path / f"s{index}.py").write_text(big)
    executable = Path(sys.executable).with_name("xla-migrate")
    main = subprocess.Popen([str(executable), "--in", ".", "--check", "-j", "2"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        workers: set[int] = set()
        while len(workers) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            workers = _children(main.pid)
        assert len(workers) >= 2, "the workers did not start"
        time.sleep(1.0)  # they are migrating now
        main.send_signal(signal.SIGKILL)
        main.wait()
        deadline = time.monotonic() + 5
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in workers)
    finally:
        for pid in _children(main.pid) | workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if main.poll() is None:
            main.kill()
