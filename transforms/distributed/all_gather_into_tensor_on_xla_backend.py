"""XLA412 all-gather-into-tensor-on-xla-backend: dist.all_gather_into_tensor on the xla process group becomes
dist.all_gather into the output's chunks, which every torch_xla release with the backend runs.

What it does:
    Where ``torch.distributed`` stays on torch_xla's ``xla`` process group (the ddp form; in the xm form, a
    call XLA411 leaves for the kept group), rewrites::

        dist.all_gather_into_tensor(output, input[, group][, async_op])

    to ``dist.all_gather(list(output.chunk(dist.get_world_size([group]))), input[, group][, async_op])``
    (``dist._all_gather_base``, its old name, too). ``chunk`` returns views of ``output``, so what the backend
    copies into them lands in ``output``: the same layout for both of ``all_gather_into_tensor``'s output
    shapes (``[world * n, ...]``, one chunk per rank; ``[world, n, ...]``, each chunk ``[1, n, ...]``, which the
    backend's copy broadcasts into). The call returns what it returned before (``None``, or a work handle
    with ``async_op=True``), so it is rewritten wherever it stands. A call with unpacked arguments or a
    ``group`` that is not a plain name (it would be evaluated twice) is left as it is.

Why:
    torch_xla's ``xla`` backend runs ``dist.all_gather_into_tensor`` only from 2.8 (pytorch/xla #9332):
    in 2.5-2.7 its ``_allgather_base`` hands the output tensor to ``allgather``, which indexes it as a list
    (seen on 2.6.1: ``IndexError: invalid index of a 0-dim tensor``); before 2.5 it has no ``_allgather_base``.
    ``dist.all_gather`` works on every release with the backend (a 0-dim input from 2.3), so the ddp form's
    output runs on the releases its report names (both targets: the ``sagemaker`` ddp form, torch_xla 1.13's
    process group, is proven on 2.6.1, where ``all_gather_into_tensor`` fails) (measured here: the same values as
    ``all_gather_into_tensor`` for both output shapes, a 0-dim and an integer input, on torch_xla 2.9.0, and
    the same on 2.6.1).

Example:
    stacked = torch.zeros(world_size * metric.numel(), device=metric.device)
    dist.all_gather_into_tensor(stacked, metric)

Use instead:
    stacked = torch.zeros(world_size * metric.numel(), device=metric.device)
    dist.all_gather(list(stacked.chunk(dist.get_world_size())), metric)
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.common import parenthesized_for_attribute, short
from xla_migrate.transforms.distributed import dist_gather_broadcast_to_xm as gather_broadcast
from xla_migrate.transforms.distributed import distributed_common as common

PARAMETERS = ("output_tensor", "input_tensor", "group", "async_op")
# all_gather_into_tensor's keyword -> all_gather's (group and async_op keep their names and positions).
RENAMED = {"output_tensor": "tensor_list", "input_tensor": "tensor"}


class AllGatherIntoTensorOnXlaBackend(Rule):
    code = "XLA412"
    name = "all-gather-into-tensor-on-xla-backend"
    summary = ("dist.all_gather_into_tensor(out, t) -> dist.all_gather(list(out.chunk(world_size)), t) on the xla "
               "process group (torch_xla < 2.8 fails on the former)")
    fix_safety = "safe"

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        if common.dist_call(ctx, node, "all_gather_into_tensor", "_all_gather_base") is None:
            return
        if not (ctx.ddp_form or (ctx.xm_form and "xla_process_group" in ctx.target.spellings and not (
                common.active(ctx, "XLA411") and gather_broadcast.arguments(ctx, node) is not None))):
            return
        values = _arguments(node)
        group = values.get("group") if values is not None else None
        if values is None or "output_tensor" not in values or "input_tensor" not in values or (
                group is not None and patterns.dotted_name(group) is None):
            self.finding(node, f"{short(node)}: not rewritten (unpacked arguments, or a group that is not a "
                         "name); torch_xla's xla backend runs all_gather_into_tensor only from 2.8",
                         "call dist.all_gather(list(output.chunk(world_size)), input) instead on torch_xla < 2.8")
            return
        module = (patterns.code_of(node.func.value) if isinstance(node.func, cst.Attribute)
                  else ctx.local_name("torch.distributed", "dist"))
        world_size = f"{module}.get_world_size({patterns.code_of(group) if group is not None else ''})"

        def gathered(updated: cst.Call) -> cst.Call:
            args = []
            for index, arg in enumerate(updated.args):
                key = arg.keyword.value if arg.keyword is not None else PARAMETERS[index]
                if key == "output_tensor":
                    output = patterns.code_of(parenthesized_for_attribute(arg.value))
                    arg = arg.with_changes(value=patterns.parsed_expression(f"list({output}.chunk({world_size}))"))
                if arg.keyword is not None and key in RENAMED:
                    arg = arg.with_changes(keyword=cst.Name(RENAMED[key]))
                args.append(arg)
            func = patterns.parsed_expression(f"{module}.all_gather")
            return updated.with_changes(func=func, args=args)

        self.replace(node, gathered, f"{short(node)} -> {short(gathered(node), 80)}: torch_xla's xla backend runs "
                     "all_gather_into_tensor only from 2.8, all_gather on every release (the chunks are views "
                     "of the output, filled in place)")
        common.free_imports(self, node)


def _arguments(node: cst.Call) -> dict[str, cst.BaseExpression] | None:
    """The call's arguments by parameter name; None when some are unpacked or unknown."""
    values: dict[str, cst.BaseExpression] = {}
    for index, arg in enumerate(node.args):
        if arg.star:
            return None
        key = arg.keyword.value if arg.keyword is not None else (
            PARAMETERS[index] if index < len(PARAMETERS) else None)
        if key not in PARAMETERS or key in values:
            return None
        values[key] = arg.value
    return values
