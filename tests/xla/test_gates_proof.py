"""Proof tier, gates, devices, checkpoints and launch (issue 29; issue 36 point 3): each runnable fixture of a
shape, migrated for an env's target, runs on real torch_xla (PJRT CPU) with the original's losses, resumes
from its checkpoint as the original does, and where the original takes a CPU path (an option, a flag) the
migrated script takes it too.

Per env (tools/xla_envs.sh): `current` (torch_xla 2.9) runs the `2.9` target's output, `sagemaker` (torch_xla
2.6.1) the `sagemaker` target's. The original runs with plain torch on the CPU in the same interpreter.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest
import xla_proof as xp

pytestmark = pytest.mark.xla


@dataclass(frozen=True)
class Shape:
    name: str
    what: str  # what must hold besides the losses (the test id says which shape)
    distributed: bool = False
    # Arguments under which the original and the migrated script both take the CPU path.
    cpu_args: tuple[str, ...] = ()
    # What the migrated output must (not) contain, per target: the rewrite the shape is about.
    present: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()


SHAPES = [
    Shape("gates_by_branch", "gates decided by branch content; DataParallel, compile, fused, streams off",
          present=("fused=False", "Tensor = torch.Tensor"),
          absent=("DataParallel", "torch.compile", "torch.cuda", ".module")),
    Shape("device_option", "--device option keeps choosing; map_location through a helper and a variable",
          cpu_args=("--device", "cpu"), present=('default="xla', 'map_location="cpu"'),
          absent=("map_location=device", "map_location=loc")),
    Shape("no_cuda_flag", "--no-cuda keeps the CPU path (a step barrier, no device loader); default-argument device",
          cpu_args=("--no-cuda",), present=('torch.device("xla:0")', "device() if use_cuda else"),
          absent=("MpDeviceLoader",)),
    Shape("launched_device", "no XLA device before the launcher: module level, default, seed in the launcher",
          distributed=True, present=('device = torch.device("xla:0")',), absent=("manual_seed_all",)),
    Shape("timing_events", "synchronize only around a timing; CUDA events become host clocks",
          present=("time.perf_counter()",), absent=("torch.cuda",)),
    Shape("whole_objects", "a checkpoint of whole objects keeps torch.save and resumes",
          present=("torch.save(state, CKPT)",)),
    Shape("int_ordinal", "a CUDA ordinal used as the device becomes the XLA device",
          absent=("device_count", '"cpu"')),
]
BY_NAME = {s.name: s for s in SHAPES}


def _params():
    return [pytest.param(env, shape.name, id=f"{env}-{shape.name}") for env in xp.TARGETS for shape in SHAPES]


@lru_cache(maxsize=None)
def _migrated(name: str, target: str) -> str:
    from xla_migrate import migrate

    path = xp.RUNNABLE / f"{name}.py"
    result = migrate(path.read_text(), target=target, path=str(path))
    assert result.error is None, result.error
    return result.code


@lru_cache(maxsize=None)
def _runs(env: str, name: str) -> tuple[str, xp.Run, xp.Run]:
    python = xp.require_env(env)
    shape = BY_NAME[name]
    code = _migrated(name, xp.TARGETS[env])
    original = xp.run_script(python, (xp.RUNNABLE / f"{name}.py").read_text(), f"{env} original {name}", xla=False,
                             distributed=shape.distributed)
    migrated = xp.run_script(python, code, f"{env} migrated {name}", xla=True, distributed=shape.distributed)
    xp.RECORD.append((env, f"{name} [gates]", migrated))
    if original.losses and len(original.losses) == len(migrated.losses):
        xp.DELTAS[(env, f"{name} [gates]")] = max(abs(a - b) for a, b in zip(original.losses, migrated.losses))
    return code, original, migrated


def _run_with_args(python: Path, source: str, args: tuple[str, ...], xla: bool) -> subprocess.CompletedProcess:
    """A plain run with arguments (the CPU-path checks need no metrics): PJRT CPU for the migrated script."""
    workdir = Path(tempfile.mkdtemp(prefix="xla-proof-gates-args-"))
    xp.WORKDIRS.append(workdir)
    (workdir / "script.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PJRT_", "TPU_", "CPU_NUM_DEVICES"))}
    env.pop("PYTHONPATH", None)
    env.update(PYTHONHASHSEED="0", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    if xla:
        env["PJRT_DEVICE"] = "CPU"
    return subprocess.run([str(python), "script.py", *args], cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=240)


@pytest.mark.parametrize("env,name", _params())
def test_runs_resumes_and_matches_the_original(env, name):
    shape = BY_NAME[name]
    code, original, migrated = _runs(env, name)
    body = code[code.index('"""', 3) + 3:]  # after the module docstring, which names the shapes
    for text in shape.present:
        assert text in body, f"{text!r} not in the migrated script:\n{code}"
    for text in shape.absent:
        assert text not in body, f"{text!r} still in the migrated script:\n{code}"
    assert original.returncode == 0, original.describe()
    assert migrated.returncode == 0, migrated.describe() + "\n--- migrated script ---\n" + code
    assert "Runtime is already initialized" not in migrated.stderr
    assert original.losses and len(migrated.losses) == len(original.losses), (original.stdout, migrated.stdout)
    worst = max(abs(a - b) for a, b in zip(original.losses, migrated.losses))
    assert worst <= xp.FP32_TOLERANCE, f"losses differ by up to {worst:.3g} (the resumed steps included)"


@pytest.mark.parametrize("env,name", [pytest.param(env, s.name, id=f"{env}-{s.name}") for env in xp.TARGETS
                                      for s in SHAPES if s.cpu_args])
def test_the_cpu_path_stays_a_choice(env, name):
    """Run with the option that picks the CPU: the original and the migrated script both train on the CPU, with
    the same losses, and the migrated one never touches the XLA device for it."""
    python = xp.require_env(env)
    shape = BY_NAME[name]
    source = (xp.RUNNABLE / f"{name}.py").read_text()
    original = _run_with_args(python, source, shape.cpu_args, xla=False)
    migrated = _run_with_args(python, _migrated(name, xp.TARGETS[env]), shape.cpu_args, xla=True)
    assert original.returncode == 0, original.stderr[-2000:]
    assert migrated.returncode == 0, migrated.stderr[-2000:]
    assert "device cpu" in original.stdout and "device cpu" in migrated.stdout, migrated.stdout
    first, second = xp.parse_losses(original.stdout), xp.parse_losses(migrated.stdout)
    assert first and len(first) == len(second)
    assert max(abs(a - b) for a, b in zip(first, second)) <= xp.FP32_TOLERANCE


@pytest.mark.parametrize("env", list(xp.TARGETS))
def test_the_default_device_is_xla(env):
    """Without the CPU option, the option's default ("xla") runs on the XLA device (the original's default,
    CUDA, is not there: it fell back to the CPU)."""
    _, original, migrated = _runs(env, "device_option")
    assert "device cpu" in original.stdout
    assert "device xla" in migrated.stdout, migrated.stdout
