"""XLA204 optimizer-step-to-xla: optimizer.step() becomes the target's optimizer step.

What it does:
    Rewrites ``optimizer.step()`` to ``xm.optimizer_step(optimizer)`` for every optimizer the script holds:
    names and ``self`` attributes bound to a ``torch.optim`` (or syncfree) optimizer, function parameters
    named ``optimizer``, ``opt`` or ``*_optimizer``, and names that say so (``optimizer``,
    ``self.g_optimizer``), and in a distributed script any other step the step model counts as a training
    loop's update (``self.opt.step()`` after its backward). A closure (``optimizer.step(closure)``) travels as
    ``optimizer_args={"closure": closure}``. ``scheduler.step()``, ``scaler.step(optimizer)`` and any other
    ``.step()`` are left alone: with a GradScaler the scaler makes the step (XLA202 rewrites it where the
    target has no scaler). A direct ``optimizer.step()`` in an AMP script (bfloat16 autocast without a
    scaler, or the unscaled branch of a script) is rewritten too: it is an unscaled step like any other.
    An optimizer from ignite's ``idist.auto_optim(...)`` is left as it is (a note says why): on XLA (ignite's
    ``xla-tpu`` backend) its ``step()`` is already ``xm.optimizer_step(optimizer, barrier=True)`` (XLA302's
    barrier stays: on other backends auto_optim changes nothing).
    Scripts that build an ``accelerate.Accelerator`` are left alone: the prepared optimizer all-reduces on
    XLA itself (XLA605).
    In a distributed loop whose gradients XLA406 all-reduces explicitly (they are clipped or read before the
    step) the step stays ``optimizer.step()``: the gradients are reduced exactly once. So it does in a
    distributed script migrated in the ddp data-parallel form (``--data-parallel ddp``), where DDP on the
    ``xla`` process group reduces them during the backward, and in the spmd form (``--data-parallel
    spmd``), where the compiler reduces the gradients of the sharded batch itself.

Why:
    ``xm.optimizer_step`` all-reduces the gradients across replicas before stepping (a no-op on one device),
    so the same script runs on one device or many; it is the step the seeds' recipe and pytorch/xla's
    examples use.

Example:
    loss.backward()
    optimizer.step()
    scheduler.step()

Use instead:
    loss.backward()
    xm.optimizer_step(optimizer)
    scheduler.step()
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.analysis.data_parallel import optimizer_receiver
from xla_migrate.analysis.steps.collect import steps_itself
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.common import short


class OptimizerStepToXla(Rule):
    code = "XLA204"
    name = "optimizer-step-to-xla"
    summary = "optimizer.step() -> xm.optimizer_step(optimizer) for every optimizer (never scheduler or scaler steps)"

    def visit_Call(self, node: cst.Call) -> None:
        method = patterns.method_call(node, "step")
        # Accelerate's prepared optimizer already all-reduces on XLA (XLA605).
        if method is None or self.ctx.facts.uses_accelerate:
            return
        spelling = patterns.dotted_name(method.value)
        if spelling is None or not optimizer_receiver(self.ctx, spelling, method.value, node):
            return
        if self.ctx.ddp_form:
            return  # DDP all-reduced the gradients in the backward: xm.optimizer_step would reduce again
        if self.ctx.spmd_form:
            return  # one SPMD program: the compiler reduces the sharded batch's gradients in the backward
        if steps_itself(self.ctx, node):
            # ignite's idist.auto_optim optimizer: its step() is xm.optimizer_step(opt, barrier=True) on XLA.
            self.ctx.record_change(self.code, node, f"{short(node)} left as it is: the optimizer comes from ignite's "
                                   "idist.auto_optim, whose step() on XLA (backend 'xla-tpu') is already "
                                   "xm.optimizer_step(optimizer, barrier=True): it reduces (the step barrier stays for the other backends, where auto_optim changes nothing; after barrier=True it finds nothing to run)")
            return
        if self.ctx.steps.explicitly_reduced_step(node):
            # XLA406 all-reduces this loop's gradients right after the backward: a second reduction here
            # would run one more collective per step (the step model decides for both rules).
            return
        closure = self._closure(node)
        if closure is False:
            self.finding(node, f"{short(node)}: a step with arguments other than a closure is not rewritten",
                         "call xm.optimizer_step(optimizer, optimizer_args={...}) by hand")
            return
        extra = f", optimizer_args={{\"closure\": {patterns.code_of(closure)}}}" if closure is not None else ""
        step = patterns.parsed_expression(self.ctx.spell("optimizer_step", spelling + extra))
        assert isinstance(step, cst.Call)

        def optimizer_step(updated: cst.Call) -> cst.Call:
            receiver = updated.func.value if isinstance(updated.func, cst.Attribute) else method.value
            first = step.args[0].with_changes(value=receiver)
            return step.with_changes(args=[first, *step.args[1:]], lpar=updated.lpar, rpar=updated.rpar)

        self.replace(node, optimizer_step, f"{short(node)} -> {short(step, 80)}")

    def _closure(self, node: cst.Call) -> cst.BaseExpression | None | bool:
        """The closure argument; None without arguments; False for anything else."""
        if not node.args:
            return None
        if len(node.args) == 1 and not node.args[0].star and (
                node.args[0].keyword is None or node.args[0].keyword.value == "closure"):
            return node.args[0].value
        return False
