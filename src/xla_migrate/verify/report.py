"""The report of ``xla-migrate verify``: figures, problems, the verdict, its text and its JSON.

Statuses, first that applies: ``cannot-run`` (exit 2: the check could not be made; the XLA run's figures are
kept when it ran), ``crash`` (exit 1), ``not-on-xla`` (exit 1: no graph ran on the XLA device, or the trained
parameters never lived there), ``divergence`` (exit 1: the losses, or replicas that train apart), ``slowdown``
(exit 1), ``clean`` (exit 0).
A check that could not compare the losses but found problems in the XLA run reports those problems (exit 1),
with the reason it did not compare. JSON schema: docs/verify.schema.json (``xla-migrate-verify`` version 3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .losses import DEFAULT_LOSS_REGEX

SCHEMA = "xla-migrate-verify"
SCHEMA_VERSION = 3

EXIT_CLEAN, EXIT_PROBLEM, EXIT_CANNOT_RUN = 0, 1, 2


@dataclass
class Problem:
    # crash, timeout, not-on-xla, no-step-marker, recompilation, executions, host-reads, fallback, replicas,
    # losses, spmd (verify --devices: the program did not span the devices)
    kind: str
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
    placement: dict = field(default_factory=dict)
    replicas: dict = field(default_factory=dict)
    spmd: dict | None = None  # verify --devices N: {"requested_devices": N, "devices": what the program spanned}
    losses: dict = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    cannot_run: str | None = None
    against: str | None = None
    against_args: list[str] | None = None
    deterministic: bool = False
    hidden_from_original: list[str] = field(default_factory=list)  # what this run wrote in the working folder
    observed: bool = False  # the XLA run happened: its figures are real

    @property
    def status(self) -> str:
        kinds = {p.kind for p in self.problems}
        if self.cannot_run and not kinds:
            return "cannot-run"
        if kinds & {"crash", "timeout"}:
            return "crash"
        if "not-on-xla" in kinds:
            return "not-on-xla"
        if kinds & {"losses", "replicas"}:  # replicas train apart even where world size 1 shows no loss change
            return "divergence"
        return "slowdown" if kinds else "clean"

    @property
    def exit_code(self) -> int:
        return {"clean": EXIT_CLEAN, "cannot-run": EXIT_CANNOT_RUN}.get(self.status, EXIT_PROBLEM)

    @property
    def verdict(self) -> str:
        if self.status == "cannot-run":
            return f"verdict: cannot run: {self.cannot_run}"
        if self.problems:
            line = f"verdict: {self.status}: " + "; ".join(p.message for p in self.problems)
            return line + (f" (and {self.cannot_run})" if self.cannot_run else "")
        return "verdict: clean: " + _clean_summary(self)

    def to_json(self) -> dict:
        from .. import __version__

        return {
            "schema": SCHEMA, "version": SCHEMA_VERSION,
            "tool": {"name": "xla-migrate", "version": __version__},
            "script": self.script, "against": self.against, "args": list(self.args),
            "against_args": None if self.against_args is None else list(self.against_args),
            "python": self.python, "torch_xla": self.torch_xla, "requested_device": self.requested_device,
            "device": self.device, "deterministic": self.deterministic,
            "verdict": {"status": self.status, "exit_code": self.exit_code, "line": self.verdict,
                        "problems": [{"kind": p.kind, "message": p.message} for p in self.problems]},
            "warnings": list(self.warnings),
            "run": self.run, "steps": self.steps, "compilations": self.compilations,
            "executions": self.executions, "host_reads": self.host_reads, "fallback_ops": self.fallback_ops,
            "deprecations": self.deprecations, "placement": self.placement, "replicas": self.replicas,
            "spmd": self.spmd, "hidden_from_original": list(self.hidden_from_original),
            "losses": {**self.losses, "values": json_numbers(self.losses.get("values") or []),
                       "original": None if self.losses.get("original") is None
                       else json_numbers(self.losses["original"])},
        }


def json_numbers(values: list[float]) -> list:
    """JSON has no NaN or infinity: those become the strings Python's json module would write unquoted."""
    return [v if math.isfinite(v) else ("NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity"))
            for v in values]


def empty_losses(regex: str = DEFAULT_LOSS_REGEX) -> dict:
    return {"regex": regex, "values": [], "original": None, "mode": None, "tolerance": None, "compared": 0,
            "max_delta": None, "curves": [], "random": [], "ok": None, "note": None}


