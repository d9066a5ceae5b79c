"""The plain run's fast start: ``cli.run`` parses the common command lines itself (no typer) into exactly the
arguments typer gives ``migrate_command``, declines every other command line (typer's turn), and a plain
file run imports nothing it does not use."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import libcst as cst
import pytest
from helpers import CUDA_SCRIPT, run_cli, tree_snapshot
from typer.main import get_command
from typer.testing import CliRunner

from xla_migrate import cli
from xla_migrate.cli import main, options, output
from xla_migrate.engine import pipeline as engine
from xla_migrate.engine.registry import all_rules

# Command lines the fast path takes: every option it knows, in the forms click accepts (--opt VALUE and
# --opt=VALUE, options before, between and after the paths, -q counted), and odd values.
TAKEN = [
    [],
    ["train.py"],
    ["train.py", "--out", "train_xla.py"],
    ["--out", "train_xla.py", "train.py", "-q"],
    ["train.py", "--out=train_xla.py", "-qq"],
    ["train.py", "--out", "-"],
    ["-", "--out", "-", "--quiet", "-q"],
    ["train.py", "--diff", "--check", "--diff-file", "t.diff", "--report", "r.json", "--format", "json-report"],
    ["train.py", "--in-place", "-v", "--statistics", "--target", "2.9", "--data-parallel", "xm"],
    ["--in", "a.py", "--in=b.py", "c.py", "d.py", "--out", "o"],
    ["train.py", "--select", "XLA1", "--select=XLA2,XLA3", "--ignore", "XLA101", "--ignore", "XLA9"],
    ["src", "--exclude", "build/", "--extend-exclude", "gen/", "--extend-exclude=*.pb.py", "--force-exclude"],
    ["src", "--no-gitignore", "--only-changed", "--out", "out", "--no-project", "--requirements"],
    ["train.py", "--distributed", "--project", ".", "--config", "pyproject.toml", "--verbose"],
    ["train.py", "--single", "--list-rules", "--verify", "--out", "x.py"],
    ["train.py", "--format", "github", "-qqq"],
    ["a b.py", "ünï.py", "x=y.py", "", "--out", "with space.py"],
    ["train.py", "--target", "nonsense", "--format", "yaml"],  # values are the command's to judge
    ["-", "--stdin-filename", "nb.ipynb", "--diff"],
    ["--stdin-filename=src/t.py", "--check"],
]

# Command lines left to typer: help, --version among other arguments, -j (an int), a repeated option or
# flag, a value that starts with '-', '--', an unknown or abbreviated option, a flag given a value,
# grouped short flags, a missing value.
DECLINED = [
    ["--help"], ["-h"], ["train.py", "--version"], ["train.py", "-j", "2"], ["train.py", "--jobs=2"],
    ["train.py", "--out", "a.py", "--out", "b.py"], ["train.py", "--diff", "--diff"], ["train.py", "-v", "-v"],
    ["train.py", "--distributed", "--single"], ["train.py", "--out", "-x.py"], ["train.py", "--out=-x.py"],
    ["train.py", "--out="], ["--", "train.py"], ["train.py", "--bogus"], ["train.py", "--ou", "x.py"],
    ["train.py", "--diff=yes"], ["train.py", "-qv"], ["train.py", "--out"], ["-x.py"],
]


def _typer_arguments(argv: list[str], monkeypatch) -> dict:
    """What typer passes ``migrate_command`` for ``argv``."""
    seen: list[dict] = []
    monkeypatch.setattr(main, "migrate_command", lambda **arguments: seen.append(arguments) or 0)
    result = CliRunner().invoke(cli.app, argv)
    assert result.exit_code == 0, result.output
    assert len(seen) == 1
    return seen[0]


@pytest.mark.parametrize("argv", TAKEN, ids=" ".join)
def test_fast_path_gives_typer_s_arguments(argv, monkeypatch):
    fast = options.fast_arguments(argv)
    assert fast is not None
    expected = _typer_arguments(argv, monkeypatch)
    assert fast == expected
    assert {k: type(v) for k, v in fast.items()} == {k: type(v) for k, v in expected.items()}


@pytest.mark.parametrize("argv", DECLINED, ids=" ".join)
def test_fast_path_declines_what_typer_must_judge(argv):
    assert options.fast_arguments(argv) is None


def test_fast_tables_agree_with_the_typer_declarations():
    """Each option the fast path knows is typer's, for the same parameter and of the same kind; the
    defaults are the command's parameters, all of them."""
    # typer's own completion options (--install-completion, --show-completion) never reach the command.
    params = {param.name: param for param in get_command(cli.app).params
              if param.name not in ("install_completion", "show_completion")}
    assert set(options._DEFAULTS) == set(params) == set(inspect.signature(main.migrate_command).parameters)
    by_option = {opt: param for param in params.values() for opt in [*param.opts, *param.secondary_opts]}
    for option, key in options._FAST_VALUES.items():
        param = by_option[option]
        assert (param.name, param.multiple, getattr(param, "is_flag", False)) == (key, False, False), option
    for option, key in options._FAST_LISTS.items():
        assert (by_option[option].name, by_option[option].multiple) == (key, True), option
    for option, (key, value) in options._FAST_FLAGS.items():
        param = by_option[option]
        assert param.name == key and param.is_flag, option
        assert value is (option not in param.secondary_opts), option
    assert by_option["-q"].name == by_option["--quiet"].name == "quiet" and by_option["-q"].count


