"""What a recipe of the real-programs suite says: where the program is, how to make its run tiny, how to read it.

A recipe file (one per program, in this folder, any name not starting with ``_``) defines ``RECIPE``, a
:class:`Recipe`. It holds no third-party text beyond the identifiers a flag or a substitution needs: the
program itself stays in the repository cache, never in this repository.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

# verify's default: the number after "loss"
DEFAULT_LOSS_REGEX = r"(?i)loss\b[^0-9a-z\n+-]*(?:tensor\()?\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|nan|inf)"


@dataclass(frozen=True)
class Substitution:
    """A small textual change to one file of the copy, made before migrating (identifiers and numbers only)."""

    path: str
    old: str
    new: str
    count: int = 1  # how many occurrences must be there (all are replaced)


@dataclass(frozen=True)
class Resume:
    """A second run that resumes from the checkpoint the first run wrote: its arguments replace the first's."""

    args: tuple[str, ...]
    loss_regex: str | None = None  # default: the recipe's


@dataclass(frozen=True)
class Recipe:
    name: str
    repo: str  # owner/name in the repository cache
    entry: str  # the script run, relative to the repository
    style: str  # what kind of program (for the table)
    args: tuple[str, ...] = ()
    original_args: tuple[str, ...] = ()  # appended for the original only (a CPU device flag)
    # "{port}" in a value becomes a free TCP port, chosen once per program (a process group's MASTER_PORT)
    env: dict[str, str] = field(default_factory=dict)
    keep: tuple[str, ...] = ()  # paths copied from the repository (default: all of it)
    substitutions: tuple[Substitution, ...] = ()
    # made in a second copy that only the original runs from, never migrated: what CPU torch needs and the
    # program hard-codes for CUDA (the gloo backend for nccl, a CPU device for "cuda:{rank}")
    original_substitutions: tuple[Substitution, ...] = ()
    files: dict[str, str] = field(default_factory=dict)  # small files of our own (tiny configs), by path
    data: Callable[[Path], None] | None = None  # makes the fake data inside the copy
    data_script: str = ""  # Python run in the copy with the torch 2.9 interpreter, for data only torch writes
    cwd: str = ""  # the run's working folder, relative to the copy
    pythonpath: tuple[str, ...] = ()  # folders of the copy put on sys.path (an installed package's root)
    loss_regex: str = DEFAULT_LOSS_REGEX
    random: str = ""  # why the XLA run draws other random numbers ("" when it should match step by step)
    # an unseeded program: every process of its runs starts with torch, random and NumPy seeded with this
    # (REAL_PROGRAMS_SEED, _stubs/sitecustomize.py), so both runs start from the same weights and shuffle order
    seed: int | None = None
    amp: bool = False  # the tiny run trains under autocast/GradScaler (its losses are compared as bf16 curves)
    forms: tuple[tuple[str, str], ...] = ()  # extra (target, data-parallel form) runs besides each target's default
    timeout: int = 300  # seconds per run
    resume: Resume | None = None
    notes: str = ""
