"""ruff's selection and inspection options on top of the settings: ``--extend-select``/``--extend-ignore``,
``per-file-ignores``, ``--safe-only`` (``fix-safety``), ``--exit-non-zero-on-findings``, and the two that
print instead of migrating, ``--show-settings`` and ``--show-files``."""

from __future__ import annotations

import os
from pathlib import Path

from .options import UsageError, _split_codes


def extend(settings, extend_select, extend_ignore, exit_non_zero_on_findings: bool, safe_only: bool) -> None:
    """The flags over the configuration. ``extend-select`` adds to an explicit ``select`` (with none, every
    rule already runs); ``extend-ignore`` adds to ``ignore``."""
    settings.extend_select = [*settings.extend_select, *_split_codes(extend_select)]
    settings.extend_ignore = [*settings.extend_ignore, *_split_codes(extend_ignore)]
    if settings.select and settings.extend_select:
        settings.select = [*settings.select, *settings.extend_select]
    settings.ignore = [*settings.ignore, *settings.extend_ignore]
    if exit_non_zero_on_findings:
        settings.exit_non_zero_on_findings = True
    if safe_only:
        settings.fix_safety = "safe"


def check_codes(settings) -> None:
    """The codes ``extend-select`` and ``per-file-ignores`` name exist (select and ignore are checked with
    the target)."""
    from ..engine.registry import unknown_selectors

    named = [*settings.extend_select, *(c for codes in settings.per_file_ignores.values() for c in codes)]
    unknown = unknown_selectors(named)
    if unknown:
        raise UsageError(f"unknown rule code or prefix: {', '.join(unknown)} (see --list-rules)")
    if not settings.per_file_ignores:
        return  # pathspec is not imported for nothing (a plain run's start-up)
    from pathspec import GitIgnoreSpec

    for pattern in settings.per_file_ignores:
        try:
            GitIgnoreSpec.from_lines([pattern])
        except ValueError:
            raise UsageError(f"per-file-ignores in {settings.config_path}: {pattern!r} is not a valid "
                             "gitignore pattern") from None


def ignores_for(path: str, per_file_ignores: dict[str, list[str]], config_dir) -> list[str]:
    """The codes ``per-file-ignores`` ignores in ``path``: its patterns match the path relative to the
    configuration's folder (gitignore style: ``tests/*.py``, or ``eval.py`` in any folder)."""
    if not per_file_ignores or path == "-":
        return []
    from pathspec import GitIgnoreSpec

    absolute = os.path.abspath(path)
    relative = os.path.relpath(absolute, config_dir) if config_dir is not None else path
    if relative.startswith(".."):
        relative = absolute
    relative = Path(relative).as_posix()
    codes: list[str] = []
    for pattern, ignored in per_file_ignores.items():
        if GitIgnoreSpec.from_lines([pattern]).match_file(relative):
            codes += ignored
    return codes


def config_line(settings) -> str:
    """-v: which configuration the run read."""
    if settings.config_path is None:
        return "configuration: none (no pyproject.toml with [tool.xla-migrate] above the input; defaults)"
    return f"configuration: {os.path.abspath(settings.config_path)} [tool.xla-migrate]"


def show_settings(settings, inputs: list[str]) -> None:
    """--show-settings: the resolved settings, one per line (key = value, TOML-like), on stdout."""
    import json

    from .config import DEFAULT_EXCLUDE

    exclude = settings.cli_exclude if settings.cli_exclude is not None else (
        settings.exclude if settings.exclude is not None else list(DEFAULT_EXCLUDE))
    rows = [
        ("config", str(os.path.abspath(settings.config_path)) if settings.config_path else None),
        ("inputs", inputs),
        ("target", settings.target),
        ("select", settings.select or ["ALL"]),
        ("ignore", settings.ignore),
        ("extend-select", settings.extend_select),
        ("extend-ignore", settings.extend_ignore),
        ("per-file-ignores", settings.per_file_ignores),
        ("fix-safety", settings.fix_safety),
        ("exit-non-zero-on-findings", settings.exit_non_zero_on_findings),
        ("distributed", settings.distributed),
        ("data-parallel", settings.data_parallel),
        ("exclude", exclude),
        ("extend-exclude", [*settings.extend_exclude, *settings.cli_extend_exclude]),
        ("force-exclude", settings.force_exclude),
    ]
    for key, value in rows:
        print(f"{key} = {json.dumps(value)}")


def show_files(inputs: list[str], ignorer) -> None:
    """--show-files: the files a run would migrate (scripts and notebooks), sorted, on stdout."""
    from . import discovery

    if inputs == ["-"]:
        print("-")
        return
    try:
        found = discovery.discover(inputs or ["."], ignorer, set())
    except discovery.DiscoveryError as error:
        raise UsageError(str(error)) from None
    for item in sorted(found, key=lambda f: f.path):
        if item.explicit or discovery.kind_of(item.path) != "other":
            print(item.path)
