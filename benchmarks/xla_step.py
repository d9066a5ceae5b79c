"""Steps per second and compile counts of each migrated runnable fixture on torch_xla (PJRT CPU), side by side
with the hand-written XLA version of the same model where the project has one (fixtures/runnable/handwritten/).

    .venv/bin/python benchmarks/xla_step.py [--env current|sagemaker] [--only NAME ...]

Needs the environments of tools/xla_envs.sh (run it first). Steps per second are measured inside the script,
between the step markers after warm-up (xla-migrate verify's loader records when each one returns), so
interpreter start-up and the first compilations do not count; `wall` is the whole run. Run it on a quiet
machine: the figures are as noisy as the host.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "xla"))

import xla_proof as xp  # noqa: E402


def measure(python: Path, source: str, label: str, distributed: bool = False) -> dict:
    run = xp.run_script(python, source, label, xla=True, distributed=distributed)
    times = run.observation.step_times  # of the process that ran the steps
    warm = min(xp.WARMUP_STEPS, max(len(times) - 2, 0))
    steady = times[warm:]
    rate = (len(steady) - 1) / (steady[-1] - steady[0]) if len(steady) > 1 and steady[-1] > steady[0] else None
    steps = len(xp.parse_losses(run.stdout)) or len(re.findall(r"^replica 0/\d+ step", run.stdout, re.M))
    note = ""
    if run.returncode == 0 and len(times) < steps:
        rate, note = None, f"{len(times)} step markers for {steps} steps: no per-step rate"
    final = run.final or xp.Metrics()
    return {
        "ok": run.returncode == 0,
        "error": "" if run.returncode == 0 else (run.stderr.strip().splitlines() or ["?"])[-1][:70],
        "steps": steps,
        "note": note,
        "markers": len(times),
        "rate": rate,
        "compiles": final.compiles,
        "runs": final.runs,
        "reads": final.reads - run.closure_reads,
        "wall": run.wall,
    }


def cell(result: dict | None, key: str, fmt: str = "{}") -> str:
    if result is None:
        return "-"
    if not result["ok"]:
        return "crash"
    value = result[key]
    return "-" if value is None else fmt.format(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="current", choices=list(xp.TARGETS))
    parser.add_argument("--only", nargs="*", default=None, help="fixture names (default: all)")
    args = parser.parse_args(argv)

    python, why = xp.env_python(args.env)
    if python is None:
        print(why, file=sys.stderr)
        return 2
    from xla_migrate import migrate

    target = xp.TARGETS[args.env]
    rows = []
    for script in xp.SCRIPTS:
        if args.only and script.name not in args.only:
            continue
        reason = xp.skip_reason(script, args.env)
        if reason:
            rows.append((script.name, None, None, reason.split(":")[0]))
            continue
        result = migrate(script.path.read_text(), target=target)
        migrated = measure(python, result.code, f"bench {script.name}", script.distributed)
        handwritten = None
        if script.name in xp.HANDWRITTEN_FOR:
            path = xp.HANDWRITTEN / xp.HANDWRITTEN_FOR[script.name]
            handwritten = measure(python, path.read_text(), f"bench handwritten {path.stem}")
        note = migrated["error"] if not migrated["ok"] else migrated["note"]
        rows.append((script.name, migrated, handwritten, note))
        print(f"measured {script.name}", file=sys.stderr)

    header = (f"{'fixture':<18} {'steps':>5} {'migrated steps/s':>16} {'compiles':>8} {'runs':>5} "
              f"{'reads':>5} {'wall s':>6} | {'hand-written steps/s':>20} {'compiles':>8} {'runs':>5} "
              f"{'reads':>5}  note")
    print(f"torch_xla on PJRT CPU, env {args.env} (target {target}); reads = host reads outside step closures")
    print(header)
    print("-" * len(header))
    for name, migrated, handwritten, note in rows:
        print(f"{name:<18} {cell(migrated, 'steps'):>5} {cell(migrated, 'rate', '{:.1f}'):>16} "
              f"{cell(migrated, 'compiles'):>8} {cell(migrated, 'runs'):>5} {cell(migrated, 'reads'):>5} "
              f"{cell(migrated, 'wall', '{:.1f}'):>6} | {cell(handwritten, 'rate', '{:.1f}'):>20} "
              f"{cell(handwritten, 'compiles'):>8} {cell(handwritten, 'runs'):>5} {cell(handwritten, 'reads'):>5}"
              f"  {note}")
    xp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
