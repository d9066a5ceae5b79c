"""Node positions: libcst's PositionProvider against positions.py, both against a plain print.

    .venv/bin/python benchmarks/positions.py [DIR ...] [--repeat N]

DIR: folders of ``.py`` files (any depth; default ``fixtures/realistic``); files libcst cannot parse are
left out. Printed, best of N runs over all files (parsed once beforehand): ``Module.code`` (the print),
``MetadataWrapper.resolve(PositionProvider)`` and ``positions.Positions`` (which gives the code as well),
each with its ratio to the print (the three take turns in each run). Timings depend on the machine's
load: printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from xla_migrate.syntax.positions import Positions

ROOT = Path(__file__).resolve().parent.parent


def _modules(folders: list[Path]) -> list[cst.Module]:
    modules = []
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            try:
                modules.append(cst.parse_module(path.read_bytes()))
            except cst.ParserSyntaxError:
                pass
    return modules


def _best_of(works: dict, modules: list[cst.Module], repeat: int) -> dict[str, float]:
    """Best time of each work over all modules; the works take turns, so a change of load hits them alike."""
    best = dict.fromkeys(works, float("inf"))
    for _ in range(repeat):
        for name, work in works.items():
            start = time.perf_counter()
            for module in modules:
                work(module)
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", type=Path, default=[ROOT / "fixtures" / "realistic"])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    modules = _modules(args.folders)
    print(f"{len(modules)} files, load average {os.getloadavg()[0]:.2f}, best of {args.repeat}")
    best = _best_of({
        "print": lambda m: m.code,
        "provider": lambda m: MetadataWrapper(m, unsafe_skip_copy=True).resolve(PositionProvider),
        "own": Positions,
    }, modules, args.repeat)
    printed, provider, own = best["print"], best["provider"], best["own"]
    print(f"  Module.code       {printed:7.3f} s")
    print(f"  PositionProvider  {provider:7.3f} s  {provider / printed:5.1f}x the print")
    print(f"  Positions         {own:7.3f} s  {own / printed:5.1f}x the print "
          f"({provider / own:.1f}x faster than PositionProvider)")


if __name__ == "__main__":
    main()
