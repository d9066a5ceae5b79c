"""Many files in one run: finding them (directories, globs, ``.gitignore``, ``--exclude``), the cheap
pre-filter, and migrating them in worker processes, one parse per file.

Workers read, migrate and write their own files (nothing big travels between processes except the diff
when one is asked for); the CLI prints what they report in sorted path order.
"""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

# A file that mentions none of these is not parsed at all: nothing in it can need migrating. The one place
# the list lives; keep it a superset of what any rule looks for.
TRIGGERS = ("cuda", "torch", "Trainer", "nccl", "accelerate", "autocast", "GradScaler", "apex")
TRIGGER_RE = re.compile("|".join(re.escape(t) for t in TRIGGERS).encode())

PYTHON_SUFFIXES = (".py",)
NOTEBOOK_SUFFIXES = (".ipynb",)
GLOB_CHARS = re.compile(r"[*?\[]")
ALWAYS_SKIPPED_DIRS = {".git", ".hg", ".svn"}


def mentions_a_trigger(data: bytes) -> bool:
    return TRIGGER_RE.search(data) is not None


def kind_of(path: str) -> str:
    if path.endswith(NOTEBOOK_SUFFIXES):
        return "notebook"
    if path.endswith(PYTHON_SUFFIXES):
        return "python"
    return "other"


class DiscoveryError(Exception):
    """A path on the command line that names nothing."""


# Finding files ---------------------------------------------------------------------------------------------
class Ignorer:
    """``.gitignore`` files (from the repository root, or the walked folder outside a repository, down) and
    ``--exclude``/config patterns, with gitignore semantics (a deeper file and a later line win)."""

    def __init__(self, use_gitignore: bool, excludes: list[tuple[Path | None, list[str]]]):
        self.use_gitignore = use_gitignore
        self._gitignores: dict[Path, object] = {}
        self._exclude_lines = [(base, lines) for base, lines in excludes if lines]

    @cached_property
    def excludes(self) -> list:
        """(base folder or None for "relative to the walked root", spec), compiled when first asked: a
        single script never is (the caller asks at once for patterns that a user wrote, which can be bad)."""
        from pathspec import GitIgnoreSpec

        return [(base, GitIgnoreSpec.from_lines(lines)) for base, lines in self._exclude_lines]

    def _gitignore(self, folder: Path):
        if folder not in self._gitignores:
            spec = None
            ignore_file = folder / ".gitignore"
            if ignore_file.is_file():
                from pathspec import GitIgnoreSpec

                try:
                    spec = GitIgnoreSpec.from_lines(ignore_file.read_text(errors="replace").splitlines())
                except Exception:  # a malformed pattern: ignore that file, as git would ignore the line
                    spec = None
            self._gitignores[folder] = spec
        return self._gitignores[folder]

    def excluded_by_pattern(self, path: Path, root: Path, is_dir: bool) -> bool:
        suffix = "/" if is_dir else ""
        for base, spec in self.excludes:
            try:
                rel = path.relative_to(base or root).as_posix()
            except ValueError:
                if base is not None:  # outside the config's folder: its patterns say nothing about it
                    continue
                rel = path.as_posix().lstrip("/")  # a named file outside the current folder: its whole path
            if rel != "." and spec.match_file(rel + suffix):
                return True
        return False

    def excluded(self, path: Path, root: Path, is_dir: bool) -> bool:
        """``path`` and ``root`` absolute (not resolved); ``root`` is the folder being walked."""
        if self.excluded_by_pattern(path, root, is_dir):
            return True
        suffix = "/" if is_dir else ""
        if not self.use_gitignore:
            return False
        top = _repo_root(root) or root
        try:
            parts = path.relative_to(top).parts
        except ValueError:
            return False
        verdict = None
        folder = top
        for depth in range(len(parts)):
            spec = self._gitignore(folder)
            if spec is not None:
                result = spec.check_file("/".join(parts[depth:]) + suffix).include
                if result is not None:
                    verdict = result
            folder = folder / parts[depth]
        return bool(verdict)


_REPO_ROOTS: dict[Path, Path | None] = {}