def cannot_run_report(script: str, args, python: str | None, device: str, reason: str) -> Report:
    report = Report(str(script), list(args), python, device, cannot_run=reason)
    report.run = {"exit_status": None, "last_error_line": None, "wall_s": 0.0, "timed_out": False,
                  "stopped_after_steps": None, "processes": 0, "stopped_processes": []}
    report.steps = {"markers": 0, "warmup": 0, "after_warmup": 0}
    report.compilations = {"total": 0, "after_warmup": 0, "first_compiles_after_warmup": 0,
                           "recompilations_after_warmup": 0, "allowed_after_warmup": 0, "graphs_after_warmup": 0,
                           "causes": []}
    report.executions = {"total": 0, "after_warmup": 0, "per_step": None}
    report.host_reads = {"scalar_reads": 0, "transfers": 0, "in_step_closures": 0, "outside_per_step": None,
                         "sites": [], "forced_executions": []}
    report.placement = {"on_xla": None, "parameters": {}, "optimizers": [], "likely_cause": None}
    report.replicas = {"updates": 0, "data_parallel": False, "unreduced": 0, "reduced_twice": 0,
                       "unequal_start": 0, "steps_nothing": 0, "reduced_by": []}
    report.losses = empty_losses()
    return report


# Text ----------------------------------------------------------------------------------------------------------


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def ends(values: list[float]) -> str:
    return ", ".join(f"{v:.4g}" for v in values[:3]) + (" ... " + ", ".join(f"{v:.4g}" for v in values[-3:])
                                                         if len(values) > 6 else "")


def _clean_summary(report: Report) -> str:
    parts = [f"{report.steps['markers']} step markers"]
    if report.executions["per_step"] is not None:
        per_step = report.executions["per_step"]
        parts.append(f"{per_step:g} graph execution{'' if per_step == 1 else 's'} per step")
    parts.append(f"{plural(report.compilations['recompilations_after_warmup'], 'recompilation')} after warm-up")
    parts.append("no fallback ops")
    losses = report.losses
    if losses.get("ok"):
        if losses["mode"] == "fp32":
            parts.append(f"losses match the original within {losses['tolerance']:g} (max {losses['max_delta']:.2g})")
        else:
            worst = _worst_curve(losses)
            parts.append(f"loss curves match the original ({losses['mode']}: {_curve_figures(worst)})")
    elif losses.get("note"):
        parts.append(losses["note"])
    return ", ".join(parts)


def _worst_curve(losses: dict) -> dict | None:
    curves = losses.get("curves") or []
    return max(curves, key=lambda c: c["rel_l1"]) if curves else None


def _curve_figures(curve: dict | None) -> str:
    if curve is None:
        return "no curve"
    r2 = "R² not judged (flat curve)" if curve["r2"] is None else f"R² {curve['r2']:.3g}"
    if curve.get("level_only") and curve["r2"] is not None:
        r2 += " not judged (other initial parameters)"
    return f"{r2}, relative L1 {curve['rel_l1']:.3g}"


