"""XLA314 finite-check-in-step-closure: a check that stops training on a non-finite loss runs in a step closure.

What it does:
    In a training step (the loop's body, or a function the step calls), the pair::

        loss_value = loss.item()
        if not math.isfinite(loss_value):
            print("Loss is {}, stopping training".format(loss_value))
            sys.exit(1)

    (``math.isfinite``/``isnan``/``isinf`` or their ``torch`` forms, a body that stops with ``sys.exit``,
    ``exit``, ``os._exit`` or ``raise``) moves, unchanged, into a function that a step closure runs after
    the step's graph ran::

        def check_finite(loss):
            loss_value = loss.item()
            if not math.isfinite(loss_value):
                ...
        xm.add_step_closure(check_finite, args=(loss,))

    The function takes the tensors the read names and the loop's own variables it uses. Only when the value
    is read nowhere else (``metric_logger.update(loss=loss_value)`` afterwards keeps the read, which XLA311
    reports), and the check neither breaks, continues nor returns.

Why:
    ``loss.item()`` mid-step runs the graph up to the loss before the step ends: a second graph execution
    and a host sync every step. In a step closure the value is read after the step, at no extra execution.
    The check then stops training one update later than the original did (the step with the non-finite
    loss is applied before the closure runs); the run still ends with the same message and exit code.

Example:
    for samples, targets in data_loader:
        loss = criterion(model(samples), targets)
        loss_value = loss.item()
        if not math.isfinite(loss_value):
            sys.exit(1)
        loss.backward()
        optimizer.step()

Use instead:
    for samples, targets in data_loader:
        loss = criterion(model(samples), targets)
        def check_finite(loss):
            loss_value = loss.item()
            if not math.isfinite(loss_value):
                sys.exit(1)
        xm.add_step_closure(check_finite, args=(loss,))
        loss.backward()
        optimizer.step()
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.analysis import steps
from xla_migrate.engine.rule import Rule
from xla_migrate.analysis.steps import FiniteCheck
from xla_migrate.transforms.common import fresh_name, short


class FiniteCheckInClosure(Rule):
    code = "XLA314"
    name = "finite-check-in-step-closure"
    summary = "a finite check that stops training (loss.item(); if not math.isfinite(...): sys.exit(1)) -> a step closure"
    fix_safety = "review"

    def visit_Module(self, node: cst.Module) -> None:
        for check in self.ctx.steps.host_reads.finite_checks:
            self._move(check)

    def _move(self, check: FiniteCheck) -> None:
        ctx = self.ctx
        value = check.assign.body[0].targets[0].target.value  # type: ignore[attr-defined]
        params = steps.captured_names(ctx, [check.read, check.check], check.region, exclude=frozenset({value}))
        name = fresh_name(ctx, check.check, "check_finite")
        closure = ctx.spell("add_step_closure")
        args = f", args=({', '.join(params)},)" if params else ""
        call = ctx.statement(f"{closure}({name}{args})")
        assign = check.assign.with_changes(leading_lines=[])
        signature = cst.Parameters(params=[cst.Param(cst.Name(p)) for p in params])

        def wrapped(updated: cst.If) -> cst.FunctionDef:
            return cst.FunctionDef(name=cst.Name(name), params=signature, leading_lines=updated.leading_lines,
                                   body=cst.IndentedBlock(body=[assign, updated.with_changes(leading_lines=[])]))

        self.remove(check.assign, f"{short(check.read)}: read in the step closure {name}() below")
        self.replace(check.check, wrapped, f"{short(check.check.test)}: the check that stops training runs "
                                           f"after the step, in {name}()")
        self.insert_after(check.check, [call], f"{closure}({name}{args}): the finite check reads the loss after "
                                                "the step's graph ran")
