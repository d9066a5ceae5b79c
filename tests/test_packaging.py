"""The rules ship inside the package: the wheel holds transforms/ as xla_migrate.transforms (and every module
of src/xla_migrate/, subpackages included), and both a regular and an editable install in a fresh virtual
environment can import every rule module."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Paths relative to transforms/, family folders included (device/cuda_device_to_xla.py, ...).
RULE_FILES = sorted(p.relative_to(ROOT / "transforms").as_posix() for p in (ROOT / "transforms").rglob("*.py"))
# Every module of the package, subpackages included (a subpackage missing from pyproject's `packages` would
# be left out of the wheel).
PACKAGE_FILES = sorted(p.relative_to(ROOT / "src").as_posix() for p in (ROOT / "src" / "xla_migrate").rglob("*.py"))


def _pip(python: Path, *args: str, cwd: Path = ROOT) -> None:
    done = subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", "-q", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]


def test_wheel_contains_the_rules(tmp_path):
    _pip(Path(sys.executable), "wheel", "--no-deps", "-w", str(tmp_path), str(ROOT))
    (wheel,) = tmp_path.glob("xla_migrate-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for rule_file in RULE_FILES:
        assert f"xla_migrate/transforms/{rule_file}" in names
    assert set(PACKAGE_FILES) <= names, sorted(set(PACKAGE_FILES) - names)
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "xla-migrate = xla_migrate.__main__:console" in entry_points


@pytest.mark.parametrize("editable", [False, True], ids=["install", "editable"])
def test_fresh_venv_install_finds_every_rule(tmp_path, editable):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    # --no-deps: the check only locates modules, so libcst and friends need not be installed there.
    _pip(python, "install", "--no-deps", *(["-e"] if editable else []), str(ROOT),
         cwd=tmp_path)
    modules = [f"xla_migrate.transforms.{name[:-3].replace('/', '.')}" for name in RULE_FILES
               if not name.endswith("__init__.py")]
    check = ("import importlib.util, sys; missing = [m for m in sys.argv[1:] "
             "if importlib.util.find_spec(m) is None]; print(missing)")
    done = subprocess.run([str(python), "-c", check, *modules], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    origin = subprocess.run([str(python), "-c", "import xla_migrate.transforms as t; print(t.__file__)"],
                            cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    if editable:
        assert origin == str(ROOT / "transforms" / "__init__.py")
    else:
        assert str(env_dir) in origin
