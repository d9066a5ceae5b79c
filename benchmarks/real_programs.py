"""Real programs, run end to end: the developers' measure of what the migration does to training programs.

    .venv/bin/python benchmarks/real_programs.py [--cache DIR] [-j 2] [--only NAME[,NAME]] [--targets 2.9,sagemaker]
                                                 [--json PATH] [--compare OLD.json] [--keep DIR] [--timeout S]
    .venv/bin/python benchmarks/real_programs.py --setup      # once: the programs' own dependencies (below)
    .venv/bin/python benchmarks/real_programs.py --list       # the recipes

For each recipe of ``benchmarks/real_programs/`` (one file per program) the suite copies the repository from the
cache (``--cache``, default ``~/.cache/xla-migrate/repos/<owner>+<name>``; never part of this repository), makes
the recipe's tiny-run changes (flags, a tiny config, environment variables, identifier substitutions) and fake
data in the shape the program reads (a recipe's original-only substitutions, what CPU torch needs where the
program hard-codes CUDA, go into a second copy the original runs from and the migration never sees), then:

1. runs the original on plain CPU torch (the ``current`` environment's torch 2.9.0, CUDA hidden) and reads its
   loss curve with the recipe's regex;
2. migrates the copy as a project (``xla-migrate COPY --out OUT --target T [--data-parallel F]``: a tree run,
   whose root is the project) for each target, and the recipe's extra data-parallel forms;
3. runs ``xla-migrate verify OUT/ENTRY --against ORIGINAL --format json`` on torch_xla (2.9 for ``--target 2.9``,
   2.6.1 for ``sagemaker``; a sagemaker output that enters torch_xla's ``amp.autocast(device)`` without testing the
   hardware is not run: 2.6.1 crashes entering it on a CPU device) with ``XLA_METRICS_FILE`` set, so torch_xla
   itself writes its metrics at every step marker; ORIGINAL is a small launcher that runs the original entry in
   its own folder (its writes never land in the output's folder) with the recipe's original-only arguments;
4. measures from torch_xla's metrics file, independently of verify's loader: compilations after warm-up,
   graph executions per step, host reads (``aten::_local_scalar_dense``) per step, ops that fell back to the
   CPU; compares the losses with the original's of step 1, with verify's definitions (fp32 programs: 1e-3 at
   every value; programs that draw random numbers: verify's stochastic curve comparison; AMP: its bf16 one);
   gives its own verdict, and whether verify's verdict agrees with it;
5. where the recipe names how: resumes from the checkpoint the run wrote (original and output alike) and
   compares the resumed losses. The replicas column is verify's replica probe: "1 proc" for a single-process
   run, "ok" for a data-parallel one whose every update was reduced once, else the unreduced updates.

Stdout gets one table (a row per program and target) and a summary per target; ``--json PATH`` keeps every
figure (both loss curves, verify's report, the migration's counts), rewritten after every program (``complete``
says whether every recipe ran, so a stopped run keeps what it measured); ``--compare OLD.json`` prints what got
better and worse since that run. ``-j N`` runs N programs at a time (each program's runs stay sequential).

Every program's runs get a HOME of their own under the work folder (the output's persistent compilation cache
starts empty) and, for a recipe's ``{port}``, a free port (a process group's MASTER_PORT). A data-parallel
recipe (llama2c_ddp) runs at world size 1 under torchrun's variables: the replica probe then judges every
update, but what only a second process shows (replicas that never meet) stays out of sight.

``--setup`` installs what the programs import and the torch environments lack (torchvision matched to each
torch, pillow, matplotlib, gymnasium...) with ``pip install --target`` into
``~/.cache/xla-migrate/real-programs/`` (``--extras``), never into the shared environments; runs put it on
PYTHONPATH, after ``benchmarks/real_programs/_stubs`` (no-op ``wandb`` and ``tensorboard_logger``; a recipe's
``seed`` seeds an unseeded program's every process there).

Exit status: 0 when the suite ran (whatever it found), 2 for bad arguments, a missing repository or missing
dependencies (one line naming it).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "benchmarks" / "real_programs"
STUBS = RECIPES / "_stubs"
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(RECIPES))
from xla_migrate import verify  # noqa: E402  (the product's loss parsing, warm-up and thresholds)
from xla_migrate.verify.run import last_error_line, run_child  # noqa: E402
from _recipe import Recipe  # noqa: E402
from real_programs_measure import (agreement, compare, compare_losses, metrics_figures, own_problems,  # noqa: E402
                                   parse_metrics_file, placement_figures, read_placement, render_notes,
                                   render_summary, render_table, status_of, summarize)

SCHEMA, SCHEMA_VERSION = "xla-migrate-real-programs", 1
DEFAULT_CACHE = Path.home() / ".cache" / "xla-migrate" / "repos"
DEFAULT_EXTRAS = Path.home() / ".cache" / "xla-migrate" / "real-programs"
ENV_OF_TARGET = {"2.9": "current", "sagemaker": "sagemaker"}
TORCHVISION = {"current": "torchvision==0.24.0", "sagemaker": "torchvision==0.21.0"}  # matched to torch 2.9.0 / 2.6.0


# Recipes and the cache ---------------------------------------------------------------------------------------


def load_recipes(folder: Path = RECIPES) -> list[Recipe]:
    recipes = []
    for path in sorted(folder.glob("*.py")):
        if path.name.startswith("_"):
            continue
        spec = importlib.util.spec_from_file_location(f"recipe_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        recipe = getattr(module, "RECIPE", None)
        if not isinstance(recipe, Recipe):
            raise SystemExit(f"error: {path}: defines no RECIPE")
        recipes.append(recipe)
    names = [r.name for r in recipes]
    if len(set(names)) != len(names):
        raise SystemExit("error: two recipes share a name")
    return recipes


def repo_folder(cache: Path, repo: str) -> Path:
    return cache / repo.replace("/", "+")


def missing_repositories(recipes: list[Recipe], cache: Path) -> list[str]:
    return [r.repo for r in recipes if not repo_folder(cache, r.repo).is_dir()]


def variants(recipe: Recipe, targets: list[str]) -> list[tuple[str, str | None]]:
    """(target, data-parallel form or None for the target's default), in order."""
    return [(t, None) for t in targets] + [(t, f) for t, f in recipe.forms if t in targets]


def label(target: str, form: str | None) -> str:
    return target if form is None else f"{target} {form}"


# Preparing a copy ----------------------------------------------------------------------------------------------


def prepare_copy(recipe: Recipe, source: Path, dest: Path) -> None:
    """The repository (or the recipe's parts of it), with the tiny-run changes and the fake data."""
    ignore = shutil.ignore_patterns(".git")
    if recipe.keep:
        for part in recipe.keep:
            src = source / part
            if src.is_dir():
                shutil.copytree(src, dest / part, ignore=ignore, symlinks=True)
            else:
                (dest / part).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / part)
    else:
        shutil.copytree(source, dest, ignore=ignore, symlinks=True)
    substitute(dest, recipe.substitutions)
    for rel, text in recipe.files.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_text(text, encoding="utf-8")
    if recipe.data:
        recipe.data(dest)


