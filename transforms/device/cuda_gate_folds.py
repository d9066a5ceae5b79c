"""How XLA104 (cuda_gates.py) folds a test it has decided: a constant in place of the test, the taken branch of
an ``if`` or a conditional expression without the test, a condition's decided operand dropped, an assertion
that holds on XLA removed, a process-group backend chosen by the test made XLA's. Kept apart from the decision
loop so each module reads on its own; the rule mixes this class in."""

from __future__ import annotations

import libcst as cst

from xla_migrate.analysis import gates
from xla_migrate.syntax import patterns


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


def _bare_return(suite: cst.BaseSuite) -> bool:
    small = (suite.body[0] if isinstance(suite, cst.IndentedBlock) else suite).body[0]
    return isinstance(small, cst.Return) and small.value is None


class GateFolds:
    """The folding half of ``CudaGates`` (it needs the rule's ``ctx``, ``replace``, ``remove``, ``finding``,
    its ``_done`` set and its ``_value`` / ``_compared`` answers)."""

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
            self._fold_backend_tests(parent)
            return None
        if isinstance(parent, cst.IfExp) and parent.test is node:
            self._done.add(parent)
            self.replace(parent, lambda u: _bare(u.body if value else u.orelse, u),
                         f"{text} is {value} on XLA: kept the {'first' if value else 'second'} branch")
            return None
        if isinstance(parent, cst.If) and parent.test is node:
            return self._fold_if(parent, value, text)
        if isinstance(parent, cst.Assert) and parent.test is node and self._compared(node) is not None:
            # `assert model.to.call_args.args[0] == "cuda"`: a check of what the code did (a test's), not that
            # CUDA is there: kept, and said, as the migrated code no longer does that.
            self._done.add(parent)
            self.finding(parent, f"assert {text}: kept, but the migrated code uses the XLA device, so this check "
                         "of a CUDA device no longer holds",
                         "rewrite the expected device to XLA's (its type is \"xla\") or drop the check by hand")
            return None
        if isinstance(parent, cst.Assert) and parent.test is node and value:
            self._done.add(parent)
            self.remove(parent, f"removed assert {text}: holds on XLA")
            return None
        self._done.add(node)
        if value and self._fused_flag(node):
            self.replace(node, _constant(False), f"{text} -> False (a fused-kernel flag: CUDA's fused optimizer "
                         "kernels take no XLA tensors)")
            return None
        self.replace(node, _constant(value), f"{text} -> {value} (its value on the XLA accelerator)")
        return None

    def _fused_flag(self, node: cst.BaseExpression) -> bool:
        """``{"fused": device.type == "cuda"}`` or ``make_optimizer(..., fused=<test>)``: the test asks for CUDA's
        fused optimizer kernel (litgpt's pretrain hands the dict to AdamW through **kwargs), which raises on XLA
        parameters; torch.optim's own ``fused=`` is XLA205's to drop."""
        parent = self.ctx.parent(node)
        if isinstance(parent, cst.DictElement) and parent.value is node:
            return patterns.string_value(parent.key) == "fused"
        if isinstance(parent, cst.Arg) and parent.value is node and parent.keyword is not None \
                and parent.keyword.value == "fused":
            call = self.ctx.parent(parent)
            return isinstance(call, cst.Call) and not any(q.startswith("torch.optim.")
                                                          for q in self.ctx.qualnames(call.func))
        return False

    def _fold_backend_tests(self, choice: cst.IfExp) -> None:
        """``backend = "xla"`` (the choice just folded) bound once in a function, then ``if backend == "gloo":``:
        that test is known too; its branch that can never run goes."""
        assign = self.ctx.parent(choice)
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1
                and isinstance(assign.targets[0].target, cst.Name)):
            return
        name = assign.targets[0].target
        scope = self.ctx.scopes.get(name)
        if scope is None or type(scope).__name__ != "FunctionScope" or len(scope.assignments[name.value]) != 1:
            return
        for access in next(iter(scope.assignments[name.value])).references:
            test = self.ctx.parent(access.node)
            if not (isinstance(test, cst.Comparison) and test.left is access.node and len(test.comparisons) == 1
                    and isinstance(test.comparisons[0].operator, (cst.Equal, cst.NotEqual))):
                continue
            literal = patterns.string_value(test.comparisons[0].comparator)
            owner = self.ctx.parent(test)
            if literal is None or not isinstance(owner, cst.If) or owner.test is not test or owner in self._done:
                continue
            equal = isinstance(test.comparisons[0].operator, cst.Equal)
            self._fold_if(owner, (literal == "xla") == equal, " ".join(patterns.code_of(test).split()))

    def _fold_if(self, node: cst.If, value: bool, text: str) -> None:
        """``if <test>:`` whose test is known: keep the taken branch without the ``if`` where it is one
        statement in a block; otherwise fold the test to a constant."""
        in_block = isinstance(self.ctx.parent(node), (cst.IndentedBlock, cst.Module))
        orelse = node.orelse
        branch = node.body if value else (orelse.body if isinstance(orelse, cst.Else) else None)
        self._done.add(node)
        quiet = not isinstance(node.body, cst.IndentedBlock) or node.body.header.comment is None
        if value and isinstance(self.ctx.parent(node), cst.If) and self.ctx.parent(node).orelse is node:
            # `elif <always>:` -> `else:`
            self.replace(node, lambda u: cst.Else(body=u.body, leading_lines=u.leading_lines,
                                                  whitespace_before_colon=u.whitespace_after_test),
                         f"elif {text}: {value} on XLA, it becomes the else")
            return
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
        after = gates.fall_through(node, self.ctx.parent) if value else []
        if in_block and quiet and after and _bare_return(node.body):
            # `if <always>: return` ending the function: it and the unreachable code after it go.
            for statement in [node, *after]:
                self.remove(statement, f"removed if {text}: {value} on XLA, the early return is always taken "
                            "and the code after it unreachable")
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
            for statement in after:  # an early return always taken: what followed it is unreachable
                self.remove(statement, f"removed: unreachable after the early return of if {text}")
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
