"""XLA900 cuda-leftover: every CUDA-specific construct the migration leaves in the output is reported.

What it does:
    After every other rule has recorded its edits, reports each CUDA-specific construct that will still be
    in the output, one finding per construct with its line: ``torch.cuda.*`` in any spelling (``import
    torch as T``, ``from torch import cuda``, ``from torch.cuda.amp import autocast``), ``.cuda()`` and other
    ``.cuda`` attributes, ``.pin_memory()`` calls, ``torch.backends.cudnn`` / ``torch.backends.cuda`` /
    ``torch.version.cuda``, device strings (``"cuda"``, ``"cuda:0"``, ``f"cuda:{rank}"``), the ``"nccl"``
    backend, and imports of CUDA modules that stay. A construct inside code another rule replaces or removes
    is not reported, unless the replacement keeps it (``torch.cuda.FloatTensor(n).cuda()`` keeps its
    receiver); an import another rule made dead, and removes, is not reported either. Constructs another
    rule already reported at the same place are not reported twice. Nothing is rewritten.

Why:
    The migration must never leave CUDA code behind silently: on an XLA machine it fails (``.cuda()``,
    ``torch.cuda.*``), does nothing (cuDNN flags), or quietly takes a CPU path (``device == "cuda"``). With
    this rule, what the other rules could not rewrite is a finding with a line and what to do, so the
    output plus the findings account for every CUDA construct of the input.

Example:
    torch.cuda.nvtx.range_push("forward")
    dist.init_process_group(backend="nccl")

Use instead:
    # findings, e.g. "line 1: CUDA-specific code left: torch.cuda.nvtx.range_push"
    # and "line 2: CUDA-specific code left: 'nccl'"
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import GlobalScope

from xla_migrate.syntax import patterns, walk
from xla_migrate.engine.rule import ALL_TARGETS, Rule
from xla_migrate.engine.targets import MODULE_PLACEHOLDERS

CUDA_NAMES = ("cuda", "cudnn")
CUDA_MODULES = ("torch.cuda", "torch.backends.cudnn", "torch.backends.cuda", "torch.version.cuda",
                "torch.has_cuda", "torch.has_cudnn")
BACKENDS = ("nccl",)
TORCHTPU_FIX = ("write the TorchTPU form by hand: torch.accelerator for the device and its statistics, "
                "torch.autocast(\"tpu\", dtype=torch.bfloat16), backend \"tpu_dist\" for process groups")


def _cuda_qualname(names: set[str]) -> str | None:
    for name in sorted(names):
        if any(name == m or name.startswith(m + ".") for m in CUDA_MODULES):
            return name
    return None


def _contains(tree: cst.CSTNode | cst.FlattenSentinel, target: cst.CSTNode) -> bool:
    stack = list(tree.nodes) if isinstance(tree, cst.FlattenSentinel) else [tree]
    while stack:
        node = stack.pop()
        if node is target:
            return True
        stack.extend(walk.children(node))
    return False


class CudaLeftover(Rule):
    code = "XLA900"
    name = "cuda-leftover"
    summary = "every CUDA construct left in the output (torch.cuda, .cuda(), 'cuda', nccl, cudnn) is reported"
    on_xla_code = True  # it only reports, on code already on XLA too (its CUDA paths included)
    reports_only = True
    targets = (*ALL_TARGETS, "torchtpu")

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        # (node to check, node whose position is reported, text, what to do)
        self._candidates: list[tuple[cst.CSTNode, cst.CSTNode, str, str]] = []
        self._chain: set[cst.CSTNode] = set()

    def _spelled(self, concept: str) -> str:
        aliases = {placeholder: alias for placeholder, (_, alias) in MODULE_PLACEHOLDERS.items()}
        return self.ctx.target.spelling(concept).template.format(**aliases)

    # Collecting ------------------------------------------------------------------------------------------
    def _expression(self, node: cst.Attribute | cst.Name) -> None:
        parent = self.ctx.parent(node)
        if parent in self._chain and isinstance(parent, cst.Attribute) and parent.value is node:
            self._chain.add(node)  # part of a construct already collected
            return
        if isinstance(parent, cst.Attribute) and parent.attr is node:
            return
        if self._in_annotation(node):
            return  # `scaler: amp.GradScaler` runs nothing; the import that names it is reported once
        own = node.attr.value if isinstance(node, cst.Attribute) else node.value
        qualname = _cuda_qualname(self.ctx.torch_names(node))
        if qualname is None and own not in CUDA_NAMES and not self._has_cuda_part(node):
            return
        self._chain.add(node)
        text = " ".join(patterns.code_of(node).split())
        statement = self._import_statement(node)
        if statement is not None:
            fix = "remove the import once nothing uses it"
            self._candidates.append((statement, node, f"import {text}", fix))
            return
        call = parent if isinstance(parent, cst.Call) and parent.func is node else None
        if own == "cuda" and isinstance(node, cst.Attribute) and qualname is None and call is not None:
            fix = f"move it to the XLA device: .to(device), with device = {self._spelled('device')}"
            text = f".cuda() on {' '.join(patterns.code_of(node.value).split())}"
        elif own == "cuda" and qualname is None:
            fix = "a CUDA switch or attribute: check that what it gates runs on XLA"
        elif "cudnn" in (qualname or text):
            fix = "cuDNN does not exist on XLA: remove it"
        elif (qualname or text) == "torch.version.cuda":
            fix = "there is no CUDA on XLA: report torch_xla.__version__ instead, or remove it"
        else:
            fix = "use the XLA equivalent (see the XLA1xx/XLA2xx rules) or remove it"
        if call is not None and not text.startswith(".cuda()"):
            text += "()"
        self._candidates.append((call or node, self._cuda_link(node), text, fix))

    def _in_annotation(self, node: cst.CSTNode) -> bool:
        current = self.ctx.parent(node)
        while current is not None and not isinstance(current, (cst.BaseStatement, cst.Param)):
            if isinstance(current, cst.Annotation):
                return True
            current = self.ctx.parent(current)
        return False

    def _cuda_link(self, node: cst.CSTNode) -> cst.CSTNode:
        """Where a construct is reported: its ``cuda`` / ``cudnn`` name (the line a reader searches for),
        else the construct itself (``autocast`` imported from ``torch.cuda.amp``)."""
        link = node
        current = node
        while isinstance(current, (cst.Attribute, cst.Call)):
            if isinstance(current, cst.Call):  # `torch.cuda.FloatTensor(n).normal_()`: the link is in the receiver
                current = current.func
                continue
            if current.attr.value in CUDA_NAMES:
                link = current.attr
            current = current.value
        if isinstance(current, cst.Name) and current.value in CUDA_NAMES:
            link = current
        return link

    def _has_cuda_part(self, node: cst.CSTNode) -> bool:
        """An attribute chain with a ``cuda`` / ``cudnn`` link (``torch.cuda.amp``), however it resolves."""
        while isinstance(node, cst.Attribute):
            if node.attr.value in CUDA_NAMES:
                return True
            node = node.value
        return isinstance(node, cst.Name) and node.value in CUDA_NAMES

    def _import_statement(self, node: cst.CSTNode) -> cst.Import | cst.ImportFrom | None:
        current = self.ctx.parent(node)
        while current is not None and not isinstance(current, (cst.BaseStatement, cst.BaseSmallStatement)):
            current = self.ctx.parent(current)
        return current if isinstance(current, (cst.Import, cst.ImportFrom)) else None

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value == "pin_memory":
            self._pin_memory(node)
        self._expression(node)

    def _pin_memory(self, node: cst.Attribute) -> None:
        """``x.pin_memory()``: pinned host memory needs CUDA (XLA102 drops the calls it can)."""
        call = self.ctx.parent(node)
        if isinstance(call, cst.Call) and call.func is node:
            text = f".pin_memory() on {' '.join(patterns.code_of(node.value).split())}"
            self._candidates.append((call, call, text, "pinned host memory needs CUDA: drop the call (the XLA "
                                     "transfer does not use it)"))

    def visit_Name(self, node: cst.Name) -> None:
        # Most names are neither: for a name, _expression does nothing else (a name holds no chain).
        if node.value in CUDA_NAMES or self.ctx.torch_names(node):
            self._expression(node)

    def _string(self, node: cst.BaseExpression) -> None:
        if isinstance(self.ctx.parent(node), cst.ConcatenatedString):
            return
        value = patterns.string_value(node)
        if patterns.is_cuda_string(node) and self.ctx.device_flow.selects(node):
            # `impl="cuda"`, checked by `impl in ["ref", "cuda"]`: an implementation's name, not a device. Kept,
            # and said: on XLA tensors the CUDA implementation is never chosen, the other one runs.
            fix = ("nothing, unless that kernel's speed matters: the string names an implementation, not a device, "
                   "and on XLA tensors the CUDA implementation's dispatch test is False, so the other one runs")
        elif patterns.is_cuda_string(node):
            fix = f"use the XLA device ({self._spelled('device')}) or, for a device type, \"xla\""
        elif value in BACKENDS:
            fix = "XLA collectives use the \"xla\" backend (init_method=\"xla://\") or xm collectives"
        else:
            return
        self._candidates.append((node, node, patterns.code_of(node), fix))

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        self._string(node)

    def visit_FormattedString(self, node: cst.FormattedString) -> None:
        self._string(node)

    def visit_ConcatenatedString(self, node: cst.ConcatenatedString) -> None:
        self._string(node)

    # Reporting what stays ----------------------------------------------------------------------------------
    def leave_Module(self, original_node: cst.Module) -> None:
        reported = {(f.line, f.column) for f in self.ctx.findings if f.code != self.code}
        starts = {where: start for checked, where, _, _ in self._candidates
                  for start in [self.ctx.position(checked)]}
        seen: set[cst.CSTNode] = set()
        for checked, where, text, fix in self._candidates:
            if checked in seen:
                continue
            seen.add(checked)
            if self._dropped(checked) or self._dropped(where):
                continue  # the construct, or its CUDA link, is rewritten (`torch.cuda.FloatTensor(n).normal_()`)
            if isinstance(checked, (cst.Import, cst.ImportFrom)) and not self._import_stays(checked):
                continue
            if self.ctx.position(where) in reported or starts[where] in reported:
                continue
            if self.ctx.target.runtime == "torch_tpu":
                # The torchtpu target maps only part of CUDA so far (docs/guide.md, TorchTPU): say so plainly.
                self.finding(where, f"CUDA-specific code left, not migrated for torchtpu yet: {text}",
                             TORCHTPU_FIX)
                continue
            self.finding(where, f"CUDA-specific code left: {text}", fix)

    def _dropped(self, node: cst.CSTNode) -> bool:
        """The output will not hold ``node``: it, or an ancestor whose replacement does not keep it, is
        replaced or removed by some rule."""
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

    def _import_stays(self, node: cst.Import | cst.ImportFrom) -> bool:
        """An import of a CUDA module stays unless every name it binds was marked dead by a rule and every
        use of it is dropped (the engine then removes it). ``import torch.cuda`` binds ``torch``: it stays."""
        if isinstance(node, cst.ImportFrom):
            if isinstance(node.names, cst.ImportStar) or node.module is None or node.relative:
                return True
            module = patterns.dotted_name(node.module)
            bindings = [((module, alias.evaluated_name), alias.evaluated_alias or alias.evaluated_name)
                        for alias in node.names]
        else:
            if any(alias.asname is None for alias in node.names):
                return True
            bindings = [((patterns.dotted_name(alias.name), None), alias.evaluated_alias) for alias in node.names]
        scope = self.ctx.scopes.get(node)
        if not isinstance(scope, GlobalScope):
            return True  # the engine removes dead imports at module level only: a local one stays
        for key, bound in bindings:
            if key not in self.ctx.maybe_dead_imports:
                return True
            for assignment in scope.assignments[bound]:
                if any(not self._dropped(access.node) for access in assignment.references):
                    return True
        return False
