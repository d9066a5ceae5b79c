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
class Guard:
    """A tie made only under ``if <param>:`` / ``if not <param>:`` of the class's ``__init__`` (issue 36:
    ``if share_proj: self.proj.weight = self.trg_emb.weight``). ``param`` is "" for a condition that is not one
    of those (an ``else``, ``if self.config.tie:``): the call site cannot say whether the model tied."""

    param: str
    position: int = -1  # among __init__'s parameters after self
    default: str | None = None  # the parameter's default as code
    negated: bool = False


UNKNOWN = Guard("")


@dataclass(frozen=True)
class Tie:
    """``<object>.left = <object>.right``: attribute paths below the model object, made under ``guards``."""

    left: str
    right: str
    guards: tuple[Guard, ...] = ()


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
    for assign, guards in _guarded_assignments(node, (), _init_parameters(node)):
        value = _self_path(assign.value)
        for target in assign.targets:
            left = _self_path(target.target)
            if left and value and (left.rsplit(".", 1)[-1] in PARAMETERS or value.rsplit(".", 1)[-1] in PARAMETERS):
                ties.append(Tie(left, value, guards))
    for call in patterns.find_all(node, lambda n: isinstance(n, cst.Call) and bool(
            patterns.method_call(n, HF_TIE))):
        args = patterns.positional(call)  # type: ignore[arg-type]
        if len(args) >= 2:
            first, second = _self_path(args[0].value), _self_path(args[1].value)
            if first and second:
                ties.append(Tie(f"{first}.weight", f"{second}.weight"))
    return tuple(dict.fromkeys(ties))


def _init_parameters(node: cst.CSTNode) -> dict[str, tuple[int, str | None]]:
    """``__init__``'s parameters after self: name -> (position, default as code)."""
    if not isinstance(node, cst.ClassDef):
        return {}
    for statement in node.body.body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value == "__init__":
            params = list(statement.params.params)[1:]
            found = {p.name.value: (i, patterns.code_of(p.default) if p.default is not None else None)
                     for i, p in enumerate(params)}
            found.update({p.name.value: (-1, patterns.code_of(p.default) if p.default is not None else None)
                          for p in statement.params.kwonly_params})
            return found
    return {}


def _guard(test: cst.BaseExpression, params: dict[str, tuple[int, str | None]]) -> Guard:
    negated = isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not)
    name = test.expression if negated else test  # type: ignore[attr-defined]
    if isinstance(name, cst.Name) and name.value in params:
        position, default = params[name.value]
        return Guard(name.value, position, default, negated)
    return UNKNOWN


def _guarded_assignments(node: cst.CSTNode, guards: tuple[Guard, ...], params: dict[str, tuple[int, str | None]]):
    """Each assignment under ``node`` with the ``if`` tests it is made under."""
    if isinstance(node, cst.Assign):
        yield node, guards
        return
    if isinstance(node, cst.If):
        yield from _guarded_assignments(node.body, (*guards, _guard(node.test, params)), params)
        if node.orelse is not None:
            yield from _guarded_assignments(node.orelse, (*guards, UNKNOWN), params)
        return
    for child in node.children:
        yield from _guarded_assignments(child, guards, params)


def guard_condition(made: cst.Call, guards: tuple[Guard, ...]) -> str | bool | None:
    """The condition of a guarded tie in the terms of the call that made the model: code, a constant (the
    argument is a literal), or None when it cannot be told (then the tie is reported, not re-made)."""
    parts: list[str] = []
    if any(a.star for a in made.args):
        return None if guards else True
    positional = [a for a in made.args if a.keyword is None]
    for guard in guards:
        if not guard.param:
            return None
        arg = patterns.keyword(made, guard.param)
        if arg is not None:
            code = patterns.code_of(arg.value)
        elif 0 <= guard.position < len(positional):
            code = patterns.code_of(positional[guard.position].value)
        elif guard.default is not None:
            code = guard.default
        else:
            return None
        if code in ("True", "False", "None"):
            if (code == "True") == guard.negated:
                return False
            continue
        parts.append(f"not {code}" if guard.negated else code)
    return " and ".join(parts) if parts else True


def _self_path(node: cst.BaseExpression) -> str | None:
    """``self.transformer.wte.weight`` -> ``transformer.wte.weight``; None for anything else."""
    name = patterns.dotted_name(node)
    if name is None or not name.startswith("self.") or name.count(".") < 1:
        return None
    return name[len("self."):]


def retie_code(model: str, ties: tuple[Tie, ...], made: cst.Call | None = None) -> tuple[list[str], list[Tie]]:
    """The re-tie statements, each under the condition the class tied it (in the call's terms), and the ties
    whose condition cannot be told at the call (reported instead: re-tying them always changes the model)."""
    lines: list[str] = []
    unknown: list[Tie] = []
    for tie in ties:
        statement = f"{model}.{tie.left} = {model}.{tie.right}"
        condition = guard_condition(made, tie.guards) if made is not None else (None if tie.guards else True)
        if condition is None:
            unknown.append(tie)
        elif condition is True:
            lines.append(statement)
        elif condition is not False:
            lines.append(f"if {condition}:\n    {statement}")
    return lines, unknown


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
                return tuple(Tie(tie[0], tie[1], (UNKNOWN,) if len(tie) > 2 else ()) for tie in found)
    return ()
