"""XLA202 grad-scaler-to-xla: the CUDA GradScaler becomes torch_xla's, or goes where the target has none.

What it does:
    Where the target has ``torch_xla.amp.GradScaler`` (the seeds' target), rewrites
    ``torch.cuda.amp.GradScaler(...)``, ``torch.amp.GradScaler("cuda", ...)`` and their from-imports and
    module aliases to ``torch_xla.amp.GradScaler(...)`` with the same arguments (the device argument dropped);
    the loop's ``scaler.scale(loss).backward()``, ``unscale_``, ``step`` and ``update`` stay as they are.
    Where it has none (``2.9``: bfloat16 autocast needs no loss scaling), the scaler assignment is removed
    and its uses are rewritten: ``scaler.scale(loss)`` -> ``loss``,
    ``scaler.unscale_(opt)`` and ``scaler.update()`` removed, ``scaler.step(opt)`` -> the target's optimizer
    step (``xm.optimizer_step(opt)``; ``opt.step()`` in a distributed loop whose gradients XLA406 already
    all-reduced, in the ddp data-parallel form, where DDP reduces, and for an optimizer from ignite's
    ``idist.auto_optim``, whose step on XLA is already ``xm.optimizer_step(optimizer, barrier=True)``). When anything else still touches the scaler (``state_dict()`` in a checkpoint,
    ``load_state_dict``, ``get_scale()``, ``is_enabled()``, passing it on), the assignment stays, as a
    scaler that scales nothing (``torch.amp.GradScaler("xla", enabled=False)``), so those uses keep
    working, and each is reported with its line.

Why:
    ``torch.cuda.amp.GradScaler`` keeps its found-inf check and scale on the CUDA device; on XLA it would
    force a host sync every step. ``torch_xla.amp.GradScaler`` pairs with the syncfree optimizers (XLA203)
    to skip a step without one. torch_xla 2.9 removed its GradScaler: its AMP is bfloat16, which does not
    underflow the way float16 does, so the scaler has nothing to do (for float16 on 2.9, torch's own
    ``torch.amp.GradScaler("xla")`` works, with ``torch.autocast("xla", dtype=torch.float16)``).

Example:
    scaler = torch.cuda.amp.GradScaler()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()

Use instead:
    scaler = xla_amp.GradScaler()        # --target sagemaker: the loop is unchanged
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()

    loss.backward()                      # --target 2.9: no scaler
    xm.optimizer_step(optimizer)
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.analysis.steps.collect import steps_itself
from xla_migrate.engine.rule import ALL_TARGETS, Rule
from xla_migrate.transforms.common import imported_from, joined, parenthesized_for_attribute, short

# GradScaler(init_scale=..., growth_factor=..., backoff_factor=..., growth_interval=..., enabled=...)
CUDA_SCALERS = ("torch.cuda.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler")
# GradScaler(device="cuda", init_scale=..., ...)
DEVICE_SCALERS = ("torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler")
# torch_xla's own, removed like the CUDA one where the target upgrades torch_xla code (torchtpu: XLA703).
XLA_SCALERS = ("torch_xla.amp.GradScaler", "torch_xla.amp.grad_scaler.GradScaler")


class GradScalerToXla(Rule):
    code = "XLA202"
    name = "grad-scaler-to-xla"
    summary = "torch.cuda.amp.GradScaler -> torch_xla.amp.GradScaler; removed with its uses where the target has none"
    fix_safety = "review"
    on_xla_code = True  # CUDA remnants in code that already runs on XLA are migrated too
    targets = (*ALL_TARGETS, "torchtpu")

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        # Removing targets: decided at the end, once every construction and use has been seen.
        self._removed: set[str] = set()
        self._uses: list[tuple[str, cst.Call, str]] = []  # (spelling, call, method)
        self._handled: set[cst.CSTNode] = set()
        self._references: list[tuple[str, cst.CSTNode]] = []
        # Targets without a scaler: (spelling, assignment, construction, imports it may leave dead).
        self._constructions: list[tuple[str, cst.CSTNode, cst.Call, list]] = []

    # Constructions -----------------------------------------------------------------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        names = self.ctx.qualnames(node.func)
        scalers = set(CUDA_SCALERS) | (set(XLA_SCALERS) if self.ctx.target.upgrades_xla_code else set())
        if names & scalers:
            self._construction(node, sorted(names & scalers)[0], device_index=None)
        elif names & set(DEVICE_SCALERS):
            index = self._device_index(node)
            if index is not False:
                self._construction(node, sorted(names & set(DEVICE_SCALERS))[0], device_index=index)
        elif not self.ctx.target.has_grad_scaler:
            self._use(node)

    def _device_index(self, node: cst.Call) -> int | None | bool:
        """Index of the ``"cuda"`` device argument (None: defaulted to cuda); False for another device."""
        for index, arg in enumerate(node.args):
            if (arg.keyword is None and index == 0 and not arg.star) or (arg.keyword and arg.keyword.value == "device"):
                return index if patterns.is_cuda_string(arg.value) else False
        return None

    def _construction(self, node: cst.Call, qualname: str, device_index: int | None) -> None:
        dead = imported_from(self.ctx, node.func, qualname)
        if self.ctx.target.has_grad_scaler:
            func = patterns.parsed_expression(self.ctx.spell("grad_scaler"))

            def to_xla(updated: cst.Call) -> cst.Call:
                args = [a for i, a in enumerate(updated.args) if i != device_index]
                if device_index is not None:
                    args = joined(args) if args else []
                return updated.with_changes(func=func, args=args)

            self.replace(node, to_xla, f"{short(node)} -> {short(to_xla(node), 80)}")
        else:
            parent = self.ctx.parent(node)
            target = None
            if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
                target = parent.targets[0].target
            elif isinstance(parent, cst.AnnAssign):
                target = parent.target
            spelling = patterns.dotted_name(target) if target is not None else None
            if spelling is None or spelling not in self.ctx.facts.scalers:
                self.finding(node, f"{short(node)}: the {self.ctx.target.name} target has no GradScaler",
                             "remove the scaler: scale(loss) -> loss, step(opt) -> the optimizer step, "
                             "drop unscale_() and update()")
                return
            self._removed.add(spelling)
            self._handled.add(target)
            self._constructions.append((spelling, parent, node, dead))
            return
        for module, name in dead:
            self.import_may_be_dead(module, name)

    # A scaler's state read by key (targets without a GradScaler) --------------------------------------------
    def visit_Subscript(self, node: cst.Subscript) -> None:
        """``loss_scaler.state_dict()["scale"]`` (Swin's logging, every step): the disabled scaler this target
        keeps (here or in a helper module) has an empty state dict: KeyError. ``.get("scale", 1.0)`` reads the
        scale a disabled scaler applies, and what a real key holds where there is one (issue 36)."""
        if self.ctx.target.has_grad_scaler or len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
            return
        key = patterns.string_value(node.slice[0].slice.value)
        call = node.value
        if key != "scale" or not isinstance(call, cst.Call) or call.args:
            return
        method = patterns.method_call(call, "state_dict")
        receiver = patterns.dotted_name(method.value) if method is not None else None
        if receiver is None or "scaler" not in receiver.rsplit(".", 1)[-1].lower() or self.ctx.is_write_target(node):
            return

        def get(updated: cst.Subscript) -> cst.BaseExpression:
            return cst.Call(func=cst.Attribute(value=updated.value, attr=cst.Name("get")),
                            args=[cst.Arg(updated.slice[0].slice.value, comma=cst.Comma(  # type: ignore[attr-defined]
                                whitespace_after=cst.SimpleWhitespace(" "))), cst.Arg(cst.Float("1.0"))],
                            lpar=updated.lpar, rpar=updated.rpar)

        self.replace(node, get, f"{short(node)} -> {short(get(node))}: on the {self.ctx.target.name} target the "
                                "GradScaler is disabled (no loss scaling), its state dict is empty, its scale 1.0")

    # Uses (targets without a GradScaler) -------------------------------------------------------------------
    def _use(self, node: cst.Call) -> None:
        method = patterns.method_call(node, "scale", "unscale_", "step", "update")
        if method is None:
            return
        spelling = patterns.dotted_name(method.value)
        if spelling is None or spelling not in self.ctx.facts.scalers:
            return
        self._uses.append((spelling, node, method.attr.value))

    def visit_Name(self, node: cst.Name) -> None:
        self._reference(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._reference(node)

    def _reference(self, node: cst.BaseExpression) -> None:
        if self.ctx.target.has_grad_scaler:
            return
        parent = self.ctx.parent(node)
        if isinstance(parent, cst.Param) and parent.name is node:
            return  # a parameter's name binds the scaler passed in; its reads are the references
        spelling = patterns.dotted_name(node)
        if spelling is not None and spelling in self.ctx.facts.scalers:
            self._references.append((spelling, node))

    def leave_Module(self, original_node: cst.Module) -> None:
        if self.ctx.target.has_grad_scaler:
            return
        for spelling, node, method in self._uses:
            if spelling in self._removed and self._rewrite_use(node, method):
                self._handled.add(node.func.value)
        still_read = {spelling for spelling, node in self._references
                      if spelling in self._removed and node not in self._handled}
        for spelling, assignment, construction, dead in self._constructions:
            if spelling in still_read:
                disabled = self.ctx.spell_expression("disabled_grad_scaler")
                self.replace(construction, disabled, f"{short(construction)} -> {short(disabled, 80)}: the "
                             f"{self.ctx.target.name} target needs no loss scaling, and {spelling} is still read")
            else:
                self.remove(assignment, f"removed {spelling} = {short(construction)}: the {self.ctx.target.name} "
                                        "target has no GradScaler (bfloat16 autocast needs no loss scaling)")
            for module, name in dead:
                self.import_may_be_dead(module, name)
        for spelling, node in self._references:
            if spelling in still_read and node not in self._handled:
                self._report(node)

    def _rewrite_use(self, node: cst.Call, method: str) -> bool:
        args = node.args
        positional = patterns.positional(node)
        if method == "scale" and len(args) == 1 and len(positional) == 1:
            parent = self.ctx.parent(node)
            needs_parens = isinstance(parent, (cst.Attribute, cst.Subscript)) or (
                isinstance(parent, cst.Call) and parent.func is node)

            def unscaled(updated: cst.Call) -> cst.BaseExpression:
                value = updated.args[0].value
                value = parenthesized_for_attribute(value) if needs_parens else value
                return value.with_changes(lpar=[*updated.lpar, *value.lpar], rpar=[*value.rpar, *updated.rpar])

            self.replace(node, unscaled, f"{short(node)} -> {short(positional[0].value)} (no loss scaling)")
            return True
        if method in ("unscale_", "update"):
            statement = self.ctx.parent(node)
            if isinstance(statement, cst.Expr):
                self._remove_statement(statement, f"removed {short(node)}: no GradScaler on this target")
                return True
            return False
        if method == "step" and len(args) == 1 and len(positional) == 1:
            eager = self.ctx.target.runtime != "torch_xla"  # TorchTPU: a plain step, no barrier to add
            itself = steps_itself(self.ctx, node)
            if eager or itself or self.ctx.steps.explicitly_reduced_step(node) or self.ctx.ddp_form:
                # XLA406 all-reduced the gradients after the backward, or DDP did in the backward (the ddp
                # form): step without a second reduction.
                def plain_step(updated: cst.Call) -> cst.Call:
                    receiver = parenthesized_for_attribute(updated.args[0].value)
                    return cst.Call(func=cst.Attribute(value=receiver, attr=cst.Name("step")),
                                    lpar=updated.lpar, rpar=updated.rpar)

                by = "DDP" if self.ctx.ddp_form else "XLA406"
                why = "eager: the optimizer steps as on CUDA" if eager and not self.ctx.ddp_form else (
                    f"gradients already all-reduced by {by}")
                if itself and not eager:
                    why = ("the optimizer comes from ignite's idist.auto_optim, whose step() on XLA (backend "
                           "'xla-tpu') is already xm.optimizer_step(optimizer, barrier=True): it reduces; the step "
                           "barrier stays for the other backends, where auto_optim changes nothing)")
                self.replace(node, plain_step, f"{short(node)} -> {short(plain_step(node))} ({why})")
                return True
            step = patterns.parsed_expression(self.ctx.spell("optimizer_step", patterns.code_of(positional[0].value)))
            assert isinstance(step, cst.Call)

            def optimizer_step(updated: cst.Call) -> cst.Call:
                first = step.args[0].with_changes(value=updated.args[0].value)
                return step.with_changes(args=[first, *step.args[1:]], lpar=updated.lpar, rpar=updated.rpar)

            self.replace(node, optimizer_step, f"{short(node)} -> {short(step)}")
            return True
        return False

    def _remove_statement(self, statement: cst.Expr, message: str) -> None:
        """Remove ``statement``; an ``if`` left with nothing to do (``if clip: scaler.unscale_(opt)``) goes
        with it when its test has no side effects."""
        owner = self.ctx.sole_if_around(statement)
        if owner is not None and not patterns.find_all(
                owner.test, lambda n: isinstance(n, (cst.Call, cst.Await, cst.NamedExpr, cst.Yield))):
            self.remove(owner, f"{message} (with the `if` around it)")
        else:
            self.remove(statement, message)

    def _report(self, node: cst.CSTNode) -> None:
        parent = self.ctx.parent(node)
        shown = parent if isinstance(parent, cst.Attribute) and isinstance(self.ctx.parent(parent), cst.Call) else node
        if shown is not node:
            shown = self.ctx.parent(shown)
        self.finding(node, f"{short(shown)}: the GradScaler scales nothing on the {self.ctx.target.name} target "
                           "(kept disabled so this still runs)",
                     "remove this use (a checkpoint's scaler state is not needed)" + (
                         "" if self.ctx.target.runtime == "torch_tpu" else "; for float16 on torch_xla 2.9 enable the "
                         "torch.amp.GradScaler('xla') and scale the loss again"))
