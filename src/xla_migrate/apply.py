"""Applies every recorded edit in one transform of the tree.

Replacements are functions of the updated node, so an edit inside another edit's subtree survives. The two
cases that cannot compose (two replacements of one node; a fixed replacement over a subtree another edit
changed) are overlaps: the later edit is not applied, its change record is withdrawn, and it is reported as
a finding so a person applies it by hand. Nothing is dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from . import patterns
from .context import Edits, FixedReplacement, MigrationContext
from .patterns import leading_blank_lines, merge_carried_lines
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
        self._changed_below.append(False)
        return node in self._on_edit_path

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        pass  # per-attribute hooks are unused: skip libcst's two lookups per child

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        pass

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode:  # type: ignore[override]
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
                result = result.with_changes(body=kept)
                changed = True
        if isinstance(original, _BLOCKS):
            result, body_changed = self._rebuild_block(original, result)
            changed = changed or body_changed
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
            if old in self.removed:
                carried.extend(new.leading_lines)
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
            self._drop_emptied_if(original)
            body = [cst.SimpleStatementLine([cst.Pass()], leading_lines=carried)]
            carried = []
        result = updated.with_changes(body=body)
        if isinstance(updated, cst.Module) and not any(line.comment is not None for line in carried):
            carried = []  # blank lines of statements removed at the end of the file would end it
        if carried:
            result = result.with_changes(footer=[*carried, *updated.footer])
        return result, True

    def _drop_emptied_if(self, block: cst.CSTNode) -> None:
        """``if ddp: model = DDP(model)`` whose whole body was removed goes too, rather than stay as
        ``if ddp: pass``, when it has no ``else`` and its test has no side effects."""
        owner = self.ctx.parent(block)
        if (isinstance(owner, cst.If) and owner.body is block and owner.orelse is None
                and patterns.is_pure(owner.test) and isinstance(self.ctx.parent(owner), (cst.IndentedBlock, cst.Module))):
            self.removed.add(owner)

    def _overlap(self, change: Change, winner: Change | None) -> None:
        self.overlaps.append((change, winner))


@dataclass
class Applied:
    module: cst.Module
    # (change not applied, the change that won over it or None for "a fixed replacement over an edit inside")
    overlaps: list[tuple[Change, Change | None]] = field(default_factory=list)

    def report_overlaps(self, ctx: MigrationContext) -> None:
        """Each overlapping edit becomes a finding instead of a change: nothing is dropped silently."""
        for change, winner in self.overlaps:
            other = f" by {winner.code}" if winner is not None else " inside it"
            ctx.withdraw(change, f"not applied: overlaps another edit{other}: {change.message}",
                         "apply this change by hand")


def apply_edits(ctx: MigrationContext, edits: Edits | None = None) -> Applied:
    """The module with ``edits`` (by default every recorded edit) applied. The edit log is not changed, so
    the output gate can apply a subset of it again."""
    edits = ctx.edits if edits is None else edits
    if not edits:
        return Applied(ctx.module)
    applier = EditApplier(ctx, edits)
    return Applied(ctx.module.visit(applier), applier.overlaps)
