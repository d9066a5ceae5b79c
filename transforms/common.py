"""Helpers shared by rules of several families (short code excerpts, keyword arguments, the imports that bind a name). Not a rule."""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.engine.context import MigrationContext

# Expressions that can stand before ``.attr`` / ``(...)`` / ``[...]`` without parentheses.
_ATOMS = (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.SimpleString, cst.Integer, cst.Float,
          cst.List, cst.Tuple, cst.Dict, cst.Set, cst.FormattedString, cst.ConcatenatedString)


def imported_from(ctx: MigrationContext, func: cst.BaseExpression, qualname: str) -> list[tuple[str, str | None]]:
    """The imports that may bind ``func`` (``GradScaler`` after ``from torch.cuda.amp import GradScaler`` ->
    ("torch.cuda.amp", "GradScaler"); ``amp.GradScaler`` after ``import torch.cuda.amp as amp`` or
    ``from torch.cuda import amp``), so a rule can mark them as possibly dead: an import is removed only when
    nothing uses it any more. Empty for ``torch.cuda.amp.X``, whose ``import torch`` stays."""
    if isinstance(func, cst.Name):
        module, _, name = qualname.rpartition(".")
        return [(module, name)] if module else []
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
        base = func.value.value
        for module in ctx.qualnames(func.value):
            if module != base and "." in module:
                parent, _, name = module.rpartition(".")
                return [(module, None), (parent, name)]
    return []


def parenthesized_for_attribute(node: cst.BaseExpression) -> cst.BaseExpression:
    """``node`` wrapped in parentheses when it is not an atom (``loss / n`` before ``.backward()``)."""
    if isinstance(node, _ATOMS) or node.lpar:
        return node
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def keyword_arg(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(value=value, keyword=cst.Name(name),
                   equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                         whitespace_after=cst.SimpleWhitespace("")))


def with_keyword(call: cst.Call, name: str, value: cst.BaseExpression, at: int | None = None) -> cst.Call:
    """``call`` with ``name=value`` inserted before its argument ``at`` (appended when None), laid out like the
    arguments before it: the argument before it gives its comma (with a line break, when it has one) to the new
    one and takes the separator the call already uses."""
    new = keyword_arg(name, value)
    args = list(call.args)
    at = len(args) if at is None else at
    if at == 0:  # first: it takes a plain separator of its own
        comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if args else cst.MaybeSentinel.DEFAULT
        return call.with_changes(args=[new.with_changes(comma=comma), *args])
    before = args[at - 1]
    if at >= 2 and isinstance(args[at - 2].comma, cst.Comma):
        separator = args[at - 2].comma
    elif isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace):
        separator = cst.Comma(whitespace_after=call.whitespace_before_args)
    else:
        separator = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    if isinstance(before.comma, cst.Comma):
        # A comma after it (a trailing one too): the new argument takes it (and the line break that follows).
        new = new.with_changes(comma=before.comma)
        before = before.with_changes(comma=separator)
    else:
        new = new.with_changes(whitespace_after_arg=before.whitespace_after_arg)
        before = before.with_changes(comma=separator, whitespace_after_arg=cst.SimpleWhitespace(""))
    return call.with_changes(args=[*args[:at - 1], before, new, *args[at:]])


LIGHTNING_PACKAGES = ("pytorch_lightning", "lightning", "lightning_fabric")


def lightning_accelerator(ctx: MigrationContext, node: cst.BaseExpression) -> bool:
    """``accelerator`` (a name or attribute so called) in a module that imports Lightning: Lightning's accelerator
    name (``"cuda"``, ``"gpu"``, ``"tpu"``, litgpt's LLM.distribute), not a torch device: XLA908 reports it,
    the device rules leave it (Lightning's XLA accelerator is named ``"tpu"``, not ``"xla"``)."""
    name = patterns.dotted_name(node)
    if name is None or name.rsplit(".", 1)[-1] != "accelerator":
        return False

    def imports_lightning() -> bool:
        for statement in patterns.find_all(ctx.module, lambda n: isinstance(n, (cst.Import, cst.ImportFrom))):
            names = ([patterns.dotted_name(a.name) for a in statement.names] if isinstance(statement, cst.Import)
                     else [patterns.dotted_name(statement.module) if statement.module is not None else None])
            if any(n is not None and n.split(".")[0] in LIGHTNING_PACKAGES for n in names):
                return True
        return False
    return bool(ctx.once("imports lightning", imports_lightning))


def joined(args: list[cst.Arg]) -> list[cst.Arg]:
    """Args on one line, ``a, b=c``, whatever commas they carried before."""
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    out = [a.with_changes(comma=comma) for a in args]
    return patterns.without_trailing_comma(out)


def short(node: cst.CSTNode, limit: int = 60) -> str:
    text = " ".join(patterns.code_of(node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def fresh_name(ctx: MigrationContext, node: cst.CSTNode, name: str) -> str:
    """``name``, prefixed with ``xla_`` until no scope visible at ``node`` binds it."""
    while any(name in scope for scope in ctx.visible_scopes(node)):
        name = "xla_" + name
    return name


# cuDNN/TF32 switches (``torch.backends.cudnn.benchmark = True``): no effect off CUDA, removed by the device rules.
BACKEND_FLAG_PREFIXES = ("torch.backends.cudnn.", "torch.backends.cuda.")


def is_backend_flag(ctx: MigrationContext, target: cst.BaseExpression) -> bool:
    """An assignment target that is one of torch's CUDA backend switches."""
    return isinstance(target, cst.Attribute) and any(
        n.startswith(BACKEND_FLAG_PREFIXES) for n in ctx.qualnames(target))


def after_leading_imports(body: list[cst.BaseStatement]) -> int:
    """The index of the first statement after the module's docstring and leading imports (where the engine
    adds the imports the output needs, so the call comes after them)."""
    index = 1 if body and patterns.is_docstring(body[0]) else 0
    while index < len(body) and patterns.is_ipython_placeholder(body[index]):
        index += 1
    last = None
    for position in range(index, len(body)):
        if patterns.is_import_line(body[position]):
            last = position
        elif last is not None or not patterns.is_docstring(body[position]):
            break
    return index if last is None else last + 1


def statement_after_imports(module: cst.Module) -> cst.BaseStatement | None:
    """The module's first statement after its docstring and leading imports, before which a rule inserts what
    must run once before the code (a setting, the compile cache); None when the module holds only imports."""
    body = list(module.body)
    index = after_leading_imports(body)
    return body[index] if index < len(body) else None
