"""The command line's typer declarations: ``xla-migrate [OPTIONS] PATH...`` (the options, their help, and
click's parsing of them) and ``xla-migrate rule CODE``. The main command itself is ``main.migrate_command``.

Importing typer and letting it parse cost more than migrating a small file, so a plain run does neither:
``xla_migrate.cli.run`` parses the common command lines itself into the same arguments (tests/test_cli_fast.py
compares the two) and comes here for everything else (``--help``, a usage error, an option it does not take).
"""

from __future__ import annotations

from typing import Optional

import typer

from ..engine.targets import DEFAULT_TARGET, TARGETS
from . import main
from .options import EXIT_ERROR, HELP
from .output import _err

app = typer.Typer(add_completion=True, rich_markup_mode=None, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]})


@app.command(help=HELP)
def command(
    paths: Optional[list[str]] = typer.Argument(None, metavar="PATH", show_default=False, hidden=True),
    in_path: Optional[list[str]] = typer.Option(None, "--in", metavar="PATH", help="A PATH given as an option (repeatable; the same as listing it)."),
    out: Optional[str] = typer.Option(None, "--out", metavar="PATH", help="Where to write the migrated script ('-' for stdout), or the folder that mirrors an input folder."),
    in_place: bool = typer.Option(False, "--in-place", help="Rewrite the input files themselves (only those that change)."),
    diff: bool = typer.Option(False, "--diff", help="Dry run: print the unified diff on stdout, write nothing."),
    diff_file: Optional[str] = typer.Option(None, "--diff-file", metavar="PATH", help="Also write the unified diff to PATH."),
    check: bool = typer.Option(False, "--check", help="Exit 1 if anything would change; write nothing."),
    target: Optional[str] = typer.Option(None, "--target", metavar="NAME", help=f"torch_xla API generation to emit: {', '.join(TARGETS)} (default {DEFAULT_TARGET})."),
    select: Optional[list[str]] = typer.Option(None, "--select", metavar="CODES", help="Only these rule codes or prefixes (comma-separated)."),
    ignore: Optional[list[str]] = typer.Option(None, "--ignore", metavar="CODES", help="Skip these rule codes or prefixes (comma-separated)."),
    distributed: Optional[bool] = typer.Option(None, "--distributed/--single", help="Migrate as a multi-replica (distributed) or a single-device script (default: detected per script)."),
    data_parallel: Optional[str] = typer.Option(None, "--data-parallel", metavar="FORM", help="Form of a distributed script: auto (the default: xm where every update is shown reduced once and the replicas start equal, else ddp; the report says why), ddp (torch.distributed and DDP on the xla process group) xm (the seeds' recipe: xm.optimizer_step, xmp.spawn; exit 1 if an update stays unreduced) or, on --target 2.9, spmd (one SPMD program over a device mesh, the batch sharded)."),
    exclude: Optional[list[str]] = typer.Option(None, "--exclude", metavar="PATTERN", help="Skip paths matching this gitignore-style pattern, in place of the default excludes (.venv/, build/, node_modules/...) and the config's exclude (repeatable)."),
    extend_exclude: Optional[list[str]] = typer.Option(None, "--extend-exclude", metavar="PATTERN", help="Skip these paths as well as the default or configured excludes (repeatable)."),
    force_exclude: bool = typer.Option(False, "--force-exclude", help="Apply the excludes to paths named on the command line too (as pre-commit passes them)."),
    no_gitignore: bool = typer.Option(False, "--no-gitignore", help="Also migrate files that .gitignore ignores."),
    only_changed: bool = typer.Option(False, "--only-changed", help="With --out DIR: write only the files that change."),
    jobs: Optional[int] = typer.Option(None, "-j", "--jobs", metavar="N", help="Worker processes for many files (default: the CPU count)."),
    project: Optional[str] = typer.Option(None, "--project", metavar="ROOT", help="Migrate as part of the project (repository) at ROOT: helpers in other modules, entry files and the distributed decision are taken from the whole project, so file-by-file runs agree with a tree run (default: the folder of the pyproject.toml with [tool.xla-migrate], or the one input folder)."),
    no_project: bool = typer.Option(False, "--no-project", help="Migrate every file alone, as if it were the whole program."),
    requirements: bool = typer.Option(False, "--requirements", help="Tree run: add the target's torch_xla pin to the project's requirements.txt or pyproject.toml [project] dependencies."),
    config: Optional[str] = typer.Option(None, "--config", metavar="PATH", help="Read [tool.xla-migrate] from this pyproject.toml (default: the nearest one above the input)."),
    output_format: str = typer.Option("text", "--output-format", "--format", metavar="FORMAT", help="Report format: text (stderr); on stdout (not with --diff or --out -: use --report): json (ruff's flat list of diagnostics), json-report (the nested per-file report), sarif (SARIF 2.1.0) or github (workflow annotations). With --list-rules: text or json."),
    report_path: Optional[str] = typer.Option(None, "--report", metavar="PATH", help="Also write the JSON report to PATH."),
    verify_output: bool = typer.Option(False, "--verify", help="After writing one script, run 'xla-migrate verify' on it (against the input with --out); its report on stderr, its exit code. With --data-parallel spmd it runs over 4 PJRT CPU devices (verify --devices 4)."),
    statistics: bool = typer.Option(False, "--statistics", help="Count the changes and findings per rule code instead of listing each."),
    list_rules: bool = typer.Option(False, "--list-rules", help="List every code; 'xla-migrate rule CODE' prints its page."),
    version: bool = typer.Option(False, "--version", help="Print the version and exit."),
    quiet: int = typer.Option(0, "-q", "--quiet", count=True, show_default=False, help="Leave out the summary line; -qq: print errors only."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Also list every change, and say which pyproject.toml the run read."),
    extend_select: Optional[list[str]] = typer.Option(None, "--extend-select", metavar="CODES", help="Add these codes to --select or the configured select (comma-separated; ALL: every rule)."),
    extend_ignore: Optional[list[str]] = typer.Option(None, "--extend-ignore", metavar="CODES", help="Skip these codes as well as the ignored ones (comma-separated)."),
    exit_non_zero_on_findings: bool = typer.Option(False, "--exit-non-zero-on-findings", help="Exit 1 while findings need a human (for CI), as ruff's flag of that name."),
    safe_only: bool = typer.Option(False, "--safe-only", help="Only the rules whose fix is safe edit; those labelled review report what they would change (config: fix-safety = \"safe\")."),
    show_settings: bool = typer.Option(False, "--show-settings", help="Print the resolved settings (and the pyproject.toml read) and exit."),
    show_files: bool = typer.Option(False, "--show-files", help="Print the files the run would migrate and exit."),
    stdin_filename: Optional[str] = typer.Option(None, "--stdin-filename", metavar="NAME", help="The name of the code read from stdin ('-'): the diff headers, the configuration and per-file-ignores that apply, --force-exclude, and a notebook by its .ipynb."),
    python: Optional[str] = typer.Option(None, "--python", metavar="PY", help="With --verify: the interpreter with torch_xla to run the script with (default: $XLA_MIGRATE_PYTHON, else this one)."),
) -> None:
    arguments = dict(locals())  # first, so that it holds the parameters only
    raise typer.Exit(main.migrate_command(**arguments))


# xla-migrate rule CODE -------------------------------------------------------------------------------------
rule_app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False,
                       context_settings={"help_option_names": ["-h", "--help"]})


@rule_app.command(help="Print a rule's documentation (what it does, why, an example), as ruff's 'rule'.")
def rule(
    code: str = typer.Argument(..., metavar="CODE", help="A rule code (XLA101) or name (cuda-device-to-xla).", show_default=False),
    output_format: str = typer.Option("text", "--format", metavar="FORMAT", help="text (Markdown) or json."),
) -> None:
    from ..report.ruledocs import docs_path, find_rule, rule_page, rule_record

    found = find_rule(code)
    if output_format not in ("text", "json"):
        _err(f"error: --format {output_format}: expected text or json", "red")
        raise typer.Exit(EXIT_ERROR)
    if found is None:
        _err(f"error: unknown rule: {code} (xla-migrate --list-rules lists them)", "red")
        raise typer.Exit(EXIT_ERROR)
    if output_format == "json":
        import json

        print(json.dumps({**rule_record(found), "explanation": "\n".join(rule_page(found)).rstrip() + "\n"},
                         indent=2))
        return
    print("\n".join(rule_page(found)).rstrip())
    print(f"\nWith golden examples: {docs_path(found)} in the xla-migrate repository.")
