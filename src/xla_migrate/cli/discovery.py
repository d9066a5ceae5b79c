"""Finding a run's files: directories, globs, ``.gitignore`` and ``--exclude`` (ruff's model), what kind
each file is, and which links and special files a walk does not follow or read. Also the project index of
every Python file the walk finds under a root (the analysis takes the list; the walk and its excludes are
the command line's)."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..analysis.project import ProjectIndex

# The decision "nothing to migrate" (engine/triggers.py) is migrate()'s own: a tree run reads every file.

PYTHON_SUFFIXES = (".py",)
NOTEBOOK_SUFFIXES = (".ipynb",)
GLOB_CHARS = re.compile(r"[*?\[]")
ALWAYS_SKIPPED_DIRS = {".git", ".hg", ".svn"}
VIRTUALENV_MARKER = "pyvenv.cfg"  # what makes a folder a virtual environment (PEP 405), whatever its name


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
    ``--exclude``/config patterns, with gitignore semantics (a deeper file and a later line win). With the
    default excludes, a folder that holds a ``pyvenv.cfg`` (a virtual environment, whatever its name) too."""

    def __init__(self, use_gitignore: bool, excludes: list[tuple[Path | None, list[str]]],
                 skip_virtualenvs: bool = False):
        self.use_gitignore = use_gitignore
        self.skip_virtualenvs = skip_virtualenvs
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
        if is_dir and self.skip_virtualenvs and (path / VIRTUALENV_MARKER).is_file():
            return True
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
    root: str | None = None  # the folder walked to find it (None: named on the command line)


def walk(root: str, ignorer: Ignorer, skip: set[str] = frozenset(), pattern=None,
         skipped: list[str] | None = None) -> list[Found]:
    """Every file below ``root`` not ignored; symlinked folders followed once each (no loops). As ruff and
    black do, a link whose target lies outside ``root`` is not followed, nor is anything read that is not
    a regular file (a FIFO would block the run): each is named in ``skipped``, one line each."""
    root_abs = Path(os.path.abspath(root))
    inside = _Inside(root)
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
            if not inside.follows(child, os.path.join(dirpath, name), skipped):
                continue
            keep.append(name)
        dirnames[:] = keep
        for name in filenames:
            child = here / name
            if ignorer.excluded(child, root_abs, is_dir=False):
                continue
            if not inside.follows(child, os.path.join(dirpath, name), skipped):
                continue
            rel = child.relative_to(root_abs).as_posix()
            if pattern is not None and not pattern.match_file(rel):
                continue
            found.append(Found(os.path.join(root, rel) if root not in (".", "./") else rel, rel, False, root))
    return found


class _Inside:
    """Whether a walk may go through a path: links only to targets inside the walked folder, files only
    when they are regular files (os.walk lists FIFOs, sockets and devices as files)."""

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)

    def contains(self, real: str) -> bool:
        return real == self.root or real.startswith(self.root.rstrip(os.sep) + os.sep)

    def follows(self, child: Path, shown: str, skipped: list[str] | None) -> bool:
        reason = None
        if os.path.islink(child):
            real = os.path.realpath(child)
            if not os.path.exists(real):
                reason = "a broken link"
            elif not self.contains(real):
                reason = "a link to outside the folder"
        if reason is None:
            try:
                mode = os.stat(child).st_mode
            except OSError as error:
                reason = f"cannot read: {error.strerror or error}"
            else:
                if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    reason = "not a regular file"
        if reason is not None and skipped is not None:
            skipped.append(f"{shown}: skipped: {reason}")
        return reason is None


def inside_folders(path: str, folders: list[str]) -> bool:
    """Whether ``path``, resolved through every link, lies in one of ``folders`` (resolved too)."""
    return any(_Inside(folder).contains(os.path.realpath(path)) for folder in folders)


def force_excluded(path: str, ignorer: Ignorer) -> bool:
    """``--force-exclude``: whether a path named on the command line matches an exclude pattern, itself or
    through a folder above it (command-line patterns are relative to the current folder). As in ruff,
    exclusions otherwise apply only to what a folder walk or a glob finds."""
    # gitignore matching of "a/build/x.py" against "build/" covers the folders above the file.
    absolute, here = Path(os.path.abspath(path)), Path(os.getcwd())
    if ignorer.excluded_by_pattern(absolute, here, is_dir=os.path.isdir(path)):
        return True
    # A virtual environment above it, below the current folder (patterns are relative to it too).
    return ignorer.skip_virtualenvs and any((folder / VIRTUALENV_MARKER).is_file() for folder in absolute.parents
                                            if folder != here and here in folder.parents)


def discover(specs: list[str], ignorer: Ignorer, skip: set[str] = frozenset(),
             skipped: list[str] | None = None) -> list[Found]:
    """Expand the paths: files as they are, folders walked, globs matched (``**`` for any depth). A file
    named on the command line is taken whatever it is and wherever a link leads (the user named it)."""
    found: list[Found] = []
    for spec in specs:
        if os.path.isdir(spec):
            found += walk(spec, ignorer, skip, skipped=skipped)
        elif os.path.lexists(spec):
            found.append(Found(spec, None, True))  # named: migrated even if excluded (see force_excluded)
        elif GLOB_CHARS.search(spec):
            found += _glob(spec, ignorer, skip, skipped)
        else:
            raise DiscoveryError(f"{spec}: no such file or directory")
    return found


def _glob(spec: str, ignorer: Ignorer, skip: set[str], skipped: list[str] | None = None) -> list[Found]:
    from pathspec import GitIgnoreSpec

    parts = spec.split("/")
    index = next(i for i, part in enumerate(parts) if GLOB_CHARS.search(part))
    base = "/".join(parts[:index]) or ("/" if spec.startswith("/") else ".")
    rest = "/".join(parts[index:])
    if not os.path.isdir(base):
        raise DiscoveryError(f"{spec}: no files match")
    pattern = GitIgnoreSpec.from_lines(["/" + rest])
    matches = [Found(f.path, None, True, base) for f in walk(base, ignorer, skip, pattern, skipped)]
    if not matches:
        raise DiscoveryError(f"{spec}: no files match")
    return matches


def index_for(root: str, ignorer: Ignorer) -> ProjectIndex:
    """Index every Python file the tree walk finds under ``root`` (the same excludes and .gitignore)."""
    from ..analysis.project import build_index

    from ..engine.input_checks import MAX_INPUT_BYTES

    found = walk(root, ignorer)
    paths = [os.path.join(root, f.rel) for f in found if f.rel and f.rel.endswith(".py")]
    # A file too large to migrate is not indexed either (its ast alone would be gigabytes).
    return build_index(root, [path for path in paths if _size(path) <= MAX_INPUT_BYTES],
                       notebooks=any(f.rel.endswith(".ipynb") for f in found if f.rel))


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
