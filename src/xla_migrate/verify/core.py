"""``xla-migrate verify``: run a (migrated) script on torch_xla and say whether it runs the way XLA wants.

One implementation of these measurements, used by the command, by ``xla-migrate --verify`` and by the proof
tier (tests/xla) and its benchmark:

- :mod:`xla_migrate.verify.run` finds the interpreter and runs the two scripts: :func:`observe` runs the
  migrated one with the loader of :mod:`xla_migrate.verify.child` (never part of the script) and torch_xla's
  debug output on; :func:`run_plain` runs the original on plain CPU torch (CUDA hidden);
- :func:`assess` (here) turns those into a :class:`Report`: figures, problems, a verdict and an exit code;
- :mod:`xla_migrate.verify.losses` compares the losses the way the program allows (fp32 values, bf16 or
  stochastic curves); :mod:`xla_migrate.verify.report` has the report, its text and its JSON
  (docs/verify.schema.json).

Exit codes: 0 clean; 1 a crash, work that never reached the XLA device, a divergence or a slowdown
(recompilation after warm-up, more than one graph execution per step, host reads on most steps, ops that fell
back to the CPU, no step marker, losses that differ from the original or are not finite); 2 the check cannot
run (no torch_xla, a missing script, an original that does not run on plain CPU torch).
"""

from __future__ import annotations

import math
import os
import re
import shutil
from pathlib import Path

from .losses import (
    DEFAULT_LOSS_REGEX, FP32_TOLERANCE, amp_in_use, compare_losses, parse_losses, parse_series, random_sources,
)
from .report import (
    EXIT_CANNOT_RUN, EXIT_CLEAN, EXIT_PROBLEM, SCHEMA, SCHEMA_VERSION, Problem, Report, cannot_run_report, plural,
    render_text,
)
from .paths import Trees, import_paths
from .workdirs import added_since, list_folder, mirror_without
from .run import (
    HOW_TO_GET_TORCH_XLA, Analysis, CannotRun, Interpreter, Interrupted, Observation, Process, find_python,
    loader_source, make_workdir, observe, one_process_world, parse_debug, read_records, remove_stale_workdirs,
    run_plain, stop_on_signals,
)

__all__ = [
    "AMP_MARKERS", "Analysis", "CannotRun", "DEFAULT_LOSS_REGEX", "EXIT_CANNOT_RUN", "EXIT_CLEAN", "EXIT_PROBLEM",
    "FP32_TOLERANCE", "HOW_TO_GET_TORCH_XLA", "Interpreter", "Interrupted", "LATE_COMPILES", "Observation",
    "Problem", "Process", "READ_CAUSE", "Report", "SCHEMA", "SCHEMA_VERSION", "SITE_WARMUP", "Trees",
    "WARMUP_MARKERS", "assess", "busy_steps", "cannot_run_report", "find_python", "finite_and_decreasing", "is_amp",
    "likely_cause", "loader_source", "observe", "parse_debug", "parse_losses", "parse_series", "read_records",
    "render_text", "run_plain", "split_compiles", "stop_on_signals", "verify", "warmup_markers",
]

WARMUP_MARKERS = 5  # step markers allowed to compile (first step, optimizer state appearing...)
LATE_COMPILES = 3  # recompilations allowed after warm-up (a smaller last batch, the save)
READ_CAUSE = "access tensor value"  # torch_xla's cause for an execution forced by reading a lazy tensor
SITE_WARMUP = 2  # a graph's steps in a row that may compile (its warm-up): its first, the next (state appears)
AMP_MARKERS = re.compile(r"\b(autocast|GradScaler)\b")


def _zero() -> dict:
    return {"compiles": 0, "executions": 0, "transfers": 0, "reads": 0, "closure_reads": 0,
            "closure_transfers": 0, "debug_offset": 0, "fallbacks": {}, "random_ops": {}}


