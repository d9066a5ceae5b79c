"""Cost of the step model and the loop rules, per file, relative to libcst's own parse + print of that file.

    .venv/bin/python benchmarks/step_analysis.py [--repeat 5] [FILE...]

For every realistic-suite script (``fixtures/realistic/``; or the files given) prints the lines, libcst's
parse + print time (the floor no libcst tool goes below), the time of the step analysis (``StepModel``: its
walk, the callee resolution, the loop classification, the host-read plan and the gradient-reduction
decision), the time of the loop rules' traversal (XLA301, XLA302, XLA310-XLA314, XLA406), and
(analysis + rules) / (parse + print). Metadata resolution and the facts pass are shared by every rule and not
counted here. Goal: every file at most 3x; the last line says which files exceed it. Best of ``--repeat``
runs; timings vary with the machine and are printed, never asserted in tests.
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

import libcst as cst

from xla_migrate.engine.context import MigrationContext
from xla_migrate.engine.pipeline import _BatchedRules
from xla_migrate.engine.registry import all_rules
from xla_migrate.analysis.steps import StepModel
from xla_migrate.engine.targets import get_target

ROOT = Path(__file__).resolve().parent.parent
LOOP_RULES = ("XLA301", "XLA302", "XLA310", "XLA311", "XLA312", "XLA313", "XLA314", "XLA406")
GOAL = 3.0


def timed(run) -> float:
    """Seconds ``run()`` takes, with the garbage of earlier runs collected first (not counted)."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        run()
        return time.perf_counter() - start
    finally:
        gc.enable()


def best(repeat: int, run) -> float:
    return min(timed(run) for _ in range(repeat))


def measure(path: Path, repeat: int) -> tuple[int, float, float, float]:
    source = path.read_bytes()
    floor = best(repeat, lambda: cst.parse_module(source).bytes)
    rules = [r for r in all_rules() if r.code in LOOP_RULES]
    target = get_target("2.9")

    def context() -> MigrationContext:
        module = cst.parse_module(source)
        return MigrationContext(cst.MetadataWrapper(module, unsafe_skip_copy=True), target,
                                rule_codes=frozenset(r.code for r in rules))

    analysis_times, rule_times = [], []
    for _ in range(repeat):
        ctx = context()
        built: list[StepModel] = []

        def analyse() -> None:
            model = StepModel(ctx)
            model.host_reads  # noqa: B018 - computed on first use; the rules use it
            model.reductions  # noqa: B018
            built.append(model)

        analysis_times.append(timed(analyse))
        ctx.steps = built[0]
        rule_times.append(timed(lambda: ctx.module.visit(_BatchedRules([rule(ctx) for rule in rules]))))
    return len(source.splitlines()), floor, min(analysis_times), min(rule_times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    files = args.files or sorted((ROOT / "fixtures" / "realistic").glob("*.py"))
    print(f"{'file':34} {'lines':>5} {'parse+print':>11} {'analysis':>9} {'rules':>8} {'ratio':>6}")
    over = []
    worst = 0.0
    for path in files:
        lines, floor, analysis, rules = measure(path, args.repeat)
        ratio = (analysis + rules) / floor
        worst = max(worst, ratio)
        if ratio > GOAL:
            over.append(path.name)
        print(f"{path.name:34} {lines:5d} {floor * 1e3:9.1f}ms {analysis * 1e3:7.1f}ms {rules * 1e3:6.1f}ms "
              f"{ratio:5.2f}x")
    print(f"worst {worst:.2f}x; over {GOAL:.0f}x: {', '.join(over) or 'none'}")


if __name__ == "__main__":
    main()
