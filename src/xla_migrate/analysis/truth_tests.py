"""Truth tests of tensors in a function, read with ``ast`` for the project index (issue 30): ``if torch.min(y) <
-1.:``, ``while t.max() > 0:``, ``assert (t >= 0).all()`` read the tensor's value to the host as surely as
``.item()`` (a graph cut every step when a step calls the function). Evidence is required: a torch call that
computes a tensor, or a name the function binds to one; a parameter alone may be a number or an array.
``tensor_tests.py`` answers the same question for the module being migrated, with its step model."""

from __future__ import annotations

import ast

from .project_flow import dotted, own_nodes

# torch functions that answer on the host without reading a tensor's value.
HOST_TORCH = ("torch.is_tensor", "torch.is_floating_point", "torch.is_complex", "torch.is_grad_enabled",
              "torch.is_inference_mode_enabled", "torch.get_default_dtype", "torch.numel", "torch.is_storage",
              "torch.are_deterministic_algorithms_enabled", "torch.device", "torch.dtype", "torch.Size",
              "torch.finfo", "torch.iinfo")
HOST_TORCH_PREFIXES = ("torch.cuda.", "torch.distributed.", "torch.backends.", "torch.jit.", "torch.onnx.",
                       "torch.version.", "torch.utils.", "torch.multiprocessing.", "torch.compiler.",
                       "torch_xla.", "torch.nn.")
# Tensor methods and attributes answered from the tensor's metadata, on the host.
_HOST_METHODS = ("size", "dim", "ndimension", "numel", "nelement", "element_size", "get_device", "is_contiguous",
                 "is_floating_point", "stride", "data_ptr", "storage_offset", "item", "tolist", "numpy", "cpu")
# torch functions that read the tensors themselves and return a Python bool: a name bound to one is no tensor.
_BOOL_RESULTS = ("torch.equal", "torch.allclose", "torch.is_nonzero", "torch.is_same_size")
_HOST_ATTRIBUTES = ("shape", "dtype", "device", "ndim", "is_cuda", "requires_grad", "layout", "names")


def torch_aliases(tree: ast.Module) -> dict[str, str]:
    """Names the module binds to torch modules: ``torch``, ``th`` (``import torch as th``), ``F``
    (``import torch.nn.functional as F``)."""
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "torch" or alias.name.startswith("torch."):
                    found[alias.asname or "torch"] = alias.name if alias.asname else "torch"
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and (
                node.module == "torch" or node.module.startswith("torch.")):
            for alias in node.names:
                found[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return found


def _torch_call(func: ast.expr, aliases: dict[str, str]) -> str | None:
    """The called torch name, its module alias spelled out (``F.relu`` -> ``torch.nn.functional.relu``)."""
    name = dotted(func)
    head, dot, rest = (name or "").partition(".")
    return aliases[head] + dot + rest if head in aliases else None


class _Evidence:
    def __init__(self, aliases: dict[str, str]) -> None:
        self.aliases = aliases
        self.tensors: set[str] = set()

    def tensor(self, node: ast.expr) -> bool:
        """``node`` computes a tensor (see the module docstring)."""
        if isinstance(node, ast.Call):
            called = _torch_call(node.func, self.aliases)
            if called is not None:
                host = called in HOST_TORCH or (called.startswith(HOST_TORCH_PREFIXES)
                                                and not called.startswith("torch.nn.functional."))
                return not host
            return (isinstance(node.func, ast.Attribute) and node.func.attr not in _HOST_METHODS
                    and self.tensor(node.func.value))
        if isinstance(node, ast.Name):
            return node.id in self.tensors
        if isinstance(node, ast.Attribute):
            return node.attr == "grad" or (node.attr not in _HOST_ATTRIBUTES and self.tensor(node.value))
        if isinstance(node, ast.Subscript):
            return self.tensor(node.value)
        if isinstance(node, ast.BinOp):
            return self.tensor(node.left) or self.tensor(node.right)
        if isinstance(node, ast.UnaryOp) and not isinstance(node.op, ast.Not):
            return self.tensor(node.operand)
        if isinstance(node, ast.Compare):
            if all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
                return False
            return any(self.tensor(operand) for operand in (node.left, *node.comparators))
        return False

    def reads(self, test: ast.expr) -> bool:
        """The truth of ``test`` needs a tensor's value: ``torch.min(y) < -1.``, ``(t >= 0).all()``,
        ``torch.isnan(loss)``; ``x is None`` and ``isinstance`` parts do not."""
        if isinstance(test, ast.BoolOp):
            return any(self.reads(value) for value in test.values)
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self.reads(test.operand)
        return self.tensor(test)

    def bind(self, function: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        """The names the function binds to tensors, to a fixed point (``t = torch.relu(x)``; ``t = t / 2``)."""
        assignments = [(n.targets[0] if isinstance(n, ast.Assign) else n.target, n.value)
                       for n in own_nodes(function) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                       and n.value is not None and (not isinstance(n, ast.Assign) or len(n.targets) == 1)]
        changed = True
        while changed:
            changed = False
            for target, value in assignments:
                names = {n.id for n in ast.walk(target) if isinstance(n, ast.Name)} - self.tensors
                returns_bool = isinstance(value, ast.Call) and _torch_call(value.func, self.aliases) in _BOOL_RESULTS
                if names and isinstance(target, (ast.Name, ast.Tuple)) and self.tensor(value) and not returns_bool:
                    self.tensors |= names
                    changed = True


def first_truth_test(function: ast.FunctionDef | ast.AsyncFunctionDef,
                     aliases: dict[str, str]) -> tuple[int, str, bool] | None:
    """The first ``if``/``while``/``assert`` of a function's own code whose test reads a tensor: (line,
    ``if torch.min(y) < -1.0:``, in a loop of the function)."""
    if not aliases:
        return None
    evidence = _Evidence(aliases)
    evidence.bind(function)
    looped: set[int] = set()
    for node in own_nodes(function):
        if isinstance(node, (ast.For, ast.While, ast.AsyncFor)):
            looped |= {id(n) for child in node.body for n in ast.walk(child)}
    found: tuple[int, str, bool] | None = None
    for node in own_nodes(function):
        if not isinstance(node, (ast.If, ast.While, ast.Assert)) or not evidence.reads(node.test):
            continue
        keyword = {ast.If: "if", ast.While: "while", ast.Assert: "assert"}[type(node)]
        try:
            code = f"{keyword} {ast.unparse(node.test)}" + (":" if keyword != "assert" else "")
        except Exception:  # noqa: BLE001 (a node ast cannot write back: keep the keyword)
            code = f"{keyword} ..."
        candidate = (node.lineno, code, id(node) in looped or isinstance(node, ast.While))
        if found is None or candidate[0] < found[0]:
            found = candidate
    return found
