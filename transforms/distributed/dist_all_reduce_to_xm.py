"""XLA410 dist-all-reduce-to-xm: torch.distributed.all_reduce on tensors becomes xm.all_reduce, in place.

What it does:
    In a distributed script, rewrites ``dist.all_reduce(tensor)`` and ``dist.all_reduce(tensor,
    op=dist.ReduceOp.SUM)`` (a statement on its own, the usual way to sum a metric over the workers) to
    ``xm.all_reduce("sum", [tensor])``: given a list, ``xm.all_reduce`` reduces the tensors in place, as
    ``dist.all_reduce`` did. ``ReduceOp.MAX``/``MIN``/``PRODUCT`` map to ``"max"``/``"min"``/``"mul"``,
    and ``ReduceOp.AVG`` to ``"sum"`` with ``scale=1.0 / <world size>``. ``dist.reduce(tensor, dst[, op])``
    becomes the same all-reduce: every replica gets what ``dst`` got (the others' copies were unspecified after
    a reduce). Calls with a process group (``group=``), ``async_op=True`` or another operation are reported, as
    are the other ``torch.distributed`` collectives (XLA404).

    In the ddp form the process group stays, on the ``xla`` backend, and ``dist.reduce(tensor, dst[, op])``
    becomes ``dist.all_reduce(tensor[, op=op])`` there.

    In the spmd form a mean over the replicas goes: ``dist.all_reduce(t, op=ReduceOp.AVG)``, and
    ``dist.all_reduce(t)`` followed by ``t /= <world size>`` (or ``t.div_(...)``, ``return t / <world size>``),
    with the division. A bare
    sum, or a reduce, is reported (XLA404).

Why:
    The migration removes the process group (XLA404), so ``torch.distributed`` collectives have nothing to
    run on; torch_xla's own collective reduces the device tensors of all replicas inside the step's graph.
    The tensor must live on the XLA device (metrics computed from the loss do). torch_xla's ``xla`` backend
    raises NotImplementedError for ``reduce`` on 2.6.1 (the sagemaker target's runtime; measured) and runs a
    ``torch_xla.sync()`` inside it on 2.9, a graph cut in the step; its ``all_reduce`` works on both.
    In the spmd form the step runs once over the global batch, sharded over the mesh: a loss or metric
    computed from it already is the mean over the former replicas' shards, so averaging it again is the
    identity; a sum over the replicas of per-replica means (or of counts) has no single SPMD meaning.

Example:
    total = torch.tensor([correct, count], device=device)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)

Use instead:
    total = torch.tensor([correct, count], device=device)
    xm.all_reduce("sum", [total])
"""

from __future__ import annotations

from typing import ClassVar

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.distributed import distributed_common as common
from xla_migrate.transforms.common import short

OPS = {"SUM": "sum", "MAX": "max", "MIN": "min", "PRODUCT": "mul", "AVG": "sum"}
# torch.distributed's parameters, in order.
PARAMETERS = {"all_reduce": ("tensor", "op", "group", "async_op"),
              "reduce": ("tensor", "dst", "op", "group", "async_op")}
REDUCE_NOTE = " (every rank gets the result dst got; the others' copies were unspecified after a reduce)"
BACKEND_REDUCE = ("torch_xla's xla backend raises NotImplementedError for reduce on 2.6.1 (the sagemaker target's "
                  "runtime) and runs a torch_xla.sync() inside it on 2.9, a graph cut in the step")


