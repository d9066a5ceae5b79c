"""Proof tier, projects (issue 14): the runnable fixture project (fixtures/projects/ddp_project: main.py with
the arguments and the distributed setup through utils.py, the loop in engine.py, the update in utils.LossScaler,
the model in model.py) migrated as a tree runs on real torch_xla (PJRT CPU) like the original: the same losses
within 1e-3, at most one graph execution per step after warm-up, and a checkpoint that plain torch loads.

Each env runs its target's output in the default data-parallel form, auto, which keeps DDP for this project
(the update is in utils.LossScaler.__call__, which engine.py's loop calls): current (torch_xla 2.9) the `2.9`
target's ddp form, sagemaker (torch_xla 2.6.1) the `sagemaker` target's (torch_xla 1.13's process group,
xmp.spawn); tests/xla/test_data_parallel_proof.py runs its xm form too. The original runs with plain torch
(gloo) under torchrun's environment for one process.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest
import xla_proof as xp

pytestmark = pytest.mark.xla

PROJECT = xp.ROOT / "fixtures" / "projects" / "ddp_project"
ENTRY = "main.py"
STEPS = 48  # 384 samples / 16 per batch * 2 epochs


def _python(env: str):
    return xp.require_env(env)


def _sources(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.glob("*.py"))}


@lru_cache(maxsize=None)
def migrated_tree(target: str) -> dict[str, str]:
    """The project migrated as a tree by the command line (a mirror), file name -> migrated source."""
    out = Path(tempfile.mkdtemp(prefix=f"xla-proof-project-{target}-"))
    xp.WORKDIRS.append(out)
    proc = subprocess.run([sys.executable, "-m", "xla_migrate", str(PROJECT), "--out", str(out / "migrated"),
                           "--target", target, "-q"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return _sources(out / "migrated")


def _run(env: str, files: dict[str, str], label: str, xla: bool) -> xp.Run:
    companions = {name: text for name, text in files.items() if name != ENTRY}
    return xp.run_script(_python(env), files[ENTRY], label, xla=xla, distributed=True, companions=companions)


@lru_cache(maxsize=None)
def runs(env: str) -> tuple[dict[str, str], xp.Run, xp.Run]:
    files = migrated_tree(xp.TARGETS[env])
    original = _run(env, _sources(PROJECT), f"{env} original project", xla=False)
    migrated = _run(env, files, f"{env} migrated project", xla=True)
    xp.RECORD.append((env, "ddp_project [project]", migrated))
    return files, original, migrated


@pytest.mark.parametrize("env", list(xp.TARGETS))
def test_project_runs_with_the_original_losses(env):
    files, original, migrated = runs(env)
    assert original.returncode == 0, original.describe()
    assert len(original.losses) == STEPS, original.stdout
    assert migrated.returncode == 0, migrated.describe() + "\n--- migrated main.py ---\n" + files[ENTRY]
    assert len(migrated.losses) == STEPS, migrated.stdout
    worst = max(abs(a - b) for a, b in zip(original.losses, migrated.losses))
    assert worst <= xp.FP32_TOLERANCE, f"losses differ by up to {worst}"
    xp.DELTAS[(env, "ddp_project [project]")] = worst
    assert "def _mp_fn" not in files["utils.py"] and "def _mp_fn" not in files["engine.py"]


@pytest.mark.parametrize("env", list(xp.TARGETS))
def test_project_runs_one_graph_per_step(env):
    _, _, migrated = runs(env)
    assert migrated.returncode == 0, migrated.describe()
    first, last, markers = xp.steady_window(migrated)
    graph_runs = last.runs - first.runs
    assert markers > 0, f"{len(migrated.blocks)} step markers"
    assert graph_runs <= markers, f"{graph_runs} graph runs over {markers} step markers after warm-up"
    assert last.compiles - first.compiles <= xp.LATE_COMPILES


@pytest.mark.parametrize("env", list(xp.TARGETS))
def test_project_checkpoint_loads_with_plain_torch_and_matches(env):
    _, original, migrated = runs(env)
    assert original.returncode == 0 and migrated.returncode == 0
    states = xp.load_states(_python(env), [original.workdir / "model.pt", migrated.workdir / "model.pt"], None)
    assert xp.max_state_difference(*states) <= xp.FP32_TOLERANCE
