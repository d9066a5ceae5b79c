"""XLA908 lightning-devices: a Lightning Trainer or Fabric told to run on CUDA GPUs, or with a strategy that
has no XLA backend (DDP, torch FSDP, DeepSpeed), is reported with Lightning's XLA form.

What it does:
    Reports each ``Trainer(...)`` / ``Fabric(...)`` of Lightning (``pytorch_lightning``, ``lightning``,
    ``lightning_fabric``) that passes ``gpus=`` (anything but ``None`` or ``0``), ``accelerator="gpu"`` /
    ``"cuda"``, or a strategy without an XLA backend (``"ddp"``, ``"fsdp"``, ``"deepspeed_stage_2"``, ...,
    ``DDPPlugin(...)``, ``DDPStrategy(...)``, ``FSDPStrategy(...)``, ``DeepSpeedStrategy(...)``), one finding
    naming those arguments (an ``accelerator=`` name bound to ``"cuda"``/``"gpu"`` in the function, litgpt's
    ``LLM.distribute``, is named with the binding's line); a strategy object built elsewhere (``strategy =
    FSDPStrategy(...)``) is reported where it is built. A Trainer or Fabric built from configuration the tool cannot read (``Trainer(**cfg)``,
    ``Trainer(**asdict(cfg))``, ``hydra.utils.instantiate(cfg.trainer)``) is reported too, with the keys to
    set; a class of the same file whose field defaults ask for GPUs or a CUDA strategy (a dataclass config)
    is named in that finding. Nothing is rewritten: Lightning owns the device, the launch and the gradient
    reduction of such a program.

Why:
    A Lightning program chooses its device in the Trainer or Fabric, not in its module: left alone, it still
    asks for CUDA GPUs (``Trainer(gpus=...)`` raises MisconfigurationException on a TPU host) or for a
    strategy Lightning cannot run on XLA devices (torch FSDP, NCCL DDP, DeepSpeed). Lightning's XLA forms are
    ``accelerator="tpu"`` with the strategy ``"xla"`` (one process per device, launched by Lightning) or
    ``XLAFSDPStrategy`` for sharded training.

Example:
    trainer = Trainer(gpus=[0], strategy=DDPPlugin(find_unused_parameters=False), max_epochs=1)
    trainer = pl.Trainer(**asdict(cfg))     # cfg's class: accelerator: str = "gpu", strategy: str = "ddp"
    fabric = L.Fabric(devices=8, strategy=FSDPStrategy(state_dict_type="full"))

Use instead:
    trainer = Trainer(accelerator="tpu", devices="auto", max_epochs=1)
    trainer = pl.Trainer(**asdict(cfg))     # cfg's class: accelerator: str = "tpu", strategy: str = "xla"
    fabric = L.Fabric(accelerator="tpu", devices=8, strategy=XLAFSDPStrategy(state_dict_type="full"))
"""

from __future__ import annotations

import re

import libcst as cst

from xla_migrate.engine.rule import Rule
from xla_migrate.syntax import patterns
from xla_migrate.analysis.values import bound_values
from xla_migrate.transforms.common import LIGHTNING_PACKAGES

_ENTRIES = ("Trainer", "Fabric")
# Strategy classes and names that need CUDA (NCCL DDP, torch FSDP, DeepSpeed, DataParallel, Horovod); Lightning's
# XLA ones (XLAStrategy, XLAFSDPStrategy, "xla", "xla_fsdp", TPUSpawnPlugin) do not match.
_CUDA_STRATEGY_CLASS = re.compile(r"^(DDP|FSDP|DeepSpeed|DataParallel|Horovod)\w*(Plugin|Strategy)$")
_CUDA_STRATEGY_NAME = re.compile(r"^(ddp|fsdp|deepspeed|dp$|horovod)")
_FIX = ('run it on Lightning\'s XLA accelerator: accelerator="tpu" with devices=, no gpus=, and the strategy "xla" '
        "(Lightning launches one process per XLA device) or XLAFSDPStrategy for sharded training; drop "
        "DDP/FSDP/DeepSpeed strategies and plugins")
