"""The torchtpu target on the CPU (issue 32 point 3): its device-agnostic output trains with plain CPU torch.

Nothing here runs on a TPU (there is none): each runnable fixture's torchtpu output runs in the torch 2.9
environment with CUDA hidden and ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` (with torch_tpu installed, a CPU backward
hung on libtpu's metadata retries without it), and must print the original's losses (fp32: 1e-6). The torch
names the target writes (torch.accelerator, torch.autocast...) must exist in that torch; the torch.tpu ones are
checked against the torch_tpu wheel by tests/test_torchtpu.py. The same fixtures' sagemaker and 2.9 outputs,
upgraded with --target torchtpu (XLA703/XLA704), must print the original's losses too.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import xla_proof as xp

from xla_migrate import migrate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_torchtpu import dotted_names, torchtpu_outputs  # noqa: E402

# fp32 runnable fixtures whose original falls back to the CPU (hard_cuda has no fallback: its CPU twin is the
# reference, and the output's torch.accelerator device falls back where the original could not).
SCRIPTS = ["sgd_item_save", "trainer_class", "stepper_object", "aliased_imports", "mnist_conv",
           "accumulation_clip", "eval_counts", "finite_check", "cpu_before_device", "hard_cuda", "device_option"]
TOLERANCE = 1e-6


def cpu_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PJRT_", "TPU_", "CPU_NUM_DEVICES"))}
    env.pop("PYTHONPATH", None)
    env.update(PYTHONHASHSEED="0", OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1", CUDA_VISIBLE_DEVICES="",
               TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    return env


def run(python: Path, source: str, workdir: Path) -> subprocess.CompletedProcess:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "script.py").write_text(source)
    return subprocess.run([str(python), "script.py"], cwd=workdir, env=cpu_env(), capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("name", SCRIPTS)
def test_torchtpu_output_trains_on_the_cpu_with_the_original_losses(name, tmp_path):
    python = xp.require_env("current")
    source = (xp.RUNNABLE / f"{name}.py").read_text()
    result = migrate(source, target="torchtpu", path=f"{name}.py")
    assert result.error is None and result.changed, result.error
    assert ".accelerator.current_accelerator(" in result.code  # the accelerator, with the CPU fallback
    original = run(python, xp.cpu_twin(source) if name == "hard_cuda" else source, tmp_path / "original")
    migrated = run(python, result.code, tmp_path / "migrated")
    assert original.returncode == 0, original.stderr[-3000:]
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    before, after = xp.parse_losses(original.stdout), xp.parse_losses(migrated.stdout)
    assert before and len(before) == len(after), (before, after)
    worst = max(abs(a - b) for a, b in zip(before, after))
    assert worst <= TOLERANCE, f"largest loss difference {worst:.3g}"


# Upgrade mode (issue 32 point 2): this tool's sagemaker and 2.9 outputs of the same fp32 fixtures, migrated again
# with --target torchtpu, train on the CPU with the original's losses too.
@pytest.mark.parametrize("xla_target", ["sagemaker", "2.9"])
@pytest.mark.parametrize("name", SCRIPTS)
def test_upgraded_xla_output_trains_on_the_cpu_with_the_original_losses(name, xla_target, tmp_path):
    python = xp.require_env("current")
    source = (xp.RUNNABLE / f"{name}.py").read_text()
    on_xla = migrate(source, target=xla_target, path=f"{name}.py")
    result = migrate(on_xla.code, target="torchtpu", path=f"{name}.py")
    assert result.error is None and result.changed, result.error
    assert "torch_xla" not in result.code.split('"""')[-1]  # the code after the docstring holds no torch_xla
    original = run(python, xp.cpu_twin(source) if name == "hard_cuda" else source, tmp_path / "original")
    migrated = run(python, result.code, tmp_path / "migrated")
    assert original.returncode == 0, original.stderr[-3000:]
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    before, after = xp.parse_losses(original.stdout), xp.parse_losses(migrated.stdout)
    assert before and len(before) == len(after), (before, after)
    worst = max(abs(a - b) for a, b in zip(before, after))
    print(f"{name} {xla_target}->torchtpu: {len(after)} losses, largest difference {worst:.3g}")
    assert worst <= TOLERANCE, f"largest loss difference {worst:.3g}"


def emitted_torch_names() -> set[str]:
    """The torch.* names (not torch.tpu) new in the torchtpu outputs: goldens and the runnable fixtures'."""
    pairs = [(source.read_text(), output.read_text()) for source, output in torchtpu_outputs()]
    for name in SCRIPTS:
        source = (xp.RUNNABLE / f"{name}.py").read_text()
        pairs.append((source, migrate(source, target="torchtpu").code))
    names = set()
    for source, output in pairs:
        names |= {n for n in dotted_names(output) - dotted_names(source)
                  if n.startswith("torch.") and not n.startswith("torch.tpu")}
    return names


RESOLVE = """
import importlib, sys, torch
missing = []
for name in sys.argv[1:]:
    parts = name.split(".")
    value = torch
    for i, part in enumerate(parts[1:], 2):
        try:
            value = getattr(value, part)
        except AttributeError:
            try:
                value = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                missing.append(name)
                break
print("\\n".join(missing))
"""


def test_torch_names_the_target_writes_exist_in_torch_2_9():
    python = xp.require_env("current")
    names = sorted(emitted_torch_names())
    assert "torch.accelerator.current_accelerator" in names and "torch.autocast" in names
    proc = subprocess.run([str(python), "-c", RESOLVE, *names, "torch.accelerator.no_such_api"], env=cpu_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The probe name shows the check can fail; nothing else may be missing.
    assert proc.stdout.split() == ["torch.accelerator.no_such_api"], proc.stdout
    ast.parse(RESOLVE)  # the probe itself is valid Python (a syntax error would read as "nothing missing")
    assert re.search(r"check_available", " ".join(out.read_text() for _, out in torchtpu_outputs()))
