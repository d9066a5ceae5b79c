"""XLA908 lightning-devices: a Lightning Trainer or Fabric told to run on CUDA GPUs, or with a strategy that
has no XLA backend (DDP, torch FSDP, DeepSpeed), is reported with Lightning's XLA form.

What it does:
    Reports each ``Trainer(...)`` / ``Fabric(...)`` of Lightning (``pytorch_lightning``, ``lightning``,
    ``lightning_fabric``) that passes ``gpus=`` (anything but ``None`` or ``0``), ``accelerator="gpu"`` /
    ``"cuda"``, or a strategy without an XLA backend (``"ddp"``, ``"fsdp"``, ``"deepspeed_stage_2"``, ...,
    ``DDPPlugin(...)``, ``DDPStrategy(...)``, ``FSDPStrategy(...)``, ``DeepSpeedStrategy(...)``), one finding
    naming those arguments; a strategy object built elsewhere (``strategy = FSDPStrategy(...)``) is reported
    where it is built. Nothing is rewritten: Lightning owns the device, the launch and the gradient
    reduction of such a program.

Why:
    A Lightning program chooses its device in the Trainer or Fabric, not in its module: left alone, it still
    asks for CUDA GPUs (``Trainer(gpus=...)`` raises MisconfigurationException on a TPU host) or for a
    strategy Lightning cannot run on XLA devices (torch FSDP, NCCL DDP, DeepSpeed). Lightning's XLA forms are
    ``accelerator="tpu"`` with the strategy ``"xla"`` (one process per device, launched by Lightning) or
    ``XLAFSDPStrategy`` for sharded training.

Example:
    trainer = Trainer(gpus=[0], strategy=DDPPlugin(find_unused_parameters=False), max_epochs=1)
    fabric = L.Fabric(devices=8, strategy=FSDPStrategy(state_dict_type="full"))

Use instead:
    trainer = Trainer(accelerator="tpu", devices="auto", max_epochs=1)
    fabric = L.Fabric(accelerator="tpu", devices=8, strategy=XLAFSDPStrategy(state_dict_type="full"))
"""

from __future__ import annotations

import re

import libcst as cst

from xla_migrate.engine.rule import Rule
from xla_migrate.syntax import patterns

_PACKAGES = ("pytorch_lightning", "lightning", "lightning_fabric")
_ENTRIES = ("Trainer", "Fabric")
# Strategy classes and names that need CUDA (NCCL DDP, torch FSDP, DeepSpeed, DataParallel, Horovod); Lightning's
# XLA ones (XLAStrategy, XLAFSDPStrategy, "xla", "xla_fsdp", TPUSpawnPlugin) do not match.
_CUDA_STRATEGY_CLASS = re.compile(r"^(DDP|FSDP|DeepSpeed|DataParallel|Horovod)\w*(Plugin|Strategy)$")
_CUDA_STRATEGY_NAME = re.compile(r"^(ddp|fsdp|deepspeed|dp$|horovod)")
_FIX = ('run it on Lightning\'s XLA accelerator: accelerator="tpu" with devices=, no gpus=, and the strategy "xla" '
        "(Lightning launches one process per XLA device) or XLAFSDPStrategy for sharded training; drop "
        "DDP/FSDP/DeepSpeed strategies and plugins")


def _lightning(names: frozenset[str], wanted) -> str | None:
    """The last part of a Lightning qualified name that ``wanted`` accepts, else None."""
    for name in sorted(names):
        if name.split(".")[0] in _PACKAGES and wanted(name.rsplit(".", 1)[-1]):
            return name.rsplit(".", 1)[-1]
    return None


class LightningDevices(Rule):
    code = "XLA908"
    name = "lightning-devices"
    summary = ("a Lightning Trainer/Fabric on CUDA GPUs (gpus=, accelerator=\"gpu\") or a DDP/FSDP/DeepSpeed "
               "strategy is reported with accelerator=\"tpu\" and the \"xla\" strategy")
    on_xla_code = True  # it only reports
    reports_only = True

    def visit_Call(self, node: cst.Call) -> None:
        qualnames = self.ctx.qualnames(node.func)
        entry = _lightning(qualnames, lambda last: last in _ENTRIES)
        if entry is not None:
            arguments = [self._cuda_argument(arg) for arg in node.args]
            arguments = [a for a in arguments if a is not None]
            if arguments:
                self.finding(node, f"{entry}({', '.join(arguments)}): asks Lightning for CUDA GPUs or a "
                             "strategy without an XLA backend: on an XLA host it fails before training", _FIX)
            return
        strategy = _lightning(qualnames, _CUDA_STRATEGY_CLASS.match)
        if strategy is not None and not self._argument_of_entry(node):
            self.finding(node, f"{strategy}(...): a Lightning strategy without an XLA backend", _FIX)

    def _cuda_argument(self, arg: cst.Arg) -> str | None:
        keyword = arg.keyword.value if arg.keyword is not None else None
        text = " ".join(patterns.code_of(arg.value).split())
        value = patterns.string_value(arg.value)
        if keyword == "gpus" and text not in ("None", "0"):
            return f"gpus={text}"
        if keyword == "accelerator" and value in ("gpu", "cuda"):
            return f"accelerator={text}"
        if keyword in ("strategy", "plugins"):
            if value is not None and _CUDA_STRATEGY_NAME.match(value):
                return f"{keyword}={text}"
            if isinstance(arg.value, cst.Call) and _lightning(self.ctx.qualnames(arg.value.func),
                                                              _CUDA_STRATEGY_CLASS.match):
                return f"{keyword}={text}"
        return None

    def _argument_of_entry(self, node: cst.Call) -> bool:
        """``Trainer(strategy=DDPPlugin(...))``: the Trainer's finding names it."""
        arg = self.ctx.parent(node)
        call = self.ctx.parent(arg) if isinstance(arg, cst.Arg) else None
        return isinstance(call, cst.Call) and _lightning(self.ctx.qualnames(call.func),
                                                        lambda last: last in _ENTRIES) is not None
