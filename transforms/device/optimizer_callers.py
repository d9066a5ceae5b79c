"""For XLA107 (optimizer_before_device_move.py): whether every caller of a function that receives a model with
its optimizer, and moves the model, moved that model to the device before it built the optimizer it passes.

``def train(model, optimizer, ...): model.to(device)`` is a stale-optimizer bug on XLA only when a caller built
the optimizer on a model that was not on the device yet: ``nn.Module.to`` makes new parameter objects on XLA only
when it converts them (CPU -> XLA), so a model moved before its optimizer was built is returned as is by the
function's move, and the optimizer holds the live parameters (round 9's going_modular engine.train: its only
caller, train.py, builds ``model = TinyVGG(...).to(device)`` then ``torch.optim.Adam(model.parameters())``).

The callers are read from the standard ``ast`` of this module and of each module of the project that imports it
(cheap: no libcst, no scopes; the project index names the importers). The answer is yes only when each use of
the function is a call that passes plain names for the model and the optimizer, the optimizer is bound, in the
caller's scope, by ``optimizer = <call>(... model.parameters() ...)``, and the last thing that happened to the
model before that was an unconditional move to a device (``model = Net().to(device)``, ``model.cuda()``,
``model = model.to(device)``). Anything else (a use that is not a call, a star import, a notebook importer, an
optimizer built elsewhere, a conditional move) answers no, and the rule keeps its finding.
"""

from __future__ import annotations

import ast
import os
import re
import warnings

_PARAMETER_METHODS = ("parameters", "named_parameters")
_DEVICE_WORD = re.compile(r"device|dev\b|cuda|gpu|rank|xla", re.IGNORECASE)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def every_caller_moved_first(index, rel: str, source: str, function: str, params: list[str], model: str,
                             optimizer: str) -> bool:
    """``function`` (module level in ``rel``, whose code is ``source``) with parameters ``params`` receives
    ``model`` with ``optimizer``: True when it is called at least once in the project and each caller moved
    the model it passes to the device before building the optimizer it passes."""
    calls = 0
    for other in [rel, *index.importers(rel)]:
        if other == rel:
            text = source
        elif not other.endswith(".py"):
            return False  # a notebook's cells are not read here
        else:
            try:
                with open(os.path.join(index.root, other), "rb") as handle:
                    text = handle.read()
            except OSError:
                return False
        tree = _parse(text)
        if tree is None:
            return False
        found = _calls_of(tree, function, None if other == rel else _aliases(index, other, rel, tree, function))
        if found is None:
            return False
        for call, scope, parents in found:
            if not _moved_first(call, scope, parents, params, model, optimizer):
                return False
        calls += len(found)
    return calls > 0


def _parse(text: str | bytes) -> ast.Module | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _aliases(index, importer: str, rel: str, tree: ast.Module, function: str) -> tuple[set[str], set[str]] | None:
    """(names bound to the function, names bound to its module) in ``importer``; None for a star import."""
    names: set[str] = set()
    modules: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.ImportFrom) and any(alias.name == "*" for alias in node.names):
            if _target(index, importer, node, "") == rel:
                return None
            continue
        for alias in node.names:
            if isinstance(node, ast.Import):
                if alias.asname and index.resolve(importer, alias.name) == rel:
                    modules.add(alias.asname)
                elif not alias.asname and index.resolve(importer, alias.name) == rel:
                    modules.add(alias.name)  # ``import pkg.engine``: called as ``pkg.engine.train``
                continue
            local = alias.asname or alias.name
            base = _base(index, importer, node)
            if base is None:
                continue
            if index.resolve(importer, f"{base}.{alias.name}" if base else alias.name) == rel:
                modules.add(local)  # ``from pkg import engine``
            elif base and index.resolve(importer, base) == rel and alias.name == function:
                names.add(local)  # ``from engine import train``
    return names, modules


def _base(index, importer: str, node: ast.ImportFrom) -> str | None:
    base = node.module or ""
    if node.level:
        package = index.modules[importer].name if importer in index.modules else ""
        parts = package.split(".")[:-1] if package else []
        if importer.endswith("__init__.py"):
            parts = package.split(".") if package else []
        parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
        base = ".".join([*parts, *([base] if base else [])])
    return base


