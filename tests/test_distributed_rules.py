"""The distributed rules (XLA401-XLA409): mode detection and its overrides, the gradient reduction done
exactly once and in the seeds' order, and the coordination with XLA202/XLA204."""

from __future__ import annotations

import re
import textwrap

import libcst as cst
import pytest

from xla_migrate import migrate, migrate_file
from xla_migrate.engine.context import MigrationContext
from xla_migrate.engine.targets import get_target


def facts_distributed(source: str) -> bool:
    wrapper = cst.MetadataWrapper(cst.parse_module(textwrap.dedent(source)), unsafe_skip_copy=True)
    return MigrationContext(wrapper, get_target("sagemaker")).distributed


@pytest.mark.parametrize("source", [
    "from torch.nn.parallel import DistributedDataParallel as DDP\nm = DDP(m)\n",
    "import torch.distributed as dist\ndist.init_process_group('nccl')\n",
    "from torch.utils.data.distributed import DistributedSampler\ns = DistributedSampler(d)\n",
    "import torch\ns = torch.utils.data.DistributedSampler(d)\n",
    "import os\nr = int(os.environ['LOCAL_RANK'])\n",
    "import os\nr = os.environ.get('WORLD_SIZE', 1)\n",
    "from os import getenv\nr = getenv('RANK')\n",
    "import torch.multiprocessing as mp\nmp.spawn(f, nprocs=2)\n",
    "import torch_xla.distributed.xla_multiprocessing as xmp\nxmp.spawn(f)\n",
])
def test_distributed_signals(source):
    assert facts_distributed(source)


@pytest.mark.parametrize("source", [
    "import torch\nmodel = torch.nn.Linear(2, 2).cuda()\n",
    "import os\nr = int(os.environ.get('SLURM_PROCID', 0))\n",
    "import torch.distributed as dist\nprint(dist.is_available())\n",
    "environ = {}\nr = environ['RANK']\n",
])
def test_single_device_scripts_are_not_distributed(source):
    assert not facts_distributed(source)


AMP_CLIP_DDP = '''\
import os

import torch
from torch.cuda.amp import GradScaler, autocast
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    torch.manual_seed(0)
    local_rank = int(os.environ["LOCAL_RANK"])
    model = DDP(torch.nn.Linear(8, 2).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler()
    batches = iter(make_batches())
    step = 0
    while step < 100:
        x, y = next(batches)
        optimizer.zero_grad()
        with autocast():
            loss = torch.nn.functional.mse_loss(model(x.cuda()), y.cuda())
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        step += 1


if __name__ == "__main__":
    main()
'''


def _index(lines: list[str], pattern: str) -> int:
    hits = [i for i, line in enumerate(lines) if re.search(pattern, line)]
    assert len(hits) == 1, (pattern, hits)
    return hits[0]


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_order_backward_all_reduce_unscale_clip_step_barrier(target):
    result = migrate(AMP_CLIP_DDP, target=target, data_parallel="xm")
    assert result.error is None
    lines = result.code.splitlines()
    backward = _index(lines, r"\.backward\(\)")
    fetch = _index(lines, r"gradients = xm\._fetch_gradients\(optimizer\)")
    reduce = _index(lines, r"xm\.all_reduce\(\"sum\", gradients, scale=1\.0 / ")
    clip = _index(lines, r"clip_grad_norm_")
    barrier = _index(lines, r"xm\.mark_step\(\)|torch_xla\.sync\(\)")
    world = "xm.xrt_world_size()" if target == "sagemaker" else "xr.world_size()"
    assert world in lines[reduce]
    if target == "sagemaker":
        # The seeds' AMP form: the scaler stays and makes the step.
        unscale = _index(lines, r"scaler\.unscale_\(optimizer\)")
        step = _index(lines, r"scaler\.step\(optimizer\)")
        assert backward < fetch < reduce < unscale < clip < step < barrier
    else:
        # No GradScaler on 2.9: the step is the optimizer's own, without a second reduction.
        step = _index(lines, r"^\s*optimizer\.step\(\)")
        assert backward < fetch < reduce < clip < step < barrier
    # Exactly once: no xm.optimizer_step (which would all-reduce again).
    assert "optimizer_step" not in result.code
    assert result.code.count("all_reduce") == 1


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_without_clipping_the_optimizer_step_reduces(target):
    source = AMP_CLIP_DDP.replace("        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n", "")
    result = migrate(source, target=target, data_parallel="xm")
    if target == "sagemaker":
        # A kept GradScaler unscales and checks the gradients in scaler.step: reduce before it.
        assert result.code.count("xm.all_reduce(") == 1 and "optimizer_step" not in result.code
    else:
        assert "all_reduce" not in result.code
        assert result.code.count("xm.optimizer_step(optimizer)") == 1