def substitute(dest: Path, substitutions) -> None:
    for sub in substitutions:
        path = dest / sub.path
        text = path.read_text(encoding="utf-8")
        found = text.count(sub.old)
        if found != sub.count:
            raise RecipeError(f"substitution in {sub.path}: {sub.old!r} found {found} times, expected {sub.count} "
                              "(the repository changed?)")
        path.write_text(text.replace(sub.old, sub.new), encoding="utf-8")


def original_copy(recipe: Recipe, orig: Path) -> Path:
    """The copy the original runs from: the migrated one itself, or beside it a second copy with the recipe's
    original-only substitutions (what CPU torch needs where the program hard-codes CUDA), never migrated."""
    if not recipe.original_substitutions:
        return orig
    run = orig.with_name(orig.name + "-cpu")
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(orig, run, symlinks=True)
    substitute(run, recipe.original_substitutions)
    return run


def fresh_copy(source: Path, dest: Path) -> Path:
    """A copy of ``source`` at ``dest`` (replacing what was there): where one run of the original starts."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(source, dest, symlinks=True)
    return dest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def program_env(recipe: Recipe, work: Path) -> dict[str, str]:
    """The recipe's variables for one program's runs: "{port}" filled in, and a HOME of its own: the output's
    persistent compilation cache (~/.cache/xla_compile) starts empty and stays with the program, so what a
    run compiles never depends on what an earlier run or another program left there (PJRT's CPU client cannot
    read that cache back today, "Deserializing serialized executable not supported", but a later one may)."""
    port = str(free_port())
    return {"HOME": str(work / "home"), **{k: v.replace("{port}", port) for k, v in recipe.env.items()}}


class RecipeError(Exception):
    """The recipe does not fit the repository in the cache: one line."""


def copy_missing_files(orig: Path, out: Path) -> int:
    """Files of the copy the mirror did not write (ignored by a .gitignore: fake data, say), copied as they are."""
    copied = 0
    for path in orig.rglob("*"):
        target = out / path.relative_to(orig)
        if path.is_file() and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
            copied += 1
    return copied


def notebook_script(notebook: Path) -> Path:
    """A notebook entry runs as a script of its code cells, in order (IPython lines become comments), written
    beside it: NAME.ipynb -> NAME_ipynb.py, for the original and, from the migrated notebook, for the output."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    lines = []
    for cell in cells:
        if cell.get("cell_type") != "code":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if source.lstrip().startswith("%%"):
            continue  # a cell magic: another language, or timing
        for line in source.splitlines():
            stripped = line.lstrip()
            lines.append(f"{line[:len(line) - len(stripped)]}pass  # {stripped}" if stripped.startswith(("%", "!"))
                         else line)
        lines.append("")
    script = notebook.with_name(notebook.stem + "_ipynb.py")
    script.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return script


