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

DISTRIBUTED = ["ddp_torchrun", "ddp_env_flag", "ddp_helpers", "ddp_world_size_arg"]
# (env, target, form): where each form applies.
RUNS = [("current", "2.9", "ddp"), ("sagemaker", "2.9", "ddp"), ("current", "2.9", "xm"),
        ("sagemaker", "sagemaker", "xm")]
# More runs for one script: the 2.9 target's xm collectives (xm.all_gather, xm.collective_broadcast) on 2.6.1 too.
EXTRA_RUNS = {"ddp_helpers": [("sagemaker", "2.9", "xm")]}
# Forms that cannot run yet, with why: strict xfails (a fix makes them XPASS, which fails until removed).
GAPS: dict[tuple[str, str, str, str], str] = {}  # (script, env, target, form)


def _python(env: str):
    return xp.require_env(env)


@lru_cache(maxsize=None)
def _original(env: str, name: str) -> xp.Run:
    source = xp.runnable_path(name).read_text()
    return xp.run_script(_python(env), source, f"{env} original {name}", xla=False, distributed=True)


@lru_cache(maxsize=None)
def _migrated(env: str, name: str, target: str, form: str) -> tuple[str, xp.Run]:
    from xla_migrate import migrate

    path = xp.runnable_path(name)
    result = migrate(path.read_text(), target=target, data_parallel=form, path=str(path))
    assert result.error is None, result.error
    assert result.data_parallel == form
    run = xp.run_script(_python(env), result.code, f"{env} {form} {name}", xla=True, distributed=True)
    xp.RECORD.append((env, f"{name} [{form}]", run))
    return result.code, run


def _params():
    params = []
    for name in DISTRIBUTED:
        for env, target, form in RUNS + EXTRA_RUNS.get(name, []):
            gap = GAPS.get((name, env, target, form))
            marks = [pytest.mark.xfail(strict=True, reason=gap)] if gap else []
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
        assert "gradient_as_bucket_view=True)" in code and 'init_method="xla://"' in code
    else:
        assert "DDP(" not in code and "init_process_group" not in code
    # What the helper collectives returned (`collective NAME v1 v2 ...` lines), value for value.
    expected, got = _collectives(original.stdout), _collectives(migrated.stdout)
    assert got.keys() == expected.keys(), migrated.stdout
    for collective, values in expected.items():
        assert len(got[collective]) == len(values), collective
        worst = max(abs(a - b) for a, b in zip(values, got[collective]))
        assert worst <= xp.FP32_TOLERANCE, f"{collective}: results differ by up to {worst}"
    if name == "ddp_helpers":
        assert set(expected) == {"all_reduce", "all_gather", "all_gather_into_tensor", "broadcast"}
        if form == "ddp":
            # XLA412: torch_xla 2.6.1's xla backend fails on all_gather_into_tensor (IndexError), runs all_gather
            assert "dist.all_gather(list(stacked.chunk(dist.get_world_size())), curve * 2)" in code, code
        if form == "xm":
            # the mapped collectives, and the emptied ddp_setup()/cleanup() gone with their calls
            for mapped in ("xm.all_gather(curve.unsqueeze(0))", "stacked.copy_(xm.all_gather(curve * 2))",
                           "xm.collective_broadcast([first], root_ordinal=0)"):
                assert mapped in code, mapped
            assert "def ddp_setup" not in code and "ddp_setup(local_rank)" not in code, code
            assert "def cleanup" not in code and "    cleanup()\n" not in code and "dist." not in code, code


def _collectives(stdout: str) -> dict[str, list[float]]:
    found = {}
    for line in stdout.splitlines():
        if line.startswith("collective "):
            _, name, *values = line.split()
            found[name] = [float(v) for v in values]
    return found
