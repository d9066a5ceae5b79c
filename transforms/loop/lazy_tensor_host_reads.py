"""XLA311 lazy-tensor-host-reads: tensor values read every step for control flow or accumulation are reported.

What it does:
    In a training step or an evaluation batch, as the step model sees them (``xla_migrate.analysis.steps``: the loop's
    body, and the functions it calls, followed through ``self`` methods and objects' ``__call__``), reports
    each read of a tensor's value to the host that is not pure logging: ``loss.item()``, ``float(loss)``,
    ``x.tolist()``, ``x.cpu()``,
    ``x.numpy()`` in assignments, accumulations (``total += loss.item()``), calls (``losses.append(...)``),
    and ``if``/``while`` conditions that test a tensor (``if loss.item() > 10:``, ``if torch.isnan(loss):``).
    A read in a called function names its call path (``loss.item() in Trainer._run_batch (run every step
    by the loop at line 40: self._run_batch(...))``). Nothing is rewritten here. Logging statements are
    XLA310's (moved into a step closure), running sums XLA313's (kept on the device), finite checks that stop
    training XLA314's; when those rules run, the reads they move are not reported. Reads inside
    ``xm.add_step_closure`` are already where they belong, and so are reads
    after the step's end (after a step barrier, or after the optimizer step in a loop without a device
    loader, where XLA302 marks the step).

Why:
    Each read runs the step's graph up to that value before the step ends: a second graph execution every
    step (measured: ``loss.item()`` every step, 2 compiles and 40 executions for 20 steps instead of 1 and
    20). Accumulate on the device and read once (after the loop, or every N steps); decide control flow
    from a value read less often.

Example:
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        total_loss += loss.item()

Use instead:
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        total_loss += loss.detach()  # a device tensor; read it once, after the loop
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.analysis import steps
from xla_migrate.engine.rule import Rule
from xla_migrate.analysis.steps import Region
from xla_migrate.transforms.common import short

ACCUMULATE = ("keep the running value on the device (total += loss.detach()) and read it once after the loop "
              "or every N steps, or log it through xm.add_step_closure")
CONTROL = "decide from a value read every N steps (or after the loop), not every step"


class LazyTensorHostReads(Rule):
    code = "XLA311"
    name = "lazy-tensor-host-reads"
    summary = "tensor reads per training step or eval batch that no rule moves (if loss > x, x.cpu()) are reported"
    on_xla_code = True  # reports only: it runs on code already on XLA too
    reports_only = True

    def _report(self, node: cst.CSTNode, region: Region, fix: str, what: str) -> None:
        every = "every step" if region.step.kind == "train" else "every evaluation batch"
        where = steps.describe_path(self.ctx, region)
        self.finding(node, f"{short(node)}{where}: {what} {every} (a device sync: the graph runs mid-step)", fix)

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        if not steps.may_read(node):
            return
        region = ctx.steps.region(node)
        if region is None or steps.in_step_closure(ctx, node) or ctx.steps.after_step_end(node, region):
            return
        if not steps.reads(ctx, node, set()) == [node] and not self._is_conversion(node, region):
            return
        if steps.is_logging_read(ctx, node) or self._in_condition(node) or ctx.steps.moves_read(node):
            return
        if self._is_outermost_read(node, region):
            self._report(node, region, ACCUMULATE, "reads a tensor's value to the host")

    def _is_conversion(self, node: cst.Call, region: Region) -> bool:
        return steps.reads(self.ctx, node, self.ctx.steps.tensor_names(region)) == [node]

    def _is_outermost_read(self, node: cst.Call, region: Region) -> bool:
        """``float(loss.item())`` is one read: report the outer call only."""
        names = self.ctx.steps.tensor_names(region)
        current = self.ctx.parent(node)
        while current is not None and not isinstance(current, (cst.BaseStatement, cst.BaseSmallStatement)):
            if isinstance(current, cst.Call) and steps.reads(self.ctx, current, names) == [current]:
                return False
            current = self.ctx.parent(current)
        return True

    def _in_condition(self, node: cst.CSTNode) -> bool:
        current, child = self.ctx.parent(node), node
        while current is not None and not isinstance(current, (cst.BaseStatement, cst.BaseSmallStatement)):
            child, current = current, self.ctx.parent(current)
        return isinstance(current, (cst.If, cst.While)) and child is current.test

    def _condition(self, node: cst.If | cst.While) -> None:
        ctx = self.ctx
        region = ctx.steps.region(node)
        if region is None or node is region.step.loop or ctx.steps.after_step_end(node, region):
            return
        if ctx.steps.moves_read(node):
            return
        if steps.reads(ctx, node.test, ctx.steps.tensor_names(region)):
            every = "every step" if region.step.kind == "train" else "every evaluation batch"
            where = steps.describe_path(ctx, region)
            self.finding(node.test, f"{short(node.test)}{where}: a condition on a tensor's value reads it to the "
                                    f"host {every} (a device sync: the graph runs mid-step)", CONTROL)

    def visit_If(self, node: cst.If) -> None:
        self._condition(node)

    def visit_While(self, node: cst.While) -> None:
        self._condition(node)
