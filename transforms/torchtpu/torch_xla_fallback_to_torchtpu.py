"""XLA705 torch-xla-fallback-to-torchtpu: a script's "torch_xla if installed" switch goes (torchtpu).

What it does:
    Only for ``--target torchtpu``. A module-level ``try:`` that imports torch_xla and sets a flag
    (``HAS_XLA = True``), with ``except ImportError: HAS_XLA = False``, is removed, and the flag's reads
    take the torch_xla side, which XLA703/XLA704 upgrade: ``if HAS_XLA: a`` / ``else: b`` keeps ``a`` (the
    statements after it in the block go when ``a`` ends in ``return`` or ``raise``), ``if not HAS_XLA: b``
    keeps the ``else`` or nothing, ``x if HAS_XLA else y`` becomes ``x``, and any other read is ``True``.
    A flag assigned anywhere else, or a ``try`` that does more than import and set it, is left as it is.

Why:
    The torch_xla branch, upgraded, is TorchTPU's device-agnostic code: the accelerator, else the CPU. It
    already does what the CUDA/CPU fallback did where there is no TPU, so keeping the fallback beside it
    would keep a second path that only runs where torch_xla happens to be missing. Nothing here was run on
    a TPU.

Example:
    try:
        import torch_xla.core.xla_model as xm
        HAS_XLA = True
    except ImportError:
        HAS_XLA = False
    device = xm.xla_device() if HAS_XLA else torch.device("cpu")

Use instead:
    device = torch.accelerator.current_accelerator(check_available=True) or torch.device("cpu")
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.torchtpu import torch_xla_names as names

_MISSING = ("ImportError", "ModuleNotFoundError", "Exception")
_BLOCKS = (cst.IndentedBlock, cst.Module)


class TorchXlaFallbackToTorchTpu(Rule):
    code = "XLA705"
    name = "torch-xla-fallback-to-torchtpu"
    summary = "try: import torch_xla / HAS_XLA = True / except ImportError: the switch goes, the XLA side stays"
    targets = ("torchtpu",)
    on_xla_code = True
    fix_safety = "review"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._flags: dict[str, cst.Try] = {}
        if "xla" not in ctx.input_code:
            return
        for statement in ctx.module.body:
            flag = _flag_of(statement) if isinstance(statement, cst.Try) else None
            if flag is not None and flag not in self._flags and self._assigned_once(flag, statement):
                self._flags[flag] = statement
        for flag, statement in self._flags.items():
            self.remove(statement, f"removed the torch_xla import switch ({flag}): the upgraded torch_xla side "
                                   "runs on TorchTPU and, without a TPU, on the CPU")

    def _assigned_once(self, flag: str, statement: cst.Try) -> bool:
        """``flag`` is bound nowhere but in ``statement`` (a function's own ``HAS_XLA = ...`` or a ``global``
        rebinding it would keep a meaning of its own)."""
        for node in patterns.find_all(self.ctx.module, lambda n: isinstance(n, (cst.Name, cst.Global))):
            if isinstance(node, cst.Global) and any(n.name.value == flag for n in node.names):
                return False
            if isinstance(node, cst.Name) and node.value == flag and self.ctx.is_write_target(node) and not any(
                    patterns.find_all(statement, lambda n, node=node: n is node)):
                return False
        return True

    def visit_Name(self, node: cst.Name) -> None:
        flag = node.value
        if flag not in self._flags or self.ctx.is_write_target(node) or any(
                patterns.find_all(self._flags[flag], lambda n: n is node)):
            return
        parent = self.ctx.parent(node)
        negated = isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not)
        test = parent if negated else node
        owner = self.ctx.parent(test)
        if isinstance(owner, cst.If) and owner.test is test and isinstance(self.ctx.parent(owner), _BLOCKS) and \
                not isinstance(owner.orelse, cst.If):
            return self._branch(owner, flag, keep_body=not negated)
        if isinstance(owner, cst.IfExp) and owner.test is test:
            kept = "body" if not negated else "orelse"
            return self.replace(owner, lambda updated: getattr(updated, kept).with_changes(lpar=[], rpar=[]),
                                f"{flag}: the torch_xla side of the choice, upgraded")
        self.replace(node, cst.Name("True"), f"{flag} -> True: the torch_xla side, upgraded")

    def _branch(self, owner: cst.If, flag: str, keep_body: bool) -> None:
        kept = owner.body if keep_body else (owner.orelse.body if owner.orelse is not None else None)
        message = f"if {'' if keep_body else 'not '}{flag}: the torch_xla side kept, upgraded"
        if kept is None:
            return self.remove(owner, message)
        if not isinstance(kept, cst.IndentedBlock):
            return self.replace(patterns.find_all(owner.test, lambda n: isinstance(n, cst.Name) and n.value == flag)[0],
                                cst.Name("True"), f"{flag} -> True: the torch_xla side, upgraded")
        attribute = "body" if keep_body else "orelse"

        def unwrapped(updated: cst.If) -> cst.FlattenSentinel:
            block = updated.body if keep_body else updated.orelse.body
            statements = list(block.body)
            statements[0] = statements[0].with_changes(leading_lines=[*updated.leading_lines,
                                                                      *statements[0].leading_lines])
            return cst.FlattenSentinel(statements)

        self.replace(owner, unwrapped, message)
        del attribute
        last = kept.body[-1]
        if isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[-1], (cst.Return, cst.Raise)):
            block = self.ctx.parent(owner)
            siblings = list(block.body)
            for after in siblings[siblings.index(owner) + 1:]:
                self.remove(after, f"removed: after the torch_xla side's `{patterns.code_of(last.body[-1]).strip()}`"
                                   " it is not reached")


def _flag_of(statement: cst.Try) -> str | None:
    """``try: import torch_xla...; FLAG = True`` / ``except ImportError: FLAG = False``: FLAG, else None."""
    if statement.orelse is not None or statement.finalbody is not None or not statement.handlers:
        return None
    imports, flag = False, None
    for line in statement.body.body:
        if not isinstance(line, cst.SimpleStatementLine):
            return None
        for small in line.body:
            if isinstance(small, cst.Import) and all(names.is_torch_xla(patterns.dotted_name(a.name) or "")
                                                     for a in small.names):
                imports = True
            elif isinstance(small, cst.ImportFrom) and small.module is not None and names.is_torch_xla(
                    patterns.dotted_name(small.module) or ""):
                imports = True
            elif _assigns(small, "True") and flag is None:
                flag = small.targets[0].target.value
            else:
                return None
    if not imports or flag is None:
        return None
    for handler in statement.handlers:
        caught = patterns.code_of(handler.type) if handler.type is not None else "Exception"
        if not all(part.strip(" ()") in _MISSING for part in caught.split(",")) or handler.name is not None:
            return None
        for line in handler.body.body:
            if not isinstance(line, cst.SimpleStatementLine):
                return None
            for small in line.body:
                if not (isinstance(small, cst.Pass) or _assigns(small, "None") or (
                        _assigns(small, "False") and small.targets[0].target.value == flag)):
                    return None
    return flag


def _assigns(small: cst.BaseSmallStatement, value: str) -> bool:
    return isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(
        small.targets[0].target, cst.Name) and isinstance(small.value, cst.Name) and small.value.value == value
