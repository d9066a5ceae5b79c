"""The torchtpu target (issue 32, DESIGN.md section 10): the names it emits exist in TorchTPU, and its output
holds nothing of torch_xla.

The names are checked against the torch_tpu 0.2.0 wheel's Python files: the wheel is downloaded once into the
user's cache (never committed) and read, not installed (it needs libtpu and a TPU). A failed download fails
the test: CI reaches the package index. The names in torch proper (torch.accelerator, torch.autocast) are
checked in the torch 2.9 environment by tests/xla/test_torchtpu_smoke.py, which also trains the outputs on
the CPU.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import zipfile
from functools import lru_cache
from pathlib import Path

import pytest
from goldens import FIXTURES, NOT_GOLDEN

from xla_migrate import migrate
from xla_migrate.engine.targets import TARGETS

ROOT = Path(__file__).resolve().parent.parent
WHEEL_PIN = "torch_tpu==0.2.0"
# The wheel's platform and Python (a pure read: pip needs them only to choose the file, whatever runs the tests).
WHEEL_PLATFORM = ("--only-binary=:all:", "--python-version", "3.11", "--platform", "manylinux_2_31_x86_64")
# Where the torchtpu target's own spellings and messages live (findings name torch.tpu APIs too).
TORCHTPU_SOURCES = [ROOT / "src/xla_migrate/engine/targets.py", *sorted((ROOT / "transforms/torchtpu").glob("*.py"))]


def wheel_cache() -> Path:
    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache_home) / "xla-migrate" / "wheels"


@lru_cache(maxsize=1)
def torch_tpu_wheel() -> Path:
    folder = wheel_cache()
    found = sorted(folder.glob("torch_tpu-0.2.0-*.whl"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", *WHEEL_PLATFORM, WHEEL_PIN,
                           "-d", str(folder)], capture_output=True, text=True, timeout=900)
    found = sorted(folder.glob("torch_tpu-0.2.0-*.whl"))
    if proc.returncode != 0 or not found:
        pytest.fail(f"could not download {WHEEL_PIN} into {folder} (exit {proc.returncode}):\n{proc.stderr[-3000:]}",
                    pytrace=False)
    return found[0]


def wheel_text(member: str) -> str:
    with zipfile.ZipFile(torch_tpu_wheel()) as wheel:
        return wheel.read(member).decode()


@lru_cache(maxsize=1)
def public_api() -> dict[str, set[str]]:
    """``torch.tpu`` module -> its exported names, from the wheel's declarative table (its public_api.py
    builds the ``torch.tpu`` modules from ``_PUBLIC_MODULES`` and nothing else)."""
    tree = ast.parse(wheel_text("torch_tpu/_internal/public_api.py"))
    table = next(node.value for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AnnAssign))
                 and "_PUBLIC_MODULES" in ast.unparse(node.targets[0] if isinstance(node, ast.Assign) else node.target))
    modules: dict[str, set[str]] = {}
    for key, spec in zip(table.keys, table.values):
        exports = next((k.value for k in spec.keywords if k.arg == "exports"), None)
        modules[key.value] = {k.value for k in exports.keys} if isinstance(exports, ast.Dict) else set()
    return modules


def is_public(name: str) -> bool:
    """``torch.tpu.distributed.set_tpu_launch_env``: a public module, or a name it exports; ``torch_tpu.x``: a
    module file of the wheel. No part of it private."""
    if any(part.startswith("_") for part in name.split(".")):
        return False
    if name.startswith("torch_tpu."):
        path = name.replace(".", "/")
        with zipfile.ZipFile(torch_tpu_wheel()) as wheel:
            files = set(wheel.namelist())
        return f"{path}.py" in files or f"{path}/__init__.py" in files
    modules = public_api()
    if name in modules:
        return True
    module, _, attribute = name.rpartition(".")
    return attribute in modules.get(module, set())


TPU_NAME = re.compile(r"\btorch(?:\.tpu|_tpu)(?:\.[A-Za-z_]\w*)+")


def dotted_names(code: str) -> set[str]:
    """Every attribute chain rooted at ``torch`` or ``torch_tpu`` in ``code``."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Attribute):
            text = ast.unparse(node)
            if re.fullmatch(r"(torch|torch_tpu)(\.\w+)+", text):
                names.add(text)
    return names


def torchtpu_outputs() -> list[tuple[Path, Path]]:
    return sorted((out.with_name(out.name.replace(".out-torchtpu.py", ".in.py")), out)
                  for out in FIXTURES.glob("*/*.out-torchtpu.py") if out.parent.name not in NOT_GOLDEN)


def emitted_tpu_names() -> set[str]:
    """The torch.tpu / torch_tpu names the target writes: in its outputs (new there) and in its rules' text."""
    names = {n for path in TORCHTPU_SOURCES for n in TPU_NAME.findall(path.read_text())}
    for source, output in torchtpu_outputs():
        new = dotted_names(output.read_text()) - dotted_names(source.read_text())
        names |= {n for n in new if TPU_NAME.fullmatch(n)}
    return names


def test_every_emitted_torch_tpu_name_is_public_in_the_wheel():
    names = emitted_tpu_names()
    assert "torch.tpu.distributed.set_tpu_launch_env" in names  # the launch finding's fix names it
    missing = sorted(n for n in names if not is_public(n))
    assert not missing, f"not public in {WHEEL_PIN}: {missing}"


