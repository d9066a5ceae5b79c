"""XLA302 step-barrier: loops without a device loader mark the step after the update (eval loops: per batch).

What it does:
    For each loop the step model (``xla_migrate.analysis.steps``) sees running device work per iteration that iterates
    no device loader after migration (a ``while`` loop, ``next(it)``, a batch function, a list of batches, a
    loader XLA301 does not wrap) and marks no step yet, inserts the target's step barrier once:

    - training loops: after the update, the last statement of the block holding the optimizer step that
      holds the step or a later update call (``scaler.update()``, ``zero_grad()``, a scheduler's ``step()``).
      The step may be in a called function (``self.train_step(batch)``, a loss-scaler object's
      ``__call__``, ``loss.accumulate_gradients(...)`` of an object a factory made when only one class of
      the project defines that method): the barrier goes after that call or the update after it. With gradient accumulation it runs once per
      optimizer step: inside ``if (i + 1) % k == 0:`` when the update is guarded (XLA301 then gives the loop
      no device loader, which would mark every micro-step), after the update when the micro-steps are a
      nested loop. Optimizers stepped in a loop over their list (``for optimizer in optimizers:
      optimizer.step()``, ``for name, opt in optims.items():``) each step once: the barrier goes after that
      loop. A training loop with no step in sight gets it at the end of its body;
    - evaluation loops (no backward, a model forward per iteration): at the end of the body, once per batch.

    Loops that XLA301 wraps in ``pl.MpDeviceLoader`` get none: the device loader marks the step. A loop
    written on one line gets the barrier appended after a semicolon. Scripts that build an
    ``accelerate.Accelerator`` get none: Accelerate's prepared loaders mark the step (XLA605); nor does a loop
    whose backward is Lightning Fabric's ``fabric.backward(loss)``: Fabric's strategy reduces and steps (its
    ``optimizer.step()`` stays as it is, XLA204), and its loaders mark the step.

    Where the step ends (``xla_migrate.analysis.step_end``): a training step's barrier moves past the device
    work that follows the update in the same block (an EMA or teacher update: ``accumulate(g_ema, g, 0.999)``,
    ``ema.update(model)``, in-place updates of a second model's parameters; the reduction of the step's
    losses; values XLA310 keeps on the device for logging), up to the first statement that reads a value,
    leaves the loop, saves or evaluates. An evaluation batch whose first read copies a value already
    computed (``losses[k] = loss.item()``) gets the barrier right before that read, also over a device
    loader: the batch runs one graph, where a barrier at its end ran a second one for the still-pending
    logits. A collective that runs after the step's barrier (in a logging branch: ``if step % log_every == 0:
    dist.all_reduce(loss_t)``, or after a read that stopped the barrier) gets a barrier of its own right after
    it (past the device work that follows it in its block, up to the first read), on the steps that run it.
    Never in the methods of an ``nn.Module``, also one whose base class is a project class imported
    from another module (a loop over blocks or decoder steps in ``forward``,
    ``__init__`` building submodules) or in a project module's import-time code: those loops are not steps.
    The process function of an ignite ``Engine(train_step)`` that runs a backward and an update gets the
    barrier at its end (before its ``return``): ignite's loop runs it per batch and marks no step. And a
    device value that the code after a loop reads several times (``val_loss = evaluate(...)``, then
    ``scheduler.step(val_loss)``, ``val_loss.item()``, ``f"{val_loss:.4f}"``) gets one barrier before the
    first read: each read of a pending value runs its graph again.

Why:
    XLA records operations lazily and runs them when the step is marked. Without a barrier the graph grows
    with every iteration until something reads a value, so every step compiles anew and memory runs out
    (measured: a loop whose step ran in a loss-scaler object compiled 6 growing graphs in 6 steps). A
    barrier right after ``loss.backward()`` under accumulation would split each optimizer step into one graph
    per micro-step, with the clipping and the step spilling into the next. The seeds: without a device
    loader, call ``xm.mark_step()`` at the end of each training step (``torch_xla.sync()`` from torch_xla 2.4;
    ``xm.mark_step`` is deprecated in 2.8).

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
        optimizer.zero_grad()
        xm.mark_step()
        step += 1
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule


class StepBarrier(Rule):
    code = "XLA302"
    name = "step-barrier"
    summary = "loops without a device loader get the step barrier (xm.mark_step()) after the update, eval loops per batch"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._engine_steps: set[cst.FunctionDef] = set()

    def _visit_loop(self, node: cst.For | cst.While) -> None:
        steps = self.ctx.steps
        step = steps.loop(node)
        if step is None or not steps.needs_barrier(step):
            return
        site = steps.end_of_step(step)
        assert site is not None
        barrier = self.ctx.spell("step_barrier")
        if site.before_read:
            what = ("in each evaluation batch, before its first host read (the batch's graph runs once; the read "
                    "copies its result)")
        elif step.kind == "eval":
            what = "at the end of each evaluation batch"
        elif not site.after_update:
            what = "at the end of the training step"
        elif step.accumulation is not None:
            what = "after the update, once per optimizer step (gradient accumulation)"
        else:
            what = "after the update"
        if isinstance(site.statement, cst.SimpleStatementSuite):
            # `for x in data: step(x)` -> `for x in data: step(x); xm.mark_step()`
            call = cst.Expr(patterns.parsed_expression(barrier))

            def append(updated: cst.SimpleStatementSuite) -> cst.SimpleStatementSuite:
                *rest, last = updated.body
                separator = cst.Semicolon(whitespace_after=cst.SimpleWhitespace(" "))
                return updated.with_changes(body=[*rest, last.with_changes(semicolon=separator), call])

            self.replace(site.statement, append, f"step barrier {what} (one-line block): {barrier}")
            return
        self.insert_after(site.statement, [self.ctx.statement(barrier)], f"step barrier {what}: {barrier}")
        for after in steps.collective_barriers(step):
            self.insert_after(after.statement, [self.ctx.statement(barrier)],
                              f"step barrier after a collective that runs after the step's barrier: {barrier} "
                              "(every replica runs it in this graph; left to the first read of its result, the "
                              "replicas that read it would run it without the others)")

    def visit_Module(self, node: cst.Module) -> None:
        for repeated in self.ctx.steps.repeated_reads:
            barrier = self.ctx.spell("step_barrier")
            lines = ", ".join(str(line) for line in repeated.lines)
            self.insert_before(repeated.first, [self.ctx.statement(barrier)],
                               f"{repeated.name} (a device value still to compute) is read {len(repeated.lines)} "
                               f"times (lines {lines}): each read would run its graph again; {barrier} runs it "
                               "once before the first")

    def visit_Call(self, node: cst.Call) -> None:
        """An ignite ``Engine(train_step)``: the engine's loop runs ``train_step`` per batch, so the barrier
        ends that function (before its ``return``): one graph per iteration, its output already computed
        when the engine's handlers read it."""
        function = self.ctx.steps.engine_step(node)
        if function is None or function in self._engine_steps:
            return
        self._engine_steps.add(function)
        barrier = self.ctx.spell("step_barrier")
        last = function.body.body[-1]  # type: ignore[union-attr]
        what = (f"step barrier at the end of {function.name.value}(), the process function that ignite's "
                f"Engine runs once per iteration (its loop is ignite's: nothing else marks the step): {barrier}")
        returns = isinstance(last, cst.SimpleStatementLine) and any(isinstance(s, cst.Return) for s in last.body)
        if returns:
            self.insert_before(last, [self.ctx.statement(barrier)], what)
        else:
            self.insert_after(last, [self.ctx.statement(barrier)], what)

    def visit_For(self, node: cst.For) -> None:
        self._visit_loop(node)

    def visit_While(self, node: cst.While) -> None:
        self._visit_loop(node)
