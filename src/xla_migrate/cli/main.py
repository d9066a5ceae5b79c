"""The command line, ``xla-migrate [OPTIONS] PATH...``. stdout carries one thing: the code, the diff or the
JSON report; the text report and errors go to stderr. Subcommands (``xla-migrate rule CODE``) are
dispatched in ``__main__.py`` before this command parses anything, so paths stay positional. The options
are declared for typer in ``typer_app.py``; ``run`` parses the common command lines itself (see the fast path
below), so a plain run imports no typer.

Exit codes: 0 success, 1 changes found under --check, 2 usage or input error (nothing written), 130
interrupted (Ctrl-C: finished files are kept, the rest are listed).
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import Optional

from .. import __version__
from ..report import formats as report
from ..api import MigrationResult, migrate
from ..report.files import write_atomically

EXIT_OK, EXIT_CHANGES, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130
FORMATS = ("text", "json", "github")
# How this run reports: --format, --report, -q (0: all, 1: no summary line, 2: errors only) and
# --statistics (set once per command).
_OUTPUT: dict = {"format": "text", "report": None, "quiet": 0, "statistics": False, "project": None}

class UsageError(Exception):
    """A one-line problem with the command line or the input: reported, exit 2, nothing written."""


def _colour(stream) -> bool:
    return stream.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def _err(line: str, style: str | None = None) -> None:
    if style and _colour(sys.stderr):
        codes = {"red": "31", "yellow": "33", "bold": "1"}
        line = f"\033[{codes[style]}m{line}\033[0m"
    print(line, file=sys.stderr)


def _diff_bytes(result: MigrationResult) -> bytes:
    """The diff in the file's own encoding, so it applies byte for byte (a BOM is not repeated in it)."""
    return result.diff.encode("utf-8" if result.encoding == "utf-8-sig" else result.encoding)


def _print_diff(result: MigrationResult) -> None:
    diff = result.diff
    if not _colour(sys.stdout):
        sys.stdout.flush()
        sys.stdout.buffer.write(_diff_bytes(result))
        sys.stdout.flush()
        return
    for line in diff.splitlines(keepends=True):
        colour = "1" if line.startswith(("---", "+++")) else {"+": "32", "-": "31", "@": "36"}.get(line[:1])
        sys.stdout.write(f"\033[{colour}m{line.rstrip(chr(10))}\033[0m\n" if colour else line)


def _split_codes(values: Optional[list[str]]) -> list[str]:
    return [code.strip() for value in values or [] for code in value.split(",") if code.strip()]


def _list_rules(output_format: str) -> None:
    from ..engine.registry import all_rules

    if output_format == "json":
        import json

        from ..report.ruledocs import rule_record

        print(json.dumps([rule_record(rule) for rule in all_rules()], indent=2))
        return
    for rule in all_rules():
        targets = ",".join(rule.targets)
        print(f"{rule.code}  {rule.name:<28} {rule.fix_safety:<6} [{targets}]  {rule.summary}")


