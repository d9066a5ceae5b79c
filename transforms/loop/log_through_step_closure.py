"""XLA310 log-through-step-closure: logging that reads tensors in a training loop runs in xm.add_step_closure.

What it does:
    In a training step (a training loop's body, or a function the step calls: ``self.train_step(batch)``), as
    the step model sees it (``xla_migrate.analysis.steps``), a statement that only logs (``print``,
    ``logger.info(...)`` and other logger methods, ``writer.add_scalar(...)``, ``pbar.set_postfix(...)``,
    ``accelerator.print``), possibly under ``if step % N == 0:``, and reads a tensor's value (``loss.item()``,
    ``float(loss)``, ``print(loss)``, ``f"{loss:.4f}"``) is moved into the target's step closure:
    ``xm.add_step_closure(lambda loss, step: print(...), args=(loss, step))``. The lambda takes the tensors
    (and the loop's own variables it reads) as arguments, so it logs the values of this step, read after
    the step's graph ran; long closures get one argument per line. Reads that feed control flow or are
    accumulated are left to XLA311, which reports them. Logging after the step's end is left as it is: after
    a step barrier in the loop body or, in a loop that iterates no device loader, after the optimizer step
    (where XLA302 marks the step); its reads cost no extra graph run. In a device-loader loop the step ends
    at the next batch, so everything in the body is mid-step.

Why:
    XLA runs a step's graph when the step is marked. Reading a value in the middle of the step
    (``loss.item()``) runs the graph up to that value first: measured on a 20-step loop, ``loss.item()``
    every step doubled the graph executions (40 for 20 steps) and added a compile; through
    ``xm.add_step_closure`` it was back to one execution per step. The seeds: print lazy tensors through
    ``xm.add_step_closure``.

Example:
    for step, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}")

Use instead:
    for step, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            xm.add_step_closure(lambda step, loss: print(f"step {step} loss {loss.item():.4f}"), args=(step, loss))
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.analysis import steps
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.common import short

# Longer closures get one argument per line.
LINE_LIMIT = 100


class LogThroughStepClosure(Rule):
    code = "XLA310"
    name = "log-through-step-closure"
    summary = "logging that reads tensors in a training step (loss.item(), print(loss)) -> xm.add_step_closure"

    def visit_Expr(self, node: cst.Expr) -> None:
        found = steps.logging_statement(self.ctx, node)
        if found is None:
            return
        call, _, region = found
        captured = steps.captured_names(self.ctx, [call], region)
        params = ", ".join(captured)
        args = f", args=({params},)" if len(captured) == 1 else (f", args=({params})" if captured else "")
        closure = self.ctx.spell("add_step_closure")
        head = f"lambda {params}:" if captured else "lambda:"
        template = patterns.parsed_expression(f"{closure}({head} {patterns.HOLE}{args})")

        one_line = len(patterns.code_of(call)) + len(f"{closure}({head} {args})") + self._indent(node)
        if one_line > LINE_LIMIT and isinstance(template, cst.Call):
            template = _one_argument_per_line(template, self.ctx.module.default_indent)

        def wrap(updated: cst.BaseExpression) -> cst.BaseExpression:
            return patterns.fill(template, updated)

        where = steps.describe_path(self.ctx, region)
        self.replace(call, wrap, f"{short(call)} reads tensors mid-step{where} -> {closure}({head} ...)")

    def _indent(self, node: cst.CSTNode) -> int:
        depth, current = 0, self.ctx.parent(node)
        while current is not None:
            if isinstance(current, cst.IndentedBlock):
                depth += 1
            current = self.ctx.parent(current)
        # Visual width: a tab counts as four columns, so tabs and spaces lay a call out alike.
        return depth * len(self.ctx.module.default_indent.expandtabs(4))


def _one_argument_per_line(call: cst.Call, indent: str) -> cst.Call:
    """``f(a, b)`` as ``f(\n    a,\n    b,\n)`` at the statement's indentation, one more of the file's own
    indentation unit (tabs in a tab-indented file) for the arguments."""
    def line_break(last_line: str) -> cst.ParenthesizedWhitespace:
        return cst.ParenthesizedWhitespace(indent=True, last_line=cst.SimpleWhitespace(last_line))

    args = list(call.args)
    laid_out = [a.with_changes(comma=cst.Comma(whitespace_after=line_break(indent if i < len(args) - 1 else "")))
                for i, a in enumerate(args)]
    return call.with_changes(args=laid_out, whitespace_before_args=line_break(indent))
