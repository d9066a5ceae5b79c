"""What code still needs CUDA once the rules' edits are applied: the question a CUDA gate is decided by.

A gate folded to its accelerator value (``if torch.cuda.is_available():`` -> the branch, unconditionally) may
only turn on code the migration made XLA-correct. ``CudaOnly.constructs(node)`` lists what in ``node`` would
still fail or mislead on XLA after the edits recorded so far: streams, events and CUDA graphs, memory
statistics, CUDA device queries and RNG state, legacy CUDA tensor types used otherwise than XLA105 rewrites
them, ``torch.nn.DataParallel``, ``fused=True``, an inductor ``torch.compile``, NVTX, cuDNN queries, Triton /
apex / CuPy / flash-attn / xformers / Liger kernels. What another rule replaces or removes does not count
(checked as XLA900 does: the node, or an ancestor whose replacement does not keep it, is edited).

``messages_only(block)`` says whether a branch only prints or logs about CUDA ("WARNING: you have a CUDA
device"): on XLA such a message is wrong, so the gate keeps it off.
"""

from __future__ import annotations

import re

import libcst as cst

from ..syntax import patterns, walk

# torch.cuda.<name> that needs a CUDA driver, or answers a question only CUDA can (False / 0 without it).
_STREAMS = ("Stream", "stream", "current_stream", "default_stream", "set_stream", "ExternalStream", "StreamContext",
            "Event", "graph", "CUDAGraph", "make_graphed_callables", "graph_pool_handle", "graphs")
_MEMORY = ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved", "memory_cached",
           "max_memory_cached", "memory_stats", "memory_stats_as_nested_dict", "memory_summary", "memory_snapshot",
           "mem_get_info", "list_gpu_processes", "utilization", "memory_usage", "temperature", "power_draw",
           "caching_allocator_alloc", "set_per_process_memory_fraction")
_QUERIES = ("device_count", "get_device_properties", "get_device_capability", "current_device", "get_arch_list",
            "is_bf16_supported", "device_of", "get_rng_state", "get_rng_state_all", "set_rng_state",
            "set_rng_state_all", "comm", "nccl", "jiterator", "tunable", "can_device_access_peer", "cudart")
LEGACY_TYPES = ("FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "ByteTensor", "CharTensor",
                "ShortTensor", "IntTensor", "LongTensor", "BoolTensor")
