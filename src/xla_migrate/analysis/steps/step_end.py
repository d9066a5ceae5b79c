"""Where a step's barrier finally goes (issue 30, point 2), once the host-read plan is known.

The step model (model.py) places a training loop's barrier right after the update. Two refinements need to
know which reads stay (the host-read plan: running sums kept on the device, reads of logged values deferred):

- Training loops: the device work that follows the update in the same block belongs to the step too: an EMA
  or teacher update (``ema.update(model)``, ``accumulate(g_ema, generator, 0.999)``, ``update_ema(...)``, a
  loop of in-place ``mul_``/``add_`` over two models' parameters), the reduction of the step's losses
  (``loss_reduced = reduce_loss_dict(loss_dict)``, or a ``dist.reduce``/``dist.gather`` in the loop body:
  each replica must run it in the same graph), values the plan keeps on the device. A barrier before
  them leaves them to the next step's graph, or worse, to the reads that follow, each of which then runs
  its own graph. The barrier moves past them, and past host-only statements between them (``step += 1``),
  up to the first statement that reads a value to the host, leaves the loop body (break, continue, return,
  raise), saves, evaluates, or calls code that may read (a call the module cannot see into, given a model
  or a tensor).
- Evaluation loops: a read that stays (``losses[k] = loss.item()``, ``preds.extend(out.argmax(1).tolist())``)
  runs the graph up to its value; a barrier at the end of the batch then runs a second graph for what is
  still pending (the logits). The barrier goes right before the first statement that reads, so the batch
  runs one graph and the read copies a value already computed; this holds for loops over a device loader
  too (its own step marker then finds nothing pending).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import libcst as cst

from ...syntax import patterns
from . import kinds, reads
from .reads import plain_read
from .collect import is_model_name
from .kinds import BarrierSite, Region

if TYPE_CHECKING:
    from .kinds import StepLoop
    from .model import StepModel

# Calls that update a second copy of the model from the trained one, after the optimizer step.
EMA_NAME = re.compile(r"(^|_)(ema|teacher|momentum|moving_average|swa|polyak|accumulate|soft_update|"
                      r"update_average|target)(_|$)|ema$|^ema|teacher|momentum", re.IGNORECASE)
IN_PLACE_UPDATES = ("mul_", "add_", "copy_", "lerp_", "sub_", "addcmul_", "update_parameters")
SAVES = ("torch.save", "torch_xla.core.xla_model.save", "torch_xla.utils.serialization.save")
_LEAVES = (cst.Break, cst.Continue, cst.Return, cst.Raise, cst.Yield)
# Collectives over the step's tensors (``dist.reduce(loss, 0)``, ``dist.gather``; their XLA forms, XLA410/411).
# On XLA they are lazy: left after the barrier, one runs at the first host read of its result, in a graph of its
# own on the reading replica only (``if rank == 0: print(reduced.item())``), while the others run it in their
# next step's graph: the replicas never meet (measured: 2 replicas on PJRT CPU hang). Before the barrier every
# replica runs it in the step's graph.
COLLECTIVES = frozenset(f"{module}.{name}" for module in ("torch.distributed", "torch_xla.core.xla_model")
                        for name in ("all_reduce", "reduce", "all_gather", "gather", "broadcast",
                                     "all_gather_into_tensor", "collective_broadcast", "reduce_scatter"))


def final_sites(model: StepModel) -> dict[cst.CSTNode, BarrierSite]:
    """Loop -> its barrier site after the refinements above (only the loops whose site changes)."""
    found: dict[cst.CSTNode, BarrierSite] = {}
    for step in model.loops.values():
        site = step.barrier_site
        if site is None or step.has_barrier or model.ctx.facts.uses_accelerate:
            continue
        if step.kind == "train":
            extended = _after_step_work(model, step, site)
        else:
            extended = _before_first_read(model, step)
        if extended is not None and extended != site:
            found[step.loop] = extended
    return found


# Statements -----------------------------------------------------------------------------------------------


class _Looker:
    """What one statement of a step's block does, as far as the barrier cares."""

    def __init__(self, model: StepModel, step: StepLoop) -> None:
        self.model = model
        self.ctx = model.ctx
        self.step = step
        region = Region(step)
        self.names = model.base_tensor_names(region) | {n for (loop, n) in model.host_reads.device_values
                                                         if loop is step.loop}
        self.moved = model.host_reads.moved
        self.with_loops = {model._c.loop_function[s.loop] for s in model.loops.values()}  # noqa: SLF001

    def reads(self, statement: cst.CSTNode) -> bool:
        """The statement reads a value of the step to the host, and no rule of this run moves the read."""
        return bool(self.staying_reads(statement)) or self._other_reads(statement)

    def staying_reads(self, statement: cst.CSTNode) -> list[cst.CSTNode]:
        """The reads of the statement's own expressions that stay (see ``reads``)."""
        ctx = self.ctx
        finder = _ValueReads(ctx, self.names)
        statement.visit(finder)
        found = []
        for read in finder.found:
            if read in self.moved or self._moved_inside(read):
                continue
            if not isinstance(read, cst.Call) and not self._value_use(read, statement):
                continue  # ``stepper(loss)``, ``losses.append(loss)``: the tensor is handed on, not read
            if isinstance(read, cst.Call) and patterns.method_call(read, "cpu") and not _read_of_value(ctx, read):
                continue
            found.append(read)
        return found

    def _other_reads(self, statement: cst.CSTNode) -> bool:
        if isinstance(statement, cst.Assert) or patterns.find_all(statement, lambda n: isinstance(n, cst.Assert)):
            return True
        for call in patterns.find_all(statement, lambda n: isinstance(n, cst.Call)):
            callee = self.model.callee(call)  # type: ignore[arg-type]
            if callee is not None and any(e.kind == kinds.READ and e.node not in self.moved
                                          for e in self.model.effects(callee)):
                return True
        return False

    def _value_use(self, mention: cst.CSTNode, statement: cst.CSTNode) -> bool:
        """A tensor mentioned where its value is needed on the host: formatted, compared, tested, printed."""
        child, current = mention, self.ctx.parent(mention)
        while current is not None and child is not statement:
            if isinstance(current, (cst.FormattedStringExpression, cst.Comparison, cst.BooleanOperation)):
                return True
            if isinstance(current, (cst.If, cst.While, cst.Assert)) and child is current.test:
                return True
            if isinstance(current, cst.Call) and reads.is_logging_call(self.ctx, current):
                return True
            child, current = current, self.ctx.parent(current)
        return False

    def _moved_inside(self, read: cst.CSTNode) -> bool:
        return any(m in self.moved for m in patterns.find_all(read, lambda n: isinstance(n, cst.Call)))

    def stops(self, statement: cst.CSTNode) -> bool:
        """The barrier cannot move past this statement (see the module docstring)."""
        ctx = self.ctx
        if self.reads(statement) or patterns.find_all(statement, lambda n: isinstance(n, _LEAVES)):
            return True
        if patterns.find_all(statement, lambda n: isinstance(n, (cst.For, cst.While)) and n in self.model.loops):
            return True
        for call in patterns.find_all(statement, lambda n: isinstance(n, cst.Call)):
            names = ctx.qualnames(call.func)  # type: ignore[attr-defined]
            if names & set(SAVES) or names & set(kinds.STEP_BARRIERS) or names & set(kinds.STEP_CLOSURES):
                return True
            if names & COLLECTIVES:
                continue  # the step's collective: before the barrier (see COLLECTIVES)
            if any(name.startswith("torch.") and name.count(".") == 1 for name in names):
                continue  # torch's own tensor functions (torch.zeros_like(loss), torch.stack): device work
            callee = self.model.callee(call)  # type: ignore[arg-type]
            if callee is not None:
                if callee in self.with_loops:
                    return True
                continue
            if self._ema(call) or _in_place(call):
                continue
            if reads.is_logging_call(ctx, call):  # type: ignore[arg-type]
                continue  # no tensor in it (else `reads` said so)
            if any(self._device_argument(arg.value) for arg in call.args):  # type: ignore[attr-defined]
                return True
        return False

    def device_work(self, statement: cst.CSTNode) -> bool:
        """The statement computes on the device: it uses the step's tensors, or updates a copy of the model."""
        if reads.mentions(statement, self.names):
            return True
        for call in patterns.find_all(statement, lambda n: isinstance(n, cst.Call)):
            if self._ema(call) or _in_place(call):  # type: ignore[arg-type]
                return True
        return False

    def _ema(self, call: cst.Call) -> bool:
        spelled = patterns.dotted_name(call.func) or ""
        if EMA_NAME.search(spelled.rsplit(".", 1)[-1]) or EMA_NAME.search(spelled.split(".")[0]):
            return True
        return any(EMA_NAME.search(patterns.dotted_name(a.value) or "") for a in call.args)

    def _device_argument(self, value: cst.BaseExpression) -> bool:
        name = patterns.dotted_name(value)
        if name is not None and (name in self.names or is_model_name(name)):
            return True
        return bool(reads.mentions(value, self.names))


