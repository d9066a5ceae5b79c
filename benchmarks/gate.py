"""The output gate's cost: per file and in total, beside libcst's parse + print and the whole pipeline.

    .venv/bin/python benchmarks/gate.py [DIR ...]     (default: fixtures/realistic and fixtures/scripts)

For each .py file (recursively): libcst parse + print (the floor), ``migrate()`` for the 2.9 target (the
whole pipeline, gate included), and the gate alone on that output (compile + pyflakes on the output; the
input is analysed only when the output has an unbound name). Prints the slowest files and the totals;
figures are printed, never asserted.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import libcst as cst

from xla_migrate import migrate
from xla_migrate.engine.gate import OutputGate

ROOT = Path(__file__).resolve().parent.parent


def timed(function, *args):
    start = time.perf_counter()
    value = function(*args)
    return time.perf_counter() - start, value


def main(folders: list[str]) -> None:
    files = sorted(p for folder in folders for p in Path(folder).rglob("*.py"))
    rows = []
    for path in files:
        data = path.read_bytes()
        try:
            floor, _ = timed(lambda: cst.parse_module(data).code)
        except Exception:  # not parseable by libcst: nothing to gate
            continue
        pipeline, result = timed(migrate, data, "2.9")
        if result.error is not None:
            continue
        gate_time, _ = timed(lambda: OutputGate(result.source).problem(result.code))
        rows.append((path, result.code.count("\n"), floor, pipeline, gate_time))
    lines = sum(r[1] for r in rows)
    floor, pipeline, gate = (sum(r[i] for r in rows) for i in (2, 3, 4))
    print(f"{len(rows)} files, {lines} lines")
    print(f"{'file':50} {'lines':>6} {'floor s':>8} {'gate s':>8} {'gate/floor':>10} {'gate/pipeline':>13}")
    for path, n, f, p, g in sorted(rows, key=lambda r: -r[4])[:8]:
        print(f"{str(path)[-50:]:50} {n:6} {f:8.4f} {g:8.4f} {g / f:10.2f} {g / p:13.1%}")
    print(f"{'total':50} {lines:6} {floor:8.3f} {gate:8.3f} {gate / floor:10.2f} {gate / pipeline:13.1%}")
    print(f"gate per 1,000 lines: {gate / lines * 1000 * 1000:.1f} ms; pipeline total {pipeline:.2f} s")


if __name__ == "__main__":
    main(sys.argv[1:] or [str(ROOT / "fixtures" / "realistic"), str(ROOT / "fixtures" / "scripts")])
