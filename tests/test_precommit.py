"""The pre-commit hooks in .pre-commit-hooks.yaml, run by pre-commit itself on a temporary git repository.

The hooks are declared `language: python` (pre-commit builds a virtual environment from this repository);
here they run as `language: system` against the xla-migrate installed in this environment, so the test
needs no network: the entry, the file types and the way pre-commit passes files are the real ones."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import CUDA_SCRIPT, NO_CUDA_SCRIPT

from xla_migrate import migrate

ROOT = Path(__file__).resolve().parent.parent
PRE_COMMIT = Path(sys.executable).with_name("pre-commit")
if not PRE_COMMIT.exists() or shutil.which("git") is None:
    # The test extra installs pre-commit, so CI always runs these tests; a local run without it says why.
    missing = "pre-commit or git not installed: pip install -e '.[test]'"
    if os.environ.get("CI"):
        raise RuntimeError(missing)
    pytest.skip(missing, allow_module_level=True)
import yaml  # noqa: E402  (comes with pre-commit)


def hooks() -> dict[str, dict]:
    return {hook["id"]: hook for hook in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def run_hook(tmp_path: Path, hook_id: str, files: dict[str, str], args: list[str] | None = None,
             only: list[str] | None = None) -> subprocess.CompletedProcess:
    """pre-commit on a fresh repository holding ``files``: ``--all-files``, or ``--files`` for ``only``
    (as when one changed file is committed); ``args`` as a user writes them in .pre-commit-config.yaml."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    hook = {**hooks()[hook_id], "language": "system"}
    if args is not None:
        hook["args"] = args
    (repo / ".pre-commit-config.yaml").write_text(yaml.safe_dump({"repos": [{"repo": "local", "hooks": [hook]}]}))
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", ".")
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "cache"), "NO_COLOR": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    which = ["--files", *only] if only is not None else ["--all-files"]
    return subprocess.run([str(PRE_COMMIT), "run", *which, "--color", "never"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300)


def test_hooks_file_declares_the_hooks():
    declared = hooks()
    # Files are passed positionally after the entry and the user's args, so the entry ends in an option.
    assert declared["xla-migrate-check"]["entry"] == "xla-migrate --check --force-exclude"
    assert declared["xla-migrate"]["entry"] == "xla-migrate --in-place --force-exclude"
    for hook in declared.values():
        assert hook["language"] == "python" and set(hook["types_or"]) == {"python", "jupyter"}


def test_hook_args_reach_the_command(tmp_path):
    done = run_hook(tmp_path, "xla-migrate", {"train.py": CUDA_SCRIPT, "lib/model.py": CUDA_SCRIPT},
                    args=["--target", "2.9"])
    assert done.returncode == 1, done.stdout + done.stderr  # files were modified
    for name in ("train.py", "lib/model.py"):
        assert (tmp_path / "repo" / name).read_bytes() == migrate(CUDA_SCRIPT, target="2.9").output_bytes
    assert "target 2.9" in done.stdout


def test_check_hook_args_with_select(tmp_path):
    done = run_hook(tmp_path, "xla-migrate-check", {"train.py": CUDA_SCRIPT}, args=["--select", "XLA2", "-q"])
    assert done.returncode == 0, done.stdout + done.stderr  # no XLA2xx rule applies to this script


def test_excluded_files_stay_excluded_when_pre_commit_names_them(tmp_path):
    """pre-commit passes each changed file by name; --force-exclude in the hook keeps the excludes."""
    config = "[tool.xla-migrate]\nextend-exclude = [\"legacy/\"]\n"
    files = {"pyproject.toml": config, "train.py": CUDA_SCRIPT, "legacy/old.py": CUDA_SCRIPT,
             "build/generated.py": CUDA_SCRIPT}
    done = run_hook(tmp_path, "xla-migrate", files)
    assert done.returncode == 1, done.stdout + done.stderr
    repo = tmp_path / "repo"
    assert (repo / "train.py").read_bytes() == migrate(CUDA_SCRIPT).output_bytes
    assert (repo / "legacy" / "old.py").read_text() == CUDA_SCRIPT  # extend-exclude
    assert (repo / "build" / "generated.py").read_text() == CUDA_SCRIPT  # a default exclude


def test_check_hook_passes_when_only_excluded_files_changed(tmp_path):
    files = {"pyproject.toml": "[tool.xla-migrate]\nextend-exclude = [\"legacy/\"]\n", "legacy/old.py": CUDA_SCRIPT}
    done = run_hook(tmp_path, "xla-migrate-check", files, only=["legacy/old.py"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Passed" in done.stdout


def test_check_hook_fails_on_cuda_code_and_writes_nothing(tmp_path):
    done = run_hook(tmp_path, "xla-migrate-check", {"train.py": CUDA_SCRIPT, "lib/clean.py": NO_CUDA_SCRIPT,
                                                     "notes.txt": "cuda\n"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Failed" in done.stdout and "train.py: would change (3 changes)" in done.stdout
    assert (tmp_path / "repo" / "train.py").read_text() == CUDA_SCRIPT


def test_check_hook_passes_on_clean_code(tmp_path):
    done = run_hook(tmp_path, "xla-migrate-check", {"a.py": NO_CUDA_SCRIPT, "b/c.py": NO_CUDA_SCRIPT})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Passed" in done.stdout


def test_fix_hook_rewrites_and_fails_the_commit(tmp_path):
    done = run_hook(tmp_path, "xla-migrate", {"train.py": CUDA_SCRIPT, "clean.py": NO_CUDA_SCRIPT})
    assert done.returncode == 1  # pre-commit fails a hook that modified files
    assert (tmp_path / "repo" / "train.py").read_bytes() == migrate(CUDA_SCRIPT).output_bytes
    assert (tmp_path / "repo" / "clean.py").read_text() == NO_CUDA_SCRIPT