class _ValueReads(reads._Reads):  # noqa: SLF001
    """``steps.reads`` of a statement, without its assignment targets (``output = model(x)`` reads nothing)."""

    def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:
        return False

    def visit_AugAssign(self, node: cst.AugAssign) -> bool:
        node.value.visit(self)
        return False

    def visit_AnnAssign(self, node: cst.AnnAssign) -> bool:
        if node.value is not None:
            node.value.visit(self)
        return False

    def visit_For(self, node: cst.For) -> bool:
        node.iter.visit(self)
        node.body.visit(self)
        if node.orelse is not None:
            node.orelse.visit(self)
        return False


def _in_place(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Attribute) and call.func.attr.value in IN_PLACE_UPDATES


def _read_of_value(ctx, call: cst.Call) -> bool:
    """``x.cpu()`` used as a value (``.numpy()``, ``.tolist()`` after it is caught as its own read)."""
    parent = ctx.parent(call)
    return not (isinstance(parent, cst.Attribute) and parent.value is call)


# Training: after the step's device work ---------------------------------------------------------------------


def _after_step_work(model: StepModel, step: StepLoop, site: BarrierSite) -> BarrierSite | None:
    block = site.block
    if not site.after_update or not isinstance(block, cst.IndentedBlock):
        return None
    statements = list(block.body)
    if site.statement not in statements:
        return None
    return BarrierSite(statements[_extended(_Looker(model, step), statements, statements.index(site.statement))],
                       block, True)


