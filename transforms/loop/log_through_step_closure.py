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

    Also moved (``xla_migrate.analysis.steps.host_reads``): ``losses.append(loss.item())`` on a list the loop
    only appends to (a list kept for logging, read after the loop); and a value read mid-step and then only
    logged (``D_x = output.mean().item()`` ... ``print(f"{D_x:.4f}")``): the read becomes ``.detach()`` and
    each logging statement reads ``D_x.item()`` in its closure. A closure behaves as the statement did
    (``xla_migrate.analysis.steps.closure_safety`` and ``closure_args``): host values in it (``optimizer.param_groups[0]["lr"]``,
    ``time.time() - start``, ``self.global_step``) are evaluated at the step and passed as arguments; a
    ``try`` or ``with`` of the step whose body only logs moves whole into a function the closure runs
    (the handler still catches the logger's errors, the file is open); a statement under any other ``try``
    or ``with`` of the step stays (XLA311 reports it), and so does a statement followed in its block by
    ``sys.exit``, ``raise``, ``return`` or ``break`` (it runs once, on the way out: deferred, it would print
    late or never). A training loop that can end at a ``break`` gets the step barrier right after it, so the
    last step's closures run before what follows the loop (a device loader marks the step only when it runs
    out of batches).

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
from xla_migrate.analysis.steps import closure_args, closure_safety
from xla_migrate.analysis.steps.reads import loaded_names
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.common import fresh_name, short
from xla_migrate.transforms.loop.accumulate_on_device import detach_read

# Longer closures get one argument per line.
LINE_LIMIT = 100


class LogThroughStepClosure(Rule):
    code = "XLA310"
    name = "log-through-step-closure"
    summary = "logging that reads tensors in a training step (loss.item(), print(loss)) -> xm.add_step_closure"

    def visit_Module(self, node: cst.Module) -> None:
        for logged in self.ctx.steps.host_reads.logged:
            for read in logged.reads:
                detach_read(self, read, f"{logged.name} is only logged: it stays on the device until the logging "
                                        "reads it after the step")
            for mention in logged.mentions:
                self.replace(mention, _read_back(logged.kind), f"{mention.value} -> {_READ_BACK[logged.kind]}"
                             .format(name=mention.value) + ": a tensor now, read where it is logged")

    def visit_Expr(self, node: cst.Expr) -> None:
        found = steps.logging_statement(self.ctx, node)
        if found is None:
            return
        call, _, region = found
        captured, hoisted = self._arguments([call], [call], region, frozenset())
        names = [*captured, *(name for name, _ in hoisted)]
        values = [*captured, *(_one_line(value) for _, value in hoisted)]
        params = ", ".join(names)
        args = _args(values)
        closure = self.ctx.spell("add_step_closure")
        head = f"lambda {params}:" if names else "lambda:"
        template = patterns.parsed_expression(f"{closure}({head} {patterns.HOLE}{args})")

        one_line = len(patterns.code_of(call)) + len(f"{closure}({head} {args})") + self._indent(node)
        if one_line > LINE_LIMIT and isinstance(template, cst.Call):
            template = _one_argument_per_line(template, self.ctx.module.default_indent)

        def wrap(updated: cst.BaseExpression) -> cst.BaseExpression:
            return patterns.fill(template, updated)

        where = steps.describe_path(self.ctx, region)
        self.replace(call, wrap, f"{short(call)} reads tensors mid-step{where} -> {closure}({head} ...)")

    def visit_For(self, node: cst.For) -> None:
        self._leaving_loop(node)

    def visit_While(self, node: cst.While) -> None:
        self._leaving_loop(node)

    def _leaving_loop(self, node: cst.For | cst.While) -> None:
        """A training loop that can end at a ``break`` leaves the step closures of its last step queued (a
        device loader marks the step only when it runs out): a barrier right after the loop runs them before
        what follows, as the original printed them before it."""
        ctx = self.ctx
        step = ctx.steps.loop(node)
        if step is None or step.kind != "train" or not _breaks(node):
            return
        moved = [e for e in patterns.find_all(node.body, lambda n: isinstance(n, cst.Expr))
                 if steps.logging_statement(ctx, e) is not None]  # type: ignore[arg-type]
        moved += [c for c in patterns.find_all(node.body, lambda n: isinstance(n, (cst.With, cst.Try)))
                  if steps.logging_compound(ctx, c) is not None]  # type: ignore[arg-type]
        if not moved:
            return
        barrier = ctx.spell("step_barrier")
        self.insert_after(node, [ctx.statement(barrier)], f"{barrier} after the loop: it can end at a `break` with "
                                                          "its last step's logging closures still queued")

    def visit_With(self, node: cst.With) -> None:
        self._compound(node)

    def visit_Try(self, node: cst.Try) -> None:
        self._compound(node)

    def _compound(self, node: cst.With | cst.Try) -> None:
        """A ``try`` or ``with`` of the step whose body only logs moves whole into a function run by the step
        closure: the handler still catches the logger's errors, the file is open when the closure writes."""
        ctx = self.ctx
        region = steps.logging_compound(ctx, node)
        if region is None:
            return
        calls = [small.value for line in node.body.body for small in line.body]  # type: ignore[attr-defined]
        captured, hoisted = self._arguments([node], calls, region, frozenset(closure_safety.bound_inside(node)))
        names = [*captured, *(name for name, _ in hoisted)]
        values = [*captured, *(_one_line(value) for _, value in hoisted)]
        function = self._function_name(node)
        closure = ctx.spell("add_step_closure")
        call = ctx.statement(f"{closure}({function}{_args(values)})")
        signature = cst.Parameters(params=[cst.Param(cst.Name(n)) for n in names])

        def wrapped(updated: cst.CSTNode) -> cst.FunctionDef:
            return cst.FunctionDef(name=cst.Name(function), params=signature, leading_lines=updated.leading_lines,
                                   body=cst.IndentedBlock(body=[updated.with_changes(leading_lines=[])]))

        kind = "try" if isinstance(node, cst.Try) else "with"
        where = steps.describe_path(ctx, region)
        self.replace(node, wrapped, f"the `{kind}` block only logs tensors mid-step{where}: it moves whole into "
                                    f"{function}(), run by a step closure (its {'handler still catches' if kind == 'try' else 'resource is open'} when it runs)")
        self.insert_after(node, [call], f"{closure}({function}{_args(values)}): the logging runs after the step's graph")

    def _function_name(self, node: cst.CSTNode) -> str:
        """``log_step``, ``log_step_2``...: free in the scopes visible there and not yet taken by this run."""
        taken = getattr(self, "_taken", set())
        self._taken = taken
        base = fresh_name(self.ctx, node, "log_step")
        name, index = base, 2
        while name in taken or fresh_name(self.ctx, node, name) != name:
            name, index = f"{base}_{index}", index + 1
        taken.add(name)
        return name

    def _arguments(self, scanned: list[cst.CSTNode], calls: list[cst.Call], region,
                   exclude: frozenset[str]) -> tuple[list[str], list[tuple[str, cst.BaseExpression]]]:
        """The closure's arguments: the names it takes as they are at the step (the step's tensors, the loop's
        variables), then the host values it would otherwise evaluate late (closure_safety.host_values), each
        replaced in the closure's body by its parameter."""
        ctx = self.ctx
        tensors = ctx.steps.tensor_names(region)
        host = [value for call in calls for value in closure_args.host_values(ctx, call, tensors)
                if not any(n.value in exclude for n in loaded_names(value))]  # ``f.name`` of ``with ... as f``
        inside = {id(n) for value in host for n in patterns.find_all(value, lambda n: isinstance(n, cst.Name))}
        still_used = {n.value for node in scanned for n in loaded_names(node) if id(n) not in inside}
        captured = [n for n in steps.captured_names(ctx, scanned, region, exclude=exclude) if n in still_used]
        taken = set(captured) | {n.value for node in scanned for n in loaded_names(node)}
        hoisted = []
        for value in host:
            name = closure_args.parameter_name(value, taken)
            hoisted.append((name, value))
            self.replace(value, lambda updated, name=name: cst.Name(name),
                         f"{short(value)}: evaluated at the step, passed to the closure as {name}")
        return captured, hoisted

    def _indent(self, node: cst.CSTNode) -> int:
        depth, current = 0, self.ctx.parent(node)
        while current is not None:
            if isinstance(current, cst.IndentedBlock):
                depth += 1
            current = self.ctx.parent(current)
        # Visual width: a tab counts as four columns, so tabs and spaces lay a call out alike.
        return depth * len(self.ctx.module.default_indent.expandtabs(4))


