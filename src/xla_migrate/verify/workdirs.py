"""The original's run starts from the working directory as the migrated run found it.

Programs write into their working directory (checkpoints, logs, caches) and many resume from what they find
there: run second in the same folder, the original would load the migrated run's last checkpoint and train
nothing (barlowtwins resumes from ``--checkpoint-dir`` by itself). So verify lists the folder before the
migrated run, and the original runs in a mirror of it: an entry that was there and that the migrated run did
not add to is a symbolic link to it; a folder the migrated run added to is mirrored a level deeper; what the
migrated run added is absent. What the original writes through a link lands in the user's folder (as it would
without verify); what it writes into the mirror's own folders goes with the mirror.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# Entries listed at most (a data set under the working directory can hold millions): a folder past the limit
# is linked whole, so the original sees what the migrated run wrote there.
LISTING_LIMIT = 20_000


@dataclass(frozen=True)
class Listing:
    """The entry names of ``root`` and of its folders (relative paths, ``""`` for root), as far as listed."""

    root: Path
    names: dict[str, frozenset[str]]


def _names(folder: Path) -> frozenset[str] | None:
    try:
        return frozenset(os.listdir(folder))
    except OSError:
        return None


def list_folder(root: str | os.PathLike, limit: int = LISTING_LIMIT) -> Listing:
    """The names in ``root`` and in the folders below it, breadth first, without following links."""
    root = Path(root).resolve()
    names: dict[str, frozenset[str]] = {}
    queue, listed = [""], 0
    while queue and listed < limit:
        relative = queue.pop(0)
        found = _names(root / relative)
        if found is None:
            continue
        names[relative] = found
        listed += len(found)
        for name in sorted(found):
            path = root / relative / name
            if path.is_dir() and not path.is_symlink():
                queue.append(os.path.join(relative, name) if relative else name)
    return Listing(root, names)


def added_since(listing: Listing) -> list[str]:
    """The entries (relative paths) that appeared in the listed folders since ``listing`` was taken."""
    added = []
    for relative, before in listing.names.items():
        now = _names(listing.root / relative)
        if now is not None:
            added.extend(os.path.join(relative, name) if relative else name for name in now - before)
    return sorted(added)


def mirror_without(listing: Listing, added: list[str], into: Path) -> Path:
    """``into`` made a mirror of the listed folder without ``added`` (see the module's docstring)."""
    changed = {""}
    for path in added:
        parent = os.path.dirname(path)
        while parent not in changed:
            changed.add(parent)
            parent = os.path.dirname(parent)
    _mirror(listing, changed, "", into)
    return into


def _mirror(listing: Listing, changed: set[str], relative: str, into: Path) -> None:
    into.mkdir(exist_ok=True)
    for name in sorted(listing.names.get(relative, ())):
        path = os.path.join(relative, name) if relative else name
        source = listing.root / path
        if not os.path.lexists(source):
            continue  # removed by the migrated run: nothing to show the original
        if path in changed:
            _mirror(listing, changed, path, into / name)
        else:
            os.symlink(source, into / name, target_is_directory=source.is_dir())