def _extended(looker: _Looker, statements: list[cst.CSTNode], last: int) -> int:
    """The index of the last statement of the step's device work that follows ``statements[last]``."""
    for index in range(last + 1, len(statements)):
        statement = statements[index]
        if looker.stops(statement):
            break
        if looker.device_work(statement):
            last = index
    return last


# Training: collectives after the barrier ---------------------------------------------------------------------


def collective_sites(model: StepModel, step: StepLoop) -> list[BarrierSite]:
    """Barriers after the collectives that run after a training step's barrier (issue 28): in a branch
    (``if step % log_every == 0: dist.all_reduce(loss_t)``) or after a read that stopped the barrier. Left to
    itself such a collective runs at the first host read of its result: where only some replicas read it
    (``if rank == 0: print(loss_t.item())``) they run it in a graph of their own and the others in their next
    step's graph, and the replicas never meet (see COLLECTIVES). A barrier right after it (past the device work
    that follows it in its block, up to the first read) makes every replica run it in one graph, on the steps
    that run the branch only; the read then copies its value. A collective in an inner loop that reads nothing
    gets the barrier after that loop. Only for loops that XLA302 gives a barrier."""
    site = model.end_of_step(step)
    if step.kind != "train" or site is None or not site.after_update or not isinstance(site.block, cst.IndentedBlock):
        return []
    ctx = model.ctx
    looker = _Looker(model, step)
    found: list[BarrierSite] = []
    covered: set[cst.CSTNode] = set()
    for statement in _following(ctx, step, site):
        for call in patterns.find_all(statement, lambda n: isinstance(n, cst.Call)):
            if not ctx.qualnames(call.func) & COLLECTIVES:  # type: ignore[attr-defined]
                continue
            anchor = _anchor(ctx, looker, call, step.loop)
            block = ctx.parent(anchor)
            if anchor is None or anchor in covered or not isinstance(block, cst.IndentedBlock) or looker.reads(anchor):
                continue
            statements = list(block.body)
            first = statements.index(anchor)
            last = _extended(looker, statements, first)
            covered.update(statements[first:last + 1])
            found.append(BarrierSite(statements[last], block, True))
    return found


