"""XLA405 ddp-to-xla: the DistributedDataParallel wrapper goes; model.module becomes the model.

What it does:
    In a distributed script:

    - ``model = DDP(model, device_ids=[local_rank], ...)`` becomes the broadcast DDP made: ordinal 0's
      weights and buffers to every replica (``for tensor in [*model.parameters(), *model.buffers()]:
      xm.collective_broadcast([tensor], root_ordinal=0)``); where the wrapper gets another name or is used
      in place (``ddp_model = DDP(model)``, ``train(DDP(model))``) the call becomes the module it wraps
      (``ddp_model = model``) and the broadcast goes after (before) that statement. Every DDP option
      (``device_ids``, ``output_device``, ``find_unused_parameters``, ``broadcast_buffers``...) goes with it.
    - ``model.module`` (on a name bound to a DDP wrapper, or with that name elsewhere, e.g. a function's
      ``model`` parameter) -> ``model``; ``model.module if hasattr(model, "module") else model`` and
      ``getattr(model, "module", model)`` and ``model.module if ddp else model`` -> ``model``.
    - ``with model.no_sync():`` -> ``with contextlib.nullcontext():`` (gradient accumulation: without DDP no
      step reduces before the optimizer step anyway); ``model.no_sync`` itself (``ctx = model.no_sync if
      accumulating else nullcontext``) -> ``contextlib.nullcontext``. Where the script imports
      ``nullcontext`` from contextlib among its leading imports (and binds that name to nothing else), that
      name is used instead.
    - ``model = nn.SyncBatchNorm.convert_sync_batchnorm(model)`` is removed, in both forms (used in place,
      the call becomes its module): each replica normalises its own batch, and a finding says so (methods
      that need the global batch's statistics use ``torch_xla.core.functions.SyncBatchNorm``).

    In the spmd form (``--data-parallel spmd``) the wrapper goes as in the xm form, without the broadcast:
    one program holds the one copy of the weights, so ``model = DDP(model, ...)`` is removed.

    In the ddp data-parallel form (``--data-parallel ddp``, or what ``auto`` chooses) the wrapper stays,
    on the ``xla`` process group (XLA404): ``DDP(model, device_ids=[local_rank], output_device=local_rank)``
    -> ``DDP(model, gradient_as_bucket_view=True)`` (the CUDA device options go; the others stay), and
    ``model.module`` and ``no_sync()`` keep working as written.

Why:
    The seeds' distributed form keeps no DDP wrapper: each replica runs the plain model and the gradients
    are all-reduced by ``xm.optimizer_step`` (or the explicit ``xm.all_reduce`` of XLA406). DDP needs a
    process group and CUDA device ids, and on XLA its hooks deadlock or reduce a second time. DDP also
    broadcast rank 0's initial weights when it wrapped the model; the xm form broadcasts them there itself
    (``xm.collective_broadcast`` exists since torch_xla 1.13), so the replicas start equal whatever the script
    seeds. torch's SyncBatchNorm checks the device type once a process group is initialised and raises for
    XLA tensors (torch 2.9: "SyncBatchNorm expected input tensor to be on GPU or XPU or privateuseone").

Example:
    model = DDP(model, device_ids=[local_rank])
    torch.save(model.module.state_dict(), "model.pt")

Use instead:
    # Every replica starts from ordinal 0's weights and buffers, as DDP broadcast them when it wrapped the model.
    for tensor in [*model.parameters(), *model.buffers()]:
        xm.collective_broadcast([tensor], root_ordinal=0)
    torch.save(model.state_dict(), "model.pt")
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.analysis.facts import DDP
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.common import fresh_name, imported_from, joined, keyword_arg, short

# DDP options that name CUDA devices: dropped in the ddp form (torch_xla's DDP example passes none).
CUDA_DEVICE_OPTIONS = ("device_ids", "output_device")
_BROADCAST_COMMENT = "# Every replica starts from ordinal 0's weights and buffers, as DDP broadcast them when it wrapped the model."
SYNC_BATCHNORM = ("torch.nn.SyncBatchNorm.convert_sync_batchnorm",
                  "torch.nn.modules.batchnorm.SyncBatchNorm.convert_sync_batchnorm")


class DdpToXla(Rule):
    code = "XLA405"
    name = "ddp-to-xla"
    summary = "DistributedDataParallel(model, ...) removed (xm.optimizer_step reduces); model.module -> model"
    fix_safety = "review"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._wrapped = {s.rsplit(".", 1)[-1] for s in ctx.facts.ddp_models}
        self._handled: set[cst.CSTNode] = set()
        self._wrapped_arguments: set[str] | None = None
        # The forms without the wrapper: model.module and no_sync() go with it.
        self._unwrapped = ctx.xm_form or ctx.spmd_form

    def visit_Call(self, node: cst.Call) -> None:
        if not self.ctx.distributed:
            return
        names = self.ctx.qualnames(node.func)
        if names & set(DDP) and self.ctx.ddp_form:
            self._on_xla(node)
        elif names & set(DDP):
            self._unwrap(node, sorted(names & set(DDP))[0])
        elif names & set(SYNC_BATCHNORM):
            self._drop_sync_batchnorm(node)
        elif self.ctx.ddp_form:
            return  # the wrapper stays: model.module and no_sync() keep working
        elif self._is_module_getattr(node):
            self._handled.add(node)
            self.replace(node, lambda updated: updated.args[0].value.with_changes(
                lpar=updated.lpar, rpar=updated.rpar), f"{short(node)} -> {short(node.args[0].value)}: no DDP wrapper")
        elif patterns.method_call(node, "no_sync") and self._is_wrapper(node.func.value) and not node.args:
            nullcontext = self._nullcontext()
            self.replace(node, patterns.parsed_expression(f"{nullcontext}()"),
                         f"{short(node)} -> {nullcontext}(): no DDP wrapper to hold back")

    def _drop_sync_batchnorm(self, node: cst.Call) -> None:
        """``model = nn.SyncBatchNorm.convert_sync_batchnorm(model)`` goes (used in place, the call becomes its
        module): torch's SyncBatchNorm raises on an XLA tensor once a process group exists (the ddp form, or an
        xm form that keeps the group), and each replica then normalises its own batch, as BatchNorm does."""
        positional = patterns.positional(node)
        module = positional[:1] or [a for a in node.args if a.keyword and a.keyword.value == "module"]
        if not module or any(a.star for a in node.args):
            self.finding(node, f"{short(node)}: SyncBatchNorm runs on CUDA only once a process group exists",
                         "remove the conversion (each replica normalises its own batch)")
            return
        parent = self.ctx.parent(node)
        line = self.ctx.parent(parent) if isinstance(parent, cst.Assign) else None
        target = parent.targets[0].target if isinstance(parent, cst.Assign) and len(parent.targets) == 1 else None
        why = ("each replica normalises its own batch, as BatchNorm: torch's SyncBatchNorm only runs on CUDA/XPU "
               "devices once a process group exists")
        if not self.ctx.spmd_form:  # under SPMD a BatchNorm's statistics are the global batch's already
            self.finding(node, f"{short(node)} is removed: each BatchNorm now normalises its replica's batch with "
                         "that batch's statistics, where the conversion gave the global batch's (a different loss "
                         "for methods that rely on them: Barlow Twins, SimCLR, BYOL)",
                         "where the method needs cross-replica statistics, use torch_xla.core.functions."
                         "SyncBatchNorm for those BatchNorm layers (it all-reduces the batch moments)")
        if (target is not None and patterns.dotted_name(target) is not None
                and patterns.dotted_name(target) == patterns.dotted_name(module[0].value)
                and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1):
            self.remove(parent, f"removed {short(node)}: {why}")
        else:
            index = node.args.index(module[0])
            self.replace(node, lambda updated: updated.args[index].value.with_changes(
                lpar=[*updated.lpar, *updated.args[index].value.lpar],
                rpar=[*updated.args[index].value.rpar, *updated.rpar]), f"{short(node)} -> {short(module[0].value)}: {why}")

    def _on_xla(self, node: cst.Call) -> None:
        """The ddp form: ``DDP(model, device_ids=[r], output_device=r)`` -> ``DDP(model,
        gradient_as_bucket_view=True)``; its other options stay."""
        cuda_only = [a for a in node.args if a.keyword is not None and a.keyword.value in CUDA_DEVICE_OPTIONS]
        positional = patterns.positional(node)
        if len(positional) > 1:  # DDP(module, device_ids, output_device, ...): device ids by position
            cuda_only += positional[1:3]
        has_view = patterns.keyword(node, "gradient_as_bucket_view") is not None
        if not cuda_only and has_view:
            return
        dropped = [a.keyword.value if a.keyword else ("device_ids", "output_device")[i]
                   for i, a in enumerate(cuda_only)]
        kept = [a for a in node.args if a not in cuda_only]
        added = [] if has_view else [keyword_arg("gradient_as_bucket_view", cst.Name("True"))]
        indexes = [node.args.index(a) for a in kept]

        def on_xla(updated: cst.Call) -> cst.Call:
            return updated.with_changes(args=joined([updated.args[i] for i in indexes] + added))

        what = [f"{', '.join(dropped)} dropped (XLA devices are not CUDA device ids)"] if dropped else []
        what += [] if has_view else ["gradient_as_bucket_view=True (gradients share DDP's buckets: no copy)"]
        self.replace(node, on_xla, f"{short(node)}: DDP on the xla process group: {'; '.join(what)}")

    def _unwrap(self, node: cst.Call, qualname: str) -> None:
        module = patterns.positional(node)[:1] or [a for a in node.args if a.keyword and a.keyword.value == "module"]
        if not module:
            self.finding(node, f"{short(node)}: DDP without a module argument", "remove the DDP wrapper by hand")
            return
        wrapped = module[0].value
        parent = self.ctx.parent(node)
        statement = self.ctx.parent(parent) if isinstance(parent, cst.Assign) else None
        target = parent.targets[0].target if isinstance(parent, cst.Assign) and len(parent.targets) == 1 else None
        same = target is not None and patterns.dotted_name(target) is not None and (
            patterns.dotted_name(target) == patterns.dotted_name(wrapped))
        if same and self.ctx.spmd_form and isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
            self.remove(statement, f"removed {short(node)}: one SPMD program over the mesh, the compiler "
                        "inserts the gradient reduction")
        elif same and isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 and isinstance(
                self.ctx.parent(statement), (cst.IndentedBlock, cst.Module)):
            broadcast = self._broadcast_statement(node, patterns.dotted_name(wrapped))  # type: ignore[arg-type]
            self.replace(statement, lambda updated: broadcast.with_changes(
                leading_lines=[*updated.leading_lines, *broadcast.leading_lines]),
                f"{short(node)} -> every replica starts from ordinal 0's weights and buffers "
                f"({self.ctx.spell('collective_broadcast')}), as DDP broadcast them; no DDP wrapper on XLA "
                "(xm.optimizer_step all-reduces the gradients)")
        else:
            index = node.args.index(module[0])

            def inner(updated: cst.Call) -> cst.BaseExpression:
                value = updated.args[index].value
                return value.with_changes(lpar=[*updated.lpar, *value.lpar], rpar=[*value.rpar, *updated.rpar])

            self.replace(node, inner, f"{short(node)} -> {short(wrapped)}: no DDP wrapper on XLA")
            if not self.ctx.spmd_form:  # one SPMD program: no replicas to make equal
                self._broadcast_beside(node, wrapped)
        for module_name, name in imported_from(self.ctx, node.func, qualname):
            self.import_may_be_dead(module_name, name)
        self.import_may_be_dead("torch.nn.parallel", "DistributedDataParallel")

    def _broadcast_statement(self, node: cst.CSTNode, model: str) -> cst.For:
        """``for tensor in [*model.parameters(), *model.buffers()]: xm.collective_broadcast([tensor],
        root_ordinal=0)``: one tensor per call, so each keeps its own dtype (int64 buffers too)."""
        tensor = fresh_name(self.ctx, node, "tensor")
        loop = patterns.parsed_statement(
            f"for {tensor} in [*{model}.parameters(), *{model}.buffers()]:\n"
            f"    {self.ctx.spell('collective_broadcast')}([{tensor}], root_ordinal=0)\n")
        assert isinstance(loop, cst.For)
        return loop.with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(_BROADCAST_COMMENT))])

    def _broadcast_beside(self, node: cst.Call, wrapped: cst.BaseExpression) -> None:
        """DDP used under another name, in place or in a chain (``ddp_model = DDP(model)``, ``model =
        DDP(model).to(device)``, ``train(DDP(model))``): the broadcast goes after the assignment of the
        wrapper (of what it was assigned to), else before the statement that uses it (of the wrapped module)."""
        statement = self.ctx.enclosing_statement(node)
        assigned = self._assigned_wrapper(node, statement)
        model = patterns.dotted_name(assigned) if assigned is not None else patterns.dotted_name(wrapped)
        if model is None or statement is None or not isinstance(self.ctx.parent(statement),
                                                                (cst.IndentedBlock, cst.Module)):
            self.finding(node, f"{short(node)}: DDP broadcast rank 0's weights when it wrapped the model; no place "
                         "was found for the same broadcast here, so the replicas may start from different weights",
                         "after the model is built, call xm.collective_broadcast([t], root_ordinal=0) for every "
                         "tensor of its parameters() and buffers(), or migrate with --data-parallel ddp")
            return
        broadcast = self._broadcast_statement(node, model)
        message = (f"every replica starts from ordinal 0's weights and buffers ({self.ctx.spell('collective_broadcast')}"
                   f" of {model}), as DDP broadcast them")
        if assigned is not None:
            self.insert_after(statement, [broadcast], message)
        else:
            self.insert_before(statement, [broadcast], message)

    def _assigned_wrapper(self, node: cst.Call, statement: cst.CSTNode | None) -> cst.BaseExpression | None:
        """The target the wrapper (or a method chain on it: ``DDP(m).to(device)``) is assigned to, when the
        statement is that one assignment."""
        if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
                and isinstance(statement.body[0], cst.Assign) and len(statement.body[0].targets) == 1):
            return None
        assign = statement.body[0]
        value: cst.CSTNode = node
        while value is not assign.value:
            parent = self.ctx.parent(value)
            chained = isinstance(parent, cst.Attribute) and parent.value is value
            called = isinstance(parent, cst.Call) and parent.func is value
            if not (chained or called):
                return None
            value = parent
        return assign.targets[0].target

    def _no_sync_reference(self, node: cst.Attribute) -> None:
        """``ctx = model.no_sync if accumulating else nullcontext``: the method itself, not called here."""
        parent = self.ctx.parent(node)
        if isinstance(parent, cst.Call) and parent.func is node:
            return  # model.no_sync() is rewritten as a call
        nullcontext = self._nullcontext()
        self.replace(node, patterns.parsed_expression(nullcontext),
                     f"{short(node)} -> {nullcontext}: no DDP wrapper to hold back")

    def _nullcontext(self) -> str:
        """The script's own ``nullcontext`` (``from contextlib import nullcontext``), else through the module."""
        return (self.ctx.imported_name("contextlib.nullcontext")
                or f"{self.ctx.local_name('contextlib', 'contextlib')}.nullcontext")

    # model.module ------------------------------------------------------------------------------------------
    def _is_wrapper(self, node: cst.BaseExpression) -> bool:
        name = patterns.dotted_name(node)
        return name is not None and (name in self.ctx.facts.ddp_models or name.rsplit(".", 1)[-1] in self._wrapped
                                     or name in self._ddp_arguments())

    def _ddp_arguments(self) -> set[str]:
        """The names the file hands to DDP (``DistributedDataParallel(model, ...).to(device)`` makes ``model`` a
        wrapper even where the assignment is not of the call itself)."""
        if self._wrapped_arguments is None:
            calls = patterns.find_all(self.ctx.module, lambda n: isinstance(n, cst.Call) and bool(
                self.ctx.qualnames(n.func) & set(DDP)))
            self._wrapped_arguments = {name for call in calls for arg in patterns.positional(call)[:1]
                                       if (name := patterns.dotted_name(arg.value)) is not None}
        return self._wrapped_arguments

    def _is_module_getattr(self, node: cst.Call) -> bool:
        """``getattr(model, "module", model)``."""
        if not self.ctx.is_call_to(node, "builtins.getattr") or len(node.args) != 3:
            return False
        obj, attr, default = (a.value for a in node.args)
        return (patterns.string_value(attr) == "module" and patterns.dotted_name(obj) is not None
                and patterns.dotted_name(obj) == patterns.dotted_name(default))

    def visit_IfExp(self, node: cst.IfExp) -> None:
        """``model.module if hasattr(model, "module") else model`` -> ``model``."""
        if not self._unwrapped:
            return
        test, body, orelse = node.test, node.body, node.orelse
        name = patterns.dotted_name(orelse)
        if (name is not None and patterns.dotted_name(body) == f"{name}.module" and self._is_wrapper(orelse)
                and patterns.is_pure(test)):
            # raw_model = model.module if ddp else model: both branches are the model once DDP goes.
            self._handled.add(body)
            self.replace(node, lambda updated: updated.orelse.with_changes(lpar=updated.lpar, rpar=updated.rpar),
                         f"{short(node)} -> {name}: no DDP wrapper (both branches are the model)")
            return
        if not (isinstance(test, cst.Call) and self.ctx.is_call_to(test, "builtins.hasattr") and len(test.args) == 2
                and patterns.string_value(test.args[1].value) == "module"):
            return
        name = patterns.dotted_name(test.args[0].value)
        if name is None or patterns.dotted_name(orelse) != name or patterns.dotted_name(body) != f"{name}.module":
            return
        self._handled.add(body)
        self.replace(node, lambda updated: updated.orelse.with_changes(lpar=updated.lpar, rpar=updated.rpar),
                     f"{short(node)} -> {name}: no DDP wrapper")

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if self._unwrapped and node.attr.value == "no_sync" and self._is_wrapper(node.value):
            self._no_sync_reference(node)
        if not self._unwrapped or node.attr.value != "module" or node in self._handled:
            return
        if not self._is_wrapper(node.value):
            return
        parent = self.ctx.parent(node)
        if isinstance(parent, cst.AssignTarget) or (isinstance(parent, cst.Call) and parent in self._handled):
            return
        self.replace(node, lambda updated: updated.value.with_changes(lpar=updated.lpar, rpar=updated.rpar),
                     f"{short(node)} -> {short(node.value)}: no DDP wrapper")