_CONFIG_KEYS = ("gpus", "accelerator", "strategy", "plugins")
_FROM_CONFIG_FIX = ("make the configuration ask for Lightning's XLA accelerator: accelerator=\"tpu\", devices, "
                    "strategy \"xla\" (or none), no gpus; Lightning 2's XLA precisions are \"32-true\", \"16-true\" "
                    "and \"bf16-true\" (16-mixed is refused)")


def _lightning(names: frozenset[str], wanted) -> str | None:
    """The last part of a Lightning qualified name that ``wanted`` accepts, else None."""
    for name in sorted(names):
        if name.split(".")[0] in LIGHTNING_PACKAGES and wanted(name.rsplit(".", 1)[-1]):
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
            elif self._from_configuration(node):
                self._report_configuration(node, entry)
            return
        if "hydra.utils.instantiate" in qualnames and node.args and re.search(
                r"\b(trainer|fabric)\b", patterns.code_of(node.args[0].value), re.IGNORECASE):
            self._report_configuration(node, "Trainer")
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
        if keyword == "accelerator" and isinstance(arg.value, cst.Name):
            # litgpt's LLM.distribute: `accelerator = "cuda"` under a CUDA test, then Fabric(accelerator=accelerator)
            lines = [self.ctx.position(v)[0] for v in bound_values(self.ctx, arg.value)
                     if v is not None and patterns.string_value(v) in ("gpu", "cuda")]
            if lines:
                return f"accelerator={text} (bound to a CUDA name at line {lines[0]})"
        if keyword in ("strategy", "plugins"):
            if value is not None and _CUDA_STRATEGY_NAME.match(value):
                return f"{keyword}={text}"
            if isinstance(arg.value, cst.Call) and _lightning(self.ctx.qualnames(arg.value.func),
                                                              _CUDA_STRATEGY_CLASS.match):
                return f"{keyword}={text}"
        return None

    @staticmethod
    def _from_configuration(node: cst.Call) -> bool:
        """Arguments unpacked from something (``**cfg``, ``*args``) and no accelerator spelled at the call."""
        spelled = {arg.keyword.value for arg in node.args if arg.keyword is not None}
        return "accelerator" not in spelled and any(arg.star for arg in node.args)

    def _report_configuration(self, node: cst.Call, entry: str) -> None:
        call = " ".join(patterns.code_of(node).split())
        call = call if len(call) <= 60 else call[:57] + "..."
        defaults = self._cuda_config_defaults()
        where = (f"; in this file {', '.join(defaults)} ask for CUDA" if defaults
                 else "; this tool cannot read which device and strategy it asks for")
        self.finding(node, f"{call}: a Lightning {entry} built from configuration: it must ask for the XLA "
                     f"accelerator, or on an XLA host it fails before training or trains on the CPU{where}",
                     _FROM_CONFIG_FIX)

    def _cuda_config_defaults(self) -> list[str]:
        """``accelerator: str = "gpu"``-like class fields of this file (a config class's defaults), as text."""
        def found() -> list[str]:
            out = []
            for klass in self.ctx.module.body:
                if not isinstance(klass, cst.ClassDef):
                    continue
                for line in klass.body.body:
                    for small in line.body if isinstance(line, cst.SimpleStatementLine) else ():
                        target = getattr(small, "target", None) or next(
                            (t.target for t in getattr(small, "targets", ())), None)
                        value = getattr(small, "value", None)
                        if not isinstance(target, cst.Name) or target.value not in _CONFIG_KEYS or value is None:
                            continue
                        argument = self._cuda_argument(cst.Arg(value=value, keyword=cst.Name(target.value)))
                        if argument is not None:
                            line_number = self.ctx.position(small)[0]
                            out.append(f"{klass.name.value}.{argument} (line {line_number})")
            return out
        return self.ctx.once(("lightning-config-defaults",), found)

    def _argument_of_entry(self, node: cst.Call) -> bool:
        """``Trainer(strategy=DDPPlugin(...))``: the Trainer's finding names it."""
        arg = self.ctx.parent(node)
        call = self.ctx.parent(arg) if isinstance(arg, cst.Arg) else None
        return isinstance(call, cst.Call) and _lightning(self.ctx.qualnames(call.func),
                                                        lambda last: last in _ENTRIES) is not None
