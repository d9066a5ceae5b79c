"""Start-up: ``xla-migrate --version`` and one small file end to end, and where a plain run's imports go.

    .venv/bin/python benchmarks/startup.py [--cli PATH ...] [--runs N] [--imports N]

For each console script (default: this venv's; pass several ``--cli`` to compare installs, e.g. the main
checkout's and a branch's, measured in turns so that the machine's load falls on each alike), best of N runs:

- ``xla-migrate --version``;
- ``xla-migrate small.py --out small_xla.py -q`` on a copy of fixtures/examples/train_cuda.py (53 lines);

each as wall seconds and as the child's CPU seconds (user + system: what the load of a shared machine
changes least), twice: with the environment as it is (where PYTHONDONTWRITEBYTECODE is set, Python compiles
every module of xla-migrate on every run) and with a bytecode cache (PYTHONPYCACHEPREFIX in a temporary
folder, filled by a first run: what an installed package has). Then, per script, the ``python -X importtime``
entries of one small-file run (with the bytecode cache) that cost the most themselves, their total, and
which of the libraries a plain run does not need were imported; and the phases of one run in one process
(libcst's import, xla-migrate's modules, the rules, the run, the same run again; the rules are imported
through importlib, which importtime does not see). Figures depend on the machine and its load (printed); they are never asserted in tests.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMALL = ROOT / "fixtures" / "examples" / "train_cuda.py"
RUN = ["small.py", "--out", "small_xla.py", "-q"]


def timed(command: list[str], cwd: Path, env: dict) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one child process."""
    with tempfile.TemporaryFile() as stderr:  # a file, not a pipe: a full pipe would stall the child
        start = time.perf_counter()
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            stderr.seek(0)
            raise SystemExit(f"{' '.join(command)} failed: {stderr.read().decode(errors='replace')[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime


def environments(temp: Path, index: int) -> dict[str, dict]:
    cached = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    cached["PYTHONPYCACHEPREFIX"] = str(temp / f"pycache-{index}")
    as_is = "environment as is" + (" (PYTHONDONTWRITEBYTECODE set: no bytecode cache)"
                                   if os.environ.get("PYTHONDONTWRITEBYTECODE") else "")
    return {as_is: dict(os.environ), "bytecode cache": cached}


def import_times(cli: Path, cwd: Path, env: dict, top: int) -> None:
    python = cli.with_name("python")
    done = subprocess.run([str(python), "-X", "importtime", "-m", "xla_migrate", *RUN], cwd=cwd, env=env,
                          capture_output=True, text=True, check=True)
    rows = []
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "self [us]" not in line:
            own, cumulative, name = line[len("import time:"):].split("|")
            rows.append((int(own), int(cumulative), name.strip()))
    print(f"\npython -X importtime of one small-file run ({cli}, bytecode cache): {len(rows)} modules, "
          f"{sum(r[0] for r in rows) / 1e6:.3f} s in all; the {top} that cost the most themselves:")
    for own, cumulative, name in sorted(rows, reverse=True)[:top]:
        print(f"  {own / 1e3:7.1f} ms  (with its imports {cumulative / 1e3:7.1f} ms)  {name}")
    heavy = [name for name in ("typer", "pydantic", "rich", "click", "unidiff", "nbformat", "pathspec",
                               "importlib.metadata", "email") if any(r[2] == name for r in rows)]
    print(f"  imported of typer, pydantic, rich, click, unidiff, nbformat, pathspec, importlib.metadata, "
          f"email: {', '.join(heavy) or 'none'}")


# One plain run's phases in one process, timed with perf_counter (the rules are imported through importlib,
# which -X importtime does not see).
PHASES = """
import sys, time
marks = [time.perf_counter()]
import libcst, libcst.metadata
marks.append(time.perf_counter())
import xla_migrate.cli.main
from xla_migrate import cli
from xla_migrate.engine import pipeline as engine
marks.append(time.perf_counter())
from xla_migrate.engine.registry import all_rules
all_rules()
marks.append(time.perf_counter())
for _ in range(2):
    sys.argv = ["xla-migrate", *sys.argv[1:]] if _ == 0 else sys.argv
    try:
        cli.run()
    except SystemExit:
        pass
    marks.append(time.perf_counter())
names = ["libcst", "xla_migrate's modules", "the rules", "the run", "the same run again"]
print(", ".join(f"{name} {1000 * (b - a):.0f} ms" for name, a, b in zip(names, marks, marks[1:])))
"""


def phases(cli: Path, cwd: Path, env: dict) -> str:
    done = subprocess.run([str(cli.with_name("python")), "-c", PHASES, *RUN], cwd=cwd, env=env,
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cli", action="append", type=Path,
                        help="an xla-migrate console script (repeatable; default: this venv's)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--imports", type=int, default=15, help="importtime entries to print (0: none)")
    options = parser.parse_args()
    clis = [cli.absolute() for cli in options.cli or [Path(sys.executable).with_name("xla-migrate")]]
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; best of {options.runs}")
    with tempfile.TemporaryDirectory() as name:
        temp = Path(name)
        shutil.copyfile(SMALL, temp / "small.py")
        envs = [environments(temp, index) for index in range(len(clis))]
        for label in envs[0]:
            for cli, env in zip(clis, envs):
                timed([str(cli), *RUN], temp, env[label])  # fills the bytecode cache
            best: dict[tuple[Path, str], list[tuple[float, float]]] = {}
            for _ in range(options.runs):
                for cli, env in zip(clis, envs):
                    for what, args in (("--version", ["--version"]), ("small file", RUN)):
                        best.setdefault((cli, what), []).append(timed([str(cli), *args], temp, env[label]))
            print(f"\n{label}:")
            for (cli, what), times in best.items():
                print(f"  {what:<10} wall {min(t[0] for t in times):.3f} s  cpu {min(t[1] for t in times):.3f} s"
                      f"  {cli}")
            for cli, env in zip(clis, envs):
                print(f"  phases in one process: {phases(cli, temp, env[label])}  {cli}")
        for cli, env in zip(clis, envs) if options.imports else ():
            import_times(cli, temp, env["bytecode cache"], options.imports)
    print(f"\nload average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
