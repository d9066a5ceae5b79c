"""The spmd form (issue 31, ``--data-parallel spmd``): a whole DDP script becomes one SPMD program (every rule
together), mp.spawn becomes one call, collectives are reported, the target table refuses it on sagemaker, and
torch FSDP1 becomes FSDPv2 in the spmd form and is reported elsewhere (XLA415). The runs on 4 devices are
tests/xla/test_spmd_proof.py's."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from xla_migrate import migrate
from xla_migrate.engine.targets import TARGETS, data_parallel_problem

ROOT = Path(__file__).resolve().parent.parent
SPAWN = textwrap.dedent("""\
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler


    def worker(rank, world_size):
        dist.init_process_group("nccl", rank=rank, world_size=world_size)
        torch.manual_seed(0)
        dataset = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        loader = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset))
        model = DDP(nn.Linear(4, 1).to(rank), device_ids=[rank])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x.to(rank)), y.to(rank))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            dist.all_reduce(loss)
        if rank == 0:
            torch.save(model.module.state_dict(), "model.pt")
        dist.barrier()


    if __name__ == "__main__":
        world_size = torch.cuda.device_count()
        mp.spawn(worker, args=(world_size,), nprocs=world_size)
    """)


def test_the_target_table_has_spmd_on_2_9_only():
    assert data_parallel_problem(TARGETS["2.9"], "spmd") is None
    assert data_parallel_problem(TARGETS["sagemaker"], "spmd") == (
        "--data-parallel spmd: the sagemaker target (torch_xla 1.13 API) has no SPMD; use --target 2.9")
    with pytest.raises(ValueError, match="data_parallel=spmd: the sagemaker target"):
        migrate(SPAWN, target="sagemaker", data_parallel="spmd")


def test_mp_spawn_becomes_one_spmd_program():
    result = migrate(SPAWN, target="2.9", data_parallel="spmd")
    assert result.error is None and result.data_parallel == "spmd"
    code = result.code
    ast.parse(code)
    for gone in ("mp.spawn", "DDP(", "init_process_group", "collective_broadcast", "xm.optimizer_step", "_mp_fn",
                 "torch_xla.launch", ".module."):
        assert gone not in code, gone
    main_block = code[code.index('if __name__ == "__main__":'):].splitlines()
    assert [line.strip() for line in main_block[2:6]] == [
        "xr.use_spmd()",
        "# One SPMD program over the host's devices: each loader's (global) batch is split on the \"data\" axis.",
        "num_devices = xr.global_runtime_device_count()",
        'xs.set_global_mesh(xs.Mesh(np.arange(num_devices), (num_devices,), ("data",)))']
    assert main_block[6].strip() == "worker(0, world_size)"
    assert "DistributedSampler(dataset, num_replicas=xr.process_count(), rank=xr.process_index())" in code
    assert ('pl.MpDeviceLoader(loader, device, input_sharding=xs.ShardingSpec(xs.get_global_mesh(), '
            '("data", None), minibatch=True))') in code
    assert "optimizer.step()" in code and 'xm.rendezvous("barrier")' in code
    assert "if xr.process_index() == 0:" in code
    # The user's own collective between replicas has no SPMD meaning: reported, not rewritten.
    [collective] = [f for f in result.findings if f.code == "XLA404"]
    assert "dist.all_reduce(loss)" in collective.message and "no process group" in collective.message
    assert "dist.all_reduce(loss)" in code


def test_the_spmd_output_is_stable():
    first = migrate(SPAWN, target="2.9", data_parallel="spmd")
    again = migrate(first.code, target="2.9", data_parallel="spmd")
    assert again.error is None
    assert again.code == first.code, again.diff


def test_the_other_forms_are_unchanged_by_the_spmd_rules():
    for form in ("ddp", "xm"):
        code = migrate(SPAWN, target="2.9", data_parallel=form).code
        assert "use_spmd" not in code and "get_global_mesh" not in code and "process_index" not in code, form


FSDP1 = (ROOT / "fixtures" / "XLA415" / "fsdp1_wrap.in.py").read_text()
FSDP1_PLAIN = (ROOT / "fixtures" / "XLA415" / "fsdp1_device_id.in.py").read_text()
FSDP2 = (ROOT / "fixtures" / "XLA415" / "fsdp2_fully_shard.in.py").read_text()


@pytest.mark.parametrize("target,form", [("2.9", None), ("2.9", "xm"), ("2.9", "ddp"), ("2.9", "spmd"),
                                         ("sagemaker", None), ("sagemaker", "xm"), ("sagemaker", "ddp")])
def test_every_torch_fsdp_call_is_converted_or_reported(target, form):
    one = [f for f in migrate(FSDP1, target=target, data_parallel=form).findings if f.code == "XLA415"]
    two = [f for f in migrate(FSDP2, target=target, data_parallel=form).findings if f.code == "XLA415"]
    assert [f.line for f in one] == ([] if form == "spmd" else [17])
    assert [f.line for f in two] == ([] if form == "spmd" else [12, 13])
    plain = migrate(FSDP1_PLAIN, target=target, data_parallel=form)
    plain_findings = [f for f in plain.findings if f.code == "XLA415"]
    if form == "spmd":
        # torch's size_based_auto_wrap_policy: kept, imported from torch_xla.distributed.fsdp.wrap (whose
        # policies FSDPv2's recursive wrap calls); a policy torch_xla has not is reported (below).
        code = migrate(FSDP1, target=target, data_parallel=form).code
        assert "FSDP(" not in code and ', ("fsdp", "model")), auto_wrap_policy=policy)' in code
        assert "from torch_xla.distributed.fsdp.wrap import size_based_auto_wrap_policy" in code
        other = FSDP1.replace("import size_based_auto_wrap_policy",
                              "import ModuleWrapPolicy, size_based_auto_wrap_policy")
        reported = [f for f in migrate(other, target=target, data_parallel=form).findings if f.code == "XLA415"]
        assert len(reported) == 1 and "(auto_wrap_policy): not converted" in reported[0].message
        assert reported[0].fix.startswith("wrap the model with SpmdFullyShardedDataParallel")
        assert plain_findings == []
        assert ('model = fsdpv2.SpmdFullyShardedDataParallel(model, mesh=xs.Mesh(np.arange('
                'xr.global_runtime_device_count()), (xr.global_runtime_device_count(), 1), ("fsdp", "model")))'
                ) in plain.code
        assert "torch.distributed.fsdp" not in plain.code
        # fully_shard per block and on the root: one FSDPv2 wrap of the root (tests/test_spmd_fsdp2.py).
        assert "model = fsdpv2.SpmdFullyShardedDataParallel(model, mesh=" in migrate(FSDP2, target=target,
                                                                                     data_parallel=form).code
        return
    fix = one[0].fix
    assert "torch FSDP1 does not run on XLA devices" in one[0].message
    assert [f.line for f in plain_findings] == [13] and "FSDP(" in plain.code
    if target == "sagemaker":
        assert fix.startswith("use torch_xla.distributed.fsdp.XlaFullyShardedDataParallel")
    else:
        assert fix.startswith("migrate with --data-parallel spmd and use FSDPv2")


def test_an_fsdp_import_alone_or_another_fully_shard_is_not_reported():
    source = ("from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n"
              "def fully_shard(m):\n    return m\nfully_shard(1)\n")
    assert [f for f in migrate(source, target="2.9").findings if f.code == "XLA415"] == []


def test_a_relative_import_is_not_a_policy_import():
    # `from . import util` has no module name: XLA415's look for torch's wrap-policy imports raised (an internal
    # error on every module of a package that imports its siblings this way, caught by the review fixtures).
    source = "from . import util\nimport torch\n\n\nmodel = torch.nn.Linear(2, 2).cuda()\n"
    for form in (None, "spmd"):
        result = migrate(source, target="2.9", data_parallel=form)
        assert result.error is None and "cuda()" not in result.code, result.error
