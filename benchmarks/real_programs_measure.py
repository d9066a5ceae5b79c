"""The real-programs suite's figures: torch_xla's metrics file read, loss curves compared, this suite's own
verdict and whether verify's agrees, the table and summary printed, and two runs' JSON compared.

Pure functions of the runs' records (no process is started here): benchmarks/real_programs.py runs the programs,
tests/test_real_programs.py checks these.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from xla_migrate import verify  # noqa: E402  (the product's warm-up, thresholds and definitions)
from xla_migrate.verify import losses as verify_losses  # noqa: E402  (its curve comparison)

STATUS_RANK = {"clean": 0, "slowdown": 1, "not-on-xla": 2, "divergence": 3, "crash": 4, "cannot-run": 5}
# Problem kinds both verify and this suite measure (verify's host-reads has no independent counterpart here:
# the metrics file cannot tell reads inside step closures from the others).
SHARED_KINDS = {"crash", "losses", "recompilation", "executions", "fallback", "no-step-marker", "not-on-xla"}

# Measuring -----------------------------------------------------------------------------------------------------


def parse_metrics_file(text: str) -> list[dict]:
    """torch_xla's XLA_METRICS_FILE: one block per step marker; each block's metrics (total samples) and counters."""
    blocks: list[dict] = []
    current: dict | None = None
    name, kind = None, None
    for line in text.splitlines():
        if line.startswith("[MetricsData;"):
            current = {"metrics": {}, "counters": {}}
            blocks.append(current)
            continue
        if current is None:
            continue
        if line.startswith("Metric: "):
            name, kind = line[len("Metric: "):].strip(), "metrics"
        elif line.startswith("Counter: "):
            name, kind = line[len("Counter: "):].strip(), "counters"
        elif name and line.strip().startswith(("TotalSamples:", "Value:")):
            value = line.split(":", 1)[1].strip()
            try:
                current[kind][name] = int(float(value))
            except ValueError:
                pass
            name = None
    return blocks


def _counts(block: dict) -> dict:
    counters, metrics = block["counters"], block["metrics"]
    launched = counters.get("CachedCompile", 0) + counters.get("UncachedCompile", 0)
    fallbacks = {k: v for k, v in counters.items() if k.startswith("aten::") and k != "aten::_local_scalar_dense"}
    ops = {k[len("xla::"):]: v for k, v in counters.items() if k.startswith("xla::")}
    return {"compiles": metrics.get("CompileTime", 0), "executions": max(launched, metrics.get("ExecuteTime", 0)),
            "reads": counters.get("aten::_local_scalar_dense", 0), "fallbacks": fallbacks, "ops": ops}


def graph_signatures(counts: list[dict]) -> list[frozenset]:
    """Per step marker, the ops torch_xla traced since the previous one (its ``xla::<op>`` counters that moved):
    what graph that step built, told apart without verify's loader. A training step, an evaluation step and
    another model's step trace other ops; a graph that changes from step to step (other shapes, a Python value
    traced as a constant, a graph that keeps growing) traces the same ones."""
    signatures, before = [], {}
    for count in counts:
        signatures.append(frozenset(op for op, n in count["ops"].items() if n > before.get(op, 0)))
        before = count["ops"]
    return signatures


def split_compiles(counts: list[dict], warm: int) -> tuple[int, int]:
    """The compilations after warm-up: (first compiles of a graph, recompilations), by verify's one definition
    (:func:`xla_migrate.verify.split_compiles`: a graph is what a step traced; it recompiles when it compiles in
    more than ``verify.SITE_WARMUP`` of its steps in a row) applied to this suite's own measurement: the compiles
    and the traced ops that torch_xla's metrics file has at each step marker (:func:`graph_signatures`)."""
    first, again, _ = verify.split_compiles([c["compiles"] for c in counts], graph_signatures(counts), warm)
    return first, again


