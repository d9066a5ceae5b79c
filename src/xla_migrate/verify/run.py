"""Running the scripts ``xla-migrate verify`` checks: the interpreter, the child processes, their import paths.

- :func:`find_python` picks an interpreter that has torch_xla (the current one, else ``--python``); its probe
  runs in an empty folder with the current folder off ``sys.path``, so a ``csv.py`` where the user stands is
  never imported;
- :func:`observe` runs the (migrated) script on torch_xla with the loader of :mod:`xla_migrate.verify.child`
  and torch_xla's debug output on; :func:`run_plain` runs the original on plain CPU torch (CUDA hidden) with
  the same loader, which there only records randomness and optimizers;
- every child runs in its own session (process group): the whole group is ended when the child exits, times
  out, or verify is stopped (SIGINT, SIGTERM, SIGHUP: :class:`Interrupted` says what was stopped), and on
  Linux a child dies with verify even after ``kill -9``; temporary folders are removed, and those of a verify
  that was killed outright are removed by the next run;
- each run's import path comes from :mod:`xla_migrate.verify.paths` (the original never sees the migrated
  files).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import spmd_graphs
from .replica_probe import summarize as summarize_replicas

HOW_TO_GET_TORCH_XLA = ("create one with `python3 -m venv xla-env && xla-env/bin/pip install torch torch-xla` "
                        "and pass --python xla-env/bin/python")
WORKDIR_PREFIX = "xla-migrate-verify-"


class CannotRun(Exception):
    """The check cannot run (exit 2): one line, no traceback."""


class Interrupted(BaseException):
    """verify got SIGINT, SIGTERM or SIGHUP: the running script's process group was ended (``stopped`` lists its
    processes) and its temporary folder removed. A BaseException, like KeyboardInterrupt, so nothing in between
    swallows it."""

    def __init__(self, signum: int, stopped: list[str] | None = None) -> None:
        super().__init__(signum)
        self.signum = signum
        self.stopped = list(stopped or [])

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


@contextlib.contextmanager
def stop_on_signals():
    """SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted` while the block runs (main thread only), so the
    runners' cleanup ends the script's process group and removes the temporary folders."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    signals = [s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None]

    def raise_interrupted(signum, frame):
        for other in signals:  # a second signal must not cut the cleanup short (it takes 2 s at most)
            signal.signal(other, signal.SIG_IGN)
        raise Interrupted(signum)

    previous = {}
    for signum in signals:
        previous[signum] = signal.signal(signum, raise_interrupted)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# Interpreters --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interpreter:
    path: str
    torch_xla: str
    torch: str | None


# The current folder (sys.path[0] of ``-c``) goes first: a csv.py there must not shadow the standard library's.
_PROBE = ("import sys\n"
          "sys.path[:] = [p for p in sys.path if p not in ('', '.')]\n"
          "import importlib.util as u, importlib.metadata as m\n"
          "def v(name):\n"
          "    try:\n"
          "        return m.version(name)\n"
          "    except m.PackageNotFoundError:\n"
          "        return ''\n"
          "print(v('torch_xla') if u.find_spec('torch_xla') else '')\n"
          "print(v('torch'))\n")


def find_python(requested: str | None = None) -> Interpreter:
    """The current interpreter if it has torch_xla, else ``requested``; CannotRun with the way out if neither."""
    if requested:
        path = shutil.which(requested) or requested
        if not os.path.isfile(path):
            raise CannotRun(f"--python {requested}: no such interpreter")
        found = _probe(path)
        if not found.torch_xla:
            raise CannotRun(f"--python {requested}: that interpreter has no torch_xla; {HOW_TO_GET_TORCH_XLA}")
        return found
    found = _probe(sys.executable)
    if found.torch_xla:
        return found
    raise CannotRun(f"no torch_xla in this interpreter ({sys.executable}): pass --python PATH to one that has it "
                    f"(or set XLA_MIGRATE_PYTHON); {HOW_TO_GET_TORCH_XLA}")


def _probe(path: str) -> Interpreter:
    empty = tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-probe-")
    try:
        proc = subprocess.run([path, "-c", _PROBE], capture_output=True, text=True, timeout=60, cwd=empty,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise CannotRun(f"{path}: cannot run it: {error}") from None
    finally:
        shutil.rmtree(empty, ignore_errors=True)
    if proc.returncode != 0:
        raise CannotRun(f"{path}: cannot run it: {last_error_line(proc.stderr) or f'exit {proc.returncode}'}")
    lines = (proc.stdout.splitlines() + ["", ""])[:2]
    return Interpreter(path, lines[0].strip(), lines[1].strip() or None)


# Child processes ---------------------------------------------------------------------------------------------


@dataclass
class Process:
    """A finished child process: exit status, output, and how it ended."""

    returncode: int | None
    stdout: str
    stderr: str
    wall: float
    timed_out: bool = False
    stopped_early: bool = False  # ended by us after enough loss values (run_plain with stop_after_losses)
    stopped: list[str] = field(default_factory=list)  # processes of its group still running at the end: ended
    events: list[dict] = field(default_factory=list)  # the loader's records (run_plain; observe keeps its own)

    @property
    def last_error_line(self) -> str | None:
        if self.returncode == 0 and not self.timed_out:
            return None
        if self.timed_out:
            return "timed out"
        return last_error_line(self.stderr) or (f"killed by signal {-self.returncode}"
                                                if self.returncode and self.returncode < 0 else None)


def last_error_line(stderr: str) -> str | None:
    lines = [line.rstrip() for line in stderr.splitlines() if line.strip()]
    if "Traceback (most recent call last):" in stderr:
        after = stderr.rsplit("Traceback (most recent call last):", 1)[1].splitlines()
        tops = [line.rstrip() for line in after if line.strip() and not line[:1].isspace()]
        if tops:
            return tops[-1]
    return lines[-1] if lines else None


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the child gets SIGKILL when verify dies, even by SIGKILL (then its group is not ended by us)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def group_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, short command line) of the live processes of a process group (Linux /proc; elsewhere nothing)."""
    members = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return members
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read().decode(errors="replace")
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] == "Z" or int(fields[2]) != pgid:  # state, then ppid, pgrp
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                argv = handle.read().decode(errors="replace").split("\0")
        except (OSError, ValueError, IndexError):
            continue
        members.append((int(entry), _short_command([arg for arg in argv if arg])))
    return sorted(members)


def _short_command(argv: list[str]) -> str:
    """A command line to name a process by: absolute paths by their last part, at most 120 characters."""
    command = " ".join(os.path.basename(arg) if os.path.isabs(arg) else arg for arg in argv)
    return command if len(command) <= 120 else command[:117] + "..."


def _describe(pid: int, command: str) -> str:
    return f"pid {pid} ({command})" if command else f"pid {pid}"


def end_group(proc: subprocess.Popen) -> list[str]:
    """SIGKILL to the child's whole process group (the script and whatever it started); returns what was
    still running, and waits (2 s at most) until the group is gone."""
    alive = [_describe(pid, command) for pid, command in group_members(proc.pid)]
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        if proc.poll() is None:
            proc.kill()
    proc.wait()
    deadline = time.monotonic() + 2
    while group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return alive


def run_child(argv: list[str], env: dict[str, str], cwd: str | None, timeout: float | None, workdir: Path,
              stop_when=None) -> Process:
    """Run a child in its own session with its output in files (no pipe to fill up); ``stop_when(stdout so
    far)`` ends it early. However this ends (exit, timeout, early stop, a signal to verify), the child's
    process group is ended before returning or raising."""
    out_path, err_path = workdir / "stdout.txt", workdir / "stderr.txt"
    start = time.perf_counter()
    timed_out = stopped_early = False
    linux = sys.platform.startswith("linux")
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                                start_new_session=True, preexec_fn=_die_with_parent if linux else None)
        try:
            while True:
                try:
                    proc.wait(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if timeout is not None and time.perf_counter() - start > timeout:
                    timed_out = True
                elif stop_when is not None and stop_when(out_path.read_text(errors="replace")):
                    stopped_early = True
                if timed_out or stopped_early:
                    break
        except BaseException as error:
            stopped = end_group(proc)
            if isinstance(error, Interrupted):
                error.stopped += stopped
                raise
            if isinstance(error, KeyboardInterrupt):
                raise Interrupted(signal.SIGINT, stopped) from None
            raise
        wall = time.perf_counter() - start
        # also what it left behind (data loader workers of a run that --steps ended)
        stopped = end_group(proc)
    return Process(None if timed_out else (0 if stopped_early else proc.returncode),
                   out_path.read_text(errors="replace"), err_path.read_text(errors="replace"), wall,
                   timed_out=timed_out, stopped_early=stopped_early, stopped=stopped)


# Temporary folders -----------------------------------------------------------------------------------------------


def make_workdir(kind: str = "") -> Path:
    """A temporary folder named after this process (``xla-migrate-verify-<pid>-...``)."""
    return Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-{kind + '-' if kind else ''}"))


def remove_stale_workdirs() -> list[str]:
    """Remove the temporary folders of verify runs that were killed outright (their process is gone)."""
    removed = []
    pattern = re.compile(re.escape(WORKDIR_PREFIX) + r"(\d+)-")
    root = tempfile.gettempdir()
    try:
        entries = os.listdir(root)
    except OSError:
        return removed
    for name in entries:
        match = pattern.match(name)
        if not match or int(match.group(1)) == os.getpid():
            continue
        path = os.path.join(root, name)
        try:
            if os.stat(path).st_uid != os.getuid() or not os.path.isdir(path):
                continue
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        except (OSError, AttributeError):
            continue
    return removed


LOADER_FILES = {"sitecustomize.py": "child.py", "xla_migrate_verify_hooks.py": "child_hooks.py",
                "xla_migrate_replica_probe.py": "replica_probe.py"}


def loader_source(name: str = "sitecustomize.py") -> str:
    """The text of one file of the loader (as it is named in the child's folder)."""
    return (Path(__file__).with_name(LOADER_FILES[name])).read_text(encoding="utf-8")


def _install_loader(work: Path) -> Path:
    loader = work / "loader"
    loader.mkdir(exist_ok=True)
    for name in LOADER_FILES:
        (loader / name).write_text(loader_source(name), encoding="utf-8")
    return loader


# The two runs ----------------------------------------------------------------------------------------------------


@dataclass
class Analysis:
    """One block of torch_xla's debug output (PT_XLA_DEBUG_LEVEL=2): a compilation or an execution."""

    kind: str  # "compilation" or "execution"
    cause: str
    frames: list[str]  # "file:line", innermost first
    graph_hash: str | None
    offset: int  # byte offset in the debug file


@dataclass
class Observation:
    """What the loader saw in one run of a script on torch_xla."""

    process: Process
    markers: list[dict] = field(default_factory=list)  # one snapshot per step marker (main process)
    final: dict | None = None  # the snapshot at exit (or when --steps stopped the run)
    stopped: bool = False  # --steps ended the run
    torch_xla: str | None = None
    skip_dirs: list[str] = field(default_factory=list)  # torch and torch_xla: not the user's frames
    warnings: list[dict] = field(default_factory=list)
    analyses: list[Analysis] = field(default_factory=list)
    processes: int = 0  # processes that imported torch_xla
    workdir: Path | None = None
    events: list[dict] = field(default_factory=list)  # OBSERVED_EVENTS' events, of every process
    replicas: dict | None = None  # the replica probe's summary (replica_probe.summarize), every process
    all_gathers: dict | None = None  # verify --devices: the step graph's all-gathers (spmd_graphs.all_gathers)

    @property
    def device(self) -> str | None:
        return next((m.get("device") for m in self.markers if m.get("device")), None)

    @property
    def spmd_devices(self) -> int | None:
        """The devices the SPMD program spans (0: SPMD never turned on; None: not known)."""
        return next((m["spmd_devices"] for m in self.markers if m.get("spmd_devices") is not None), None)

    @property
    def step_times(self) -> list[float]:
        return [m["time"] for m in self.markers]

    @property
    def last(self) -> dict | None:
        """The last figures known: at exit, else at the last step marker."""
        return self.final or (self.markers[-1] if self.markers else None)


_ANALYSIS = re.compile(rb"^(Compilation|Execution) Analysis: (.*)$")
_FRAME = re.compile(r"^\s+\S.*\((.+):(\d+)\)\s*$")


def parse_debug(data: bytes) -> list[Analysis]:
    """torch_xla's compilation and execution analyses (PT_XLA_DEBUG_LEVEL=2), in file order. Blocks of the
    two kinds may interleave (writes from several threads); each kind is followed on its own."""
    blocks: list[Analysis] = []
    current: dict[str, Analysis | None] = {"compilation": None, "execution": None}
    section: dict[str, str] = {"compilation": "", "execution": ""}
    offset = 0
    for raw in data.splitlines(keepends=True):
        match = _ANALYSIS.match(raw.rstrip(b"\r\n"))
        start, offset = offset, offset + len(raw)
        if not match:
            continue
        kind = match.group(1).decode().lower()
        text = match.group(2).decode("utf-8", errors="replace")
        stripped = text.strip()
        if stripped.endswith("Cause") and not stripped.startswith(("=", "-")):
            block = Analysis(kind, "", [], None, start)
            blocks.append(block)
            current[kind], section[kind] = block, "cause"
            continue
        block = current[kind]
        if block is None:
            continue
        if stripped.startswith("Graph Info"):
            section[kind] = "graph"
        elif stripped.startswith("Python Frame"):
            section[kind] = "frames"
        elif stripped.startswith(("---", "===")):
            section[kind] = ""
        elif section[kind] == "cause" and stripped:
            block.cause = f"{block.cause} {stripped}".strip()
        elif section[kind] == "graph" and stripped.startswith("Graph Hash:"):
            block.graph_hash = block.graph_hash or stripped.split(":", 1)[1].strip()
        elif section[kind] == "frames":
            frame = _FRAME.match(text)
            if frame:
                block.frames.append(f"{frame.group(1)}:{frame.group(2)}")
    return blocks


OBSERVED_EVENTS = ("random", "optimizer", "cuda-gate", "device-flags", "autocast")


def _child_env(env: dict | None, pythonpath: list[str], record: Path, deterministic: bool) -> dict[str, str]:
    child_env = dict(os.environ if env is None else env)
    for key in ("XLA_MIGRATE_VERIFY_STEPS", "XLA_MIGRATE_VERIFY_NO_DROPOUT"):
        child_env.pop(key, None)
    child_env.update(PYTHONPATH=os.pathsep.join(pythonpath), XLA_MIGRATE_VERIFY_RECORD=str(record))
    if deterministic:
        child_env["XLA_MIGRATE_VERIFY_NO_DROPOUT"] = "1"
    return child_env


def observe(python: str, script: str | os.PathLike, args: list[str] | tuple = (), *, cwd: str | None = None,
            device: str = "cpu", steps: int | None = None, debug: bool = True, env: dict | None = None,
            extra_pythonpath: list[str] | tuple = (), timeout: float | None = None,
            workdir: str | os.PathLike | None = None, pythonpath: list[str] | None = None,
            deterministic: bool = False, graphs: bool = False) -> Observation:
    """Run ``python script args`` with the loader; ``device="cpu"`` runs on PJRT CPU with CUDA hidden.
    ``graphs``: dump the compiled graphs and read the step graph's all-gathers (verify --devices).

    The import path is the loader's folder, ``extra_pythonpath``, then ``pythonpath`` (default: the
    environment's PYTHONPATH); a sitecustomize the loader shadows still runs. ``workdir`` keeps the loader, the
    records and the debug file (default: a temporary folder, removed).
    """
    keep = workdir is not None
    work = Path(workdir) if keep else make_workdir()
    work.mkdir(parents=True, exist_ok=True)
    try:
        loader = _install_loader(work)
        base = dict(os.environ if env is None else env)
        if pythonpath is None:
            pythonpath = [entry for entry in base.get("PYTHONPATH", "").split(os.pathsep) if entry]
        record = work / "record"
        child_env = _child_env(base, [str(loader), *map(str, extra_pythonpath), *pythonpath], record, deterministic)
        if steps:
            child_env["XLA_MIGRATE_VERIFY_STEPS"] = str(steps)
        debug_file = work / "debug.txt"
        if debug:
            child_env.update(PT_XLA_DEBUG_LEVEL="2", PT_XLA_DEBUG_FILE=str(debug_file))
        if device == "cpu":
            child_env.update(PJRT_DEVICE="CPU", CUDA_VISIBLE_DEVICES="")
        # The replica probe (the loader installs it): one caller-given file is read, not replaced.
        probe_file = child_env.setdefault("XLA_REPLICA_PROBE_FILE", str(work / "replicas.jsonl"))
        if graphs:
            child_env["XLA_FLAGS"] = spmd_graphs.dump_flags(work / "hlo", child_env.get("XLA_FLAGS"))
        process = run_child([str(python), str(script), *args], child_env, cwd, timeout, work)
        observation = read_records(work, process)
        if graphs:
            observation.all_gathers = spmd_graphs.all_gathers(work / "hlo")
        observation.replicas = summarize_replicas(probe_file)
        if debug and debug_file.exists():
            observation.analyses = parse_debug(debug_file.read_bytes())
        observation.workdir = work if keep else None
        return observation
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def _records(work: Path) -> list[list[dict]]:
    runs = []
    for path in sorted(work.glob("record.*")):
        events = []
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:  # a line cut by a process killed mid-write
                continue
        runs.append(events)
    return runs


def read_records(work: Path, process: Process) -> Observation:
    """The loader's records of every process; the figures are those of the process that ran the steps."""
    observation = Observation(process)
    runs = _records(work)
    for events in runs:
        observation.warnings += [e for e in events if e["event"] == "warning"]
        observation.events += [e for e in events if e["event"] in OBSERVED_EVENTS]
    started = [events for events in runs if any(e["event"] == "start" for e in events)]
    observation.processes = len(started)
    if not started:
        return observation
    main = max(started, key=lambda events: sum(e["event"] == "marker" for e in events))
    for event in main:
        if event["event"] == "start":
            observation.torch_xla = event.get("torch_xla")
            observation.skip_dirs = event.get("skip_dirs", [])
        elif event["event"] == "marker":
            observation.markers.append(event)
        elif event["event"] == "exit":
            observation.final = event
            observation.stopped = bool(event.get("stopped"))
    return observation


def one_process_world(env: dict | None = None) -> dict[str, str]:
    """The environment torchrun gives the one process of a world of one (rank 0 of 1, a free local port), for
    an original that reads it; variables the caller set are kept."""
    import socket

    world = dict(os.environ if env is None else env)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1"),
                       ("GROUP_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port))):
        world.setdefault(key, value)
    return world


def run_plain(python: str, script: str | os.PathLike, args: list[str] | tuple = (), *, cwd: str | None = None,
              loss_regex: str | None = None, stop_after_losses: int | None = None,
              timeout: float | None = None, env: dict | None = None, pythonpath: list[str] | None = None,
              deterministic: bool = False) -> Process:
    """Run the original on plain CPU torch: CUDA hidden, no torch_xla settings; the loader records its
    randomness and optimizers (``Process.events``). With ``stop_after_losses`` it ends once it printed that many
    loss values (to match a run cut by --steps)."""
    from .losses import DEFAULT_LOSS_REGEX, loss_matches

    base = {k: v for k, v in (os.environ if env is None else env).items()
            if not k.startswith(("XLA_MIGRATE_VERIFY_", "PJRT_", "PT_XLA_", "XLA_REPLICA_PROBE_"))}
    # transformers and accelerate pick torch_xla's device whenever torch_xla is installed; the original runs
    # on plain CPU torch.
    base.setdefault("USE_TORCH_XLA", "0")
    if pythonpath is None:
        pythonpath = [entry for entry in base.get("PYTHONPATH", "").split(os.pathsep) if entry]
    pattern = re.compile(loss_regex or DEFAULT_LOSS_REGEX, re.MULTILINE)
    seen = {"lines": 0, "losses": 0}

    def enough_losses(stdout: str) -> bool:
        # Count in complete lines not read before (the output only grows).
        lines = stdout.splitlines(keepends=True)
        complete = len(lines) - (1 if lines and not lines[-1].endswith("\n") else 0)
        seen["losses"] += len(loss_matches("".join(lines[seen["lines"]:complete]), pattern))
        seen["lines"] = max(seen["lines"], complete)
        return seen["losses"] >= stop_after_losses

    work = make_workdir("plain")
    try:
        loader = _install_loader(work)
        child_env = _child_env(base, [str(loader), *pythonpath], work / "record", deterministic)
        child_env.update(CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
        process = run_child([str(python), str(script), *args], child_env, cwd, timeout, work,
                            enough_losses if stop_after_losses else None)
        process.events = [e for events in _records(work) for e in events if e["event"] in OBSERVED_EVENTS]
        return process
    finally:
        shutil.rmtree(work, ignore_errors=True)
