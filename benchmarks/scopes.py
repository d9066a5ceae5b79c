"""Name resolution: libcst's ScopeProvider against xla_migrate.analysis.scopes, on the same parsed modules.

    .venv/bin/python benchmarks/scopes.py [DIR ...] [--repeat N]

DIR: folders of ``.py`` files (default fixtures/realistic). Prints, best of N runs over all the files (each
inside ``walk.fast_visits()``, as the pipeline resolves them): libcst's ScopeProvider (with its
ExpressionContextProvider dependency) and that dependency alone, then ``scopes.resolve_scopes`` and
``scopes.expression_contexts`` alone, and the ratios. Then the whole pipeline (``xla_migrate.migrate`` on
every file, as benchmarks/throughput.py runs it) with the engine resolving libcst's ScopeProvider (before)
and with ``scopes.resolve_scopes`` (after), the two runs alternating (best of N each, so the machine's load
hits both alike), each against libcst's parse-and-print floor. tests/test_scopes.py checks that both give
the same scopes; here only the time is measured, never asserted.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import libcst as cst
from libcst.metadata import ExpressionContextProvider, ScopeProvider

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from xla_migrate.engine import context
from xla_migrate import migrate
from xla_migrate.analysis import scopes
from xla_migrate.syntax import walk  # noqa: E402


def _best(repeat: int, run) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="*", type=Path, default=[ROOT / "fixtures" / "realistic"])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    datas = []
    for folder in args.dirs:
        for path in sorted(folder.rglob("*.py")):
            try:
                cst.parse_module(path.read_bytes())
                datas.append(path.read_bytes())
            except cst.ParserSyntaxError:
                pass
    # The pipeline first, while no parsed module is held (they would make every garbage collection slower).
    floor = before = after = float("inf")
    for _ in range(args.repeat):
        floor = min(floor, _best(1, lambda: [cst.parse_module(d).bytes for d in datas]))
        context.resolve_scopes = _libcst_scopes
        before = min(before, _best(1, lambda: [migrate(d) for d in datas]))
        context.resolve_scopes = scopes.resolve_scopes
        after = min(after, _best(1, lambda: [migrate(d) for d in datas]))
    modules = [cst.parse_module(d) for d in datas]

    def wrappers():
        return [cst.MetadataWrapper(m, unsafe_skip_copy=True) for m in modules]

    def timed(resolve) -> float:
        # Fresh wrappers per run (a wrapper caches what it resolved); building them is not timed.
        best = float("inf")
        for _ in range(args.repeat):
            batch = wrappers()
            best = min(best, _best(1, lambda: [resolve(w) for w in batch]))
        return best

    with walk.fast_visits():
        libcst_scopes = timed(lambda w: w.resolve(ScopeProvider))
        libcst_contexts = timed(lambda w: w.resolve(ExpressionContextProvider))
        own_scopes = timed(scopes.resolve_scopes)
        own_contexts = _best(args.repeat, lambda: [scopes.expression_contexts(m) for m in modules])
    print(f"{len(modules)} files, best of {args.repeat}, load average {os.getloadavg()[0]:.2f}")
    print(f"pipeline, libcst ScopeProvider {before:7.3f} s  {before / floor:5.2f}x floor ({floor:.3f} s)")
    print(f"pipeline, xla_migrate.analysis.scopes   {after:7.3f} s  {after / floor:5.2f}x floor")
    print(f"libcst ScopeProvider          {libcst_scopes:7.3f} s  "
          f"(its ExpressionContextProvider {libcst_contexts:.3f} s)")
    print(f"xla_migrate.analysis.scopes            {own_scopes:7.3f} s  (its expression_contexts {own_contexts:.3f} s)")
    print(f"ratio                         {libcst_scopes / own_scopes:7.1f}x  "
          f"(expression contexts {libcst_contexts / own_contexts:.1f}x)")


def _libcst_scopes(wrapper: cst.MetadataWrapper):
    return wrapper.resolve(ScopeProvider)


if __name__ == "__main__":
    main()