def metrics_figures(blocks: list[dict]) -> dict:
    """Compilations after warm-up (first compiles of a graph, recompilations), graph executions and host reads
    per step after warm-up, fallback ops, with verify's warm-up (the first 5 step markers, half of a shorter
    run)."""
    if not blocks:
        return {"markers": 0, "compiles": 0, "compiles_after_warmup": 0, "first_compiles_after_warmup": 0,
                "recompiles_after_warmup": 0, "executions": 0, "executions_after_warmup": 0, "busy_steps": 0,
                "executions_per_step": None, "reads": 0,
                "reads_per_step": None, "fallbacks": {}}
    counts = [_counts(b) for b in blocks]
    warm = verify.warmup_markers(len(blocks))
    window = len(blocks) - warm if warm else 0
    at_warm, last = (counts[warm - 1] if warm else counts[0]), counts[-1]
    per_step = (lambda key: round((last[key] - at_warm[key]) / window, 3) if window else None)
    first, again = split_compiles(counts, warm) if window else (0, 0)
    # graph executions per step: per step marker that launched a graph, as verify counts them
    busy = verify.busy_steps([c["executions"] for c in counts], warm) if window else 0
    executions_late = last["executions"] - at_warm["executions"] if window else 0
    return {"markers": len(blocks), "warmup": warm, "after_warmup": window, "compiles": last["compiles"],
            "compiles_after_warmup": last["compiles"] - at_warm["compiles"] if window else 0,
            "first_compiles_after_warmup": first, "recompiles_after_warmup": again,
            "executions": last["executions"], "executions_after_warmup": executions_late, "busy_steps": busy,
            "executions_per_step": round(executions_late / busy, 3) if busy else (0.0 if window else None),
            "reads": last["reads"], "reads_per_step": per_step("reads"), "fallbacks": last["fallbacks"]}


def read_placement(folder: Path) -> list[dict]:
    """The suite's placement probe's records (benchmarks/real_programs_placement.py): one per process that
    imported torch_xla and stepped an optimizer."""
    records = []
    for path in sorted(Path(folder).glob("*.json")) if Path(folder).is_dir() else []:
        try:
            records.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    return records


def placement_figures(records: list[dict]) -> dict:
    """Where the stepped optimizers' parameters lived (elements by device type, every process's optimizers at
    their last step), and whether the trained model was on XLA: None when no optimizer stepped in a process
    with torch_xla (nothing to tell), False when none of those parameters was on the XLA device (verify's
    definition of work that never reached it)."""
    parameters: dict[str, int] = {}
    steps = 0
    for record in records:
        for optimizer in record.get("optimizers", []):
            steps += optimizer.get("steps", 0)
            for kind, count in (optimizer.get("devices") or {}).items():
                parameters[kind] = parameters.get(kind, 0) + count
    on_xla = ("xla" in parameters) if parameters else None
    return {"optimizer_steps": steps, "parameters": parameters, "on_xla": on_xla}


def compare_losses(values: list[float], reference: list[float], *, amp: bool, random: bool,
                   different_start: bool = False) -> dict:
    """The migrated run's losses against the original's (this suite's own run of it), with verify's definitions:
    fp32 value by value; random programs (stochastic) and AMP programs (bf16) by verify's curve comparison, by
    the level alone where the runs start from other parameters (``different_start``: unseeded weight init)."""
    result = {"values": len(values), "original": len(reference), "max_delta": None, "mode": None, "ok": None,
              "tolerance": None, "relative_l1": None, "r2": None, "note": ""}
    count = min(len(values), len(reference))
    if count:
        deltas = [abs(a - b) for a, b in zip(values[:count], reference[:count])]
        result["max_delta"] = max(deltas) if all(math.isfinite(d) for d in deltas) else float("inf")
    if not reference:
        result["note"] = "the original printed no loss"
        return result
    if not values:
        result.update(ok=False, note="no loss in the output's run")
        return result
    mode = "random" if random else ("amp" if amp else "fp32")
    if len(values) != len(reference):
        result.update(mode=mode, ok=False, note=f"{len(values)} loss values, the original {len(reference)}")
        return result
    if mode == "fp32":
        result.update(mode=mode, tolerance=verify.FP32_TOLERANCE,
                      ok=result["max_delta"] is not None and verify_losses.within_fp32_tolerance(result["max_delta"]))
        return result
    curve_mode = "stochastic" if random else "bf16"  # verify's names of the two curve comparisons
    result.update(mode=mode, tolerance=verify_losses.tolerance_text(curve_mode))
    if not all(math.isfinite(v) for v in values):
        result.update(ok=False, note="losses not finite")
        return result
    if count < verify_losses.MIN_CURVE_VALUES:
        result["note"] = f"fewer than {verify_losses.MIN_CURVE_VALUES} values: not compared as a curve"
        return result
    curve = verify_losses.compare_curve("loss", values, reference, level_only=different_start and random)
    result.update(relative_l1=round(curve.rel_l1, 4), r2=None if curve.r2 is None else round(curve.r2, 4),
                  ok=curve.within(curve_mode))
    return result


