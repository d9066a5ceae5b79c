"""Growth: does the pipeline's cost grow with the input as libcst's parse-and-print floor does, whatever the
input's shape? (issue 38)

    .venv/bin/python benchmarks/growth.py [--sizes 1,5] [--shapes functions,imports,...] [--target T]
                                          [--repeats N]

For each shape of benchmarks/shapes.py (``functions``, ``imports``, ``statements``, ``nesting``; ``real``, the
developers' corpus concatenated, when it is there) and each size (megabytes; default the issue's 1 and 5;
``--sizes 0.25,1.25`` is a quicker check of the same fivefold growth), prints the CPU seconds of
``xla_migrate.migrate`` and of the floor (``libcst.parse_module`` + ``.bytes``), each in a fresh process (so
one size's memory and caches do not touch the next), the tool's peak memory, and between the smallest and the
largest size the growth of the tool's time and of the floor's. Floor and tool alternate (floor, tool, floor,
... ``--repeats`` tool runs between ``--repeats + 1`` floor runs; the best of each is kept), and every call is
followed by a ``gc.collect()`` timed in: the tool pauses the collector while it runs, so its garbage is part of
its cost (the collection's own seconds are printed beside it). A shape is ``linear`` when the tool's growth is
at most 1.2x the floor's (the bar, printed with each figure), else ``SUPERLINEAR``; the exit status is 1 when
a shape is superlinear. CPU time, not wall time: the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
BAR = 1.2

CHILD = r"""
import gc, json, resource, sys, time
data = open(sys.argv[1], "rb").read()
if sys.argv[2] == "floor":
    import libcst
    start = time.process_time()
    assert libcst.parse_module(data).bytes == data
else:
    from xla_migrate import migrate
    start = time.process_time()
    result = migrate(data, target=sys.argv[3])
    assert result.error is None, result.error
returned = time.process_time()
collected = gc.collect()  # the call's own garbage is part of its cost (the tool pauses the collector)
end = time.process_time()
print(json.dumps({"cpu": end - start, "gc": end - returned, "collected": collected,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def measure(path: Path, which: str, target: str) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), which, target], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{which} on {path.name} failed:\n{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


def main() -> int:
    sys.path.insert(0, str(HERE))
    from shapes import CORPUS, SHAPES

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1,5", help="megabytes, comma-separated (the issue's: 1,5)")
    parser.add_argument("--shapes", default=",".join(s for s in SHAPES if s != "real" or CORPUS.is_dir()))
    parser.add_argument("--target", default="sagemaker")
    parser.add_argument("--repeats", type=int, default=1, help="tool runs per size, alternated with floor runs")
    args = parser.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]
    verdicts = {}
    with tempfile.TemporaryDirectory() as folder:
        for shape in args.shapes.split(","):
            rows = []
            for megabytes in sizes:
                path = Path(folder) / f"{shape}-{megabytes}.py"
                path.write_text(SHAPES[shape](int(megabytes * 1_000_000)))
                # alternated: floor, tool, floor, ..., tool, floor; the best of each
                floors = [measure(path, "floor", args.target)]
                tools = []
                for _ in range(max(1, args.repeats)):
                    tools.append(measure(path, "tool", args.target))
                    floors.append(measure(path, "floor", args.target))
                floor = min(floors, key=lambda run: run["cpu"])
                tool = min(tools, key=lambda run: run["cpu"])
                rows.append((path.stat().st_size, floor["cpu"], tool["cpu"], tool["peak_mb"]))
                print(f"{shape:10} {rows[-1][0] / 1e6:5.2f} MB  tool {tool['cpu']:7.2f} s (collection "
                      f"{tool['gc']:5.2f} s, {tool['collected']} objects)  floor {floor['cpu']:6.2f} s (collection "
                      f"{floor['gc']:4.2f} s)  ratio {tool['cpu'] / floor['cpu']:5.2f}  peak {tool['peak_mb']:6.0f} MB",
                      flush=True)
            (size0, floor0, tool0, _), (size1, floor1, tool1, _) = rows[0], rows[-1]
            tool_growth, floor_growth = tool1 / tool0, floor1 / floor0
            linear = tool_growth <= BAR * floor_growth
            verdicts[shape] = linear
            print(f"{shape:10} {size1 / size0:.1f}x the bytes: tool {tool_growth:.2f}x, floor {floor_growth:.2f}x, "
                  f"tool/floor growth {tool_growth / floor_growth:.2f} against the bar {BAR:.2f}: "
                  f"{'linear' if linear else 'SUPERLINEAR'}", flush=True)
    failed = [shape for shape, linear in verdicts.items() if not linear]
    verdict = f"FAILED for {', '.join(failed)}" if failed else "met by every shape"
    print(f"growth bar ({BAR}x the floor's growth): {verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
