"""XLA311 lazy-tensor-host-reads: tensor values read every step for control flow or accumulation are reported.

What it does:
    In a training loop (the innermost loop that calls ``backward()``), reports each read of a tensor's value
    to the host that is not pure logging: ``loss.item()``, ``float(loss)``, ``x.tolist()``, ``x.cpu()``,
    ``x.numpy()`` in assignments, accumulations (``total += loss.item()``), calls (``losses.append(...)``),
    and ``if``/``while`` conditions that test a tensor (``if loss.item() > 10:``, ``if torch.isnan(loss):``).
    Nothing is rewritten: the value is used in the step itself. Logging statements are XLA310's (moved into
    a step closure); reads inside ``xm.add_step_closure`` are already where they belong, and so are reads
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

from xla_migrate.rule import Rule
from xla_migrate.transforms.loop import lazy_tensor_common as lazy
from xla_migrate.transforms.common import short

ACCUMULATE = ("keep the running value on the device (total += loss.detach()) and read it once after the loop "
              "or every N steps, or log it through xm.add_step_closure")
CONTROL = "decide from a value read every N steps (or after the loop), not every step"


class LazyTensorHostReads(Rule):
    code = "XLA311"
    name = "lazy-tensor-host-reads"
    summary = "tensor reads in a training loop that are not logging (total += loss.item(), if loss > x) are reported"
    on_xla_code = True  # CUDA remnants in code that already runs on XLA are migrated too

    def _report(self, node: cst.CSTNode, fix: str, what: str) -> None:
        self.finding(node, f"{short(node)}: {what} every step (a device sync: the graph runs mid-step)", fix)

    def visit_Call(self, node: cst.Call) -> None:
        loop = lazy.training_loop_of(self.ctx, node)
        if loop is None or lazy.in_step_closure(self.ctx, node) or lazy.after_step_end(self.ctx, node, loop):
            return
        if not lazy.reads(self.ctx, node, set()) == [node] and not self._is_conversion(node, loop):
            return
        if lazy.is_logging_read(self.ctx, node) or self._in_condition(node):
            return
        if self._is_outermost_read(node, loop):
            self._report(node, ACCUMULATE, "reads a tensor's value to the host")

    def _is_conversion(self, node: cst.Call, loop: cst.CSTNode) -> bool:
        return lazy.reads(self.ctx, node, lazy.tensor_names(self.ctx, loop)) == [node]

    def _is_outermost_read(self, node: cst.Call, loop: cst.CSTNode) -> bool:
        """``float(loss.item())`` is one read: report the outer call only."""
        names = lazy.tensor_names(self.ctx, loop)
        current = self.ctx.parent(node)
        while current is not None and not isinstance(current, (cst.BaseStatement, cst.BaseSmallStatement)):
            if isinstance(current, cst.Call) and lazy.reads(self.ctx, current, names) == [current]:
                return False
            current = self.ctx.parent(current)
        return True

    def _in_condition(self, node: cst.CSTNode) -> bool:
        current, child = self.ctx.parent(node), node
        while current is not None and not isinstance(current, (cst.BaseStatement, cst.BaseSmallStatement)):
            child, current = current, self.ctx.parent(current)
        return isinstance(current, (cst.If, cst.While)) and child is current.test

    def _condition(self, node: cst.If | cst.While) -> None:
        loop = lazy.training_loop_of(self.ctx, node)
        if loop is None or node is loop or lazy.after_step_end(self.ctx, node, loop):
            return
        if lazy.reads(self.ctx, node.test, lazy.tensor_names(self.ctx, loop)):
            self.finding(node.test, f"{short(node.test)}: a condition on a tensor's value reads it to the host "
                                    "every step (a device sync: the graph runs mid-step)", CONTROL)

    def visit_If(self, node: cst.If) -> None:
        self._condition(node)

    def visit_While(self, node: cst.While) -> None:
        self._condition(node)
