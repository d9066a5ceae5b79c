"""Where a program updates its weights, read from the standard ``ast`` of each of its modules (cheap: no libcst,
no scopes), for the data-parallel choice (data_parallel.py).

Per module: the backward calls, the optimizer updates (``opt.step()``, ``scaler.step(opt)``,
``xm.optimizer_step(opt)``), the optimizers it builds, the DistributedDataParallel wrappers (and whether each is
a plain ``x = DDP(...)`` statement, where the xm form broadcasts the weights instead), and the gradient
reductions it makes itself (gradient hooks, all-reduces over ``.grad``: tacotron2's
``apply_gradient_allreduce``, a hand-written ``average_gradients``). A program is one module, or in a project
the modules connected to it by imports (the run's one distributed decision covers the same modules): every
module of it reads the same summaries, so each gets the same form.
"""

from __future__ import annotations

import ast
import os
import warnings
from dataclasses import dataclass, field

# torch.optim classes (and the syncfree ones): a call of one builds an optimizer.
OPTIMIZER_CLASSES = frozenset({
    "SGD", "Adam", "AdamW", "Adamax", "Adagrad", "Adadelta", "RMSprop", "Rprop", "ASGD", "NAdam", "RAdam",
    "LBFGS", "SparseAdam", "Adafactor", "FusedAdam", "FusedLAMB", "LAMB", "Lamb", "Lion", "LARS",
})
_STEP_RECEIVER = ("optim", "opt", "scaler")
# Calls that hook into or reduce the gradients by hand.
_GRAD_HOOKS = ("register_hook", "register_comm_hook", "_register_comm_hook", "register_post_accumulate_grad_hook",
               "register_full_backward_hook", "register_backward_hook")
_REDUCTIONS = ("all_reduce", "all_reduce_coalesced", "reduce_gradients", "all_reduce_multigpu", "reduce")


@dataclass(frozen=True)
class Site:
    line: int
    function: str  # dotted: ``train``, ``Trainer.fit``, ``NativeScaler.__call__``; "" at module level
    what: str  # the call as a short text: ``optimizer.step()``
    column: int = 1


@dataclass(frozen=True)
class ModuleUpdates:
    backwards: tuple[Site, ...] = ()
    updates: tuple[Site, ...] = ()
    optimizers: tuple[Site, ...] = ()
    # (site, plain statement ``x = DDP(x, ...)``) per DistributedDataParallel call
    ddp_wraps: tuple[tuple[Site, bool], ...] = ()
    own_reductions: tuple[Site, ...] = ()
    # torch.distributed collectives no xm collective replaces (gather, scatter, *_object, send/recv...), or
    # called with a process group or async_op=True: the process group must stay for them
    collectives_without_xm: tuple[Site, ...] = ()
    # ``opt = idist.auto_optim(...)`` (ignite.distributed): the name it binds (``what``: ``opt``, ``optimizer``).
    # On XLA the optimizer it returns steps with ``xm.optimizer_step(opt, barrier=True)`` itself.
    auto_optimized: tuple[Site, ...] = ()
    error: bool = False


def summarize(source: str | bytes) -> ModuleUpdates:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ModuleUpdates(error=True)
    collector = _Collector()
    collector.visit(tree)
    return ModuleUpdates(tuple(collector.backwards), tuple(collector.updates), tuple(collector.optimizers),
                         tuple(collector.ddp_wraps), tuple(collector.own_reductions),
                         tuple(collector.collectives_without_xm), tuple(collector.auto_optimized))


_CACHE: dict[tuple[str, int, int], ModuleUpdates] = {}


def summarize_file(path: str) -> ModuleUpdates:
    """The summary of a file, cached per process by path, size and modification time (every worker of a tree
    run reads the same program's files)."""
    try:
        stat = os.stat(path)
    except OSError:
        return ModuleUpdates(error=True)
    key = (os.path.abspath(path), stat.st_size, stat.st_mtime_ns)
    if key not in _CACHE:
        try:
            with open(path, "rb") as handle:
                _CACHE[key] = summarize(handle.read())
        except OSError:
            return ModuleUpdates(error=True)
    return _CACHE[key]


