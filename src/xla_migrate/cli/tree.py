"""Migrating one file of a tree run (in a worker process, or in this one): read it (bounded), migrate it
(``migrate`` decides whether there is anything to migrate; a script, or a notebook's code cells), write its
output atomically, never outside the folder named nor through a mirror's links, and say what happened
(``Outcome``); and Ctrl-C's handling, so that every file is either completely written or untouched.

Workers read, migrate and write their own files (nothing big travels between processes except the diff
when one is asked for); the CLI prints what they report in sorted path order.
"""

from __future__ import annotations

import errno
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from .discovery import inside_folders

# Migrating one file (in a worker) ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Options:
    target: str
    select: list[str] | None
    ignore: list[str] | None
    distributed: bool | None  # None: detected per script
    data_parallel: str | None  # "auto" / "ddp" / "xm"; None: the target's default
    write: bool  # write outputs (a mirror or in place); False for --diff/--check
    copy_others: bool  # a mirror copies what it does not change (not with --only-changed)
    want_diff: bool
    # The project index (project.ProjectIndex, plain data): every file is migrated as part of that program.
    project: object = None
    mirror_root: str | None = None  # --out DIR: writes stay inside it and never go through a link
    per_file_ignores: dict | None = None  # [tool.xla-migrate] per-file-ignores, relative to config_dir
    config_dir: object = None
    fix_safety: str = "all"  # "safe": --safe-only

    def ignore_for(self, path: str) -> list[str] | None:
        """``ignore`` with the codes ``per-file-ignores`` adds for ``path``."""
        from .selection import ignores_for

        extra = ignores_for(path, self.per_file_ignores or {}, self.config_dir)
        return [*(self.ignore or []), *extra] or None


@dataclass(frozen=True)
class Task:
    path: str
    kind: str  # python, notebook, other
    out_path: str | None  # the mirror's file; None in place or for a dry run
    in_place: bool = False
    within: str | None = None  # the folder it was found in: an in-place write must resolve inside it


@dataclass
class Outcome:
    path: str
    kind: str
    out_path: str | None = None
    parsed: bool = False
    changed: bool = False
    written: bool = False
    error: str | None = None  # "path:line:col: message"
    input_error: object = None  # the InputError behind ``error``, where there is one (for the JSON report)
    changes: list = field(default_factory=list)  # (label, Change)
    findings: list = field(default_factory=list)  # (label, Finding)
    diff: bytes = b""
    releases: tuple | None = None
    target: str = ""
    data_parallel: str = ""  # the form a distributed script was migrated to ("" for a single-device one)
    data_parallel_reason: str = ""  # why --data-parallel auto chose it


# Ctrl-C ------------------------------------------------------------------------------------------------------
class Interrupted(Exception):
    """Ctrl-C during ``run_all``: ``outcomes`` finished (their writes are complete), ``not_reached`` were not
    started or were stopped before anything of theirs was written."""

    def __init__(self, outcomes: list[Outcome], not_reached: list[Task]):
        super().__init__(f"interrupted: {len(not_reached)} files not reached")
        self.outcomes, self.not_reached = outcomes, not_reached


class _InterruptState:
    requested = False  # Ctrl-C seen: start no other file
    migrating = False  # in pure computation (reading, migrating): safe to abandon at once


_INTERRUPT = _InterruptState()


def _on_sigint(signum, frame) -> None:
    """SIGINT during a run: a file being migrated is abandoned at once, a write in progress finishes, and no
    file starts after it, so every file is either completely written or untouched."""
    _INTERRUPT.requested = True
    if _INTERRUPT.migrating:
        _INTERRUPT.migrating = False
        raise KeyboardInterrupt


class _Migrating:
    """Marks the part of a file's work that Ctrl-C may abandon. Code inside can turn the KeyboardInterrupt
    into another error, or swallow it (libcst does, here and there): whatever it became, a file whose
    migration saw Ctrl-C is one that was not reached."""

    def __enter__(self):
        _INTERRUPT.migrating = True

    def __exit__(self, *exc):
        _INTERRUPT.migrating = False
        if _INTERRUPT.requested:
            raise KeyboardInterrupt
        return False


class _SigintHandled:
    """Installs ``_on_sigint`` for the run (and for forked workers); off the main thread, Ctrl-C stays
    Python's KeyboardInterrupt."""

    def __enter__(self):
        _INTERRUPT.requested = _INTERRUPT.migrating = False
        try:
            self.previous = signal.signal(signal.SIGINT, _on_sigint)
        except ValueError:
            self.previous = None
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
        return False


def init_worker() -> None:
    """In a worker process: Ctrl-C (from the terminal, or passed on by the parent) stops it as it stops a
    serial run. The KeyboardInterrupt the handler raises can land in a weakref callback or a ``__del__``,
    where Python prints it as "Exception ignored" with a traceback: that one is dropped silently (the
    request stays recorded, and ``_Migrating`` raises it again on leaving)."""
    import sys

    _INTERRUPT.requested = _INTERRUPT.migrating = False
    signal.signal(signal.SIGINT, _on_sigint)
    default_hook = sys.unraisablehook

    def hook(unraisable) -> None:
        if not issubclass(unraisable.exc_type, KeyboardInterrupt):
            default_hook(unraisable)

    sys.unraisablehook = hook


def interrupt_requested() -> bool:
    return _INTERRUPT.requested


def process(task: Task, options: Options) -> Outcome:
    try:
        return _process(task, options)
    except Exception as error:  # a bug in xla-migrate on this file: say so, and let the others migrate
        if os.environ.get("XLA_MIGRATE_DEBUG"):
            raise
        return Outcome(task.path, task.kind, task.out_path, target=options.target,
                       error=f"{task.path}: internal error in xla-migrate ({type(error).__name__}: {error}); "
                             "set XLA_MIGRATE_DEBUG=1 for the traceback and please report it")


def _process(task: Task, options: Options) -> Outcome:
    from ..engine.input_checks import TooLarge, read_bounded

    outcome = Outcome(task.path, task.kind, task.out_path, target=options.target)
    if task.kind == "other":  # a mirror's copy, streamed: a data file is not held in memory
        return _copy_other(task, options, outcome)
    with _Migrating():  # Ctrl-C abandons this part at once; the write below always completes
        try:
            data = read_bounded(task.path)
        except OSError as error:
            outcome.error = f"{task.path}: cannot read: {error.strerror or error}"
            return outcome
        except TooLarge as error:
            outcome.error = f"{task.path}: {error}"
            return outcome
        output = data
        if task.kind == "python":  # migrate() decides whether there is anything to migrate (triggers.py)
            output = _migrate_python(task, data, options, outcome)
        elif task.kind == "notebook":
            from .notebooks import migrate_notebook

            output = migrate_notebook(task, data, options, outcome)
    if outcome.error is not None:
        output = data  # a mirror keeps the file as it was; in place nothing is written
    outcome.changed = output != data
    if options.write:
        _write_outcome(task, options, outcome, output, data)
    return outcome


def _copy_other(task: Task, options: Options, outcome: Outcome) -> Outcome:
    if options.write and options.copy_others and task.out_path is not None and options.mirror_root is not None:
        try:
            _write_mirror(Path(task.out_path), Path(task.path), Path(task.path), options.mirror_root)
            outcome.written = True
        except OSError as error:
            outcome.error = f"{task.out_path}: cannot write: {error.strerror or error}"
    return outcome


def _write_outcome(task: Task, options: Options, outcome: Outcome, output: bytes, data: bytes) -> None:
    """In place: the file the path resolves to, only inside the folder it was found in. A mirror: its own
    file, never through a link, never outside it. A single output file (a notebook's --out): nothing when
    the input could not be migrated."""
    from ..report.files import write_atomically

    mirror = options.mirror_root is not None and task.out_path is not None
    try:
        if task.in_place:
            if outcome.changed:
                if task.within is not None and not inside_folders(task.path, [task.within]):
                    raise OSError(errno.EPERM, f"it resolves to {os.path.realpath(task.path)}, outside {task.within}")
                write_atomically(Path(os.path.realpath(task.path)), output, original=data)
                outcome.written = True
        elif task.out_path is not None and (outcome.changed or options.copy_others):
            if mirror:
                _write_mirror(Path(task.out_path), output, Path(task.path), options.mirror_root)
            elif outcome.error is None:
                write_atomically(Path(task.out_path), output, mode_from=Path(task.path))
            else:
                return
            outcome.written = True
    except OSError as error:
        where = task.path if task.in_place else task.out_path
        outcome.error = f"{where}: cannot write: {error.strerror or error}"


def _write_mirror(path: Path, data: bytes | Path, source: Path, mirror_root: str | None = None) -> None:
    """Into the mirror: a link found there is replaced by the file, never written through, and a folder
    that resolves outside the mirror (a link in it) is refused."""
    from ..report.files import write_atomically

    if mirror_root is not None:
        parent = os.path.realpath(path.parent)
        if not inside_folders(parent, [mirror_root]):
            raise OSError(errno.EPERM, f"{path.parent} resolves to {parent}, outside the mirror {mirror_root}")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, data, mode_from=source, follow_links=mirror_root is None)


def _migrate_python(task: Task, data: bytes, options: Options, outcome: Outcome) -> bytes:
    from ..api import migrate

    result = migrate(data, target=options.target, select=options.select, ignore=options.ignore_for(task.path),
                     path=task.path, out_path=task.out_path or task.path, distributed=options.distributed,
                     data_parallel=options.data_parallel, project=options.project, fix_safety=options.fix_safety)
    outcome.parsed = True
    if result.error is not None:
        outcome.error = result.error.format(task.path)
        outcome.input_error = result.error
        return data
    outcome.target = result.target
    outcome.data_parallel = result.data_parallel
    outcome.data_parallel_reason = result.data_parallel_reason
    outcome.changes = [(f"{task.path}:{c.line}:{c.column}", c) for c in result.changes]
    outcome.findings = [(f"{task.path}:{f.line}:{f.column}", f) for f in result.findings]
    if result.changed:
        outcome.releases = result.releases
        if options.want_diff:
            outcome.diff = result.diff.encode("utf-8" if result.encoding == "utf-8-sig" else result.encoding)
    return result.output_bytes
