"""Proof tier, issue 28: a collective after the optimizer step (``dist.reduce`` of the step's loss, XLA410's
``xm.all_reduce`` in the xm form) runs in the step's graph on every replica. The step barrier goes after it
(analysis/steps/step_end.py); before the fix it went right after ``xm.optimizer_step``, so rank 0's read of the
reduced value ran the all-reduce in a graph of its own on rank 0 alone and two replicas hung (measured on
torch_xla 2.9 PJRT CPU: ``rendezvous.cc:127 Termination timeout ... all reduce``, BrokenProcessPool).

The migrated program runs with two replicas (PJRT CPU, ``CPU_NUM_DEVICES=2``, the step-marker shim of
docs/proof.md "Two replicas"), the original with two processes on plain torch (gloo); both print each replica's
loss and rank 0 the reduced sum per step, and the values must agree.
"""

from __future__ import annotations

import re
import textwrap

import pytest
import xla_proof as xp

from xla_migrate import migrate

pytestmark = pytest.mark.xla

ORIGINAL = textwrap.dedent('''\
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    def main():
        dist.init_process_group("nccl")
        rank = dist.get_rank()
        generator = torch.Generator().manual_seed(0)
        model = torch.nn.Linear(4, 1)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator))
        model = DDP(model.cuda())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.Generator().manual_seed(1 + rank)
        for step in range(4):
            x = torch.randn(8, 4, generator=data).cuda()
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total = loss.detach().clone()
            dist.reduce(total, dst=0)
            print(f"replica {rank} step {step} loss {loss.item():.6f}\\n", end="", flush=True)
            if rank == 0:
                print(f"step {step} reduced {total.item():.6f}\\n", end="", flush=True)


    if __name__ == "__main__":
        main()
    ''')


def _values(stdout: str) -> dict[str, float]:
    """``replica R step S loss V`` and ``step S reduced V`` -> {"replica R step S loss": V, ...} (the replicas
    are threads of one process: their lines may interleave)."""
    return {key: float(value) for key, value in
            re.findall(r"(replica \d+ step \d+ loss|step \d+ reduced) (-?\d+\.\d{6})", stdout)}


def test_a_reduce_after_the_step_runs_on_both_replicas_with_the_originals_values():
    python = xp.require_env("current")
    result = migrate(ORIGINAL, target="2.9", data_parallel="xm")
    assert result.error is None
    lines = [line.strip() for line in result.code.splitlines()]
    reduce_at = lines.index('xm.all_reduce("sum", [total])')
    assert lines[reduce_at + 1] == "torch_xla.sync()", result.code  # the barrier after the step's collective
    two = xp.run_script(python, result.code, "collectives-after-step x2", xla=True, timeout=240,
                        extra_env={"CPU_NUM_DEVICES": "2", "XLA_PROOF_SERIALIZE_STEPS": "1",
                                   "XLA_ENABLE_PARAM_ALIASING": "0"})
    xp.RECORD.append(("current", "collectives after the step (2 replicas)", two))
    assert two.returncode == 0, two.describe()
    migrated, original = _values(two.stdout), _values(xp.gloo_run(python, ORIGINAL, "collectives"))
    assert len(original) == 12 and set(migrated) == set(original), (two.stdout, original)
    for key, value in original.items():
        assert abs(migrated[key] - value) <= 1e-4 * max(1.0, abs(value)), (key, migrated[key], value)
    for step in range(4):  # rank 0 got the sum of both replicas' losses
        both = migrated[f"replica 0 step {step} loss"] + migrated[f"replica 1 step {step} loss"]
        assert abs(migrated[f"step {step} reduced"] - both) <= 1e-4, (step, migrated)
