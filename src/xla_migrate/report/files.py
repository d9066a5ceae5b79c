"""Writing output without ever leaving a half-written file: write a temp file beside the target, flush it to
disk, then rename it over the target in one step (``os.replace`` is atomic on POSIX and Windows).

A symlink is written through: the file it points to is replaced (atomically, beside itself) and the link
stays. A FIFO or a character device (``/dev/null``, ``/dev/stdout``, a shell's ``>(...)``) is written to
directly, as ``-`` writes to stdout: a stream cannot be replaced, and renaming over it would remove it.
Other special files (block devices, sockets) are refused.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path


def write_atomically(path: Path, data: bytes, mode_from: Path | None = None) -> None:
    """Write ``data`` to ``path``: afterwards it holds the old content or the new, never a part; no temp file
    is left behind on failure. The new file keeps the mode of the file it replaces, else that of
    ``mode_from`` when its owner can read it, else the mode a new file gets (0o666 less the umask)."""
    try:
        existing = os.stat(path)  # follows symlinks, /dev/fd/N included
    except OSError:
        existing = None
    if existing is not None and (stat.S_ISFIFO(existing.st_mode) or stat.S_ISCHR(existing.st_mode)):
        with open(path, "wb") as stream:
            stream.write(data)
        return
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        kind = "a block device" if stat.S_ISBLK(existing.st_mode) else (
            "a socket" if stat.S_ISSOCK(existing.st_mode) else "not a regular file")
        raise OSError(errno.EINVAL, f"is {kind}; xla-migrate writes regular files, FIFOs and character devices")
    path = Path(os.path.realpath(path))  # through symlinks: the link stays, the file it points to is replaced
    directory = path.parent if str(path.parent) else Path(".")
    mode = stat.S_IMODE(existing.st_mode) if existing is not None else _mode_for_new_file(mode_from)
    fd, temp_name = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".xla-migrate.tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp_name, mode)
        os.replace(temp_name, path)
    except BaseException:
        try:
            os.unlink(temp_name)
        except FileNotFoundError:
            pass
        raise


def _mode_for_new_file(mode_from: Path | None) -> int:
    """The source's mode when its owner may read it (a script stays executable); else, as for any new file,
    0o666 less the umask (a ``chmod 000`` input that root could read gives a normal file, not one nobody
    may open)."""
    if mode_from is not None:
        try:
            mode = stat.S_IMODE(os.stat(mode_from).st_mode)
        except OSError:
            mode = None
        if mode is not None and mode & stat.S_IRUSR:
            return mode
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask
