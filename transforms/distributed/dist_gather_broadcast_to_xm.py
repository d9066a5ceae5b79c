"""XLA411 dist-gather-broadcast-to-xm: torch.distributed all_gather, all_gather_into_tensor and broadcast become
torch_xla collectives, with the same results in the same tensors.

What it does:
    In a distributed script migrated in the xm form, for a call that is a statement of its own:

    - ``dist.all_gather(tensor_list, tensor)`` -> a loop that copies each replica's chunk of
      ``xm.all_gather(tensor.unsqueeze(0))`` into the list's tensors (``xm.all_gather`` returns the tensors of
      all replicas concatenated along dim 0; ``dist.all_gather`` fills the given tensors in place)::

          for gathered, chunk in zip(tensor_list, xm.all_gather(tensor.unsqueeze(0))):
              gathered.copy_(chunk)

    - ``dist.all_gather_into_tensor(output, input)`` -> ``output.copy_(xm.all_gather(input))``.
    - ``dist.broadcast(tensor, src)`` -> ``xm.collective_broadcast([tensor], root_ordinal=src)`` (in place,
      both targets: torch_xla has it since 1.13).
    - ``dist.gather(tensor, gather_list, dst)`` -> on every replica, the all-gather kept in a name, a step
      barrier, then the copy loop over ``gather_list or ()`` (the list is None off ``dst``), and a second
      barrier unless the step's own follows before any read::

          gathered_metric = xm.all_gather(metric.unsqueeze(0), pin_layout=False)
          xm.mark_step()
          for gathered_tensor, chunk in zip(gathered or (), gathered_metric):
              gathered_tensor.copy_(chunk)
          xm.mark_step()

      A call without a list keeps the name and the first barrier (the replica only takes part). torch_xla
      runs at a barrier only what a live tensor needs: an all-gather whose result a replica drops (the
      ``zip`` over an empty list) never runs there, while ``dst`` waits for it in its graph (measured: two
      replicas on PJRT CPU, 4 collectives in dst's step graph, 3 in the other's, the rendezvous times out).
      The barrier before the copies makes every replica run the same graph, as torch_xla's own xla backend
      does in its gather (also ``pin_layout=False``: the pinned form pads by the ordinal, a graph that differs
      per replica).

    In the ddp form (the process group kept on the ``xla`` backend) a ``dist.gather`` is reported: that
    backend raises NotImplementedError for it on torch_xla 2.6.1 and runs a ``torch_xla.sync()`` inside it on
    2.9.

    A call with a process group (``group=``), ``async_op=``, unpacked arguments or whose value is used is left
    as it is: XLA404 then keeps the process group on the ``xla`` backend (``2.9``) and reports the call (on
    ``sagemaker``, whose API has no ``xla`` backend, it reports that the call needs an xm collective).

Why:
    The xm form removes the process group (XLA404), so ``torch.distributed`` collectives have nothing to run
    on, and keeping the group only for them costs a second runtime. torch_xla's own collectives run inside
    the step's graph on the XLA devices; the rewrite keeps the script's tensors (the list it reads
    afterwards, the output buffer, the broadcast tensor) holding what ``torch.distributed`` put there.
    ``xm.collective_broadcast`` runs the same graph on every replica (each multiplies its tensor by a 1 or a 0
    sent as device data, then all of them all-reduce), so no replica waits in a collective the others never
    compiled; a broadcast written as a per-replica branch (``if rank != src: tensor.zero_()``) would hang.
    One difference: a NaN or infinity in a replica's tensor other than ``src``'s makes the result NaN
    (0 * NaN), where ``dist.broadcast`` overwrites it.

Example:
    gathered = [torch.zeros_like(metric) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, metric)
    dist.broadcast(weights, src=0)

Use instead:
    gathered = [torch.zeros_like(metric) for _ in range(xr.world_size())]
    for gathered_tensor, chunk in zip(gathered, xm.all_gather(metric.unsqueeze(0))):
        gathered_tensor.copy_(chunk)
    xm.collective_broadcast([weights], root_ordinal=0)
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.engine.context import MigrationContext
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.common import fresh_name, short
from xla_migrate.transforms.distributed import distributed_common as common

# torch.distributed function -> (its parameters in order, the target concept it needs).
MAPPED = {
    "all_gather": (("tensor_list", "tensor"), "all_gather"),
    "all_gather_into_tensor": (("output_tensor", "input_tensor"), "all_gather"),
    "broadcast": (("tensor", "src"), "collective_broadcast"),
    "gather": (("tensor", "gather_list", "dst"), "all_gather"),
}
# Parameters a call may leave out (torch.distributed's defaults): gather's list is None off the dst rank.
OPTIONAL = {"gather": ("gather_list", "dst")}


def arguments(ctx: MigrationContext, node: cst.Call) -> tuple[str, list[cst.BaseExpression]] | None:
    """(function, its arguments in parameter order) when ``node`` is a mapped collective this rule rewrites
    for this target: a statement of its own, no other keywords, nothing unpacked. XLA404 asks too."""
    name = common.dist_call(ctx, node, *MAPPED)
    if name is None:
        return None
    parameters, concept = MAPPED[name]
    if concept not in ctx.target.spellings or not ctx.xm_form:
        return None
    statement = ctx.parent(node)
    line = ctx.parent(statement)
    if not (isinstance(statement, cst.Expr) and statement.value is node):
        return None
    if name in ("all_gather", "gather") and not (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1
                                     and isinstance(ctx.parent(line), (cst.IndentedBlock, cst.Module))):
        return None  # the loop needs a line of its own
    if any(a.star for a in node.args):
        return None
    values: dict[str, cst.BaseExpression] = {}
    later = ("group", "async_op")  # after the parameters, in torch.distributed's order
    for index, arg in enumerate(node.args):
        key = arg.keyword.value if arg.keyword is not None else (
            parameters[index] if index < len(parameters) else
            later[index - len(parameters)] if index - len(parameters) < len(later) else None)
        if key in later and common.neutral_argument(ctx, key, arg.value):
            continue  # group=None / the default group, async_op=False: what the xm collective does anyway
        if key not in parameters or key in values:
            return None
        values[key] = arg.value
    if set(parameters) - set(values) - set(OPTIONAL.get(name, ())):
        return None
    return name, [values.get(p) for p in parameters]


def _argument_index(node: cst.Call, position: int, parameter: str) -> int:
    for index, arg in enumerate(node.args):
        if (arg.keyword is not None and arg.keyword.value == parameter) or (arg.keyword is None and index == position):
            return index
    raise AssertionError(parameter)


class DistGatherBroadcastToXm(Rule):
    code = "XLA411"
    name = "dist-gather-broadcast-to-xm"
    summary = ("dist.all_gather / all_gather_into_tensor / broadcast / gather -> xm.all_gather / "
               "xm.collective_broadcast, filling the same tensors")
    fix_safety = "review"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        common.register(ctx, self.code)
        self._result_names: set[str] = set()  # the names this module's gathers keep their results in

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        if ctx.ddp_form and common.dist_call(ctx, node, "gather"):
            self.finding(node, f"{short(node)}: kept on the xla process group, whose gather raises "
                         "NotImplementedError on torch_xla 2.6.1 (the sagemaker target's runtime) and runs a "
                         "torch_xla.sync() inside on 2.9", "all-gather instead: dist.all_gather(<a list of "
                         "world-size tensors on every rank>, tensor), and read it on dst")
        found = arguments(ctx, node)
        if found is None:
            return
        name, _ = found
        if name == "gather":
            self._gather(node)
            return
        parameters, _ = MAPPED[name]
        first, second = (_argument_index(node, i, p) for i, p in enumerate(parameters))

        def code(updated: cst.Call, index: int) -> str:
            return patterns.code_of(updated.args[index].value)

        if name == "all_gather":
            line = ctx.parent(ctx.parent(node))
            target, chunk = fresh_name(ctx, node, "gathered_tensor"), fresh_name(ctx, node, "chunk")

            def gathered(updated: cst.SimpleStatementLine) -> cst.BaseStatement:
                call = updated.body[0].value
                loop = patterns.parsed_statement(
                    f"for {target}, {chunk} in zip({code(call, first)}, "
                    f"{ctx.spell('all_gather')}({_unsqueezed(call.args[second].value)})):\n"
                    f"    {target}.copy_({chunk})\n")
                return loop.with_changes(leading_lines=updated.leading_lines)

            self.replace(line, gathered, f"{short(node)} -> {ctx.spell('all_gather')}(...) copied into the list "
                         "(xm.all_gather concatenates the replicas' tensors along dim 0)")
        elif name == "all_gather_into_tensor":
            def into(updated: cst.Call) -> cst.BaseExpression:
                return patterns.parsed_expression(
                    f"{_receiver(updated.args[first].value)}.copy_({ctx.spell('all_gather')}({code(updated, second)}))"
                ).with_changes(lpar=updated.lpar, rpar=updated.rpar)

            self.replace(node, into, f"{short(node)} -> {short(into(node), 80)}")
        else:
            def broadcast(updated: cst.Call) -> cst.BaseExpression:
                return patterns.parsed_expression(
                    f"{ctx.spell('collective_broadcast')}([{code(updated, first)}], "
                    f"root_ordinal={code(updated, second)})").with_changes(lpar=updated.lpar, rpar=updated.rpar)

            self.replace(node, broadcast, f"{short(node)} -> {short(broadcast(node), 80)} (in place)")
        common.free_imports(self, node)


    def _gather(self, node: cst.Call) -> None:
        """``dist.gather(tensor, gather_list, dst)`` -> every replica all-gathers into a name of its own, runs it
        at a barrier, then copies the chunks into its list: on dst the list torch.distributed filled, elsewhere
        none (``gather_list`` is None there, so ``or ()``). The name keeps the result alive until the barrier
        on the replicas without a list (torch_xla runs only what a live tensor needs); the barrier before the
        copies makes every replica run the same graph (dst's copies run after, in a graph with no collective,
        at a second barrier unless a step barrier follows before any read), as torch_xla's own xla backend
        does in its gather. ``pin_layout=False`` as there too: the pinned form is an all-reduce over a copy padded
        by the ordinal, a graph that differs per replica (two replicas on PJRT CPU deadlock in it, measured)."""
        ctx = self.ctx
        line = ctx.parent(ctx.parent(node))
        result = self._result_name(node)
        target, chunk = fresh_name(ctx, node, "gathered_tensor"), fresh_name(ctx, node, "chunk")
        tensor_index = _argument_index(node, 0, "tensor")
        list_index = next((i for i, a in enumerate(node.args) if (a.keyword is None and i == 1) or (
            a.keyword is not None and a.keyword.value == "gather_list")), None)
        barrier = ctx.spell("step_barrier")
        follows = ctx.steps.barrier_follows(line)

        def gathered(updated: cst.SimpleStatementLine) -> cst.FlattenSentinel:
            call = updated.body[0].value
            gather_list = None if list_index is None else call.args[list_index].value
            comment = "# Kept on every replica: one that drops the all-gather's result never runs it; the others wait."
            tensor = _unsqueezed(call.args[tensor_index].value)
            statements = [ctx.statement(f"{result} = {ctx.spell('all_gather')}({tensor}, pin_layout=False)").with_changes(
                leading_lines=[*updated.leading_lines, cst.EmptyLine(comment=cst.Comment(comment))]),
                ctx.statement(barrier)]
            if gather_list is not None:  # with no list this replica only takes part in the collective
                listed = (
                    patterns.code_of(gather_list) if isinstance(gather_list, (cst.List, cst.ListComp))
                    else f"{_receiver(gather_list)} or ()")
                statements.append(patterns.parsed_statement(
                    f"for {target}, {chunk} in zip({listed}, {result}):\n"
                    f"    {target}.copy_({chunk})\n"))
                if not follows:
                    statements.append(ctx.statement(barrier))
            return cst.FlattenSentinel(statements)

        self.replace(line, gathered, f"{short(node)} -> {ctx.spell('all_gather')}(...) on every replica, kept in "
                     f"{result} and run at {barrier} (every replica runs the same graph), then copied into the list "
                     "where there is one (dst's): torch_xla's xla backend has no gather on 2.6.1 and syncs inside "
                     "it on 2.9")
        common.free_imports(self, node)

    def _result_name(self, node: cst.Call) -> str:
        """A name for a gather's result, bound nowhere visible and used by no other gather of the module: a
        second gather rebinding it would drop the first one's result on the replicas without a list."""
        tensor = node.args[_argument_index(node, 0, "tensor")].value
        base = f"gathered_{tensor.value}" if isinstance(tensor, cst.Name) else "all_gathered"
        name, count = fresh_name(self.ctx, node, base), 1
        while name in self._result_names:
            count += 1
            name = fresh_name(self.ctx, node, f"{base}_{count}")
        self._result_names.add(name)
        return name


def _unsqueezed(tensor: cst.BaseExpression) -> str:
    return f"{_receiver(tensor)}.unsqueeze(0)"


def _receiver(expression: cst.BaseExpression) -> str:
    """``expression`` as the receiver of a method call: parenthesized unless it is a name, attribute, call or
    subscript."""
    text = patterns.code_of(expression)
    if isinstance(expression, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or expression.lpar:
        return text
    return f"({text})"
