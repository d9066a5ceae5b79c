"""Proof tier, the spmd form's FSDP state-dict APIs (issue 31, XLA416): fixtures/runnable/fsdp2_checkpoint_spmd.py
(FSDP2 fully_shard per block and on the root; after 8 steps get_model_state_dict / get_optimizer_state_dict
with full CPU state, torch.save on rank 0, then the weights and momentum zeroed and set_model_state_dict /
set_optimizer_state_dict from the file, 7 more steps) migrated with ``--data-parallel spmd`` and run as ONE
program on 4 PJRT CPU devices: the wrap becomes FSDPv2 (XLA415), the state APIs ``model.module.state_dict()``,
``optimizer.state_dict()``, ``model.module.load_state_dict(...)``, ``optimizer.load_state_dict(...)`` (XLA416),
the save ``xm.save`` (XLA501: CPU tensors in the file).

The original runs with plain torch (gloo, FSDP2 at world size 1). Save then load must round-trip: the losses of
all 15 steps, the 7 after the reload too, equal the original's (fp32, within 1e-4; a lost state would show from
step 8 on), and the two checkpoint files hold the same tensors under the same model keys (the FSDPv2 wrapper's
own keys would start with ``_orig_module.``). The optimizer's file differs in form only: torch's plain
``optimizer.state_dict()`` keys its state by parameter index, get_optimizer_state_dict by parameter name; the
momentum buffers, in parameter order, must be equal.
"""

from __future__ import annotations

import json
import subprocess
from functools import lru_cache

import pytest
import xla_proof as xp

pytestmark = pytest.mark.xla

NAME = "fsdp2_checkpoint_spmd"
DEVICES = 4
STEPS = 15  # 480 rows / 32 a batch (drop_last); saved and reloaded before step 8
TOLERANCE = 1e-4

COMPARE = """
import json, sys, torch
a, b = (torch.load(p, map_location="cpu", weights_only=False) for p in sys.argv[1:3])
model = {k: (a["model"][k].float() - b["model"][k].float()).abs().max().item() for k in a["model"]}
def momenta(optim):  # in the order of the first param group's parameters (names or indexes)
    return [optim["state"][p]["momentum_buffer"] for p in optim["param_groups"][0]["params"]]
pairs = list(zip(momenta(a["optim"]), momenta(b["optim"])))
print(json.dumps({"keys": [sorted(a["model"]), sorted(b["model"])], "model": max(model.values()),
                  "momenta": len(pairs), "momentum": max((x.cpu() - y.cpu()).abs().max().item() for x, y in pairs),
                  "devices": sorted({str(t.device) for t in b["model"].values()})}))
"""


@lru_cache(maxsize=None)
def _runs():
    runs = xp.spmd_runs(NAME, DEVICES)
    return runs.python, runs.result, runs.original, runs.migrated


def test_the_state_apis_become_the_plain_ones():
    _, result, _, _ = _runs()
    code = result.code.split('"""', 2)[2]  # after the module docstring, which names the FSDP APIs
    for gone in ("fully_shard(", "get_model_state_dict(", "get_optimizer_state_dict(", "set_model_state_dict(",
                 "set_optimizer_state_dict(", "init_process_group"):
        assert gone not in code, gone
    for kept in ("state = model.module.state_dict()", "optim_state = optimizer.state_dict()",
                 'model.module.load_state_dict(checkpoint["model"])', 'optimizer.load_state_dict(checkpoint["optim"])',
                 "fsdpv2.SpmdFullyShardedDataParallel(model, mesh="):
        assert kept in code, kept
    assert {f.code for f in result.findings} <= {"XLA501"}, [f.message for f in result.findings]


def test_save_then_load_on_four_devices_trains_like_the_original():
    _, _, original, migrated = _runs()
    assert original.returncode == 0, original.describe()
    assert migrated.returncode == 0, migrated.describe()
    assert len(original.losses) == len(migrated.losses) == STEPS, (original.stdout, migrated.stdout)
    worst = max(abs(a - b) for a, b in zip(original.losses, migrated.losses))
    xp.DELTAS[("current", f"{NAME} [2.9 spmd, {DEVICES} devices]")] = worst
    assert worst <= TOLERANCE, f"losses differ by up to {worst}"
    assert original.losses[-1] < original.losses[0]


def test_the_checkpoints_hold_the_same_state_under_the_same_keys():
    python, _, original, migrated = _runs()
    assert original.returncode == 0 and migrated.returncode == 0
    proc = subprocess.run([str(python), "-c", COMPARE, str(original.workdir / "checkpoint.pt"),
                           str(migrated.workdir / "checkpoint.pt")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["keys"][0] == found["keys"][1] == ["0.bias", "0.weight", "2.bias", "2.weight"], found["keys"]
    assert found["model"] <= TOLERANCE and found["momentum"] <= TOLERANCE, found
    assert found["momenta"] == 4 and found["devices"] == ["cpu"], found  # xm.save wrote CPU tensors


def test_the_reload_compiles_once_then_the_steps_run_one_graph_each():
    _, _, _, migrated = _runs()
    blocks = migrated.blocks
    assert len(blocks) >= STEPS
    # After the reload (step 8) the step graph compiles again (the restored state is new data), then stops.
    late = blocks[min(len(blocks) - 1, 8 + xp.WARMUP_STEPS)]
    assert blocks[-1].compiles == late.compiles, [b.compiles for b in blocks]
    assert blocks[-1].runs - late.runs <= len(blocks) - 1 - blocks.index(late), [b.runs for b in blocks]
