"""Training that a library runs (issue 30): ``transformers.Trainer(...).train()``, trl's ``SFTTrainer``,
Lightning's ``Trainer(...).fit(model)``. The script has no ``.backward()`` and no loop of its own, yet it
trains: XLA903 drops ``torch.compile`` from it like from any training script.

Also the updates Lightning Fabric owns (issue 29): a loop whose backward is ``fabric.backward(loss)`` steps
optimizers that ``fabric.setup(...)`` wrapped; Fabric's strategy (XLAStrategy on XLA, XLA908 says which)
reduces the gradients and runs the step, so XLA204 leaves ``optimizer.step()`` as it is and XLA302 adds no
barrier after it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from ...syntax import patterns

if TYPE_CHECKING:
    from ...engine.context import MigrationContext

# Packages whose ``...Trainer`` class trains when its method below is called.
TRAINER_PACKAGES = {"transformers.": "train", "trl.": "train", "pytorch_lightning.": "fit", "lightning.": "fit"}


def trains_through_a_trainer(ctx: MigrationContext) -> bool:
    """The module calls a trainer's ``train()``/``fit()``: on ``Trainer(...)`` itself or on a name bound to
    one (``trainer = transformers.Trainer(...)`` ... ``trainer.train()``), a local subclass's too."""
    return ctx.once(trains_through_a_trainer, lambda: _trains(ctx))  # type: ignore[return-value]


def _trains(ctx: MigrationContext) -> bool:
    local = _local_trainers(ctx)
    bound: dict[str, str] = {}  # name -> the method that trains
    for assign in patterns.find_all(ctx.module, lambda n: isinstance(n, cst.Assign) and isinstance(n.value, cst.Call)):
        method = _training_method(ctx, assign.value.func, local)  # type: ignore[attr-defined]
        if method is not None:
            for target in assign.targets:  # type: ignore[attr-defined]
                name = patterns.dotted_name(target.target)
                if name is not None:
                    bound[name] = method
    for call in patterns.find_all(ctx.module, lambda n: isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute)):
        func = call.func  # type: ignore[attr-defined]
        receiver = func.value
        if isinstance(receiver, cst.Call):
            if _training_method(ctx, receiver.func, local) == func.attr.value:
                return True
        elif bound.get(patterns.dotted_name(receiver) or "") == func.attr.value:
            return True
    return False


def _training_method(ctx: MigrationContext, node: cst.BaseExpression, local: dict[str, str]) -> str | None:
    """``train`` or ``fit`` when ``node`` names a trainer class (a library's or a local subclass of one)."""
    name = patterns.dotted_name(node)
    if name is not None and name in local:
        return local[name]
    for qualname in ctx.qualnames(node):
        for package, method in TRAINER_PACKAGES.items():
            if qualname.startswith(package) and qualname.rsplit(".", 1)[-1].endswith("Trainer"):
                return method
    return None


def _local_trainers(ctx: MigrationContext) -> dict[str, str]:
    """Classes of the module derived from a trainer class (``class MyTrainer(Trainer)``), in source order."""
    found: dict[str, str] = {}
    for cls in patterns.find_all(ctx.module, lambda n: isinstance(n, cst.ClassDef)):
        for base in cls.bases:  # type: ignore[attr-defined]
            method = _training_method(ctx, base.value, found)
            if method is not None:
                found[cls.name.value] = method  # type: ignore[attr-defined]
                break
    return found


# Lightning Fabric's class, as libcst resolves it (``import lightning as L`` ... ``L.Fabric(...)``).
FABRIC_CLASSES = ("lightning.Fabric", "lightning.fabric.Fabric", "lightning_fabric.Fabric",
                  "lightning.fabric.fabric.Fabric", "lightning_fabric.fabric.Fabric")


def fabric_backward(ctx: MigrationContext, node: cst.CSTNode) -> bool:
    """``fabric.backward(loss)``: the backward of an object of Lightning's ``Fabric`` (a name bound to
    ``L.Fabric(...)`` in the module, or a name or attribute called ``fabric``, as a parameter holds it)."""
    method = patterns.method_call(node, "backward") if isinstance(node, cst.Call) else None
    if method is None or not patterns.positional(node):  # type: ignore[arg-type]
        return False
    receiver = patterns.dotted_name(method.value)
    if receiver is None:
        return False
    return receiver.rsplit(".", 1)[-1] == "fabric" or receiver in _fabric_names(ctx)


def _fabric_names(ctx: MigrationContext) -> frozenset[str]:
    return ctx.once(_fabric_names, lambda: frozenset(_bound_to_fabric(ctx)))  # type: ignore[return-value]


def _bound_to_fabric(ctx: MigrationContext) -> set[str]:
    found: set[str] = set()
    for assign in patterns.find_all(ctx.module, lambda n: isinstance(n, cst.Assign) and isinstance(n.value, cst.Call)):
        if ctx.qualnames(assign.value.func) & set(FABRIC_CLASSES):  # type: ignore[attr-defined]
            for target in assign.targets:  # type: ignore[attr-defined]
                name = patterns.dotted_name(target.target)
                if name is not None:
                    found.add(name)
    return found
