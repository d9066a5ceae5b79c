"""What the project index knows of the program's flow across modules (issue 30), read with ``ast``: the calls
of each function's own code, the model objects a loop calls, which functions a loop of another module runs
every step (the forward of an imported model class and what it calls), reads passed on through a module's own
calls, and random-crop helpers. ``project.py`` builds the index with these."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .project import ProjectIndex


def walk_ast(tree: ast.AST) -> list[ast.AST]:
    """``list(ast.walk(tree))``, in the same order (breadth first), for about half its time (no generators)."""
    nodes = [tree]
    index = 0
    append, AST = nodes.append, ast.AST
    while index < len(nodes):
        node = nodes[index]
        index += 1
        for field in node._fields:
            value = getattr(node, field, None)
            if isinstance(value, AST):
                append(value)
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, AST):
                        append(item)
    return nodes


def dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


_MOVES = ("to", "cuda", "cpu", "train", "eval", "float", "half", "bfloat16", "double")


def own_nodes(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.AST]:
    """The nodes of a function's own code (nested functions, lambdas and classes are not run by calling it)."""
    found: list[ast.AST] = []
    todo: list[ast.AST] = list(function.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        found.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return found


def own_calls(function: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[tuple[str, str], ...]:
    """The calls of a function's own code (:func:`own_nodes`): ("name", f) for ``f(...)``, ("self", m) for
    ``self.m(...)``."""
    found: list[tuple[str, str]] = []
    for node in own_nodes(function):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name):
                found.append(("name", node.func.id))
            elif isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
                    and node.func.value.id == "self":
                found.append(("self", node.func.attr))
    return tuple(dict.fromkeys(found))


def reads_through_own_calls(reads: dict[str, tuple[int, str]], calls: dict[str, tuple[tuple[str, str], ...]]) -> None:
    """A function or method that calls one of its module's functions (or its own class's methods) that reads,
    reads too (``optimize`` -> ``self._compute_norms()`` -> ``th.norm(p).item()``): the callee's read."""
    changed = True
    while changed:
        changed = False
        for qualified, called in calls.items():
            if qualified in reads:
                continue
            owner = qualified.rsplit(".", 1)[0] if "." in qualified else ""
            for kind, name in called:
                callee = f"{owner}.{name}" if kind == "self" and owner else name if kind == "name" else None
                if callee is not None and callee in reads:
                    reads[qualified] = reads[callee]
                    changed = True
                    break


def _made_class(value: ast.expr) -> str | None:
    """The class an assigned object is made from: ``Decoder()``, ``models.Decoder(cfg).to(device)``."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _MOVES \
            and isinstance(value.func.value, ast.Call):
        value = value.func.value
    if not isinstance(value, ast.Call):
        return None
    made = dotted(value.func)
    return made if made and made.rsplit(".", 1)[-1][:1].isupper() else None


def loop_model_calls(tree: ast.Module) -> tuple[tuple[int, str, str], ...]:
    """(loop line, name, class) for each call ``name(...)`` in a loop of a function (or of the module's
    code) where ``name`` is bound in that function (or the module) to an object of a class."""
    found: list[tuple[int, str, str]] = []
    scopes: list[ast.AST] = [tree] + [n for n in walk_ast(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    module_objects: dict[str, str] = {}
    # An object made in one function and handed to another as a parameter of the same name (``decoder =
    # DecoderWithAttention(...)`` in main, ``decoder(imgs, caps)`` in train): the one class bound to the name.
    anywhere: dict[str, set[str]] = {}
    for node in walk_ast(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            made = _made_class(node.value)
            if made is not None:
                anywhere.setdefault(node.targets[0].id, set()).add(made)
    for scope in scopes:
        objects = dict(module_objects) if scope is not tree else module_objects
        if scope is not tree:
            objects.update({name: next(iter(made)) for name, made in anywhere.items()
                            if len(made) == 1 and name not in objects})
        loops: list[ast.AST] = []
        todo = list(scope.body)  # type: ignore[attr-defined]
        while todo:
            node = todo.pop(0)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                made = _made_class(node.value)
                if made is not None:
                    objects[node.targets[0].id] = made
            if isinstance(node, (ast.For, ast.While, ast.AsyncFor)):
                loops.append(node)
            todo.extend(ast.iter_child_nodes(node))
        for loop in loops:
            for node in walk_ast(loop):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in objects:
                    found.append((loop.lineno, node.func.id, objects[node.func.id]))
    return tuple(dict.fromkeys(found))


def per_step_functions(index: ProjectIndex) -> dict[tuple[str, str], str]:
    """(file, function) -> how it runs every step, for the models (and callable objects: a loss class's
    ``__call__``) a loop of another module calls and what their forward calls (module functions, imported
    project functions, methods of the class)."""
    found: dict[tuple[str, str], str] = {}
    todo: list[tuple[str, str, str]] = []
    for rel, info in sorted(index.modules.items()):
        for line, name, made in info.loop_models:
            defined = index._class_file(rel, made)
            if defined is None or defined[0] == rel:
                continue  # a class of the loop's own module: its step model follows it
            for method in ("forward", "__call__"):  # a torch module's forward, or a callable object's (a loss)
                todo.append((defined[0], f"{defined[1]}.{method}", f"the loop at {rel}:{line}: {name}(...)"))
    while todo:
        rel, qualified, how = todo.pop(0)
        info = index.modules[rel]
        if (rel, qualified) in found or qualified not in info.calls:
            continue
        found[(rel, qualified)] = how
        owner = qualified.rsplit(".", 1)[0] if "." in qualified else ""
        for kind, name in info.calls[qualified]:
            if kind == "self" and owner:
                todo.append((rel, f"{owner}.{name}", f"{how} -> self.{name}(...)"))
            elif kind == "name" and name in info.calls:
                todo.append((rel, name, f"{how} -> {name}(...)"))
            elif kind == "name" and name in info.imports:
                module, attribute = info.imports[name]
                target = index.resolve(rel, module) if attribute else None
                if target is not None and attribute in index.modules[target].calls:
                    todo.append((target, attribute, f"{how} -> {name}(...) ({target})"))
    return found


# Bases that make a class a torch module when spelled so (the step model's not_steps.py has the same list for
# the classes of the file it analyses).
_TORCH_MODULE_SPELLINGS = ("nn.Module", "torch.nn.Module", "Module", "nn.Sequential", "nn.ModuleList",
                           "LightningModule", "pl.LightningModule")


def torch_module_class(index: ProjectIndex, rel: str, class_name: str) -> bool:
    """``class_name`` (as ``rel`` spells it) is a class of the project whose bases reach a torch module,
    following the bases through the project's modules (``Ladder(BaseModel)``, ``BaseModel(nn.Module)``)."""
    seen: set[tuple[str, str]] = set()
    todo = [(rel, class_name)]
    while todo:
        where, name = todo.pop()
        defined = index._class_file(where, name)
        if defined is None or defined in seen:
            continue
        seen.add(defined)
        for base in index.modules[defined[0]].bases.get(defined[1], ()):
            if (base in _TORCH_MODULE_SPELLINGS or base.startswith("torch.nn.")
                    or base.endswith("PreTrainedModel")):
                return True
            todo.append((defined[0], base))
    return False


_RANDOM = ("random.", "np.random.", "numpy.random.")


def random_slice_helpers(tree: ast.Module) -> dict[str, tuple[int, str]]:
    """Top-level functions that slice like a tensor (several dimensions or ``...``) at offsets drawn with
    ``random.*`` / ``np.random.*`` (``lr_top = random.randint(...)``; ``img[:, :, lr_top:lr_top + p]``)."""
    found: dict[str, tuple[int, str]] = {}
    for function in tree.body:
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        nodes = walk_ast(function)
        drawn: set[str] = set()
        for node in nodes:
            if isinstance(node, ast.Assign) and any(
                    isinstance(c, ast.Call) and (dotted(c.func) or "").startswith(_RANDOM) for c in walk_ast(node.value)):
                drawn |= {n.id for t in node.targets for n in walk_ast(t) if isinstance(n, ast.Name)}
        if not drawn:
            continue
        for node in nodes:
            if not (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Tuple)):
                continue
            bounds = [b for e in node.slice.elts if isinstance(e, ast.Slice) for b in (e.lower, e.upper) if b]
            if any(isinstance(n, ast.Name) and n.id in drawn for b in bounds for n in walk_ast(b)):
                candidate = (node.lineno, ast.unparse(node))
                if function.name not in found or candidate[0] < found[function.name][0]:
                    found[function.name] = candidate
    return found


