"""The output gate: no output is written that does not compile, or that reads a name the input bound and
the output no longer binds (a removed definition, a dropped import, a local read before it is assigned).

Names are checked with pyflakes (undefined names, locals read before assignment, star-import guesses),
and the output's findings are compared with the input's own, so code that was already incomplete (a
notebook cell using an earlier cell's names, ``get_ipython()``) is not blamed on the rewrite. The input is
analysed only when the output has such a name at all; measured cost in ``benchmarks/gate.py``.

When the gate fails, the engine finds the edits responsible by bisection over the change records,
withdraws them and reports each as a finding (``engine.run_pipeline``).

A large file (``syntax/large_files.py``) is checked a piece at a time, cut before top-level statements, both its
output and its input: the ast of a 5 MB output alone is 0.73 GB. Each piece must compile (one with a
``__future__`` import is compiled after a statement, so one that is no longer at the top fails as it would
in the whole file), and pyflakes runs on each; a name it finds unbound in one piece does not count when a
piece binds it at module level. What that cannot see, on both sides alike: a module-level statement that
reads a name another piece binds only later. Where the process can fork and has a second core, a child
process checks the second half of the pieces meanwhile (it sends back only names and lines).
"""

from __future__ import annotations

import ast
import gc
import os
import pickle
import re
import threading
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from pyflakes import checker, messages

CODE = "XLA000"  # the code of the findings that report a withdrawn rewrite

_UNBOUND = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport, messages.ImportStarUsage)
_Key = tuple[str, str]  # (kind of problem, name)
_WORDS = {"undefined": "an undefined name '{}'", "unassigned": "'{}' read before it is assigned"}


class OutputGate:
    """Judges outputs of one input. ``problem(output)`` is None for an output that may be written, else
    what is wrong with it, in words that fit after "it would have produced"."""

    def __init__(self, source: str, source_pieces: Callable[[], list[int]] | None = None) -> None:
        """``source_pieces``: for a large file, gives the offsets where the source's pieces start (the
        outputs then come with theirs)."""
        self.source = source
        self._source_pieces = source_pieces
        self._input: tuple[bool, Counter[_Key] | None] | None = None  # (compiles, unbound names)

    def problem(self, output: str, pieces: list[int] | None = None) -> str | None:
        """``pieces``: where the output's pieces start (given for a large file, and only then)."""
        compiles, unbound = _analysis(output, pieces, names_when_broken=False)
        if compiles is not True:
            return None if not self._input_analysis()[0] else f"code that does not compile ({compiles})"
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
            pieces = self._source_pieces() if self._source_pieces is not None else None
            compiles, unbound = _analysis(self.source, pieces, names_when_broken=True)
            self._input = (compiles is True, None if unbound is None else Counter(key for key, _ in unbound))
        return self._input


def _analysis(code: str, pieces: list[int] | None,
              names_when_broken: bool) -> tuple[bool | str, list[tuple[_Key, int]] | None]:
    """(True, or the compile error; the unbound names with their lines, None when the code does not parse
    or, unless ``names_when_broken``, does not compile): of the whole code, or of each piece when
    ``pieces`` says where they start."""
    if pieces is None:
        tree, error = _compiled(code)
        if tree is None or (error is not None and not names_when_broken):
            return error or True, None
        return error or True, _unbound_names(tree)
    # pyflakes links each ast node to its parent (a cycle per node): a piece's tree is freed only by a
    # collection, and the migration pauses the collector. Frozen, the migration's own objects are left out
    # of the collection after each piece, which then scans only that piece's.
    gc.freeze()
    try:
        return _analysis_in_pieces(code, pieces, names_when_broken)
    finally:
        gc.unfreeze()


