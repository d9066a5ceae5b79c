"""Writing output without ever leaving a half-written file: write a temp file beside the target, flush it to
disk, then rename it over the target in one step (``os.replace`` is atomic on POSIX and Windows)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


def write_atomically(path: Path, data: bytes, mode_from: Path | None = None) -> None:
    """Write ``data`` to ``path``: afterwards it holds the old content or the new, never a part; no temp file
    is left behind on failure. The new file keeps the mode of the file it replaces (or of ``mode_from``)."""
    directory = path.parent if str(path.parent) else Path(".")
    mode = _mode_of(path) or (_mode_of(mode_from) if mode_from is not None else None)
    fd, temp_name = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".xla-migrate.tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(temp_name, mode)
        os.replace(temp_name, path)
    except BaseException:
        try:
            os.unlink(temp_name)
        except FileNotFoundError:
            pass
        raise


def _mode_of(path: Path) -> int | None:
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return None