def entry_script(recipe: Recipe, root: Path) -> Path:
    entry = root / recipe.entry
    return entry.with_name(entry.stem + "_ipynb.py") if entry.suffix == ".ipynb" else entry


LAUNCHER = '''\
"""Runs the original entry in its own folder (real-programs suite launcher; not part of the program).{amp}"""
import os, runpy, sys
os.chdir({cwd!r})
sys.argv = [{entry!r}] + sys.argv[1:] + {extra!r}
sys.path[:] = [os.path.dirname({entry!r})] + {paths!r} + [p for p in sys.path[1:] if p not in {drop!r}]
runpy.run_path({entry!r}, run_name="__main__")
'''


def write_launcher(path: Path, entry: Path, cwd: Path, extra: tuple[str, ...], paths: list[Path] = (),
                   drop: list[Path] = ()) -> Path:
    """The original's entry, run in its own folder with its own package roots first (the output's left out)."""
    # verify decides "AMP" from the scripts' text: the launcher names the original's markers so the decision
    # is the one --against ORIGINAL_ENTRY would give.
    markers = sorted(set(verify.AMP_MARKERS.findall(entry.read_text(encoding="utf-8", errors="replace"))))
    amp = f" The original uses: {', '.join(markers)}." if markers else ""
    path.write_text(LAUNCHER.format(cwd=str(cwd), entry=str(entry), extra=list(extra), amp=amp,
                                    paths=[str(p) for p in paths], drop=[str(p) for p in drop]), encoding="utf-8")
    return path


# Running -------------------------------------------------------------------------------------------------------


class Context:
    """What every program's runs share: interpreters, paths, the tool's command line, options."""

    def __init__(self, args: argparse.Namespace, pythons: dict[str, str]):
        self.cache, self.extras, self.pythons = args.cache, args.extras, pythons
        self.targets = args.targets
        self.timeout_scale = args.timeout_scale
        self.tool = args.tool
        self.keep = args.keep
        self.work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="real-programs-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.mpl = self.work / ".mplconfig"

    def env(self, recipe: Recipe, env_name: str, root: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "XLA_METRICS_FILE")}
        # One thread per process: -j 2 on two cores, and the same float reduction order in both runs.
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0", MPLBACKEND="Agg",
                   WANDB_MODE="disabled", MPLCONFIGDIR=str(self.mpl), PYTHONDONTWRITEBYTECODE="1",
                   PYTHONPATH=os.pathsep.join([*(str(root / p) for p in recipe.pythonpath), str(STUBS),
                                               str(self.extras / f"tv-{env_name}"), str(self.extras / "common")]))
        if recipe.seed is not None:
            env["REAL_PROGRAMS_SEED"] = str(recipe.seed)
        env.update(recipe.env)
        return env


