"""Proof tier, the spmd form of a torchrun script with helper collectives (issue 31): fixtures/runnable/
torchrun_collectives_spmd.py, whose helpers read the rank and world size, average the logged loss over the workers
with dist.all_reduce then a division by the world size, wait at dist.barrier() and save on rank 0 only, migrated
with ``--data-parallel spmd`` and run as ONE program on 4 PJRT CPU devices (``CPU_NUM_DEVICES=4``).

The original runs with plain torch (gloo) at world size 1: its loader's batch of 32 rows is the whole global
batch. In the SPMD program the loss is computed over the global batch sharded on the 4 devices, so it already is
the mean over the former workers: the migration removes the all_reduce and the division by the world size
(XLA410), and the averaged losses the script logs must equal the original's (fp32, within 1e-4), as must the
weights rank 0 saves. torch_xla's metrics (read at every step marker by xla-migrate verify's loader) must show
compilation stopping after warm-up and one graph execution per training step: the removed collective leaves no
graph cut. The barrier (``xm.rendezvous``) after training costs one small graph (its all-gather of payload sizes).
"""

from __future__ import annotations

import subprocess
from functools import lru_cache

import pytest
import xla_proof as xp

pytestmark = pytest.mark.xla

NAME = "torchrun_collectives_spmd"
DEVICES = 4
STEPS = 15  # 480 rows / 32 a batch (drop_last)
TOLERANCE = 1e-4

COMPARE_WEIGHTS = """
import sys, torch
a, b = (torch.load(p, map_location="cpu") for p in sys.argv[1:3])
assert a.keys() == b.keys(), (sorted(a), sorted(b))
print(max((a[k].float() - b[k].float()).abs().max().item() for k in a))
"""


@lru_cache(maxsize=None)
def _runs():
    runs = xp.spmd_runs(NAME, DEVICES)
    return runs.python, runs.result, runs.original, runs.migrated


def test_the_helper_collectives_get_their_spmd_meaning():
    _, result, _, _ = _runs()
    code = result.code.split('"""', 2)[2]  # after the module docstring, which names DDP and the collectives
    assert result.data_parallel == "spmd"
    # Every collective has its SPMD meaning: nothing is reported about them (XLA404) or left to call.
    assert [f.message for f in result.findings if f.code in ("XLA404", "XLA410")] == []
    for gone in ("dist.all_reduce", "averaged /=", "init_process_group", "destroy_process_group", "DDP(",
                 "dist.get_rank", "dist.get_world_size", "dist.is_initialized", "dist.barrier", "_mp_fn"):
        assert gone not in code, gone
    assert 'xm.rendezvous("barrier")' in code
    assert "return xr.process_index() if xr.process_count() > 1 else 0" in code
    assert "num_replicas=xr.process_count(), rank=xr.process_index()" in code
    assert 'input_sharding=xs.ShardingSpec(xs.get_global_mesh(), ("data", None), minibatch=True)' in code
    main_block = code[code.index('if __name__ == "__main__":'):]
    assert main_block.splitlines()[1].strip() == "xr.use_spmd()", main_block


def test_the_averaged_losses_and_the_saved_weights_equal_the_original():
    python, _, original, migrated = _runs()
    assert original.returncode == 0, original.describe()
    assert migrated.returncode == 0, migrated.describe()
    assert len(original.losses) == len(migrated.losses) == STEPS, (original.stdout, migrated.stdout)
    worst = max(abs(a - b) for a, b in zip(original.losses, migrated.losses))
    xp.DELTAS[("current", f"{NAME} [2.9 spmd, {DEVICES} devices]")] = worst
    assert worst <= TOLERANCE, f"losses differ by up to {worst}"
    assert original.losses[-1] < original.losses[0]  # it trains: the comparison is not of two flat curves
    saved = [run.workdir / "model.pt" for run in (original, migrated)]
    assert all(p.exists() for p in saved), saved
    compared = subprocess.run([str(python), "-c", COMPARE_WEIGHTS, *map(str, saved)], capture_output=True,
                              text=True, timeout=120)
    assert compared.returncode == 0, compared.stderr
    assert float(compared.stdout.strip()) <= TOLERANCE, compared.stdout


def test_compiles_stop_after_warm_up_and_each_step_is_one_graph():
    _, _, _, migrated = _runs()
    assert migrated.returncode == 0, migrated.describe()
    blocks = migrated.blocks
    assert len(blocks) >= STEPS, f"{len(blocks)} step markers for {STEPS} steps"
    # The device loader marks a step at each batch and once more when it is exhausted (marker STEPS + 1): the
    # training window ends there.
    first = blocks[xp.WARMUP_STEPS]
    trained = next(b for b in blocks if b.step == STEPS + 1)
    assert trained.compiles == first.compiles, (
        f"{trained.compiles - first.compiles} compilations in training after warm-up: {blocks}")
    assert trained.runs == STEPS, f"{trained.runs} graph runs for {STEPS} training steps: {blocks}"
    assert trained.reads == 0, "the loop reads lazy tensors back to the host"
    # After training: xm.rendezvous("barrier") (torch_xla's xla_rendezvous all-gathers its payload sizes, one
    # graph compiled and run, its size read back) and the read of the stacked losses; nothing else.
    final = migrated.final
    assert final.compiles - trained.compiles <= 2, (final, blocks)
    assert final.runs == STEPS + 2, f"{final.runs} graph runs in all for {STEPS} steps"
    assert final.reads <= 1, final