def _scratch(tmp_path):
    tmp_path.mkdir()
    (tmp_path / "train.py").write_text(CUDA_SCRIPT)
    (tmp_path / "clean.py").write_text("x = 1\n")
    (tmp_path / "bad.py").write_text("def f(:\n")
    return tmp_path


# Run as a user runs them: once down the fast path, once through typer (XLA_MIGRATE_DEBUG sends every
# command line there; it only changes what an internal error prints, and none of these has one).
END_TO_END = [
    ["train.py", "--out", "train_xla.py"],
    ["train.py", "--out", "-"],
    ["train.py", "--diff", "-v"],
    ["train.py", "--check", "-q"],
    ["clean.py", "--check"],
    ["train.py", "--in-place", "--statistics"],
    ["train.py", "--diff-file", "t.diff", "--format", "json-report", "--target", "2.9"],
    ["train.py", "--out", "o.py", "--format", "github", "--select", "XLA1"],
    ["train.py", "--out", "o.py", "--select", "XLA999"],
    ["missing.py", "--out", "o.py"],
    ["bad.py", "--out", "o.py"],
    ["train.py"],
    ["train.py", "--out", "train.py"],
    ["--out", "o.py"],
    [".", "--out", "mirror"],
    ["train.py", "--list-rules", "--format", "json"],
]


@pytest.mark.parametrize("argv", END_TO_END, ids=" ".join)
def test_fast_path_runs_as_typer_does(argv, tmp_path):
    assert options.fast_arguments(argv) is not None
    runs = []
    for env in ({}, {"XLA_MIGRATE_DEBUG": "1"}):
        folder = _scratch(tmp_path / str(len(runs)))
        done = run_cli(*argv, cwd=folder, env=env)
        runs.append((done.returncode, done.stdout, done.stderr, tree_snapshot(folder)))
    assert runs[0] == runs[1]


