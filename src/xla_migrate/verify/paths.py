"""Each run of ``xla-migrate verify`` imports from its own tree: the original never sees the migrated files.

When the migrated script and the original live in two trees (a mirror and its source folder, or a script
written out of its project), :class:`Trees` names their roots and :func:`import_paths` gives each run its
``PYTHONPATH``: entries that point into the other tree are mapped into the run's own (the same place in it);
a tree run's roots go first; the migrated script can fall back on the original's folder for modules its own
folder lacks (a script migrated out of its project still imports the project's helpers); a project's root is
importable in both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Trees:
    """The roots of the migrated tree and of the original's (a mirror and its source folder): each run imports
    from its own tree. ``explicit``: a tree run named them, and both roots go on their runs' import path."""

    migrated: Path
    original: Path
    explicit: bool = False

    @classmethod
    def of(cls, script: str | os.PathLike, against: str | os.PathLike) -> "Trees | None":
        """The two trees, when the scripts sit in different folders: the folders above the path the two
        share at their ends (``out/pkg/main.py`` and ``src/pkg/main.py``: ``out`` and ``src``)."""
        mine, theirs = Path(script).resolve().parent.parts, Path(against).resolve().parent.parts
        common = 0
        while (common < min(len(mine), len(theirs)) - 1 and mine[len(mine) - 1 - common]
               == theirs[len(theirs) - 1 - common]):
            common += 1
        migrated, original = Path(*mine[:len(mine) - common]), Path(*theirs[:len(theirs) - common])
        return None if migrated == original else cls(migrated, original)


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def own_import_path(entries: list[str], cwd: str, own: Path, other: Path) -> list[str]:
    """``entries`` (PYTHONPATH, relative ones taken from ``cwd``) with those inside the other tree mapped into
    ``own`` (the same place in it, when it exists there); where one tree holds the other, the nearer root
    decides."""
    result = []
    for entry in entries:
        path = Path(cwd, entry or ".").resolve()
        in_own, in_other = _inside(path, own), _inside(path, other)
        if in_other and not (in_own and len(own.parts) > len(other.parts)):
            mapped = own / path.relative_to(other)
            path = mapped if mapped.exists() else path  # a folder the other tree alone has stays importable
        result.append(str(path))
    return result


def import_paths(env: dict, cwd: str | None, script: str | os.PathLike, against: str | os.PathLike | None,
                 trees: Trees | None, project_root: str | None = None) -> tuple[list[str], list[str]]:
    """The import path (after the loader) of the migrated run and of the original's run: the environment's
    PYTHONPATH, each entry in its own run's tree; a mirror's roots first (a tree run); then, for the migrated
    script, the original's folder when it has modules the migrated script's folder lacks (a script migrated out
    of its project, or a mirror of only the changed files, still imports the project's other modules); the
    project's root last."""
    inherited = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    here = cwd or os.getcwd()
    if trees is not None:
        migrated = own_import_path(inherited, here, trees.migrated, trees.original)
        original = own_import_path(inherited, here, trees.original, trees.migrated)
        if trees.explicit:
            migrated.insert(0, str(trees.migrated))
            original.insert(0, str(trees.original))
    else:
        migrated, original = list(inherited), list(inherited)
    if against is not None and _missing_modules(Path(script).resolve().parent, Path(against).resolve().parent):
        migrated.append(str(Path(against).resolve().parent))
    if project_root is not None:
        migrated.append(str(Path(project_root).resolve()))
        original.append(str(Path(project_root).resolve()))
    return _unique(migrated), _unique(original)


def _missing_modules(mine: Path, theirs: Path) -> bool:
    if mine == theirs:
        return False
    try:
        return bool({p.name for p in theirs.glob("*.py")} - {p.name for p in mine.glob("*.py")})
    except OSError:
        return False


def _unique(entries: list[str]) -> list[str]:
    seen, result = set(), []
    for entry in entries:
        if entry not in seen:
            seen.add(entry)
            result.append(entry)
    return result