def _is_ast_mask(node: ast.expr, masks: set[str]) -> bool:
    """A boolean mask as XLA312 sees one: a comparison, ``~m``, ``a & b``, ``x.bool()``, a tensor made with
    ``dtype=torch.bool``, or a name bound to one of these."""
    if isinstance(node, ast.Compare):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Invert):
        return _is_ast_mask(node.operand, masks)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr)):
        return _is_ast_mask(node.left, masks) or _is_ast_mask(node.right, masks)
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Attribute) and node.func.attr == "bool" and not node.args:
            return True
        return any(k.arg == "dtype" and dotted(k.value) in ("torch.bool", "bool") for k in node.keywords)
    return isinstance(node, ast.Name) and node.id in masks


def mask_index_helpers(tree: ast.Module) -> dict[str, tuple[int, str]]:
    """Top-level functions (and ``Class.method``) whose code indexes with a boolean mask (``x[~mask]``,
    ``sim[labels.bool()]``): (line, code) of the first; a step that calls one gets a data-dependent shape."""
    found: dict[str, tuple[int, str]] = {}
    functions = [(f.name, f) for f in tree.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
    functions += [(f"{c.name}.{f.name}", f) for c in tree.body if isinstance(c, ast.ClassDef)
                  for f in c.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for name, function in functions:
        masks: set[str] = set()
        for statement in walk_ast(function):  # breadth first: a nested block's binding may come late
            if isinstance(statement, ast.Assign) and _is_ast_mask(statement.value, masks):
                masks |= {t.id for t in statement.targets if isinstance(t, ast.Name)}
        for node in walk_ast(function):
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_ast_mask(node.slice, masks):
                candidate = (node.lineno, ast.unparse(node))
                if name not in found or candidate[0] < found[name][0]:
                    found[name] = candidate
    return found
