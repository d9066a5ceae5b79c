"""XLA405 ddp-to-xla: the DistributedDataParallel wrapper goes; model.module becomes the model.

What it does:
    In a distributed script:

    - ``model = DDP(model, device_ids=[local_rank], ...)`` is removed; where the wrapper gets another name
      or is used in place (``ddp_model = DDP(model)``, ``train(DDP(model))``) the call becomes the module
      it wraps (``ddp_model = model``). Every DDP option (``device_ids``, ``output_device``,
      ``find_unused_parameters``, ``broadcast_buffers``...) goes with it.
    - ``model.module`` (on a name bound to a DDP wrapper, or with that name elsewhere, e.g. a function's
      ``model`` parameter) -> ``model``; ``model.module if hasattr(model, "module") else model`` and
      ``getattr(model, "module", model)`` and ``model.module if ddp else model`` -> ``model``.
    - ``with model.no_sync():`` -> ``with contextlib.nullcontext():`` (gradient accumulation: without DDP no
      step reduces before the optimizer step anyway); ``model.no_sync`` itself (``ctx = model.no_sync if
      accumulating else nullcontext``) -> ``contextlib.nullcontext``. Where the script imports
      ``nullcontext`` from contextlib among its leading imports (and binds that name to nothing else), that
      name is used instead.
    - ``nn.SyncBatchNorm.convert_sync_batchnorm(model)`` is reported.

    In the ddp data-parallel form (``--data-parallel ddp``, the ``2.9`` target's default) the wrapper stays,
    on the ``xla`` process group (XLA404): ``DDP(model, device_ids=[local_rank], output_device=local_rank)``
    -> ``DDP(model, gradient_as_bucket_view=True)`` (the CUDA device options go; the others stay), and
    ``model.module`` and ``no_sync()`` keep working as written.

Why:
    The seeds' distributed form keeps no DDP wrapper: each replica runs the plain model and the gradients
    are all-reduced by ``xm.optimizer_step`` (or the explicit ``xm.all_reduce`` of XLA406). DDP needs a
    process group and CUDA device ids, and on XLA its hooks deadlock or reduce a second time. DDP also
    broadcast rank 0's initial weights; without it every replica must build the same weights (XLA408).

Example:
    model = DDP(model, device_ids=[local_rank])
    torch.save(model.module.state_dict(), "model.pt")

Use instead:
    torch.save(model.state_dict(), "model.pt")
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.analysis.facts import DDP
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.common import imported_from, joined, keyword_arg, short

# DDP options that name CUDA devices: dropped in the ddp form (torch_xla's DDP example passes none).
CUDA_DEVICE_OPTIONS = ("device_ids", "output_device")
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

    def visit_Call(self, node: cst.Call) -> None:
        if not self.ctx.distributed:
            return
        names = self.ctx.qualnames(node.func)
        if names & set(DDP) and self.ctx.ddp_form:
            self._on_xla(node)
        elif names & set(DDP):
            self._unwrap(node, sorted(names & set(DDP))[0])
        elif names & set(SYNC_BATCHNORM):
            self.finding(node, f"{short(node)}: SyncBatchNorm synchronises batch statistics through a CUDA "
                         "process group", "remove it (each replica normalises its own batch) or reduce the "
                         "statistics with xm.all_reduce")
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
        if same and isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
            self.remove(parent, f"removed {short(node)}: no DDP wrapper on XLA (xm.optimizer_step "
                                "all-reduces the gradients)")
        else:
            index = node.args.index(module[0])

            def inner(updated: cst.Call) -> cst.BaseExpression:
                value = updated.args[index].value
                return value.with_changes(lpar=[*updated.lpar, *value.lpar], rpar=[*value.rpar, *updated.rpar])

            self.replace(node, inner, f"{short(node)} -> {short(wrapped)}: no DDP wrapper on XLA")
        for module_name, name in imported_from(self.ctx, node.func, qualname):
            self.import_may_be_dead(module_name, name)
        self.import_may_be_dead("torch.nn.parallel", "DistributedDataParallel")

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
        return name is not None and (name in self.ctx.facts.ddp_models or name.rsplit(".", 1)[-1] in self._wrapped)

    def _is_module_getattr(self, node: cst.Call) -> bool:
        """``getattr(model, "module", model)``."""
        if not self.ctx.is_call_to(node, "builtins.getattr") or len(node.args) != 3:
            return False
        obj, attr, default = (a.value for a in node.args)
        return (patterns.string_value(attr) == "module" and patterns.dotted_name(obj) is not None
                and patterns.dotted_name(obj) == patterns.dotted_name(default))

    def visit_IfExp(self, node: cst.IfExp) -> None:
        """``model.module if hasattr(model, "module") else model`` -> ``model``."""
        if not self.ctx.xm_form:
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
        if self.ctx.xm_form and node.attr.value == "no_sync" and self._is_wrapper(node.value):
            self._no_sync_reference(node)
        if not self.ctx.xm_form or node.attr.value != "module" or node in self._handled:
            return
        if not self._is_wrapper(node.value):
            return
        parent = self.ctx.parent(node)
        if isinstance(parent, cst.AssignTarget) or (isinstance(parent, cst.Call) and parent in self._handled):
            return
        self.replace(node, lambda updated: updated.value.with_changes(lpar=updated.lpar, rpar=updated.rpar),
                     f"{short(node)} -> {short(node.value)}: no DDP wrapper")
