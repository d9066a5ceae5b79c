"""XLA702 ddp-to-torchtpu: DDP stays DDP on the torchtpu target, on the "tpu_dist" process group.

What it does:
    Only for ``--target torchtpu``. The ``"nccl"`` backend that ``torch.distributed.init_process_group``
    is given (``backend="nccl"``, the first positional argument, either branch of ``"nccl" if ... else
    "gloo"``) becomes ``"tpu_dist"``, and ``"cpu:gloo,cuda:nccl"`` becomes ``"cpu:gloo,tpu:tpu_dist"``.
    ``DistributedDataParallel(model, device_ids=[...], output_device=...)`` loses the two CUDA device
    options; the other options stay. A backend the script computes (``backend=args.backend``) and
    ``device_ids`` given by position are reported. Each process group gets a finding on how TorchTPU
    launches its workers, and so does ``torch.multiprocessing.spawn``: the launch is outside the script.

Why:
    torch_tpu 0.2.0 registers the ``tpu_dist`` backend (``tpu`` devices), drives one device per process
    and takes ``DDP(model)`` without ``device_ids``, as the CPU does. Its workers need TorchTPU's variables:
    ``python -m torch.tpu.distributed`` exports them before ``torchrun``, or
    ``torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=N)`` before ``mp.spawn``. Nothing here was
    run on a TPU.

Example:
    dist.init_process_group(backend="nccl")
    model = DDP(model, device_ids=[local_rank], output_device=local_rank)

Use instead:
    dist.init_process_group(backend="tpu_dist")
    model = DDP(model)
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.analysis.facts import DDP, INIT_PROCESS_GROUP, MP_SPAWN
from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.common import short

CUDA_DEVICE_OPTIONS = ("device_ids", "output_device")
LAUNCH = ("launch the workers with torchrun after `python -m torch.tpu.distributed` (it exports TorchTPU's "
          "variables), or call torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=N) before mp.spawn")


class DdpToTorchTpu(Rule):
    code = "XLA702"
    name = "ddp-to-torchtpu"
    summary = "init_process_group('nccl') -> 'tpu_dist'; DDP loses device_ids/output_device (torchtpu)"
    targets = ("torchtpu",)
    fix_safety = "review"

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.is_call_to(node, *INIT_PROCESS_GROUP):
            self._process_group(node)
        elif self.ctx.is_call_to(node, *DDP):
            self._ddp(node)
        elif self.ctx.is_call_to(node, *MP_SPAWN):
            self.finding(node, f"{short(node)}: TorchTPU's workers need its launch variables", LAUNCH)

    def _process_group(self, node: cst.Call) -> None:
        backend = patterns.keyword(node, "backend")
        positional = patterns.positional(node)
        value = backend.value if backend is not None else positional[0].value if positional else None
        literals = [value.body, value.orelse] if isinstance(value, cst.IfExp) else [value]
        known = False
        for literal in literals:
            text = patterns.string_value(literal) if literal is not None else None
            if text is not None and "nccl" in text and isinstance(literal, cst.SimpleString):
                new = text.replace("cuda:nccl", "tpu:tpu_dist") if "cuda:nccl" in text else text.replace(
                    "nccl", "tpu_dist")
                quote = literal.value[-1]
                self.replace(literal, cst.SimpleString(f"{quote}{new}{quote}"),
                             f"{literal.value} -> {quote}{new}{quote}: TorchTPU's process group backend")
                known = True
            elif text is not None:
                known = True
        if value is not None and not known:
            self.finding(value, f"{short(value)}: the process group backend is computed",
                         'use "tpu_dist" on a TPU ("cpu:gloo,tpu:tpu_dist" with CPU collectives)')
        self.finding(node, f"{short(node)}: TorchTPU's workers need its launch variables", LAUNCH)

    def _ddp(self, node: cst.Call) -> None:
        if len(patterns.positional(node)) > 1:
            self.finding(node, f"{short(node)}: device_ids given by position",
                         "drop them: TorchTPU's DDP takes no device_ids (one device per process)")
            return
        dropped = [a for a in node.args if a.keyword is not None and a.keyword.value in CUDA_DEVICE_OPTIONS]
        if not dropped:
            return

        def without(updated: cst.Call) -> cst.Call:
            kept = [a for a in updated.args if a.keyword is None or a.keyword.value not in CUDA_DEVICE_OPTIONS]
            return updated.with_changes(args=patterns.without_trailing_comma(kept))

        names = ", ".join(a.keyword.value for a in dropped)
        self.replace(node, without, f"{short(node)}: dropped {names} (TorchTPU's DDP takes none)")
