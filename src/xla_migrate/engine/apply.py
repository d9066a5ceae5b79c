"""Applies every recorded edit in one transform of the tree.

Replacements are functions of the updated node, so an edit inside another edit's subtree survives. The two
cases that cannot compose (two replacements of one node; a fixed replacement over a subtree another edit
changed) are overlaps: the later edit is not applied, its change record is withdrawn, and it is reported as
a finding so a person applies it by hand. Nothing is dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from ..syntax import patterns
from .context import Edits, FixedReplacement, MigrationContext
from ..syntax.patterns import leading_blank_lines, merge_carried_lines
from .records import Change

_BLOCKS = (cst.Module, cst.IndentedBlock)


class EditApplier(cst.CSTTransformer):
    def __init__(self, ctx: MigrationContext, edits: Edits) -> None:
        super().__init__()
        self.ctx = ctx
        self.edits = edits
        # Statements removed: the recorded ones, plus lines all of whose statements are removed (found while
        # applying; kept here so the edit log itself is never changed and can be applied again).
        self.removed: set[cst.CSTNode] = set(edits.remove)
        self.overlaps: list[tuple[Change, Change | None]] = []
        # Functions (original nodes) whose body the edits left doing nothing (only ``pass`` or a docstring).
        self.emptied_functions: list[cst.FunctionDef] = []
        # ``if`` statements whose body (negated: ``if not test:`` + the else's body) or whose ``else`` body
        # the edits emptied (the ``else`` goes), rebuilt when the applier leaves them.
        self._negated_ifs: set[cst.CSTNode] = set()
        self._emptied_else: set[cst.CSTNode] = set()
        # ``if``/``else`` statements whose two branches the edits made equal -> the statements that replace them.
        self._folded: dict[cst.CSTNode, list[cst.BaseStatement]] = {}
        self.equal_branches: list[cst.If] = []  # those of them folded because their branches became equal
        # One flag per open node: did anything below it change?
        self._changed_below: list[bool] = [False]
        # Only subtrees that hold an edit are walked: on a large script with few edits that is most of it.
        self._on_edit_path: set[cst.CSTNode] = set()
        for edited in (*self.edits.replace, *self.edits.before, *self.edits.after, *self.edits.remove):
            node: cst.CSTNode | None = edited
            while node is not None and node not in self._on_edit_path:
                self._on_edit_path.add(node)
                node = ctx.parent(node)

    def on_visit(self, node: cst.CSTNode) -> bool:
        if node not in self._on_edit_path:
            return False  # nothing below it changes: on_leave gives it back as it is
        self._changed_below.append(False)
        return True

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        pass  # per-attribute hooks are unused: skip libcst's two lookups per child

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        pass

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode:  # type: ignore[override]
        if original not in self._on_edit_path:
            return updated
        changed = self._changed_below.pop()
        result = updated
        replacements = self.edits.replace.get(original)
        if replacements:
            (change, factory), *others = replacements
            for other, _ in others:
                self._overlap(other, change)
            if isinstance(factory, FixedReplacement) and changed:
                self._overlap(change, None)
            else:
                result = factory(updated)
                changed = True
                if isinstance(result, cst.FlattenSentinel) and isinstance(self.ctx.parent(original), _BLOCKS):
                    # One statement replaced by several (an if unwrapped): spliced in where its block is
                    # rebuilt, as an if folded to one of its branches is.
                    self._folded[original] = list(result.nodes)
                    result = updated
        if isinstance(original, (cst.SimpleStatementLine, cst.SimpleStatementSuite)) and any(
                o in self.removed for o in original.body):
            kept = [s for o, s in zip(original.body, result.body) if o not in self.removed]
            if not kept and isinstance(original, cst.SimpleStatementLine):
                self.removed.add(original)
            elif len(kept) != len(result.body):
                # A one-line suite (``if x: y()``) that loses every statement keeps a ``pass``; the last
                # statement kept loses the semicolon that separated it from a removed one.
                kept = [*kept[:-1], kept[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)] if kept else [cst.Pass()]
                if isinstance(original, cst.SimpleStatementSuite) and kept[0] is not None and not any(
                        o not in self.removed for o in original.body):
                    self._drop_emptied_if(original)
                    self._note_emptied_function(original)
                result = result.with_changes(body=kept)
                changed = True
        if isinstance(original, _BLOCKS):
            result, body_changed = self._rebuild_block(original, result)
            changed = changed or body_changed
        if original in self._negated_ifs or original in self._emptied_else:
            result = self._rebuild_if(original, result)
            changed = True
        elif changed and isinstance(original, (cst.If, cst.IfExp)) and original not in self._folded:
            result = self._fold_equal_branches(original, result)
        self._changed_below[-1] = self._changed_below[-1] or changed
        return result

    def _rebuild_block(self, original: cst.Module | cst.IndentedBlock, updated):
        body: list[cst.BaseStatement] = []
        carried: list[cst.EmptyLine] = []
        changed = False
        for old, new in zip(original.body, updated.body):
            inserted_before = [s for _, group in self.edits.before.get(old, ()) for s in group]
            if inserted_before:
                # Blank lines that separated the statement from what precedes it now separate the
                # inserted code; comments stay with the statement they describe.
                blanks = leading_blank_lines(new)
                inserted_before[0] = inserted_before[0].with_changes(
                    leading_lines=[*blanks, *inserted_before[0].leading_lines])
                if not isinstance(new, (cst.FunctionDef, cst.ClassDef)):
                    # A def or class keeps its own blank lines too (two at module level).
                    new = new.with_changes(leading_lines=new.leading_lines[len(blanks):])
                body.extend(inserted_before)
                changed = True
            if old in self._folded and old not in self.removed:
                first, *rest = self._folded[old]
                leading = [*new.leading_lines, *first.leading_lines]
                if carried:
                    leading = [*merge_carried_lines(carried, new), *leading]
                    carried = []
                statements = [first.with_changes(leading_lines=leading), *rest]
                body.extend(statements[:-1])
                new = statements[-1]
                changed = True
            if old in self.removed:
                if any(line.comment is not None for line in (*carried, *new.leading_lines)):
                    carried.extend(new.leading_lines)
                else:  # blank lines only: consecutive removed statements leave one gap, the largest
                    carried = max(carried, list(new.leading_lines), key=len)
                changed = True
            else:
                if carried:
                    new = new.with_changes(leading_lines=[*merge_carried_lines(carried, new), *new.leading_lines])
                    carried = []
                body.append(new)
            for _, inserted in self.edits.after.get(old, ()):
                body.extend(inserted)
                changed = True
        if not changed:
            return updated, False
        if isinstance(updated, cst.IndentedBlock) and not body:
            self._drop_emptied_if(original, keeps_else=_has_comments(carried))
            body = [cst.SimpleStatementLine([cst.Pass()], leading_lines=carried)]
            carried = []
        if isinstance(original, cst.IndentedBlock) and all(_does_nothing(s) for s in body) and not all(
                _does_nothing(s) for s in original.body):
            self._note_emptied_function(original)
        result = updated.with_changes(body=body)
        if isinstance(updated, cst.Module) and not any(line.comment is not None for line in carried):
            carried = []  # blank lines of statements removed at the end of the file would end it
        if carried:
            result = result.with_changes(footer=[*carried, *updated.footer])
        return result, True

    def _drop_emptied_if(self, block: cst.CSTNode, keeps_else: bool = False) -> None:
        """``if ddp: model = DDP(model)`` whose whole body was removed goes too, rather than stay as
        ``if ddp: pass``, when it has no ``else`` and its test has no side effects. With an ``else`` it
        becomes ``if not ddp:`` and the else's body; an ``else`` whose body was removed goes. ``keeps_else``:
        the emptied body keeps comments (the ``pass`` carries them), so an ``else`` stays as it is."""
        owner = self.ctx.parent(block)
        if keeps_else:
            if isinstance(owner, cst.If) and owner.body is block and owner.orelse is None and patterns.is_pure(
                    owner.test) and isinstance(self.ctx.parent(owner), (cst.IndentedBlock, cst.Module)):
                self.removed.add(owner)  # as before: the if without else goes
            return
        if isinstance(owner, cst.Else) and owner.body is block and not _has_comments(owner.leading_lines):
            statement = self.ctx.parent(owner)
            if isinstance(statement, (cst.If, cst.For, cst.While, cst.Try)) and statement.orelse is owner:
                self._emptied_else.add(statement)
            return
        if not (isinstance(owner, cst.If) and owner.body is block and patterns.is_pure(owner.test)):
            return
        if owner.orelse is None and isinstance(self.ctx.parent(owner), (cst.IndentedBlock, cst.Module)):
            self.removed.add(owner)
        elif isinstance(owner.orelse, cst.Else) and not _has_comments(owner.orelse.leading_lines):
            self._negated_ifs.add(owner)

    def _rebuild_if(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode:
        """The ``if`` whose body or ``else`` body was removed, rebuilt (see ``_drop_emptied_if``)."""
        if original in self._emptied_else:
            if original in self._negated_ifs:
                self.removed.add(original)  # both branches emptied: nothing is left to test
                return updated
            return updated.with_changes(orelse=None)
        if original in self._negated_ifs and isinstance(updated.orelse, cst.Else):
            return updated.with_changes(test=negated(updated.test), body=updated.orelse.body, orelse=None)
        return updated

    def _fold_equal_branches(self, original: cst.If | cst.IfExp, updated: cst.If | cst.IfExp) -> cst.CSTNode:
        """A conditional whose two branches the edits made equal (``if ddp: save(model.module...) else:
        save(model...)``, ``raw_model = model if ddp else model``) is its one branch, when its test has no
        side effects. Branches that were equal in the input are the script's own and stay."""
        if not patterns.is_pure(original.test) or type(updated) is not type(original):
            return updated
        if isinstance(original, cst.IfExp):
            if _code(updated.body) == _code(updated.orelse) and _code(original.body) != _code(original.orelse):
                return updated.body.with_changes(lpar=updated.lpar, rpar=updated.rpar) if updated.lpar else updated.body
            return updated
        if not (isinstance(original.orelse, cst.Else) and isinstance(updated.orelse, cst.Else)
                and not _has_comments(original.orelse.leading_lines)
                and isinstance(original.body, cst.IndentedBlock) and isinstance(original.orelse.body, cst.IndentedBlock)
                and isinstance(self.ctx.parent(original), (cst.IndentedBlock, cst.Module))):
            return updated
        if (_statements_code(updated.body) == _statements_code(updated.orelse.body)
                and _statements_code(original.body) != _statements_code(original.orelse.body)):
            self._folded[original] = list(updated.body.body)
            self.equal_branches.append(original)
        return updated

    def _note_emptied_function(self, block: cst.CSTNode) -> None:
        owner = self.ctx.parent(block)
        if isinstance(owner, cst.FunctionDef) and owner.body is block:
            self.emptied_functions.append(owner)

    def _overlap(self, change: Change, winner: Change | None) -> None:
        self.overlaps.append((change, winner))


