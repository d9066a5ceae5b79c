"""stdin (``-``), as ruff and black take it: the migrated code goes to stdout unless a mode says otherwise
(``--out PATH``, ``--diff``, ``--check``, ``--diff-file``), and ``--stdin-filename NAME`` names the input:
the diff headers, the configuration found from it, its ``per-file-ignores``, ``--force-exclude`` (an
excluded name passes through unchanged, as ``ruff format`` does) and the kind of file (``.ipynb``: a
notebook, migrated as one). A notebook piped in without a name is recognised by its JSON, not parsed as a
Python dict literal."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .options import EXIT_CHANGES, EXIT_ERROR, EXIT_OK, UsageError


def stdin_inputs(inputs: list[str], stdin_filename: str | None) -> list[str]:
    """The inputs with ``--stdin-filename``: stdin (``-``) itself, or nothing else."""
    if stdin_filename is None:
        return inputs
    if not stdin_filename:
        raise UsageError("--stdin-filename: expected a file name")
    if inputs and inputs != ["-"]:
        raise UsageError("--stdin-filename names stdin ('-'); it cannot be combined with other inputs")
    return ["-"]


def named(inputs: list[str], stdin_filename: str | None) -> list[str]:
    """The inputs as the configuration and the excludes see them: stdin by its name, where it has one."""
    return [stdin_filename if path == "-" and stdin_filename else path for path in inputs]


def default_out(inputs: list[str], out, in_place: bool, diff: bool, check: bool, diff_file, output_format: str,
                stdout_formats) -> str | None:
    """``-`` alone with no mode is a filter: the migrated code on stdout (``--out -``)."""
    if inputs != ["-"] or out is not None or in_place or diff or check or diff_file:
        return out
    if output_format in stdout_formats:
        raise UsageError(f"stdin ('-') sends the migrated code to stdout, where --output-format {output_format} "
                         "puts its report: pass --check for the report alone, or --out PATH")
    return "-"


def is_notebook(data: bytes, stdin_filename: str | None) -> bool:
    """A notebook by its name; without a name, by its content (a JSON object with ``cells`` and
    ``nbformat``), which Python would otherwise read as a dict literal with nothing to migrate. A notebook
    under another name is refused rather than migrated as that dict literal (a silent no-op)."""
    from .discovery import kind_of

    if stdin_filename is not None and kind_of(stdin_filename) == "notebook":
        return True
    if not _looks_like_a_notebook(data):
        return False
    if stdin_filename is not None:
        raise UsageError(f"--stdin-filename {stdin_filename}: stdin holds a Jupyter notebook; name it with "
                         ".ipynb to migrate it as one")
    return True


def _looks_like_a_notebook(data: bytes) -> bool:
    if data.lstrip()[:1] != b"{":
        return False
    try:
        parsed = json.loads(data)
    except (ValueError, RecursionError):
        return False
    return isinstance(parsed, dict) and "cells" in parsed and "nbformat" in parsed


def pass_through(data: bytes, name: str, destination: str | None, quiet: int) -> int:
    """``--force-exclude`` and an excluded ``--stdin-filename``: the input unchanged where the code goes."""
    from .output import _err, _write

    if destination == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    elif destination is not None:
        _write(Path(destination), data)
    if not quiet:
        _err(f"{name}: excluded (--force-exclude): passed through unchanged")
    return EXIT_OK


def migrate_notebook(data: bytes, name: str, destination: str | None, diff: bool, diff_file, check: bool,
                     settings, ignore: list[str], verbose: bool) -> int:
    """A notebook on stdin, migrated as a tree run migrates one (one program, edits back in their cells);
    on an error nothing is written and stdout stays empty."""
    from . import tree
    from .output import _OUTPUT, _print_patch, _report_tree, _write

    task = tree.Task(name, "notebook", None)
    options = tree.Options(settings.target, settings.select or None, ignore or None, settings.distributed,
                           settings.data_parallel, write=False, copy_others=False,
                           want_diff=diff or bool(diff_file) or bool(_OUTPUT["report"])
                           or _OUTPUT["format"] == "json-report", fix_safety=settings.fix_safety)
    outcome = tree.Outcome(name, "notebook", target=settings.target)
    from .notebooks import migrate_notebook as migrate_cells

    output = migrate_cells(task, data, options, outcome)
    if outcome.error is not None:
        output = data
    outcome.changed = output != data
    if outcome.error is None:
        if diff_file:
            _write(Path(diff_file), outcome.diff)
        if diff:
            _print_patch(outcome.diff)
        if destination == "-":
            sys.stdout.buffer.write(output)
            sys.stdout.flush()
        elif destination is not None:
            _write(Path(destination), output)
            outcome.written = True
    _report_tree([outcome], settings.target, diff or check, verbose, settings.data_parallel)
    if outcome.error is not None:
        return EXIT_ERROR
    unreduced = any(f.code == "XLA413" for _, f in outcome.findings)
    return EXIT_CHANGES if (check and outcome.changed) or unreduced else EXIT_OK
