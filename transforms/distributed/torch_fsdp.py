"""XLA415 torch-fsdp: torch's FSDP (FullyShardedDataParallel, fully_shard) is reported with the XLA form to use.

What it does:
    Reports every call of torch's FSDP: FSDP1 ``FullyShardedDataParallel(model, ...)`` (``FSDP`` as it is
    usually imported) and FSDP2 ``fully_shard(model, ...)`` (``torch.distributed.fsdp`` or
    ``torch.distributed._composable.fsdp``), in every form and target. The finding says what to use: on
    ``2.9``, ``--data-parallel spmd`` (FSDPv2: ``SpmdFullyShardedDataParallel`` from
    ``torch_xla.experimental.spmd_fully_sharded_data_parallel`` over a ``("fsdp", "model")`` mesh, the batch
    sharded on ``"fsdp"``) or torch_xla's ``XlaFullyShardedDataParallel``
    (``torch_xla.distributed.fsdp``); on ``sagemaker``, ``XlaFullyShardedDataParallel``. Nothing is
    rewritten yet, in the spmd form either.

Why:
    torch's FSDP shards parameters over a process group of CUDA (or CPU) devices: on an XLA device it
    raises (torch 2.9, torch_xla 2.9: "Device 'xla:0' does not have a corresponding backend registered as
    'torch.xla'" at ``FSDP(...)``), and without a migration the script keeps it silently. torch_xla shards a
    model its own ways: SPMD FSDPv2 (one program, the compiler inserts the collectives) or its FSDP wrapper
    for the replica forms. Their arguments (auto-wrap policies, mixed precision, state-dict types) differ.

Example:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    model = FSDP(model, device_id=local_rank, use_orig_params=True)

Use instead:
    # xla-migrate --target 2.9 --data-parallel spmd, then FSDPv2 over a ("fsdp", "model") mesh:
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel
    model = SpmdFullyShardedDataParallel(model, mesh=xs.Mesh(np.arange(n), (n, 1), ("fsdp", "model")))
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.common import short

_MODULES = ("torch.distributed.fsdp.", "torch.distributed._composable.fsdp.")
_WRAPPERS = {"FullyShardedDataParallel": "FSDP1", "fully_shard": "FSDP2"}


def fsdp_call(names: frozenset[str] | set[str]) -> str | None:
    """"FSDP1" or "FSDP2" when one of a call's qualified names is torch's FSDP wrapper, else None."""
    for name in names:
        last = name.rsplit(".", 1)[-1]
        if last in _WRAPPERS and name.startswith(_MODULES):
            return _WRAPPERS[last]
    return None


class TorchFsdp(Rule):
    code = "XLA415"
    name = "torch-fsdp"
    summary = "torch FSDP (FullyShardedDataParallel, fully_shard) is reported: use --data-parallel spmd (FSDPv2)"
    on_xla_code = True  # it only reports: torch FSDP fails on XLA devices wherever it is left
    reports_only = True

    def visit_Call(self, node: cst.Call) -> None:
        kind = fsdp_call(self.ctx.qualnames(node.func))
        if kind is None:
            return
        why = (f"{short(node)}: torch {kind} does not run on XLA devices (\"Device 'xla:0' does not have a "
               "corresponding backend registered as 'torch.xla'\")")
        if "use_spmd" in self.ctx.target.spellings:
            if self.ctx.spmd_form:
                fix = ("not converted yet: wrap the model with SpmdFullyShardedDataParallel "
                       "(torch_xla.experimental.spmd_fully_sharded_data_parallel) over a (\"fsdp\", \"model\") mesh "
                       "and shard the batch on \"fsdp\"")
            else:
                fix = ("migrate with --data-parallel spmd and use FSDPv2 (SpmdFullyShardedDataParallel over a "
                       "(\"fsdp\", \"model\") mesh), or torch_xla.distributed.fsdp.XlaFullyShardedDataParallel")
        else:
            fix = ("use torch_xla.distributed.fsdp.XlaFullyShardedDataParallel, or migrate with --target 2.9 "
                   "--data-parallel spmd (FSDPv2)")
        self.finding(node, why, fix)