XLA_AUTOCAST = re.compile(r"\b(?:xla_amp|torch_xla\.amp)\.autocast\(")


def enters_xla_autocast(out: Path) -> bool:
    """Whether a migrated tree enters torch_xla's ``amp.autocast`` without testing the hardware first: 2.6.1
    crashes entering it on a CPU device, even at float32, where on a TPU it only warns. The tool's sagemaker
    output tests ``xm.xla_device_hw(device) != "CPU"`` on the same line (XLA201), except in a decorator."""
    return any(XLA_AUTOCAST.search(line) and "xla_device_hw" not in line
               for path in out.rglob("*.py") for line in path.read_text(errors="replace").splitlines())


def run_original(recipe: Recipe, ctx: Context, orig: Path) -> dict:
    """``orig``: the copy the original runs from (original_copy)."""
    process = verify.run_plain(ctx.pythons["current"], entry_script(recipe, orig), [*recipe.args, *recipe.original_args],
                               cwd=str(orig / recipe.cwd), loss_regex=recipe.loss_regex,
                               timeout=recipe.timeout * ctx.timeout_scale, env=ctx.env(recipe, "current", orig))
    return {"exit_status": process.returncode, "timed_out": process.timed_out,
            "last_error_line": process.last_error_line, "wall_s": round(process.wall, 1),
            "losses": verify.parse_losses(process.stdout, recipe.loss_regex),
            "stdout_tail": process.stdout[-2000:], "stderr_tail": process.stderr[-3000:]}


def migrate(recipe: Recipe, ctx: Context, orig: Path, out: Path, target: str, form: str | None) -> dict:
    report_path = out.parent / f"{out.name}.report.json"
    cmd = [*ctx.tool, str(orig), "--out", str(out), "--target", target, "-j", "1", "-q", "--report", str(report_path)]
    if form:
        cmd += ["--data-parallel", form]
    if recipe.entry.endswith(".ipynb"):  # the original's script of the notebook is not part of the program
        cmd += ["--extend-exclude", Path(recipe.entry).stem + "_ipynb.py"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(out.parent), timeout=600)
    record = {"command": " ".join(cmd[len(ctx.tool):]), "exit_status": proc.returncode,
              "wall_s": round(time.perf_counter() - start, 1),
              "error": last_error_line(proc.stderr) if proc.returncode not in (0,) else None}
    try:
        report = json.loads(report_path.read_text())
    except (OSError, ValueError):
        return record
    project = report.get("project") or {}
    entry_rel = f"{orig.name}/{recipe.entry}"
    entry = next((f for f in report["files"] if f["path"] == entry_rel), None)
    record.update(files=project.get("files", len(report["files"])),
                  changed=sum(bool(f["changed"]) for f in report["files"]),
                  changes=sum(len(f["changes"]) for f in report["files"]),
                  findings=sum(len(f["findings"]) for f in report["files"]),
                  errors=[f"{f['path']}: {f['error']}" for f in report["files"] if f.get("error")],
                  data_parallel=(project.get("decisions") or {}).get("data_parallel", {}).get("value"),
                  cuda_left=(project.get("cuda_constructs") or {}).get("left"),
                  entry_changes=len(entry["changes"]) if entry else None)
    return record


