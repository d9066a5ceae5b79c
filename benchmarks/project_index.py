"""The project index's cost beside the tree run it serves (issue 14: at most 10% of the run).

    .venv/bin/python benchmarks/project_index.py [DIR] [--jobs N] [--check]

DIR (default: fixtures, every Python file below it: goldens, realistic scripts, runnable fixtures and the
fixture project, about 200 files) is migrated as a tree, dry (``--check``: nothing written), with the
index built first as the CLI builds it; the index is then built alone, three times (the best counts). Prints
both and the ratio; ``--check`` exits 1 when the index costs more than 10% of the run. With ``--jobs N``
(default 1) the run uses N worker processes: the index is built once in the parent before they start, so
the fraction grows with N; the budget is stated for one worker.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from xla_migrate.cli import discovery, tree, workers
from xla_migrate.cli.discovery import index_for

ROOT = Path(__file__).resolve().parent.parent
BUDGET = 0.10


def measure(folder: str, jobs: int) -> tuple[float, float, int, int]:
    """(index seconds, tree run seconds with the index, files indexed, files migrated)."""
    ignorer = discovery.Ignorer(True, [(None, [])])
    found = discovery.discover([folder], ignorer)
    tasks = [tree.Task(f.path, discovery.kind_of(f.path), None) for f in found if discovery.kind_of(f.path) != "other"]
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        index = index_for(folder, ignorer)
        best = min(best, time.perf_counter() - start)
    options = tree.Options("2.9", None, None, None, None, write=False, copy_others=False, want_diff=False,
                           project=index)
    start = time.perf_counter()
    index_for(folder, ignorer)
    workers.run_all(tasks, options, jobs)
    run = time.perf_counter() - start
    return best, run, len(index.modules), len(tasks)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", nargs="?", default=str(ROOT / "fixtures"))
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    index, run, indexed, migrated = measure(args.folder, args.jobs)
    ratio = index / run
    print(f"{os.path.relpath(args.folder)}: index {index * 1000:.0f} ms for {indexed} modules; tree run "
          f"{run:.2f} s for {migrated} files (-j {args.jobs}); index = {ratio:.1%} of the run "
          f"(budget {BUDGET:.0%})")
    return 1 if args.check and ratio > BUDGET else 0


if __name__ == "__main__":
    sys.exit(main())
