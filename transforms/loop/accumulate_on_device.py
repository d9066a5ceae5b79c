"""XLA313 accumulate-on-device: running sums of tensor values stay on the device and are read once, after the loop.

What it does:
    In a training or evaluation loop (as the step model sees them: ``xla_migrate.analysis.steps``), a running sum of
    a value read from a tensor, ``total += loss.item()``, ``test_loss += F.nll_loss(...).item()``,
    ``correct += pred.eq(target).sum().item()``, ``total += len(data) * criterion(out, y).item()``,
    ``total += float(loss)``, becomes a sum on the device (``.item()`` / ``float(...)`` -> ``.detach()``; a
    ``.cpu()`` on the way to the read goes too: ``pred.eq(y).cpu().sum().item()`` -> ``pred.eq(y).sum().detach()``),
    and the sum is read once, right after the loop, the way the loop read it::

        total = total.item() if torch.is_tensor(total) else total  # float(total) after float(...)

    (the ``if`` keeps a loop that ran no batch working). Only sums the loop does not read or rebind
    otherwise, bound before the loop, in the loop's own body, and only arithmetic between the read and the
    sum. A function the step calls that ends in ``return loss.item()`` (a per-batch method) returns
    ``loss.detach()`` instead when every caller sums the result this way or logs it (the logging then runs
    in a step closure, XLA310, and reads ``loss.item()`` there). Every other read stays and is reported by
    XLA311.

Why:
    ``.item()`` in the loop body runs the step's graph up to that value before the step ends: a second
    graph execution every step or evaluation batch, and a host sync that stalls the device. On the device
    the sum is part of the step's graph (one execution per step) and the host waits once, after the loop.
    The sum is computed in the tensor's precision (float32) rather than Python's float64: the read value
    may differ in the last digits.

Example:
    test_loss = 0
    correct = 0
    for data, target in test_loader:
        output = model(data)
        test_loss += F.nll_loss(output, target, reduction="sum").item()
        correct += output.argmax(dim=1).eq(target).sum().item()

Use instead:
    test_loss = 0
    correct = 0
    for data, target in test_loader:
        output = model(data)
        test_loss += F.nll_loss(output, target, reduction="sum").detach()
        correct += output.argmax(dim=1).eq(target).sum().detach()
    test_loss = test_loss.item() if torch.is_tensor(test_loss) else test_loss
    correct = correct.item() if torch.is_tensor(correct) else correct
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.engine.rule import Rule
from xla_migrate.analysis.steps import Loop
from xla_migrate.transforms.common import parenthesized_for_attribute, short

_READ_BACK = {
    "item": "{name} = {name}.item() if {torch}.is_tensor({name}) else {name}",
    "float": "{name} = float({name})",
    "int": "{name} = int({name})",
}
_COMMENT = "# Summed on the device by the loop above: read once, here."


class AccumulateOnDevice(Rule):
    code = "XLA313"
    name = "accumulate-on-device"
    summary = "running sums of tensor reads in a loop (total += loss.item()) stay on the device, read once after it"
    fix_safety = "review"

    def visit_Module(self, node: cst.Module) -> None:
        plan = self.ctx.steps.host_reads
        read_backs: dict[tuple[Loop, str], str] = {}
        for device_sum in plan.sums:
            for read in device_sum.reads:
                self._detach(read, "the running sum stays on the device")
            read_backs.setdefault((device_sum.loop, device_sum.name), device_sum.read_back)
        by_loop: dict[Loop, list[tuple[str, str]]] = {}
        for (loop, name), kind in read_backs.items():
            by_loop.setdefault(loop, []).append((name, kind))
        for loop, sums in by_loop.items():
            torch = self.ctx.local_name("torch", "torch")
            statements = [self.ctx.statement(_READ_BACK[kind].format(name=name, torch=torch)) for name, kind in sums]
            statements[0] = statements[0].with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(_COMMENT))])
            names = ", ".join(name for name, _ in sums)
            self.insert_after(loop, statements, f"{names}: summed on the device by the loop, read once after it")
        for device_return in plan.returns:
            for read in device_return.reads:
                self._detach(read, f"{device_return.function.name.value}() returns the tensor (its callers keep it on "
                                   "the device or log it in a step closure)")
            for mention in device_return.mentions:
                self.replace(mention, lambda updated: cst.Call(func=cst.Attribute(value=updated, attr=cst.Name("item"))),
                             f"{mention.value} -> {mention.value}.item(): a tensor now, read where it is logged")

    def _detach(self, read: cst.Call, why: str) -> None:
        detach_read(self, read, why)


def detach_read(rule: Rule, read: cst.Call, why: str) -> None:
    """``x.item()`` / ``float(x)`` / ``int(x)`` -> ``x.detach()``: the value stays on the device (XLA313, XLA310).
    A ``.cpu()`` on the way to the read goes too (``pred.eq(y).cpu().sum().item()``): kept, it copies to the
    host at every batch, the read the rewrite removes."""
    def detach(updated: cst.Call) -> cst.BaseExpression:
        if isinstance(updated.func, cst.Attribute) and updated.func.attr.value == "item":
            value = _without_host_copies(updated.func.value)
            return updated.with_changes(func=updated.func.with_changes(value=value, attr=cst.Name("detach")))
        value = parenthesized_for_attribute(_without_host_copies(updated.args[0].value))
        return cst.Call(func=cst.Attribute(value=value, attr=cst.Name("detach")), lpar=updated.lpar,
                        rpar=updated.rpar)

    tensor = read.func.value if isinstance(read.func, cst.Attribute) else parenthesized_for_attribute(
        read.args[0].value)
    kept = _without_host_copies(tensor)
    copies = "" if kept.deep_equals(tensor) else " (and its .cpu(), a host copy per batch)"
    rule.replace(read, detach, f"{short(read)} -> {short(kept)}.detach(){copies}: {why}")


def _without_host_copies(expression: cst.BaseExpression) -> cst.BaseExpression:
    """The method chain ``expression`` without its ``.cpu()`` calls (arguments and other calls kept)."""
    if isinstance(expression, cst.Call) and isinstance(expression.func, cst.Attribute):
        inner = _without_host_copies(expression.func.value)
        if expression.func.attr.value == "cpu" and not expression.args:
            return inner
        return expression.with_changes(func=expression.func.with_changes(value=inner))
    if isinstance(expression, (cst.Attribute, cst.Subscript)):
        return expression.with_changes(value=_without_host_copies(expression.value))
    return expression