def run_variant(recipe: Recipe, ctx: Context, work: Path, orig: Path, original: dict, target: str,
                form: str | None, cpu: Path | None = None, own: Path | None = None) -> dict:
    """Migrates ``orig``; verify's run of the original starts from a fresh copy of ``cpu`` (original_copy;
    default ``orig``); the resume check resumes the original where its own first run (``own``) left it."""
    cpu = cpu or orig
    own = own or cpu
    name = label(target, form)
    slug = name.replace(" ", "-").replace(".", "")
    out = work / f"out-{slug}"
    env_name = ENV_OF_TARGET[target]
    record: dict = {"label": name, "target": target, "form": form, "env": env_name}
    record["migrate"] = migrate(recipe, ctx, orig, out, target, form)
    if record["migrate"]["exit_status"] != 0 or not (out / recipe.entry).exists():
        record["skipped"] = f"migration failed: {record['migrate'].get('error')}"
        return record
    record["migrate"]["copied_files"] = copy_missing_files(orig, out)
    if recipe.entry.endswith(".ipynb"):
        notebook_script(out / recipe.entry)
    if original["exit_status"] != 0:
        record["skipped"] = "the original does not run on CPU torch"
        return record
    if target == "sagemaker" and enters_xla_autocast(out):
        record["skipped"] = ("its output enters torch_xla's amp.autocast(device) unguarded, which crashes on a CPU "
                             "device (2.6.1: its XLA:CPU branch never sets up torch.autocast)")
        return record
    metrics_file = work / f"metrics-{slug}.txt"
    metrics_file.unlink(missing_ok=True)
    start = fresh_copy(cpu, work / f"orig-{slug}")
    launcher = write_launcher(work / f"original-{slug}.py", entry_script(recipe, start), start / recipe.cwd,
                              recipe.original_args, [start / p for p in recipe.pythonpath],
                              [out / p for p in recipe.pythonpath])
    env = ctx.env(recipe, env_name, out)
    env["XLA_METRICS_FILE"] = str(metrics_file)
    placement = work / f"placement-{slug}"  # the suite's own probe of where the optimizers' parameters lived
    shutil.rmtree(placement, ignore_errors=True)
    placement.mkdir()
    env["REAL_PROGRAMS_PLACEMENT"] = str(placement)
    timeout = recipe.timeout * ctx.timeout_scale
    cmd = [*ctx.tool, "verify", str(entry_script(recipe, out)), "--against", str(launcher), "--python",
           ctx.pythons[env_name], "--format", "json", "--loss-regex", recipe.loss_regex, "--timeout", str(timeout),
           "--", *recipe.args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(out / recipe.cwd), env=env,
                              timeout=2 * timeout + 120)
        report = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None
        verify_exit, verify_error = proc.returncode, last_error_line(proc.stderr)
    except subprocess.TimeoutExpired:
        report, verify_exit, verify_error = None, None, "verify itself timed out"
    record["verify"] = {"exit_code": verify_exit, "error": verify_error if report is None else None,
                        "report": report}
    record["run"] = dict(report["run"]) if report else {"exit_status": None, "timed_out": None}
    blocks = parse_metrics_file(metrics_file.read_text(errors="replace")) if metrics_file.exists() else []
    record["own"] = metrics_figures(blocks)
    record["own"]["placement"] = placement_figures(read_placement(placement))
    values = [float(v) for v in (report["losses"]["values"] if report else [])]
    record["losses"] = compare_losses(values, original["losses"], amp=recipe.amp, random=bool(recipe.random),
                                      different_start="weight init" in recipe.random)
    record["losses"]["curve"] = values
    record["problems"] = own_problems(record["run"], record["own"], record["losses"])
    record["status"] = status_of(record["problems"])
    record["agrees"], record["disagreement"] = agreement(record["problems"], report)
    record["resume"] = run_resume(recipe, ctx, own, out, env_name) if recipe.resume and record["status"] != "crash" \
        else {"status": "n/a"}
    return record


def run_resume(recipe: Recipe, ctx: Context, orig: Path, out: Path, env_name: str) -> dict:
    """The original and the output each resume from the checkpoint their own first run wrote."""
    regex = recipe.resume.loss_regex or recipe.loss_regex
    original = verify.run_plain(ctx.pythons[env_name], entry_script(recipe, orig),
                                [*recipe.resume.args, *recipe.original_args], cwd=str(orig / recipe.cwd),
                                loss_regex=regex, timeout=recipe.timeout * ctx.timeout_scale,
                                env=ctx.env(recipe, env_name, orig))
    env = ctx.env(recipe, env_name, out)
    env.update(PJRT_DEVICE="CPU", CUDA_VISIBLE_DEVICES="")
    work = Path(tempfile.mkdtemp(prefix="resume-", dir=out.parent))
    migrated = run_child([ctx.pythons[env_name], str(entry_script(recipe, out)), *recipe.resume.args], env,
                           str(out / recipe.cwd), recipe.timeout * ctx.timeout_scale, work)
    shutil.rmtree(work, ignore_errors=True)
    if original.returncode != 0:
        return {"status": "original fails", "error": original.last_error_line}
    if migrated.returncode != 0:
        return {"status": "crash", "error": migrated.last_error_line}
    losses = compare_losses(verify.parse_losses(migrated.stdout, regex), verify.parse_losses(original.stdout, regex),
                            amp=recipe.amp, random=bool(recipe.random),
                            different_start="weight init" in recipe.random)
    return {"status": "ok" if losses["ok"] else "differs", "losses": losses}


