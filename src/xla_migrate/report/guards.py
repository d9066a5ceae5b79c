"""What the command line checks before it reads or writes anything, and how it shows a file's name.

Outputs: no path the run writes (``--out``, a mirror's files, ``--diff-file``, ``--report``) is a file the
run reads (its inputs, the configuration, the requirements files ``--requirements`` edits) or one another
output of the same run writes; in place, the outputs are the inputs themselves and nothing else may name
them. Paths are compared resolved through every link, and by inode (a hard link is the same file). A
stream (stdout ``-``, a FIFO, ``/dev/null``) holds nothing to lose and is not compared. A clash is one
line, exit 2, before anything is read or written.

In place: only a regular file (a FIFO would block, a device cannot be rewritten).

Names: a file name is the user's data, not the terminal's: its control characters (a newline that would
forge a line, an escape sequence) are printed escaped (``printable``).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass


class Clash(Exception):
    """A problem with the paths the run would write: the one-line message (exit 2, nothing written)."""


@dataclass(frozen=True)
class Role:
    what: str  # how the message names it: "--report", "the input file", "--out"
    path: str
    is_input: bool = False
    # False for a mirror's file: a link there is replaced, not written through (files.write_atomically).
    through_links: bool = True


def _identity(role: Role) -> tuple[str, tuple[int, int] | None] | None:
    """(resolved path, (device, inode) when it exists); None for a stream."""
    path = role.path
    if path == "-":
        return None
    try:
        info = os.stat(path) if role.through_links else os.lstat(path)
    except OSError:
        info = None
    if not role.through_links:
        real = os.path.join(os.path.realpath(os.path.dirname(path) or "."), os.path.basename(path))
        return real, ((info.st_dev, info.st_ino) if info is not None and stat.S_ISREG(info.st_mode) else None)
    if info is not None and (stat.S_ISFIFO(info.st_mode) or stat.S_ISCHR(info.st_mode)):
        return None
    return os.path.realpath(path), ((info.st_dev, info.st_ino) if info is not None else None)


def check(roles: list[Role]) -> None:
    """Raise ``Clash`` when an output is an input, or two outputs are one file (inputs first in
    ``roles``); a folder named as a file output is refused too."""
    by_path: dict[str, Role] = {}
    by_inode: dict[tuple[int, int], Role] = {}
    for role in sorted(roles, key=lambda r: not r.is_input):
        identity = _identity(role)
        if identity is None:
            continue
        real, inode = identity
        if not role.is_input:
            if os.path.isdir(role.path):
                raise Clash(f"{role.what} {role.path}: is a directory, expected a file path")
            other = by_path.get(real) or (by_inode.get(inode) if inode is not None else None)
            if other is not None:
                if other.is_input:
                    raise Clash(f"{role.what} {role.path} is {other.what} {other.path}: writing it would "
                                "overwrite it; nothing written (name another file)")
                raise Clash(f"{role.what} {role.path} and {other.what} {other.path} name the same file: "
                            "nothing written")
        by_path.setdefault(real, role)
        if inode is not None:
            by_inode.setdefault(inode, role)


def single_file_roles(in_path: str, destination: str | None, in_place: bool, diff_file: str | None,
                      report: str | None, config: str | None) -> list[Role]:
    """The files a one-script run reads and writes (``destination``: where the code goes, None for none)."""
    roles = [Role("the input file", in_path, True)] if in_path != "-" else []
    if config is not None:
        roles.append(Role("the configuration file", str(config), True))
    if destination is not None and not in_place:
        roles.append(Role("--out", destination))
    if diff_file:
        roles.append(Role("--diff-file", diff_file))
    if report:
        roles.append(Role("--report", report))
    return roles


def tree_roles(tasks, mirror: bool, writes: bool, diff_file: str | None, report: str | None, config: str | None,
               requirements: list[str]) -> list[Role]:
    """The files a tree run reads (every file found, the configuration, the requirements files it may edit)
    and writes (a mirror's files or a notebook's --out when it writes, --diff-file, --report)."""
    roles = [Role("the input file", task.path, True) for task in tasks]
    if config is not None:
        roles.append(Role("the configuration file", str(config), True))
    roles += [Role("the requirements file", path, True) for path in requirements]
    if writes:
        roles += [Role("--out" if not mirror else "the mirror's file", task.out_path, through_links=not mirror)
                  for task in tasks if task.out_path is not None and not task.in_place]
    if diff_file:
        roles.append(Role("--diff-file", diff_file))
    if report:
        roles.append(Role("--report", report))
    return roles


def check_single_outputs(in_path: str, destination: str | None, in_place: bool, diff_file: str | None,
                         report: str | None, config) -> None:
    check(single_file_roles(in_path, destination, in_place, diff_file, report, config))


def check_tree_outputs(tasks, mirror: bool, writes: bool, diff_file: str | None, report: str | None, config,
                       requirements_root: str | None, in_place: bool) -> None:
    requirements = ([os.path.join(requirements_root, name) for name in ("requirements.txt", "pyproject.toml")]
                    if requirements_root is not None else [])
    if in_place:
        for task in tasks:
            problem = in_place_problem(task.path) if task.kind != "other" else None
            if problem is not None:
                raise Clash(problem)
    check(tree_roles(tasks, mirror, writes, diff_file, report, config, requirements))


def in_place_problem(path: str) -> str | None:
    """Why ``path`` cannot be rewritten in place (None: it can): only a regular file can."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # reading it says why
    if stat.S_ISREG(mode):
        return None
    kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")
    return f"--in-place {path}: is {kind}; only a regular file can be rewritten in place (use --out)"


# C0 controls, DEL and C1 controls; shown as Python escapes (\n, \x1b, \x9b).
_CONTROL = {code: ascii(chr(code))[1:-1] for code in [*range(0x20), 0x7F, *range(0x80, 0xA0)] if code != 0x09}


def printable(text: str) -> str:
    """``text`` with its control characters escaped (tabs kept): safe to print on a terminal."""
    return text.translate(_CONTROL)