def _code(node: cst.CSTNode) -> str:
    return patterns.code_of(node.with_changes(lpar=[], rpar=[]) if getattr(node, "lpar", None) else node)


def _statements_code(block: cst.IndentedBlock) -> str:
    return "".join(patterns.code_of(statement) for statement in block.body)


def _has_comments(lines) -> bool:
    return any(line.comment is not None for line in lines)


_FLIPPED = {cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal, cst.Is: cst.IsNot, cst.IsNot: cst.Is,
            cst.In: cst.NotIn, cst.NotIn: cst.In}


def negated(test: cst.BaseExpression) -> cst.BaseExpression:
    """``not test``, spelled as a person would: ``x != 0`` for ``x == 0``, ``x`` for ``not x``."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not) and not test.lpar:
        inner = test.expression
        return inner.with_changes(lpar=[], rpar=[]) if isinstance(inner, (cst.Name, cst.Attribute)) else inner
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and not test.lpar:
        target = test.comparisons[0]
        flipped = _FLIPPED.get(type(target.operator))
        if flipped is not None:
            operator = target.operator
            new_operator = flipped(whitespace_before=operator.whitespace_before,
                                   whitespace_after=operator.whitespace_after)
            return test.with_changes(comparisons=[target.with_changes(operator=new_operator)])
    if isinstance(test, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or test.lpar:
        return cst.UnaryOperation(cst.Not(), test)
    return cst.UnaryOperation(cst.Not(), test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]))


def _does_nothing(statement: cst.BaseStatement) -> bool:
    """``pass``, ``...`` or a docstring: what a function whose real statements were all removed keeps."""
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(s, cst.Pass) or (isinstance(s, cst.Expr) and isinstance(
            s.value, (cst.SimpleString, cst.ConcatenatedString, cst.Ellipsis))) for s in statement.body)


@dataclass
class Applied:
    module: cst.Module
    # (change not applied, the change that won over it or None for "a fixed replacement over an edit inside")
    overlaps: list[tuple[Change, Change | None]] = field(default_factory=list)
    # Functions whose whole body the edits removed (see leftovers.py).
    emptied_functions: list[cst.FunctionDef] = field(default_factory=list)
    # if/else statements (original nodes) folded to one branch because the edits made both branches equal.
    folded_ifs: list[cst.If] = field(default_factory=list)

    def report_overlaps(self, ctx: MigrationContext) -> None:
        """Each overlapping edit becomes a finding instead of a change: nothing is dropped silently."""
        for change, winner in self.overlaps:
            other = f" by {winner.code}" if winner is not None else " inside it"
            ctx.withdraw(change, f"not applied: overlaps another edit{other}: {change.message}",
                         "apply this change by hand")

    def report_folds(self, ctx: MigrationContext) -> None:
        """Each if/else folded to its one branch is a change of the rule whose edit made the branches equal."""
        for node in self.folded_ifs:
            where = ctx.code_range(node)
            if where is None:
                continue
            inside = [c for c in ctx.changes if where.start.line < c.line <= where.end.line]
            if inside:
                line, column = ctx.position(node)
                ctx.changes.append(Change(line, column, inside[0].code, "if/else whose branches the migration made "
                                          "the same: one copy kept (its test has no side effects)"))


def apply_edits(ctx: MigrationContext, edits: Edits | None = None) -> Applied:
    """The module with ``edits`` (by default every recorded edit) applied. The edit log is not changed, so
    the output gate can apply a subset of it again."""
    edits = ctx.edits if edits is None else edits
    if not edits:
        return Applied(ctx.module)
    applier = EditApplier(ctx, edits)
    module = ctx.module.visit(applier)
    folded = [node for node in applier.equal_branches if node not in applier.removed]
    return Applied(module, applier.overlaps, applier.emptied_functions, folded)
