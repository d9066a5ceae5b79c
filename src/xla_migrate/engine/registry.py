"""Finds the rules: every ``Rule`` subclass defined in a module of the ``xla_migrate.transforms`` package
or one of its family folders (``transforms/device/``, ``amp/``, ``loop/``, ...).

Registration is automatic (drop a file in a family folder); a test asserts codes and names are unique.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache

from .rule import Rule


@lru_cache(maxsize=1)
def all_rules() -> tuple[type[Rule], ...]:
    from .. import transforms

    rules: list[type[Rule]] = []
    for info in pkgutil.walk_packages(transforms.__path__, prefix=f"{transforms.__name__}."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Rule) and value is not Rule and value.__module__ == module.__name__:
                rules.append(value)
    return tuple(sorted(rules, key=lambda r: r.code))


def _matches(code: str, selectors: list[str]) -> bool:
    """``ALL`` (ruff's spelling) matches every code; another selector is a code or a prefix of one."""
    return any(s.strip().upper() == "ALL" or code.startswith(s.strip().upper()) for s in selectors if s.strip())


def ignored_engine_codes(ignore: list[str] | None) -> frozenset[str]:
    """The engine's own codes (codes.py) an ignore list names: they are dropped from the findings. A bare
    prefix (``XLA``, ``XLA0``) or ``ALL`` names them as it names rules."""
    from .codes import ENGINE_CODES

    return frozenset(entry.code for entry in ENGINE_CODES if ignore and _matches(entry.code, ignore))


def all_codes() -> list[str]:
    """Every code the tool can print: the engine's (XLA000...) and the rules', sorted."""
    from .codes import ENGINE_CODES

    return sorted([entry.code for entry in ENGINE_CODES] + [rule.code for rule in all_rules()])


def select_rules(target: str, select: list[str] | None = None, ignore: list[str] | None = None) -> list[type[Rule]]:
    """Rules for ``target``, narrowed by code or code prefix (``XLA1``, ``XLA101``) as ruff does."""
    chosen = []
    for rule in all_rules():
        if target not in rule.targets:
            continue
        if select and not _matches(rule.code, select):
            continue
        if ignore and _matches(rule.code, ignore):
            continue
        chosen.append(rule)
    return chosen


def as_selectors(value: str | list[str] | tuple[str, ...] | None, argument: str) -> list[str] | None:
    """``select=``/``ignore=`` as the library takes them: a code or prefix, a comma-separated string or a list
    of them. Raises ValueError for another type or a code no rule has (a typo would silently select nothing)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple, set, frozenset)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{argument} must be a rule code or prefix, or a list of them (got {value!r})")
    codes = [code.strip() for v in value for code in v.split(",") if code.strip()]
    unknown = unknown_selectors(codes)
    if unknown:
        raise ValueError(f"{argument}: unknown rule code or prefix: {', '.join(unknown)}")
    return codes


def unknown_selectors(selectors: list[str]) -> list[str]:
    codes = all_codes()
    return [s for s in selectors if s.strip() and s.strip().upper() != "ALL"
            and not any(c.startswith(s.strip().upper()) for c in codes)]
