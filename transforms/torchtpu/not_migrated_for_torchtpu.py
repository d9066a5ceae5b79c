"""XLA790 not-migrated-for-torchtpu: what the torchtpu target does not map yet is reported, not left silently.

What it does:
    Only for ``--target torchtpu``. Reports, without rewriting: ``torch.compile`` with ``mode=`` or
    ``backend="inductor"`` (both raise under TorchTPU, which picks its own ``tpu`` backend);
    ``torch.nn.DataParallel``; FSDP (``FullyShardedDataParallel``, ``fully_shard``) and
    ``init_device_mesh`` on a CUDA mesh. The CUDA constructs no rule rewrote are XLA900's; torch_xla code is
    upgraded by XLA703 and XLA704, which report what they leave.

Why:
    The torchtpu target is a preview (docs/guide.md, TorchTPU): it maps a single-device CUDA script's idioms
    and DDP; each construct here still needs a person, and saying so is better than leaving it as it was.

Example:
    model = torch.compile(model, mode="max-autotune")

Use instead:
    model = torch.compile(model)
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.common import short

PREVIEW = "not migrated for torchtpu yet"
DATA_PARALLEL = ("torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                 "torch.nn.parallel.data_parallel.DataParallel")
FSDP = ("torch.distributed.fsdp.FullyShardedDataParallel",
        "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel",
        "torch.distributed.fsdp.fully_shard", "torch.distributed._composable.fsdp.fully_shard")
MESH = ("torch.distributed.device_mesh.init_device_mesh", "torch.distributed.init_device_mesh")


class NotMigratedForTorchTpu(Rule):
    code = "XLA790"
    name = "not-migrated-for-torchtpu"
    summary = "torch.compile(mode=/inductor), DataParallel, FSDP, CUDA meshes: reported (torchtpu)"
    targets = ("torchtpu",)
    on_xla_code = True
    reports_only = True

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        if ctx.is_call_to(node, "torch.compile"):
            mode = patterns.keyword(node, "mode")
            backend = patterns.keyword(node, "backend")
            if mode is not None or (backend is not None and patterns.string_value(backend.value) == "inductor"):
                self.finding(node, f"{short(node)}: TorchTPU's torch.compile raises with mode= or "
                             'backend="inductor"', "drop mode= and backend=: TorchTPU picks its tpu backend")
        elif ctx.is_call_to(node, *DATA_PARALLEL):
            self.finding(node, f"{short(node)}: DataParallel, {PREVIEW}",
                         "TorchTPU drives one device per process: use DDP on the tpu_dist process group, or drop it")
        elif ctx.is_call_to(node, *FSDP):
            self.finding(node, f"{short(node)}: FSDP, {PREVIEW}",
                         'use FSDP2 fully_shard on init_device_mesh("tpu", ...) by hand')
        elif ctx.is_call_to(node, *MESH):
            first = patterns.positional(node)
            if first and patterns.is_cuda_string(first[0].value):
                self.finding(node, f"{short(node)}: a CUDA device mesh, {PREVIEW}",
                             'use init_device_mesh("tpu", ...) by hand')