def _analysis_in_pieces(code: str, pieces: list[int],
                        names_when_broken: bool) -> tuple[bool | str, list[tuple[_Key, int]] | None]:
    spans = list(zip(pieces, [*pieces[1:], len(code)]))
    halves = [spans[:len(spans) // 2], spans[len(spans) // 2:]]
    # The second half in a child process, on another core, while this one checks the first: the checks
    # are independent, and what comes back (names and lines) is small.
    second = _in_child(lambda: _checked(code, halves[1], names_when_broken)) if _may_fork(spans) else None
    first = _checked(code, halves[0], names_when_broken)
    if first.error is not None and not names_when_broken:
        if second is not None:
            second()
        return first.error, None
    rest = (second() if second is not None else None) or _checked(code, halves[1], names_when_broken)
    first_error = first.error or rest.error
    if first_error is not None and not names_when_broken:
        return first_error, None
    bound = first.bound | rest.bound
    unbound = [(key, line) for key, line in first.found + rest.found if key[0] == "unassigned" or key[1] not in bound]
    return first_error or True, unbound if first.parsed and rest.parsed else None


@dataclass
class _Checked:
    """What the pieces of one run of ``_checked`` gave."""

    error: str | None = None  # the first compile error, its line counted in the whole code
    found: list[tuple[_Key, int]] = field(default_factory=list)  # unbound names, lines in the whole code
    bound: set[str] = field(default_factory=set)  # names the pieces bind at module level
    parsed: bool = True  # every piece parsed


def _checked(code: str, spans: list[tuple[int, int]], names_when_broken: bool) -> _Checked:
    """Each piece ``code[start:end]`` compiled and checked; ends at the first compile error unless
    ``names_when_broken``."""
    checked_pieces = _Checked()
    lines_before = code.count("\n", 0, spans[0][0]) if spans else 0  # lines of the code before the piece
    for start, end in spans:
        piece = code[start:end]
        # After a statement, a __future__ import that is no longer the first fails as in the whole file.
        prefix = "0\n" if start and "__future__" in piece else ""
        tree, error = _compiled(prefix + piece)
        shift = lines_before - prefix.count("\n")  # the piece's lines counted in the code
        lines_before += piece.count("\n")
        if error is not None and checked_pieces.error is None:
            checked_pieces.error = _shifted(error, shift)
        if checked_pieces.error is not None and not names_when_broken:
            return checked_pieces
        if tree is None:
            checked_pieces.parsed = False
            continue
        checked = checker.Checker(tree, filename="<output>")
        checked_pieces.found += [(key, line + shift) for key, line in _unbound_messages(checked)]
        module_scope = checked.deadScopes[-1]
        checked_pieces.bound.update(
            name for name, binding in module_scope.items() if not isinstance(binding, checker.Builtin))
        del tree, checked, module_scope
        gc.collect()
    return checked_pieces


def _may_fork(spans: list) -> bool:
    """Half the pieces may go to a child process: there are two halves and two cores, and this process
    can fork safely (no other thread that could hold a lock the child would wait on)."""
    return (len(spans) > 1 and hasattr(os, "fork") and (os.cpu_count() or 1) > 1
            and threading.active_count() == 1)


def _in_child(function: Callable[[], _Checked]) -> Callable[[], _Checked | None] | None:
    """``function`` run in a forked child; gives a call that waits for its result (None when the child
    failed: the caller then runs it itself), or None when no child could be started."""
    read, write = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read)
        os.close(write)
        return None
    if pid == 0:  # the child: the result down the pipe, then out without the parent's exit handlers
        try:
            os.close(read)
            with os.fdopen(write, "wb") as pipe:
                pipe.write(pickle.dumps(function()))
        finally:
            os._exit(0)
    os.close(write)

    def result() -> _Checked | None:
        with os.fdopen(read, "rb") as pipe:
            data = pipe.read()
        os.waitpid(pid, 0)
        try:
            return pickle.loads(data)
        except Exception:  # noqa: BLE001 - nothing, or not all of it, came back
            return None

    return result


def _shifted(error: str, lines: int) -> str:
    """A piece's compile error, its line counted in the whole code."""
    return re.sub(r"output line (\d+)$", lambda match: f"output line {int(match.group(1)) + lines}", error)


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
    return _unbound_messages(checker.Checker(tree, filename="<output>"))


def _unbound_messages(checked: checker.Checker) -> list[tuple[_Key, int]]:
    found = []
    for message in checked.messages:
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