@dataclass
class _Collector(ast.NodeVisitor):
    backwards: list[Site] = field(default_factory=list)
    updates: list[Site] = field(default_factory=list)
    optimizers: list[Site] = field(default_factory=list)
    ddp_wraps: list[tuple[Site, bool]] = field(default_factory=list)
    own_reductions: list[Site] = field(default_factory=list)
    collectives_without_xm: list[Site] = field(default_factory=list)
    auto_optimized: list[Site] = field(default_factory=list)
    _names: list[str] = field(default_factory=list)
    _plain_wraps: set = field(default_factory=set)
    _grad_functions: list[bool] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__()

    def _site(self, node: ast.AST, what: str) -> Site:
        return Site(getattr(node, "lineno", 0), ".".join(self._names), what, getattr(node, "col_offset", 0) + 1)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._names.append(node.name)
        self.generic_visit(node)
        self._names.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._names.append(node.name)
        # A function that handles .grad and reduces is a hand-written gradient reduction.
        self._grad_functions.append(any(isinstance(n, ast.Attribute) and n.attr == "grad" for n in ast.walk(node)))
        self.generic_visit(node)
        self._grad_functions.pop()
        self._names.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Assign(self, node: ast.Assign) -> None:
        # x = DDP(x, ...), or a method chain on it (x = DDP(x, ...).to(device)): the xm form broadcasts after it
        wrapper = node.value
        while isinstance(wrapper, ast.Call) and not _is_ddp(wrapper) and isinstance(wrapper.func, ast.Attribute):
            wrapper = wrapper.func.value
        if isinstance(wrapper, ast.Call) and _is_ddp(wrapper) and len(node.targets) == 1:
            self.ddp_wraps.append((self._site(wrapper, "DistributedDataParallel(...)"), True))
            self._plain_wraps.add(wrapper)
        value = node.value
        if isinstance(value, ast.Call) and (_dotted(value.func) or "").rsplit(".", 1)[-1] == "auto_optim":
            for target in node.targets:
                name = _dotted(target)
                if name is not None:
                    self.auto_optimized.append(self._site(value, name.rsplit(".", 1)[-1]))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        dotted = _dotted(func) or ""
        last = dotted.rsplit(".", 1)[-1] if dotted else (func.attr if isinstance(func, ast.Attribute) else "")
        receiver = _receiver(func)
        if last == "backward" and isinstance(func, ast.Attribute):
            self.backwards.append(self._site(node, _short(node)))
        elif last == "step" and isinstance(func, ast.Attribute) and any(w in receiver for w in _STEP_RECEIVER) \
                and "sched" not in receiver and not receiver.startswith("lr"):
            self.updates.append(self._site(node, _short(node)))
        elif last == "optimizer_step":
            self.updates.append(self._site(node, _short(node)))
        elif last in OPTIMIZER_CLASSES:
            self.optimizers.append(self._site(node, _short(node)))
        elif _is_ddp(node) and node not in self._plain_wraps:
            self.ddp_wraps.append((self._site(node, "DistributedDataParallel(...)"), False))
        elif last in _GRAD_HOOKS:
            self.own_reductions.append(self._site(node, _short(node)))
        elif last in _REDUCTIONS and (self._grad_functions[-1:] == [True] or _mentions_grad(node)):
            self.own_reductions.append(self._site(node, _short(node)))
        if dotted.startswith(_DIST_PREFIXES) and (last in _WITHOUT_XM or (last in _WITH_XM and _asks_more(node))):
            self.collectives_without_xm.append(self._site(node, _short(node)))
        self.generic_visit(node)


_DIST_PREFIXES = ("dist.", "torch.distributed.", "distributed.")
_WITH_XM = ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "reduce", "gather")
_WITHOUT_XM = ("scatter", "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
               "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "send", "recv",
               "isend", "irecv", "new_group", "monitored_barrier")


def _asks_more(node: ast.Call) -> bool:
    """A collective called with a process group (other than None / the default group) or async_op=True."""
    for keyword in node.keywords:
        value = keyword.value
        if keyword.arg == "async_op" and not (isinstance(value, ast.Constant) and value.value is False):
            return True
        if keyword.arg == "group" and not ((isinstance(value, ast.Constant) and value.value is None)
                                           or (_dotted(value) or "").endswith("group.WORLD")):
            return True
    return False


def _is_ddp(node: ast.Call) -> bool:
    dotted = _dotted(node.func) or ""
    return dotted.rsplit(".", 1)[-1] in ("DistributedDataParallel", "DDP")


def _mentions_grad(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "grad" for n in ast.walk(node))


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _receiver(func: ast.AST) -> str:
    if isinstance(func, ast.Attribute):
        dotted = _dotted(func.value)
        if dotted is not None:
            return dotted.rsplit(".", 1)[-1].lower()
    return ""


def _short(node: ast.Call) -> str:
    try:
        text = ast.unparse(node)
    except (ValueError, RecursionError):  # pragma: no cover - unparse of what parse gave
        return "(...)"
    return text if len(text) <= 60 else text[:57] + "..."


# A program: one file, or the modules of a project connected by imports -----------------------------------


@dataclass(frozen=True)
class Program:
    """The summaries of a program's modules: relative path (or the file's name) -> summary."""

    modules: dict[str, ModuleUpdates]

    def sites(self, kind: str) -> list[tuple[str, Site]]:
        return [(rel, site) for rel, info in sorted(self.modules.items()) for site in getattr(info, kind)]


def program_of(project, rel: str) -> Program:
    """The program ``rel`` belongs to in a project index: the modules connected to it by imports."""
    return Program({other: summarize_file(os.path.join(project.root, other)) for other in project.component(rel)})


def where(rel: str, site: Site) -> str:
    return f"{rel}:{site.line}"
