"""The bad-input matrix beyond tests/test_cli.py, and atomic writes: nothing half-written, nothing lost."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import CUDA_SCRIPT, run_cli, tree_snapshot
from typer.testing import CliRunner

from xla_migrate import cli
from xla_migrate.report import files

runner = CliRunner()


def test_empty_file_migrates_to_itself(tmp_path):
    (tmp_path / "empty.py").write_bytes(b"")
    result = runner.invoke(cli.app, ["--in", str(tmp_path / "empty.py"), "--out", str(tmp_path / "out.py")])
    assert result.exit_code == 0
    assert (tmp_path / "out.py").read_bytes() == b""
    assert runner.invoke(cli.app, ["--in", str(tmp_path / "empty.py"), "--check"]).exit_code == 0


def test_unreadable_file(tmp_path):
    source = tmp_path / "secret.py"
    source.write_text(CUDA_SCRIPT)
    source.chmod(0)
    if os.access(source, os.R_OK):  # root reads anything: use a file the kernel refuses to read instead
        source = Path("/proc/self/mem")
    result = runner.invoke(cli.app, ["--in", str(source), "--out", str(tmp_path / "out.py")])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {source}: cannot read: ")
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out.py").exists()


def test_failing_write_midway_keeps_the_old_file_and_leaves_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "train_xla.py"
    target.write_bytes(b"old\n")

    real_fsync = os.fsync

    def crash(fd):  # the data is half on disk when the "power goes": fail before the rename
        os.write(fd, b"partial")
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError):
        files.write_atomically(target, b"new content\n" * 1000)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert target.read_bytes() == b"old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["train_xla.py"]


KILLER = """
import sys
from pathlib import Path
from xla_migrate.report import files
target = Path(sys.argv[1])
data = b"y" * (64 * 1024 * 1024)
print("ready", flush=True)
while True:
    files.write_atomically(target, data)
"""


def test_killed_writer_never_leaves_a_partial_target(tmp_path):
    """SIGKILL a process that rewrites a 64 MB file in a loop: the target is always whole (old or new).
    (A temp file may survive SIGKILL, which no cleanup can catch; it never has the target's name.)"""
    target = tmp_path / "out.py"
    target.write_bytes(b"x" * (64 * 1024 * 1024))
    process = subprocess.Popen([sys.executable, "-c", KILLER, str(target)], stdout=subprocess.PIPE)
    assert process.stdout.readline().strip() == b"ready"
    time.sleep(0.5)
    process.send_signal(signal.SIGKILL)
    process.wait()
    content = target.read_bytes()
    assert content in (b"x" * (64 * 1024 * 1024), b"y" * (64 * 1024 * 1024))
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "out.py"]
    assert all(name.startswith(".out.py.") and name.endswith(".xla-migrate.tmp") for name in leftovers)


def test_nothing_written_on_error_through_a_real_process(tmp_path):
    (tmp_path / "bad.py").write_text("def f(:\n")
    before = tree_snapshot(tmp_path)
    done = run_cli("--in", "bad.py", "--out", "bad_xla.py", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.decode().startswith("error: bad.py:1:")
    assert tree_snapshot(tmp_path) == before


def test_large_generated_script_finishes_with_bounded_memory(tmp_path):
    """A 5 MB generated script (about 150,000 lines) through a real process: it migrates completely, and
    the process's peak memory stays bounded (issue 17's bar is 1.5 GB; the bound, 2 GB at 5 MB, leaves room
    for other machines' allocators). Its time is issue 38's, measured in benchmarks/, not here: CI on 2 cores
    took 298-373 s for it in the thirteenth session (the bar is 60 s).
    XLA_MIGRATE_LARGE_FILE_MB sets another size."""
    import resource

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from large_file import generate

    megabytes = float(os.environ.get("XLA_MIGRATE_LARGE_FILE_MB", "5"))
    source = tmp_path / "big.py"
    source.write_text(generate(int(megabytes * 1_000_000)))
    done = run_cli("--in", "big.py", "--out", "big_xla.py", "-q", cwd=tmp_path, timeout=1800)
    assert done.returncode == 0, done.stderr
    output = (tmp_path / "big_xla.py").read_text()
    assert output.count("xm.optimizer_step(optimizer)") == source.read_text().count("optimizer.step()")
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    assert peak_mb < 500 + 300 * megabytes, f"peak memory {peak_mb:.0f} MB"


# Writes through symlinks and to special files ------------------------------------------------------------
def test_in_place_through_a_symlink_rewrites_the_target_and_keeps_the_link(tmp_path):
    real = tmp_path / "real" / "train.py"
    real.parent.mkdir()
    real.write_text(CUDA_SCRIPT)
    link = tmp_path / "train.py"
    link.symlink_to(real)
    result = runner.invoke(cli.app, ["--in", str(link), "--in-place"])
    assert result.exit_code == 0, result.stderr
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert "xm.xla_device()" in real.read_text()
    assert sorted(p.name for p in real.parent.iterdir()) == ["train.py"]  # no temp file left beside it


def test_out_through_a_symlink_writes_its_target(tmp_path):
    (tmp_path / "train.py").write_text(CUDA_SCRIPT)
    target = tmp_path / "elsewhere.py"
    target.write_text("old\n")
    link = tmp_path / "train_xla.py"
    link.symlink_to(target)
    result = runner.invoke(cli.app, ["--in", str(tmp_path / "train.py"), "--out", str(link)])
    assert result.exit_code == 0, result.stderr
    assert link.is_symlink() and "xm.xla_device()" in target.read_text()


def test_out_a_fifo_is_written_to_directly(tmp_path):
    import threading

    (tmp_path / "train.py").write_text(CUDA_SCRIPT)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    done = run_cli("--in", "train.py", "--out", "pipe", cwd=tmp_path)
    reader.join(timeout=30)
    assert done.returncode == 0, done.stderr
    assert b"xm.xla_device()" in received[0]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still a FIFO, not replaced by a regular file


def test_out_a_character_device_is_written_to_directly(tmp_path):
    """/dev/null and friends: written like ``-``, never replaced (as root a rename would replace the node)."""
    (tmp_path / "train.py").write_text(CUDA_SCRIPT)
    null = tmp_path / "null"
    try:
        os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # what /dev/null is
    except (PermissionError, AttributeError):
        pytest.skip("creating a device node needs root")
    for out in (str(null), "/dev/null"):
        result = runner.invoke(cli.app, ["--in", str(tmp_path / "train.py"), "--out", out])
        assert result.exit_code == 0, result.stderr
        assert stat.S_ISCHR(os.lstat(out).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null", "train.py"]


def test_out_a_socket_is_refused_with_one_line(tmp_path):
    import socket

    (tmp_path / "train.py").write_text(CUDA_SCRIPT)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "sock"))
    try:
        result = runner.invoke(cli.app, ["--in", str(tmp_path / "train.py"), "--out", str(tmp_path / "sock")])
    finally:
        server.close()
    assert result.exit_code == 2
    assert result.stderr == (f"error: {tmp_path / 'sock'}: cannot write: is a socket; xla-migrate writes regular "
                             "files, FIFOs and character devices\n")
    assert stat.S_ISSOCK(os.lstat(tmp_path / "sock").st_mode)


