"""The main command's arguments: the fast path's own parsing of the common command lines (typer's
declarations are in ``typer_app.py``), the configuration merged under the flags, the excludes, and the checks
of paths, modes and rule codes that end a run with a one-line usage error (exit 2) before anything is
written.

Exit codes: 0 success, 1 changes found under --check, 2 usage or input error (nothing written), 130
interrupted (Ctrl-C: finished files are kept, the rest are listed).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

EXIT_OK, EXIT_CHANGES, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130
# --output-format (--format): text on stderr; the others on stdout, as ruff's. json is ruff's flat list of
# diagnostics, json-report the nested per-file report (docs/report.schema.json), sarif SARIF 2.1.0.
FORMATS = ("text", "json", "json-report", "sarif", "github")
STDOUT_FORMATS = ("json", "json-report", "sarif", "github")


class UsageError(Exception):
    """A one-line problem with the command line or the input: reported, exit 2, nothing written."""


def _split_codes(values: Optional[list[str]]) -> list[str]:
    return [code.strip() for value in values or [] for code in value.split(",") if code.strip()]


def _check_paths(in_path: str, out: Optional[str], in_place: bool, diff: bool, check: bool,
                 diff_file: Optional[str]) -> Optional[str]:
    """Validate the combination of paths and modes; return where the migrated code goes (None: nowhere)."""
    if in_place:
        if out is not None:
            raise UsageError("--in-place and --out cannot be used together")
        if in_path == "-":
            raise UsageError("--in-place needs a file, not stdin")
        from ..report.guards import in_place_problem

        problem = in_place_problem(in_path)
        if problem is not None:
            raise UsageError(problem)
        out = in_path
    if out is None and not (diff or check or diff_file):
        raise UsageError("nothing to do: pass --out PATH (or --out - for stdout), --in-place, --diff or --check")
    if diff or check:
        out_target = None  # a dry run writes no code
    else:
        out_target = out
    if out_target not in (None, "-") and not in_place and in_path != "-" and _same_file(in_path, out_target):
        raise UsageError(f"--out {out_target} is the input file; pass --in-place to rewrite it")
    if out_target not in (None, "-") and Path(out_target).is_dir():
        raise UsageError(f"--out {out_target}: is a directory, expected a file path")
    return out_target


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


HELP = """Migrate CUDA PyTorch training scripts to PyTorch/XLA.

