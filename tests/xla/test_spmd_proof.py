"""Proof tier, the spmd form (issue 31; DESIGN.md section 9): a torchrun DDP script migrated with
``--data-parallel spmd`` runs as ONE program on 4 PJRT CPU devices (``CPU_NUM_DEVICES=4``), no launcher, and
trains like the original.

The original (fixtures/runnable/ddp_spmd.py) runs with plain torch (gloo) at world size 1: its loader's batch of
32 rows is the whole global batch. The SPMD program keeps that batch size and shards each batch over the 4
devices (8 rows each), so both compute the same global step and their losses must agree (fp32, within 1e-4).
torch_xla's metrics (read at every step marker by xla-migrate verify's loader) must show compilation stopping
after warm-up and one graph execution per step; the test-only shim (tests/xla/sitecustomize.py,
XLA_PROOF_SHARDING_FILE) records the sharding of the first batch's tensors: split on the data axis over the 4
devices, not replicated.
"""

from __future__ import annotations

import tempfile
from functools import lru_cache
from pathlib import Path

import pytest
import xla_proof as xp

pytestmark = pytest.mark.xla

NAME = "ddp_spmd"
DEVICES = 4
STEPS = 15  # 480 rows / 32 a batch (drop_last)
TOLERANCE = 1e-4


@lru_cache(maxsize=None)
def _runs():
    from xla_migrate import migrate

    python = xp.require_env("current")
    path = xp.runnable_path(NAME)
    source = path.read_text()
    result = migrate(source, target="2.9", data_parallel="spmd", path=str(path))
    assert result.error is None, result.error
    original = xp.run_script(python, source, f"current original {NAME}", xla=False, distributed=True)
    folder = Path(tempfile.mkdtemp(prefix="xla-proof-sharding-"))
    xp.WORKDIRS.append(folder)
    sharding = folder / "sharding.tsv"
    # No torchrun variables: the SPMD program is one process that finds its devices itself.
    migrated = xp.run_script(python, result.code, f"current spmd {NAME}", xla=True, distributed=False,
                             extra_env={"CPU_NUM_DEVICES": str(DEVICES), "XLA_PROOF_SHARDING_FILE": str(sharding)},
                             timeout=400)
    xp.RECORD.append(("current", f"{NAME} [2.9 spmd, {DEVICES} devices]", migrated))
    shardings = sharding.read_text().splitlines() if sharding.exists() else []
    return result, original, migrated, shardings


def test_the_migration_is_one_spmd_program():
    result, _, _, _ = _runs()
    code = result.code.split('"""', 2)[2]  # after the module docstring, which names DDP
    assert result.data_parallel == "spmd"
    assert [f.message for f in result.findings] == []
    for gone in ("DistributedDataParallel", "DDP(", "init_process_group", "destroy_process_group",
                 "torch_xla.launch", "_mp_fn", "xm.optimizer_step", "collective_broadcast"):
        assert gone not in code, gone
    main_block = code[code.index('if __name__ == "__main__":'):]
    assert main_block.splitlines()[1].strip() == "xr.use_spmd()", main_block
    assert 'xs.Mesh(np.arange(num_devices), (num_devices,), ("data",))' in main_block
    assert 'input_sharding=xs.ShardingSpec(xs.get_global_mesh(), ("data", None))' in code
    assert "num_replicas=xr.process_count(), rank=xr.process_index()" in code
    assert "if xr.process_index() == 0:" in code


def test_spmd_on_four_devices_trains_like_the_original():
    _, original, migrated, _ = _runs()
    assert original.returncode == 0, original.describe()
    assert migrated.returncode == 0, migrated.describe()
    assert len(original.losses) == len(migrated.losses) == STEPS, (original.stdout, migrated.stdout)
    worst = max(abs(a - b) for a, b in zip(original.losses, migrated.losses))
    xp.DELTAS[("current", f"{NAME} [2.9 spmd, {DEVICES} devices]")] = worst
    assert worst <= TOLERANCE, f"losses differ by up to {worst}"
    assert original.losses[-1] < original.losses[0]  # it trains: the comparison is not of two flat curves


def test_spmd_compiles_once_then_runs_one_graph_per_step():
    _, _, migrated, _ = _runs()
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


def test_the_batch_is_sharded_over_the_devices():
    _, _, migrated, shardings = _runs()
    assert migrated.returncode == 0, migrated.describe()
    assert len(shardings) == 2, shardings  # inputs and targets
    for line in shardings:
        shape, spec = line.split("\t")
        # Split along dim 0 over the 4 devices (GSPMD's devices=[4,1]), not replicated.
        assert shape.startswith("[32,") and f"devices=[{DEVICES},1]" in spec and "replicated" not in spec, line