def run_program(recipe: Recipe, ctx: Context) -> dict:
    work = ctx.work / recipe.name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    orig = work / "orig"
    start = time.perf_counter()
    recipe = dataclasses.replace(recipe, env=program_env(recipe, work))
    record = {"name": recipe.name, "repo": recipe.repo, "entry": recipe.entry, "style": recipe.style,
              "args": list(recipe.args), "random": recipe.random, "amp": recipe.amp, "notes": recipe.notes}
    try:
        prepare_copy(recipe, repo_folder(ctx.cache, recipe.repo), orig)
        if recipe.data_script:
            made = subprocess.run([ctx.pythons["current"], "-c", recipe.data_script], cwd=orig, capture_output=True,
                                  text=True, env=ctx.env(recipe, "current", orig), timeout=300)
            if made.returncode != 0:
                raise RecipeError(f"data_script: {last_error_line(made.stderr)}")
        if recipe.entry.endswith(".ipynb"):
            notebook_script(orig / recipe.entry)
        cpu = original_copy(recipe, orig)
    except (RecipeError, OSError) as error:
        record["error"] = f"recipe: {error}"
        return record
    # Every run of the original starts from a fresh copy of ``cpu``: what one run writes (a checkpoint the
    # program resumes from by itself, logs) never reaches another run or the migration's input (``orig``).
    own = fresh_copy(cpu, work / "orig-run")
    record["original"] = run_original(recipe, ctx, own)
    record["variants"] = [run_variant(recipe, ctx, work, orig, record["original"], target, form, cpu, own)
                          for target, form in variants(recipe, ctx.targets)]
    record["wall_s"] = round(time.perf_counter() - start, 1)
    if not ctx.keep:
        shutil.rmtree(work, ignore_errors=True)
    return record


# Command line --------------------------------------------------------------------------------------------------


def find_pythons(args: argparse.Namespace) -> dict[str, str]:
    pythons = {"current": args.python_current, "sagemaker": args.python_sagemaker}
    for name in pythons:
        if pythons[name] is None:
            proc = subprocess.run(["bash", str(ROOT / "tools" / "xla_envs.sh"), name], capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"error: tools/xla_envs.sh {name} failed: {last_error_line(proc.stderr)}")
            pythons[name] = proc.stdout.split()[-1]
    return pythons


def setup_extras(extras: Path, pythons: dict[str, str]) -> None:
    """The programs' own dependencies, beside (never inside) the shared torch environments."""
    steps = [(pythons["current"], extras / "common", ["-r", str(RECIPES / "requirements.txt")], []),
             (pythons["current"], extras / "common", ["-r", str(RECIPES / "requirements-nodeps.txt")], ["--no-deps"])]
    steps += [(pythons[name], extras / f"tv-{name}", [pin], ["--no-deps"]) for name, pin in TORCHVISION.items()]
    for python, dest, what, flags in steps:
        print(f"installing {' '.join(what)} into {dest}", file=sys.stderr)
        subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--upgrade",
                        "--target", str(dest), *flags, *what], check=True)
    # pip --target brings setuptools along; the environments' own must win.
    for stale in (extras / "common").glob("setuptools*"):
        shutil.rmtree(stale, ignore_errors=True)
    (extras / ".complete").write_text("")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="the repositories, <owner>+<name> each")
    parser.add_argument("--extras", type=Path, default=DEFAULT_EXTRAS, help="where --setup installs dependencies")
    parser.add_argument("--setup", action="store_true", help="install the programs' dependencies, then exit")
    parser.add_argument("--list", action="store_true", help="list the recipes, then exit")
    parser.add_argument("--only", help="comma-separated recipe names")
    parser.add_argument("--targets", default="2.9,sagemaker", help="comma-separated: 2.9, sagemaker; none: originals only")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="programs at a time (default 1)")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--compare", type=Path, metavar="OLD.json", help="print what got better and worse since")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="keep each program's copies, outputs and metrics")
    parser.add_argument("--timeout-scale", type=float, default=1.0, help="multiply each recipe's timeout")
    parser.add_argument("--python-current", help="torch 2.9.0 + torch_xla 2.9.0 (default: tools/xla_envs.sh)")
    parser.add_argument("--python-sagemaker", help="torch 2.6.0 + torch_xla 2.6.1 (default: tools/xla_envs.sh)")
    parser.add_argument("--tool", default=f"{sys.executable} -m xla_migrate",
                        help="the xla-migrate command line to measure (default: this checkout's)")
    args = parser.parse_args(argv)
    # "none": only the originals (while writing a recipe)
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip() and t.strip() != "none"]
    bad = [t for t in args.targets if t not in ENV_OF_TARGET]
    if bad:
        parser.error(f"--targets: unknown target {bad[0]} (known: {', '.join(ENV_OF_TARGET)})")
    args.tool = args.tool.split()
    return args


