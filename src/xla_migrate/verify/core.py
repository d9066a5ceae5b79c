"""``xla-migrate verify``: run a (migrated) script on torch_xla and say whether it runs the way XLA wants.

One implementation of these measurements, used by the command, by ``xla-migrate --verify`` and by the proof
tier (tests/xla) and its benchmark:

- :func:`find_python` picks an interpreter that has torch_xla (the current one, else ``--python``);
- :func:`observe` runs a script there with the loader of :mod:`xla_migrate.verify.child` (never part of the
  script) and torch_xla's debug output on, and reads back what it saw (:class:`Observation`);
- :func:`run_plain` runs the original on plain CPU torch (CUDA hidden), for its loss curve;
- :func:`assess` turns those into a :class:`Report`: figures, problems, a verdict and an exit code;
- :func:`render_text` and :meth:`Report.to_json` (schema docs/verify.schema.json).

Exit codes: 0 clean; 1 a slowdown or a divergence (recompilation after warm-up, more than one graph execution
per step, host reads on most steps, ops that fell back to the CPU, no step marker, losses that differ from the
original or are not finite, a crash); 2 the check cannot run (no torch_xla, a missing script, an original that
does not run on plain CPU torch).

Over 600 lines, kept whole on purpose for now: the verifier is being rewritten (and split) in parallel, and
one move here keeps that rewrite's rebase a rename.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA = "xla-migrate-verify"
SCHEMA_VERSION = 1

EXIT_CLEAN, EXIT_PROBLEM, EXIT_CANNOT_RUN = 0, 1, 2

WARMUP_MARKERS = 5  # step markers allowed to compile (first step, optimizer state appearing...)
LATE_COMPILES = 3  # new graphs allowed after warm-up (an evaluation loop, a smaller last batch)
FP32_TOLERANCE = 1e-3  # largest |loss delta| against the original, fp32
DEFAULT_LOSS_REGEX = r"(?i)loss\b[^0-9a-z\n+-]*(?:tensor\()?\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|nan|inf)"
HOW_TO_GET_TORCH_XLA = ("create one with `python3 -m venv xla-env && xla-env/bin/pip install torch torch-xla` "
                        "and pass --python xla-env/bin/python")
AMP_MARKERS = re.compile(r"\b(autocast|GradScaler)\b")
READ_CAUSE = "access tensor value"  # torch_xla's cause for an execution forced by reading a lazy tensor


class CannotRun(Exception):
    """The check cannot run (exit 2): one line, no traceback."""


# Interpreters --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interpreter:
    path: str
    torch_xla: str
    torch: str | None


_PROBE = ("import importlib.util as u, importlib.metadata as m\n"
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
    try:
        proc = subprocess.run([path, "-c", _PROBE], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise CannotRun(f"{path}: cannot run it: {error}") from None
    if proc.returncode != 0:
        raise CannotRun(f"{path}: cannot run it: {_last_error_line(proc.stderr) or f'exit {proc.returncode}'}")
    lines = (proc.stdout.splitlines() + ["", ""])[:2]
    return Interpreter(path, lines[0].strip(), lines[1].strip() or None)


# Running ---------------------------------------------------------------------------------------------------


@dataclass
class Process:
    """A finished child process: exit status, output, and how it ended."""

    returncode: int | None
    stdout: str
    stderr: str
    wall: float
    timed_out: bool = False
    stopped_early: bool = False  # ended by us after enough loss values (run_plain with stop_after_losses)

    @property
    def last_error_line(self) -> str | None:
        if self.returncode == 0 and not self.timed_out:
            return None
        if self.timed_out:
            return "timed out"
        return _last_error_line(self.stderr) or (f"killed by signal {-self.returncode}"
                                                 if self.returncode and self.returncode < 0 else None)


def _last_error_line(stderr: str) -> str | None:
    lines = [line.rstrip() for line in stderr.splitlines() if line.strip()]
    if "Traceback (most recent call last):" in stderr:
        after = stderr.rsplit("Traceback (most recent call last):", 1)[1].splitlines()
        tops = [line.rstrip() for line in after if line.strip() and not line[:1].isspace()]
        if tops:
            return tops[-1]
    return lines[-1] if lines else None


def _run(argv: list[str], env: dict[str, str], cwd: str | None, timeout: float | None, workdir: Path,
         stop_when=None) -> Process:
    """Run a child with its output in files (no pipe to fill up); ``stop_when(stdout_so_far)`` ends it early."""
    out_path, err_path = workdir / "stdout.txt", workdir / "stderr.txt"
    start = time.perf_counter()
    timed_out = stopped = False
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                                start_new_session=True)
        while True:
            try:
                proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            if timeout is not None and time.perf_counter() - start > timeout:
                timed_out = True
            elif stop_when is not None and stop_when(out_path.read_text(errors="replace")):
                stopped = True
            if timed_out or stopped:
                break
        _kill(proc)  # also what it left behind (data loader workers of a run that --steps ended)
    wall = time.perf_counter() - start
    return Process(None if timed_out else (0 if stopped else proc.returncode),
                   out_path.read_text(errors="replace"), err_path.read_text(errors="replace"), wall,
                   timed_out=timed_out, stopped_early=stopped)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the script and whatever it started (its own session)
    except (ProcessLookupError, PermissionError):
        if proc.poll() is None:
            proc.kill()
    proc.wait()


def loader_source() -> str:
    return (Path(__file__).with_name("child.py")).read_text(encoding="utf-8")


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

    @property
    def device(self) -> str | None:
        return next((m.get("device") for m in self.markers if m.get("device")), None)

    @property
    def step_times(self) -> list[float]:
        return [m["time"] for m in self.markers]

    @property
    def last(self) -> dict | None:
        """The last figures known: at exit, else at the last step marker."""
        return self.final or (self.markers[-1] if self.markers else None)


def observe(python: str, script: str | os.PathLike, args: list[str] | tuple = (), *, cwd: str | None = None,
            device: str = "cpu", steps: int | None = None, debug: bool = True, env: dict | None = None,
            extra_pythonpath: list[str] | tuple = (), timeout: float | None = None,
            workdir: str | os.PathLike | None = None) -> Observation:
    """Run ``python script args`` with the loader; ``device="cpu"`` runs on PJRT CPU with CUDA hidden.

    ``extra_pythonpath`` goes after the loader's folder (a sitecustomize there still runs: the loader chains
    to it). ``workdir`` keeps the loader, the records and the debug file (default: a temporary folder, removed).
    """
    keep = workdir is not None
    work = Path(workdir) if keep else Path(tempfile.mkdtemp(prefix="xla-migrate-verify-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        loader = work / "loader"
        loader.mkdir(exist_ok=True)
        (loader / "sitecustomize.py").write_text(loader_source(), encoding="utf-8")
        child_env = dict(os.environ if env is None else env)
        child_env.pop("XLA_MIGRATE_VERIFY_STEPS", None)
        record = work / "record"
        debug_file = work / "debug.txt"
        paths = [str(loader), *map(str, extra_pythonpath)]
        if child_env.get("PYTHONPATH"):
            paths.append(child_env["PYTHONPATH"])
        child_env.update(PYTHONPATH=os.pathsep.join(paths), XLA_MIGRATE_VERIFY_RECORD=str(record))
        if steps:
            child_env["XLA_MIGRATE_VERIFY_STEPS"] = str(steps)
        if debug:
            child_env.update(PT_XLA_DEBUG_LEVEL="2", PT_XLA_DEBUG_FILE=str(debug_file))
        if device == "cpu":
            child_env.update(PJRT_DEVICE="CPU", CUDA_VISIBLE_DEVICES="")
        process = _run([str(python), str(script), *args], child_env, cwd, timeout, work)
        observation = read_records(work, process)
        if debug and debug_file.exists():
            observation.analyses = parse_debug(debug_file.read_bytes())
        observation.workdir = work if keep else None
        return observation
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def read_records(work: Path, process: Process) -> Observation:
    """The loader's records of every process; the figures are those of the process that ran the steps."""
    observation = Observation(process)
    runs = []
    for path in sorted(work.glob("record.*")):
        events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        runs.append(events)
        observation.warnings += [e for e in events if e["event"] == "warning"]
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


