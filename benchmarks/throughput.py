"""Throughput: how fast xla-migrate gets through a tree of realistic training scripts.

    .venv/bin/python benchmarks/throughput.py [--files 120] [--keep]

Builds a corpus in a temp folder (the fixtures' CUDA scripts, stitched into files of a few hundred lines
with their names varied), then prints, side by side in one run:

- floor: libcst parse + print of every file, in this process (no tool can go below this);
- api -j1: ``xla_migrate.migrate`` on every file, in this process (the whole pipeline, no I/O or startup);
- cli -j1 / cli -j2: ``xla-migrate --in corpus --out DIR -j N`` as a user runs it (startup, walk, writes);
- ``xla-migrate --version`` and one small file end to end, best of several runs.

Goals: api within 1.5x of the floor; -j2 at least 1.7x faster than -j1 (needs 2 idle cores); --version under
0.15 s; a small file under 0.4 s. Timings vary with the machine: they are printed, never asserted in tests.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = Path(sys.executable).with_name("xla-migrate")


def sources() -> list[str]:
    paths = sorted(ROOT.glob("fixtures/XLA*/**/*.in.py")) + sorted(ROOT.glob("fixtures/examples/**/*.py"))
    paths += sorted(ROOT.glob("fixtures/runnable/**/*.py"))
    texts = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        try:
            compile(text, str(path), "exec")
        except SyntaxError:
            continue
        texts.append(text)
    return texts


def build_corpus(folder: Path, files: int, min_lines: int = 310) -> tuple[int, int]:
    """``files`` scripts of at least ``min_lines`` lines each: fixtures stitched together, names varied."""
    base = sources()
    if not base:
        raise SystemExit("no fixtures found under fixtures/")
    total = 0
    cursor = 0
    for index in range(files):
        parts, lines = [], 0
        while lines < min_lines:
            text = base[cursor % len(base)]
            cursor += 1
            # Vary the names so files differ (as a real tree would), keeping them valid Python.
            text = re.sub(r"\b(model|optimizer|loader|batch|loss)\b", lambda m: f"{m.group(1)}_{index % 7}", text)
            parts.append(f"# --- part {len(parts)} of script {index} ---\n{text}")
            lines += text.count("\n") + 1
        sub = folder / f"project_{index % 10}" / ("train" if index % 2 else "models")
        sub.mkdir(parents=True, exist_ok=True)
        body = "\n".join(parts)
        (sub / f"script_{index:03}.py").write_text(body, encoding="utf-8")
        total += body.count("\n")
    return files, total


def best_of(runs: int, function) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    return best


def floor(paths: list[Path]) -> float:
    import libcst

    def run():
        for path in paths:
            data = path.read_bytes()
            assert libcst.parse_module(data).bytes == data

    return best_of(1, run)


def api_single(paths: list[Path]) -> float:
    from xla_migrate import migrate

    def run():
        for path in paths:
            result = migrate(path.read_bytes(), path=str(path))
            assert result.ok, result.error

    return best_of(1, run)


def cli(*args: str, cwd: Path) -> None:
    done = subprocess.run([str(CLI), *args], cwd=cwd, capture_output=True)
    if done.returncode not in (0, 1):
        raise SystemExit(f"xla-migrate {' '.join(args)} failed ({done.returncode}): {done.stderr.decode()[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--keep", action="store_true", help="keep the corpus folder and print where it is")
    args = parser.parse_args()
    temp = Path(tempfile.mkdtemp(prefix="xla-migrate-bench-"))
    try:
        corpus = temp / "corpus"
        count, lines = build_corpus(corpus, args.files)
        paths = sorted(corpus.rglob("*.py"))
        print(f"corpus: {count} files, {lines} lines ({corpus if args.keep else 'temp folder'}); "
              f"{os.cpu_count()} CPUs", flush=True)

        print(f"\n{'measure':<44} {'seconds':>8} {'files/s':>8} {'lines/s':>9} {'x floor':>8}", flush=True)
        t_floor = floor(paths)

        def row(name: str, seconds: float) -> float:
            print(f"{name:<44} {seconds:8.2f} {count / seconds:8.1f} {lines / seconds:9.0f} "
                  f"{seconds / t_floor:8.2f}", flush=True)
            return seconds

        row("floor: libcst parse + print", t_floor)
        t_api = row("api: migrate() -j1, in process", api_single(paths))

        def cli_run(jobs: int):
            def run():
                out = temp / f"out{jobs}"
                shutil.rmtree(out, ignore_errors=True)
                cli("--in", "corpus", "--out", str(out), "-j", str(jobs), "-q", cwd=temp)
            return run

        t_j1 = row("cli: xla-migrate --in DIR --out DIR -j1", best_of(1, cli_run(1)))
        t_j2 = row("cli: xla-migrate --in DIR --out DIR -j2", best_of(1, cli_run(2)))

        small = temp / "small.py"
        small.write_text((ROOT / "fixtures" / "XLA101" / "dot_cuda.in.py").read_text())
        t_version = best_of(5, lambda: cli("--version", cwd=temp))
        t_small = best_of(5, lambda: cli("--in", "small.py", "--out", "small_xla.py", cwd=temp))

        def verdict(ok: bool) -> str:
            return "ok" if ok else "MISSED"

        print("\ngoal                                          figure     verdict")
        print(f"{'api -j1 within 1.5x of the floor':<44} {t_api / t_floor:7.2f}x   {verdict(t_api <= 1.5 * t_floor)}")
        print(f"{'cli -j2 at least 1.7x faster than -j1':<44} {t_j1 / t_j2:7.2f}x   {verdict(t_j1 / t_j2 >= 1.7)}")
        print(f"{'xla-migrate --version under 0.15 s':<44} {t_version:7.3f}s   {verdict(t_version < 0.15)}")
        print(f"{'one small file end to end under 0.4 s':<44} {t_small:7.3f}s   {verdict(t_small < 0.4)}")
    finally:
        if args.keep:
            print(f"corpus kept in {temp}")
        else:
            shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    main()
