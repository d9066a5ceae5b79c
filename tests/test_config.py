"""[tool.xla-migrate] in pyproject.toml: found walking up from the input, flags win, --config, bad keys."""

from __future__ import annotations

import pytest
from helpers import CUDA_SCRIPT, tree_snapshot
from typer.testing import CliRunner

from xla_migrate import cli, migrate
from xla_migrate.cli import main

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(cli.app, list(args))


@pytest.fixture
def repo(tmp_path):
    (tmp_path / "proj" / "code" / "legacy").mkdir(parents=True)
    (tmp_path / "proj" / "code" / "train.py").write_text(CUDA_SCRIPT)
    (tmp_path / "proj" / "code" / "legacy" / "old.py").write_text(CUDA_SCRIPT)
    return tmp_path / "proj"


def write_config(folder, body: str):
    (folder / "pyproject.toml").write_text(f"[project]\nname = 'x'\n\n[tool.xla-migrate]\n{body}\n")


def test_config_above_the_input_sets_target_and_exclude(repo):
    write_config(repo, 'target = "2.9"\nexclude = ["code/legacy/"]')
    result = invoke("--in", str(repo / "code"), "--in-place")
    assert result.exit_code == 0, result.stderr
    # The 2.9 spelling (a tree run migrates train.py as its project's entry file, so it also gets XLA315's
    # compile cache, which the library gives a script alone only when it has a loop or a __main__ block).
    migrated = (repo / "code" / "train.py").read_bytes()
    assert b"device = torch_xla.device()" in migrated and b"xm.xla_device" not in migrated
    assert (repo / "code" / "legacy" / "old.py").read_text() == CUDA_SCRIPT
    assert "target 2.9" in result.stderr


def test_config_applies_to_a_single_file_and_flags_win(repo):
    write_config(repo, 'target = "2.9"')
    script = repo / "code" / "train.py"
    assert "torch_xla.device()" in invoke("--in", str(script), "--out", "-").stdout
    assert "xm.xla_device()" in invoke("--in", str(script), "--out", "-", "--target", "sagemaker").stdout


def test_config_ignore_and_select(repo):
    write_config(repo, 'ignore = ["XLA1"]')
    result = invoke("--in", str(repo / "code" / "train.py"), "--out", "-")
    assert result.exit_code == 0 and result.stdout == CUDA_SCRIPT
    flag = invoke("--in", str(repo / "code" / "train.py"), "--out", "-", "--ignore", "XLA2")
    assert "xla_device" in flag.stdout  # --ignore on the command line replaces the config's list


def test_explicit_config_path(repo, tmp_path):
    other = tmp_path / "elsewhere"
    other.mkdir()
    write_config(other, 'target = "2.9"')
    result = invoke("--in", str(repo / "code" / "train.py"), "--out", "-", "--config", str(other / "pyproject.toml"))
    assert result.exit_code == 0 and "torch_xla.device()" in result.stdout


def test_nearest_section_wins_and_sectionless_files_are_skipped(repo):
    write_config(repo, 'target = "2.9"')
    (repo / "code" / "pyproject.toml").write_text("[project]\nname = 'inner'\n")  # no [tool.xla-migrate]
    assert "torch_xla.device()" in invoke("--in", str(repo / "code" / "train.py"), "--out", "-").stdout


@pytest.mark.parametrize(("body", "message"), [
    ('targett = "2.9"', "unknown key in [tool.xla-migrate]: targett (known: target, select, ignore, exclude, "
                        "extend-exclude, force-exclude, distributed, data-parallel, extend-select, extend-ignore, "
                        "per-file-ignores, exit-non-zero-on-findings, fix-safety)"),
    # TOML reads 2.9 as a float (and 2.10 as 2.1): a wrong type, as the guide says, not a target.
    ('target = 2.9', '[tool.xla-migrate] target must be a string such as "2.9" (got a float: quote it)'),
    ('target = 3', '[tool.xla-migrate] target must be a string such as "2.9" (got an integer: quote it)'),
    ('extend-exclude = 1', "[tool.xla-migrate] extend-exclude must be a list of strings"),
    ('force-exclude = "yes"', "[tool.xla-migrate] force-exclude must be true or false"),
    ('select = 3', "[tool.xla-migrate] select must be a list of strings"),
    ('distributed = "yes"', "[tool.xla-migrate] distributed must be true or false"),
    ('target = "1.0"', "unknown target"),
    ('select = ["XLA8"]', "unknown rule code or prefix: XLA8"),
    ('target = ', "not valid TOML"),
])
def test_bad_config_is_one_line_exit_2(repo, body, message):
    write_config(repo, body)
    before = tree_snapshot(repo)
    result = invoke("--in", str(repo / "code"), "--in-place")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert tree_snapshot(repo) == before


def test_missing_config_path(repo):
    result = invoke("--in", str(repo / "code"), "--check", "--config", str(repo / "nope.toml"))
    assert result.exit_code == 2 and result.stderr.strip() == f"error: {repo / 'nope.toml'}: no such file"


@pytest.mark.parametrize(("config", "flags", "expected"), [
    ("", [], None), ("distributed = true", [], True), ("distributed = true", ["--single"], False),
    ("", ["--distributed"], True)])
def test_distributed_reaches_the_engine(repo, monkeypatch, config, flags, expected, tmp_path):
    from xla_migrate import api

    log = tmp_path / "seen.log"  # a tree run migrates in worker processes (forked: they inherit the spy)
    real = api.migrate

    def spy(*args, **kwargs):
        with open(log, "a") as handle:
            handle.write(f"{kwargs.get('distributed')}\n")
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "migrate", spy)
    monkeypatch.setattr(main, "migrate", spy)
    write_config(repo, config)
    assert invoke("--in", str(repo / "code" / "train.py"), "--check", *flags).exit_code == 1  # one file
    assert invoke("--in", str(repo / "code"), "--check", "-j", "1", *flags).exit_code == 1  # a tree
    assert log.read_text().split() == [str(expected)] * 3


def test_force_exclude_from_the_config(repo):
    write_config(repo, 'extend-exclude = ["code/legacy/"]\nforce-exclude = true')
    old = repo / "code" / "legacy" / "old.py"
    result = invoke(str(old), str(repo / "code" / "train.py"), "--in-place")
    assert result.exit_code == 0, result.stderr
    assert old.read_text() == CUDA_SCRIPT and "xla_device" in (repo / "code" / "train.py").read_text()