def _following(ctx, step: StepLoop, site: BarrierSite) -> list[cst.CSTNode]:
    """The statements of the loop body that run after the site: after it in its block, then after each
    enclosing statement up to the loop body."""
    found: list[cst.CSTNode] = []
    statement, block = site.statement, site.block
    while isinstance(block, cst.IndentedBlock):
        statements = list(block.body)
        found.extend(statements[statements.index(statement) + 1:])
        if block is step.loop.body:
            break
        statement = ctx.parent(block)
        while statement is not None and not isinstance(ctx.parent(statement), cst.IndentedBlock):
            statement = ctx.parent(statement)  # an ``else``/``except`` clause: up to its statement
        if statement is None:
            break
        block = ctx.parent(statement)
    return found


def _anchor(ctx, looker: _Looker, call: cst.Call, loop: cst.CSTNode) -> cst.CSTNode | None:
    """The statement after which a barrier runs ``call``: its own statement, or the inner loop holding it
    when that loop reads nothing."""
    node: cst.CSTNode | None = call
    while node is not None and not isinstance(ctx.parent(node), cst.IndentedBlock):
        node = ctx.parent(node)
    while node is not None:
        owner = ctx.parent(ctx.parent(node))
        if owner is loop or not isinstance(owner, (cst.For, cst.While)) or looker.reads(owner):
            return node
        node = owner
    return None


def barrier_follows(model: StepModel, statement: cst.CSTNode, sites: list[tuple[StepLoop, BarrierSite]]) -> bool:
    """A barrier of ``sites`` ends ``statement``'s block after it, and nothing between reads a value to the
    host or leaves the block."""
    block = model.ctx.parent(statement)
    for step, site in sites:
        if site.block is not block or not isinstance(block, cst.IndentedBlock):
            continue
        statements = list(block.body)
        if statement not in statements or site.statement not in statements:
            continue
        start, end = statements.index(statement), statements.index(site.statement)
        looker = _Looker(model, step)
        if start <= end and not any(looker.reads(s) or patterns.find_all(s, lambda n: isinstance(n, _LEAVES))
                                    for s in statements[start + 1:end + 1]):
            return True
    return False


# Evaluation: before the first read -------------------------------------------------------------------------


def _before_first_read(model: StepModel, step: StepLoop) -> BarrierSite | None:
    body = step.loop.body
    if not isinstance(body, cst.IndentedBlock) or len(body.body) < 2:
        return None
    looker = _Looker(model, step)
    statements = list(body.body)
    for index, statement in enumerate(statements):
        if looker.reads(statement):
            if index == 0 or not any(looker.device_work(s) for s in statements[:index]):
                return None
            # Only when the reads copy values computed before (``loss.item()``): a read that computes
            # (``criterion(out, y).item()``) runs its own graph after a barrier placed before it.
            found = looker.staying_reads(statement)
            if not found or looker._other_reads(statement) or not all(plain_read(r) for r in found):  # noqa: SLF001
                return None
            return BarrierSite(statements[index - 1], body, False, before_read=True)
    return None
