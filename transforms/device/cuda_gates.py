"""XLA104 cuda-gates: CUDA availability tests and device comparisons take the accelerator branch on XLA.

What it does:
    Finds the tests a script uses to choose its accelerator path: ``torch.cuda.is_available()``,
    ``device == "cuda"``, ``device.type == "cuda"``, ``args.device == "cuda"``, ``"cuda" in device``,
    ``device.startswith("cuda")`` (and their negations ``!=``, ``not in``, ``not ...``). On XLA every one of
    them is False, so the migrated script would silently leave the accelerator path (no AMP, no
    ``pin_memory``, a CPU device). Each is folded to the value it has on the accelerator, and the code around
    it is simplified:

    - ``use_amp = torch.cuda.is_available()`` -> ``use_amp = True``; ``pin_memory=torch.cuda.is_available()``
      -> ``pin_memory=True``.
    - ``not args.no_cuda and torch.cuda.is_available()`` -> ``not args.no_cuda``.
    - ``if torch.cuda.is_available(): x`` -> ``x`` (the taken branch is kept without the ``if``, one level
      less indented; its ``else`` is dropped; statements other rules remove from it do not count);
      ``if device.type != "cuda": ...`` without ``else`` is removed (with an ``elif``, the ``elif`` becomes
      the ``if``), and so is an ``if`` whose branch held only removed CUDA code. An ``if`` line with a
      comment, or a branch ending in one, keeps its ``if`` with the folded test (``if True:``), so no
      comment is lost.
    - ``assert torch.cuda.is_available()`` is removed.
    - ``a if torch.cuda.is_available() else b`` -> ``a``.
    - ``"nccl" if torch.cuda.is_available() else "gloo"`` (a process-group backend chosen by the test) ->
      ``"xla"``: neither backend is XLA's, the choice was the accelerator's.

    In a function that calls a ``torch.cuda`` API that raises without CUDA and that no rule rewrites
    (``get_rng_state``, ``get_device_properties``, ``current_device``, ``memory_summary``, ``Stream``...),
    no test is folded: folding would run that call on the XLA host. Each test there is reported instead.

    Device expressions that XLA101 or the AMP rules rewrite as a whole (``"cuda" if torch.cuda.is_available()
    else "cpu"``) are left to them.

Why:
    ``torch.cuda.is_available()`` is False on an XLA machine and an XLA device's type is ``"xla"``: left
    alone, these tests turn the migrated script's accelerator code off without a word. Review the result:
    a test can also guard something that must stay off on XLA.

Example:
    use_amp = torch.cuda.is_available()
    loader = DataLoader(ds, batch_size=64, pin_memory=torch.cuda.is_available())
    if torch.cuda.is_available():
        torch.backends.cudnn.benchmark = True

Use instead:
    use_amp = True
    loader = DataLoader(ds, batch_size=64, pin_memory=True)
    torch.backends.cudnn.benchmark = True
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.analysis.facts import is_cuda_device_expr
from xla_migrate.engine.rule import Rule

IS_AVAILABLE = ("torch.cuda.is_available",)
# torch.cuda calls that raise without a CUDA driver and that no rule rewrites (measured on torch 2.9 with no
# GPU): a gate folded to True would run them on the XLA host. And set_rng_state: the state it restores
# comes from get_rng_state, under the same kind of gate.
RAISE_WITHOUT_CUDA = tuple(f"torch.cuda.{name}" for name in (
    "get_rng_state", "get_rng_state_all", "get_device_properties", "get_device_capability", "current_device",
    "memory_summary", "mem_get_info", "Stream", "current_stream", "default_stream", "Event", "stream",
    "memory_stats", "list_gpu_processes", "utilization", "set_rng_state", "set_rng_state_all"))


def _constant(value: bool) -> cst.Name:
    return cst.Name("True" if value else "False")


def _bare(node: cst.BaseExpression, like: cst.BaseExpression) -> cst.BaseExpression:
    """``node`` standing where ``like`` stood: it takes ``like``'s parentheses unless it is atomic."""
    if isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or node.lpar:
        return node
    return node.with_changes(lpar=like.lpar, rpar=like.rpar)


BACKENDS = ("nccl", "gloo", "mpi")


def _backend_choice(node: cst.IfExp) -> bool:
    """``"gloo" if <cuda test> else "nccl"``: a process-group backend chosen by the CUDA test."""
    return patterns.string_value(node.body) in BACKENDS and patterns.string_value(node.orelse) in BACKENDS


def _quoted(like: cst.BaseExpression, value: str) -> str:
    quote = "'" if isinstance(like, cst.SimpleString) and like.value.startswith("'") else '"'
    return f"{quote}{value}{quote}"


