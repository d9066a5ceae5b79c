"""The main command, ``xla-migrate [OPTIONS] PATH...``, on its parsed arguments (``migrate_command``):
one script (or stdin) the original single-file way, or a tree run (folders, globs, several paths, a
notebook) with the project index, worker processes and the project summary; then ``--verify``.

Exit codes: see ``options.py``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

from .. import __version__
from ..api import migrate
from . import output, selection, stdin
from .options import (EXIT_CHANGES, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, FORMATS, STDOUT_FORMATS, UsageError, _check_paths,
                      _decision_sources, _ignorer, _is_single_file, _project_root, _same_file, _settings,
                      _validate_rules, _without_excluded)
from .output import (_OUTPUT, _diff_bytes, _err, _list_rules, _machine_report, _print_diff, _print_patch, _progress,
                     _report, _report_interrupted, _report_tree, _write)


def _read_input(path: str) -> bytes:
    from ..engine.input_checks import TooLarge, read_bounded

    source = Path(path)
    if path != "-" and source.is_dir():
        raise UsageError(f"{path}: is a directory, expected a Python file")
    try:
        return read_bounded(source, sys.stdin.buffer if path == "-" else None)
    except TooLarge as error:
        raise UsageError(f"{'stdin' if path == '-' else path}: {error}") from None
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except OSError as error:
        raise UsageError(f"{path}: cannot read: {error.strerror or error}") from None


def migrate_command(paths, in_path, out, in_place, diff, diff_file, check, target, select, ignore, distributed,
                    data_parallel, exclude, extend_exclude, force_exclude, no_gitignore, only_changed, jobs,
                    project, no_project, requirements, config, output_format, report_path, verify_output,
                    statistics, list_rules, version, quiet, verbose, extend_select=None, extend_ignore=None,
                    exit_non_zero_on_findings=False, safe_only=False, show_settings=False, show_files=False,
                    python=None, stdin_filename=None) -> int:
    """The main command on its parsed arguments (from typer, or from the fast path for a plain run, which
    gives the same ones); returns the exit code."""
    _interrupts_raise()
    if version:
        print(f"xla-migrate {__version__}")
        return EXIT_OK
    try:
        if output_format not in FORMATS:
            raise UsageError(f"--format {output_format}: expected one of {', '.join(FORMATS)}")
        if list_rules:
            if output_format not in ("text", "json"):
                raise UsageError("--list-rules --format: expected text or json")
            _list_rules(output_format)
            return EXIT_OK
        inputs = stdin.stdin_inputs([*(in_path or []), *(paths or [])], stdin_filename)
        out = stdin.default_out(inputs, out, in_place, diff, check, diff_file, output_format, STDOUT_FORMATS)
        if output_format in STDOUT_FORMATS and (diff or out == "-"):
            raise UsageError(f"--format {output_format} prints the report on stdout, where "
                             f"{'--diff' if diff else '--out -'} puts its output: write the report to a file with "
                             "--report PATH instead")
        if statistics and output_format != "text":
            raise UsageError(f"--statistics is a text report; --format {output_format} has every record")
        _OUTPUT.update(format=output_format, report=report_path, quiet=quiet, statistics=statistics, project=None,
                       findings=0)
        if project is not None and no_project:
            raise UsageError("--project and --no-project cannot be used together")
        if project is not None and not os.path.isdir(project):
            raise UsageError(f"--project {project}: not a folder")
        settings = _settings(stdin.named(inputs, stdin_filename), config, target, select, ignore, exclude,
                             extend_exclude)
        _OUTPUT["config"] = settings.config_path
        selection.extend(settings, extend_select, extend_ignore, exit_non_zero_on_findings, safe_only)
        selection.check_codes(settings)
        if verbose and quiet < 2:
            _err(selection.config_line(settings))
        if show_settings:
            selection.show_settings(settings, stdin.named(inputs, stdin_filename))
            return EXIT_OK
        if distributed is not None:
            settings.distributed = distributed
        if data_parallel is not None:
            settings.data_parallel = data_parallel
        ignorer = _ignorer(settings, not no_gitignore)
        if show_files:
            selection.show_files(stdin.named(inputs, stdin_filename) if stdin_filename else inputs, ignorer)
            return EXIT_OK
        passed_through = False  # --force-exclude and an excluded --stdin-filename: stdin comes back unchanged
        if force_exclude or settings.force_exclude:
            if stdin_filename is not None and inputs == ["-"]:
                from .discovery import force_excluded

                passed_through = force_excluded(stdin_filename, ignorer)
            inputs = _without_excluded(inputs, ignorer)
            if inputs == []:
                return _nothing_to_migrate()
        if python is not None and not verify_output:
            raise UsageError("--python names the interpreter --verify runs the script with: pass --verify too")
        sources = _decision_sources(settings, target, distributed, data_parallel)
        root = None if no_project else _project_root(settings, inputs, project)
        checked = _verify_target(inputs, out, in_place, diff or check, root, ignorer) if verify_output else None
        if _is_single_file(inputs):
            if requirements:
                raise UsageError("--requirements takes a tree run (a folder): it edits the project's requirements")
            single = inputs[0] if inputs else None
            name = stdin_filename if single == "-" and stdin_filename else single
            index = _single_file_index(name, root, ignorer)
            ignored = [*settings.ignore, *selection.ignores_for(name or "-", settings.per_file_ignores,
                                                              settings.config_dir)]
            code = _migrate_one(single, out, in_place, diff, diff_file, check,
                                settings.target, settings.select, ignored, verbose,
                                settings.distributed, settings.data_parallel, index, settings.fix_safety,
                                stdin_filename=stdin_filename, passed_through=passed_through, settings=settings)
        else:
            if requirements and root is None:
                raise UsageError("--requirements needs a project: one input folder, --project ROOT or a "
                                 "pyproject.toml with [tool.xla-migrate]")
            code = _migrate_tree(inputs, out, in_place, diff, diff_file, check, settings, ignorer,
                                 only_changed, jobs, verbose, root, sources, requirements)
        if checked is not None and code == EXIT_OK:
            spmd = settings.data_parallel == "spmd"  # one program over devices: check it over several
            code = _verify_written(*checked, python=python, devices=SPMD_VERIFY_DEVICES if spmd else None)
        if code == EXIT_OK and settings.exit_non_zero_on_findings and _OUTPUT.get("findings"):
            code = EXIT_CHANGES  # ruff's --exit-non-zero-on-findings: CI fails while findings need a human
    except UsageError as error:
        _err(f"error: {error}", "red")
        code = EXIT_ERROR
    except KeyboardInterrupt:  # one script: its output is written atomically, or not at all
        _err("interrupted", "red")
        code = EXIT_INTERRUPTED
    except MemoryError:
        _err("error: out of memory (nothing more written); see the size limits in docs/guide.md", "red")
        code = EXIT_ERROR
    except Exception as error:  # noqa: BLE001 - the guards' refusals, else a bug in xla-migrate
        from ..report.guards import Clash

        if not isinstance(error, Clash):
            return _internal_error(error)
        _err(f"error: {error}", "red")
        code = EXIT_ERROR
    return code


def _internal_error(error: Exception) -> int:
    """A bug in xla-migrate: one line, and the traceback on request."""
    if os.environ.get("XLA_MIGRATE_DEBUG"):
        raise error
    _err(f"error: internal error in xla-migrate ({type(error).__name__}: {error}); "
         "set XLA_MIGRATE_DEBUG=1 for the traceback and please report it", "red")
    return EXIT_ERROR


def _interrupts_raise() -> None:
    """From here Ctrl-C raises KeyboardInterrupt, which the command reports (``__main__`` ends the process
    with the same line and status while it starts)."""
    import signal

    try:
        if getattr(signal.getsignal(signal.SIGINT), "xla_migrate_start_up", False):
            signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:  # not the main thread
        pass


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
    from .discovery import index_for

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


# --verify after --data-parallel spmd: the SPMD program runs over this many PJRT CPU devices (verify --devices)
SPMD_VERIFY_DEVICES = 4


def _verify_written(script: str, original: Optional[str], trees=None, project_root: Optional[str] = None,
                    python: Optional[str] = None, devices: Optional[int] = None) -> int:
    """xla-migrate verify on what was just written; its text report goes to stderr with the migration's (stdout
    keeps its one thing: nothing, or the JSON report). A mirror's entry runs with the mirror importable (its
    original with the source tree); a script of a project, with the project's root importable; ``devices``:
    an SPMD script runs as one program over that many CPU devices."""
    from ..verify.cli import emit, interrupted
    from ..verify.core import Interrupted, stop_on_signals, verify

    try:
        with stop_on_signals():
            report = verify(script, against=original, python=python or os.environ.get("XLA_MIGRATE_PYTHON"),
                            original_required=False, trees=trees, project_root=project_root, devices=devices)
    except Interrupted as stop:
        return interrupted(stop)
    emit(report, "text", stream=sys.stderr)
    return report.exit_code


def _nothing_to_migrate() -> int:
    """Every path given was excluded (pre-commit passing only excluded files): nothing to do, exit 0."""
    if not _machine_report([]) and not _OUTPUT["quiet"]:
        _err("0 files: every path given is excluded (--force-exclude)")
    return EXIT_OK


def _single_file_index(path, root, ignorer):
    """The project index for one script under the project's root (None: the script is migrated alone)."""
    if path is None or path == "-" or root is None or not os.path.isfile(path):
        return None
    try:
        Path(os.path.abspath(path)).relative_to(root)
    except ValueError:
        return None
    from .discovery import index_for

    index = index_for(root, ignorer)
    return index if index.relative(path) is not None else None


