"""XLA410 dist-all-reduce-to-xm: torch.distributed.all_reduce on tensors becomes xm.all_reduce, in place.

What it does:
    In a distributed script, rewrites ``dist.all_reduce(tensor)`` and ``dist.all_reduce(tensor,
    op=dist.ReduceOp.SUM)`` (a statement on its own, the usual way to sum a metric over the workers) to
    ``xm.all_reduce("sum", [tensor])``: given a list, ``xm.all_reduce`` reduces the tensors in place, as
    ``dist.all_reduce`` did. ``ReduceOp.MAX``/``MIN``/``PRODUCT`` map to ``"max"``/``"min"``/``"mul"``,
    and ``ReduceOp.AVG`` to ``"sum"`` with ``scale=1.0 / <world size>``. Calls with a process group
    (``group=``), ``async_op=True`` or another operation are reported, as are the other ``torch.distributed``
    collectives (XLA404).

Why:
    The migration removes the process group (XLA404), so ``torch.distributed`` collectives have nothing to
    run on; torch_xla's own collective reduces the device tensors of all replicas inside the step's graph.
    The tensor must live on the XLA device (metrics computed from the loss do).

Example:
    total = torch.tensor([correct, count], device=device)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)

Use instead:
    total = torch.tensor([correct, count], device=device)
    xm.all_reduce("sum", [total])
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.distributed import distributed_common as common
from xla_migrate.transforms.common import short

OPS = {"SUM": "sum", "MAX": "max", "MIN": "min", "PRODUCT": "mul", "AVG": "sum"}


class DistAllReduceToXm(Rule):
    code = "XLA410"
    name = "dist-all-reduce-to-xm"
    summary = "dist.all_reduce(tensor[, op=ReduceOp.X]) -> xm.all_reduce(\"x\", [tensor]) (in place)"
    fix_safety = "review"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        common.register(ctx, self.code)

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        if not ctx.xm_form or common.dist_call(ctx, node, "all_reduce") is None:
            return
        operation = rewritable(ctx, node)
        if operation is None:
            self.finding(node, f"{short(node)}: not rewritten (a process group, async_op, another operation, or "
                         "its value is used): the process group stays for it (XLA404)",
                         f"use {ctx.spell('all_reduce')}(\"sum\", [tensor]) (in place), with groups= for a subgroup")
            return
        positional = patterns.positional(node)
        scale = f", scale=1.0 / {ctx.spell('world_size')}" if operation == "AVG" else ""
        template = patterns.parsed_expression(f"{ctx.spell('all_reduce')}(\"{OPS[operation]}\", [__tensor__]{scale})")
        assert isinstance(template, cst.Call)
        index = node.args.index(positional[0] if positional else patterns.keyword(node, "tensor"))

        def reduced(updated: cst.Call) -> cst.Call:
            value = updated.args[index].value
            listed = cst.List([cst.Element(value)])
            args = [template.args[0], template.args[1].with_changes(value=listed), *template.args[2:]]
            return template.with_changes(args=args, lpar=updated.lpar, rpar=updated.rpar)

        self.replace(node, reduced, f"{short(node)} -> {short(reduced(node), 80)}")
        common.free_imports(self, node)
        self.import_may_be_dead("torch.distributed", "ReduceOp")


def rewritable(ctx, node: cst.Call) -> str | None:
    """The operation (``SUM``...) when this rule rewrites the ``dist.all_reduce`` call: a statement of its own,
    the tensor and the op (by keyword or position), the defaults spelled out at most. XLA404 asks too: a call
    it cannot rewrite keeps the process group."""
    statement = ctx.parent(node)
    positional = patterns.positional(node)
    op = patterns.keyword(node, "op") or (positional[1] if len(positional) > 1 else None)
    tensor = positional[0].value if positional else (
        patterns.keyword(node, "tensor").value if patterns.keyword(node, "tensor") else None)
    # all_reduce(tensor, op, group=None, async_op=False): the defaults ask for nothing more, in any spelling
    later = [("group", a.value) for a in positional[2:3]] + [("async_op", a.value) for a in positional[3:4]]
    extra = [a for a in node.args if a.keyword and a.keyword.value not in ("op", "tensor")
             and not common.neutral_argument(ctx, a.keyword.value, a.value)]
    extra += [value for keyword, value in later if not common.neutral_argument(ctx, keyword, value)]
    operation = "SUM" if op is None else _operation(ctx, op.value)
    if (tensor is None or operation is None or extra or len(positional) > 4 or any(a.star for a in node.args)
            or not (isinstance(statement, cst.Expr) and statement.value is node)):
        return None
    return operation


def _operation(ctx, node: cst.BaseExpression) -> str | None:
    for qualname in ctx.qualnames(node):
        for prefix in ("torch.distributed.ReduceOp.", "torch.distributed.distributed_c10d.ReduceOp.",
                       "torch._C._distributed_c10d.ReduceOp."):
            if qualname.startswith(prefix) and qualname[len(prefix):] in OPS:
                return qualname[len(prefix):]
    name = patterns.dotted_name(node)
    last = name.rsplit(".", 1)[-1] if name else None
    return last if last in OPS and name and "ReduceOp" in name else None
