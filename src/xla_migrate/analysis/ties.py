"""Tied weights and the device move (issue 36, point 1).

``Module.to(device)`` on CUDA swaps each parameter's storage in place, so two modules that share one
``Parameter`` (a GPT's ``self.transformer.wte.weight = self.lm_head.weight``) still share it afterwards. A CPU
tensor cannot take an XLA tensor's storage: on XLA each module gets a new ``Parameter`` of its own, and the tie
is gone (issue 36: a tiny GPT trained 11 weight tensors instead of 10, +4,160 parameters, and its loss curve
drifted). Re-tying after the move restores the original's model.

A tie is an assignment in a method of a class between two attribute chains of ``self`` whose last part is a
parameter (``weight``/``bias``), or Hugging Face's ``self._tie_or_clone_weights(self.lm_head, self.wte)``;
classes of this module, or of another module of the project (the project index). A model made by a Hugging
Face ``from_pretrained`` re-ties itself with ``model.tie_weights()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from ..syntax import patterns

if TYPE_CHECKING:
    from ..engine.context import MigrationContext

PARAMETERS = ("weight", "bias")
HF_TIE = "_tie_or_clone_weights"


@dataclass(frozen=True)
class Tie:
    """``<object>.left = <object>.right``: attribute paths below the model object."""

    left: str
    right: str


def class_ties(module: cst.Module) -> dict[str, tuple[Tie, ...]]:
    """Class name -> the ties its methods make (this module's classes)."""
    found: dict[str, tuple[Tie, ...]] = {}
    for statement in module.body:
        if isinstance(statement, cst.ClassDef):
            ties = ties_in(statement)
            if ties:
                found[statement.name.value] = ties
    return found


def ties_in(node: cst.CSTNode) -> tuple[Tie, ...]:
    ties: list[Tie] = []
    for assign in patterns.find_all(node, lambda n: isinstance(n, cst.Assign)):
        value = _self_path(assign.value)  # type: ignore[attr-defined]
        for target in assign.targets:  # type: ignore[attr-defined]
            left = _self_path(target.target)
            if left and value and (left.rsplit(".", 1)[-1] in PARAMETERS or value.rsplit(".", 1)[-1] in PARAMETERS):
                ties.append(Tie(left, value))
    for call in patterns.find_all(node, lambda n: isinstance(n, cst.Call) and bool(
            patterns.method_call(n, HF_TIE))):
        args = patterns.positional(call)  # type: ignore[arg-type]
        if len(args) >= 2:
            first, second = _self_path(args[0].value), _self_path(args[1].value)
            if first and second:
                ties.append(Tie(f"{first}.weight", f"{second}.weight"))
    return tuple(dict.fromkeys(ties))


def _self_path(node: cst.BaseExpression) -> str | None:
    """``self.transformer.wte.weight`` -> ``transformer.wte.weight``; None for anything else."""
    name = patterns.dotted_name(node)
    if name is None or not name.startswith("self.") or name.count(".") < 1:
        return None
    return name[len("self."):]


def retie_code(model: str, ties: tuple[Tie, ...]) -> list[str]:
    return [f"{model}.{tie.left} = {model}.{tie.right}" for tie in ties]


def ties_of_class(ctx: MigrationContext, call: cst.Call, local: dict[str, tuple[Tie, ...]]) -> tuple[Tie, ...] | str:
    """What the object ``call`` makes ties: its class's ties (this module, or the project's), "hf" for a
    Hugging Face ``from_pretrained``, else ()."""
    name = patterns.dotted_name(call.func) or ""
    if name in local:
        return local[name]
    qualified = ctx.qualnames(call.func)
    if name.endswith(".from_pretrained") and any(q.startswith("transformers.") for q in qualified):
        return "hf"
    project = ctx.project
    if project is not None:
        for q in sorted(qualified):
            found = project.class_ties(q)
            if found:
                return tuple(Tie(left, right) for left, right in found)
    return ()