DATA_PARALLEL = ("torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                 "torch.nn.parallel.data_parallel.DataParallel", "torch.nn.parallel.data_parallel")
COMPILE = ("torch.compile",)
# Libraries of CUDA kernels (a name rooted in one is CUDA-only).
KERNEL_LIBRARIES = ("triton", "apex", "cupy", "pycuda", "numba.cuda", "flash_attn", "xformers", "liger_kernel",
                    "bitsandbytes", "torch.utils.cpp_extension", "transformer_engine", "fused_dense_lib",
                    "dropout_layer_norm", "rotary_emb", "mamba_ssm", "causal_conv1d")
# Keywords that ask CUDA-only implementations of an optimizer or op when true.
CUDA_KEYWORDS = ("fused",)
_CUDA_WORDS = re.compile(r"\b(cuda|gpus?|nvidia|cudnn)\b", re.IGNORECASE)
_MESSAGE_CALLS = ("print", "warnings.warn", "logging.info", "logging.warning", "logging.warn", "logging.debug",
                  "logging.error")
_LOGGER_METHODS = ("info", "warning", "warn", "debug", "error", "print", "log")


def _cuda_api(name: str) -> str | None:
    """What a qualified name under torch.cuda / torch.backends.cudnn is, when CUDA-only, else None."""
    if name.startswith("torch.cuda.nvtx"):
        return "NVTX range"
    if name.startswith("torch.backends.cudnn.") and name.rsplit(".", 1)[-1] in ("is_available", "version"):
        return "cuDNN query"
    if name == "torch.version.cuda":
        return "CUDA version"
    if not name.startswith("torch.cuda."):
        return None
    rest = name[len("torch.cuda."):]
    for prefix in ("memory.", "streams.", "graphs.", "random.", "amp."):
        rest = rest[len(prefix):] if rest.startswith(prefix) else rest
    if rest in _STREAMS:
        return "CUDA stream/event/graph"
    if rest in _MEMORY:
        return "CUDA memory statistic"
    if rest in _QUERIES:
        return "CUDA-only query"
    if rest.endswith("Tensor") and "." not in rest:
        return "CUDA tensor type"
    return None


def _library(name: str) -> str | None:
    for library in KERNEL_LIBRARIES:
        if name == library or name.startswith(library + "."):
            return library
    return None


class CudaOnly:
    """Asks the context's qualified names and the edits recorded so far (``ctx.edits``)."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx

    # The question ----------------------------------------------------------------------------------------
    def constructs(self, node: cst.CSTNode, ignore: tuple[cst.CSTNode, ...] = ()) -> list[tuple[cst.CSTNode, str]]:
        """The CUDA-only constructs in ``node`` that stay after the edits (in source order), each with what it
        is. ``ignore``: subtrees not to look into (the gate's own test)."""
        found: list[tuple[cst.CSTNode, str]] = []
        stack = [node]
        while stack:
            current = stack.pop()
            if current in ignore:
                continue
            what = self._what(current)
            if what is not None:
                if not self.dropped(current):
                    found.append((current, what))
                continue
            stack.extend(reversed(walk.children(current)))
        return found

    def dropped(self, node: cst.CSTNode) -> bool:
        """The output will not hold ``node``: it, or an ancestor whose replacement does not keep it, is
        replaced or removed by a rule (what XLA900 asks too)."""
        edits = self.ctx.edits
        current: cst.CSTNode | None = node
        while current is not None:
            if current in edits.remove:
                return True
            replacements = edits.replace.get(current)
            if replacements:
                _, factory = replacements[0]
                try:
                    result = factory(current)
                except Exception:  # a factory that only works on updated nodes: assume it keeps the node
                    result = None
                if result is not None and not _contains(result, node):
                    return True
            current = self.ctx.parent(current)
        return False

    # What a node is --------------------------------------------------------------------------------------
    def _what(self, node: cst.CSTNode) -> str | None:
        ctx = self.ctx
        if isinstance(node, (cst.Attribute, cst.Name)):
            parent = ctx.parent(node)
            if isinstance(parent, cst.Attribute) and parent.value is node:
                return None  # the whole chain is judged (``torch.cuda.Event``, not ``torch.cuda``)
            for name in sorted(ctx.qualnames(node)):
                what = _cuda_api(name)
                if what == "CUDA tensor type" and self._rewritten_type_use(node):
                    return None
                if what is not None:
                    return f"{what} {name}"
                if name in DATA_PARALLEL:
                    return "torch.nn.DataParallel"
                library = _library(name)
                if library is not None:
                    return f"{library} (CUDA kernels)"
            return None
        if isinstance(node, cst.Call):
            if ctx.is_call_to(node, *COMPILE) and not _openxla(node):
                return "torch.compile (the inductor backend cannot compile XLA tensors)"
            for keyword in CUDA_KEYWORDS:
                arg = patterns.keyword(node, keyword)
                if arg is not None and isinstance(arg.value, cst.Name) and arg.value.value == "True":
                    return f"{keyword}=True (a CUDA-only implementation)"
        if isinstance(node, cst.Decorator) and not isinstance(node.decorator, cst.Call):
            if ctx.qualnames(node.decorator) & set(COMPILE):
                return "torch.compile (the inductor backend cannot compile XLA tensors)"
        return None

    def _rewritten_type_use(self, node: cst.CSTNode) -> bool:
        """A legacy CUDA tensor type where XLA105 rewrites it: called (``torch.cuda.FloatTensor(n)``) or passed
        to ``.type()``."""
        parent = self.ctx.parent(node)
        if isinstance(parent, cst.Call) and parent.func is node:
            return node.attr.value in LEGACY_TYPES if isinstance(node, cst.Attribute) else True
        if isinstance(parent, cst.Arg):
            call = self.ctx.parent(parent)
            return isinstance(call, cst.Call) and patterns.method_call(call, "type") is not None
        return False

    # Messages about CUDA ----------------------------------------------------------------------------------
    def messages_only(self, suite: cst.BaseSuite) -> bool:
        """Every statement of the branch prints, warns or logs a text that speaks of CUDA or GPUs."""
        statements = suite.body if isinstance(suite, cst.IndentedBlock) else [suite]
        smalls: list[cst.BaseSmallStatement] = []
        for statement in statements:
            if not isinstance(statement, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
                return False
            smalls.extend(statement.body)
        return bool(smalls) and all(self._cuda_message(s) for s in smalls)

    def _cuda_message(self, statement: cst.BaseSmallStatement) -> bool:
        if not (isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call)):
            return False
        call = statement.value
        names = self.ctx.qualnames(call.func) | {patterns.dotted_name(call.func) or ""}
        method = patterns.method_call(call, *_LOGGER_METHODS)
        if not (names & set(_MESSAGE_CALLS) or method is not None):
            return False
        texts = patterns.find_all(call, lambda n: isinstance(n, (cst.SimpleString, cst.FormattedStringText)))
        return any(_CUDA_WORDS.search(patterns.string_value(t) or "" if isinstance(t, cst.SimpleString) else t.value)
                   for t in texts)


def _openxla(call: cst.Call) -> bool:
    backend = patterns.keyword(call, "backend")
    return backend is not None and patterns.string_value(backend.value) == "openxla"


def _contains(tree: cst.CSTNode | cst.FlattenSentinel, target: cst.CSTNode) -> bool:
    stack = list(tree.nodes) if isinstance(tree, cst.FlattenSentinel) else [tree]
    while stack:
        node = stack.pop()
        if node is target:
            return True
        stack.extend(walk.children(node))
    return False