def _target(index, importer: str, node: ast.ImportFrom, attribute: str) -> str | None:
    base = _base(index, importer, node)
    return index.import_target(importer, base, attribute) if base else None


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def _calls_of(tree: ast.Module, function: str, aliases: tuple[set[str], set[str]] | None
              ) -> list[tuple[ast.Call, ast.AST, dict[int, ast.AST]]] | None:
    """Each call of the function with its scope (function or module) and the parent map; None when the
    function is used other than by a call (passed on, rebound). ``aliases`` None: the defining module, where
    it is called by its own name."""
    names, modules = ({function}, set()) if aliases is None else aliases
    parents: dict[int, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    found = []
    for node in ast.walk(tree):
        spelled = _dotted(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
        if spelled is None or not (spelled in names or any(spelled == f"{m}.{function}" for m in modules)):
            continue
        if isinstance(node, ast.Name) and aliases is None and isinstance(node.ctx, ast.Store):
            continue
        parent = parents.get(id(node))
        if isinstance(parent, ast.Attribute):
            continue  # ``engine.train`` is seen as a whole (its ``engine`` part is not the function)
        if not (isinstance(parent, ast.Call) and parent.func is node):
            return None
        scope = parent
        while id(scope) in parents and not isinstance(scope, _SCOPES):
            scope = parents[id(scope)]
        if isinstance(scope, (ast.Lambda, ast.ClassDef)):
            return None
        if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            scope = tree
        found.append((parent, scope, parents))
    return found


def _argument(call: ast.Call, params: list[str], name: str) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    position = params.index(name)
    if any(isinstance(a, ast.Starred) for a in call.args[: position + 1]):
        return None
    return call.args[position] if position < len(call.args) else None


def _statements(scope: ast.AST) -> list[ast.stmt]:
    """The statements of a scope in source order, nested blocks included, nested definitions not."""
    found: list[ast.stmt] = []

    def visit(body: list[ast.stmt]) -> None:
        for statement in body:
            found.append(statement)
            if isinstance(statement, _SCOPES):
                continue
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for item in getattr(statement, field, ()) or ():
                    if isinstance(item, ast.stmt):
                        visit([item])
                    elif hasattr(item, "body"):
                        visit(item.body)

    visit(scope.body)
    return found


def _binds(statement: ast.stmt, name: str) -> bool:
    targets = []
    if isinstance(statement, ast.Assign):
        targets = statement.targets
    elif isinstance(statement, (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor)):
        targets = [statement.target]
    elif isinstance(statement, (ast.With, ast.AsyncWith)):
        targets = [item.optional_vars for item in statement.items if item.optional_vars is not None]
    elif isinstance(statement, (ast.Import, ast.ImportFrom)):
        return any((alias.asname or alias.name.split(".")[0]) == name for alias in statement.names)
    elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return statement.name == name
    return any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t))


def _is_move(value: ast.expr) -> bool:
    """``X.cuda()`` / ``X.to(<a device>)``, the last call of a chain (``Net().to(device).train()`` is not)."""
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)):
        return False
    if value.func.attr == "cuda":
        return True
    if value.func.attr != "to":
        return False
    device = next((k.value for k in value.keywords if k.arg == "device"), value.args[0] if value.args else None)
    if isinstance(device, ast.Constant) and isinstance(device.value, str):
        return device.value.startswith(("cuda", "xla"))
    if isinstance(device, ast.Call):
        return (_dotted(device.func) or "").endswith("device")
    spelled = _dotted(device) if device is not None else None
    return bool(spelled) and bool(_DEVICE_WORD.search(spelled.rsplit(".", 1)[-1]))


def _moves(statement: ast.stmt, model: str) -> bool:
    """``model.to(device)`` as a statement, or ``model = <...>.to(device)``."""
    if isinstance(statement, ast.Expr):
        return _is_move(statement.value) and _dotted(statement.value.func.value) == model  # type: ignore[union-attr]
    if isinstance(statement, (ast.Assign, ast.AnnAssign)) and statement.value is not None:
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        return [_dotted(t) for t in targets] == [model] and _is_move(statement.value)
    return False


def _reads_parameters(value: ast.expr, model: str) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _PARAMETER_METHODS
               and (_dotted(n.func.value) or "").split(".")[0] == model for n in ast.walk(value))


def _unconditional(statement: ast.stmt, before: ast.stmt, parents: dict[int, ast.AST]) -> bool:
    """``statement`` runs whenever ``before`` runs: its block holds ``before`` (directly or not)."""
    block = parents.get(id(statement))
    node = parents.get(id(before))
    while node is not None:
        if node is block:
            return True
        node = parents.get(id(node))
    return False


def _moved_first(call: ast.Call, scope: ast.AST, parents: dict[int, ast.AST], params: list[str], model: str,
                 optimizer: str) -> bool:
    passed = [_argument(call, params, name) for name in (model, optimizer)]
    if not all(isinstance(value, ast.Name) for value in passed):
        return False
    model_name, optimizer_name = passed[0].id, passed[1].id  # type: ignore[union-attr]
    statements = [s for s in _statements(scope) if s.lineno < call.lineno]
    bound = [s for s in statements if _binds(s, optimizer_name)]
    if not bound:
        return False
    built = bound[-1]
    if not (isinstance(built, ast.Assign) and len(built.targets) == 1 and isinstance(built.targets[0], ast.Name)
            and isinstance(built.value, ast.Call) and _reads_parameters(built.value, model_name)
            and _unconditional(built, _statement_of(call, parents), parents)):
        return False
    touched = [s for s in statements if s.lineno < built.lineno and (_binds(s, model_name) or _moves(s, model_name))]
    return bool(touched) and _moves(touched[-1], model_name) and _unconditional(touched[-1], built, parents)


def _statement_of(node: ast.AST, parents: dict[int, ast.AST]) -> ast.AST:
    while not isinstance(node, ast.stmt) and id(node) in parents:
        node = parents[id(node)]
    return node
