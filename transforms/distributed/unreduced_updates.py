"""XLA413 unreduced-update: in the xm form, every optimizer update its gradients are not shown reduced for is reported.

What it does:
    In a distributed script migrated in the xm form (``--data-parallel xm``, or what ``auto`` chose), checks
    every optimizer update of the file (in any function, method, ``__call__`` or branch: ``opt.step()``,
    ``scaler.step(opt)``) against the form's guarantee: its gradients are all-reduced exactly once, after
    the backward that feeds it and before anything reads them. Each update that misses it is reported, with
    the reason: a ``scaler.step(opt)`` of a kept GradScaler in a helper whose backward is in another module
    (nothing all-reduces before it), a step not taken for an optimizer's (it stays as it is), clipping or
    ``.grad`` reads there before an ``xm.optimizer_step`` that averages afterwards, an explicit all-reduce
    that cannot be placed after its backward. ``xla-migrate`` exits 1 when any is reported. ``auto`` never
    gives the xm form to such a program: it takes the ddp form there (the report says why). (XLA406 reduces
    where it can: after the backward, before a helper handed the model or the optimizer, in a helper that
    runs both the backward and the update, a loss scaler's ``__call__`` that another module calls.)

Why:
    An update that steps local gradients trains each replica on its own batch only: the replicas' weights
    drift apart without an error, and clipping the local gradients before the average changes the update.
    DDP on the ``xla`` process group (the ddp form) reduces every update in the backward, wherever the step
    is.

Example:
    # utils.py: the caller (engine.py) runs scaler.scale(loss).backward() and then this
    def optimizer_update(scaler, optimizer, model, max_norm):
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()

Use instead:
    # migrate the program with --data-parallel ddp (or auto), or all-reduce before the first read:
    def optimizer_update(scaler, optimizer, model, max_norm):
        gradients = xm._fetch_gradients(optimizer)
        xm.all_reduce("sum", gradients, scale=1.0 / xm.xrt_world_size())
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.analysis.data_parallel import update_problems
from xla_migrate.engine.rule import Rule


class UnreducedUpdate(Rule):
    code = "XLA413"
    name = "unreduced-update"
    summary = "xm form: each optimizer update not shown all-reduced once, before its gradients are read, is reported (exit 1)"

    def leave_Module(self, original_node: cst.Module) -> None:
        if not self.ctx.xm_form:
            return
        for problem in update_problems(self.ctx):
            self.finding(problem.node, problem.message, problem.fix)