def select(recipes: list[Recipe], only: str | None) -> list[Recipe]:
    if not only:
        return recipes
    wanted = [n.strip() for n in only.split(",") if n.strip()]
    known = {r.name for r in recipes}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise SystemExit(f"error: --only: no recipe named {unknown[0]} (see --list)")
    return [r for r in recipes if r.name in wanted]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        recipes = select(load_recipes(), args.only)
    except SystemExit as error:
        print(error, file=sys.stderr)
        return 2
    if args.list:
        for r in recipes:
            print(f"{r.name:28} {r.repo:45} {r.entry:40} {r.style}")
        return 0
    try:
        pythons = find_pythons(args)
        if args.setup:
            setup_extras(args.extras, pythons)
            return 0
    except SystemExit as error:
        print(error, file=sys.stderr)
        return 2
    if not (args.extras / ".complete").exists():
        print(f"error: the programs' dependencies are not in {args.extras}: run benchmarks/real_programs.py --setup",
              file=sys.stderr)
        return 2
    missing = missing_repositories(recipes, args.cache)
    if missing:
        print(f"error: repository {missing[0]} is not in the cache {args.cache} (expected "
              f"{repo_folder(args.cache, missing[0])}){f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}",
              file=sys.stderr)
        return 2
    ctx = Context(args, pythons)
    started, start = time.strftime("%Y-%m-%d %H:%M:%S"), time.perf_counter()
    results: dict[str, dict] = {}
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)

    def document(done: list[dict]) -> dict:
        return {"schema": SCHEMA, "version": SCHEMA_VERSION, "started": started,
                "wall_s": round(time.perf_counter() - start, 1), "jobs": args.jobs,
                "commit": commit.stdout.strip() or None, "tool": args.tool, "pythons": pythons,
                "targets": args.targets, "summary": summarize(done), "programs": done,
                "complete": len(done) == len(recipes)}

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        # the longest first (by their timeouts), so that two jobs end together rather than one waiting on the last
        futures = {pool.submit(run_program, r, ctx): r for r in sorted(recipes, key=lambda r: -r.timeout)}
        for future in concurrent.futures.as_completed(futures):
            recipe = futures[future]
            try:
                results[recipe.name] = future.result()
            except Exception as error:  # a bug in the harness: the other programs still run
                results[recipe.name] = {"name": recipe.name, "repo": recipe.repo, "error": f"harness: {error!r}"}
            done = results[recipe.name]
            print(f"[{len(results)}/{len(recipes)}] {recipe.name} ({done.get('wall_s', '-')} s): "
                  + ", ".join(f"{v['label']} {v.get('status', 'not run')}" for v in done.get("variants", [])),
                  file=sys.stderr, flush=True)
            if args.json:  # after every program: a run stopped early keeps the figures of what it ran
                partial = [results[r.name] for r in recipes if r.name in results]
                args.json.write_text(json.dumps(document(partial), indent=1, default=str) + "\n")
    ordered = [results[r.name] for r in recipes]
    final = document(ordered)
    for line in render_table(ordered) + [""] + render_notes(ordered) + [""] + render_summary(final["summary"]):
        print(line)
    print(f"wall {final['wall_s']} s with -j {args.jobs}")
    if args.compare:
        print()
        for line in compare(json.loads(args.compare.read_text()), final):
            print(line)
    if not args.keep:
        shutil.rmtree(ctx.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