class DistAllReduceToXm(Rule):
    code = "XLA410"
    name = "dist-all-reduce-to-xm"
    summary = ("dist.all_reduce(tensor[, op=ReduceOp.X]) and dist.reduce(tensor, dst) -> xm.all_reduce(\"x\", "
               "[tensor]) (in place)")
    fix_safety = "review"
    golden_forms: ClassVar[tuple[str, ...]] = ("spmd",)

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        common.register(ctx, self.code)

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        name = common.dist_call(ctx, node, *PARAMETERS)
        if name is None:
            return
        if ctx.spmd_form:
            self._spmd(node)
            return
        if name == "reduce" and ctx.ddp_form:
            self._reduce_on_the_group(node)
            return
        if not ctx.xm_form:
            return
        operation = rewritable(ctx, node)
        if operation is None:
            self.finding(node, f"{short(node)}: not rewritten (a process group, async_op, another operation, or "
                         "its value is used): the process group stays for it (XLA404)"
                         f"{'; ' + BACKEND_REDUCE if name == 'reduce' else ''}",
                         f"use {ctx.spell('all_reduce')}(\"sum\", [tensor]) (in place), with groups= for a subgroup")
            return
        scale = f", scale=1.0 / {ctx.spell('world_size')}" if operation == "AVG" else ""
        template = patterns.parsed_expression(f"{ctx.spell('all_reduce')}(\"{OPS[operation]}\", [__tensor__]{scale})")
        assert isinstance(template, cst.Call)
        index = node.args.index(_argument(node, name, "tensor"))

        def reduced(updated: cst.Call) -> cst.Call:
            value = updated.args[index].value
            listed = cst.List([cst.Element(value)])
            args = [template.args[0], template.args[1].with_changes(value=listed), *template.args[2:]]
            return template.with_changes(args=args, lpar=updated.lpar, rpar=updated.rpar)

        self.replace(node, reduced, f"{short(node)} -> {short(reduced(node), 80)}{REDUCE_NOTE if name == 'reduce' else ''}")
        common.free_imports(self, node)
        self.import_may_be_dead("torch.distributed", "ReduceOp")

    def _reduce_on_the_group(self, node: cst.Call) -> None:
        """The ddp form keeps the process group, on the xla backend, whose ``reduce`` raises NotImplementedError
        on torch_xla 2.6.1 and runs a ``torch_xla.sync()`` inside on 2.9: ``dist.reduce(t, dst, op)`` ->
        ``dist.all_reduce(t, op=op)``, on the same group."""
        operation = rewritable(self.ctx, node)
        if operation is None or not isinstance(node.func, cst.Attribute):
            self.finding(node, f"{short(node)}: not rewritten (a process group, async_op, another operation, its "
                         f"value is used, or an imported name): {BACKEND_REDUCE}",
                         "call dist.all_reduce(tensor, op=...) instead: every rank gets what dst got")
            return
        index = node.args.index(_argument(node, "reduce", "tensor"))
        op = _argument(node, "reduce", "op")
        spelled_op = "" if op is None else f", op={patterns.code_of(op.value)}"

        def all_reduced(updated: cst.Call) -> cst.Call:
            call = patterns.parsed_expression(f"f(__tensor__{spelled_op})")
            args = [call.args[0].with_changes(value=updated.args[index].value), *call.args[1:]]
            return updated.with_changes(func=updated.func.with_changes(attr=cst.Name("all_reduce")), args=args)

        self.replace(node, all_reduced, f"{short(node)} -> {short(all_reduced(node), 80)}: {BACKEND_REDUCE}"
                     f"{REDUCE_NOTE}")

    def _spmd(self, node: cst.Call) -> None:
        """The spmd form: one program computes the step over the whole (sharded) global batch, so a value made
        from it already is the mean over the former replicas' shards: their mean (``op=ReduceOp.AVG``, or a sum
        divided by the world size on the next line) goes, with the division. A bare sum is reported (XLA404):
        the sum of per-replica means and the sum of per-replica counts differ in SPMD."""
        removed = spmd_mean(self.ctx, node)
        if removed is None:
            return
        message = (f"removed {short(node)}: in the spmd form a value computed from the global batch (sharded over "
                   "the mesh) already is the mean over the former replicas")
        self.remove(self.ctx.parent(node), message)
        if isinstance(removed, cst.Return):  # return value / world_size -> return value
            self.replace(removed.value, lambda updated: updated.left, f"the division by the world size after {short(node)} "
                         f"dropped: {message}")
        elif removed is not True:
            self.remove(removed, f"removed the division by the world size after {short(node)}: {message}")
        common.free_imports(self, node)
        self.import_may_be_dead("torch.distributed", "ReduceOp")


