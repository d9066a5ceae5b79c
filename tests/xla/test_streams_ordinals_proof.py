"""Proof tier, issue 29: a side-stream data prefetcher (XLA111) and integer GPU ids used as devices (XLA101).
Each runnable fixture, migrated for an env's target, runs on real torch_xla (PJRT CPU) with the losses of the
original run with plain torch on the CPU (its CPU fallback), and the CUDA-only code the shape is about is gone.

Per env (tools/xla_envs.sh): `current` (torch_xla 2.9) runs the `2.9` target's output, `sagemaker` (torch_xla
2.6.1) the `sagemaker` target's.
"""

from __future__ import annotations

import ast
from functools import lru_cache

import pytest
import xla_proof as xp

pytestmark = pytest.mark.xla

# Fixture -> the calls the migrated script must no longer make (each one raises on a host without CUDA).
SHAPES = {
    "stream_prefetcher": ("torch.cuda.Stream", "torch.cuda.stream", "torch.cuda.current_stream"),
    "gpu_ids_metric": (),
}


@lru_cache(maxsize=None)
def _migrated(name: str, target: str) -> str:
    from xla_migrate import migrate

    path = xp.RUNNABLE / f"{name}.py"
    result = migrate(path.read_text(), target=target, path=str(path))
    assert result.error is None, result.error
    return result.code


def _calls(code: str) -> set[str]:
    return {ast.unparse(n.func) for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call)}


def _integer_devices(code: str) -> list[str]:
    """`.to(...)` calls whose device is still an element of the GPU id list or an int literal."""
    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "to":
            for value in [*node.args, *(k.value for k in node.keywords if k.arg == "device")]:
                if "gpu_ids" in ast.unparse(value) or (isinstance(value, ast.Constant) and type(value.value) is int):
                    found.append(ast.unparse(node))
    return found


@pytest.mark.parametrize("env,name", [pytest.param(env, name, id=f"{env}-{name}") for env in xp.TARGETS
                                      for name in SHAPES])
def test_runs_with_the_original_losses(env, name):
    python = xp.require_env(env)
    code = _migrated(name, xp.TARGETS[env])
    left = _calls(code) & set(SHAPES[name])
    assert not left, f"CUDA stream calls left: {sorted(left)}\n{code}"
    assert not _integer_devices(code), code
    original = xp.run_script(python, (xp.RUNNABLE / f"{name}.py").read_text(), f"{env} original {name}", xla=False)
    migrated = xp.run_script(python, code, f"{env} migrated {name}", xla=True)
    xp.RECORD.append((env, f"{name} [streams/ordinals]", migrated))
    assert original.returncode == 0, original.describe()
    assert migrated.returncode == 0, migrated.describe() + "\n--- migrated script ---\n" + code
    assert original.losses and len(migrated.losses) == len(original.losses), (original.stdout, migrated.stdout)
    worst = max(abs(a - b) for a, b in zip(original.losses, migrated.losses))
    assert worst <= xp.FP32_TOLERANCE, f"losses differ by up to {worst:.3g}"
    checkpoint = {"stream_prefetcher": "prefetch.pt", "gpu_ids_metric": "metric.pt"}[name]
    assert (migrated.workdir / checkpoint).exists(), sorted(p.name for p in migrated.workdir.iterdir())
