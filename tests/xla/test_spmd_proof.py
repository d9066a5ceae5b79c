"""Proof tier, the spmd form (issue 31; DESIGN.md section 9): torchrun scripts migrated with ``--data-parallel
spmd`` run as ONE program on 4 PJRT CPU devices (``CPU_NUM_DEVICES=4``), no launcher, and train like the
original: a DDP script (fixtures/runnable/ddp_spmd.py), an FSDP1 script (fsdp_spmd.py, whose wrap becomes
FSDPv2, SpmdFullyShardedDataParallel), an FSDP1 script with an auto-wrap policy (fsdp1_autowrap_spmd.py:
transformer_auto_wrap_policy on each Block, kept, from torch_xla.distributed.fsdp.wrap) and an FSDP2 script
(fsdp2_spmd.py: fully_shard per block and on the root, which become one FSDPv2 wrap of the root).

The original runs with plain torch (gloo) at world size 1: its loader's batch of 32 rows is the whole global
batch (torch FSDP1 needs an accelerator, so the FSDP1 script's CPU fallback trains the plain model: what FSDP
computes; FSDP2's fully_shard runs on gloo at world size 1, so the FSDP2 script's original is sharded as written). The SPMD program keeps that batch size and shards each batch over the 4 devices (8 rows each), so
both compute the same global step and their losses must agree (fp32, within 1e-4). torch_xla's metrics (read at
every step marker by xla-migrate verify's loader) must show compilation stopping after warm-up and one graph
execution per step; the test-only shim (tests/xla/sitecustomize.py, XLA_PROOF_SHARDING_FILE) records the
sharding of the first batch's tensors (split on dim 0 over the 4 devices, not replicated) and of the FSDPv2
wrapper's parameters (each split over the 4 devices).
"""

from __future__ import annotations

from functools import lru_cache

import pytest
import xla_proof as xp

pytestmark = pytest.mark.xla

SCRIPTS = ["ddp_spmd", "fsdp_spmd", "fsdp1_autowrap_spmd", "fsdp2_spmd"]
FSDPV2 = {"fsdp_spmd", "fsdp1_autowrap_spmd", "fsdp2_spmd"}  # the scripts whose model becomes FSDPv2
DEVICES = 4
STEPS = 15  # 480 rows / 32 a batch (drop_last)
TOLERANCE = 1e-4


@lru_cache(maxsize=None)
def _runs(name: str):
    runs = xp.spmd_runs(name, DEVICES, sharding=True)
    return runs.result, runs.original, runs.migrated, runs.sharding


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_migration_is_one_spmd_program(name):
    result, _, _, _ = _runs(name)
    code = result.code.split('"""', 2)[2]  # after the module docstring, which names DDP and FSDP
    assert result.data_parallel == "spmd"
    assert [f.message for f in result.findings] == []
    for gone in ("DistributedDataParallel", "DDP(", "FSDP(", "fully_shard(", "torch.distributed.fsdp", "init_process_group",
                 "destroy_process_group", "torch_xla.launch", "_mp_fn", "xm.optimizer_step", "collective_broadcast"):
        assert gone not in code, gone
    main_block = code[code.index('if __name__ == "__main__":'):]
    assert main_block.splitlines()[1].strip() == "xr.use_spmd()", main_block
    assert 'xs.Mesh(np.arange(num_devices), (num_devices,), ("data",))' in main_block
    assert 'input_sharding=xs.ShardingSpec(xs.get_global_mesh(), ("data", None), minibatch=True)' in code
    assert "num_replicas=xr.process_count(), rank=xr.process_index()" in code
    assert "if xr.process_index() == 0:" in code
    assert ("fsdpv2.SpmdFullyShardedDataParallel(model, mesh=" in code) == (name in FSDPV2)


@pytest.mark.parametrize("name", SCRIPTS)
def test_spmd_on_four_devices_trains_like_the_original(name):
    _, original, migrated, _ = _runs(name)
    assert original.returncode == 0, original.describe()
    assert migrated.returncode == 0, migrated.describe()
    assert len(original.losses) == len(migrated.losses) == STEPS, (original.stdout, migrated.stdout)
    worst = max(abs(a - b) for a, b in zip(original.losses, migrated.losses))
    xp.DELTAS[("current", f"{name} [2.9 spmd, {DEVICES} devices]")] = worst
    assert worst <= TOLERANCE, f"losses differ by up to {worst}"
    assert original.losses[-1] < original.losses[0]  # it trains: the comparison is not of two flat curves


@pytest.mark.parametrize("name", SCRIPTS)
def test_spmd_compiles_once_then_runs_one_graph_per_step(name):
    _, _, migrated, _ = _runs(name)
    assert migrated.returncode == 0, migrated.describe()
    assert len(migrated.blocks) >= STEPS, f"{len(migrated.blocks)} step markers for {STEPS} steps"
    first, last, markers = xp.steady_window(migrated)
    assert last.compiles == first.compiles, (
        f"{last.compiles - first.compiles} compilations over the {markers} step markers after warm-up")
    # The device loader marks a step at each batch and once more when it is exhausted (a marker with nothing
    # to run): at most one graph per marker, and over the whole run one per step plus the read of the stacked
    # losses after the loop.
    assert last.runs - first.runs <= markers, f"{last.runs - first.runs} graph runs over {markers} step markers"
    assert migrated.final.runs == STEPS + 1, f"{migrated.final.runs} graph runs in all for {STEPS} steps"
    assert last.reads - first.reads == 0, "the loop reads lazy tensors back to the host"


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_batch_and_the_fsdpv2_parameters_are_sharded(name):
    _, _, migrated, rows = _runs(name)
    assert migrated.returncode == 0, migrated.describe()
    batch = [row for row in rows if row[0] == "batch"]
    assert len(batch) == 2, rows  # inputs and targets
    for _, shape, spec in batch:
        # Split along dim 0 over the 4 devices (GSPMD's devices=[4,1]), not replicated.
        assert shape.startswith("[32,") and f"devices=[{DEVICES},1]" in spec and "replicated" not in spec, spec
    params = [row for row in rows if row[0] == "param"]
    if name not in FSDPV2:
        assert params == []
        return
    if name == "fsdp1_autowrap_spmd":  # each Block's wrap (auto_wrap_policy), then the root's, which holds all
        assert len(params) == 2 + 2 + 4, rows
        params = params[-4:]
    assert len(params) == 4, rows  # two Linear layers: weights and biases
    for _, shape, spec in params:
        # FSDPv2 shards every parameter over the "fsdp" axis: one dimension split 4 ways ([4,1], [1,4] or [4]).
        assert spec.startswith("{devices=[") and "replicated" not in spec, (shape, spec)
        split = spec[len("{devices=["):spec.index("]")].split(",")
        assert sorted(int(n) for n in split)[-1] == DEVICES, (shape, spec)
