"""Host reads that can move off the step, decided once for the module: XLA313's running sums kept on the
device and per-step helpers that return the tensor, XLA314's finite checks moved into a step closure,
XLA310's values read mid-step and only logged (kept on the device until the logging reads them); so that
XLA311 reports exactly the reads that stay."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from ...syntax import patterns
from .kinds import CALL, Loop, Region, StepLoop
from .reads import APPENDS, appends_to_log, inside, is_logging_call, mentions, plain_read, reads

if TYPE_CHECKING:
    from ...engine.context import MigrationContext
    from .model import StepModel


# Host reads that can move off the step -------------------------------------------------------------------------
#
# XLA313 keeps running sums on the device (``total += loss.item()`` -> ``total += loss.detach()``, read once
# after the loop) and makes per-step helpers return the tensor (``return loss.item()`` -> ``return
# loss.detach()``) when every caller keeps it on the device or logs it; XLA314 moves a finite check that stops
# training into a step closure. Decided here, once, so that XLA311 reports exactly the reads that stay.

# Between a read and the value of ``total += ...``: only arithmetic.
_ARITHMETIC = (cst.BinaryOperation, cst.UnaryOperation)
FINITE_CHECKS = ("math.isfinite", "math.isnan", "math.isinf", "torch.isfinite", "torch.isnan", "torch.isinf")
STOPS = ("sys.exit", "builtins.exit", "builtins.quit", "os._exit")


@dataclass(frozen=True)
class DeviceSum:
    """``total += <value>`` in a step loop whose value reads a tensor (``loss.item()``, ``float(loss)``, a
    per-step helper's result): the reads become ``.detach()``, and ``total`` is read back once, right after
    ``loop``, the way it was read (``read_back``: "item", "float" or "int")."""

    statement: cst.AugAssign
    name: str
    reads: tuple[cst.Call, ...]
    loop: Loop
    read_back: str


@dataclass(frozen=True)
class DeviceReturn:
    """A function the step calls that returns ``loss.item()``: it returns ``loss.detach()`` instead; its
    callers keep the value on the device (a running sum) or log it in a step closure (``value.item()``)."""

    function: cst.FunctionDef
    reads: tuple[cst.Call, ...]
    # The names its callers bind the result to, and the logging statements that read them.
    names: tuple[tuple[Loop, str], ...]
    logging: tuple[cst.Expr, ...]
    mentions: tuple[cst.Name, ...]


@dataclass(frozen=True)
class FiniteCheck:
    """``value = loss.item()`` followed by ``if not math.isfinite(value): ... sys.exit(1)``: both move into a
    function run by a step closure, which takes the tensors the read names."""

    assign: cst.SimpleStatementLine
    check: cst.If
    read: cst.Call
    region: Region


def _read_kind(ctx: MigrationContext, node: cst.CSTNode) -> str | None:
    """"item" for ``x.item()``, "float"/"int" for ``float(x)``/``int(x)``, else None."""
    if not isinstance(node, cst.Call):
        return None
    if patterns.method_call(node, "item") and not node.args:
        return "item"
    names = ctx.qualnames(node.func)
    if len(node.args) == 1 and not node.args[0].star and node.args[0].keyword is None:
        if "builtins.float" in names:
            return "float"
        if "builtins.int" in names:
            return "int"
    return None


@dataclass(frozen=True)
class LoggedRead:
    """``name = <read>`` whose ``name`` the step only logs: ``read`` becomes a device value (``.detach()``) and
    every mention of ``name`` in the logging statements reads it (``kind``: "item", "float" or "int")."""

    assign: cst.Assign
    name: str
    reads: tuple[cst.Call, ...]
    kinds: tuple[str, ...]
    loop: Loop
    mentions: tuple[cst.Name, ...]
    logging: tuple[cst.Expr, ...]

    @property
    def kind(self) -> str:
        return self.kinds[0] if len(set(self.kinds)) == 1 else "item"


class _HostReadPlan:
    """The reads XLA313 and XLA314 move, decided once for the module (see above)."""

    def __init__(self, model: StepModel) -> None:
        self.model = model
        self.ctx = model.ctx
        self.sums: list[DeviceSum] = []
        self.returns: list[DeviceReturn] = []
        self.finite_checks: list[FiniteCheck] = []
        self.moved: set[cst.CSTNode] = set()
        # (loop, name) -> the callers' names bound to a per-step helper's tensor (device values).
        self.device_values: set[tuple[Loop, str]] = set()
        self.device_logging: set[cst.Expr] = set()
        self.device_mentions: set[cst.Name] = set()
        if self.ctx.runs("XLA313"):
            self._plan_returns()
            self._plan_sums()
        if self.ctx.runs("XLA314"):
            self._plan_finite_checks()
        # Values read mid-step and only logged: kept on the device, read by XLA310's closures (issue 30).
        self.logged: list[LoggedRead] = []
        if self.ctx.runs("XLA310"):
            for logged in self._plan_logged():
                self.logged.append(logged)
                self.moved.update(logged.reads)
                self.device_values.add((logged.loop, logged.name))
                self.device_logging.update(logged.logging)
                self.device_mentions.update(logged.mentions)

    # Running sums ---------------------------------------------------------------------------------------------
    def _plan_sums(self) -> None:
        by_accumulator: dict[tuple[Loop, str], list[DeviceSum | None]] = {}
        for node, (function, loop) in self.model._c.where.items():  # noqa: SLF001
            if not isinstance(node, cst.AugAssign) or loop is None:
                continue
            if not isinstance(node.operator, cst.AddAssign) or not isinstance(node.target, cst.Name):
                continue
            step = self.model.loops.get(loop)
            if step is None:
                continue
            key = (loop, node.target.value)
            by_accumulator.setdefault(key, []).append(self._sum(node, step))
        for (loop, name), found in by_accumulator.items():
            if any(s is None for s in found) or not self._kept_in_loop(loop, name, found):  # type: ignore[arg-type]
                continue
            for device_sum in found:
                assert device_sum is not None
                self.sums.append(device_sum)
                self.moved.update(device_sum.reads)

    def _sum(self, node: cst.AugAssign, step: StepLoop) -> DeviceSum | None:
        ctx = self.ctx
        device_names = {n for (loop, n) in self.device_values if loop is step.loop}
        found = reads(ctx, node.value, device_names | self.model.base_tensor_names(Region(step)))
        if not found:
            return None
        kinds: set[str] = set()
        read_calls: list[cst.Call] = []
        for read in found:
            if isinstance(read, (cst.Name, cst.Attribute)):
                if patterns.dotted_name(read) not in device_names:
                    return None  # a tensor summed as it is: already on the device
                kinds.add("item")
            else:
                kind = _read_kind(ctx, read)
                if kind is None:
                    return None
                kinds.add(kind)
                read_calls.append(read)  # type: ignore[arg-type]
            if not self._arithmetic_up_to(read, node.value):
                return None
        parent = ctx.parent(step.loop)
        if not isinstance(parent, (cst.IndentedBlock, cst.Module)):
            return None
        read_back = kinds.pop() if len(kinds) == 1 else "item"
        return DeviceSum(node, node.target.value, tuple(read_calls), step.loop, read_back)  # type: ignore[union-attr]

    def _arithmetic_up_to(self, node: cst.CSTNode, root: cst.CSTNode) -> bool:
        current = node
        while current is not root:
            current = self.ctx.parent(current)  # type: ignore[assignment]
            if current is None:
                return False
            if current is not root and not isinstance(current, _ARITHMETIC):
                return False
        return True

    def _kept_in_loop(self, loop: Loop, name: str, sums: list[DeviceSum]) -> bool:
        """Inside the loop the accumulator is only summed into (never read or rebound there), and it is
        bound before the loop in the same function."""
        scope = self.ctx.scopes.get(sums[0].statement.target)
        if scope is None:
            return False
        statements = {s.statement for s in sums}
        bound_before = False
        for assignment in scope.assignments[name]:
            node = getattr(assignment, "node", None)
            if not isinstance(node, cst.CSTNode):
                return False
            holder = self._statement_of(node)
            if holder in statements:
                continue
            if self._inside(node, loop):
                return False
            bound_before = bound_before or self.ctx.position(node) < self.ctx.position(loop)
        return bound_before and not any(self._inside(a.node, loop) for a in scope.accesses[name])

    def _statement_of(self, node: cst.CSTNode) -> cst.CSTNode | None:
        current: cst.CSTNode | None = node
        while current is not None and not isinstance(current, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
            current = self.ctx.parent(current)
        return current

    def _inside(self, node: cst.CSTNode, container: cst.CSTNode) -> bool:
        current: cst.CSTNode | None = node
        while current is not None:
            if current is container:
                return True
            current = self.ctx.parent(current)
        return False

    # Per-step helpers that return .item() ------------------------------------------------------------------------
    def _plan_returns(self) -> None:
        model, ctx = self.model, self.ctx
        returns: dict[cst.FunctionDef, list[cst.Return]] = {}
        for node, (function, _) in model._c.where.items():  # noqa: SLF001
            if isinstance(node, cst.Return) and function in model.step_functions:
                returns.setdefault(function, []).append(node)  # type: ignore[arg-type]
        if not returns:
            return
        callers: dict[cst.FunctionDef, list[cst.Call]] = {}
        for function, raws in model._c.raw.items():  # noqa: SLF001
            for raw in raws:
                if raw.kind == CALL:
                    target = model.callee(raw.node)  # type: ignore[arg-type]
                    if target in returns:
                        callers.setdefault(target, []).append(raw.node)  # type: ignore[arg-type]
        for function, found in returns.items():
            read_calls = []
            for node in found:
                value = node.value
                read = next(iter(reads(ctx, value, set())), None) if value is not None else None
                if read is None or _read_kind(ctx, read) != "item" or not self._arithmetic_up_to(read, value):
                    break
                read_calls.append(read)
            else:
                plan = self._callers_keep_it(function, callers.get(function, []))
                if plan is not None:
                    names, logging, mentions = plan
                    self.returns.append(DeviceReturn(function, tuple(read_calls), names, logging, mentions))  # type: ignore[arg-type]
                    self.moved.update(read_calls)
                    self.device_values.update(names)
                    self.device_logging.update(logging)
                    self.device_mentions.update(mentions)

    def _callers_keep_it(self, function: cst.FunctionDef, calls: list[cst.Call]):
        """Every call of the helper is in a step loop's own body, as a statement of its own, ``name =
        helper(...)`` with ``name`` only summed (``total += name``) or logged in that loop, or ``total +=
        helper(...)``."""
        model, ctx = self.model, self.ctx
        if not calls:
            return None
        names: list[tuple[Loop, str]] = []
        logging: list[cst.Expr] = []
        mentions: list[cst.Name] = []
        for call in calls:
            where = model._c.where.get(call)  # noqa: SLF001
            step = model.loops.get(where[1]) if where and where[1] is not None else None  # type: ignore[arg-type]
            if step is None or step.kind != "train":
                return None
            parent = ctx.parent(call)
            if isinstance(parent, cst.Expr):
                continue
            if isinstance(parent, cst.AugAssign) and parent.value is call:
                continue  # a running sum: DeviceSum reads it back
            if not (isinstance(parent, cst.Assign) and parent.value is call and len(parent.targets) == 1
                    and isinstance(parent.targets[0].target, cst.Name)):
                return None
            name = parent.targets[0].target.value
            scope = ctx.scopes.get(parent.targets[0].target)
            if scope is None or len(scope.assignments[name]) != 1:
                return None
            for access in scope.accesses[name]:
                node = access.node
                if not isinstance(node, cst.Name) or not self._inside(node, step.loop):
                    return None
                statement = self._statement_of(node)
                if isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call) and \
                        is_logging_call(ctx, statement.value):
                    # Mid-step, XLA310 moves it into a step closure; after the barrier it reads the value
                    # the step's graph already computed.
                    if not ctx.runs("XLA310") and not model.after_step_end(statement, Region(step)):
                        return None
                    logging.append(statement)
                    mentions.append(node)
                elif isinstance(statement, cst.AugAssign) and self._arithmetic_up_to(node, statement.value):
                    pass  # summed: the running sum decides (and must keep it on the device)
                else:
                    return None
            names.append((step.loop, name))
        return tuple(names), tuple(logging), tuple(mentions)

    # Finite checks ----------------------------------------------------------------------------------------------
    def _plan_finite_checks(self) -> None:
        ctx, model = self.ctx, self.model
        for node in model._c.where:  # noqa: SLF001
            if not isinstance(node, cst.Assign) or len(node.targets) != 1 or not isinstance(node.targets[0].target,
                                                                                           cst.Name):
                continue
            kind = _read_kind(ctx, node.value)
            if kind is None:
                continue
            region = model.training_region(node)
            if region is None or model.after_step_end(node, region):
                continue
            line = ctx.parent(node)
            block = ctx.parent(line) if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None
            if not isinstance(block, cst.IndentedBlock):
                continue
            body = list(block.body)
            index = body.index(line)  # type: ignore[arg-type]
            check = body[index + 1] if index + 1 < len(body) else None
            name = node.targets[0].target.value
            if isinstance(check, cst.If) and self._stops_unless_finite(check, name) and \
                    self._only_used_by(node.targets[0].target, name, check):
                self.finite_checks.append(FiniteCheck(line, check, node.value, region))  # type: ignore[arg-type]
                self.moved.add(node.value)

    def _stops_unless_finite(self, check: cst.If, name: str) -> bool:
        ctx = self.ctx
        if check.orelse is not None:
            return False
        tests = patterns.find_all(check.test, lambda n: isinstance(n, cst.Call) and bool(
            ctx.qualnames(n.func) & set(FINITE_CHECKS)) and bool(mentions(n, {name})))
        if not tests:
            return False
        body = patterns.find_all(check.body, lambda n: isinstance(n, (cst.Break, cst.Continue, cst.Return, cst.Yield,
                                                                      cst.Await, cst.Nonlocal, cst.Global)))
        stops = patterns.find_all(check.body, lambda n: isinstance(n, cst.Raise) or (
            isinstance(n, cst.Call) and bool(ctx.qualnames(n.func) & set(STOPS))))
        return not body and bool(stops)

    def _only_used_by(self, target: cst.Name, name: str, check: cst.If) -> bool:
        scope = self.ctx.scopes.get(target)
        if scope is None or len(scope.assignments[name]) != 1:
            return False
        return all(self._inside(a.node, check) for a in scope.accesses[name])

    # Values read mid-step and only logged ---------------------------------------------------------------------
    #
    # ``D_x = output.mean().item()`` ... ``print(f"D(x) {D_x:.4f}")`` (DCGAN), ``mse_val = ....mean().item()``
    # before a progress-bar line (stylegan2): the read becomes ``.detach()``, the value is part of the step's
    # graph, and each logging statement that uses the name reads it there (``D_x.item()``), which XLA310 moves
    # into its step closure, or which reads a value already computed after the step's barrier.
    def _plan_logged(self) -> list[LoggedRead]:
        model, ctx = self.model, self.ctx
        planned: list[LoggedRead] = []
        for node, (_, loop) in model._c.where.items():  # noqa: SLF001
            if not isinstance(node, cst.Assign) or loop is None or len(node.targets) != 1:
                continue
            target = node.targets[0].target
            step = model.loops.get(loop)
            if not isinstance(target, cst.Name) or step is None or step.kind != "train":
                continue
            found = reads(ctx, node.value, set())
            if not found or any(r in self.moved for r in found):
                continue
            kinds = tuple(_read_kind(ctx, r) for r in found)
            if any(k is None for k in kinds) or not all(self._arithmetic_up_to(r, node.value) for r in found):
                continue
            if all(plain_read(r) for r in found) and model.after_step_end(node, Region(step)):
                continue  # after the barrier a read of a computed value is free: deferring it would not be
            logged = self._only_logged(target, step.loop)
            if logged is not None:
                planned.append(LoggedRead(node, target.value, tuple(found), kinds, step.loop,  # type: ignore[arg-type]
                                          *logged))
        return planned

    def _only_logged(self, target: cst.Name, loop: Loop) -> tuple[tuple[cst.Name, ...], tuple[cst.Expr, ...]] | None:
        """The mentions of ``target``'s name and the logging statements holding them, when the name is bound
        only here and used only in logging statements of the same loop (prints, loggers, logging-only lists)."""
        ctx = self.ctx
        scope = ctx.scopes.get(target)
        if scope is None or len(scope.assignments[target.value]) != 1:
            return None
        names: list[cst.Name] = []
        logging: list[cst.Expr] = []
        for access in scope.accesses[target.value]:
            node = access.node
            if not isinstance(node, cst.Name) or not inside(ctx, node, loop):
                return None
            statement = _expression_statement(ctx, node)
            call = statement.value if statement is not None else None
            if not (isinstance(call, cst.Call) and (is_logging_call(ctx, call) or appends_to_log(ctx, call))):
                return None
            if patterns.method_call(call, *APPENDS) and isinstance(call.func, cst.Attribute) and call.func.value is node:
                return None
            names.append(node)
            if statement not in logging:
                logging.append(statement)  # type: ignore[arg-type]
        return (tuple(names), tuple(logging)) if names else None


def _expression_statement(ctx: MigrationContext, node: cst.CSTNode) -> cst.Expr | None:
    current = ctx.parent(node)
    while current is not None and not isinstance(current, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
        if isinstance(current, cst.Lambda):
            return None
        current = ctx.parent(current)
    return current if isinstance(current, cst.Expr) else None
