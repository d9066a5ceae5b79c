"""XLA409 torch-load-map-location: checkpoints mapped to a CUDA device load on the CPU instead.

What it does:
    Rewrites the ``map_location`` of ``torch.load`` when it names a CUDA device: ``"cuda"``, ``"cuda:0"``,
    ``f"cuda:{rank}"``, ``"cuda:{}".format(gpu)``, ``"cuda:%d" % rank``, ``torch.device("cuda", rank)``, ``{"cuda:0": f"cuda:{rank}"}``, or a
    ``lambda storage, loc: storage.cuda(rank)`` -> ``map_location="cpu"``. When the loaded value goes into
    ``load_state_dict`` (directly, or through the name it is assigned to) nothing else is needed: loading
    a state dict copies each tensor onto the device of the parameter it fills. Otherwise a finding says to
    move the loaded tensors to the device. Applies to every script, distributed or not.

Why:
    There is no CUDA device on XLA, so a CUDA ``map_location`` fails. Loading onto the XLA device directly
    is not the fix either: every worker would hold a second copy of the checkpoint on its device. The CPU
    copy is moved into place by ``load_state_dict``.

Example:
    checkpoint = torch.load(path, map_location=f"cuda:{local_rank}")
    model.load_state_dict(checkpoint["model"])

Use instead:
    checkpoint = torch.load(path, map_location="cpu")
    model.load_state_dict(checkpoint["model"])
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.analysis.facts import is_cuda_device_expr
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.common import short

LOADS = ("torch.load", "torch.serialization.load")


class TorchLoadMapLocation(Rule):
    code = "XLA409"
    name = "torch-load-map-location"
    summary = "torch.load(..., map_location='cuda:N' / f'cuda:{rank}') -> map_location='cpu'"
    on_xla_code = True  # CUDA remnants in code that already runs on XLA are migrated too

    def visit_Call(self, node: cst.Call) -> None:
        if not self.ctx.is_call_to(node, *LOADS):
            return
        location = patterns.keyword(node, "map_location")
        if location is None:
            positional = patterns.positional(node)
            location = positional[1] if len(positional) > 1 else None
        if location is None or not self._is_cuda(location.value):
            return
        new = cst.SimpleString('"cpu"')
        self.replace(location.value, new, f"map_location={short(location.value)} -> \"cpu\" "
                     "(load_state_dict copies onto the device)")
        if not self._feeds_state_dict(node):
            self.finding(node, f"{short(node)}: the checkpoint now loads on the CPU",
                         "move the loaded tensors to the XLA device (.to(device)) or load them with load_state_dict")

    def _is_cuda(self, node: cst.BaseExpression) -> bool:
        if is_cuda_device_expr(node, self.ctx.qualnames):
            return True
        if isinstance(node, cst.Dict):
            return any(isinstance(e, cst.DictElement) and (patterns.is_cuda_string(e.value) or
                                                           patterns.is_cuda_string(e.key)) for e in node.elements)
        if isinstance(node, cst.Lambda):
            return bool(patterns.find_all(node.body, lambda n: patterns.method_call(n, "cuda") is not None))
        return False

    def _feeds_state_dict(self, node: cst.Call) -> bool:
        ctx = self.ctx
        current: cst.CSTNode | None = ctx.parent(node)
        while isinstance(current, (cst.Arg, cst.Subscript, cst.SubscriptElement, cst.Index)):
            current = ctx.parent(current)
            if isinstance(current, cst.Call) and patterns.method_call(current, "load_state_dict"):
                return True
        parent = ctx.parent(node)
        if not (isinstance(parent, cst.Assign) and len(parent.targets) == 1
                and isinstance(parent.targets[0].target, cst.Name)):
            return False
        name = parent.targets[0].target.value
        scope = ctx.scopes.get(parent.targets[0].target)
        if scope is None:
            return False
        uses = [access.node for assignment in scope.assignments[name] if assignment.node is parent.targets[0].target
                for access in assignment.references]
        if not uses:
            uses = [access.node for access in scope.accesses[name]]
        def into_state_dict(use: cst.CSTNode) -> bool:
            current = ctx.parent(use)
            while isinstance(current, (cst.Arg, cst.Subscript, cst.SubscriptElement, cst.Index)):
                current = ctx.parent(current)
                if isinstance(current, cst.Call) and patterns.method_call(current, "load_state_dict"):
                    return True
            return False

        return bool(uses) and any(into_state_dict(u) for u in uses)
