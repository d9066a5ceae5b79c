"""The diff applies with git apply and patch -p1 and gives exactly the written output."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from helpers import CUDA_SCRIPT

from xla_migrate import migrate
from xla_migrate.report.diff import diff_stats, split_lines, unified_diff

VARIANTS = {
    "lf": CUDA_SCRIPT.encode(),
    "crlf": CUDA_SCRIPT.replace("\n", "\r\n").encode(),
    "no-final-newline": CUDA_SCRIPT.rstrip("\n").encode(),
    "bom": b"\xef\xbb\xbf" + CUDA_SCRIPT.encode(),
    "cookie-latin1": ("# -*- coding: latin-1 -*-\n# caf\u00e9\n" + CUDA_SCRIPT).encode("latin-1"),
}


def _write_diff(tmp_path, name: str, out_name: str, data: bytes) -> tuple[bytes, bytes]:
    (tmp_path / name).write_bytes(data)
    result = migrate(data, path=name, out_path=out_name)
    assert result.changed
    encoding = "utf-8" if result.encoding == "utf-8-sig" else result.encoding
    return result.diff.encode(encoding), result.output_bytes


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("tool", ["git", "patch"])
def test_diff_applies_to_give_the_output(tmp_path, variant, tool):
    if shutil.which(tool) is None:
        pytest.fail(f"{tool} is needed by this test")
    diff, output = _write_diff(tmp_path, "train.py", "train_xla.py", VARIANTS[variant])
    (tmp_path / "change.diff").write_bytes(diff)
    command = ["git", "apply", "change.diff"] if tool == "git" else ["patch", "-s", "-p1", "-i", "change.diff"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    assert (tmp_path / "train_xla.py").read_bytes() == output
    assert (tmp_path / "train.py").read_bytes() == VARIANTS[variant]  # the input is kept


@pytest.mark.parametrize("tool", ["git", "patch"])
def test_same_name_diff_patches_in_place(tmp_path, tool):
    diff, output = _write_diff(tmp_path, "train.py", "train.py", VARIANTS["lf"])
    assert b"copy from" not in diff
    (tmp_path / "change.diff").write_bytes(diff)
    command = ["git", "apply", "change.diff"] if tool == "git" else ["patch", "-s", "-p1", "-i", "change.diff"]
    assert subprocess.run(command, cwd=tmp_path).returncode == 0
    assert (tmp_path / "train.py").read_bytes() == output


def test_headers_have_no_timestamps_and_git_prefixes():
    diff = migrate(CUDA_SCRIPT, path="train.py", out_path="train_xla.py").diff
    lines = diff.splitlines()
    assert lines[:5] == ["diff --git a/train.py b/train_xla.py", "copy from train.py", "copy to train_xla.py",
                         "--- a/train.py", "+++ b/train_xla.py"]


def test_missing_final_newline_is_marked():
    diff = unified_diff("a\nb", "a\nc", "f.py", "f.py")
    assert diff.endswith("-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n")


def test_split_lines_splits_on_newline_only():
    assert split_lines("a\x0cb\r\nc\n\nd") == ["a\x0cb\r\n", "c\n", "\n", "d"]


def test_stats_from_unidiff():
    stats = migrate(CUDA_SCRIPT).diff_stats
    assert (stats.files, stats.hunks, stats.added, stats.removed) == (1, 1, 4, 3)
    assert diff_stats("") .files == 0


def test_unchanged_source_has_empty_diff():
    assert migrate("x = 1\n").diff == ""
