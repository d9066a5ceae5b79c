"""Which loops get a device loader and which get a step barrier: one decision shared by XLA301 and XLA302.

Both rules see the same facts; deciding here keeps them from disagreeing. A ``for`` loop of a training (or
evaluation) loop that iterates a DataLoader, directly or through ``enumerate()`` / ``tqdm()``, is wrapped in
the target's device loader by XLA301; the device loader marks the step, so XLA302 gives a barrier only to
training loops that iterate no device loader (``while`` loops, ``iter()``/``next()``, lists of batches...).
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass

import libcst as cst

from . import patterns
from .context import MigrationContext
from .facts import DATALOADERS, DEVICE_LOADERS

# Calls that pass an iterable through (the loader is their first argument).
PASS_THROUGH = ("builtins.enumerate", "tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.std.tqdm")
STEP_BARRIERS = ("torch_xla.core.xla_model.mark_step", "torch_xla.sync")
OPTIMIZER_STEP = "torch_xla.core.xla_model.optimizer_step"
# A name that says it holds a loader: train_loader, self.val_loader, dataloader, train_dl.
_LOADER_NAME = re.compile(r"(loader|^dl$|_dl$|^dl_)", re.IGNORECASE)
_OPTIMIZER_NAME = re.compile(r"optim|^opt", re.IGNORECASE)

# Contexts whose rules include XLA301 (the device-loader rule registers itself when it is constructed, before
# the traversal starts), so XLA302 knows whether a loop it leaves alone really gets a device loader.
_WRAPPING: weakref.WeakSet[MigrationContext] = weakref.WeakSet()


@dataclass(frozen=True)
class LoaderSite:
    loop: cst.For
    loader: cst.BaseExpression  # the DataLoader expression as iterated (inside enumerate()/tqdm())


def register_device_loader_rule(ctx: MigrationContext) -> None:
    _WRAPPING.add(ctx)


def _unwrap(ctx: MigrationContext, node: cst.BaseExpression) -> cst.BaseExpression:
    while isinstance(node, cst.Call) and ctx.qualnames(node.func) & set(PASS_THROUGH):
        args = patterns.positional(node)
        if not args:
            break
        node = args[0].value
    return node


def is_device_loader(ctx: MigrationContext, node: cst.BaseExpression) -> bool:
    """Already delivers batches on the XLA device: ``pl.MpDeviceLoader(...)``, ``.per_device_loader(...)``,
    or a name bound to one."""
    if isinstance(node, cst.Call):
        return bool(ctx.qualnames(node.func) & set(DEVICE_LOADERS)) or bool(
            patterns.method_call(node, "per_device_loader"))
    name = patterns.dotted_name(node)
    return name is not None and name in ctx.facts.device_loaders


def is_data_loader(ctx: MigrationContext, node: cst.BaseExpression) -> bool:
    """A DataLoader: one the script builds, a name bound to one, or a name that says it is one (loaders are
    often parameters: ``def train(model, device, train_loader)``)."""
    if isinstance(node, cst.Call):
        return bool(ctx.qualnames(node.func) & set(DATALOADERS))
    name = patterns.dotted_name(node)
    if name is None or name in ctx.facts.device_loaders:
        return False
    return name in ctx.facts.loaders or bool(_LOADER_NAME.search(name.rsplit(".", 1)[-1]))


def _moves_to_device(loop: cst.For) -> bool:
    """The loop body moves its batches to a device (``.to(...)``, ``.cuda()``): a device loop (evaluation)."""
    found = False

    class Finder(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            nonlocal found
            if patterns.method_call(node, "to", "cuda"):
                found = True

    loop.body.visit(Finder())
    return found


def loop_iterable(ctx: MigrationContext, loop: cst.For) -> cst.BaseExpression:
    return _unwrap(ctx, loop.iter)


def loader_site(ctx: MigrationContext, loop: cst.CSTNode) -> LoaderSite | None:
    """The DataLoader this loop iterates and that XLA301 wraps in a device loader, else None: a training
    loop, or a loop that moves its batches to the device (evaluation), iterating a DataLoader that is not
    yet a device loader."""
    if not isinstance(loop, cst.For) or isinstance(loop.iter, cst.BaseComp) or ctx.facts.uses_accelerate:
        # Accelerate's prepared loaders already are device loaders on XLA (XLA605).
        return None
    if loop not in ctx.facts.training_loops and not _moves_to_device(loop):
        return None
    loader = loop_iterable(ctx, loop)
    if is_device_loader(ctx, loader) or not is_data_loader(ctx, loader):
        return None
    return LoaderSite(loop, loader)


def iterates_device_loader(ctx: MigrationContext, loop: cst.CSTNode) -> bool:
    """After migration the loop iterates a device loader: it already does, or XLA301 runs and wraps it."""
    if isinstance(loop, cst.For) and is_device_loader(ctx, loop_iterable(ctx, loop)):
        return True
    return ctx in _WRAPPING and loader_site(ctx, loop) is not None


def has_step_barrier(ctx: MigrationContext, loop: cst.CSTNode) -> bool:
    found = False

    class Finder(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            nonlocal found
            names = ctx.qualnames(node.func)
            barrier = patterns.keyword(node, "barrier")
            if names & set(STEP_BARRIERS) or (OPTIMIZER_STEP in names and barrier is not None
                                              and patterns.dotted_name(barrier.value) == "True"):
                found = True

    loop.body.visit(Finder())
    return found


def needs_step_barrier(ctx: MigrationContext, loop: cst.CSTNode) -> bool:
    """A training loop that iterates no device loader and has no barrier of its own (Accelerate marks the
    step through its prepared loader: none in an accelerate script)."""
    return (loop in ctx.facts.training_loops and not ctx.facts.uses_accelerate and not iterates_device_loader(ctx, loop)
            and not has_step_barrier(ctx, loop))


def is_optimizer_step(ctx: MigrationContext, node: cst.CSTNode) -> bool:
    """``optimizer.step()``, ``self.opt.step()``, ``scaler.step(optimizer)`` (not ``scheduler.step()``)."""
    if ctx.is_call_to(node, OPTIMIZER_STEP):
        return True
    attribute = patterns.method_call(node, "step")
    if attribute is None:
        return False
    receiver = patterns.dotted_name(attribute.value)
    if receiver is None:
        return False
    if receiver in ctx.facts.optimizers or receiver in ctx.facts.scalers:
        return True
    last = receiver.rsplit(".", 1)[-1]
    return bool(_OPTIMIZER_NAME.search(last)) or "scaler" in last.lower()
