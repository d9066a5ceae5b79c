"""A torchrun script whose training code runs at module level (karpathy/llama2.c's train.py, nanoGPT's): read
from the standard ``ast`` of a module, for the data-parallel choice (data_parallel.py).

Such a script joins torchrun's rendezvous at module level (``dist.init_process_group`` with ``env://`` or no
``init_method``, or ``xla://`` once migrated to the ddp form; ``int(os.environ["RANK"])``) and has no function
the XLA launcher could start on each worker: no ``if __name__ == "__main__":`` block (or module-level
statement) calling one of its own functions, no ``_mp_fn``, no ``spawn`` / ``torch_xla.launch``. The xm form needs that function (XLA407 reports its absence),
so under ``torchrun --nproc_per_node=2`` each process of its output would be a world-size-1 job: both master,
nothing reduced across them. The ddp form keeps torchrun's rendezvous (``xla://``) and trains as one.

Evidence counts only outside functions and classes (a helper's ``init_process_group`` runs where it is called,
which is a function the launcher can start); a module that other modules of its project import is a helper,
not a script (its module-level env reads run at import in whatever launched the entry file).
"""

from __future__ import annotations

import ast
import os
import warnings
from dataclasses import dataclass

# torchrun's per-process variables (torch.distributed.launch --use_env sets the same)
TORCHRUN_VARIABLES = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"})


@dataclass(frozen=True)
class Rendezvous:
    """Where a module-level script joins torchrun's rendezvous: the first line of evidence."""

    line: int
    what: str


def module_level_rendezvous(source: str | bytes) -> Rendezvous | None:
    """The first module-level torchrun evidence of a script that has no function the xm form can launch;
    None for any other module (or one that does not parse)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if _launchable(tree):
        return None
    found = [evidence for node in _module_level_nodes(tree) if (evidence := _evidence(node)) is not None]
    return min(found, key=lambda e: e.line) if found else None


_CACHE: dict[tuple[str, int, int], Rendezvous | None] = {}


def module_level_rendezvous_of_file(path: str) -> Rendezvous | None:
    """``module_level_rendezvous`` of a file, cached per process by path, size and modification time."""
    try:
        stat = os.stat(path)
        key = (os.path.abspath(path), stat.st_size, stat.st_mtime_ns)
        if key not in _CACHE:
            with open(path, "rb") as handle:
                _CACHE[key] = module_level_rendezvous(handle.read())
    except OSError:
        return None
    return _CACHE[key]


def _launchable(tree: ast.Module) -> bool:
    """A function the xm form can start on each worker (XLA407's test): the ``__main__`` block, or without one a
    module-level statement, calls one of the module's own functions; or the script launches workers itself."""
    functions = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if "_mp_fn" in functions:
        return True
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_launcher(node.func):
            return True
    guards = [node for node in tree.body if isinstance(node, ast.If) and _is_main_guard(node.test)]
    statements = [s for guard in guards for s in guard.body] if guards else tree.body
    return any(isinstance(s, ast.Expr) and isinstance(s.value, ast.Call) and isinstance(s.value.func, ast.Name)
               and s.value.func.id in functions and (guards or s.value.func.id == "main") for s in statements)


def _is_launcher(func: ast.expr) -> bool:
    """``mp.spawn`` / ``xmp.spawn`` / ``torch.multiprocessing.spawn`` / ``start_processes`` /
    ``torch_xla.launch``: the script starts its workers itself."""
    return (_dotted(func) or "").endswith(("mp.spawn", "multiprocessing.spawn", "torch_xla.launch",
                                           "start_processes"))


def _module_level_nodes(tree: ast.Module):
    """Every node outside function and class bodies (in module-level ``if``/``with``/``try`` blocks too)."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def _evidence(node: ast.AST) -> Rendezvous | None:
    line = getattr(node, "lineno", 0)
    if isinstance(node, ast.Call) and _last(node.func) == "init_process_group":
        method = next((k.value for k in node.keywords if k.arg == "init_method"),
                      node.args[1] if len(node.args) > 1 else None)
        if method is None or (isinstance(method, ast.Constant) and isinstance(method.value, str)
                              and method.value.startswith(("env://", "xla://"))):
            return Rendezvous(line, _short(node))
        return None
    variable = _environment_variable(node)
    if variable in TORCHRUN_VARIABLES:
        return Rendezvous(line, f"reads {variable} from the environment")
    return None


def _environment_variable(node: ast.AST) -> str | None:
    """``os.environ["X"]``, ``os.environ.get("X")``, ``os.getenv("X")``, ``"X" in os.environ``: X."""
    if isinstance(node, ast.Subscript) and _dotted(node.value) == "os.environ":
        return _string(node.slice)
    if isinstance(node, ast.Call) and node.args and _dotted(node.func) in ("os.environ.get", "os.getenv"):
        return _string(node.args[0])
    if (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn))
            and _dotted(node.comparators[0]) == "os.environ"):
        return _string(node.left)
    return None


def _string(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _is_main_guard(test: ast.expr) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators))


def _last(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _short(node: ast.Call) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."
