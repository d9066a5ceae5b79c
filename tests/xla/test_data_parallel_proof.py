"""Proof tier, data-parallel forms (DESIGN.md section 7): each distributed runnable fixture, migrated in each
form its target has, runs at world size 1 on real torch_xla (PJRT CPU) with the original's losses.

The original runs with plain torch (gloo) under torchrun's environment for one process; so does the ddp form
(``xla://`` reads the same variables). The xm form starts its workers with the XLA launcher. The ddp form is
the 2.9 target's output; it runs on the 2.9 env and, since torch_xla 2.6.1 has ``xla://``,
``torch_xla.launch`` and every 2.9 spelling the output uses, on the 2.6.1 env too.
"""

from __future__ import annotations

from functools import lru_cache

import pytest
import xla_proof as xp

pytestmark = pytest.mark.xla

DISTRIBUTED = ["ddp_torchrun", "ddp_env_flag"]
# (env, target, form): where each form applies.
RUNS = [("current", "2.9", "ddp"), ("sagemaker", "2.9", "ddp"), ("current", "2.9", "xm"),
        ("sagemaker", "sagemaker", "xm")]
# Forms that cannot run yet, with why: strict xfails (a fix makes them XPASS, which fails until removed).
GAPS: dict[tuple[str, str], str] = {}


def _python(env: str):
    python, why = xp.env_python(env)
    if python is None:
        if xp.in_ci():
            pytest.fail(f"CI=true and {why}", pytrace=False)
        pytest.skip(why)
    return python


@lru_cache(maxsize=None)
def _original(env: str, name: str) -> xp.Run:
    source = xp.RUNNABLE.joinpath(f"{name}.py").read_text()
    return xp.run_script(_python(env), source, f"{env} original {name}", xla=False, distributed=True)


@lru_cache(maxsize=None)
def _migrated(env: str, name: str, target: str, form: str) -> tuple[str, xp.Run]:
    from xla_migrate import migrate

    path = xp.RUNNABLE / f"{name}.py"
    result = migrate(path.read_text(), target=target, data_parallel=form, path=str(path))
    assert result.error is None, result.error
    assert result.data_parallel == form
    run = xp.run_script(_python(env), result.code, f"{env} {form} {name}", xla=True, distributed=True)
    xp.RECORD.append((env, f"{name} [{form}]", run))
    return result.code, run


def _params():
    params = []
    for name in DISTRIBUTED:
        for env, target, form in RUNS:
            marks = [pytest.mark.xfail(strict=True, reason=GAPS[(name, form)])] if (name, form) in GAPS else []
            params.append(pytest.param(env, name, target, form, id=f"{env}-{name}-{target}-{form}", marks=marks))
    return params


@pytest.mark.parametrize("env,name,target,form", _params())
def test_form_runs_with_the_original_losses(env, name, target, form):
    original = _original(env, name)
    assert original.returncode == 0, original.describe()
    assert original.losses, original.stdout
    code, migrated = _migrated(env, name, target, form)
    assert migrated.returncode == 0, migrated.describe() + "\n--- migrated script ---\n" + code
    assert len(migrated.losses) == len(original.losses), migrated.stdout
    worst = max(abs(a - b) for a, b in zip(original.losses, migrated.losses))
    assert worst <= xp.FP32_TOLERANCE, f"losses differ by up to {worst}"
    if form == "ddp":
        assert "DDP(model, gradient_as_bucket_view=True)" in code and 'init_method="xla://"' in code
    else:
        assert "DDP(" not in code and "init_process_group" not in code