def _repo_root(folder: Path) -> Path | None:
    if folder not in _REPO_ROOTS:
        found = None
        for candidate in (folder, *folder.parents):
            if (candidate / ".git").exists():
                found = candidate
                break
        _REPO_ROOTS[folder] = found
    return _REPO_ROOTS[folder]


@dataclass(frozen=True)
class Found:
    path: str  # as the user will see it: the input joined with the path below it
    rel: str | None  # below the walked folder (for a mirror), None for a file named on the command line
    explicit: bool  # named on the command line (migrated whatever its suffix)


def walk(root: str, ignorer: Ignorer, skip: set[str] = frozenset(), pattern=None) -> list[Found]:
    """Every file below ``root`` not ignored; symlinked folders followed once each (no loops)."""
    root_abs = Path(os.path.abspath(root))
    seen: set[tuple[int, int]] = set()
    found: list[Found] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        try:
            st = os.stat(dirpath)
        except OSError:
            dirnames[:] = []
            continue
        if (st.st_dev, st.st_ino) in seen:
            dirnames[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        here = Path(os.path.abspath(dirpath))
        keep = []
        for name in sorted(dirnames):
            child = here / name
            if name in ALWAYS_SKIPPED_DIRS or os.path.realpath(child) in skip:
                continue
            if ignorer.excluded(child, root_abs, is_dir=True):
                continue
            keep.append(name)
        dirnames[:] = keep
        for name in filenames:
            child = here / name
            if ignorer.excluded(child, root_abs, is_dir=False):
                continue
            rel = child.relative_to(root_abs).as_posix()
            if pattern is not None and not pattern.match_file(rel):
                continue
            found.append(Found(os.path.join(root, rel) if root not in (".", "./") else rel, rel, False))
    return found


def force_excluded(path: str, ignorer: Ignorer) -> bool:
    """``--force-exclude``: whether a path named on the command line matches an exclude pattern, itself or
    through a folder above it (command-line patterns are relative to the current folder). As in ruff,
    exclusions otherwise apply only to what a folder walk or a glob finds."""
    # gitignore matching of "a/build/x.py" against "build/" covers the folders above the file.
    return ignorer.excluded_by_pattern(Path(os.path.abspath(path)), Path(os.getcwd()), is_dir=os.path.isdir(path))


def discover(specs: list[str], ignorer: Ignorer, skip: set[str] = frozenset()) -> list[Found]:
    """Expand the paths: files as they are, folders walked, globs matched (``**`` for any depth)."""
    found: list[Found] = []
    for spec in specs:
        if os.path.isdir(spec):
            found += walk(spec, ignorer, skip)
        elif os.path.lexists(spec):
            found.append(Found(spec, None, True))  # named: migrated even if excluded (see force_excluded)
        elif GLOB_CHARS.search(spec):
            found += _glob(spec, ignorer, skip)
        else:
            raise DiscoveryError(f"{spec}: no such file or directory")
    return found


def _glob(spec: str, ignorer: Ignorer, skip: set[str]) -> list[Found]:
    from pathspec import GitIgnoreSpec

    parts = spec.split("/")
    index = next(i for i, part in enumerate(parts) if GLOB_CHARS.search(part))
    base = "/".join(parts[:index]) or ("/" if spec.startswith("/") else ".")
    rest = "/".join(parts[index:])
    if not os.path.isdir(base):
        raise DiscoveryError(f"{spec}: no files match")
    pattern = GitIgnoreSpec.from_lines(["/" + rest])
    matches = [Found(f.path, None, True) for f in walk(base, ignorer, skip, pattern)]
    if not matches:
        raise DiscoveryError(f"{spec}: no files match")
    return matches


# Migrating one file (in a worker) ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Options:
    target: str
    select: list[str] | None
    ignore: list[str] | None
    distributed: bool | None  # None: detected per script
    data_parallel: str | None  # "ddp" / "xm"; None: the target's default
    write: bool  # write outputs (a mirror or in place); False for --diff/--check
    copy_others: bool  # a mirror copies what it does not change (not with --only-changed)
    want_diff: bool
    # The project index (project.ProjectIndex, plain data): every file is migrated as part of that program.
    project: object = None


@dataclass(frozen=True)
class Task:
    path: str
    kind: str  # python, notebook, other
    out_path: str | None  # the mirror's file; None in place or for a dry run
    in_place: bool = False


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
    serial run."""
    _INTERRUPT.requested = _INTERRUPT.migrating = False
    signal.signal(signal.SIGINT, _on_sigint)


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
    outcome = Outcome(task.path, task.kind, task.out_path, target=options.target)
    with _Migrating():  # Ctrl-C abandons this part at once; the write below always completes
        try:
            data = Path(task.path).read_bytes()
        except OSError as error:
            outcome.error = f"{task.path}: cannot read: {error.strerror or error}"
            return outcome
        output = data
        if task.kind == "python" and mentions_a_trigger(data):
            output = _migrate_python(task, data, options, outcome)
        elif task.kind == "notebook":
            from .notebooks import migrate_notebook

            output = migrate_notebook(task, data, options, outcome)
    if outcome.error is not None:
        output = data  # a mirror keeps the file as it was; in place nothing is written
    outcome.changed = output != data
    if options.write:
        try:
            if task.in_place:
                if outcome.changed:
                    from ..report.files import write_atomically

                    write_atomically(Path(os.path.realpath(task.path)), output)
                    outcome.written = True
            elif task.out_path is not None and (outcome.changed or options.copy_others):
                _write_mirror(Path(task.out_path), output, Path(task.path))
                outcome.written = True
        except OSError as error:
            where = task.path if task.in_place else task.out_path
            outcome.error = f"{where}: cannot write: {error.strerror or error}"
    return outcome


def _write_mirror(path: Path, data: bytes, source: Path) -> None:
    from ..report.files import write_atomically

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, data, mode_from=source)


def _migrate_python(task: Task, data: bytes, options: Options, outcome: Outcome) -> bytes:
    from ..api import migrate

    result = migrate(data, target=options.target, select=options.select, ignore=options.ignore,
                     path=task.path, out_path=task.out_path or task.path, distributed=options.distributed,
                     data_parallel=options.data_parallel, project=options.project)
    outcome.parsed = True
    if result.error is not None:
        outcome.error = result.error.format(task.path)
        outcome.input_error = result.error
        return data
    outcome.target = result.target
    outcome.data_parallel = result.data_parallel
    outcome.changes = [(f"{task.path}:{c.line}:{c.column}", c) for c in result.changes]
    outcome.findings = [(f"{task.path}:{f.line}:{f.column}", f) for f in result.findings]
    if result.changed:
        outcome.releases = result.releases
        if options.want_diff:
            outcome.diff = result.diff.encode("utf-8" if result.encoding == "utf-8-sig" else result.encoding)
    return result.output_bytes


# Running many ------------------------------------------------------------------------------------------------
def run_all(tasks: list[Task], options: Options, jobs: int, progress=None) -> list[Outcome]:
    """Migrate every task in ``jobs`` supervised worker processes (see ``workers.py``: a worker that
    crashes costs only its file). Sorted by path. Only a run with nothing to parse, or ``XLA_MIGRATE_DEBUG``
    set with ``-j 1`` (tracebacks reach the terminal), runs in this process.

    Ctrl-C stops the run promptly: pending files are not started, files being migrated are abandoned, writes
    in progress complete; then ``Interrupted`` says what finished and what was not reached."""
    parse_work = [t for t in tasks if t.kind != "other"]
    jobs = max(1, min(jobs, len(parse_work)))
    outcomes: list[Outcome] = []
    with _SigintHandled():
        if not parse_work or (jobs == 1 and os.environ.get("XLA_MIGRATE_DEBUG")):
            for task in tasks:
                if _INTERRUPT.requested:
                    break
                try:
                    outcomes.append(process(task, options))
                except KeyboardInterrupt:
                    break
                if progress:
                    progress(1)
        else:
            from .workers import run_supervised

            outcomes = run_supervised(tasks, options, jobs, progress)
        interrupted = _INTERRUPT.requested
    if interrupted:
        finished = {o.path for o in outcomes}
        raise Interrupted(outcomes, [t for t in tasks if t.path not in finished])
    return sorted(outcomes, key=lambda o: o.path)
