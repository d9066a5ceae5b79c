"""The output gate: no output is written that does not compile, or that reads a name the input bound and
the output no longer binds (a removed definition, a dropped import, a local read before it is assigned).

Names are checked with pyflakes (undefined names, locals read before assignment, star-import guesses),
and the output's findings are compared with the input's own, so code that was already incomplete (a
notebook cell using an earlier cell's names, ``get_ipython()``) is not blamed on the rewrite. The input is
analysed only when the output has such a name at all; measured cost in ``benchmarks/gate.py``.

When the gate fails, the engine finds the edits responsible by bisection over the change records,
withdraws them and reports each as a finding (``engine.run_pipeline``).
"""

from __future__ import annotations

import ast
import warnings
from collections import Counter

from pyflakes import checker, messages

CODE = "XLA000"  # the code of the findings that report a withdrawn rewrite

_UNBOUND = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport, messages.ImportStarUsage)
_Key = tuple[str, str]  # (kind of problem, name)
_WORDS = {"undefined": "an undefined name '{}'", "unassigned": "'{}' read before it is assigned"}


class OutputGate:
    """Judges outputs of one input. ``problem(output)`` is None for an output that may be written, else
    what is wrong with it, in words that fit after "it would have produced"."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._input: tuple[bool, Counter[_Key] | None] | None = None  # (compiles, unbound names)

    def problem(self, output: str) -> str | None:
        tree, error = _compiled(output)
        if error is not None:
            return None if not self._input_analysis()[0] else f"code that does not compile ({error})"
        unbound = _unbound_names(tree)
        if not unbound:
            return None
        before = self._input_analysis()[1]
        if before is None:
            return None  # the input cannot be analysed, so there is nothing to compare with
        for (key, line), count in _by_key(unbound).items():
            if count > before[key]:
                kind, name = key
                return f"{_WORDS[kind].format(name)} (output line {line})"
        return None

    def _input_analysis(self) -> tuple[bool, Counter[_Key] | None]:
        if self._input is None:
            tree, error = _compiled(self.source)
            if tree is None:
                self._input = (False, None)
            else:
                self._input = (error is None, Counter(key for key, _ in _unbound_names(tree)))
        return self._input


def _compiled(code: str) -> tuple[ast.Module | None, str | None]:
    """The parsed tree (None when it does not parse) and the compile error (None when it compiles)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SyntaxWarnings (invalid escapes...) are the input's own
        try:
            tree = ast.parse(code)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
            return None, _describe(error)
        try:
            compile(tree, "<output>", "exec", dont_inherit=True)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
            return tree, _describe(error)
    return tree, None


def _describe(error: BaseException) -> str:
    if isinstance(error, SyntaxError):
        return f"{error.msg}, output line {error.lineno}"
    return type(error).__name__


def _unbound_names(tree: ast.Module) -> list[tuple[_Key, int]]:
    found = []
    for message in checker.Checker(tree, filename="<output>").messages:
        if isinstance(message, _UNBOUND):
            kind = "unassigned" if isinstance(message, messages.UndefinedLocal) else "undefined"
            found.append(((kind, message.message_args[0]), message.lineno))
    return found


def _by_key(found: list[tuple[_Key, int]]) -> dict[tuple[_Key, int], int]:
    """Count per name, keyed with the first output line that shows it (for the message)."""
    counts: Counter[_Key] = Counter(key for key, _ in found)
    first: dict[_Key, int] = {}
    for key, line in found:
        first.setdefault(key, line)
    return {(key, first[key]): count for key, count in counts.items()}