def test_plain_run_imports_no_unused_library(tmp_path):
    """typer (and pydantic under it), rich, unidiff, nbformat, the verifier, the notebook support, the tree
    summary, the excludes' pathspec, importlib.metadata (torch_xla is not installed here) and difflib (no
    diff asked for) wait for a run that uses them."""
    (tmp_path / "train.py").write_text(CUDA_SCRIPT)
    probe = ("import json, sys; sys.argv = ['xla-migrate', 'train.py', '--out', 'train_xla.py']\n"
             "from xla_migrate.__main__ import main\n"
             "try:\n    main()\nexcept SystemExit as stop:\n    code = stop.code\n"
             "print(json.dumps([code, sorted(sys.modules)]))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    code, modules = json.loads(done.stdout)
    assert code == 0, done.stderr
    assert (tmp_path / "train_xla.py").read_text() != CUDA_SCRIPT and "libcst" in modules
    unused = {"typer", "click", "pydantic", "rich", "unidiff", "nbformat", "xla_migrate.cli.typer_app",
              "xla_migrate.verify.core", "xla_migrate.cli.notebooks", "xla_migrate.cli.workers", "xla_migrate.report.summary",
              "pathspec", "importlib.metadata", "email", "difflib"}
    assert not unused & {name for module in modules for name in (module, module.split(".")[0])}


def _handled_by_dir(rule_class: type, prefix: str) -> tuple[str, ...]:
    """The definition _handled_node_types replaced: every name dir() lists."""
    names = [name[len(prefix):] for name in dir(rule_class) if name.startswith(prefix)
             and getattr(rule_class, name) is not getattr(cst.BatchableCSTVisitor, name, None)]
    return tuple(n for n in names if isinstance(getattr(cst, n, None), type))


def test_handled_node_types_are_those_dir_lists():
    for rule in all_rules():
        for prefix in ("visit_", "leave_"):
            assert engine._handled_node_types(rule, prefix) == _handled_by_dir(rule, prefix), (rule, prefix)
    assert any(engine._handled_node_types(rule, "leave_") for rule in all_rules())


def _dist_info(folder, name: str, version: str) -> None:
    info = folder / name
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch_xla\nVersion: {version}\n")


@pytest.mark.parametrize("name", ["torch_xla-9.1.dist-info", "Torch_XLA-9.1.dist-info", "torch-xla-9.1.dist-info",
                                  "torch.xla-9.1.egg-info"])
def test_installed_torch_xla_is_what_importlib_metadata_finds(name, tmp_path, monkeypatch):
    from importlib import metadata

    assert not output._may_have_torch_xla() and output._installed_torch_xla() is None  # none in the test envs
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version("torch_xla")
    _dist_info(tmp_path / "site", name, "9.1")
    (tmp_path / "site" / "torch_xlb-1.0.dist-info").mkdir()
    monkeypatch.setattr(sys, "path", [*sys.path, str(tmp_path / "site")])
    try:
        found = metadata.version("torch_xla")
    except metadata.PackageNotFoundError:
        found = None  # torch-xla-9.1.dist-info: a distribution named "torch"
    assert found == (None if name.startswith("torch-xla") else "9.1")
    assert output._may_have_torch_xla() and output._installed_torch_xla() == found


def test_installed_torch_xla_asks_importlib_metadata_for_what_it_cannot_list(tmp_path, monkeypatch):
    archive = tmp_path / "packages.zip"
    archive.write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip archive
    monkeypatch.setattr(sys, "path", [*sys.path, str(archive)])
    assert output._may_have_torch_xla()
    monkeypatch.setattr(sys, "path", sys.path[:-1])

    class Finder:
        @staticmethod
        def find_distributions(context=None):
            return iter(())

    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, Finder])
    assert output._may_have_torch_xla()


def test_a_bad_exclude_pattern_fails_a_single_file_run_as_before(tmp_path):
    """The excludes are compiled when first used, except the user's, compiled at once: a bad one stops a
    single-file run, which does not use them, as it always did."""
    (tmp_path / "train.py").write_text(CUDA_SCRIPT)
    for option in ("--exclude", "--extend-exclude"):
        done = run_cli("train.py", "--out", "o.py", option, "!", cwd=tmp_path)
        assert done.returncode == 2
        assert done.stderr == f"error: {option}: '!' is not a valid gitignore pattern\n".encode()
        assert not (tmp_path / "o.py").exists()
    (tmp_path / "pyproject.toml").write_text('[tool.xla-migrate]\nextend-exclude = ["!"]\n')
    done = run_cli("train.py", "--out", "o.py", cwd=tmp_path)
    assert done.returncode == 2
    config = tmp_path / "pyproject.toml"
    assert done.stderr == f"error: extend-exclude in {config}: '!' is not a valid gitignore pattern\n".encode()


def _uses_attribute_hooks_by_dir(visitor_type: type) -> bool:
    """The definition walk._uses_attribute_hooks replaced: every name dir() lists."""
    if (visitor_type.on_visit_attribute is not cst.CSTVisitor.on_visit_attribute
            or visitor_type.on_leave_attribute is not cst.CSTVisitor.on_leave_attribute):
        return True
    for name in dir(visitor_type):
        prefix, _, rest = name.partition("_")
        if prefix in ("visit", "leave") and "_" in rest and getattr(visitor_type, name) is not getattr(
                cst.CSTVisitor, name, None):
            return True
    return False


def test_attribute_hooks_are_found_as_dir_finds_them():
    from xla_migrate.engine import context
    from xla_migrate.analysis import steps
    from xla_migrate.syntax import walk  # noqa: F401 - their visitors are among those checked

    class Hooked(cst.CSTVisitor):
        def visit_Call_func(self, node) -> None:
            pass

    class Inherits(Hooked):
        pass

    visitors, pending = set(), [cst.CSTVisitor]
    while pending:
        for subclass in pending.pop().__subclasses__():
            visitors.add(subclass)
            pending.append(subclass)
    assert {Hooked, Inherits} <= visitors and len(visitors) > 10
    for visitor in visitors:
        assert walk._uses_attribute_hooks(visitor) == _uses_attribute_hooks_by_dir(visitor), visitor
    assert walk._uses_attribute_hooks(Inherits) and not walk._uses_attribute_hooks(cst.CSTVisitor)