class _BreakFinder(cst.CSTVisitor):
    """Finds a ``break`` of the loop whose body it visits (not of a loop nested in it, nor in a nested function)."""

    found = False

    def visit_Break(self, node: cst.Break) -> None:
        self.found = True

    def visit_For(self, node: cst.For) -> bool:
        return False

    def visit_While(self, node: cst.While) -> bool:
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False


def _breaks(loop: cst.For | cst.While) -> bool:
    """A ``break`` of this loop (not of a loop nested in it, nor in a nested function)."""
    finder = _BreakFinder()
    loop.body.visit(finder)
    return finder.found


def _one_line(node: cst.CSTNode) -> str:
    return " ".join(patterns.code_of(node).split())


def _args(values: list[str]) -> str:
    if not values:
        return ""
    return f", args=({values[0]},)" if len(values) == 1 else f", args=({', '.join(values)})"


_READ_BACK = {"item": "{name}.item()", "float": "float({name})", "int": "int({name})"}


def _read_back(kind: str):
    def read(updated: cst.Name) -> cst.BaseExpression:
        if kind == "item":
            return cst.Call(func=cst.Attribute(value=updated, attr=cst.Name("item")))
        return cst.Call(func=cst.Name(kind), args=[cst.Arg(updated)])

    return read


def _one_argument_per_line(call: cst.Call, indent: str) -> cst.Call:
    """``f(a, b)`` as ``f(\n    a,\n    b,\n)`` at the statement's indentation, one more of the file's own
    indentation unit (tabs in a tab-indented file) for the arguments."""
    def line_break(last_line: str) -> cst.ParenthesizedWhitespace:
        return cst.ParenthesizedWhitespace(indent=True, last_line=cst.SimpleWhitespace(last_line))

    args = list(call.args)
    laid_out = [a.with_changes(comma=cst.Comma(whitespace_after=line_break(indent if i < len(args) - 1 else "")))
                for i, a in enumerate(args)]
    return call.with_changes(args=laid_out, whitespace_before_args=line_break(indent))