def _read_input(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    source = Path(path)
    if source.is_dir():
        raise UsageError(f"{path}: is a directory, expected a Python file")
    try:
        return source.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except OSError as error:
        raise UsageError(f"{path}: cannot read: {error.strerror or error}") from None


def _check_paths(in_path: str, out: Optional[str], in_place: bool, diff: bool, check: bool,
                 diff_file: Optional[str]) -> Optional[str]:
    """Validate the combination of paths and modes; return where the migrated code goes (None: nowhere)."""
    if in_place:
        if out is not None:
            raise UsageError("--in-place and --out cannot be used together")
        if in_path == "-":
            raise UsageError("--in-place needs a file, not stdin")
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


def _installed_torch_xla() -> Optional[str]:
    if not _may_have_torch_xla():
        return None
    from importlib import metadata

    try:
        return metadata.version("torch_xla")
    except metadata.PackageNotFoundError:
        return None


def _may_have_torch_xla() -> bool:
    """False only where ``importlib.metadata`` cannot find torch_xla (importing it costs more than the
    search): no finder but the standard one, and no folder on sys.path holds a name that could be
    torch_xla's metadata (compared without case and separators, a superset of the names it matches)."""
    import importlib.machinery

    if any(hasattr(finder, "find_distributions") and finder is not importlib.machinery.PathFinder
           for finder in sys.meta_path):
        return True
    for entry in sys.path:
        folder = entry or "."
        if not os.path.isdir(folder):
            if os.path.exists(folder):  # a zip archive
                return True
            continue
        try:
            names = os.listdir(folder)
        except OSError:
            return True
        for name in [os.path.basename(entry), *names]:
            if name.lower().translate(_SEPARATORS).startswith("torchxla"):
                return True
    return False


_SEPARATORS = str.maketrans("", "", "-_.")


def _machine_report(results: list[MigrationResult]) -> bool:
    """Write --report and print the json/github report; True when the text report is replaced."""
    if _OUTPUT["report"] or _OUTPUT["format"] == "json":
        import json

        text = json.dumps(report.json_report(results, _OUTPUT["project"]), indent=2) + "\n"
        if _OUTPUT["report"]:
            _write(Path(_OUTPUT["report"]), text.encode("utf-8"))
        if _OUTPUT["format"] == "json":  # on stdout, as ruff's: nothing else is there (checked up front)
            sys.stdout.flush()
            sys.stdout.write(text)
            sys.stdout.flush()
            return True
    if _OUTPUT["format"] == "github":
        for result in results:
            for line in report.github_annotations(result):
                if _OUTPUT["quiet"] < 2 or line.startswith("::error"):
                    print(line, file=sys.stderr)
    return False


def _records(results: list[MigrationResult], verbose: bool) -> None:
    """The text report's body: every finding (and with -v every change), or --statistics' table."""
    if _OUTPUT["statistics"]:
        for line in report.statistics_lines(results):
            _err(line)
        return
    for result in results:
        if verbose:
            for line in report.change_lines(result):
                _err(line)
        for line in report.finding_lines(result):
            _err(line, "yellow")


def _report(result: MigrationResult, label: str, verbose: bool) -> None:
    if _machine_report([result]):
        return
    quiet = _OUTPUT["quiet"]
    if _OUTPUT["format"] == "github":
        if not quiet:
            _err(report.summary(result, label))
        return
    if quiet >= 2:
        return
    _records([result], verbose)
    if not quiet:
        _err(report.summary(result, label), "bold")


HELP = """Migrate CUDA PyTorch training scripts to PyTorch/XLA.

PATH is a script, a notebook (.ipynb), a folder (walked for .py and .ipynb files) or a quoted glob; '-' reads
stdin. Other commands: 'xla-migrate rule CODE' prints a rule's documentation; 'xla-migrate verify SCRIPT' runs a
migrated script on torch_xla and checks it (see 'xla-migrate verify --help')."""


def migrate_command(paths, in_path, out, in_place, diff, diff_file, check, target, select, ignore, distributed,
                    data_parallel, exclude, extend_exclude, force_exclude, no_gitignore, only_changed, jobs,
                    project, no_project, requirements, config, output_format, report_path, verify_output,
                    statistics, list_rules, version, quiet, verbose) -> int:
    """The main command on its parsed arguments (from typer, or from the fast path for a plain run, which
    gives the same ones); returns the exit code."""
    if version:
        print(f"xla-migrate {__version__}")
        return EXIT_OK
    try:
        if output_format not in FORMATS:
            raise UsageError(f"--format {output_format}: expected one of {', '.join(FORMATS)}")
        if list_rules:
            if output_format == "github":
                raise UsageError("--list-rules --format: expected text or json")
            _list_rules(output_format)
            return EXIT_OK
        if output_format == "json" and (diff or out == "-"):
            raise UsageError(f"--format json prints the report on stdout, where {'--diff' if diff else '--out -'} "
                             "puts its output: write the report to a file with --report PATH instead")
        if statistics and output_format != "text":
            raise UsageError("--statistics is a text report; the JSON report (--format json) has every record")
        _OUTPUT.update(format=output_format, report=report_path, quiet=quiet, statistics=statistics, project=None)
        if project is not None and no_project:
            raise UsageError("--project and --no-project cannot be used together")
        if project is not None and not os.path.isdir(project):
            raise UsageError(f"--project {project}: not a folder")
        inputs = [*(in_path or []), *(paths or [])]
        settings = _settings(inputs, config, target, select, ignore, exclude, extend_exclude)
        if distributed is not None:
            settings.distributed = distributed
        if data_parallel is not None:
            settings.data_parallel = data_parallel
        ignorer = _ignorer(settings, not no_gitignore)
        if force_exclude or settings.force_exclude:
            inputs = _without_excluded(inputs, ignorer)
            if inputs == []:
                return _nothing_to_migrate()
        sources = _decision_sources(settings, target, distributed, data_parallel)
        root = None if no_project else _project_root(settings, inputs, project)
        checked = _verify_target(inputs, out, in_place, diff or check, root, ignorer) if verify_output else None
        if _is_single_file(inputs):
            if requirements:
                raise UsageError("--requirements takes a tree run (a folder): it edits the project's requirements")
            index = _single_file_index(inputs[0] if inputs else None, root, ignorer)
            code = _migrate_one(inputs[0] if inputs else None, out, in_place, diff, diff_file, check,
                                settings.target, settings.select, settings.ignore, verbose,
                                settings.distributed, settings.data_parallel, index)
        else:
            if requirements and root is None:
                raise UsageError("--requirements needs a project: one input folder, --project ROOT or a "
                                 "pyproject.toml with [tool.xla-migrate]")
            code = _migrate_tree(inputs, out, in_place, diff, diff_file, check, settings, ignorer,
                                 only_changed, jobs, verbose, root, sources, requirements)
        if checked is not None and code == EXIT_OK:
            code = _verify_written(*checked)
    except UsageError as error:
        _err(f"error: {error}", "red")
        code = EXIT_ERROR
    except KeyboardInterrupt:  # one script: its output is written atomically, or not at all
        _err("interrupted", "red")
        code = EXIT_INTERRUPTED
    except Exception as error:  # a bug in xla-migrate: one line, and the traceback on request
        if os.environ.get("XLA_MIGRATE_DEBUG"):
            raise
        _err(f"error: internal error in xla-migrate ({type(error).__name__}: {error}); "
             "set XLA_MIGRATE_DEBUG=1 for the traceback and please report it", "red")
        code = EXIT_ERROR
    return code


def _verify_target(inputs, out, in_place, dry, root=None, ignorer=None) -> tuple:
    """--verify: (the script to check once written, the original to compare it with (None in place), the two
    trees of a mirror (None for one file), the project root). A tree run checks its project's one entry file
    (a ``__main__`` block or a launcher): decided before anything is written."""
    from ..verify.paths import Trees

    usage = ("--verify checks one written script: pass one input FILE with --out FILE or --in-place, or one "
             "project folder with --out DIR or --in-place")
    if len(inputs) != 1 or inputs[0] == "-" or dry or out == "-" or not (out or in_place):
        raise UsageError(usage)
    if _is_single_file(inputs):
        if not os.path.isfile(inputs[0]) or inputs[0].endswith(".ipynb"):
            raise UsageError(usage)
        project_root = root if root is not None and _single_file_index(inputs[0], root, ignorer) else None
        return (inputs[0], None, None, project_root) if in_place else (out, inputs[0], None, project_root)
    if not os.path.isdir(inputs[0]):
        raise UsageError(usage)
    from ..analysis.project import index_for

    folder = os.path.abspath(inputs[0])
    index = index_for(folder, ignorer)
    entries = sorted(rel for rel, info in index.modules.items() if info.main_block or info.launcher)
    if len(entries) != 1:
        found = ", ".join(entries[:5]) + (" ..." if len(entries) > 5 else "") if entries else "none"
        raise UsageError(f"--verify after a tree run checks the project's entry file (a __main__ block or a "
                         f"launcher), and {inputs[0]} has {len(entries)} ({found}): migrate, then run "
                         f"'xla-migrate verify MIRROR/ENTRY --against {inputs[0]}/ENTRY' for the one to check")
    if in_place:
        return os.path.join(folder, entries[0]), None, None, folder
    mirror = os.path.abspath(out)
    return (os.path.join(mirror, entries[0]), os.path.join(folder, entries[0]),
            Trees(Path(mirror), Path(folder), explicit=True), None)


def _verify_written(script: str, original: Optional[str], trees=None, project_root: Optional[str] = None) -> int:
    """xla-migrate verify on what was just written; its text report goes to stderr with the migration's (stdout
    keeps its one thing: nothing, or the JSON report). A mirror's entry runs with the mirror importable (its
    original with the source tree); a script of a project, with the project's root importable."""
    from ..verify.cli import emit, interrupted
    from ..verify.core import Interrupted, stop_on_signals, verify

    try:
        with stop_on_signals():
            report = verify(script, against=original, python=os.environ.get("XLA_MIGRATE_PYTHON"),
                            original_required=False, trees=trees, project_root=project_root)
    except Interrupted as stop:
        return interrupted(stop)
    emit(report, "text", stream=sys.stderr)
    return report.exit_code


def _without_excluded(inputs: list[str], ignorer) -> list[str]:
    """--force-exclude: drop the named paths the excludes match (stdin and globs are kept)."""
    from .tree import force_excluded

    return [path for path in inputs if path == "-" or not os.path.lexists(path) or not force_excluded(path, ignorer)]


def _nothing_to_migrate() -> int:
    """Every path given was excluded (pre-commit passing only excluded files): nothing to do, exit 0."""
    if not _machine_report([]) and not _OUTPUT["quiet"]:
        _err("0 files: every path given is excluded (--force-exclude)")
    return EXIT_OK


def _ignorer(settings, use_gitignore: bool):
    """ruff's model: ``exclude`` (the defaults unless the config or --exclude replaces them) plus
    ``extend-exclude`` (the config's and --extend-exclude), and ``.gitignore`` unless --no-gitignore."""
    from .config import DEFAULT_EXCLUDE
    from .tree import Ignorer

    if settings.cli_exclude is not None:
        excludes = [(None, settings.cli_exclude)]
    elif settings.exclude is not None:
        excludes = [(settings.config_dir, settings.exclude)]
    else:
        excludes = [(None, list(DEFAULT_EXCLUDE))]
    excludes += [(settings.config_dir, settings.extend_exclude), (None, settings.cli_extend_exclude)]
    ignorer = Ignorer(use_gitignore, excludes)
    if settings.cli_exclude is not None or settings.exclude is not None or any(lines for _, lines in excludes[1:]):
        # The user's patterns compile now, so that a bad one fails here whatever the run.
        try:
            ignorer.excludes
        except ValueError:  # pathspec's pattern errors
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
            except ValueError:
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
    from .tree import GLOB_CHARS, kind_of

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


def _single_file_index(path, root, ignorer):
    """The project index for one script under the project's root (None: the script is migrated alone)."""
    if path is None or path == "-" or root is None or not os.path.isfile(path):
        return None
    try:
        Path(os.path.abspath(path)).relative_to(root)
    except ValueError:
        return None
    from ..analysis.project import index_for

    index = index_for(root, ignorer)
    return index if index.relative(path) is not None else None


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


def _migrate_one(in_path, out, in_place, diff, diff_file, check, target, select, ignore, verbose,
                 distributed=None, data_parallel=None, project=None) -> int:
    if in_path is None:
        raise UsageError("missing PATH: the script, notebook or folder to migrate (see --help)")
    _validate_rules(target, select, ignore, data_parallel)
    destination = _check_paths(in_path, out, in_place, diff, check, diff_file)
    data = _read_input(in_path)
    label_in = "stdin" if in_path == "-" else in_path
    named_out = out if out not in (None, "-") else None
    label_out = named_out or label_in
    result = migrate(data, target=target, select=select or None, ignore=ignore or None,
                     path=label_in, out_path=label_out, distributed=distributed, data_parallel=data_parallel,
                     project=project)
    if result.error is not None:
        if _machine_report([result]) or _OUTPUT["format"] == "github":
            if _OUTPUT["format"] == "json":
                _err(f"error: {result.error.format(label_in)}", "red")
            return EXIT_ERROR
        raise UsageError(result.error.format(label_in))
    warning = result.release_warning(_installed_torch_xla())
    if warning and _OUTPUT["quiet"] < 2:
        _err(warning, "yellow")
    if diff_file:
        _write(Path(diff_file), _diff_bytes(result))
    if diff:
        _print_diff(result)
    if destination == "-":
        sys.stdout.buffer.write(result.output_bytes)
        sys.stdout.flush()
    elif destination is not None and (result.changed or not in_place):
        _write(Path(destination), result.output_bytes, mode_from=None if in_path == "-" else Path(in_path))
    _report(result, f"{label_in} -> {label_out}" if destination not in (None, "-", in_path) else label_in,
            verbose)
    return EXIT_CHANGES if check and result.changed else EXIT_OK


def _migrate_tree(inputs, out, in_place, diff, diff_file, check, settings, ignorer, only_changed, jobs,
                  verbose, root=None, sources=None, requirements=False) -> int:
    from . import tree

    _validate_rules(settings.target, settings.select, settings.ignore, settings.data_parallel)
    if "-" in inputs:
        raise UsageError("stdin ('-') cannot be combined with other inputs")
    if in_place and out is not None:
        raise UsageError("--in-place and --out cannot be used together")
    if out == "-":
        raise UsageError("--out - takes one script; for several inputs use --out DIR, --in-place, --diff or --check")
    if out is None and not (in_place or diff or check or diff_file):
        raise UsageError("nothing to do: pass --out PATH (or --out - for stdout), --in-place, --diff or --check")
    if only_changed and out is None:
        raise UsageError("--only-changed needs --out DIR")
    if jobs is not None and jobs < 1:
        raise UsageError(f"-j {jobs}: needs at least 1 worker")
    single_notebook = (len(inputs) == 1 and os.path.isfile(inputs[0]) and tree.kind_of(inputs[0]) == "notebook")
    mirror = out is not None and not single_notebook
    if mirror:
        if len(inputs) != 1 or not os.path.isdir(inputs[0]):
            raise UsageError(f"--out {out}: mirrors one folder; pass exactly one input folder (or use --in-place)")
        if os.path.exists(out) and not os.path.isdir(out):
            raise UsageError(f"--out {out}: is a file, expected a folder to mirror {inputs[0]} into")
        if not os.path.exists(out) and tree.kind_of(out) != "other":
            raise UsageError(f"--out {out}: names a file, but {inputs[0]} is a folder: --out DIR mirrors it "
                             "(or use --in-place)")
        if os.path.isdir(out) and _same_file(out, inputs[0]):
            raise UsageError(f"--out {out} is the input folder; pass --in-place to rewrite it")
    elif single_notebook and out is not None:
        if os.path.isdir(out):
            raise UsageError(f"--out {out}: is a directory, expected a file path")
        if _same_file(inputs[0], out):
            raise UsageError(f"--out {out} is the input file; pass --in-place to rewrite it")
    try:
        found = tree.discover(inputs, ignorer, {os.path.realpath(out)} if mirror else set())
    except tree.DiscoveryError as error:
        raise UsageError(str(error)) from None
    tasks = _tasks(found, out, mirror, in_place)
    dry = diff or check
    index, index_seconds = None, None
    if root is not None:
        import time

        from ..analysis.project import index_for

        started = time.perf_counter()
        index = index_for(root, ignorer)
        index_seconds = time.perf_counter() - started
    options = tree.Options(settings.target, settings.select or None, settings.ignore or None, settings.distributed,
                           settings.data_parallel,
                           write=not dry,
                           copy_others=not only_changed,
                           want_diff=diff or bool(diff_file) or bool(_OUTPUT["report"]) or _OUTPUT["format"] == "json",
                           project=index)
    try:
        with _progress(len(tasks), _OUTPUT["quiet"]) as progress:
            outcomes = tree.run_all(tasks, options, jobs or os.cpu_count() or 1, progress)
    except tree.Interrupted as stop:
        return _report_interrupted(stop, dry, verbose)
    patch = b"".join(o.diff for o in outcomes)
    project_summary = None
    if index is not None:
        project_summary = _project_summary(outcomes, settings, index, index_seconds, sources or {})
        if requirements:
            from ..report.summary import RequirementsError, add_requirement

            try:
                project_summary.requirements = add_requirement(index.root, _target_spec(settings.target),
                                                               write=not dry) or (
                    f"{index.root}: no requirements.txt or pyproject.toml: nothing to add the torch_xla pin to")
            except RequirementsError as error:
                _err(f"error: {error}", "red")
                return EXIT_ERROR
        _OUTPUT["project"] = project_summary.to_dict()
    if diff_file:
        _write(Path(diff_file), patch)
    if diff:
        _print_patch(patch)
    _report_tree(outcomes, settings.target, dry, verbose, settings.data_parallel, project_summary)
    if any(o.error for o in outcomes):
        return EXIT_ERROR
    return EXIT_CHANGES if check and any(o.changed for o in outcomes) else EXIT_OK


def _target_spec(name: str):
    from ..engine.targets import get_target

    return get_target(name)


def _project_summary(outcomes, settings, index, index_seconds, sources):
    """The summary and the decisions taken once for the project, each with where it came from."""
    from ..report.summary import Decision, summarize

    target = _target_spec(settings.target)
    decisions = {"target": Decision(target.name, sources.get("target", "default"))}
    if settings.distributed is not None:
        distributed = Decision(settings.distributed, sources.get("distributed", "the configuration"))
    else:
        # The process group and the launcher say most; torchrun's variables least.
        rank = {"init_process_group": 0, "DDP": 2, "DistributedDataParallel": 2, "DistributedSampler": 3}
        found = [(rank.get(what, 4 if what.startswith("os.environ") else 1), rel, line, what)
                 for rel, info in index.modules.items() for line, what in info.distributed]
        setup = [f"{rel}:{line} {what}" for _, rel, line, what in sorted(found)]
        if setup:
            shown = ", ".join(setup[:3]) + (f" and {len(setup) - 3} more" if len(setup) > 3 else "")
            distributed = Decision(True, f"detected: {shown}; applied to the modules that import each other")
        else:
            distributed = Decision(False, "detected: no distributed setup in the project")
    decisions["distributed"] = distributed
    if distributed.value:
        form = settings.data_parallel or target.default_data_parallel
        decisions["data_parallel"] = Decision(form, sources.get("data_parallel", f"default for the {target.name} target"))
    return summarize(outcomes, target, decisions, index, index_seconds)


def _tasks(found, out, mirror: bool, in_place: bool):
    from .tree import Task, kind_of

    tasks, seen = [], set()
    for item in sorted(found, key=lambda f: f.path):
        kind = kind_of(item.path)
        if item.explicit and kind == "other":
            kind = "python"  # a script named on the command line, whatever its name
        if mirror:
            tasks.append(Task(item.path, kind, os.path.join(out, item.rel)))
            continue
        if kind == "other":
            continue
        real = os.path.realpath(item.path)
        if real in seen:  # the same file twice (a symlink, or named twice): once is enough
            continue
        seen.add(real)
        tasks.append(Task(item.path, kind, out if out is not None else None, in_place=in_place))
    return tasks


class _progress:
    """A progress bar on stderr for a terminal and more than a few files; nothing when piped."""

    def __init__(self, total: int, quiet: int):
        self.total, self.bar = total, None
        self.show = not quiet and total > 8 and sys.stderr.isatty() and os.environ.get("TERM") != "dumb"

    def __enter__(self):
        if not self.show:
            return None
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("migrating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=Console(stderr=True), transient=True)
        self.task = self.bar.add_task("files", total=self.total)

        def advance(count: int, start: bool = False) -> None:
            if start or not self.bar.live.is_started:
                self.bar.start()
            self.bar.advance(self.task, count)

        return advance

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False


def _print_patch(patch: bytes) -> None:
    if not _colour(sys.stdout):
        sys.stdout.flush()
        sys.stdout.buffer.write(patch)
        sys.stdout.flush()
        return
    for line in patch.decode("utf-8", errors="replace").splitlines(keepends=True):
        colour = "1" if line.startswith(("---", "+++", "diff --git")) else {"+": "32", "-": "31", "@": "36"}.get(line[:1])
        sys.stdout.write(f"\033[{colour}m{line.rstrip(chr(10))}\033[0m\n" if colour else line)
    sys.stdout.flush()


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _as_results(outcomes, target: str) -> list[MigrationResult]:
    """The tree's outcomes as results for the JSON report and annotations (scripts and notebooks only)."""
    from ..engine.records import InputError

    results = []
    for outcome in outcomes:
        if outcome.kind == "other":
            continue
        changed = outcome.changed
        result = MigrationResult(source="", code="\n" if changed else "", target=outcome.target or target,
                                 path=outcome.path, out_path=outcome.out_path,
                                 changes=[c for _, c in outcome.changes], findings=[f for _, f in outcome.findings],
                                 data_parallel=outcome.data_parallel)
        if outcome.releases:
            result.releases = outcome.releases
        if outcome.error:
            result.error = outcome.input_error or InputError(
                outcome.error[len(outcome.path) + 2:] if outcome.error.startswith(outcome.path + ": ")
                else outcome.error)
        result.__dict__["diff"] = outcome.diff.decode("utf-8", errors="replace")  # the cached diff
        results.append(result)
    return results


def _report_tree(outcomes, target: str, dry: bool, verbose: bool, data_parallel: str | None = None,
                 project_summary=None) -> None:
    from ..engine.targets import describe_releases, get_target, parse_version, release_fits

    results = _as_results(outcomes, target)
    if _machine_report(results):
        for outcome in outcomes:  # stdout has the report; errors still say so to a person on stderr
            if outcome.error:
                _err(f"error: {outcome.error}", "red")
        return
    quiet = _OUTPUT["quiet"]
    github = _OUTPUT["format"] == "github"
    _file_lines(outcomes, dry, verbose, records=not github and not _OUTPUT["statistics"])
    if _OUTPUT["statistics"] and quiet < 2:
        _records(results, verbose)
    changed = [o for o in outcomes if o.changed and o.kind != "other"]
    ranges = [o.releases for o in changed if o.releases]
    runs_on = ""
    if ranges:
        low = max(r[0] for r in ranges)
        highs = [r[1] for r in ranges if r[1] is not None]
        high = min(highs) if highs else None
        runs_on = f"; output runs on {describe_releases(low, high)}"
        installed = _installed_torch_xla()
        if installed and not release_fits(parse_version(installed), low, high) and quiet < 2:
            _err(f"warning: torch_xla {installed} is installed here, but the {target} target's output needs "
                 f"{describe_releases(low, high)}", "yellow")
    if quiet:
        return
    if project_summary is not None and not github:
        for line in project_summary.lines(dry):
            _err(line)
    scripts = [o for o in outcomes if o.kind != "other"]
    errors = sum(1 for o in outcomes if o.error)
    changes = sum(len(o.changes) for o in scripts)
    findings = sum(len(o.findings) for o in scripts)
    need = "needs" if findings == 1 else "need"
    form = ""
    if any(o.data_parallel for o in scripts):
        form = f"; data parallel {data_parallel or get_target(target).default_data_parallel}"
    _err(f"{_plural(len(scripts), 'file')}: {len(changed)} {'would change' if dry else 'changed'} "
         f"({_plural(changes, 'change')}), {_plural(findings, 'finding')} {need} a human, "
         f"{_plural(errors, 'error')} (target {target}{form}{runs_on})", "bold")


def _file_lines(outcomes, dry: bool, verbose: bool, records: bool = True) -> None:
    """Per file, in sorted order: its error, its findings (and changes with -v), whether it changed."""
    quiet = _OUTPUT["quiet"]
    for outcome in outcomes:
        if outcome.error:
            _err(f"error: {outcome.error}", "red")
        if quiet >= 2 or _OUTPUT["format"] == "github":
            continue  # the annotations said it; errors and the summary line follow
        if records:
            if verbose:
                for where, change in outcome.changes:
                    _err(f"{where}: {change.code} {change.message}")
            for where, finding in outcome.findings:
                _err(report.finding_text(where, finding), "yellow")
        if outcome.changed and outcome.kind != "other":
            _err(f"{outcome.path}: {'would change' if dry else 'changed'} ({_plural(len(outcome.changes), 'change')})")
        elif verbose and outcome.kind != "other" and not outcome.error:
            _err(f"{outcome.path}: nothing to change")


def _report_interrupted(stop, dry: bool, verbose: bool) -> int:
    """Ctrl-C in a tree run: what finished is reported (and kept on disk), then what was not reached."""
    done = sorted(stop.outcomes, key=lambda o: o.path)
    if _OUTPUT["format"] == "text":
        _file_lines(done, dry, verbose)
    written = sum(1 for o in done if o.written)
    missing = sorted(task.path for task in stop.not_reached)
    what = "nothing written" if dry else f"{_plural(written, 'file')} written"
    _err(f"interrupted: {what}, {_plural(len(missing), 'file')} not reached"
         + (" (run the same command again to finish)" if missing else ""), "red")
    shown = missing if verbose or len(missing) <= 10 else missing[:10]
    for path in shown:
        _err(f"  not reached: {path}")
    if len(shown) < len(missing):
        _err(f"  ... and {len(missing) - len(shown)} more (-v lists them all)")
    return EXIT_INTERRUPTED


def _write(path: Path, data: bytes, mode_from: Optional[Path] = None) -> None:
    try:
        write_atomically(path, data, mode_from=mode_from)
    except OSError as error:
        raise UsageError(f"{path}: cannot write: {error.strerror or error}") from None


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
    "quiet": 0, "verbose": False}
_FAST_VALUES = {"--out": "out", "--diff-file": "diff_file", "--target": "target", "--data-parallel": "data_parallel",
                "--project": "project", "--config": "config", "--format": "output_format", "--report": "report_path"}
_FAST_LISTS = {"--in": "in_path", "--select": "select", "--ignore": "ignore", "--exclude": "exclude",
               "--extend-exclude": "extend_exclude"}
_FAST_FLAGS = {"--in-place": ("in_place", True), "--diff": ("diff", True), "--check": ("check", True),
               "--distributed": ("distributed", True), "--single": ("distributed", False),
               "--force-exclude": ("force_exclude", True), "--no-gitignore": ("no_gitignore", True),
               "--only-changed": ("only_changed", True), "--no-project": ("no_project", True),
               "--requirements": ("requirements", True), "--verify": ("verify_output", True),
               "--statistics": ("statistics", True), "--list-rules": ("list_rules", True),
               "-v": ("verbose", True), "--verbose": ("verbose", True)}


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


class _QuietOnBrokenPipe:
    """A closed stdout or stderr after the run: flushing it says nothing at exit (as click's own wrapper)."""

    def __init__(self, stream):
        self._stream = stream

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as error:
            if error.errno != errno.EPIPE:
                raise

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _run_fast(arguments: dict) -> int:
    """``migrate_command`` as typer's standalone mode runs it: what escapes it ends the same way."""
    try:
        return migrate_command(**arguments)
    except EOFError:
        print(file=sys.stderr)
        print("Aborted!", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except OSError as error:
        if error.errno != errno.EPIPE:
            raise
        sys.stdout, sys.stderr = _QuietOnBrokenPipe(sys.stdout), _QuietOnBrokenPipe(sys.stderr)
        return 1


def run() -> None:
    args = sys.argv[1:]
    arguments = None
    # typer answers shell completion requests and keeps tracebacks' typer frames for XLA_MIGRATE_DEBUG.
    if not os.environ.get("_XLA_MIGRATE_COMPLETE") and not os.environ.get("XLA_MIGRATE_DEBUG"):
        arguments = fast_arguments(args)
    if arguments is None:
        from .typer_app import app

        app(prog_name="xla-migrate")
        return
    sys.exit(_run_fast(arguments))


def __getattr__(name: str):
    """``cli.app`` and ``cli.rule_app``, the typer applications, imported on first use."""
    if name in ("app", "rule_app"):
        from . import typer_app as cli_typer

        return getattr(cli_typer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