class CudaGates(Rule):
    code = "XLA104"
    name = "cuda-gates"
    summary = ("torch.cuda.is_available() and device == 'cuda' tests -> their value on the accelerator "
               "(True), so the migrated script keeps its accelerator path")
    # Not on code already on XLA: there a CUDA test is a live switch (False on a TPU host) that selects the
    # script's own XLA path; folding it to True would run the CUDA branch on the TPU.
    fix_safety = "review"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._gates: list[tuple[cst.BaseExpression, bool]] = []
        self._done: set[cst.CSTNode] = set()
        # Function (or module) scopes that call a torch.cuda API raising without CUDA: their gates stay.
        self._held: dict[object, str] = {}

    # Finding the tests -------------------------------------------------------------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        raising = sorted(self.ctx.qualnames(node.func) & set(RAISE_WITHOUT_CUDA))
        if raising:
            self._held.setdefault(self.ctx.function_scope(node), raising[0])
        if self.ctx.is_call_to(node, *IS_AVAILABLE):
            self._gate(node, True)
        elif patterns.method_call(node, "startswith"):
            args = patterns.positional(node)
            if len(args) == 1 and patterns.string_value(args[0].value) == "cuda":
                self._gate(node, True)

    def visit_Comparison(self, node: cst.Comparison) -> None:
        if len(node.comparisons) != 1:
            return
        target = node.comparisons[0]
        operator = target.operator
        left_cuda = patterns.is_cuda_string(node.left)
        right_cuda = patterns.is_cuda_string(target.comparator)
        if isinstance(operator, (cst.Equal, cst.NotEqual)) and left_cuda != right_cuda:
            self._gate(node, isinstance(operator, cst.Equal))
        elif isinstance(operator, (cst.In, cst.NotIn)) and left_cuda and not right_cuda:
            self._gate(node, isinstance(operator, cst.In))

    def _gate(self, node: cst.BaseExpression, value: bool) -> None:
        current = self.ctx.parent(node)
        while current is not None and not isinstance(current, (cst.BaseSmallStatement, cst.BaseStatement)):
            if isinstance(current, cst.FormattedStringExpression) and current.equal is not None:
                return  # f"{torch.cuda.is_available()=}" prints its own text: left (XLA900 reports it)
            # Left to XLA101 / the AMP rules: whole CUDA device expressions and device-type choices.
            if is_cuda_device_expr(current, self.ctx.qualnames) and not isinstance(current, cst.Comparison):
                return
            if isinstance(current, cst.IfExp) and (patterns.is_cuda_string(current.body)
                                                   or patterns.is_cuda_string(current.orelse)):
                return
            current = self.ctx.parent(current)
        self._gates.append((node, value))

    # Folding, once every rule has recorded its edits ------------------------------------------------------
    def _value(self, node: cst.BaseExpression) -> bool | None:
        """The value a gate expression has on XLA (``gate``, ``not gate``), else None."""
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
            inner = self._value(node.expression)
            return None if inner is None else not inner
        return self._values.get(node)

    def leave_Module(self, original_node: cst.Module) -> None:
        self._values = dict(self._gates)
        for node, value in self._gates:
            held = self._held.get(self.ctx.function_scope(node))
            if held is not None:
                # Folding would run the CUDA-only call on the XLA host (it raises there); the test stays
                # False on XLA and the CUDA code behind it is reported (XLA900).
                self.finding(node, f"CUDA test left as it is: this function calls {held}(), which raises "
                             "without CUDA; on XLA the test is False", "port the CUDA-only code by hand "
                             "(xm.get_rng_state(), xm.xla_device_hw(device), ...), then drop the test")
                continue
            if not self._inside_done(node):
                self._fold(node, value, node)

    def _inside_done(self, node: cst.CSTNode) -> bool:
        """Inside an expression already folded, or in the test of an ``if`` already folded (the gates in
        its branches are folded too: its replacement keeps the edits made inside it)."""
        current: cst.CSTNode | None = node
        previous: cst.CSTNode | None = None
        while current is not None:
            if current in self._done and (not isinstance(current, cst.If) or previous is current.test):
                return True
            previous, current = current, self.ctx.parent(current)
        return False

    def _fold(self, node: cst.BaseExpression, value: bool, gate: cst.BaseExpression) -> None:
        text = " ".join(patterns.code_of(gate).split())
        parent = self.ctx.parent(node)
        if isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not):
            return self._fold(parent, not value, gate)
        if isinstance(parent, cst.BooleanOperation):
            is_and = isinstance(parent.operator, cst.And)
            other = parent.left if parent.right is node else parent.right
            other_value = self._value(other)
            if other_value is not None:
                # Both sides are gates: `torch.cuda.is_available() and device.type == "cuda"` -> True.
                self._done.add(other)
                combined = (value and other_value) if is_and else (value or other_value)
                return self._fold(parent, combined, parent)
            if value == is_and:
                # `x and True` -> x; `x or False` -> x.
                keep_left = parent.right is node
                self._done.add(parent)
                self.replace(parent, lambda u: _bare(u.left if keep_left else u.right, u),
                             f"{text} is {value} on XLA: dropped from the condition")
                return None
            return self._fold(parent, value, gate)
        if isinstance(parent, cst.IfExp) and parent.test is node and _backend_choice(parent):
            # `"gloo" if not cuda else "nccl"`: neither is XLA's; the choice was the accelerator's backend.
            self._done.add(parent)
            self.replace(parent, _bare(cst.SimpleString(_quoted(parent.body, "xla")), parent),
                         f"backend chosen by {text} -> \"xla\" (the XLA process group's backend)")
            return None
        if isinstance(parent, cst.IfExp) and parent.test is node:
            self._done.add(parent)
            self.replace(parent, lambda u: _bare(u.body if value else u.orelse, u),
                         f"{text} is {value} on XLA: kept the {'first' if value else 'second'} branch")
            return None
        if isinstance(parent, cst.If) and parent.test is node:
            return self._fold_if(parent, value, text)
        if isinstance(parent, cst.Assert) and parent.test is node and value:
            self._done.add(parent)
            self.remove(parent, f"removed assert {text}: holds on XLA")
            return None
        self._done.add(node)
        self.replace(node, _constant(value), f"{text} -> {value} (its value on the XLA accelerator)")
        return None

    def _fold_if(self, node: cst.If, value: bool, text: str) -> None:
        """``if <test>:`` whose test is known: keep the taken branch without the ``if`` where it is one
        statement in a block; otherwise fold the test to a constant."""
        in_block = isinstance(self.ctx.parent(node), (cst.IndentedBlock, cst.Module))
        orelse = node.orelse
        branch = node.body if value else (orelse.body if isinstance(orelse, cst.Else) else None)
        self._done.add(node)
        quiet = not isinstance(node.body, cst.IndentedBlock) or node.body.header.comment is None
        if in_block and quiet and not value and orelse is None:
            self.remove(node, f"removed if {text}: never taken on XLA")
            return
        if in_block and quiet and not value and isinstance(orelse, cst.If):
            # `if <never>: a elif c: b else: d` -> `if c: b else: d` (the elif chain moves up one level).
            self.replace(node, lambda u: u.orelse.with_changes(leading_lines=[*u.leading_lines, *u.orelse.leading_lines]),
                         f"removed if {text}: never taken on XLA; its elif becomes the if")
            return
        if in_block and quiet and branch is not None and self._removed_entirely(branch) and (
                value or orelse is None or isinstance(orelse, cst.Else)):
            self.remove(node, f"removed if {text}: its branch only held removed CUDA code")
            return
        if in_block and branch is not None and self._plain(branch) and (
                value or orelse is None or isinstance(orelse, cst.Else)):
            def fold(updated: cst.If) -> cst.BaseStatement | cst.FlattenSentinel:
                # Decided on the updated node: statements other rules removed from the branch are gone.
                suite = updated.body if value else updated.orelse.body
                if isinstance(suite, cst.SimpleStatementSuite):
                    statement = cst.SimpleStatementLine(body=suite.body, trailing_whitespace=suite.trailing_whitespace)
                elif len(suite.body) == 1:
                    statement = suite.body[0]
                else:  # several statements: they take the if's place (its blank lines and comments go first)
                    return cst.FlattenSentinel(suite.body)
                return statement.with_changes(leading_lines=[*updated.leading_lines, *statement.leading_lines])

            self.replace(node, fold, f"if {text}: {value} on XLA, kept the {'body' if value else 'else branch'}"
                         " without the if")
            return
        self.replace(node.test, _constant(value), f"if {text} -> if {value} (its value on the XLA accelerator)")

    def _plain(self, suite: cst.BaseSuite) -> bool:
        """No comment on the ``if`` line or after the branch, which unwrapping would lose."""
        return isinstance(suite, cst.SimpleStatementSuite) or (not suite.footer and suite.header.comment is None)

    def _removed_entirely(self, suite: cst.BaseSuite) -> bool:
        removed = self.ctx.edits.remove
        statements = suite.body if isinstance(suite, cst.IndentedBlock) else [suite]
        for statement in statements:
            if any(line.comment is not None for line in getattr(statement, "leading_lines", ())):
                return False  # removing the if would lose the comment
            if statement in removed:
                continue
            small = getattr(statement, "body", None)
            if isinstance(statement, (cst.SimpleStatementLine, cst.SimpleStatementSuite)) and all(
                    s in removed for s in small):
                continue
            return False
        return True