PATH is a script, a notebook (.ipynb), a folder (walked for .py and .ipynb files) or a quoted glob; '-' reads
stdin and writes the migrated code to stdout (--stdin-filename names it). Other commands: 'xla-migrate rule
CODE' prints a rule's documentation; 'xla-migrate verify SCRIPT' runs a migrated script on torch_xla and
checks it (see 'xla-migrate verify --help')."""


def _without_excluded(inputs: list[str], ignorer) -> list[str]:
    """--force-exclude: drop the named paths the excludes match (stdin and globs are kept)."""
    from .discovery import force_excluded

    return [path for path in inputs if path == "-" or not os.path.lexists(path) or not force_excluded(path, ignorer)]


def _ignorer(settings, use_gitignore: bool):
    """ruff's model: ``exclude`` (the defaults unless the config or --exclude replaces them) plus
    ``extend-exclude`` (the config's and --extend-exclude), and ``.gitignore`` unless --no-gitignore."""
    from .config import DEFAULT_EXCLUDE
    from .discovery import Ignorer

    if settings.cli_exclude is not None:
        excludes = [(None, settings.cli_exclude)]
    elif settings.exclude is not None:
        excludes = [(settings.config_dir, settings.exclude)]
    else:
        excludes = [(None, list(DEFAULT_EXCLUDE))]
    defaults = settings.cli_exclude is None and settings.exclude is None
    excludes += [(settings.config_dir, settings.extend_exclude), (None, settings.cli_extend_exclude)]
    ignorer = Ignorer(use_gitignore, excludes, skip_virtualenvs=defaults)  # pyvenv.cfg: with the defaults
    if settings.cli_exclude is not None or settings.exclude is not None or any(lines for _, lines in excludes[1:]):
        # The user's patterns compile now, so that a bad one fails here whatever the run.
        try:
            ignorer.excludes
        except (ValueError, re.error):  # pathspec's pattern errors
            raise UsageError(_bad_exclude_pattern(settings)) from None
    return ignorer


def _bad_exclude_pattern(settings) -> str:
    """Which pattern pathspec refused, and where it was given."""
    from pathspec import GitIgnoreSpec

    config = settings.config_path
    for where, lines in (("--exclude", settings.cli_exclude), (f"exclude in {config}", settings.exclude),
                         (f"extend-exclude in {config}", settings.extend_exclude),
                         ("--extend-exclude", settings.cli_extend_exclude)):
        for line in lines or ():
            try:
                GitIgnoreSpec.from_lines([line])
            except (ValueError, re.error):
                return f"{where}: {line!r} is not a valid gitignore pattern"
    return "an exclude pattern is not a valid gitignore pattern"


def _settings(inputs, config_path, target, select, ignore, exclude, extend_exclude):
    """Command-line flags over ``[tool.xla-migrate]`` over the defaults."""
    from .config import ConfigError, Settings, find_config, load_config

    try:
        found = Path(config_path) if config_path else find_config(inputs)
        settings = load_config(found) if found is not None else Settings()
    except ConfigError as error:
        raise UsageError(str(error)) from None
    if target is not None:
        settings.target = target
    if select:
        settings.select = _split_codes(select)
    if ignore:
        settings.ignore = _split_codes(ignore)
    settings.cli_exclude = list(exclude) if exclude else None
    settings.cli_extend_exclude = list(extend_exclude or [])
    return settings


def _is_single_file(inputs: list[str]) -> bool:
    """One script (or stdin): the original single-file behaviour, messages and all."""
    from .discovery import GLOB_CHARS, kind_of

    if len(inputs) != 1:
        return len(inputs) == 0
    path = inputs[0]
    if path == "-":
        return True
    if os.path.isdir(path) or kind_of(path) == "notebook":
        return False
    return os.path.lexists(path) or not GLOB_CHARS.search(path)


def _validate_rules(target: str, select: list[str], ignore: list[str], data_parallel: str | None = None) -> None:
    from ..engine.registry import unknown_selectors
    from ..engine.targets import data_parallel_problem, get_target

    try:
        target_spec = get_target(target)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if data_parallel is not None:
        problem = data_parallel_problem(target_spec, data_parallel)
        if problem is not None:
            raise UsageError(problem)
    unknown = unknown_selectors(select + ignore)
    if unknown:
        raise UsageError(f"unknown rule code or prefix: {', '.join(unknown)} (see --list-rules)")


def _project_root(settings, inputs: list[str], explicit: str | None) -> str | None:
    """The project's root: ``--project ROOT``; else the folder of the configuration the run read (found
    as pre-commit's file-by-file runs find it); else the one folder a tree run was given."""
    inputs = [i for i in inputs if i != "-"]
    if explicit is not None:
        return os.path.abspath(explicit)
    if settings.config_dir is not None:
        return str(settings.config_dir)
    if len(inputs) == 1 and os.path.isdir(inputs[0]):
        return os.path.abspath(inputs[0])
    return None


def _decision_sources(settings, target, distributed, data_parallel) -> dict[str, str]:
    """Where the run's target, data-parallel form and distributed choice come from (flag, config, default)."""
    config = f"{settings.config_path} [tool.xla-migrate]" if settings.config_path else "the configuration"
    sources = {}
    for name, flag, key, given in (("target", "--target", "target", target),
                                   ("data_parallel", "--data-parallel", "data-parallel", data_parallel),
                                   ("distributed", "--distributed" if distributed else "--single", "distributed",
                                    distributed)):
        if given is not None:
            sources[name] = flag
        elif key in settings.configured or (key == "data-parallel" and "data_parallel" in settings.configured):
            sources[name] = config
    return sources


# The fast path --------------------------------------------------------------------------------------------
# typer's import and its parsing cost more than migrating a small file. ``run`` parses the common command
# lines itself, into the very arguments typer gives ``migrate_command`` (tests/test_cli_fast.py compares
# them over many command lines and checks these tables against the typer declarations), and leaves to typer
# everything else: --help, --version among other arguments, -j, a repeated option, an option value that
# starts with '-', '--', an unknown option, a usage error.
_DEFAULTS: dict = {
    "paths": None, "in_path": None, "out": None, "in_place": False, "diff": False, "diff_file": None, "check": False,
    "target": None, "select": None, "ignore": None, "distributed": None, "data_parallel": None, "exclude": None,
    "extend_exclude": None, "force_exclude": False, "no_gitignore": False, "only_changed": False, "jobs": None,
    "project": None, "no_project": False, "requirements": False, "config": None, "output_format": "text",
    "report_path": None, "verify_output": False, "statistics": False, "list_rules": False, "version": False,
    "quiet": 0, "verbose": False, "extend_select": None, "extend_ignore": None, "exit_non_zero_on_findings": False,
    "safe_only": False, "show_settings": False, "show_files": False, "python": None, "stdin_filename": None}
_FAST_VALUES = {"--out": "out", "--diff-file": "diff_file", "--target": "target", "--data-parallel": "data_parallel",
                "--project": "project", "--config": "config", "--format": "output_format", "--report": "report_path",
                "--output-format": "output_format", "--python": "python",
                "--stdin-filename": "stdin_filename"}
_FAST_LISTS = {"--in": "in_path", "--select": "select", "--ignore": "ignore", "--exclude": "exclude",
               "--extend-exclude": "extend_exclude", "--extend-select": "extend_select",
               "--extend-ignore": "extend_ignore"}
_FAST_FLAGS = {"--in-place": ("in_place", True), "--diff": ("diff", True), "--check": ("check", True),
               "--distributed": ("distributed", True), "--single": ("distributed", False),
               "--force-exclude": ("force_exclude", True), "--no-gitignore": ("no_gitignore", True),
               "--only-changed": ("only_changed", True), "--no-project": ("no_project", True),
               "--requirements": ("requirements", True), "--verify": ("verify_output", True),
               "--statistics": ("statistics", True), "--list-rules": ("list_rules", True),
               "-v": ("verbose", True), "--verbose": ("verbose", True),
               "--exit-non-zero-on-findings": ("exit_non_zero_on_findings", True), "--safe-only": ("safe_only", True),
               "--show-settings": ("show_settings", True), "--show-files": ("show_files", True)}


def fast_arguments(args: list[str]) -> Optional[dict]:
    """``migrate_command``'s arguments for a command line the fast path takes, else None (typer's turn)."""
    arguments, given, paths = dict(_DEFAULTS), set(), []
    rest = iter(args)
    for arg in rest:
        if arg == "-" or not arg.startswith("-"):
            paths.append(arg)
            continue
        if arg in ("-q", "--quiet") or (len(arg) > 2 and arg.strip("q") == "-"):  # -q, --quiet, -qq...
            arguments["quiet"] += 1 if arg == "--quiet" else len(arg) - 1
            continue
        name, equals, value = arg.partition("=")
        if name in _FAST_FLAGS and not equals:
            key, flag = _FAST_FLAGS[name]
            if key in given:
                return None
            given.add(key)
            arguments[key] = flag
            continue
        if name not in _FAST_VALUES and name not in _FAST_LISTS:
            return None
        if not equals:
            value = next(rest, None)
            if value is None:
                return None
        if value.startswith("-") and value != "-" or (equals and not value):
            return None
        if name in _FAST_LISTS:
            key = _FAST_LISTS[name]
            arguments[key] = [*(arguments[key] or []), value]
            continue
        key = _FAST_VALUES[name]
        if key in given:
            return None
        given.add(key)
        arguments[key] = value
    arguments["paths"] = paths or None
    return arguments
