"""XLA406 gradient-all-reduce: gradients read or changed before the step are all-reduced once, right after backward.

What it does:
    In a distributed script, for each training loop whose gradients are read or changed between
    ``backward()`` and the optimizer step (``scaler.unscale_(opt)``, ``clip_grad_norm_`` /
    ``clip_grad_value_``, code that touches ``p.grad``, or a kept GradScaler's ``scaler.step(opt)``, which
    unscales them and checks them for inf/NaN), inserts right after the backward::

        gradients = xm._fetch_gradients(optimizer)
        xm.all_reduce("sum", gradients, scale=1.0 / xm.xrt_world_size())

    once per optimizer the loop steps, wherever the step's code is: in the loop body, or in a function it
    calls (a loss-scaler object's ``__call__``, ``self.train_step(batch)``), where both the backward and the
    first gradient read lie. The reduction runs whenever the step does: a read under ``if clip_grad:`` gets
    it before that ``if``. With micro-steps in a nested loop it goes after that loop. The step then reduces
    nothing more: XLA204 leaves that loop's
    ``optimizer.step()`` as it is and XLA202 turns ``scaler.step(opt)`` into ``opt.step()`` where the
    target has no GradScaler (the decision is the step model's: ``ctx.steps.reductions``).
    Every other loop keeps its reduction in ``xm.optimizer_step(optimizer)`` (XLA204/XLA202). With
    gradient accumulation (the step inside ``if (i + 1) % k == 0:``) the reduction goes at the top of
    that block, before the first statement that touches the gradients, so it runs once per step rather than
    per micro-batch. A loop that already all-reduces fetched gradients is left alone. Each update is paired
    with the backward that feeds it: the AMP and the fp32 branch of a loop each get their own reduction, a
    GAN's updates reduce only what they step. A call the step model cannot follow that is handed the model
    or the optimizer between the backward and the update (``clip_gradients(model, clip)`` of another
    module) counts as a read: the reduction goes before it. A function that runs a backward and an update
    and that no loop of its module calls (a loss scaler's ``__call__`` that another module's loop calls) is
    reduced there. Where the script reduces the gradients itself (gradient hooks, an all-reduce over
    ``.grad``), that reduction is reported: the xm form reduces every update again.

Why:
    ``xm.optimizer_step`` all-reduces the gradients just before it steps, which is too late when they were
    clipped or unscaled before it: each replica would clip by its own local norm (and a GradScaler would
    skip steps on one replica only), so the replicas' weights drift apart. The seeds' order for AMP is
    scaled backward -> all_reduce -> unscale_/clip -> step -> mark_step; reducing again in the step would
    average the average (harmless for the value but one more collective per step).

Example:
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()

Use instead:
    scaler.scale(loss).backward()
    gradients = xm._fetch_gradients(optimizer)
    xm.all_reduce("sum", gradients, scale=1.0 / xm.xrt_world_size())
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.analysis.steps import Reduction
from xla_migrate.analysis.update_sites import summarize
from xla_migrate.engine.rule import Rule
from xla_migrate.syntax import patterns
from xla_migrate.transforms.distributed import distributed_common as common

_COMMENT = "# All-reduce the gradients once, before they are read (unscale_/clip); the step does not reduce again."


class GradientAllReduce(Rule):
    code = "XLA406"
    name = "gradient-all-reduce"
    summary = "distributed loops that clip/unscale gradients all-reduce them right after backward, once"
    fix_safety = "review"

    def visit_Module(self, node: cst.Module) -> None:
        if not self.ctx.xm_form:  # in the ddp form DDP reduces the gradients during the backward
            return
        for decision in self.ctx.steps.reductions:
            if not decision.already_reduced:
                self._insert(decision)
        own = {(site.line, site.column): site for site in summarize(self.ctx.input_code).own_reductions}
        if not own:
            return
        for call in patterns.find_all(node, lambda n: isinstance(n, cst.Call)):
            site = own.get(self.ctx.position(call))
            if site is not None:
                self.finding(call, f"{site.what}: the script reduces the gradients itself here, and the xm form "
                             "reduces every update again (xm.optimizer_step or the all-reduce after the backward): "
                             "each update is reduced twice, one more collective per step",
                             "remove the script's own gradient reduction (the xm form reduces every update), or "
                             "migrate with --data-parallel ddp (auto does) to keep it")

    def _statement(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """The statement holding ``node`` that sits in a block (one-line suites climb to their owner)."""
        current: cst.CSTNode | None = node
        while current is not None:
            parent = self.ctx.parent(current)
            if isinstance(current, (cst.SimpleStatementLine, cst.BaseCompoundStatement)) and isinstance(
                    parent, (cst.IndentedBlock, cst.Module)):
                return current
            current = parent
        return None

    def _inside(self, node: cst.CSTNode, block: cst.CSTNode) -> cst.CSTNode | None:
        """The statement of ``block`` that holds ``node``, else None."""
        current: cst.CSTNode | None = node
        while current is not None:
            parent = self.ctx.parent(current)
            if parent is block:
                return current
            current = parent
        return None

    def _insert(self, decision: Reduction) -> None:
        ctx = self.ctx
        backward = self._statement(decision.backward)
        candidate = self._statement(decision.first_touch)
        if backward is None or candidate is None or not decision.optimizers:
            return
        where, anchor = "after", backward
        while candidate is not None:
            block = ctx.parent(candidate)
            holder = self._inside(backward, block)
            if holder is not None:
                where, anchor = "after", holder  # the backward is in this block: right after it
                break
            owner = ctx.parent(block)
            # The reduction runs whenever the step does: out of an `if clip:` or a loop over the parameters,
            # up to the block that holds every step (the body, or an accumulation's `if`).
            holds_steps = all(self._inside(s, block) is not None for s in decision.local_steps)
            if not holds_steps and owner is not decision.within and not isinstance(owner, cst.Module):
                candidate = self._statement(owner)
                continue
            where, anchor = "before", candidate
            break
        world = ctx.spell("world_size")
        name = common.fresh_name(ctx, decision.backward, "gradients")
        statements: list[cst.BaseStatement] = []
        for optimizer in decision.optimizers:
            statements.append(ctx.statement(f"{name} = {ctx.spell('fetch_gradients', optimizer)}"))
            statements.append(ctx.statement(f"{ctx.spell('all_reduce')}(\"sum\", {name}, scale=1.0 / {world})"))
        statements[0] = statements[0].with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(_COMMENT))])
        reduce_text = f"{ctx.spell('all_reduce')}(\"sum\", {name}, scale=1.0 / {world})"
        message = (f"gradients all-reduced once {'right after the backward' if where == 'after' else 'before'} "
                   f"they are read or changed: {reduce_text}")
        if where == "after":
            self.insert_after(anchor, statements, message)
        else:
            self.insert_before(anchor, statements, message)