def warmup_markers(markers: int) -> int:
    """Step markers counted as warm-up: 5, or half of a shorter run (so it still has steps to judge)."""
    return min(WARMUP_MARKERS, markers // 2)


def busy_steps(executions: list[int], warm: int) -> int:
    """The step markers after warm-up that launched a graph (``executions``: the running count at each marker).
    A marker with nothing to run (a device loader's extra marker at the end of an epoch, a sync after a sync)
    is not a step: counted, it would halve "two graphs per step" in a short run of short epochs."""
    return sum(1 for i in range(max(warm, 1), len(executions)) if executions[i] > executions[i - 1])


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


def _user_frames(frames: list[str], skip_dirs: list[str]) -> list[str]:
    return [frame for frame in frames if not any(frame.startswith(folder) for folder in skip_dirs)]


def _user_frame(frames: list[str], skip_dirs: list[str]) -> str | None:
    found = _user_frames(frames, skip_dirs)
    return found[0] if found else None


# Assessing ------------------------------------------------------------------------------------------------------


def assess(observation: Observation, script: str, args=(), *, python: str | None = None, device: str = "cpu",
           original: Process | None = None, original_required: bool = True, amp: bool | None = None,
           loss_regex: str = DEFAULT_LOSS_REGEX, steps: int | None = None, cwd: str | None = None,
           deterministic: bool = False, devices: int | None = None) -> Report:
    """The figures of one run (and the original's loss curve), the problems found and the verdict.
    ``devices``: the CPU devices the run was given for one SPMD program (verify --devices)."""
    cwd = cwd or os.getcwd()
    process = observation.process
    report = Report(str(script), list(args), python, device, torch_xla=observation.torch_xla,
                    device=observation.device, deterministic=deterministic, observed=True)
    report.run = {"exit_status": process.returncode, "last_error_line": process.last_error_line,
                  "wall_s": round(process.wall, 3), "timed_out": process.timed_out,
                  "stopped_after_steps": steps if observation.stopped else None,
                  "processes": observation.processes, "stopped_processes": list(process.stopped)}
    markers = observation.markers
    last = observation.last or _zero()
    warm = warmup_markers(len(markers))
    at_warm = markers[warm - 1] if warm else _zero()
    at_end = markers[-1] if markers else _zero()
    window = len(markers) - warm if warm else 0  # a single step marker leaves nothing to judge per step
    report.steps = {"markers": len(markers), "warmup": warm, "after_warmup": window}
    allowed = min(LATE_COMPILES, max(1, window // 2)) if window else 0
    recompiles = _compilations(report, observation, warm, at_warm, at_end, allowed, cwd)

    # Graph executions per step, after warm-up.
    executions_late = at_end["executions"] - at_warm["executions"]
    busy = busy_steps([m["executions"] for m in markers], warm) if window else 0
    report.executions = {"total": last["executions"], "after_warmup": executions_late,
                         "per_step": round(executions_late / busy, 3) if busy else (0.0 if window else None),
                         "steps": busy}

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
    report.placement = _placement(observation, last, script, cwd)
    report.replicas = replica_figures(observation.replicas)

    _find_run_problems(report, observation, window, recompiles, allowed, executions_late, outside_late)
    if devices is not None:
        _check_spmd(report, observation, devices)
    crashed = any(p.kind in ("crash", "timeout") for p in report.problems)
    off_xla = any(p.kind == "not-on-xla" for p in report.problems)
    events = observation.events + (original.events if original is not None else [])
    outcome = compare_losses(process.stdout, original, required=original_required,
                             amp=amp_in_use(observation.events) if amp is None else amp,
                             random=random_sources(last.get("random_ops", {}), events, cwd), loss_regex=loss_regex,
                             stopped=observation.stopped, crashed=crashed)
    report.losses = outcome.losses
    report.warnings += outcome.warnings or []
    report.cannot_run = outcome.cannot_run
    if off_xla:
        if outcome.problems:
            report.losses["note"] = "losses not judged: the run never reached the XLA device"
    else:
        report.problems += [Problem("losses", message) for message in outcome.problems]
    return report


def _check_spmd(report: Report, observation: Observation, devices: int) -> None:
    """verify --devices N: the script must run as one SPMD program over the N devices it was given."""
    spanned = observation.spmd_devices
    latest: dict[tuple[str, str], dict] = {}
    for event in observation.events:
        if event.get("event") == "optimizer" and event.get("sharding") is not None:
            latest[(event["optimizer"], event.get("where", ""))] = event["sharding"]
    parameters = {"sharded": sum(s["sharded"] for s in latest.values()),
                  "replicated": sum(s["replicated"] for s in latest.values()),
                  "whole": [name for s in latest.values() for name in s.get("whole", [])]} if latest else None
    report.spmd = {"requested_devices": devices, "devices": spanned, "parameters": parameters,
                   "all_gathers": observation.all_gathers}
    if spanned == 0:
        report.problems.append(Problem("spmd", f"the script never turned SPMD on (xr.use_spmd()): one of the "
                                       f"{devices} devices did all the work; migrate with --data-parallel spmd"))
    elif spanned is not None and spanned != devices:
        report.problems.append(Problem("spmd", f"the SPMD program spans {spanned} devices, not the {devices} "
                                       "it was given"))


def split_compiles(compiles: list[int], traced: list, warm: int) -> tuple[int, int, list[int]]:
    """The compilations after warm-up, split: (first compiles of a graph, recompilations, the step markers that
    recompiled). ``compiles``: the running count at each step marker; ``traced``: the ops each step traced.

    A graph is what a step traced (its ops): a training step, an evaluation step, the step after a checkpoint
    save, another model's step trace other ops; a graph that changes from step to step (other shapes, a Python
    value traced as a constant, a graph that keeps growing) traces the same ones. A graph recompiles when it
    compiles in more than ``SITE_WARMUP`` of its steps in a row: the first two are its warm-up (its first graph,
    and the next once the state it creates exists: the optimizer's state, a running sum), wherever it is first
    reached, and again after it ran from the cache (the same evaluation on a test set of another batch size, the
    step after a second save). The real-programs suite applies this to torch_xla's metrics file."""
    in_a_row: dict[frozenset, int] = {}  # per graph: its latest steps that compiled, in a row
    first = again = previous = 0
    recompiling = []
    for index, (count, ops) in enumerate(zip(compiles, traced)):
        compiled, previous = count - previous, count
        key = frozenset(ops)
        in_a_row[key] = in_a_row.get(key, 0) + 1 if compiled else 0
        if index < warm or not compiled:
            continue
        if in_a_row[key] <= SITE_WARMUP:
            first += compiled
        else:
            again += compiled
            recompiling.append(index)
    return first, again, recompiling


def _compilations(report: Report, observation: Observation, warm: int, at_warm: dict, at_end: dict, allowed: int,
                  cwd: str) -> int:
    """The compilations, with torch_xla's causes; returns the recompilations after warm-up
    (:func:`split_compiles`). The causes after warm-up that count are those of the compiles in the step markers
    that recompiled, with their graphs. Without the ops per marker every compilation after warm-up counts."""
    markers = observation.markers
    compiles_late = at_end["compiles"] - at_warm["compiles"]  # between the warm-up and the last marker
    if markers and all("traced" in m for m in markers):
        first_late, recompiles, recompiling = split_compiles([m["compiles"] for m in markers],
                                                             [m["traced"] for m in markers], warm)
    else:
        first_late, recompiles, recompiling = 0, compiles_late, list(range(warm, len(markers)))
    spans = [(markers[i - 1]["debug_offset"] if i else 0, markers[i]["debug_offset"]) for i in recompiling]
    causes: dict[tuple[str, str | None], list[int]] = {}  # cause: [compiles, after warm-up, recompilations]
    late_offset = at_warm["debug_offset"] if warm else 0
    late_graphs = set()
    for block in (a for a in observation.analyses if a.kind == "compilation"):
        where = _user_frame(block.frames, observation.skip_dirs)
        entry = causes.setdefault((block.cause or "?", _relative(where, cwd) if where else None), [0, 0, 0])
        entry[0] += 1
        if warm and late_offset <= block.offset < at_end["debug_offset"]:
            entry[1] += 1
        if any(start <= block.offset < end for start, end in spans):
            entry[2] += 1
            late_graphs.add(block.graph_hash)
    report.compilations = {
        "total": (observation.last or _zero())["compiles"], "after_warmup": compiles_late,
        "first_compiles_after_warmup": first_late, "recompilations_after_warmup": recompiles,
        "allowed_after_warmup": allowed, "graphs_after_warmup": len(late_graphs),
        "causes": sorted(({"cause": cause, "where": where, "count": n, "after_warmup": late, "recompilations": again}
                          for (cause, where), (n, late, again) in causes.items()),
                         key=lambda c: (-c["recompilations"], -c["after_warmup"], -c["count"], c["where"] or "")),
    }
    return recompiles


# Where the work ran ----------------------------------------------------------------------------------------------


def _placement(observation: Observation, last: dict, script: str, cwd: str) -> dict:
    """Where the trained parameters lived (the optimizers' last record) and, off XLA, the likely cause."""
    latest: dict[tuple[str, str], dict] = {}
    for event in observation.events:
        if event.get("event") == "optimizer":
            latest[(event["optimizer"], event.get("where", ""))] = event
    parameters: dict[str, int] = {}
    for event in latest.values():
        for kind, count in event["devices"].items():
            parameters[kind] = parameters.get(kind, 0) + count
    optimizers = [{"optimizer": e["optimizer"], "where": _relative(e.get("where", "?"), cwd),
                   "devices": e["devices"]} for e in latest.values()]
    on_xla = None
    if observation.processes:
        on_xla = last["executions"] > 0 and (not parameters or "xla" in parameters)
    placement = {"on_xla": on_xla, "parameters": parameters, "optimizers": optimizers, "likely_cause": None}
    if on_xla is False or not observation.processes:
        stepped_at = optimizers[0]["where"] if optimizers and last["executions"] > 0 else None
        placement["likely_cause"] = likely_cause(observation.events, script, cwd, stepped_at)
    return placement


_FLAG_ON = re.compile(r"(?i)^(use_|with_)?(cuda|gpu|xla|tpu|accel\w*)$")
_FLAG_OFF = re.compile(r"(?i)^(no_?(cuda|gpu|xla|tpu|accel\w*)|(use_|force_)?cpu(_only)?)$")
_CPU_LITERAL = re.compile(r"""["']cpu["']""")


def likely_cause(events: list[dict], script: str, cwd: str, stepped_at: str | None = None) -> str:
    """Why the work stayed on the CPU: a device flag, a CUDA gate that is False here, an optimizer built before
    the model moved (``stepped_at``: where it stepped CPU parameters while graphs ran on the device), or a CPU
    default."""
    for event in events:
        if event.get("event") != "device-flags":
            continue
        for name, value in event["flags"].items():
            option = "--" + name.replace("_", "-")
            if (_FLAG_ON.match(name) and value is False) or (_FLAG_OFF.match(name) and value is True):
                return (f"a device flag: {option} is {value} here (parsed at {_relative(event['where'], cwd)}); "
                        f"run with the flag that selects the accelerator, or make the XLA device its default")
            if isinstance(value, str) and value.lower().startswith("cpu"):
                return (f"a device flag: {option} is {value!r} (parsed at {_relative(event['where'], cwd)}); "
                        f"pass {option} xla, or make the XLA device its default")
    gates = [e for e in events if e.get("event") == "cuda-gate" and not e.get("result")]
    if gates:
        gate = gates[0]
        return (f"a CUDA gate that is False here: {gate['call']} at {_relative(gate['where'], cwd)} chose the CPU; "
                f"make the XLA device the branch taken without CUDA")
    if stepped_at:
        # moving a model to XLA makes new parameters: an optimizer built before keeps the old CPU ones, which
        # never get a gradient, while the forward and backward pass run on the device
        return (f"the optimizer stepped at {stepped_at} was built before the model moved to the XLA device, and "
                f"moving makes new parameters: build it after model.to(device), or move the model first")
    try:
        lines = Path(script).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    for number, line in enumerate(lines, 1):
        if _CPU_LITERAL.search(line) and not line.lstrip().startswith("#"):
            return (f"a CPU default: {_relative(f'{os.path.abspath(script)}:{number}', cwd)} `{line.strip()[:80]}`; "
                    f"use torch_xla's device there")
    return "the model and its batches were never moved to the XLA device (torch_xla.device() / xm.xla_device())"


def _find_run_problems(report: Report, observation: Observation, window: int, recompiles: int, allowed: int,
                       executions_late: int, outside_late: int) -> None:
    process, problems = observation.process, report.problems
    if process.timed_out:
        stopped = f"; ended {len(process.stopped)} processes of its group" if process.stopped else ""
        problems.append(Problem("timeout", f"timed out after {process.wall:.0f} s{stopped}"))
    elif process.returncode != 0:
        status = (f"killed by signal {-process.returncode}" if process.returncode < 0
                  else f"exit status {process.returncode}")
        problems.append(Problem("crash", f"{status}: {process.last_error_line or 'no error message'}"))
    if problems:
        return  # it crashed: the figures up to the crash are in the report, the crash is the verdict
    placement = report.placement
    if observation.processes == 0:
        problems.append(Problem("not-on-xla", f"the script never imported torch_xla; likely cause: "
                                f"{placement['likely_cause']}"))
        return
    if placement["on_xla"] is False:
        executions = report.executions["total"]
        parameters = placement["parameters"]
        what = []
        if executions == 0:
            what.append("0 graph executions on the XLA device")
        if parameters and "xla" not in parameters:
            where = ", ".join(f"{count:,} on {kind.upper()}" for kind, count in sorted(parameters.items()))
            what.append(f"the optimizer's parameters never on it ({where})")
        problems.append(Problem("not-on-xla", f"{' and '.join(what)}; likely cause: {placement['likely_cause']}"))
        return
    if not observation.markers:
        problems.append(Problem("no-step-marker", "no step marker (no device loader, mark_step or sync): "
                                "torch_xla traced the whole run as one graph"))
    if window:
        compilations = report.compilations
        if recompiles > allowed:
            late = [c for c in compilations["causes"] if c["recompilations"]]
            graphs = compilations["graphs_after_warmup"]
            what = f" of {plural(graphs, 'different graph')}" if graphs else ""
            where = f", {late[0]['cause']} at {late[0]['where']}" if late and late[0]["where"] else ""
            problems.append(Problem("recompilation", f"{recompiles} recompilations{what} in the {window} steps "
                                    f"after warm-up (allowed {allowed}{where}): the graph changes from step to "
                                    f"step (shapes, or Python values traced as constants)"))
        busy = report.executions["steps"]
        if busy and executions_late > busy + max(1, busy // 10):
            forced = report.host_reads["forced_executions"]
            where = f" (forced at {forced[0]['where']})" if forced else ""
            problems.append(Problem("executions", f"{executions_late / busy:.1f} graph executions per step "
                                    f"after warm-up{where}: something reads a lazy tensor mid-step"))
        if outside_late > window / 2:
            outside = [s for s in report.host_reads["sites"] if not s["in_step_closure"]]
            where = f" (at {outside[0]['where']})" if outside else ""
            problems.append(Problem("host-reads", f"{outside_late / window:.1f} host reads per step outside "
                                    f"step closures{where}: the host waits for the device every step"))
    if report.fallback_ops:
        names = ", ".join(f"{f['op']} ({f['count']})" for f in report.fallback_ops)
        problems.append(Problem("fallback", f"ops without an XLA lowering ran on the CPU: {names}"))
    problems += replica_problems(report.replicas)


def replica_figures(summary: dict | None) -> dict:
    """The replica probe's counts: every update, and those of a data-parallel run that would make replicas
    differ (world size 1 shows no difference in the losses, so the probe is what can tell)."""
    summary = summary or {}
    return {"updates": summary.get("updates", 0), "data_parallel": bool(summary.get("distributed")),
            **{key: len(summary.get(key, [])) for key in ("unreduced", "reduced_twice", "unequal_start",
                                                          "steps_nothing")},
            "reduced_by": list(summary.get("by", []))}


def replica_problems(replicas: dict) -> list[Problem]:
    updates, problems = replicas["updates"], []
    if replicas["steps_nothing"]:
        problems.append(Problem("replicas", f"{replicas['steps_nothing']} of {updates} optimizer updates stepped "
                                "parameters with no gradient: the optimizer holds parameters the model no longer "
                                "uses (built before the model moved to the XLA device?), so no weight changes"))
    if not replicas["data_parallel"]:
        return problems
    if replicas["unreduced"]:
        problems.append(Problem("replicas", f"{replicas['unreduced']} of {updates} optimizer updates of this "
                                "data-parallel run stepped gradients no all-reduce reached: each replica steps "
                                "its own, and they drift apart (xm.optimizer_step, or DDP on the xla backend)"))
    if replicas["reduced_twice"]:
        problems.append(Problem("replicas", f"{replicas['reduced_twice']} of {updates} optimizer updates stepped "
                                "gradients all-reduced twice (DDP or the program's own hooks, and "
                                "xm.optimizer_step): each update is the world size times too large"))
    return problems


def is_amp(*sources: str) -> bool:
    """Mixed precision named in source text (the runs' autocast records decide in verify; this is for callers
    that have only the text)."""
    return any(AMP_MARKERS.search(source) for source in sources)


def finite_and_decreasing(losses: list[float]) -> bool:
    window = min(5, len(losses) // 2)
    if window == 0 or not all(math.isfinite(v) for v in losses):
        return False
    return sum(losses[-window:]) / window < sum(losses[:window]) / window


# The whole check --------------------------------------------------------------------------------------------------


def verify(script: str, args=(), *, against: str | None = None, against_args=None, python: str | None = None,
           steps: int | None = None, device: str = "cpu", loss_regex: str | None = None,
           timeout: float | None = None, original_required: bool = True, deterministic: bool = False,
           trees: Trees | None = None, project_root: str | None = None, devices: int | None = None) -> Report:
    """``xla-migrate verify``: never raises for a check that cannot run; that is a report with exit code 2.
    A signal or Ctrl-C while a script runs ends its process group and raises :class:`Interrupted` (wrap the
    call in :func:`stop_on_signals` to get that for SIGTERM and SIGHUP too). ``trees``: the migrated tree and
    the original's (default: from the two scripts' paths); ``project_root``: importable in both runs.
    ``devices``: run the script as one SPMD program on that many PJRT CPU devices (``CPU_NUM_DEVICES``) and
    the original as a world of one process (torchrun's variables for rank 0 of 1, where the caller set none)."""
    regex = loss_regex or DEFAULT_LOSS_REGEX
    python_path = None
    try:
        _check_script(script, "SCRIPT")
        if against is not None:
            _check_script(against, "--against")
        elif against_args is not None:
            raise CannotRun("--against-args: the original's arguments need --against ORIGINAL")
        try:
            re.compile(regex)
        except re.error as error:
            raise CannotRun(f"--loss-regex {regex!r}: {error}") from None
        if steps is not None and steps < 1:
            raise CannotRun(f"--steps {steps}: needs at least 1")
        if device not in ("cpu", "auto"):
            raise CannotRun(f"--device {device}: expected cpu or auto")
        if devices is not None and (devices < 1 or device != "cpu"):
            raise CannotRun(f"--devices {devices}: needs at least 1, and --device cpu (on an accelerator the "
                            "SPMD program spans the devices torch_xla finds)")
        interpreter = find_python(python)
        python_path = interpreter.path
    except CannotRun as error:
        report = cannot_run_report(script, args, python_path, device, str(error))
        report.against, report.against_args, report.deterministic = against, against_args, deterministic
        return report
    remove_stale_workdirs()
    if against is not None and trees is None:
        trees = Trees.of(script, against)
    migrated_path, original_path = import_paths(dict(os.environ), None, script, against, trees, project_root)
    xla_env = None if devices is None else {**os.environ, "CPU_NUM_DEVICES": str(devices)}
    before = None if against is None else list_folder(os.getcwd())
    observation = observe(interpreter.path, script, args, device=device, steps=steps, timeout=timeout,
                          pythonpath=migrated_path, deterministic=deterministic, env=xla_env,
                          graphs=devices is not None)
    if observation.torch_xla is None:
        observation.torch_xla = interpreter.torch_xla
    original, hidden = None, []
    if against is not None:
        cut = len(parse_losses(observation.process.stdout, regex)) if observation.stopped else None
        hidden = added_since(before)
        workdir = make_workdir("cwd") if hidden else None
        try:
            original = run_plain(interpreter.path, os.path.abspath(against),
                                 list(args if against_args is None else against_args),
                                 cwd=None if workdir is None else str(mirror_without(before, hidden, workdir)),
                                 loss_regex=regex, timeout=timeout, stop_after_losses=cut or None,
                                 pythonpath=original_path, deterministic=deterministic,
                                 env=None if devices is None else one_process_world())
        finally:
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)  # links are removed, never followed
    report = assess(observation, script, args, python=interpreter.path, device=device, original=original,
                    original_required=original_required, loss_regex=regex, steps=steps,
                    deterministic=deterministic, devices=devices)
    report.against = against
    report.hidden_from_original = hidden
    report.against_args = None if against_args is None else list(against_args)
    if original is not None and original.returncode != 0 and args and against_args is None and report.cannot_run:
        report.cannot_run += (f"; it ran with the script's arguments ({' '.join(args)}): give it its own with "
                              f"--against-args")
    return report


def _check_script(path: str, what: str) -> None:
    if os.path.isdir(path):
        raise CannotRun(f"{what} {path}: is a directory, expected a Python script")
    if not os.path.isfile(path):
        raise CannotRun(f"{what} {path}: no such file")