def test_single_device_scripts_gain_nothing_distributed():
    source = AMP_CLIP_DDP.replace("DDP(torch.nn.Linear(8, 2).cuda(), device_ids=[local_rank])",
                                  "torch.nn.Linear(8, 2).cuda()").replace(
        'int(os.environ["LOCAL_RANK"])', "0").replace(
        "from torch.nn.parallel import DistributedDataParallel as DDP\n", "")
    result = migrate(source, target="2.9")
    assert not [c for c in result.changes if c.code.startswith("XLA4")]
    assert "_mp_fn" not in result.code and "all_reduce" not in result.code
    assert "xm.optimizer_step(optimizer)" in result.code
    forced = migrate(source, target="2.9", distributed=True, data_parallel="xm")
    assert "def _mp_fn(index):" in forced.code
    assert "torch_xla.launch(_mp_fn, args=())" in forced.code
    assert forced.code.count("xm.all_reduce(") == 1


def test_single_overrides_detection_and_says_so():
    result = migrate(AMP_CLIP_DDP, target="sagemaker", distributed=False)
    assert not [c for c in result.changes if c.code.startswith("XLA4")]
    assert any(f.code == "XLA404" and "single-device" in f.message for f in result.findings)
    assert "DDP(" in result.code


def test_migrate_file_passes_distributed_through(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("import torch\n\n\ndef main():\n    pass\n\n\nif __name__ == '__main__':\n    main()\n")
    assert "_mp_fn" not in migrate_file(path).code
    assert "xmp.spawn(_mp_fn, args=())" in migrate_file(path, distributed=True).code


def test_reduction_without_xla406_is_left_to_the_optimizer_step():
    result = migrate(AMP_CLIP_DDP, target="2.9", ignore=["XLA406"], data_parallel="xm")
    assert "all_reduce" not in result.code
    assert "xm.optimizer_step(optimizer)" in result.code


def test_migrated_output_is_stable_with_every_rule():
    for target in ("sagemaker", "2.9"):
        once = migrate(AMP_CLIP_DDP, target=target)
        twice = migrate(once.code, target=target)
        assert twice.code == once.code, twice.diff
        assert twice.changes == []


def test_device_created_at_import_is_reported():
    source = textwrap.dedent('''\
        import os
        import torch

        device = torch.device("cuda")


        def main():
            rank = int(os.environ["RANK"])
            print(rank, device)


        if __name__ == "__main__":
            main()
        ''')
    result = migrate(source, target="sagemaker")
    assert "xmp.spawn(_mp_fn, args=())" in result.code
    assert any(f.code == "XLA407" and "import time" in f.message and f.line == 4 for f in result.findings)


def test_entry_point_for_main_called_with_a_constant():
    """main(True) under the __main__ block: the constant is passed through args=, never used as a parameter
    name (def _mp_fn(index, True) crashed the rule)."""
    from xla_migrate import migrate

    source = ('import torch.distributed as dist\n\n\ndef main(distributed):\n    dist.init_process_group("nccl")\n'
              '\n\nif __name__ == "__main__":\n    main(True)\n')
    result = migrate(source, target="sagemaker")
    assert result.error is None
    # The parameter takes main's own name for it.
    assert "def _mp_fn(index, distributed):\n" in result.code and "    main(distributed)\n" in result.code
    assert "xmp.spawn(_mp_fn, args=(True,))" in result.code


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
@pytest.mark.parametrize("form", ["xm", "ddp"])
def test_world_size_from_the_cuda_count_is_reported(target, form):
    """world_size = torch.cuda.device_count() fed to init_process_group: the migrated group ignores it, the
    script's batch_size // world_size still divides by 0: XLA404 names the line and the fix (issue 29)."""
    source = textwrap.dedent('''\
        import torch
        import torch.distributed as dist


        def main():
            world_size = torch.cuda.device_count()
            dist.init_process_group("nccl", world_size=world_size, rank=0)
            print(64 // world_size)


        if __name__ == "__main__":
            main()
        ''')
    result = migrate(source, target=target, data_parallel=form)
    spelled = "xr.world_size()" if target == "2.9" else "xm.xrt_world_size()"
    found = [f for f in result.findings if f.code == "XLA404" and "torch.cuda.device_count()" in f.message]
    assert len(found) == 1 and found[0].line == 7 and "(line 6)" in found[0].message
    assert f"world_size = {spelled} on line 6" in found[0].fix
    # rank=0 is no count: nothing said about it
    assert not any("rank=" in f.message for f in found)


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_spawned_worker_takes_the_process_group_rank_from_the_runtime(target):
    """barlowtwins on SLURM: args.rank = node_id * args.ngpus_per_node (a CUDA count) in the launcher, then
    args.rank += gpu in the worker: the rank is rebound to the XLA ordinal after that update, not before it
    (rebinding first would add the launcher's index twice); a rank that is no count is left alone."""
    source = textwrap.dedent('''\
        import os
        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp


        def worker(gpu, args):
            args.rank += gpu
            dist.init_process_group("nccl", init_method=args.url, world_size=args.world_size, rank=args.rank)
            print(args.batch_size // args.world_size)


        def main(args):
            args.ngpus = torch.cuda.device_count()
            args.rank = int(os.environ["NODE"]) * args.ngpus
            args.world_size = int(os.environ["NODES"]) * args.ngpus
            mp.spawn(worker, (args,), args.ngpus)
        ''')
    ordinal = "xr.global_ordinal()" if target == "2.9" else "xm.get_ordinal()"
    code = migrate(source, target=target).code
    body = code[code.index("def worker"):code.index("def main")]
    assert body.index("args.rank += gpu") < body.index(f"args.rank = {ordinal}")
    assert body.count("args.world_size = ") == 1 and body.count("args.rank = ") == 1
    plain = migrate(source.replace('int(os.environ["NODE"]) * args.ngpus', "0"), target=target).code
    assert f"args.rank = {ordinal}" not in plain


GATHERS = textwrap.dedent('''\
    import torch
    import torch.distributed as dist


    def setup():
        dist.init_process_group("nccl")


    def evaluate(model, batches, rank, world):
        correct = torch.zeros(())
        for x, y in batches:
            correct += (model(x).argmax(1) == y).sum()
        counts = [torch.zeros_like(correct) for _ in range(world)] if rank == 0 else None
        dist.gather(correct, counts, dst=0)
        dist.gather(correct * 2, dst=0)
        if rank == 0:
            print(sum(c.item() for c in counts))


    def train(model, opt, batches, rank, world):
        for x, y in batches:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses = [torch.zeros_like(loss) for _ in range(world)] if rank == 0 else None
            dist.gather(loss.detach(), losses, dst=0)
    ''')


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_a_gather_runs_on_every_replica_at_a_barrier_before_dst_copies(target):
    """Issue 28 point 1 of the sixteenth session's notes: ``dist.gather`` off dst (no list) became a bare
    ``xm.all_gather(...)`` whose result was dropped; torch_xla runs at a barrier only what a live tensor needs,
    so those replicas never ran the collective while dst waited for it (two replicas on PJRT CPU: 4 collectives
    in dst's step graph, 3 in the other's; tests/xla/test_logging_collectives_proof.py). Every replica now
    keeps the result in a name of its own and runs it at a barrier before dst copies; the copies get a second
    barrier unless the step's barrier follows."""
    barrier = "torch_xla.sync()" if target == "2.9" else "xm.mark_step()"
    code = migrate(GATHERS, target=target, data_parallel="xm", select=["XLA411", "XLA302"]).code
    lines = [line.strip() for line in code.splitlines()]
    evaluate, train = lines[:lines.index("def train(model, opt, batches, rank, world):")], lines[
        lines.index("def train(model, opt, batches, rank, world):"):]
    first = evaluate.index("gathered_correct = xm.all_gather(correct.unsqueeze(0), pin_layout=False)")
    assert evaluate[first + 1:first + 5] == [
        barrier, "for gathered_tensor, chunk in zip(counts or (), gathered_correct):", "gathered_tensor.copy_(chunk)",
        barrier], code
    # The call without a list: the same collective, kept in a second name (rebinding the first would drop it).
    second = evaluate.index("all_gathered = xm.all_gather((correct * 2).unsqueeze(0), pin_layout=False)")
    assert evaluate[second + 1] == barrier, code
    # In a step followed by the step's barrier: no second barrier for dst's copies.
    gather = train.index("all_gathered_2 = xm.all_gather(loss.detach().unsqueeze(0), pin_layout=False)")
    assert train[gather + 1:gather + 5] == [barrier, "for gathered_tensor, chunk in zip(losses or (), all_gathered_2):",
                                            "gathered_tensor.copy_(chunk)", barrier], code
    assert train.count(barrier) == 2, code
    # Without XLA302 no step barrier follows: the copies get their own.
    alone = migrate(GATHERS, target=target, data_parallel="xm", select=["XLA411"]).code
    assert alone.count(barrier) == 5, alone
    assert migrate(code, target=target, data_parallel="xm", select=["XLA411", "XLA302"]).code == code
