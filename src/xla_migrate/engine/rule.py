"""The rule contract. One rule = one file under ``transforms/<family>/`` with one subclass of ``Rule``.

A rule is a libcst ``BatchableCSTVisitor``: all rules run together in one traversal. It never mutates the
tree; it records edits against the original nodes through the helpers below, each with a change message,
and records findings for what a human must do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Literal

import libcst as cst
from libcst import BatchableCSTVisitor

from ..syntax import patterns
from .context import FixedReplacement, MigrationContext, Statement

FixSafety = Literal["safe", "review"]
# The torch_xla targets: a rule runs for "torchtpu" (TorchTPU) only where its targets name it.
ALL_TARGETS: tuple[str, ...] = ("sagemaker", "2.9")


def torch_names_only(method):
    """Marks a rule's ``visit_Name``/``visit_Attribute`` that does nothing for a node without torch names
    (``ctx.torch_names(node)`` empty): the batched walk then calls it only for the names and attribute chains
    whose root can have some (``MigrationContext.torch_roots``), since most names in a script cannot."""
    method.torch_names_only = True
    return method


class Rule(BatchableCSTVisitor):
    code: ClassVar[str]
    name: ClassVar[str]
    summary: ClassVar[str]
    # "review": the rewrite can change behaviour in ways a person should look at (ruff's fix safety).
    fix_safety: ClassVar[FixSafety] = "safe"
    targets: ClassVar[tuple[str, ...]] = ALL_TARGETS
    # Runs on scripts that already run on torch_xla too (``facts.runs_on_xla``): rules that migrate CUDA
    # remnants (``.cuda()``, ``torch.cuda.*``) or only report. The others never migrate XLA code again.
    on_xla_code: ClassVar[bool] = False
    # Of those, the rules that only report: they also see the CUDA paths that code already on XLA keeps
    # (ctx.on_live_cuda_path), which the engine hides from the rules that edit.
    reports_only: ClassVar[bool] = False
    # Runs on scripts already on torch_xla with its edits reported instead of made: its findings (what the
    # program still needs) do not vanish when the tool runs on its own output (issue 33).
    reports_on_xla_code: ClassVar[bool] = False

    def __init__(self, ctx: MigrationContext) -> None:
        super().__init__()
        self.ctx = ctx

    # Edits -------------------------------------------------------------------------------------------------
    def replace(self, node: cst.CSTNode, new: cst.CSTNode | Callable[[cst.CSTNode], cst.CSTNode],
                message: str) -> None:
        """Replace ``node``. Pass a function of the updated node to keep edits other rules make inside it;
        a fixed node over a subtree another rule also edited is reported as an overlap, not applied.

        A written target is never replaced: rules rewrite reads (``os.environ["RANK"]`` -> the ordinal),
        and ``os.environ["LOCAL_RANK"] = ...`` must stay a write, not become ``xr.local_ordinal() = ...``."""
        if self.ctx.is_write_target(node) or self.ctx.on_live_cuda_path(node):
            return
        factory = new if callable(new) else FixedReplacement(new)
        change = self.ctx.record_change(self.code, node, message)
        self.ctx.edits.replace.setdefault(node, []).append((change, factory))

    def insert_before(self, statement: Statement, new: list[cst.BaseStatement], message: str) -> None:
        if self.ctx.on_live_cuda_path(statement):
            return
        change = self.ctx.record_change(self.code, statement, message)
        self.ctx.edits.before.setdefault(statement, []).append((change, new))

    def insert_after(self, statement: Statement, new: list[cst.BaseStatement], message: str) -> None:
        if self.ctx.on_live_cuda_path(statement):
            return
        change = self.ctx.record_change(self.code, statement, message)
        self.ctx.edits.after.setdefault(statement, []).append((change, new))

    def remove(self, node: Statement | cst.BaseSmallStatement, message: str) -> None:
        """Remove a statement; its leading comments and blank lines move to the next statement. The ``if``
        whose whole body it is goes with it when its test has no side effects (``if ddp: model = DDP(model)``
        leaves no ``if ddp: pass``); the change is then recorded on the ``if``."""
        if self.ctx.on_live_cuda_path(node):
            return
        small = node if isinstance(node, cst.BaseSmallStatement) else (
            node.body[0] if isinstance(node, cst.SimpleStatementLine) and len(node.body) == 1 else None)
        owner = self.ctx.sole_if_around(small) if small is not None else None
        if owner is not None and patterns.is_pure(owner.test):
            node, message = owner, f"{message} (with the `if` around it)"
        self.ctx.edits.remove.setdefault(node, self.ctx.record_change(self.code, node, message))

    def finding(self, node: cst.CSTNode, message: str, fix: str = "") -> None:
        self.ctx.record_finding(self.code, node, message, fix)

    def import_may_be_dead(self, module: str, name: str | None = None) -> None:
        """After this rule's edits, ``import module`` / ``from module import name`` may be unused."""
        self.ctx.maybe_dead_imports.add((module, name))

