"""Writing output without ever leaving a half-written file: write a temp file beside the target, flush it to
disk, then rename it over the target in one step (``os.replace`` is atomic on POSIX and Windows).

A symlink is written through: the file it points to is replaced (atomically, beside itself) and the link
stays; with ``follow_links=False`` (a mirror) the link itself is replaced by the file, so nothing is written
where it points. A FIFO or a character device (``/dev/null``, ``/dev/stdout``, a shell's ``>(...)``) is
written to directly, as ``-`` writes to stdout: a stream cannot be replaced, and renaming over it would
remove it. Other special files (block devices, sockets) are refused.

In place (``original``, the bytes read, is given), a file with other hard links, or whose owner or group a
new file would not get and ``chown`` cannot give it (another user's file), keeps its inode, as black and
editors keep it: the new content goes first to a temp file beside it (flushed and read back, so a full disk
fails there, before the file is touched), then into the file itself; if that write fails, the original
bytes are put back. Owner, mode, hard links and extended attributes stay.

Temp files are named ``.NAME.PID.RANDOM.xla-migrate.tmp``. One that a killed run (SIGKILL, power loss)
left behind is removed by the next run that writes in that folder, once no process has its PID.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import tempfile
import time
from pathlib import Path

TEMP_SUFFIX = ".xla-migrate.tmp"
_TEMP_NAME = re.compile(r"^\..+?\.(?:(\d+)\.)?[a-z0-9_]+" + re.escape(TEMP_SUFFIX) + "$")
_LEGACY_TEMP_AGE = 3600  # seconds: a temp name without a PID (older releases) is stale after an hour
_COPY_CHUNK = 1 << 20
_CLEANED: set[str] = set()  # folders whose stale temp files this process has removed


def write_atomically(path: Path, data: bytes | Path, mode_from: Path | None = None, follow_links: bool = True,
                     original: bytes | None = None) -> None:
    """Write ``data`` to ``path``: afterwards it holds the old content or the new, never a part; no temp file
    is left behind on failure. The new file keeps the mode of the file it replaces, else that of
    ``mode_from`` when its owner can read it, else the mode a new file gets (0o666 less the umask).
    ``data`` may be a file to copy (a mirror's copy of a data file: streamed, never held in memory).
    ``original``: the bytes the file held when read, for an in-place write (see the module's docstring)."""
    if isinstance(data, Path) and (follow_links and _is_stream(path)):
        with open(data, "rb") as source, open(path, "wb") as stream:
            shutil.copyfileobj(source, stream, _COPY_CHUNK)
        return
    try:
        existing = os.stat(path) if follow_links else os.lstat(path)  # stat follows /dev/fd/N too
    except OSError:
        existing = None
    if existing is not None and follow_links and (stat.S_ISFIFO(existing.st_mode) or stat.S_ISCHR(existing.st_mode)):
        with open(path, "wb") as stream:
            stream.write(data)
        return
    if existing is not None and stat.S_ISDIR(existing.st_mode) or (
            follow_links and existing is not None and not stat.S_ISREG(existing.st_mode)):
        kind = "a block device" if stat.S_ISBLK(existing.st_mode) else (
            "a socket" if stat.S_ISSOCK(existing.st_mode) else
            "a directory" if stat.S_ISDIR(existing.st_mode) else "not a regular file")
        raise OSError(errno.EINVAL, f"is {kind}; xla-migrate writes regular files, FIFOs and character devices")
    if not follow_links and existing is not None and not stat.S_ISREG(existing.st_mode):
        existing = None  # a link or a special file in a mirror: replaced by a new file, never written through
    if follow_links:
        path = Path(os.path.realpath(path))  # through symlinks: the link stays, the file it points to is replaced
    directory = path.parent if str(path.parent) else Path(".")
    remove_stale_temps(directory)
    mode = stat.S_IMODE(existing.st_mode) if existing is not None else _mode_for_new_file(mode_from)
    fd, temp_name = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.{os.getpid()}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as handle:
            if isinstance(data, Path):
                with open(data, "rb") as source:
                    shutil.copyfileobj(source, handle, _COPY_CHUNK)
            else:
                handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        through = original is not None and existing is not None and not _keeps_identity(temp_name, existing)
        if through:
            _check_copy(temp_name, data)
            _write_through(path, data, original)
            os.unlink(temp_name)
            return
        os.chmod(temp_name, mode)
        os.replace(temp_name, path)
    except BaseException:
        try:
            os.unlink(temp_name)
        except FileNotFoundError:
            pass
        raise


def _is_stream(path: Path) -> bool:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)


def _keeps_identity(temp_name: str, existing: os.stat_result) -> bool:
    """Whether renaming the temp file over the original keeps what the file is besides its bytes: no other
    hard link, and its owner and group (given to the temp file where the original's differ and chown may)."""
    if existing.st_nlink > 1:
        return False
    mine = os.stat(temp_name)
    if (mine.st_uid, mine.st_gid) != (existing.st_uid, existing.st_gid):
        try:
            os.chown(temp_name, existing.st_uid, existing.st_gid)
        except OSError:
            return False
    return True


def _check_copy(temp_name: str, data: bytes) -> None:
    """The temp copy holds exactly ``data`` (read back from the file system) before the original is touched."""
    with open(temp_name, "rb") as handle:
        if handle.read(len(data) + 1) != data:
            raise OSError(errno.EIO, "the temporary copy does not read back as written")


def _write_through(path: Path, data: bytes, original: bytes) -> None:
    """``data`` into the file itself (same inode); the original put back if that write fails."""
    with open(path, "r+b") as handle:
        try:
            handle.write(data)
            handle.truncate(len(data))
            handle.flush()
            os.fsync(handle.fileno())
        except BaseException:
            handle.seek(0)
            handle.write(original)
            handle.truncate(len(original))
            handle.flush()
            raise


def remove_stale_temps(directory: Path) -> None:
    """Remove the temp files of killed runs in ``directory`` (once per folder and process): those whose PID
    no process has, and those of older releases (no PID in the name) more than an hour old."""
    key = os.path.abspath(directory)
    if key in _CLEANED:
        return
    _CLEANED.add(key)
    try:
        names = [name for name in os.listdir(directory) if name.endswith(TEMP_SUFFIX)]
    except OSError:
        return
    for name in names:
        match = _TEMP_NAME.match(name)
        if match is None:
            continue
        candidate = os.path.join(directory, name)
        try:
            info = os.lstat(candidate)
            if not stat.S_ISREG(info.st_mode):
                continue
            pid = match.group(1)
            stale = (not _alive(int(pid))) if pid else time.time() - info.st_mtime > _LEGACY_TEMP_AGE
            if stale:
                os.unlink(candidate)
        except (OSError, ValueError):
            continue


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


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
