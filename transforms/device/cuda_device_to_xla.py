"""XLA101 cuda-device-to-xla: CUDA devices become the target's XLA device.

What it does:
    Rewrites every way a script names a CUDA device to the target's XLA device: ``torch.device("cuda")``,
    ``torch.device("cuda:0")``, ``torch.device(f"cuda:{rank}")``, ``torch.device("cuda", i)``,
    ``"cuda" if torch.cuda.is_available() else "cpu"`` (and the ``torch.device`` of it) where a device is
    assigned, ``torch.device("cuda") if ... else torch.device("cpu")`` wherever it is (as a whole, also with a
    CUDA device in both branches: ``torch.device(f"cuda:{rank}") if rank else torch.device("cuda")``),
    ``.to("cuda")``, ``.cuda()`` / ``.cuda(non_blocking=True)`` on tensors and modules, and ``device="cuda"``
    keyword arguments. An integer used as a device is CUDA device N: ``.to(0)``, ``.to(gpu_ids[0])``,
    ``.to(device=self.gpu_ids[0])``, ``.to(args.gpu)``, ``torch.device(gpu_id)`` and ``device=1`` of a torch
    call become the XLA device where they are used (the list of ids is left as it is). Where a device is needed and the script has no device variable in scope,
    ``device = <XLA device>`` is bound once, at the top of the function (or after the imports); in a function
    that a launching program runs before its launch (called from the ``__main__`` block above ``mp.spawn``),
    each use makes the device itself (``model.to(torch_xla.device())``), so the paths that never used CUDA
    start no XLA runtime in the launcher's process.
    Scripts that build an ``accelerate.Accelerator`` are left to Accelerate (XLA605); in a module that imports
    Lightning, a name called ``accelerator`` is Lightning's accelerator name, not a torch device, and stays
    (XLA908 reports a CUDA one; Lightning's XLA accelerator is ``"tpu"``).
    A user's device indexed by the process's rank (``f"{device}:{local_rank}"``, one GPU per process) is
    reported: each XLA process owns one device, index 0.

Why:
    On XLA every process drives one device, reached through ``xm.xla_device()`` (``torch_xla.device()``
    from torch_xla 2.3; the older spelling is deprecated in 2.8). CUDA indices and the CPU fallback have no
    meaning there: the XLA device is the accelerator.

Example:
    model = Net().cuda()
    x = x.to("cuda:0", non_blocking=True)

Use instead:
    device = xm.xla_device()
    model = Net().to(device)
    x = x.to(device, non_blocking=True)
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.analysis.facts import COUNT_WORDS, is_cuda_device_expr, is_cuda_ordinal
from xla_migrate.engine.rule import ALL_TARGETS, Rule
from xla_migrate.transforms.common import lightning_accelerator

# Names that hold one GPU's index (``model.to(args.gpu)``); the rank-named ones are XLA401's in a distributed
# script, where it rewrites them with the ranks.
_GPU_INDEX_NAMES = frozenset({"gpu", "gpu_id", "gpu_idx", "gpu_index", "local_gpu", "device_id", "cuda_id",
                              "local_rank"})
_RANK_NAMES = frozenset({"gpu", "gpu_id", "local_gpu", "device_id", "local_rank"})


class CudaDeviceToXla(Rule):
    code = "XLA101"
    name = "cuda-device-to-xla"
    summary = "CUDA devices (torch.device('cuda'), .cuda(), .to('cuda'), device='cuda') -> the XLA device"
    on_xla_code = True  # CUDA remnants in code that already runs on XLA are migrated too
    targets = (*ALL_TARGETS, "torchtpu")

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        # Device expressions replaced whole (``torch.device(f"cuda:{r}") if r else torch.device("cuda")``, a
        # device definition's value): the calls inside them are not edited again.
        self._replaced_whole: set[cst.BaseExpression] = set()
        self._named: set[cst.BaseExpression] = set()  # CUDA values that became "xla"

    def _short(self, node: cst.CSTNode) -> str:
        text = " ".join(patterns.code_of(node).split())
        return text if len(text) <= 60 else text[:57] + "..."

    # Device definitions: `device = "cuda" if ... else "cpu"`, `self.device = "cuda"`.
    def visit_Assign(self, node: cst.Assign) -> None:
        self._definition(node.targets[-1].target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._definition(node.target, node.value)

    def _definition(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        if self.ctx.facts.uses_accelerate:  # Accelerate places the model and batches (XLA605)
            return
        name = patterns.dotted_name(target)
        if name is None:
            return
        if is_cuda_ordinal(name, value, self.ctx.qualnames):
            device = self.ctx.spell("device")
            self.replace(value, patterns.parsed_expression(device),
                         f"{self._short(value)} -> {device}: a CUDA ordinal used as the device")
            self._replaced_whole.add(value)
            return
        # `device_type = "cuda"` names a device *type* (autocast wants a string): the AMP rules handle it.
        if "type" in name.rsplit(".", 1)[-1] or not patterns.is_cuda_value(value):
            return
        if lightning_accelerator(self.ctx, target):
            return  # Lightning's accelerator name ("tpu" on XLA, not "xla"): XLA908 reports it
        if patterns.is_cuda_string(value):  # a plain value: it stays one, the XLA device's name
            self._to_xla_name(value, "the device's value")
            return
        residue = None if patterns.is_cuda_value(value.orelse) else self.ctx.device_flow.residue(value.test)
        if residue is not None:  # `"cuda" if use_gpu and torch.cuda.is_available() else "cpu"`
            if patterns.is_cuda_string(value.body):
                self._to_xla_name(value.body, "the device chosen by the test")
            return
        device = self._device_at(value)
        if ("device_string" in self.ctx.target.spellings and isinstance(value, cst.IfExp)
                and patterns.is_cuda_string(value.body) and patterns.string_value(value.orelse) is not None):
            device = self.ctx.spell("device_string")  # TorchTPU: a device chosen as a string stays a string
        self.replace(value, patterns.parsed_expression(device), f"{self._short(value)} -> {device}")
        self._replaced_whole.add(value)

    def visit_FormattedString(self, node: cst.FormattedString) -> None:
        """``f"{device}:{local_rank}"`` (one GPU per process, picked by the local rank) of a device the user
        chooses, whose CUDA value became XLA's name: under PJRT each process owns one device, ``xla:0``, so
        every process but local rank 0 would ask for a device it does not have."""
        if self.ctx.facts.uses_accelerate or "cuda" not in self.ctx.input_code:
            return
        parts = node.parts
        if not (len(parts) == 3 and isinstance(parts[0], cst.FormattedStringExpression)
                and isinstance(parts[1], cst.FormattedStringText) and parts[1].value == ":"
                and isinstance(parts[2], cst.FormattedStringExpression)):
            return
        index = patterns.code_of(parts[2].expression).lower()
        if not any(word in index for word in ("rank", "ordinal")):
            return
        if not self.ctx.device_flow.cpu_capable(parts[0].expression):
            return
        # Named in words: spelling the XLA device here would import its module for a message.
        self.finding(node, f"{self._short(node)}: a device indexed by the process's rank: on XLA each process "
                     "owns one device, whose index is 0, so every process but the first asks for a device it "
                     "does not have (RuntimeError)", "drop the index: keep the device's name (the XLA runtime "
                     "gives each process its own device)")

    def _device_at(self, node: cst.CSTNode) -> str:
        """The XLA device, spelled for where ``node`` is evaluated: the plain value where making it would
        start the runtime too early (a default or decorator; module level in a launching program)."""
        if self.ctx.evaluated_at_definition(node) or (
                self.ctx.import_time_device_is_lazy and self.ctx.function_scope(node) is self.ctx.scopes.get(
                    self.ctx.module)):
            return self.ctx.spell("lazy_device")
        return self.ctx.spell("device")

    def _to_xla_name(self, literal: cst.BaseExpression, what: str) -> None:
        if literal in self._named:
            return
        self._named.add(literal)
        value = self.ctx.spell("device_name")
        quote = "'" if isinstance(literal, cst.SimpleString) and literal.value.startswith("'") else '"'
        self.replace(literal, cst.SimpleString(value.replace('"', quote)),
                     f"{self._short(literal)} -> {value}: {what} (the {self.ctx.device_words}'s name; the CPU stays a "
                     "choice)")
        self._replaced_whole.add(literal)

    def leave_Module(self, original_node: cst.Module) -> None:
        if self.ctx.facts.uses_accelerate or "cuda" not in self.ctx.input_code:
            return
        for literal in self.ctx.device_flow.option_literals:
            if not self._in_replaced_whole(literal):
                self._to_xla_name(literal, "a device option's value")

    def _in_replaced_whole(self, node: cst.CSTNode) -> bool:
        """Inside a device expression replaced as a whole (an edit of a part would overlap the whole one)."""
        current: cst.CSTNode | None = node
        while current is not None and not isinstance(current, (cst.BaseSmallStatement, cst.BaseStatement)):
            if current in self._replaced_whole:
                return True
            current = self.ctx.parent(current)
        return False

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        if ctx.facts.uses_accelerate or (self._replaced_whole and self._in_replaced_whole(node)):
            return
        # TorchTPU's device is the current accelerator: its own spelling is not rewritten again.
        if ctx.target.runtime == "torch_xla" and ctx.is_call_to(node, "torch.accelerator.current_accelerator"):
            device = ctx.spell("lazy_device")
            self.replace(node, patterns.parsed_expression(device), f"{self._short(node)} -> {device}")
            return
        if ctx.is_call_to(node, "torch.device"):
            if is_cuda_device_expr(node, ctx.qualnames) or self._accelerator_string(node) or self._ordinal_call(node):
                self._device_call(node)
            return
        if patterns.method_call(node, "cuda") and not ctx.qualnames(node.func) & {"torch.cuda"}:
            self._dot_cuda(node)
            return
        to = patterns.method_call(node, "to")
        if to:
            args = patterns.positional(node)
            if args and patterns.is_cuda_value(args[0].value):
                self._use_device(args[0].value)
            elif args and self._cuda_ordinal(args[0].value, rank_is_401s=True):
                self._use_device(args[0].value, "an integer device is CUDA device N")
        device_keyword = patterns.keyword(node, "device")
        if device_keyword is not None and patterns.is_cuda_value(device_keyword.value):
            self._use_device(device_keyword.value)
        elif device_keyword is not None and (to or any(q.startswith("torch.") for q in ctx.qualnames(node.func))) \
                and self._cuda_ordinal(device_keyword.value):
            self._use_device(device_keyword.value, "an integer device is CUDA device N")

    def _cuda_ordinal(self, node: cst.BaseExpression, rank_is_401s: bool = False) -> bool:
        """An integer used as a device, which names CUDA device N (``.to(0)``, ``.to(gpu_ids[0])``,
        ``.to(device=self.gpu_ids[0])``, ``.to(args.gpu)``, ``torch.randn(n, device=1)``): an int literal, an
        element of a list of GPU ids, or a value named as one GPU's index. In a distributed script a rank-named
        index of a positional ``.to()`` is XLA401's (``model.to(local_rank)``): ``rank_is_401s``."""
        if isinstance(node, cst.Integer):
            return True
        if isinstance(node, cst.Subscript):  # gpu_ids[0], self.gpus[0], device_ids[0]
            name = patterns.dotted_name(node.value)
            words = set((name or "").rsplit(".", 1)[-1].lower().split("_"))
            return bool(words & {"gpu", "gpus", "gpuids"} or {"device", "ids"} <= words) \
                and not words & COUNT_WORDS and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index)
        name = patterns.dotted_name(node)
        return (name is not None and name.rsplit(".", 1)[-1] in _GPU_INDEX_NAMES
                and not (rank_is_401s and self.ctx.distributed and name.rsplit(".", 1)[-1] in _RANK_NAMES))

    def _ordinal_call(self, node: cst.Call) -> bool:
        """``torch.device(0)``, ``torch.device(gpu_ids[0])``: CUDA device N."""
        args = node.args
        return len(args) == 1 and args[0].keyword is None and self._cuda_ordinal(args[0].value)

    def _accelerator_string(self, node: cst.Call) -> bool:
        """``torch.device(f"{torch.accelerator.current_accelerator()}:{rank}")``."""
        args = patterns.positional(node)
        first = args[0].value if args else None
        return isinstance(first, cst.FormattedString) and any(
            isinstance(part, cst.FormattedStringExpression) and isinstance(part.expression, cst.Call)
            and self.ctx.is_call_to(part.expression, "torch.accelerator.current_accelerator")
            for part in first.parts)

    def _device_call(self, node: cst.Call) -> None:
        parent = self.ctx.parent(node)
        args = patterns.positional(node)
        first = args[0].value if args else None
        if (isinstance(first, cst.IfExp) and not is_cuda_device_expr(first.orelse, self.ctx.qualnames)
                and self.ctx.device_flow.residue(first.test) is not None):
            # `torch.device("cuda" if use_cuda else "cpu")`: the user's part of the test still chooses.
            self._choice(node, first)
            return
        if isinstance(parent, cst.IfExp) and parent.body is node and self._tensor_device(parent):
            tensor = parent.test.value
            self.replace(parent, lambda u: u.test.with_changes(attr=cst.Name("device"), lpar=u.lpar, rpar=u.rpar),
                         f"{self._short(parent)} -> {self._short(tensor)}.device")
            self._replaced_whole.add(parent)
            return
        if (isinstance(parent, cst.IfExp) and parent.body is node
                and not is_cuda_device_expr(parent.orelse, self.ctx.qualnames)
                and self.ctx.device_flow.residue(parent.test) is not None):
            device = self._device_at(node)
            self.replace(node, patterns.parsed_expression(device), f"{self._short(node)} -> {device} (the test "
                         "still chooses the CPU)")
            self._replaced_whole.add(node)
            return
        if isinstance(parent, cst.IfExp) and parent.body is node:
            # `torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")` is the device as a
            # whole (replacing the call alone would leave XLA104 a gate to fold in a second run).
            node, parent = parent, self.ctx.parent(parent)
        if isinstance(parent, (cst.Assign, cst.AnnAssign)) and parent.value is node:
            device = self._device_at(node)
            self.replace(node, patterns.parsed_expression(device), f"{self._short(node)} -> {device}")
        else:
            self._use_device(node)
        self._replaced_whole.add(node)

    def _tensor_device(self, node: cst.IfExp) -> bool:
        """``torch.device("cuda") if x.is_cuda else torch.device("cpu")``: the device of ``x``."""
        test = node.test
        return (isinstance(test, cst.Attribute) and test.attr.value == "is_cuda"
                and isinstance(node.orelse, cst.Call) and self.ctx.is_call_to(node.orelse, "torch.device")
                and not is_cuda_device_expr(node.orelse, self.ctx.qualnames))

    def _choice(self, node: cst.Call, choice: cst.IfExp) -> None:
        """``torch.device("cuda" if T else "cpu")`` -> ``<XLA device> if T else torch.device("cpu")``."""
        device = patterns.parsed_expression(self._device_at(node))

        def chosen(updated: cst.Call) -> cst.BaseExpression:
            inner = patterns.positional(updated)[0].value
            cpu = updated.with_changes(args=[cst.Arg(inner.orelse)], lpar=[], rpar=[])
            return cst.IfExp(test=inner.test, body=device, orelse=cpu, lpar=updated.lpar, rpar=updated.rpar)

        self.replace(node, chosen, f"{self._short(node)} -> {patterns.code_of(device)} if "
                     f"{self._short(choice.test)} else torch.device(...): the test still chooses the CPU")
        self._replaced_whole.add(node)

    def _use_device(self, node: cst.BaseExpression, why: str = "") -> None:
        if patterns.is_cuda_string(node) and node in self.ctx.device_flow.option_literals:
            return  # an option's value: leave_Module names it "xla"
        device = self.ctx.device_reference(node, self.code)
        self.replace(node, patterns.parsed_expression(device), f"{self._short(node)} -> {device}"
                     + (f": {why}" if why else ""))

    def _dot_cuda(self, node: cst.Call) -> None:
        device = self.ctx.device_reference(node, self.code)
        kept = [a for a in node.args if a.keyword is not None and a.keyword.value != "device"]
        device_arg = cst.Arg(patterns.parsed_expression(device))

        def to_device(updated: cst.Call) -> cst.Call:
            # The device index (positional or `device=`) means nothing on XLA; other options are kept.
            updated_kept = [a for a in updated.args if a.keyword is not None and a.keyword.value != "device"]
            args = [device_arg.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                    if updated_kept else device_arg, *updated_kept]
            return updated.with_changes(func=updated.func.with_changes(attr=cst.Name("to")),
                                        args=patterns.without_trailing_comma(args))

        self.replace(node, to_device, f".cuda() -> .to({device}{', ...' if kept else ''})")
