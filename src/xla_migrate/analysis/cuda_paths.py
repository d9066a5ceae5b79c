"""Where code that already runs on XLA keeps a live CUDA path (one walk, asked by the ``on_xla_code`` rules).

A script written for both CUDA and torch_xla (fairseq's trainer, Lightning-style speed monitors) chooses its
path at run time: ``if torch.cuda.is_available():``, ``if device.type == "cuda":``, ``if self.cuda:``,
``use_cuda and ...``, the ``else`` of ``if self.tpu:`` / ``if xm is not None:``. The CUDA code on those paths
runs on GPU hosts and never on the TPU: it is not a remnant to migrate, and rewriting it breaks the GPU path.
In a file that tests whether it runs on XLA at all, every CUDA construct outside its XLA branches belongs to
that CUDA path too (the file has one, by its own test).
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from ..syntax import patterns

QualNames = Callable[[cst.CSTNode], set[str]]
Path = str | None  # "cuda", "xla" or None (unknown)
CUDA_TESTS = ("torch.cuda.is_available", "torch.cuda.device_count", "torch.cuda.is_initialized")


def _words(name: str) -> list[str]:
    return name.lower().split("_")


def _flag_path(name: str) -> tuple[Path, Path]:
    """A flag by its name: ``use_cuda``/``self.cuda``/``is_cuda`` (CUDA when true), ``no_cuda`` (when
    false), ``self.tpu``/``use_xla()``/``is_torch_xla_available()`` (XLA when true, else the CUDA path)."""
    words = _words(name)
    negated = bool(set(words) & {"no", "not", "disable", "without"})
    if "cuda" in words or "gpu" in words and "use" in words:
        return (None, "cuda") if negated else ("cuda", None)
    if "xla" in words or "tpu" in words:
        return ("cuda", "xla") if negated else ("xla", "cuda")
    return None, None


class CudaPaths(cst.CSTVisitor):
    def __init__(self, qualnames: QualNames, parent: Callable[[cst.CSTNode], cst.CSTNode | None]) -> None:
        super().__init__()
        self._qualnames = qualnames
        self._parent = parent
        # Branch (block, expression, elif) -> the path it is on.
        self._regions: dict[cst.CSTNode, str] = {}
        # The file tests whether it runs on XLA (it has a non-XLA path).
        self.tests_for_xla = False

    # The question ------------------------------------------------------------------------------------------
    def on_cuda_path(self, node: cst.CSTNode) -> bool:
        """``node`` is on a CUDA path: the innermost gated branch holding it is a CUDA one, or there is none
        and the file tests whether it runs on XLA."""
        path = self._innermost_path(node)
        return path == "cuda" if path is not None else self.tests_for_xla

    def path_of_branch(self, node: cst.CSTNode) -> str | None:
        """The path of a gated branch (``node`` is one), else None."""
        return self._regions.get(node)

    def under_cuda_gate(self, node: cst.CSTNode) -> bool:
        """The innermost gated branch holding ``node`` is a CUDA one."""
        return self._innermost_path(node) == "cuda"

    def _innermost_path(self, node: cst.CSTNode) -> str | None:
        current: cst.CSTNode | None = node
        while current is not None:
            path = self._regions.get(current)
            if path is not None:
                return path
            current = self._parent(current)
        return None

    # Tests -------------------------------------------------------------------------------------------------
    def paths(self, test: cst.BaseExpression) -> tuple[Path, Path]:
        """The path taken when ``test`` is true and when it is false."""
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            when_true, when_false = self.paths(test.expression)
            return when_false, when_true
        if isinstance(test, cst.BooleanOperation):
            left, right = self.paths(test.left), self.paths(test.right)
            # `a and b` true: both hold (either one's path); false: the one both agree on. `or`: the dual.
            strong, weak = (0, 1) if isinstance(test.operator, cst.And) else (1, 0)
            pair: list[Path] = [None, None]
            pair[strong] = next((p for p in ("cuda", "xla") if p in (left[strong], right[strong])), None)
            pair[weak] = left[weak] if left[weak] == right[weak] else None
            return pair[0], pair[1]
        if isinstance(test, cst.Call):
            names = self._qualnames(test.func)
            if names & set(CUDA_TESTS):
                return "cuda", None
            if patterns.method_call(test, "startswith"):
                args = patterns.positional(test)
                value = patterns.string_value(args[0].value) if len(args) == 1 else None
                return {"cuda": ("cuda", None), "xla": ("xla", "cuda")}.get(value or "", (None, None))
            name = patterns.dotted_name(test.func)
            return _flag_path(name.rsplit(".", 1)[-1]) if name else (None, None)
        if isinstance(test, (cst.Name, cst.Attribute)):
            name = patterns.dotted_name(test)
            return _flag_path(name.rsplit(".", 1)[-1]) if name else (None, None)
        if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
            return self._comparison(test)
        return None, None

    def _comparison(self, test: cst.Comparison) -> tuple[Path, Path]:
        target = test.comparisons[0]
        operator, right = target.operator, target.comparator
        negative = isinstance(operator, (cst.NotEqual, cst.NotIn, cst.IsNot))
        if isinstance(operator, (cst.Is, cst.IsNot)) and patterns.dotted_name(right) == "None":
            # `xm is not None`: a torch_xla import that may have failed.
            xla = any(n == "torch_xla" or n.startswith("torch_xla.") for n in self._qualnames(test.left))
            return (("xla", "cuda") if negative else ("cuda", "xla")) if xla else (None, None)
        strings = [patterns.string_value(side) for side in (test.left, right)]
        if isinstance(operator, (cst.Equal, cst.NotEqual, cst.In, cst.NotIn)):
            kinds = {"cuda" if patterns.is_cuda_string(side) else None for side in (test.left, right)}
            if "cuda" in kinds:
                return (None, "cuda") if negative else ("cuda", None)
            if "xla" in strings:
                return ("cuda", "xla") if negative else ("xla", "cuda")
        if isinstance(test.left, cst.Call) and self._qualnames(test.left.func) & set(CUDA_TESTS):
            return "cuda", None  # torch.cuda.device_count() > 0
        return None, None

    # The walk ----------------------------------------------------------------------------------------------
    def _mark(self, node: cst.CSTNode | None, path: Path) -> None:
        if node is not None and path is not None:
            self._regions[node] = path
            if path == "xla":
                self.tests_for_xla = True

    def _test(self, test: cst.BaseExpression) -> tuple[Path, Path]:
        when_true, when_false = self.paths(test)
        if "xla" in (when_true, when_false):
            self.tests_for_xla = True
        return when_true, when_false

    def visit_If(self, node: cst.If) -> None:
        when_true, when_false = self._test(node.test)
        self._mark(node.body, when_true)
        orelse = node.orelse
        self._mark(orelse.body if isinstance(orelse, cst.Else) else orelse, when_false)

    def visit_IfExp(self, node: cst.IfExp) -> None:
        when_true, when_false = self._test(node.test)
        self._mark(node.body, when_true)
        self._mark(node.orelse, when_false)

    def visit_BooleanOperation(self, node: cst.BooleanOperation) -> None:
        when_true, when_false = self._test(node.left)
        self._mark(node.right, when_true if isinstance(node.operator, cst.And) else when_false)

    def visit_While(self, node: cst.While) -> None:
        self._mark(node.body, self._test(node.test)[0])


def collect_cuda_paths(module: cst.Module, qualnames: QualNames,
                       parent: Callable[[cst.CSTNode], cst.CSTNode | None]) -> CudaPaths:
    paths = CudaPaths(qualnames, parent)
    module.visit(paths)
    return paths