def render_text(report: Report) -> list[str]:
    if report.cannot_run and not report.observed:
        return [report.verdict]
    run, steps, comp, execs, reads = report.run, report.steps, report.compilations, report.executions, report.host_reads
    on = f"torch_xla {report.torch_xla}" if report.torch_xla else "torch_xla"
    device = f"PJRT {report.device}" if report.device else ("PJRT CPU" if report.requested_device == "cpu"
                                                            else "device unknown")
    lines = [f"{report.script}: {on} on {device} ({report.python})"]
    if report.spmd is not None:
        spanned = report.spmd["devices"]
        lines.append(f"  spmd: given {report.spmd['requested_devices']} devices, the program spans "
                     + ("an unknown number" if spanned is None else "none (SPMD never on)" if spanned == 0
                        else str(spanned)))
        parameters = report.spmd.get("parameters")
        if parameters is not None:
            lines.append(f"    trained parameter elements: {parameters['sharded']} split over the devices, "
                         f"{parameters['replicated']} whole on every device (data parallel: all whole; FSDPv2: "
                         "all split)")
            if parameters.get("whole"):
                lines.append("    whole beside split ones (a wrap missed them, or an annotation replicated them): "
                             + ", ".join(parameters["whole"]))
        gathers = report.spmd.get("all_gathers")
        if gathers is not None:
            shapes = f": {', '.join(gathers['shapes'])}" if gathers["shapes"] else ""
            why = ("" if not gathers["per_step"] else " (FSDPv2 gathers its parameters for the forward and the "
                   "backward)" if parameters and parameters["sharded"] and not parameters["replicated"] else
                   " (in a data-parallel program a sharding annotation makes the compiler gather that tensor "
                   "every step: annotate it so it stays split, or leave it replicated)")
            lines.append(f"    all-gathers per step in the step graph: {gathers['per_step']}{shapes}{why}")
    status = "timed out" if run["timed_out"] else f"exit {run['exit_status']}"
    if run["stopped_after_steps"]:
        status += f" (stopped after {run['stopped_after_steps']} steps, --steps)"
    lines.append(f"  run: {status}, {run['wall_s']:.1f} s" + (f": {run['last_error_line']}"
                                                              if run["last_error_line"] else ""))
    if run.get("stopped_processes"):
        lines.append(f"    ended its process group: {', '.join(run['stopped_processes'][:4])}")
    lines.append(f"  step markers: {steps['markers']} ({steps['warmup']} warm-up, {steps['after_warmup']} after)")
    lines.append(f"  compilations: {comp['total']} in all, {comp['after_warmup']} after warm-up: "
                 f"{comp['first_compiles_after_warmup']} first compiles of a graph (warm-up too), "
                 f"{comp['recompilations_after_warmup']} recompilations (allowed {comp['allowed_after_warmup']})")
    for cause in comp["causes"][:6]:
        late = f", {cause['after_warmup']} after warm-up" if cause["after_warmup"] else ""
        late += f" ({cause['recompilations']} recompiling)" if cause.get("recompilations") else ""
        lines.append(f"    {cause['count']}x {cause['cause']}" + (f" at {cause['where']}" if cause["where"] else "")
                     + late)
    per_step = "-" if execs["per_step"] is None else f"{execs['per_step']:g}"
    idle = report.steps["after_warmup"] - execs.get("steps", report.steps["after_warmup"])
    over = f"over the {execs['steps']} markers that ran a graph ({idle} ran none), " if idle > 0 else ""
    lines.append(f"  graph executions: {per_step} per step after warm-up ({over}{execs['total']} in all)")
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
    lines.append("  " + _placement_line(report.placement))
    if report.replicas.get("updates"):
        lines.append("  " + _replicas_line(report.replicas))
    lines.extend("  " + line for line in _loss_lines(report.losses, report.deterministic))
    if report.hidden_from_original:
        shown = ", ".join(report.hidden_from_original[:4]) + (", ..." if len(report.hidden_from_original) > 4 else "")
        lines.append(f"  the original ran without what this run wrote in the working folder ({shown})")
    lines.extend(f"  warning: {warning}" for warning in report.warnings)
    lines.append(report.verdict)
    return lines


def _replicas_line(replicas: dict) -> str:
    if not replicas["data_parallel"]:
        return f"replicas: single process ({replicas['updates']} optimizer updates, none data-parallel)"
    start = ("every one from equal replicas (broadcast or DDP-wrapped)" if not replicas["unequal_start"] else
             f"{replicas['unequal_start']} from weights neither broadcast nor DDP-wrapped (equal only if every "
             "process seeds alike)")
    return (f"replicas: {replicas['updates']} data-parallel optimizer updates, {replicas['unreduced']} unreduced, "
            f"{replicas['reduced_twice']} reduced twice (by {', '.join(replicas['reduced_by']) or 'nothing'}); "
            f"{start}")


def _placement_line(placement: dict) -> str:
    parameters = placement.get("parameters") or {}
    if not parameters:
        return "trained parameters: no optimizer step seen"
    where = ", ".join(f"{count:,} on {'XLA' if kind == 'xla' else kind.upper()}"
                      for kind, count in sorted(parameters.items()))
    names = ", ".join(sorted({o["optimizer"] for o in placement.get("optimizers", [])}))
    return f"trained parameters: {where}" + (f" ({names})" if names else "")


def _loss_lines(losses: dict, deterministic: bool) -> list[str]:
    values = losses.get("values") or []
    line = f"losses: {plural(len(values), 'value')}" + (f" ({ends(values)})" if values else "")
    lines = [line]
    mode = losses.get("mode")
    if losses.get("original") is not None and mode:
        if mode == "fp32" and losses["max_delta"] is not None:
            lines.append(f"  vs the original on plain CPU torch (fp32): max |delta| {losses['max_delta']:.3g} over "
                         f"{losses['compared']} values (tolerance {losses['tolerance']:g})")
        elif mode != "fp32":
            lines.append(f"  vs the original on plain CPU torch ({mode}; {losses['tolerance']})")
        for curve in losses.get("curves") or []:
            lines.append(f"    {curve['name']}: {curve['compared']} values, smoothed over {curve['window']}: "
                         f"{_curve_figures(curve)}")
    if losses.get("random"):
        lines.append("  random numbers differ between the runs: " + "; ".join(losses["random"]))
    if deterministic:
        lines.append("  --deterministic: dropout switched off in both runs (random modules in eval mode)")
    if losses.get("note"):
        lines.append(f"  {losses['note']}")
    return lines
