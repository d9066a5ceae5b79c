"""The torch_xla APIs the torchtpu upgrade (XLA703, XLA704) knows, by qualified name. Not a rule."""

from __future__ import annotations

import libcst as cst

XM = "torch_xla.core.xla_model"
XR = "torch_xla.runtime"


def both(*names: str) -> tuple[str, ...]:
    """``torch_xla.device`` is also reachable as ``torch_xla.torch_xla.device`` (where it is defined)."""
    return names + tuple(n.replace("torch_xla.", "torch_xla.torch_xla.", 1) for n in names if n.count(".") == 1)


# XLA703: the single-device idioms.
DEVICE = both(f"{XM}.xla_device", "torch_xla.device")
BARRIER = both(f"{XM}.mark_step", "torch_xla.sync")
WAIT = (f"{XM}.wait_device_ops",)
# "TPU" / "GPU" / "CPU": the device's hardware (a gate such as `!= "CPU"` for autocast).
DEVICE_HW = (f"{XM}.xla_device_hw",)
OPTIMIZER_STEP = (f"{XM}.optimizer_step",)
DEVICE_LOADER = ("torch_xla.distributed.parallel_loader.MpDeviceLoader",)
PARALLEL_LOADER = ("torch_xla.distributed.parallel_loader.ParallelLoader",)
SAVE = (f"{XM}.save",)
STEP_CLOSURE = (f"{XM}.add_step_closure",)
SYNCFREE = tuple(f"torch_xla.amp.syncfree.{name}" for name in ("SGD", "Adam", "AdamW"))
AUTOCAST = ("torch_xla.amp.autocast", "torch_xla.amp.autocast_mode.autocast")
SEEDS = (f"{XM}.set_rng_state", *both("torch_xla.manual_seed"))
CACHE = (f"{XR}.initialize_cache",)
# torch's own APIs that name the device type: "xla" in them becomes "tpu".
TYPED = ("torch.autocast", "torch.amp.autocast", "torch.amp.GradScaler", "torch.device")
# torch_xla's GradScaler is XLA202's (removed with its calls where the target has no scaler).
SCALERS = ("torch_xla.amp.GradScaler", "torch_xla.amp.grad_scaler.GradScaler")
SINGLE_DEVICE = (SCALERS + DEVICE + BARRIER + WAIT + DEVICE_HW + OPTIMIZER_STEP + DEVICE_LOADER + PARALLEL_LOADER + SAVE
                 + STEP_CLOSURE + SYNCFREE + AUTOCAST + SEEDS + CACHE)

# XLA704: ranks, launch, collectives, SPMD.
ORDINAL = (f"{XM}.get_ordinal", f"{XR}.global_ordinal")
WORLD_SIZE = (f"{XM}.xrt_world_size", f"{XR}.world_size")
LOCAL_ORDINAL = (f"{XM}.get_local_ordinal", f"{XR}.local_ordinal")
IS_MASTER = (f"{XM}.is_master_ordinal",)
LAUNCH = ("torch_xla.distributed.xla_multiprocessing.spawn", *both("torch_xla.launch"))
COLLECTIVES = tuple(f"{XM}.{name}" for name in (
    "all_reduce", "_fetch_gradients", "collective_broadcast", "all_gather", "rendezvous", "reduce_scatter",
    "mesh_reduce", "all_to_all", "reduce_gradients"))
SPMD_PREFIXES = ("torch_xla.distributed.spmd", "torch_xla.experimental.spmd_fully_sharded_data_parallel",
                 "torch_xla.experimental.xla_sharding")
SPMD = (f"{XR}.use_spmd", f"{XR}.global_runtime_device_count", f"{XR}.process_count", f"{XR}.process_index")
DISTRIBUTED = ORDINAL + WORLD_SIZE + LOCAL_ORDINAL + IS_MASTER + LAUNCH + COLLECTIVES + SPMD


def is_torch_xla(name: str) -> bool:
    return name == "torch_xla" or name.startswith("torch_xla.")


def quoted_for(code: str, inside_fstring_quote: str | None) -> str:
    """``code`` (a spelling with double-quoted strings) fit for an f-string delimited by double quotes, where
    the same quote ends the string before Python 3.12."""
    return code.replace('"', "'") if inside_fstring_quote and '"' in inside_fstring_quote else code


def fstring_quote(ctx, node: cst.CSTNode) -> str | None:
    """The opening quote of the f-string ``node`` is inside, or None."""
    current = ctx.parent(node)
    while current is not None and not isinstance(current, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
        if isinstance(current, cst.FormattedString):
            return current.start
        current = ctx.parent(current)
    return None
