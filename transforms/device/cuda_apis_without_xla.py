"""XLA103 cuda-apis-without-xla-form: torch.cuda APIs with no safe XLA rewrite are reported with what to do.

What it does:
    Reports, with the line and what to do, the ``torch.cuda`` APIs that have no drop-in XLA form:
    memory statistics (``memory_allocated``, ``max_memory_allocated``, ``memory_reserved``,
    ``memory_summary``, ``mem_get_info``...), device queries (``device_count``, ``current_device``,
    ``get_device_properties``, ``get_device_capability``), CUDA tensor types other than the legacy ones
    XLA105 rewrites (``torch.cuda.FloatTensor`` and friends), streams, events and CUDA graphs (``torch.cuda.Stream``, ``torch.cuda.stream(...)``,
    ``torch.cuda.Event``, ``torch.cuda.graph``), and NVTX ranges. Nothing is rewritten. Any spelling is
    recognised (``import torch as T``, ``from torch.cuda import Event``).

Why:
    Each has an XLA counterpart only in a different shape: ``xm.get_memory_info(device)`` returns other
    keys in each torch_xla release; an XLA process drives one device, so device counts and indices mean
    something else (the number of processes is the world size); XLA schedules device work itself, with no
    user streams or events; timing needs ``xm.wait_device_ops()`` around a host clock. A rewrite would
    guess, so a person decides.

Example:
    print(torch.cuda.max_memory_allocated() / 2**20)
    start = torch.cuda.Event(enable_timing=True)

Use instead:
    # findings, e.g. "line 1: CUDA memory statistics have no exact XLA counterpart:
    # use xm.get_memory_info(device), or drop the statistic"
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.analysis.cuda_only import CudaOnly
from xla_migrate.engine.rule import Rule, torch_names_only
from xla_migrate.engine.targets import MODULE_PLACEHOLDERS
from xla_migrate.transforms.device.legacy_cuda_tensor_types import DTYPES as LEGACY_TYPES

_MEMORY = ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved", "memory_cached",
           "max_memory_cached", "memory_stats", "memory_stats_as_nested_dict", "memory_summary", "memory_snapshot",
           "mem_get_info", "list_gpu_processes", "utilization", "memory_usage", "temperature", "power_draw")
_STREAMS = ("Stream", "stream", "current_stream", "default_stream", "set_stream", "ExternalStream",
            "StreamContext", "Event", "graph", "CUDAGraph", "make_graphed_callables", "graph_pool_handle")
_DEVICES = ("device_count", "current_device", "get_device_properties", "get_device_capability", "get_arch_list",
            "is_bf16_supported", "device", "device_of")


def _api(name: str) -> str | None:
    """The kind of a qualified name, or None when it is not one of the APIs this rule reports."""
    if name.startswith("torch.cuda.nvtx.") or name == "torch.cuda.nvtx":
        return "nvtx"
    if not name.startswith("torch.cuda."):
        return None
    rest = name[len("torch.cuda."):]
    for prefix in ("memory.", "streams.", "graphs.", "random."):
        rest = rest[len(prefix):] if rest.startswith(prefix) else rest
    if rest in _MEMORY:
        return "memory"
    if rest in _STREAMS:
        return "stream"
    if rest in _DEVICES:
        return rest
    if rest.endswith("Tensor") and "." not in rest and rest not in LEGACY_TYPES:
        return "tensor_type"
    return None


class CudaApisWithoutXlaForm(Rule):
    code = "XLA103"
    name = "cuda-apis-without-xla-form"
    summary = "torch.cuda memory statistics, device queries, tensor types, streams and events: reported"
    on_xla_code = True  # it only reports, on code already on XLA too (its CUDA paths included)
    reports_only = True

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._found: list[tuple[cst.CSTNode, str, str]] = []

    def _spelled(self, concept: str, *args: str) -> str:
        """The target's spelling for advice text (adds no import: nothing is rewritten)."""
        aliases = {placeholder: alias for placeholder, (_, alias) in MODULE_PLACEHOLDERS.items()}
        return self.ctx.target.spelling(concept).template.format(*args, **aliases)

    def _advice(self, kind: str) -> tuple[str, str]:
        if kind == "memory":
            return ("CUDA memory statistics have no exact XLA counterpart",
                    "use xm.get_memory_info(device) (its keys differ between torch_xla releases), "
                    "or drop the statistic")
        if kind == "stream":
            return ("CUDA streams, events and graphs do not exist on XLA",
                    "remove the stream/graph code (XLA schedules device work itself); to time a step, read a "
                    f"host clock (time.perf_counter()) after {self._spelled('wait_device_ops')}")
        if kind == "nvtx":
            return ("NVTX ranges do not exist on XLA",
                    "remove them, or mark the region with torch_xla.debug.profiler.Trace(name)")
        if kind == "tensor_type":
            return ("CUDA tensor type",
                    "create the tensor on the XLA device with a dtype (torch.zeros(n, dtype=torch.float32, "
                    "device=device)); test x.dtype and x.device instead of the tensor type")
        if kind == "device_count":
            return ("torch.cuda.device_count() counts CUDA devices, not XLA ones (0 on a TPU host)",
                    f"use 1 for this process, or {self._spelled('world_size')} for the number of processes; "
                    "drop DataParallel branches it gates")
        if kind == "current_device":
            return ("torch.cuda.current_device() has no meaning on XLA",
                    f"use the XLA device ({self._spelled('device')}), or {self._spelled('local_ordinal')} "
                    "for this process's index on the host")
        return (f"torch.cuda.{kind} has no XLA counterpart",
                f"use the XLA device ({self._spelled('device')}) and {self._spelled('device_hw', 'device')} "
                "for its kind")

    def _check(self, node: cst.Attribute | cst.Name) -> None:
        parent = self.ctx.parent(node)
        # Report the whole construct once: `torch.cuda.nvtx.range_push`, not also `torch.cuda.nvtx`.
        if isinstance(parent, cst.Attribute) and parent.value is node:
            if any(_api(n) for n in self.ctx.torch_names(parent)):
                return
        kinds = sorted({k for n in self.ctx.torch_names(node) if (k := _api(n))})
        if not kinds:
            return
        message, fix = self._advice(kinds[0])
        name = next(n for n in sorted(self.ctx.torch_names(node)) if _api(n))
        self._found.append((node, f"{message}: {name}", fix))

    def leave_Module(self, original_node: cst.Module) -> None:
        # Reported once the rewriting rules before this one have recorded their edits (XLA102 turns timing
        # events into host clocks): what they replace is not left.
        checker = CudaOnly(self.ctx)
        for node, message, fix in self._found:
            if not checker.dropped(node):
                self.finding(node, message, fix)

    @torch_names_only
    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._check(node)

    @torch_names_only
    def visit_Name(self, node: cst.Name) -> None:
        parent = self.ctx.parent(node)
        if isinstance(parent, cst.Attribute) and parent.attr is node:
            return
        self._check(node)
