"""Proof tier, issue 29: a spawned worker's process-group numbers computed from torch.cuda.device_count() (0 on
an XLA host) come from the XLA runtime after migration, so ``batch_size // args.world_size`` no longer divides
by 0. The two XLA407 fixtures of that shape (barlowtwins' SLURM branch, ImageNet's ``ngpus_per_node *
args.world_size``), migrated by every rule in each form, run at world size 1 on real torch_xla (PJRT CPU):
rank 0, the whole batch. Before the fix the ImageNet shape crashed with ZeroDivisionError in every form."""

from __future__ import annotations

from pathlib import Path

import pytest
import xla_proof as xp

from xla_migrate import migrate

pytestmark = pytest.mark.xla

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "XLA407"
# (fixture, environment variables, the worker's line at world size 1: rank, per-device batch)
CASES = [("process_group_from_device_count", {"SLURM_JOB_ID": "1", "SLURM_NODEID": "0", "SLURM_NNODES": "1",
                                              "MASTER_ADDR": "localhost"}, "0 64"),
         ("process_group_rank_times_count", {}, "0 256")]
RUNS = [("current", "2.9", "xm"), ("current", "2.9", "ddp"), ("sagemaker", "sagemaker", "xm"),
        ("sagemaker", "sagemaker", "ddp")]


@pytest.mark.parametrize("env,target,form", RUNS)
@pytest.mark.parametrize("fixture,environment,expected", CASES)
def test_worker_numbers_come_from_the_runtime(fixture, environment, expected, env, target, form):
    python = xp.require_env(env)
    result = migrate((FIXTURES / f"{fixture}.in.py").read_text(), target=target, data_parallel=form)
    assert result.error is None
    run = xp.run_script(python, result.code, f"{fixture}-{target}-{form}", xla=False,
                        extra_env={"PJRT_DEVICE": "CPU", **environment})
    assert run.returncode == 0, run.stderr[-3000:]
    assert expected in run.stdout.splitlines(), run.stdout