def _migrate_one(in_path, out, in_place, diff, diff_file, check, target, select, ignore, verbose,
                 distributed=None, data_parallel=None, project=None, fix_safety="all", stdin_filename=None,
                 passed_through=False, settings=None) -> int:
    if in_path is None:
        raise UsageError("missing PATH: the script, notebook or folder to migrate (see --help)")
    _validate_rules(target, select, ignore, data_parallel)
    destination = _check_paths(in_path, out, in_place, diff, check, diff_file)
    from ..report.guards import check_single_outputs

    check_single_outputs(in_path, destination, in_place, diff_file, _OUTPUT["report"], _OUTPUT["config"])
    data = _read_input(in_path)
    label_in = (stdin_filename or "stdin") if in_path == "-" else in_path
    if in_path == "-" and passed_through:
        return stdin.pass_through(data, label_in, destination, _OUTPUT["quiet"])
    if in_path == "-" and stdin.is_notebook(data, stdin_filename):
        return stdin.migrate_notebook(data, label_in, destination, diff, diff_file, check, settings, ignore, verbose)
    named_out = out if out not in (None, "-") else None
    label_out = named_out or label_in
    result = migrate(data, target=target, select=select or None, ignore=ignore or None,
                     path=label_in, out_path=label_out, distributed=distributed, data_parallel=data_parallel,
                     project=project, fix_safety=fix_safety)
    if result.error is not None:
        if _machine_report([result]) or _OUTPUT["format"] == "github":
            if _OUTPUT["format"] in STDOUT_FORMATS:
                _err(f"error: {result.error.format(label_in)}", "red")
            return EXIT_ERROR
        raise UsageError(result.error.format(label_in))
    warning = result.release_warning(output._installed_torch_xla())
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
        _write(Path(destination), result.output_bytes, mode_from=None if in_path == "-" else Path(in_path),
               original=data if in_place else None)
    _report(result, f"{label_in} -> {label_out}" if destination not in (None, "-", in_path) else label_in,
            verbose)
    # An update the xm form leaves unreduced (XLA413, --data-parallel xm asked for) fails the run as --check does.
    return EXIT_CHANGES if (check and result.changed) or result.unreduced_updates else EXIT_OK