def test_output_of_an_input_nobody_may_read_has_a_normal_mode(tmp_path):
    """Root reads a ``chmod 000`` input; its output must not be mode 000 too (nobody else could open it):
    it gets a new file's mode, 0o666 less the umask, for one file and in a mirror."""
    source = tmp_path / "tree" / "train.py"
    source.parent.mkdir()
    source.write_text(CUDA_SCRIPT)
    source.chmod(0)
    if not os.access(source, os.R_OK):
        pytest.skip("only root can read a chmod 000 file")
    assert runner.invoke(cli.app, ["--in", str(source), "--out", str(tmp_path / "out.py")]).exit_code == 0
    assert runner.invoke(cli.app, ["--in", str(source.parent), "--out", str(tmp_path / "mirror")]).exit_code == 0
    umask = os.umask(0)
    os.umask(umask)
    for output in (tmp_path / "out.py", tmp_path / "mirror" / "train.py"):
        assert "xm.xla_device()" in output.read_text()
        assert stat.S_IMODE(output.stat().st_mode) == 0o666 & ~umask, output


# Deep nesting -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("depth, message", [
    (3000, "2:205: cannot parse: too many nested parentheses"),  # CPython's compile() refuses it first
    (150, "2:71: too deeply nested for xla-migrate: it takes at most 66 nested brackets, 49 nested calls, 99 "
          "nested blocks, 199 chained operators, attributes or calls, fewer where they combine (CPython itself "
          "takes 200 nested brackets and 100 nested blocks)"),
])
def test_deeply_nested_input_is_one_line_and_exit_2(tmp_path, depth, message):
    (tmp_path / "deep.py").write_text("import torch\nx = " + "[" * depth + "]" * depth + "\n")
    done = run_cli("--in", "deep.py", "--out", "deep_xla.py", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.decode() == f"error: deep.py:{message}\n"
    assert not (tmp_path / "deep_xla.py").exists()


def _at_the_limit(make):
    """The largest size ``make(n)`` the nesting guard accepts."""
    from xla_migrate.syntax.nesting import too_deep_at

    low, high = 1, 4000
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if too_deep_at(make(middle)) is None else (low, middle)
    return low


SHAPES = {  # each with a rewrite at its deepest point, so the edit pass recurses as deep as the analysis
    "lists": lambda n: "import torch\nx = " + "[" * n + "m.cuda()" + "]" * n + "\n",
    "calls": lambda n: "import torch\nx = " + "f(" * n + "m.cuda()" + ")" * n + "\n",
    "subscripts": lambda n: "import torch\nx = " + "a[" * n + "m.cuda()" + "]" * n + "\n",
    "sum": lambda n: "import torch\nx = m.cuda()" + " + 1" * n + "\n",
    "attributes": lambda n: "import torch\nx = m.cuda()" + ".b" * n + "\n",
    "joined strings": lambda n: "import torch\nx = m.to('cuda', " + " ".join(["'a'"] * n) + ")\n",
    "elif chain": lambda n: "import torch\nif a:\n    pass\n" + "elif a:\n    m.cuda()\n" * n,
    "blocks": lambda n: "import torch\n" + "".join(" " * i + "if a:\n" for i in range(15)) + " " * 15
    + "x = m.cuda()" + " + 1" * n + "\n",
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_input_at_the_nesting_limit_migrates_with_room_to_spare(shape):
    """What the guard accepts, libcst survives with 150 frames of the caller's on the stack (pytest's own
    and more): the limit sits well within what libcst's recursion allows (see nesting.py for the figures)."""
    from xla_migrate import migrate
    from xla_migrate.syntax.nesting import too_deep_at

    size = _at_the_limit(SHAPES[shape])
    assert too_deep_at(SHAPES[shape](size + 3)) is not None

    def deep(frames):
        return deep(frames - 1) if frames else migrate(SHAPES[shape](size))

    result = deep(150)
    assert result.ok, result.error
    assert result.changes and migrate(result.output_bytes).code == result.code
    compile(result.code, "<migrated>", "exec")