def test_set_tpu_launch_env_takes_what_the_output_passes():
    """The upgraded launch calls ``torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=n)``: the wheel's
    function (the one torch.tpu.distributed exports) takes ``nproc_per_node`` by keyword, and nothing else is
    required."""
    table = wheel_text("torch_tpu/_internal/public_api.py")
    assert '"torch_tpu._internal.distributed.distributed:set_tpu_launch_env"' in table
    tree = ast.parse(wheel_text("torch_tpu/_internal/distributed/distributed.py"))
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "set_tpu_launch_env")
    keywords = {a.arg: d for a, d in zip(function.args.kwonlyargs, function.args.kw_defaults)}
    assert "nproc_per_node" in keywords and all(d is not None for d in keywords.values())
    assert not function.args.args and not function.args.posonlyargs
    calls = {line.strip() for _, out in torchtpu_outputs() for line in out.read_text().splitlines()
             if "set_tpu_launch_env(" in line}
    assert calls == {"torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=nprocs)"}, calls


def test_the_check_tells_private_and_missing_names():
    assert is_public("torch.tpu.distributed") and is_public("torch.tpu.synchronize")
    assert not is_public("torch.tpu.no_such_helper")
    assert not is_public("torch.tpu._device_module")
    assert not is_public("torch_tpu._internal.distributed")


def test_python_m_torch_tpu_distributed_is_runnable():
    """The launch finding says ``python -m torch.tpu.distributed``: the module has a main in the table."""
    tree = ast.parse(wheel_text("torch_tpu/_internal/public_api.py"))
    spec = next(n for n in ast.walk(tree) if isinstance(n, ast.Dict) and any(
        isinstance(k, ast.Constant) and k.value == "torch.tpu.distributed" for k in n.keys))
    value = spec.values[[k.value for k in spec.keys].index("torch.tpu.distributed")]
    assert any(k.arg == "main" for k in value.keywords)


def test_device_type_and_backend_strings_are_registered_by_the_wheel():
    """The output's "tpu" device type (autocast, a device option) and "tpu_dist" process group backend are
    the names the wheel's loader registers."""
    loader = wheel_text("torch_tpu/_loader.py")
    assert re.search(r'assert device == "tpu"', loader) and "rename_privateuse1_backend(device)" in loader
    assert re.search(r'register_backend\(\s*"tpu_dist"', loader)
    spellings = {c: s.template for c, s in TARGETS["torchtpu"].spellings.items()}
    assert "current_accelerator().type" in spellings["autocast"] and spellings["device_name"] == '"tpu"'
    assert spellings["process_group_backend"] == '"tpu_dist"'
    emitted = " ".join(out.read_text() for _, out in torchtpu_outputs())
    autocast = 'torch.autocast(torch.accelerator.current_accelerator().type if torch.accelerator.is_available() else "cpu"'
    assert 'backend="tpu_dist"' in emitted and f"{autocast}, dtype=torch.bfloat16)" in emitted


XLA_ONLY = re.compile(r"\b(torch_xla|xm\.|xr\.|mark_step|MpDeviceLoader|optimizer_step|add_step_closure)\b")


@pytest.mark.parametrize("path", sorted((FIXTURES / "scripts").glob("*.in.py")), ids=lambda p: p.name[:-6])
def test_whole_script_output_holds_nothing_of_torch_xla(path):
    """Eager TorchTPU: no barrier, device loader, xm optimizer step or closure, no torch_xla import."""
    source = path.read_text()
    result = migrate(source, target="torchtpu", path=path.name)
    assert result.error is None and not result.data_parallel
    added = [line for line in result.code.splitlines() if XLA_ONLY.search(line) and line not in source]
    assert not added, added
    assert result.runs_on == "torch_tpu >= 0.2"
    assert all(f.code != "XLA000" for f in result.findings), result.findings


def test_leftovers_without_xla900_are_silent_on_torchtpu():
    """XLA900 is what reports the CUDA a torchtpu migration leaves: without it the nvtx call and the
    torch.version.cuda read stay silent (XLA103 does not run for this target)."""
    from output_checks import uncovered_in

    code = 'import torch\nfrom torch.cuda import nvtx\n\nnvtx.range_push("step")\nprint(torch.version.cuda)\n'
    assert uncovered_in(migrate(code, target="torchtpu")) == []
    problems = uncovered_in(migrate(code, target="torchtpu", ignore=["XLA900"]))
    assert [p.split(" has no finding")[0] for p in problems] == [
        "output line 2: 'cuda' (input lines [2])", "output line 4: 'nvtx' (input lines [4])",
        "output line 5: 'cuda' (input lines [5])"], problems
    message = [f.message for f in migrate(code, target="torchtpu").findings if f.code == "XLA900"][0]
    assert "not migrated for torchtpu yet" in message


def test_code_already_on_xla_is_upgraded_with_its_cuda_gates():
    # The torchtpu target upgrades torch_xla code (XLA703/XLA704) instead of leaving it: the CUDA gate of such a
    # file is migrated with the rest, once (before the upgrade, rewriting the test alone made the next run
    # rewrite the branch: hypothesis found it not idempotent).
    source = ("import torch\nimport torch_xla.core.xla_model as xm\n\n\ndef build(device):\n"
              "    if torch.cuda.is_available():\n        print(torch.cuda.max_memory_allocated())\n"
              "    fused = device.type == 'cuda'\n    return fused\n\n\nbuild(xm.xla_device())\n")
    first = migrate(source, target="torchtpu")
    assert "if torch.accelerator.is_available():" in first.code and "device.type == 'tpu'" in first.code
    assert "torch_xla" not in first.code and "xm." not in first.code
    assert migrate(first.code, target="torchtpu").code == first.code
    # The torch_xla targets still leave code on XLA as it is.
    assert migrate(source, target="2.9").code == source