def _migrate_tree(inputs, out, in_place, diff, diff_file, check, settings, ignorer, only_changed, jobs,
                  verbose, root=None, sources=None, requirements=False) -> int:
    from . import discovery, tree, workers

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
    single_notebook = (len(inputs) == 1 and os.path.isfile(inputs[0]) and discovery.kind_of(inputs[0]) == "notebook")
    mirror = out is not None and not single_notebook
    if mirror:
        if len(inputs) != 1 or not os.path.isdir(inputs[0]):
            raise UsageError(f"--out {out}: mirrors one folder; pass exactly one input folder (or use --in-place)")
        if os.path.exists(out) and not os.path.isdir(out):
            raise UsageError(f"--out {out}: is a file, expected a folder to mirror {inputs[0]} into")
        if not os.path.exists(out) and discovery.kind_of(out) != "other":
            raise UsageError(f"--out {out}: names a file, but {inputs[0]} is a folder: --out DIR mirrors it "
                             "(or use --in-place)")
        if os.path.isdir(out) and _same_file(out, inputs[0]):
            raise UsageError(f"--out {out} is the input folder; pass --in-place to rewrite it")
    elif single_notebook and out is not None:
        if os.path.isdir(out):
            raise UsageError(f"--out {out}: is a directory, expected a file path")
        if _same_file(inputs[0], out):
            raise UsageError(f"--out {out} is the input file; pass --in-place to rewrite it")
    skipped: list[str] = []
    try:
        found = discovery.discover(inputs, ignorer, {os.path.realpath(out)} if mirror else set(), skipped)
    except discovery.DiscoveryError as error:
        raise UsageError(str(error)) from None
    tasks = _tasks(found, out, mirror, in_place)
    dry = diff or check
    from ..report.guards import check_tree_outputs

    check_tree_outputs(tasks, mirror, not dry, diff_file, _OUTPUT["report"], settings.config_path,
                       root if requirements else None, in_place)
    if _OUTPUT["quiet"] < 2:
        for line in skipped:
            _err(f"warning: {line}", "yellow")
    index, index_seconds = None, None
    if root is not None:
        import time

        from .discovery import index_for

        started = time.perf_counter()
        index = index_for(root, ignorer)
        index_seconds = time.perf_counter() - started
    options = tree.Options(settings.target, settings.select or None, settings.ignore or None, settings.distributed,
                           settings.data_parallel,
                           write=not dry,
                           copy_others=not only_changed,
                           want_diff=diff or bool(diff_file) or bool(_OUTPUT["report"])
                           or _OUTPUT["format"] == "json-report",
                           project=index, per_file_ignores=settings.per_file_ignores,
                           config_dir=settings.config_dir, fix_safety=settings.fix_safety,
                           mirror_root=os.path.realpath(out) if mirror else None)
    try:
        with _progress(len(tasks), _OUTPUT["quiet"]) as progress:
            outcomes = workers.run_all(tasks, options, jobs or os.cpu_count() or 1, progress)
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
    # An update the xm form leaves unreduced (XLA413, --data-parallel xm asked for) fails the run as --check does.
    unreduced = any(f.code == "XLA413" for o in outcomes for _, f in o.findings)
    return EXIT_CHANGES if (check and any(o.changed for o in outcomes)) or unreduced else EXIT_OK


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
            distributed = Decision(True, f"detected: {shown}; applied to the programs that have it: an entry file and the modules it imports")
        else:
            distributed = Decision(False, "detected: no distributed setup in the project")
    decisions["distributed"] = distributed
    if distributed.value:
        requested = settings.data_parallel or target.default_data_parallel
        chosen = sorted({o.data_parallel for o in outcomes if o.data_parallel}) or [requested]
        source = sources.get("data_parallel", f"default for the {target.name} target")
        reasons = sorted({o.data_parallel_reason for o in outcomes if o.data_parallel_reason})
        if reasons:  # --data-parallel auto: what it chose, and why
            source = f"{source}: {'; '.join(reasons)}"
        decisions["data_parallel"] = Decision(", ".join(chosen), source)
    return summarize(outcomes, target, decisions, index, index_seconds)


def _tasks(found, out, mirror: bool, in_place: bool):
    from .discovery import kind_of
    from .tree import Task

    tasks, seen = [], set()
    for item in sorted(found, key=lambda f: f.path):
        kind = kind_of(item.path)
        if item.explicit and kind == "other":
            kind = "python"  # a script named on the command line, whatever its name
        if mirror:
            tasks.append(Task(item.path, kind, os.path.join(out, item.rel), within=item.root))
            continue
        if kind == "other":
            continue
        real = os.path.realpath(item.path)
        if real in seen:  # the same file twice (a symlink, or named twice): once is enough
            continue
        seen.add(real)
        tasks.append(Task(item.path, kind, out if out is not None else None, in_place=in_place, within=item.root))
    return tasks