def run_plain(python: str, script: str | os.PathLike, args: list[str] | tuple = (), *, cwd: str | None = None,
              loss_regex: str = DEFAULT_LOSS_REGEX, stop_after_losses: int | None = None,
              timeout: float | None = None, env: dict | None = None) -> Process:
    """Run the original on plain CPU torch: CUDA hidden, no torch_xla settings, no loader. With
    ``stop_after_losses`` it ends once it printed that many loss values (to match a run cut by --steps)."""
    child_env = {k: v for k, v in (os.environ if env is None else env).items()
                 if not k.startswith(("XLA_MIGRATE_VERIFY_", "PJRT_", "PT_XLA_"))}
    child_env.update(CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    pattern = re.compile(loss_regex, re.MULTILINE)
    seen = {"lines": 0, "losses": 0}

    def enough_losses(stdout: str) -> bool:
        # Count in complete lines not read before (the output only grows).
        lines = stdout.splitlines(keepends=True)
        complete = len(lines) - (1 if lines and not lines[-1].endswith("\n") else 0)
        seen["losses"] += len(_losses("".join(lines[seen["lines"]:complete]), pattern))
        seen["lines"] = max(seen["lines"], complete)
        return seen["losses"] >= stop_after_losses

    work = Path(tempfile.mkdtemp(prefix="xla-migrate-verify-plain-"))
    try:
        return _run([str(python), str(script), *args], child_env, cwd, timeout, work,
                    enough_losses if stop_after_losses else None)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# Reading the output ----------------------------------------------------------------------------------------------


def parse_losses(stdout: str, loss_regex: str = DEFAULT_LOSS_REGEX) -> list[float]:
    """The loss values a run printed: the regex's first group (or the whole match), one per match."""
    return _losses(stdout, re.compile(loss_regex, re.MULTILINE))


def _losses(stdout: str, pattern: re.Pattern) -> list[float]:
    values = []
    for match in pattern.finditer(stdout):
        text = match.group(1) if pattern.groups else match.group(0)
        try:
            values.append(float(text))
        except (TypeError, ValueError):
            continue
    return values


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


# Assessing ------------------------------------------------------------------------------------------------------


@dataclass
class Problem:
    kind: str  # crash, timeout, no-step-marker, recompilation, executions, host-reads, fallback, losses
    message: str


@dataclass
class Report:
    script: str
    args: list[str]
    python: str | None
    requested_device: str
    torch_xla: str | None = None
    device: str | None = None
    run: dict = field(default_factory=dict)
    steps: dict = field(default_factory=dict)
    compilations: dict = field(default_factory=dict)
    executions: dict = field(default_factory=dict)
    host_reads: dict = field(default_factory=dict)
    fallback_ops: list[dict] = field(default_factory=list)
    deprecations: list[dict] = field(default_factory=list)
    losses: dict = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    cannot_run: str | None = None
    against: str | None = None

    @property
    def status(self) -> str:
        if self.cannot_run:
            return "cannot-run"
        kinds = {p.kind for p in self.problems}
        if kinds & {"crash", "timeout"}:
            return "crash"
        if "losses" in kinds:
            return "divergence"
        return "slowdown" if kinds else "clean"

    @property
    def exit_code(self) -> int:
        return {"clean": EXIT_CLEAN, "cannot-run": EXIT_CANNOT_RUN}.get(self.status, EXIT_PROBLEM)

    @property
    def verdict(self) -> str:
        if self.cannot_run:
            return f"verdict: cannot run: {self.cannot_run}"
        if self.problems:
            return f"verdict: {self.status}: " + "; ".join(p.message for p in self.problems)
        return "verdict: clean: " + _clean_summary(self)

    def to_json(self) -> dict:
        from .. import __version__

        return {
            "schema": SCHEMA, "version": SCHEMA_VERSION,
            "tool": {"name": "xla-migrate", "version": __version__},
            "script": self.script, "against": self.against, "args": list(self.args), "python": self.python,
            "torch_xla": self.torch_xla, "requested_device": self.requested_device, "device": self.device,
            "verdict": {"status": self.status, "exit_code": self.exit_code, "line": self.verdict,
                        "problems": [{"kind": p.kind, "message": p.message} for p in self.problems]},
            "run": self.run, "steps": self.steps, "compilations": self.compilations,
            "executions": self.executions, "host_reads": self.host_reads, "fallback_ops": self.fallback_ops,
            "deprecations": self.deprecations,
            "losses": {**self.losses, "values": _json_numbers(self.losses.get("values") or []),
                       "original": None if self.losses.get("original") is None
                       else _json_numbers(self.losses["original"])},
        }


def _json_numbers(values: list[float]) -> list:
    """JSON has no NaN or infinity: those become the strings Python's json module would write unquoted."""
    return [v if math.isfinite(v) else ("NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity"))
            for v in values]


