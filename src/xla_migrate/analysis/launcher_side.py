"""The module's functions that run in the launcher's process, before the program starts its workers: called
(by name, directly or through each other) from the code that launches, above the launch call
(``model = load_pretrained(...)`` then ``mp.spawn(worker, ...)`` in the ``__main__`` block). A device made
there starts the XLA runtime before the spawn, which refuses to start ("Runtime is already initialized").
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from ..syntax import patterns
from .facts import MP_SPAWN

LAUNCH_CALLS = frozenset({*MP_SPAWN, "torch_xla.distributed.xla_multiprocessing.spawn", "torch_xla.launch"})


def functions_before_launch(module: cst.Module, qualnames: Callable[[cst.CSTNode], set[str]],
                            position: Callable[[cst.CSTNode], tuple[int, int]]) -> frozenset[cst.FunctionDef]:
    functions = {s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)}
    if not functions:
        return frozenset()
    found: set[cst.FunctionDef] = set()
    for launch in patterns.find_all(module, lambda n: isinstance(n, cst.Call) and bool(
            qualnames(n.func) & LAUNCH_CALLS)):
        owner = _owner(module, launch)
        worker = patterns.positional(launch)[:1]
        launched = worker[0].value.value if worker and isinstance(worker[0].value, cst.Name) else None
        for call in _calls_by_name(owner if owner is not None else module, nested=owner is not None):
            name = call.func.value  # type: ignore[attr-defined]
            if name in functions and name != launched and position(call) < position(launch):
                found.add(functions[name])
    todo = list(found)
    while todo:  # what those functions call runs before the launch too
        for call in _calls_by_name(todo.pop(), nested=True):
            callee = functions.get(call.func.value)  # type: ignore[attr-defined]
            if callee is not None and callee not in found:
                found.add(callee)
                todo.append(callee)
    return frozenset(found)


def _owner(module: cst.Module, node: cst.CSTNode) -> cst.FunctionDef | None:
    """The module-level function holding ``node`` (None: the module's own code)."""
    for statement in module.body:
        if isinstance(statement, cst.FunctionDef) and patterns.find_all(statement, lambda n: n is node):
            return statement
    return None


def _calls_by_name(tree: cst.CSTNode, nested: bool) -> list[cst.Call]:
    """The ``name(...)`` calls in ``tree``; in a module's own code (``nested`` False) not those inside its
    functions and classes."""
    if nested:
        return patterns.find_all(tree, lambda n: isinstance(n, cst.Call) and isinstance(n.func, cst.Name))
    calls: list[cst.Call] = []
    for statement in tree.body:  # type: ignore[attr-defined]
        if not isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            calls += patterns.find_all(statement, lambda n: isinstance(n, cst.Call) and isinstance(n.func, cst.Name))
    return calls
