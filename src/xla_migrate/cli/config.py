"""``[tool.xla-migrate]`` in pyproject.toml: found by walking up from the (first) input, or named with
``--config``. Flags on the command line win over it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..engine.targets import DEFAULT_TARGET

KEYS = ("target", "select", "ignore", "exclude", "extend-exclude", "force-exclude", "distributed", "data-parallel",
        "extend-select", "extend-ignore", "per-file-ignores", "exit-non-zero-on-findings", "fix-safety")
FIX_SAFETY = ("all", "safe")  # fix-safety: every rule edits, or only the rules whose fix is "safe" (--safe-only)
# Also accepted: the key spelled as the Python keyword argument (``migrate(..., data_parallel=...)``).
KEY_SPELLINGS = {"data_parallel": "data-parallel"}

# Skipped unless ``exclude`` (in the config or on the command line) replaces the list, as ruff's and black's
# defaults are: virtual environments, installed packages, build output, caches. Folders only (a trailing
# slash), so a file that happens to be called ``build`` is still copied by a mirror. ``env/`` is not here
# (ruff does not skip it, and an RL repository's ``env/`` is its environments package): a folder of any name
# that holds a ``pyvenv.cfg`` is a virtual environment, skipped with these (discovery.Ignorer).
DEFAULT_EXCLUDE = (
    ".git/", ".hg/", ".svn/", ".venv/", "venv/", "site-packages/", "node_modules/",
    "__pypackages__/", "build/", "dist/", "__pycache__/", ".tox/", ".nox/", ".eggs/", "*.egg-info/",
    ".ipynb_checkpoints/", ".mypy_cache/", ".pytest_cache/", ".ruff_cache/", ".direnv/",
)


class ConfigError(Exception):
    """One line: which file, which key, what is wrong."""


@dataclass
class Settings:
    target: str = DEFAULT_TARGET
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    # gitignore patterns, relative to config_dir; None: DEFAULT_EXCLUDE. ``exclude`` replaces the defaults,
    # ``extend-exclude`` adds to them (ruff's two settings).
    exclude: list[str] | None = None
    extend_exclude: list[str] = field(default_factory=list)
    force_exclude: bool = False  # exclusions apply to files named on the command line too
    distributed: bool | None = None  # True/False: --distributed/--single; None: detected per script
    data_parallel: str | None = None  # "auto" / "ddp" / "xm" (--data-parallel); None: the target's default
    config_path: Path | None = None
    config_dir: Path | None = None
    cli_exclude: list[str] | None = None  # --exclude: replaces exclude (relative to the current folder)
    cli_extend_exclude: list[str] = field(default_factory=list)  # --extend-exclude
    # The keys the configuration file set (for the report: where each project decision came from).
    configured: set[str] = field(default_factory=set)
    # ruff's: codes added to select / ignore (the config's and --extend-select / --extend-ignore).
    extend_select: list[str] = field(default_factory=list)
    extend_ignore: list[str] = field(default_factory=list)
    # gitignore-style pattern (relative to config_dir) -> codes ignored in the files it matches.
    per_file_ignores: dict[str, list[str]] = field(default_factory=dict)
    exit_non_zero_on_findings: bool = False  # exit 1 while findings need a human (CI)
    fix_safety: str = "all"  # "safe": the rules whose fix is "review" report instead of editing


def _load_toml(path: Path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    from ..engine.input_checks import TooLarge, read_bounded

    try:
        return tomllib.loads(read_bounded(path).decode("utf-8"))
    except TooLarge:
        raise ConfigError(f"{path}: cannot read: too large for a configuration file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, expected a pyproject.toml file") from None
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror or error}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {_one_line(error)}") from None
    except RecursionError:  # tomllib recurses per level of nested arrays and tables
        raise ConfigError(f"{path}: not valid TOML for xla-migrate: nested too deeply") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: not UTF-8 (byte 0x{error.object[error.start]:02x})") from None
    except (ValueError, MemoryError) as error:  # whatever else the parser refuses: still one line
        raise ConfigError(f"{path}: not valid TOML: {_one_line(error)}") from None


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def _tool_table(path: Path, data: dict):
    """``[tool.xla-migrate]`` of a parsed file, or None; a ``tool`` that is not a table is an error."""
    tool = data.get("tool", {})
    if not isinstance(tool, dict):
        raise ConfigError(f"{path}: tool must be a table ([tool.xla-migrate])")
    if "xla_migrate" in tool:  # not silently ignored: the settings would not apply, with no word said
        raise ConfigError(f"{path}: [tool.xla_migrate] is not read: the table is [tool.xla-migrate] (a hyphen)"
                          + ("; keep one" if tool.get("xla-migrate") is not None else ""))
    return tool.get("xla-migrate")


def _has_section(path: Path) -> bool:
    try:
        data = path.read_bytes()
    except OSError:
        return False
    if b"xla-migrate" not in data and b"xla_migrate" not in data:  # cheap: most pyproject.toml files on the way up are not ours
        return False
    try:
        return _tool_table(path, _load_toml(path)) is not None
    except ConfigError:
        return True  # ours, but broken: load_config says why


def find_config(inputs: list[str]) -> Path | None:
    """The nearest pyproject.toml with a ``[tool.xla-migrate]`` table above the first input (or here)."""
    start = inputs[0] if inputs and inputs[0] != "-" else "."
    folder = Path(os.path.abspath(start))
    if not folder.is_dir():
        folder = folder.parent
    while not folder.is_dir():  # a glob: start from the folder it names
        folder = folder.parent
    for candidate in (folder, *folder.parents):
        path = candidate / "pyproject.toml"
        if path.is_file() and _has_section(path):
            return path
    return None


def _codes(path: Path, key: str, value) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{path}: [tool.xla-migrate] {key} must be a list of strings")
    return [code.strip() for v in value for code in v.split(",") if code.strip()]


def load_config(path: Path) -> Settings:
    table = _tool_table(path, _load_toml(path))
    settings = Settings(config_path=path, config_dir=Path(os.path.abspath(path)).parent)
    if table is None:
        return settings
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.xla-migrate] must be a table")
    for spelling, key in KEY_SPELLINGS.items():
        if spelling in table:
            if key in table:
                raise ConfigError(f"{path}: [tool.xla-migrate] has both {key} and {spelling}: keep one")
            table = {(key if k == spelling else k): v for k, v in table.items()}
    settings.configured = set(table)
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown key{'s' if len(unknown) > 1 else ''} in [tool.xla-migrate]: "
                          f"{', '.join(unknown)} (known: {', '.join(KEYS)})")
    if "target" in table:
        # A bare number is refused rather than converted: TOML reads 2.10 as the float 2.1.
        if not isinstance(table["target"], str):
            raise ConfigError(f"{path}: [tool.xla-migrate] target must be a string such as \"2.9\" "
                              f"(got {_toml_type(table['target'])}: quote it)")
        settings.target = table["target"]
    for key in ("select", "ignore"):
        if key in table:
            setattr(settings, key, _codes(path, key, table[key]))
    for key in ("exclude", "extend-exclude"):
        if key in table:
            value = table[key]
            value = [value] if isinstance(value, str) else value
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{path}: [tool.xla-migrate] {key} must be a list of strings")
            setattr(settings, key.replace("-", "_"), list(value))
    if "data-parallel" in table:
        from ..engine.targets import DATA_PARALLEL_FORMS

        if table["data-parallel"] not in DATA_PARALLEL_FORMS:
            raise ConfigError(f"{path}: [tool.xla-migrate] data-parallel must be one of "
                              f"{', '.join(repr(f) for f in DATA_PARALLEL_FORMS)}")
        settings.data_parallel = table["data-parallel"]
    for key in ("extend-select", "extend-ignore"):
        if key in table:
            setattr(settings, key.replace("-", "_"), _codes(path, key, table[key]))
    if "per-file-ignores" in table:
        value = table["per-file-ignores"]
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: [tool.xla-migrate] per-file-ignores must be a table of pattern = [codes]")
        settings.per_file_ignores = {pattern: _codes(path, f"per-file-ignores {pattern!r}", codes)
                                     for pattern, codes in value.items()}
    if "fix-safety" in table:
        if table["fix-safety"] not in FIX_SAFETY:
            raise ConfigError(f"{path}: [tool.xla-migrate] fix-safety must be one of "
                              f"{', '.join(repr(f) for f in FIX_SAFETY)}")
        settings.fix_safety = table["fix-safety"]
    for key in ("distributed", "force-exclude", "exit-non-zero-on-findings"):
        if key in table:
            if not isinstance(table[key], bool):
                raise ConfigError(f"{path}: [tool.xla-migrate] {key} must be true or false")
            setattr(settings, key.replace("-", "_"), table[key])
    return settings


def _toml_type(value) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a float", list: "an array", dict: "a table"}
    return names.get(type(value), type(value).__name__)