def cannot_run_report(script: str, args, python: str | None, device: str, reason: str) -> Report:
    report = Report(str(script), list(args), python, device, cannot_run=reason)
    report.run = {"exit_status": None, "last_error_line": None, "wall_s": 0.0, "timed_out": False,
                  "stopped_after_steps": None, "processes": 0}
    report.steps = {"markers": 0, "warmup": 0, "after_warmup": 0}
    report.compilations = {"total": 0, "after_warmup": 0, "allowed_after_warmup": 0, "graphs_after_warmup": 0,
                           "causes": []}
    report.executions = {"total": 0, "after_warmup": 0, "per_step": None}
    report.host_reads = {"scalar_reads": 0, "transfers": 0, "in_step_closures": 0, "outside_per_step": None,
                         "sites": [], "forced_executions": []}
    report.losses = {"regex": DEFAULT_LOSS_REGEX, "values": [], "original": None, "mode": None,
                     "tolerance": None, "compared": 0, "max_delta": None, "ok": None, "note": None}
    return report


def _zero() -> dict:
    return {"compiles": 0, "executions": 0, "transfers": 0, "reads": 0, "closure_reads": 0,
            "closure_transfers": 0, "debug_offset": 0, "fallbacks": {}}


def warmup_markers(markers: int) -> int:
    """Step markers counted as warm-up: 5, or half of a shorter run (so it still has steps to judge)."""
    return min(WARMUP_MARKERS, markers // 2)


def _relative(where: str, cwd: str) -> str:
    """An absolute path:line inside the working folder, relative to it (a relative one already is)."""
    path, _, line = where.rpartition(":")
    if not os.path.isabs(path):
        return where
    try:
        rel = os.path.relpath(path, cwd)
    except ValueError:
        return where
    return f"{rel if not rel.startswith('..') else path}:{line}"


def _user_frame(frames: list[str], skip_dirs: list[str]) -> str | None:
    for frame in frames:
        if not any(frame.startswith(folder) for folder in skip_dirs):
            return frame
    return None


def assess(observation: Observation, script: str, args=(), *, python: str | None = None, device: str = "cpu",
           original: Process | None = None, original_required: bool = True, amp: bool | None = None,
           loss_regex: str = DEFAULT_LOSS_REGEX, steps: int | None = None, cwd: str | None = None) -> Report:
    """The figures of one run (and the original's loss curve), the problems found and the verdict."""
    cwd = cwd or os.getcwd()
    process = observation.process
    report = Report(str(script), list(args), python, device, torch_xla=observation.torch_xla,
                    device=observation.device)
    report.run = {"exit_status": process.returncode, "last_error_line": process.last_error_line,
                  "wall_s": round(process.wall, 3), "timed_out": process.timed_out,
                  "stopped_after_steps": steps if observation.stopped else None,
                  "processes": observation.processes}
    markers = observation.markers
    last = observation.last or _zero()
    warm = warmup_markers(len(markers))
    at_warm = markers[warm - 1] if warm else _zero()
    at_end = markers[-1] if markers else _zero()
    window = len(markers) - warm if warm else 0  # a single step marker leaves nothing to judge per step
    report.steps = {"markers": len(markers), "warmup": warm, "after_warmup": window}

    # Compilations: all of them, and those after warm-up with torch_xla's causes.
    compiles_late = at_end["compiles"] - at_warm["compiles"]  # between the warm-up and the last marker
    allowed = min(LATE_COMPILES, max(1, window // 2)) if window else 0
    compilations = [a for a in observation.analyses if a.kind == "compilation"]
    causes: dict[tuple[str, str | None], list[int]] = {}
    late_offset = at_warm["debug_offset"] if warm else 0
    end_offset = at_end["debug_offset"] if markers else 0
    late_graphs = set()
    for block in compilations:
        where = _user_frame(block.frames, observation.skip_dirs)
        key = (block.cause or "?", _relative(where, cwd) if where else None)
        entry = causes.setdefault(key, [0, 0])
        entry[0] += 1
        if warm and late_offset <= block.offset < end_offset:
            entry[1] += 1
            late_graphs.add(block.graph_hash)
    report.compilations = {
        "total": last["compiles"], "after_warmup": compiles_late, "allowed_after_warmup": allowed,
        "graphs_after_warmup": len(late_graphs),
        "causes": sorted(({"cause": cause, "where": where, "count": n, "after_warmup": late}
                          for (cause, where), (n, late) in causes.items()),
                         key=lambda c: (-c["after_warmup"], -c["count"], c["where"] or "")),
    }

    # Graph executions per step, after warm-up.
    executions_late = at_end["executions"] - at_warm["executions"]
    report.executions = {"total": last["executions"], "after_warmup": executions_late,
                         "per_step": round(executions_late / window, 3) if window else None}

    # Host reads: torch_xla's counters, what step closures read, and the source lines.
    outside_late = ((at_end["transfers"] - at_end["closure_transfers"])
                    - (at_warm["transfers"] - at_warm["closure_transfers"]))
    sites: dict[tuple[str, bool], int] = {}
    for snapshot in [*markers, *([observation.final] if observation.final else [])]:
        for where, count, in_closure in snapshot.get("sites", []):
            key = (_relative(where, cwd), bool(in_closure))
            sites[key] = sites.get(key, 0) + count
    forced: dict[str, int] = {}
    for block in observation.analyses:
        if block.kind == "execution" and READ_CAUSE in block.cause:
            where = _user_frame(block.frames, observation.skip_dirs)
            if where:
                forced[_relative(where, cwd)] = forced.get(_relative(where, cwd), 0) + 1
    report.host_reads = {
        "scalar_reads": last["reads"], "transfers": last["transfers"],
        "in_step_closures": last["closure_transfers"],
        "outside_per_step": round(outside_late / window, 3) if window else None,
        "sites": sorted(({"where": w, "count": n, "in_step_closure": c} for (w, c), n in sites.items()),
                        key=lambda s: (s["in_step_closure"], -s["count"], s["where"])),
        "forced_executions": sorted(({"where": w, "count": n} for w, n in forced.items()),
                                    key=lambda s: (-s["count"], s["where"])),
    }
    report.fallback_ops = sorted(({"op": op, "count": n} for op, n in last.get("fallbacks", {}).items() if n),
                                 key=lambda f: (-f["count"], f["op"]))
    seen: dict[tuple[str, str], int] = {}
    for warning in observation.warnings:
        if re.search("xla", warning["message"], re.IGNORECASE):
            key = (warning["message"], _relative(warning["where"], cwd))
            seen[key] = seen.get(key, 0) + 1
    report.deprecations = [{"message": m, "where": w, "count": n} for (m, w), n in seen.items()]

    _find_run_problems(report, observation, window, compiles_late, allowed, executions_late, outside_late)
    _compare_losses(report, observation, original, original_required, amp, loss_regex, script)
    return report


def _find_run_problems(report: Report, observation: Observation, window: int, compiles_late: int, allowed: int,
                       executions_late: int, outside_late: int) -> None:
    process, problems = observation.process, report.problems
    if process.timed_out:
        problems.append(Problem("timeout", f"timed out after {process.wall:.0f} s"))
    elif process.returncode != 0:
        status = (f"killed by signal {-process.returncode}" if process.returncode < 0
                  else f"exit status {process.returncode}")
        problems.append(Problem("crash", f"{status}: {process.last_error_line or 'no error message'}"))
    if observation.processes == 0:
        if not problems:
            problems.append(Problem("no-step-marker", "the script never imported torch_xla"))
        return
    if problems:
        return  # it crashed: the figures up to the crash are in the report, the crash is the verdict
    if not observation.markers:
        problems.append(Problem("no-step-marker", "no step marker (no device loader, mark_step or sync): "
                                "torch_xla traced the whole run as one graph"))
    if window:
        late = [c for c in report.compilations["causes"] if c["after_warmup"]]
        if compiles_late > allowed:
            graphs = report.compilations["graphs_after_warmup"]
            what = f" of {_plural(graphs, 'different graph')}" if graphs else ""
            where = f", {late[0]['cause']} at {late[0]['where']}" if late and late[0]["where"] else ""
            problems.append(Problem("recompilation", f"{compiles_late} compilations{what} in the {window} steps "
                                    f"after warm-up (allowed {allowed}{where}): the graph changes from step to "
                                    f"step (shapes, or Python values traced as constants)"))
        if executions_late > window + max(1, window // 10):
            forced = report.host_reads["forced_executions"]
            where = f" (forced at {forced[0]['where']})" if forced else ""
            problems.append(Problem("executions", f"{executions_late / window:.1f} graph executions per step "
                                    f"after warm-up{where}: something reads a lazy tensor mid-step"))
        if outside_late > window / 2:
            outside = [s for s in report.host_reads["sites"] if not s["in_step_closure"]]
            where = f" (at {outside[0]['where']})" if outside else ""
            problems.append(Problem("host-reads", f"{outside_late / window:.1f} host reads per step outside "
                                    f"step closures{where}: the host waits for the device every step"))
    if report.fallback_ops:
        names = ", ".join(f"{f['op']} ({f['count']})" for f in report.fallback_ops)
        problems.append(Problem("fallback", f"ops without an XLA lowering ran on the CPU: {names}"))


def is_amp(*sources: str) -> bool:
    return any(AMP_MARKERS.search(source) for source in sources)


def _read(path: str | None) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace") if path else ""
    except OSError:
        return ""


def finite_and_decreasing(losses: list[float]) -> bool:
    window = min(5, len(losses) // 2)
    if window == 0 or not all(math.isfinite(v) for v in losses):
        return False
    return sum(losses[-window:]) / window < sum(losses[:window]) / window


def _compare_losses(report: Report, observation: Observation, original: Process | None, required: bool,
                    amp: bool | None, loss_regex: str, script: str) -> None:
    values = parse_losses(observation.process.stdout, loss_regex)
    losses = {"regex": loss_regex, "values": values, "original": None, "mode": None, "tolerance": None,
              "compared": 0, "max_delta": None, "ok": None, "note": None}
    report.losses = losses
    crashed = any(p.kind in ("crash", "timeout") for p in report.problems)
    if values and not all(math.isfinite(v) for v in values) and not crashed:
        report.problems.append(Problem("losses", f"losses not finite: {_first_bad(values)}"))
    if original is None:
        return
    if original.returncode != 0 or original.timed_out:
        why = f"the original does not run on plain CPU torch ({original.last_error_line})"
        if required:
            report.cannot_run = why
        else:
            losses["note"] = f"not compared: {why}"
        return
    reference = parse_losses(original.stdout, loss_regex)
    losses["original"] = reference
    if amp is None:
        amp = is_amp(_read(script))
    losses["mode"] = "amp" if amp else "fp32"
    if crashed:
        losses["note"] = "not compared: the script crashed"
        return
    if not reference:
        reason = f"no loss values in the original's output (--loss-regex {loss_regex})"
        if required:
            report.cannot_run = reason
        else:
            losses["note"] = f"not compared: {reason}"
        return
    if amp:
        losses["tolerance"] = "finite and decreasing"
        losses["compared"] = len(values)
        losses["ok"] = finite_and_decreasing(values)
        if not losses["ok"]:
            report.problems.append(Problem("losses", f"AMP losses not finite and decreasing ({len(values)} values: "
                                           f"{_ends(values)})"))
        return
    losses["tolerance"] = FP32_TOLERANCE
    cut = observation.stopped or original.stopped_early
    if observation.stopped and not values:
        losses["note"] = ("not compared: the run, stopped by --steps, printed no loss (losses printed after the "
                          "loop are not seen)")
        return
    count = min(len(values), len(reference)) if cut else len(values)
    if not values or (not cut and len(values) != len(reference)):
        losses["ok"] = False
        report.problems.append(Problem("losses", f"{len(values)} loss values in the script's output, "
                                       f"{len(reference)} in the original's"))
        return
    deltas = [abs(a - b) for a, b in zip(values[:count], reference[:count])]
    worst = max(deltas) if deltas else 0.0
    worst = worst if math.isfinite(worst) else float("inf")
    losses.update(compared=count, max_delta=worst if math.isfinite(worst) else None,
                  ok=worst <= FP32_TOLERANCE)
    if worst > FP32_TOLERANCE:
        step = next(i for i, d in enumerate(deltas) if not d <= FP32_TOLERANCE)
        report.problems.append(Problem("losses", f"losses differ from the original by up to {worst:.3g} "
                                       f"(fp32 tolerance {FP32_TOLERANCE:g}; first at value {step}: "
                                       f"{values[step]:.6g} vs {reference[step]:.6g})"))


def _first_bad(values: list[float]) -> str:
    index = next(i for i, v in enumerate(values) if not math.isfinite(v))
    return f"value {index} is {values[index]}"


def _ends(values: list[float]) -> str:
    return ", ".join(f"{v:.4g}" for v in values[:3]) + (" ... " + ", ".join(f"{v:.4g}" for v in values[-3:])
                                                         if len(values) > 6 else "")


def _clean_summary(report: Report) -> str:
    parts = [f"{report.steps['markers']} step markers"]
    if report.executions["per_step"] is not None:
        per_step = report.executions["per_step"]
        parts.append(f"{per_step:g} graph execution{'' if per_step == 1 else 's'} per step")
    parts.append(f"{_plural(report.compilations['after_warmup'], 'compilation')} after warm-up")
    parts.append("no fallback ops")
    losses = report.losses
    if losses.get("ok"):
        parts.append("losses match the original" + (f" within {losses['tolerance']:g} (max {losses['max_delta']:.2g})"
                                                    if losses["mode"] == "fp32" else " (AMP: finite and decreasing)"))
    elif losses.get("note"):
        parts.append(losses["note"])
    return ", ".join(parts)


# The whole check --------------------------------------------------------------------------------------------------


def verify(script: str, args=(), *, against: str | None = None, python: str | None = None, steps: int | None = None,
           device: str = "cpu", loss_regex: str | None = None, timeout: float | None = None,
           original_required: bool = True) -> Report:
    """``xla-migrate verify``: never raises for a check that cannot run; that is a report with exit code 2."""
    regex = loss_regex or DEFAULT_LOSS_REGEX
    python_path = None
    try:
        _check_script(script, "SCRIPT")
        if against is not None:
            _check_script(against, "--against")
        try:
            re.compile(regex)
        except re.error as error:
            raise CannotRun(f"--loss-regex {regex!r}: {error}") from None
        if steps is not None and steps < 1:
            raise CannotRun(f"--steps {steps}: needs at least 1")
        if device not in ("cpu", "auto"):
            raise CannotRun(f"--device {device}: expected cpu or auto")
        interpreter = find_python(python)
        python_path = interpreter.path
    except CannotRun as error:
        report = cannot_run_report(script, args, python_path, device, str(error))
        report.against = against
        return report
    observation = observe(interpreter.path, script, args, device=device, steps=steps, timeout=timeout)
    if observation.torch_xla is None:
        observation.torch_xla = interpreter.torch_xla
    original = None
    if against is not None:
        cut = len(parse_losses(observation.process.stdout, regex)) if observation.stopped else None
        original = run_plain(interpreter.path, against, args, loss_regex=regex, timeout=timeout,
                             stop_after_losses=cut or None)
    amp = is_amp(_read(script), _read(against)) if against else None
    report = assess(observation, script, args, python=interpreter.path, device=device, original=original,
                    original_required=original_required, amp=amp, loss_regex=regex, steps=steps)
    report.against = against
    return report


def _check_script(path: str, what: str) -> None:
    if os.path.isdir(path):
        raise CannotRun(f"{what} {path}: is a directory, expected a Python script")
    if not os.path.isfile(path):
        raise CannotRun(f"{what} {path}: no such file")


# Text report -------------------------------------------------------------------------------------------------------


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def render_text(report: Report) -> list[str]:
    if report.cannot_run:
        return [report.verdict]
    run, steps, comp, execs, reads = report.run, report.steps, report.compilations, report.executions, report.host_reads
    on = f"torch_xla {report.torch_xla}" if report.torch_xla else "torch_xla"
    device = f"PJRT {report.device}" if report.device else ("PJRT CPU" if report.requested_device == "cpu"
                                                            else "device unknown")
    lines = [f"{report.script}: {on} on {device} ({report.python})"]
    status = "timed out" if run["timed_out"] else f"exit {run['exit_status']}"
    if run["stopped_after_steps"]:
        status += f" (stopped after {run['stopped_after_steps']} steps, --steps)"
    lines.append(f"  run: {status}, {run['wall_s']:.1f} s" + (f": {run['last_error_line']}"
                                                              if run["last_error_line"] else ""))
    lines.append(f"  step markers: {steps['markers']} ({steps['warmup']} warm-up, {steps['after_warmup']} after)")
    lines.append(f"  compilations: {comp['total']} in all, {comp['after_warmup']} after warm-up "
                 f"(allowed {comp['allowed_after_warmup']})")
    for cause in comp["causes"][:6]:
        late = f", {cause['after_warmup']} after warm-up" if cause["after_warmup"] else ""
        lines.append(f"    {cause['count']}x {cause['cause']}" + (f" at {cause['where']}" if cause["where"] else "")
                     + late)
    per_step = "-" if execs["per_step"] is None else f"{execs['per_step']:g}"
    lines.append(f"  graph executions: {per_step} per step after warm-up ({execs['total']} in all)")
    outside = "-" if reads["outside_per_step"] is None else f"{reads['outside_per_step']:g}"
    lines.append(f"  host reads: {outside} per step outside step closures after warm-up ({reads['transfers']} "
                 f"transfers, {reads['scalar_reads']} scalar reads in all; {reads['in_step_closures']} in step "
                 f"closures)")
    for site in reads["sites"][:6]:
        lines.append(f"    {site['count']}x at {site['where']}" + (" (in a step closure)" if site["in_step_closure"]
                                                                   else ""))
    for forced in reads["forced_executions"][:3]:
        lines.append(f"    {forced['count']}x graph execution forced at {forced['where']}")
    lines.append("  fallback ops: " + (", ".join(f"{f['op']} ({f['count']})" for f in report.fallback_ops)
                                       or "none"))
    lines.append("  torch_xla deprecation warnings: " + ("none" if not report.deprecations else ""))
    for warning in report.deprecations:
        lines.append(f"    {warning['where']}: {warning['message']}" + (f" ({warning['count']}x)"
                                                                      if warning["count"] > 1 else ""))
    lines.append("  " + _loss_line(report.losses))
    lines.append(report.verdict)
    return lines


def _loss_line(losses: dict) -> str:
    values = losses.get("values") or []
    line = f"losses: {_plural(len(values), 'value')}" + (f" ({_ends(values)})" if values else "")
    if losses.get("original") is not None:
        mode = losses["mode"]
        if mode == "fp32" and losses["max_delta"] is not None:
            line += (f"; vs the original on plain CPU torch: max |delta| {losses['max_delta']:.3g} over "
                     f"{losses['compared']} values (fp32 tolerance {losses['tolerance']:g})")
        elif mode == "amp":
            line += "; AMP: checked finite and decreasing (the original runs in fp32 on the CPU)"
    if losses.get("note"):
        line += f"; {losses['note']}"
    return line
