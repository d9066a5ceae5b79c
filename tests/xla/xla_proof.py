"""The proof tier's harness: migrate a runnable fixture, run the original with plain torch on the CPU and the
migrated script with torch_xla on PJRT CPU, and read what happened (loss curve, stderr, torch_xla metrics).

The measurements are the product's (xla_migrate.verify.core: its child-side loader records torch_xla's counters at
every step marker and at exit); this file adds the tier's own thresholds and the test-only replica shim.
Used by tests/xla/test_xla_proof.py and benchmarks/xla_step.py. See docs/proof.md.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from xla_migrate.verify import core as verify

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE = ROOT / "fixtures" / "runnable"
HANDWRITTEN = RUNNABLE / "handwritten"
WHOLE_SCRIPTS = ROOT / "fixtures" / "scripts"
ENVS_SCRIPT = ROOT / "tools" / "xla_envs.sh"
SHIM = Path(__file__).with_name("sitecustomize.py")
REPLICA_PROBE = ROOT / "src" / "xla_migrate" / "verify" / "replica_probe.py"

# Environment name (tools/xla_envs.sh) -> the xla-migrate target whose output runs there.
TARGETS = {"current": "2.9", "sagemaker": "sagemaker"}

FP32_TOLERANCE = verify.FP32_TOLERANCE
WARMUP_STEPS = verify.WARMUP_MARKERS  # step markers allowed to compile (first step, optimizer state appearing, ...)
LATE_COMPILES = 3  # compilations allowed after warm-up (evaluation loop, a last batch, the save)
SPARE_RUNS = 3  # graph executions allowed beyond one per step marker (after the loop: stacking the losses...)
SPARE_READS = 3  # host reads allowed outside step closures (after the loop: a final `eval loss`...)


@dataclass(frozen=True)
class Script:
    name: str
    amp: bool = False  # mixed precision: the curve is checked for finite and decreasing, not equality
    hard_cuda: bool = False  # no CPU fallback: the original is replaced by a CPU twin (.cuda() -> .cpu())
    distributed: bool = False  # torchrun style: needs RANK/WORLD_SIZE/MASTER_* (world size 1 here)
    item_every_step: bool = False  # logs loss.item() every step (the lazy-tensor rewrite is issue 5)
    checkpoint: str | None = None  # the file the script saves (relative to its working folder)
    checkpoint_key: str | None = None  # the state dict's key inside the checkpoint, when it is nested
    # Shapes of the step model (issue 12): optimizer steps when the `step N loss X` lines also carry evaluation
    # results (None: one per line); evaluation batches (one graph run each); host reads the migrated script
    # makes outside step closures by design (sums read back after a loop, logging after the barrier).
    optimizer_steps: int | None = None
    eval_batches: int = 0
    host_reads: int = 0

    @property
    def path(self) -> Path:
        return RUNNABLE / f"{self.name}.py"


SCRIPTS = [
    Script("sgd_item_save", item_every_step=True, checkpoint="model.pt"),
    Script("amp_clip", amp=True),
    Script("amp_modern_adamw", amp=True),
    Script("trainer_class", checkpoint="checkpoint.pt", checkpoint_key="model"),
    Script("hard_cuda", hard_cuda=True),
    Script("ddp_torchrun", distributed=True, checkpoint="model.pt"),
    Script("aliased_imports", checkpoint="net.pt"),
    Script("mnist_conv", checkpoint="mnist_cnn.pt"),
    Script("stepper_object"),
    Script("per_batch_method", optimizer_steps=30, host_reads=33),
    Script("accumulation_clip", optimizer_steps=22),
    Script("eval_counts", optimizer_steps=20, eval_batches=8, host_reads=4),
    Script("hidden_state", optimizer_steps=100, eval_batches=26, host_reads=2),
    Script("finite_check"),
    Script("inference_mode_eval", optimizer_steps=20, eval_batches=5, host_reads=5),
    Script("fused_adamw"),
    Script("host_labels", optimizer_steps=16, eval_batches=4, host_reads=2),
    Script("cpu_before_device", optimizer_steps=24),
    Script("optimizer_first"),
    Script("optimizer_groups_branches"),
]
SCRIPT_BY_NAME = {s.name: s for s in SCRIPTS}

# Hand-written XLA versions (2.9 spellings, which 2.6 also has), for the benchmark and as a reference:
# fixture name -> file under fixtures/runnable/handwritten/.
HANDWRITTEN_FOR = {"sgd_item_save": "sgd_xla.py", "ddp_torchrun": "ddp_xla.py"}


# Known gaps: (script, env, check) -> why the migrated script cannot pass that check yet ("*" matches any env or
# check). Those tests are strict xfails whose ids end in "-GAP" (docs/proof.md lists them): when the rules close
# a gap the test XPASSes, which fails the run until the entry is removed here and in docs/proof.md.
# Checks: "exit", "curve", "checkpoint", "deprecation", "compiles", "per_step".
GAPS: dict[tuple[str, str, str], str] = {}


def gap(script: Script, env: str, check: str) -> str | None:
    for key in ((script.name, env, check), (script.name, "*", check), (script.name, env, "*"),
                (script.name, "*", "*")):
        if key in GAPS:
            return GAPS[key]
    return None


def skip_reason(script: Script, env: str) -> str | None:
    """Why a script is not run in an environment (shown in the test's skip reason and the tier summary). None
    today: the sagemaker target's AMP cases, once skipped (torch_xla 2.6's autocast cannot be entered on a CPU
    device), run since the output enters it only on XLA hardware other than the CPU (XLA201)."""
    del script, env
    return None


def runnable_path(name: str) -> Path:
    """A runnable fixture: ``fixtures/runnable/<name>.py``, or a whole-script golden input that also runs
    (``fixtures/scripts/<name>.in.py``, one file for both: a golden's input needs a CPU fallback to run)."""
    path = RUNNABLE / f"{name}.py"
    return path if path.exists() else WHOLE_SCRIPTS / f"{name}.in.py"


# Environments ---------------------------------------------------------------------------------------------


def env_pins() -> dict[str, str]:
    text = ENVS_SCRIPT.read_text()
    return dict(re.findall(r'\[(\w+)\]="([^"]+)"', text))


def env_python(name: str) -> tuple[Path | None, str]:
    """The interpreter tools/xla_envs.sh made for `name`, found the way the script finds it (never installs)."""
    pins = env_pins()[name]
    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    root = Path(os.environ.get("XLA_MIGRATE_ENV_DIR") or Path(cache_home) / "xla-migrate" / "envs")
    key = pins.translate(str.maketrans(" =", "-_"))
    folder = root / key
    python = folder / "bin" / "python"
    if not (folder / ".complete").is_file() or not python.exists():
        return None, (f"the {name} environment ({pins}) is not in {folder}: run `tools/xla_envs.sh all` first "
                      f"(about 2 minutes per environment, then cached)")
    return python, ""


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_env(name: str) -> Path:
    """The interpreter of environment ``name``; without it the calling test fails under CI=true (the proof
    tier must run there) and is skipped locally, with how to make it."""
    import pytest

    python, why = env_python(name)
    if python is None:
        if in_ci():
            pytest.fail(f"CI=true and {why}", pytrace=False)
        pytest.skip(why)
    return python


# Running ----------------------------------------------------------------------------------------------------


@dataclass
class Metrics:
    compiles: int = 0
    runs: int = 0
    reads: int = 0
    step: int = -1
    fallbacks: dict = field(default_factory=dict)

    @classmethod
    def of(cls, snapshot: dict) -> "Metrics":
        """From one of verify's snapshots (a step marker, or the exit)."""
        return cls(snapshot["compiles"], snapshot["executions"], snapshot["reads"], snapshot.get("index", -1),
                   dict(snapshot.get("fallbacks", {})))


@dataclass
class Run:
    label: str
    returncode: int
    stdout: str
    stderr: str
    wall: float
    workdir: Path
    losses: list[float] = field(default_factory=list)
    blocks: list[Metrics] = field(default_factory=list)  # one per step marker
    final: Metrics | None = None  # at exit (or at the last step marker, for a process that skips atexit)
    closure_reads: int = 0
    observation: verify.Observation | None = None

    def describe(self) -> str:
        tail = "\n".join(self.stderr.strip().splitlines()[-25:])
        return f"{self.label}: exit {self.returncode}\n--- stderr (tail) ---\n{tail}"


LOSS_LINE = r"^step \d+ loss (\S+)$"  # what every runnable fixture prints, once per step


def parse_losses(stdout: str) -> list[float]:
    return verify.parse_losses(stdout, LOSS_LINE)


WORKDIRS: list[Path] = []  # removed at the end of the session unless XLA_PROOF_KEEP=1


def cleanup() -> None:
    for pool in _pool:  # runs started ahead and never asked for (a -k selection, -x) are cancelled or awaited
        pool.shutdown(wait=True, cancel_futures=True)
    if os.environ.get("XLA_PROOF_KEEP") == "1":
        return
    while WORKDIRS:
        shutil.rmtree(WORKDIRS.pop(), ignore_errors=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def gloo_run(python: Path, source: str, label: str, world: int = 2) -> str:
    """A torchrun-style CUDA original on plain torch: ``world`` processes on the gloo backend (its ``"nccl"`` and
    ``.cuda()`` taken off, nothing else); their stdout, joined (each process's lines together)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"xla-proof-{label}-gloo-"))
    WORKDIRS.append(workdir)
    (workdir / "original.py").write_text(source.replace('"nccl"', '"gloo"').replace(".cuda()", ""))
    port = str(free_port())
    processes = []
    for rank in range(world):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PJRT_", "TPU_"))}
        env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, OMP_NUM_THREADS="1")
        processes.append(subprocess.Popen([str(python), "original.py"], cwd=workdir, env=env, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outputs = []
    for process in processes:
        stdout, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr[-3000:]
        outputs.append(stdout)
    return "".join(outputs)


@dataclass
class SpmdRuns:
    python: Path
    result: object  # the migration's MigrationResult
    original: Run
    migrated: Run
    sharding: list[list[str]]  # XLA_PROOF_SHARDING_FILE's rows (parameter, sharding spec, ...), when asked for


def spmd_runs(name: str, devices: int, *, env: str = "current", original_source=None,
              sharding: bool = False) -> SpmdRuns:
    """The runnable fixture ``name`` migrated with ``--target 2.9 --data-parallel spmd`` and run as one process on
    ``devices`` PJRT CPU devices (no torchrun variables: an SPMD program finds its devices itself), beside its
    original on plain torch under torchrun's variables for one process; ``original_source(source)`` gives the
    original another form to run in (one process, no torchrun variables: the Trainer script without its FSDP
    arguments)."""
    from xla_migrate import migrate

    python = require_env(env)
    path = runnable_path(name)
    source = path.read_text()
    result = migrate(source, target="2.9", data_parallel="spmd", path=str(path))
    assert result.error is None, result.error
    if original_source is None:
        original = run_script(python, source, f"{env} original {name}", xla=False, distributed=True)
    else:
        original = run_script(python, original_source(source), f"{env} original {name}", xla=False, timeout=300)
    extra_env = {"CPU_NUM_DEVICES": str(devices)}
    if sharding:
        folder = Path(tempfile.mkdtemp(prefix="xla-proof-sharding-"))
        WORKDIRS.append(folder)
        extra_env["XLA_PROOF_SHARDING_FILE"] = str(folder / "sharding.tsv")
    migrated = run_script(python, result.code, f"{env} spmd {name}", xla=True, distributed=False,
                          extra_env=extra_env, timeout=400)
    RECORD.append(("current", f"{name} [2.9 spmd, {devices} devices{', hf env' if env == 'hf' else ''}]", migrated))
    table = Path(extra_env.get("XLA_PROOF_SHARDING_FILE", "/nonexistent"))
    rows = [line.split("\t") for line in table.read_text().splitlines()] if table.exists() else []
    return SpmdRuns(python, result, original, migrated, rows)


def run_script(python: Path, source: str, label: str, *, xla: bool, distributed: bool = False,
               extra_env: dict[str, str] | None = None, timeout: float = 180,
               companions: dict[str, str] | None = None) -> Run:
    """Run `source` as __main__ of a fresh script file in its own temporary working folder; `companions`
    (file name -> source) are written beside it: the other modules of a project the script imports."""
    workdir = Path(tempfile.mkdtemp(prefix=f"xla-proof-{label.replace(' ', '-').replace('/', '-')}-"))
    WORKDIRS.append(workdir)
    script = workdir / "script.py"
    script.write_text(source)
    for name, text in (companions or {}).items():
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PJRT_", "TPU_", "CPU_NUM_DEVICES"))}
    env.pop("PYTHONPATH", None)
    env.update(PYTHONHASHSEED="0", OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    if distributed:
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(free_port()))
    env.update(extra_env or {})
    if not xla:
        process = verify.run_plain(python, script, cwd=str(workdir), env=env, timeout=timeout)
        return _run_of(label, process, workdir)
    # Its own home: the 2.9 target's persistent compilation cache (XLA315, ~/.cache/xla_compile) is written
    # there, not into the user's, and a run never reads another run's cache.
    (workdir / "home").mkdir()
    env["HOME"] = str(workdir / "home")
    shim = workdir / "shim"  # the test-only replica shim, after verify's loader (which runs it)
    shim.mkdir()
    shutil.copy(SHIM, shim / "sitecustomize.py")
    shutil.copy(REPLICA_PROBE, shim / "replica_probe.py")  # the shim installs it when XLA_REPLICA_PROBE_FILE is set
    observation = verify.observe(python, script, cwd=str(workdir), env=env, debug=False, timeout=timeout,
                                 extra_pythonpath=[str(shim)], workdir=workdir / "verify")
    run = _run_of(label, observation.process, workdir)
    run.observation = observation
    run.blocks = [Metrics.of(marker) for marker in observation.markers]
    last = observation.last
    run.final = Metrics.of(last) if last else None
    run.closure_reads = last["closure_reads"] if last else 0
    return run


def _run_of(label: str, process: verify.Process, workdir: Path) -> Run:
    stderr = process.stderr + ("\n[harness] timed out" if process.timed_out else "")
    return Run(label, -9 if process.timed_out else process.returncode, process.stdout, stderr, process.wall,
               workdir, parse_losses(process.stdout))


def cpu_twin(source: str) -> str:
    """The CPU twin of a script with no CUDA fallback: what it computes, on the CPU."""
    return source.replace(".cuda()", ".cpu()")


@dataclass
class Case:
    script: Script
    env: str
    target: str
    migrated_source: str
    original: Run
    migrated: Run
    findings: list = field(default_factory=list)


@lru_cache(maxsize=None)
def run_case(script_name: str, env: str) -> Case:
    """Migrate one fixture for the env's target and run original (or twin) and migrated; cached per session.
    A case started by :func:`run_ahead` is waited for."""
    _STARTED.add((script_name, env))
    ahead = _AHEAD.pop((script_name, env), None)
    return ahead.result() if ahead is not None else _runs(*_migration(script_name, env))


def _migration(script_name: str, env: str) -> tuple:
    from xla_migrate import migrate

    script = SCRIPT_BY_NAME[script_name]
    python, why = env_python(env)
    if python is None:
        raise RuntimeError(why)
    target = TARGETS[env]
    source = script.path.read_text()
    result = migrate(source, target=target, path=str(script.path))
    if result.error is not None:
        raise RuntimeError(f"migrating {script.path.name} for {target} failed: {result.error}")
    return script, env, python, target, source, result


def _runs(script: Script, env: str, python: Path, target: str, source: str, result) -> Case:
    original_source = cpu_twin(source) if script.hard_cuda else source
    original = run_script(python, original_source, f"{env} original {script.name}", xla=False,
                          distributed=script.distributed)
    migrated = run_script(python, result.code, f"{env} migrated {script.name}", xla=True,
                          distributed=script.distributed)
    RECORD.append((env, script.name, migrated))
    if original.losses and len(original.losses) == len(migrated.losses):
        DELTAS[(env, script.name)] = max(abs(a - b) for a, b in zip(original.losses, migrated.losses))
    return Case(script, env, target, result.code, original, migrated, list(result.findings))


# Each case's runs are processes of one thread (OMP_NUM_THREADS=1), so the tier runs them a few at a time: its
# wall time divides by the cores (CI's time budget). XLA_PROOF_WORKERS=1 runs them one by one, as they are needed;
# so does a pytest-xdist worker (tools/test.sh runs one per core already), unless XLA_PROOF_WORKERS says otherwise.
_DEFAULT_WORKERS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else (os.cpu_count() or 1)
PROOF_WORKERS = max(1, min(int(os.environ.get("XLA_PROOF_WORKERS") or 0) or _DEFAULT_WORKERS, 4))
_AHEAD: dict[tuple[str, str], Future] = {}
_STARTED: set[tuple[str, str]] = set()
SELECTED: list[tuple[str, str]] = []  # the cases the selected tests need, in their order (tests/xla/conftest.py)
_pool: list[ThreadPoolExecutor] = []


def run_ahead(cases: list[tuple[str, str]]) -> None:
    """Start the runs of these (script name, env) cases now, PROOF_WORKERS at a time, in the given order; the
    migrations stay in the calling thread (the pipeline is not shared across threads)."""
    if PROOF_WORKERS < 2:
        return
    if not _pool:
        _pool.append(ThreadPoolExecutor(PROOF_WORKERS, thread_name_prefix="xla-proof"))
    for key in cases:
        if key in _STARTED:
            continue
        _STARTED.add(key)
        try:
            _AHEAD[key] = _pool[0].submit(_runs, *_migration(*key))
        except Exception as error:  # a migration that fails fails its own case's tests, not the one asking now
            _AHEAD[key] = Future()
            _AHEAD[key].set_exception(error)


RECORD: list[tuple[str, str, Run]] = []  # every migrated run, for the tier summary
DELTAS: dict[tuple[str, str], float] = {}  # largest |original - migrated| loss per case, for the summary
SKIPPED: set[tuple[str, str, str]] = set()  # (env, script, reason) not run, for the tier summary


def load_states(python: Path, paths: list[Path], key: str | None) -> list[str]:
    """Load checkpoints with plain torch (no torch_xla import): they must hold CPU tensors. One subprocess."""
    code = (
        "import sys, torch\n"
        "key = sys.argv[1]\n"
        "for path in sys.argv[2:]:\n"
        "    state = torch.load(path, map_location='cpu', weights_only=False)\n"
        "    state = state[key] if key else state\n"
        "    for name, tensor in state.items():\n"
        "        print(name, tensor.device.type, ' '.join(repr(float(v)) for v in tensor.flatten().tolist()))\n"
        "    print('=====')\n"
        "assert 'torch_xla' not in sys.modules, 'loading the checkpoints imported torch_xla'\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PJRT_"))}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(python), "-c", code, key or ""] + [str(p) for p in paths], capture_output=True,
                          text=True, timeout=120, env=env)
    if proc.returncode != 0:
        raise AssertionError(f"cannot load {', '.join(p.name for p in paths)} with plain torch:\n"
                             f"{proc.stderr[-2000:]}")
    return proc.stdout.split("=====\n")[:-1]


def max_state_difference(first: str, second: str) -> float:
    def parse(text):
        rows = {}
        for line in text.splitlines():
            name, device, *values = line.split(" ")
            rows[name] = (device, [float(v) for v in values])
        return rows

    a, b = parse(first), parse(second)
    assert a.keys() == b.keys(), f"different state dict keys: {sorted(a)} vs {sorted(b)}"
    worst = 0.0
    for name in a:
        assert a[name][1].__len__() == b[name][1].__len__(), f"{name}: different sizes"
        for x, y in zip(a[name][1], b[name][1]):
            worst = max(worst, abs(x - y))
    return worst


def finite_and_decreasing(losses: list[float]) -> bool:
    return len(losses) >= 2 * 5 and verify.finite_and_decreasing(losses)  # the fixtures run 24-40 steps


# Checks that read the metrics --------------------------------------------------------------------------------


def steady_window(run: Run) -> tuple[Metrics, Metrics, int]:
    """The blocks after warm-up to the last block, and how many step markers lie between them."""
    blocks = run.blocks
    first = blocks[min(WARMUP_STEPS, len(blocks) - 1)]
    last = blocks[-1]
    return first, last, len(blocks) - 1 - min(WARMUP_STEPS, len(blocks) - 1)


DEPRECATION = re.compile(r"(DeprecationWarning|FutureWarning|is deprecated)")


def deprecation_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if DEPRECATION.search(line)]
