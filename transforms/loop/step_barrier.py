"""XLA302 step-barrier: training loops without a device loader mark the step after the optimizer step.

What it does:
    For each training loop (the innermost loop that calls ``backward()``) that iterates no device loader
    after migration (a ``while`` loop, ``next(it)``, a list of batches, or a loader XLA301 does not wrap)
    and has no barrier yet, inserts the target's step barrier once: right after the statement of the loop
    body that holds the optimizer step (``optimizer.step()``, ``scaler.step(optimizer)``, also inside an
    ``if`` for gradient accumulation), or at the end of the loop body when no step call is found. Loops
    that XLA301 wraps in ``pl.MpDeviceLoader`` get none: the device loader marks the step. The decision is
    shared with XLA301 (``xla_migrate.loops``). A loop written on one line gets the barrier appended
    after a semicolon. Scripts that build an ``accelerate.Accelerator`` get none: Accelerate's prepared
    loaders mark the step (XLA605).

Why:
    XLA records operations lazily and runs them when the step is marked. Without a barrier the graph grows
    with every iteration until something reads a value, so every step compiles anew and memory runs out.
    The seeds: without a device loader, call ``xm.mark_step()`` at the end of each training step
    (``torch_xla.sync()`` from torch_xla 2.4; ``xm.mark_step`` is deprecated in 2.8).

Example:
    while step < max_steps:
        x, y = next(batches)
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        step += 1

Use instead:
    while step < max_steps:
        x, y = next(batches)
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        xm.mark_step()
        optimizer.zero_grad()
        step += 1
"""

from __future__ import annotations

import libcst as cst

from xla_migrate import loops
from xla_migrate.rule import Rule


class StepBarrier(Rule):
    code = "XLA302"
    name = "step-barrier"
    summary = "training loops without a device loader get the step barrier (xm.mark_step()) after the step"

    def _visit_loop(self, node: cst.For | cst.While) -> None:
        if not loops.needs_step_barrier(self.ctx, node):
            return
        barrier = self.ctx.spell("step_barrier")
        if not isinstance(node.body, cst.IndentedBlock):
            # `for x in data: step(x)` -> `for x in data: step(x); xm.mark_step()`
            call = cst.Expr(cst.parse_expression(barrier))

            def append(updated: cst.SimpleStatementSuite) -> cst.SimpleStatementSuite:
                *rest, last = updated.body
                separator = cst.Semicolon(whitespace_after=cst.SimpleWhitespace(" "))
                return updated.with_changes(body=[*rest, last.with_changes(semicolon=separator), call])

            self.replace(node.body, append, f"step barrier at the end of the one-line training loop: {barrier}")
            return
        body = list(node.body.body)
        anchor = self._step_statement(body) or body[-1]
        what = "after the optimizer step" if anchor is not body[-1] or self._step_statement(body) else \
            "at the end of the training step"
        self.insert_after(anchor, [self.ctx.statement(barrier)], f"step barrier {what}: {barrier}")

    def visit_For(self, node: cst.For) -> None:
        self._visit_loop(node)

    def visit_While(self, node: cst.While) -> None:
        self._visit_loop(node)

    def _step_statement(self, body: list[cst.BaseStatement]) -> cst.BaseStatement | None:
        """The statement of the loop body that holds the optimizer step (the last one if several)."""
        ctx = self.ctx
        found: cst.BaseStatement | None = None
        for statement in body:
            hit = False

            class Finder(cst.CSTVisitor):
                def visit_Call(self, node: cst.Call) -> None:
                    nonlocal hit
                    if loops.is_optimizer_step(ctx, node):
                        hit = True

                # Steps inside nested loops or functions belong to them.
                def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
                    return False

            statement.visit(Finder())
            if hit:
                found = statement
        return found