def spmd_mean(ctx, node: cst.Call) -> cst.BaseSmallStatement | bool | None:
    """In the spmd form, whether ``node`` averages a tensor over the replicas: True for ``op=ReduceOp.AVG``, the
    division statement for a sum followed by ``tensor /= <world size>``, ``tensor.div_(<world size>)`` or
    ``return tensor / <world size>``, None otherwise. XLA404 asks too."""
    operation = rewritable(ctx, node)
    if operation == "AVG":
        return True
    if operation != "SUM":
        return None
    line = ctx.parent(ctx.parent(node))
    block = ctx.parent(line)
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1 or not isinstance(
            block, (cst.IndentedBlock, cst.Module)):
        return None
    index = list(block.body).index(line)
    following = block.body[index + 1] if index + 1 < len(block.body) else None
    if not isinstance(following, cst.SimpleStatementLine) or len(following.body) != 1:
        return None
    tensor = patterns.code_of(_argument(node, common.dist_call(ctx, node, *PARAMETERS), "tensor").value)
    statement = following.body[0]
    divisor = None
    if isinstance(statement, cst.AugAssign) and isinstance(statement.operator, cst.DivideAssign) and \
            patterns.code_of(statement.target) == tensor:
        divisor = statement.value
    elif isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call) and isinstance(
            statement.value.func, cst.Attribute) and statement.value.func.attr.value == "div_" and \
            patterns.code_of(statement.value.func.value) == tensor and len(statement.value.args) == 1:
        divisor = statement.value.args[0].value
    elif isinstance(statement, cst.Return) and isinstance(statement.value, cst.BinaryOperation) and isinstance(
            statement.value.operator, cst.Divide) and patterns.code_of(statement.value.left) == tensor:
        divisor = statement.value.right
    if divisor is None or not _world_size(ctx, divisor):
        return None
    return statement


def _world_size(ctx, node: cst.BaseExpression) -> bool:
    """A read of the world size: ``dist.get_world_size()``, ``xr.process_count()`` (already rewritten), a helper or
    attribute named so (``get_world_size()``, ``args.world_size``)."""
    if common.rank_read(ctx, node) == "world_size":
        return True
    target = node.func if isinstance(node, cst.Call) and not node.args else node
    name = patterns.dotted_name(target) or ""
    return name.rsplit(".", 1)[-1] in ("world_size", "get_world_size", "process_count", "xrt_world_size")


def rewritable(ctx, node: cst.Call) -> str | None:
    """The operation (``SUM``...) when this rule rewrites the ``dist.all_reduce`` or ``dist.reduce`` call: a
    statement of its own, the tensor, the op and (reduce) dst, by keyword or position, the defaults spelled out
    at most. XLA404 asks too: a call it cannot rewrite keeps the process group."""
    name = common.dist_call(ctx, node, *PARAMETERS)
    if name is None:
        return None
    parameters = PARAMETERS[name]
    statement = ctx.parent(node)
    positional = patterns.positional(node)
    op, tensor = _argument(node, name, "op"), _argument(node, name, "tensor")
    # the group and async_op defaults ask for nothing more, in any spelling
    named = dict(zip(parameters, positional))
    named.update((a.keyword.value, a) for a in node.args if a.keyword)
    extra = [key for key, arg in named.items() if key not in parameters
             or (key in ("group", "async_op") and not common.neutral_argument(ctx, key, arg.value))]
    operation = "SUM" if op is None else _operation(ctx, op.value)
    if (tensor is None or operation is None or extra or len(positional) > len(parameters)
            or any(a.star for a in node.args) or not (isinstance(statement, cst.Expr) and statement.value is node)):
        return None
    return operation


def _argument(node: cst.Call, name: str, parameter: str) -> cst.Arg | None:
    positional = patterns.positional(node)
    index = PARAMETERS[name].index(parameter)
    return patterns.keyword(node, parameter) or (positional[index] if len(positional) > index else None)


def _operation(ctx, node: cst.BaseExpression) -> str | None:
    for qualname in ctx.qualnames(node):
        for prefix in ("torch.distributed.ReduceOp.", "torch.distributed.distributed_c10d.ReduceOp.",
                       "torch._C._distributed_c10d.ReduceOp."):
            if qualname.startswith(prefix) and qualname[len(prefix):] in OPS:
                return qualname[len(prefix):]
    name = patterns.dotted_name(node)
    last = name.rsplit(".", 1)[-1] if name else None
    return last if last in OPS and name and "ReduceOp" in name else None