def own_problems(run: dict, figures: dict, losses: dict) -> list[str]:
    """This suite's verdict from its own figures, in verify's problem kinds (plus not-on-xla)."""
    if run.get("timed_out") or run.get("exit_status") != 0:
        return ["crash"]
    kinds = []
    # verify's definition, measured here: no graph executed, or the stepped parameters never on the XLA device
    # (an optimizer built before the model moved keeps stepping the CPU copies)
    if figures["executions"] == 0 or (figures.get("placement") or {}).get("on_xla") is False:
        kinds.append("not-on-xla")
        return kinds  # verify judges nothing else of a run that never reached the device
    if figures["markers"] == 0:
        kinds.append("no-step-marker")
    window = figures.get("after_warmup") or 0
    if window:
        allowed = min(verify.LATE_COMPILES, max(1, window // 2))
        # a record without the split (an older run's JSON) counts every compilation after warm-up
        if figures.get("recompiles_after_warmup", figures["compiles_after_warmup"]) > allowed:
            kinds.append("recompilation")
        # whole counts (the rounded per-step figure times the steps once made 8 executions in 7 steps 8.001);
        # a record without them (an older run's JSON) is judged per marker
        busy = figures.get("busy_steps", window)
        late = figures.get("executions_after_warmup", round(figures["executions_per_step"] * window))
        if busy and late > busy + max(1, busy // 10):
            kinds.append("executions")
    if figures["fallbacks"]:
        kinds.append("fallback")
    if losses.get("ok") is False:
        kinds.append("losses")
    return kinds


def status_of(kinds: list[str]) -> str:
    if "crash" in kinds or "timeout" in kinds:
        return "crash"
    if "losses" in kinds:
        return "divergence"
    if "not-on-xla" in kinds:
        return "not-on-xla"
    return "slowdown" if kinds else "clean"


def agreement(own: list[str], verify_report: dict | None) -> tuple[bool | None, str]:
    """Whether verify found the problems this suite found (on the kinds both measure), and how they differ."""
    if not verify_report:
        return None, "verify gave no report"
    theirs = {"crash" if p["kind"] == "timeout" else p["kind"] for p in verify_report["verdict"]["problems"]}
    if verify_report["verdict"]["status"] == "cannot-run":
        return False, f"verify cannot run: {verify_report['verdict']['line']}"
    mine, theirs = set(own) & SHARED_KINDS, theirs & SHARED_KINDS
    if mine == theirs:
        return True, ""
    parts = []
    if mine - theirs:
        parts.append("verify misses " + ", ".join(sorted(mine - theirs)))
    if theirs - mine:
        parts.append("verify also says " + ", ".join(sorted(theirs - mine)))
    return False, "; ".join(parts)


# The table, the summary, the comparison -------------------------------------------------------------------------


def _num(value, fmt: str = "{:g}") -> str:
    return "-" if value is None else fmt.format(value)


def losses_cell(losses: dict | None) -> str:
    if not losses or losses.get("mode") is None:
        return "-" if not losses or not losses.get("note") else "no loss"
    if losses["values"] != losses["original"]:
        return f"{losses['values']}/{losses['original']} vals"
    if losses["mode"] in ("amp", "random"):
        if losses.get("relative_l1") is None:  # too short for a curve, or not finite
            return f"{losses['mode']} {'-' if losses['ok'] is None else ('ok' if losses['ok'] else 'BAD')}"
        return f"{'~' if losses['ok'] else 'DIFF~'}{losses['relative_l1']:.2g}"
    return f"{'=' if losses['ok'] else 'DIFF '}{losses['max_delta']:.2g}"


def run_cell(variant: dict) -> str:
    if variant.get("skipped"):
        return "not run"
    run = variant.get("run") or {}
    if run.get("timed_out"):
        return "timeout"
    return "ok" if run.get("exit_status") == 0 else ("crash" if run.get("exit_status") is not None else "no report")


def replica_cell(report: dict | None) -> str:
    """verify's replica probe: "1 proc" for a single-process run, else "ok" or what would set replicas apart."""
    replicas = (report or {}).get("replicas")
    if not replicas or not replicas["updates"]:
        return "-"
    if not replicas["data_parallel"]:
        return "1 proc"
    wrong = [f"{replicas[key]} {short}" for key, short in (("unreduced", "unred"), ("reduced_twice", "twice"))
             if replicas[key]]
    return ", ".join(wrong) or "ok"


def rows(results: list[dict]) -> list[list[str]]:
    table = []
    for program in results:
        if program.get("error"):
            table.append([program["name"], "-", "-", "recipe error", *["-"] * 10])
            continue
        original_ok = program["original"]["exit_status"] == 0
        for v in program["variants"]:
            m = v["migrate"]
            migrated = f"{m.get('changes', '-')}/{m.get('findings', '-')}" if m["exit_status"] == 0 else "FAILED"
            run = run_cell(v) if original_ok or v.get("skipped") else f"{run_cell(v)} (orig fails)"
            own, report = v.get("own") or {}, (v.get("verify") or {}).get("report")
            verdict = (f"{report['verdict']['status']} ({report['verdict']['exit_code']})" if report
                       else ("-" if v.get("skipped") else "no report"))
            agrees = "-" if v.get("agrees") is None else ("yes" if v["agrees"] else "NO")
            fallbacks = sum((own.get("fallbacks") or {}).values()) if own else None
            table.append([program["name"], v["label"], migrated, run, losses_cell(v.get("losses")),
                          _num(own.get("recompiles_after_warmup", own.get("compiles_after_warmup"))),
                          _num(own.get("executions_per_step"), "{:.2g}"),
                          _num(own.get("reads_per_step"), "{:.2g}"), _num(fallbacks), v.get("status", "-"),
                          verdict, agrees, replica_cell(report), (v.get("resume") or {}).get("status", "n/a")])
    return table


HEADER = ["program", "target", "chg/find", "run", "losses", "recomp", "exec/step", "reads/step", "fallback",
          "own verdict", "verify", "agree", "replicas", "resume"]


def render_table(results: list[dict]) -> list[str]:
    body = rows(results)
    widths = [max(len(str(r[i])) for r in [HEADER, *body]) for i in range(len(HEADER))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return [line(HEADER), "-" * len(line(HEADER)), *map(line, body)]


def render_notes(results: list[dict]) -> list[str]:
    """One line per thing the table cannot show: crashes, skips, disagreements, original failures."""
    notes = []
    for program in results:
        name = program["name"]
        if program.get("error"):
            notes.append(f"{name}: {program['error']}")
            continue
        original = program["original"]
        if original["exit_status"] != 0:
            notes.append(f"{name}: the original fails on CPU torch: {original['last_error_line']}")
        for v in program["variants"]:
            where = f"{name} [{v['label']}]"
            if v.get("skipped"):
                notes.append(f"{where}: not run: {v['skipped']}")
                continue
            run = v.get("run") or {}
            if run.get("exit_status") != 0:
                notes.append(f"{where}: {'timed out' if run.get('timed_out') else 'crash'}: "
                             f"{run.get('last_error_line') or (v.get('verify') or {}).get('error')}")
            if v.get("losses", {}).get("note"):
                notes.append(f"{where}: losses: {v['losses']['note']}")
            if v.get("agrees") is False:
                notes.append(f"{where}: verify disagrees: {v['disagreement']}")
            if (v.get("resume") or {}).get("error"):
                notes.append(f"{where}: resume: {v['resume']['error']}")
    return notes


def summarize(results: list[dict]) -> dict[str, dict]:
    """Per target label: the figures the round's issues report."""
    out: dict[str, dict] = {}
    for program in results:
        if program.get("error"):
            continue
        original_ok = program["original"]["exit_status"] == 0
        for v in program["variants"]:
            s = out.setdefault(v["label"], {"programs": 0, "original_ran": 0, "run": 0, "ran_clean_exit": 0,
                                            "new_crashes": 0, "losses_equal": 0, "one_graph_per_step": 0,
                                            "no_late_compiles": 0, "no_fallbacks": 0, "verify_agrees": 0,
                                            "not_run": 0, "data_parallel": 0, "unreduced": 0})
            s["programs"] += 1
            if not original_ok:
                continue
            s["original_ran"] += 1
            if v.get("skipped"):
                s["not_run"] += 1
                continue
            s["run"] += 1
            s["verify_agrees"] += bool(v.get("agrees"))  # a crash both see is an agreement too
            problems = v.get("problems") or []
            if "crash" in problems:
                s["new_crashes"] += 1
                continue
            s["ran_clean_exit"] += 1
            s["losses_equal"] += bool(v["losses"].get("ok"))
            s["one_graph_per_step"] += "executions" not in problems and "not-on-xla" not in problems
            s["no_late_compiles"] += "recompilation" not in problems
            s["no_fallbacks"] += "fallback" not in problems
            cell = replica_cell((v.get("verify") or {}).get("report"))
            s["data_parallel"] += cell not in ("-", "1 proc")
            s["unreduced"] += cell not in ("-", "1 proc", "ok")
    return out


def render_summary(summary: dict[str, dict]) -> list[str]:
    lines = []
    for name, s in summary.items():
        lines.append(f"{name}: {s['programs']} programs, original ran {s['original_ran']}; of those, run "
                     f"{s['run']} ({s['not_run']} not run): {s['ran_clean_exit']} ran without edits, "
                     f"{s['new_crashes']} crashes the original did not have; {s['losses_equal']} losses equal "
                     f"to the original, {s['one_graph_per_step']} at one graph execution per step, "
                     f"{s['no_late_compiles']} without compilations after warm-up, {s['no_fallbacks']} without "
                     f"CPU fallbacks; verify agrees on {s['verify_agrees']} of {s['run']} run; data-parallel "
                     f"{s.get('data_parallel', 0)}, of which with unreduced updates {s.get('unreduced', 0)}")
    return lines


def _facts(variant: dict) -> dict:
    """The comparable facts of one row: (value, better when) pairs."""
    report = (variant.get("verify") or {}).get("report")
    own, losses = variant.get("own") or {}, variant.get("losses") or {}
    return {
        "runs": (run_cell(variant) == "ok", "higher"),
        "losses equal": (losses.get("ok"), "higher"),
        "graph executions per step": (own.get("executions_per_step"), "lower"),
        "recompilations after warm-up": (own.get("recompiles_after_warmup", own.get("compiles_after_warmup")), "lower"),
        "host reads per step": (own.get("reads_per_step"), "lower"),
        "fallback ops": (sum((own.get("fallbacks") or {}).values()) if own else None, "lower"),
        "verify verdict": (STATUS_RANK.get(report["verdict"]["status"]) if report else None, "lower"),
        "verify agrees": (variant.get("agrees"), "higher"),
        "resume": ((variant.get("resume") or {}).get("status") == "ok"
                   if (variant.get("resume") or {}).get("status") not in (None, "n/a") else None, "higher"),
    }


def _shown(fact: str, value) -> str:
    if fact == "verify verdict":
        return next(name for name, rank in STATUS_RANK.items() if rank == value)
    return {True: "yes", False: "no"}.get(value, value) if isinstance(value, bool) else f"{value:g}"


def compare(old: dict, new: dict) -> list[str]:
    """What got better and worse between two runs' JSON, row by row (program and target)."""
    def index(doc):
        return {(p["name"], v["label"]): v for p in doc.get("programs", []) for v in p.get("variants", [])}

    before, after = index(old), index(new)
    better, worse = [], []
    for key in sorted(before.keys() & after.keys()):
        was, now = _facts(before[key]), _facts(after[key])
        for fact, (value, direction) in now.items():
            previous = was[fact][0]
            if value is None or previous is None or value == previous:
                continue
            if isinstance(value, float) and abs(value - previous) < 0.05:
                continue
            up = (value > previous) == (direction == "higher")
            text = f"{key[0]} [{key[1]}]: {fact} {_shown(fact, previous)} -> {_shown(fact, value)}"
            (better if up else worse).append(text)
    lines = [f"better ({len(better)}):", *[f"  {t}" for t in better], f"worse ({len(worse)}):",
             *[f"  {t}" for t in worse]]
    for key in sorted(after.keys() - before.keys()):
        lines.append(f"new: {key[0]} [{key[1]}]")
    for key in sorted(before.keys() - after.keys()):
        lines.append(f"gone: {key[0]} [{key[1]}]")
    return lines
