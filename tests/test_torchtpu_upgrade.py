"""Upgrading torch_xla code to TorchTPU (issue 32 point 2): every runnable fixture's ``sagemaker`` and ``2.9``
outputs (this tool's own) migrated again with ``--target torchtpu``.

For each: the upgrade is idempotent, no torch_xla name (nor an ``"xla"`` device string) is left without a
finding on its input line, and every ``torch.tpu`` name the output or its findings write is public in the
torch_tpu 0.2.0 wheel (tests/test_torchtpu.py reads it). The CPU runs of the fp32 ones are in
tests/xla/test_torchtpu_smoke.py. The torch_xla targets leave code on XLA as it is (goldens).
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import pytest
from output_checks import input_lines_for
from test_torchtpu import TPU_NAME, dotted_names, is_public

from xla_migrate import migrate

ROOT = Path(__file__).resolve().parent.parent
RUNNABLE = sorted(p.stem for p in (ROOT / "fixtures" / "runnable").glob("*.py"))
XLA_TARGETS = ("sagemaker", "2.9")
# A torch_xla name read in code (a module alias of the tool's outputs or torch_xla itself), or an "xla" device.
TORCH_XLA = re.compile(r"\b(torch_xla|xm|xr|pl|xmp|xla_amp|syncfree|xs|fsdpv2)\.\w|[\"']xla(:\d+)?[\"']")


@lru_cache(maxsize=None)
def upgraded(name: str, target: str):
    source = (ROOT / "fixtures" / "runnable" / f"{name}.py").read_text()
    on_xla = migrate(source, target=target, path=f"{name}.py")
    assert on_xla.error is None, on_xla.error
    result = migrate(on_xla.code, target="torchtpu", path=f"{name}.py")
    assert result.error is None, result.error
    return on_xla.code, result


def code_lines(code: str) -> set[int]:
    """Lines that hold code (not a docstring or comment, which may name torch_xla in prose)."""
    import ast
    import io
    import tokenize

    lines = set()
    docstrings = {n.body[0].value.lineno for n in ast.walk(ast.parse(code)) if isinstance(
        n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body and isinstance(n.body[0], ast.Expr) and isinstance(
        n.body[0].value, ast.Constant) and isinstance(n.body[0].value.value, str)}
    for token in tokenize.generate_tokens(io.StringIO(code).readline):
        if token.type in (tokenize.NAME, tokenize.OP) or (token.type == tokenize.STRING
                                                            and token.start[0] not in docstrings):
            lines.update(range(token.start[0], token.end[0] + 1))
    return lines


def torch_xla_left(source: str, result) -> list[str]:
    """Output lines with a torch_xla name and no finding on an input line they come from (imports aside: the
    names they bind are checked where they are read)."""
    findings = {f.line for f in result.findings}
    mapping = input_lines_for(source, result.code)
    code = code_lines(result.code)
    problems = []
    for number, line in enumerate(result.code.splitlines(), 1):
        if number not in code or line.lstrip().startswith(("import ", "from ")) or not TORCH_XLA.search(line):
            continue
        if not findings & set(mapping.get(number, [])):
            problems.append(f"output line {number}: {line.strip()}")
    return problems


@pytest.mark.parametrize("target", XLA_TARGETS)
@pytest.mark.parametrize("name", RUNNABLE)
def test_upgrade_of_this_tools_output(name, target):
    source, result = upgraded(name, target)
    # (a) idempotent
    assert migrate(result.code, target="torchtpu", path=f"{name}.py").code == result.code
    # (b) no torch_xla name left silently
    problems = torch_xla_left(source, result)
    assert not problems, "\n".join(problems)
    # (c) every torch.tpu name written (code, findings) is public in the wheel
    written = {n for n in dotted_names(result.code) - dotted_names(source) if TPU_NAME.fullmatch(n)}
    for finding in result.findings:
        written |= set(TPU_NAME.findall(f"{finding.message} {finding.fix}"))
    missing = sorted(n for n in written if not is_public(n))
    assert not missing, missing
    assert result.runs_on == "torch_tpu >= 0.2"


# The Trainer's fixture has no xr.use_spmd() of its own: its spmd form is the Trainer's FSDPv2 settings (XLA606).
SPMD_RUNNABLE = sorted(name for name in RUNNABLE if name.endswith("_spmd") and not name.startswith("trainer_"))


@pytest.mark.parametrize("name", SPMD_RUNNABLE)
def test_upgrade_of_the_spmd_form(name):
    """This tool's 2.9 --data-parallel spmd output (xr.use_spmd, xs.Mesh, input_sharding=, FSDPv2): no
    mechanical TorchTPU form, so each SPMD line has a finding naming DTensor / FSDP2 fully_shard on
    init_device_mesh("tpu", ...); the rest is upgraded, idempotently."""
    source = (ROOT / "fixtures" / "runnable" / f"{name}.py").read_text()
    on_xla = migrate(source, target="2.9", path=f"{name}.py", data_parallel="spmd")
    assert on_xla.data_parallel == "spmd" and "xr.use_spmd()" in on_xla.code
    result = migrate(on_xla.code, target="torchtpu", path=f"{name}.py")
    assert result.error is None and migrate(result.code, target="torchtpu").code == result.code
    assert not torch_xla_left(on_xla.code, result)
    spmd = [f for f in result.findings if "SPMD" in f.message]
    lines = on_xla.code.splitlines()
    assert {lines[f.line - 1].strip() for f in spmd} >= {"xr.use_spmd()"}
    assert all('init_device_mesh("tpu", ...)' in f.fix for f in spmd)


def test_the_checks_can_fail():
    """The leftover check sees a torch_xla call with no finding, and passes it with one."""
    source, result = upgraded("mnist_conv", "sagemaker")
    assert "xm." in source and "xm." not in result.code and result.changed
    bare = type("R", (), {"code": "import torch\nxm.mark_step()\n", "findings": []})()
    assert torch_xla_left("import torch\nxm.mark_step()\n", bare) == ["output line 2: xm.mark_step()"]
    found = type("F", (), {"line": 2})()
    covered = type("R", (), {"code": "import torch\nxm.mark_step()\n", "findings": [found]})()
    assert torch_xla_left("import torch\nxm.mark_step()\n", covered) == []
    assert not is_public("torch.tpu.no_such_helper")


@pytest.mark.parametrize("target", XLA_TARGETS)
def test_distributed_xm_form_gets_ddp_back_on_tpu_dist(target):
    """The xm form (the sagemaker default, 2.9 --data-parallel xm) of a DDP script: xm.optimizer_step's
    all-reduce becomes DDP again, each worker joins the tpu_dist group, mp.spawn after set_tpu_launch_env
    starts them (transforms/torchtpu/xm_form_ddp.py); nothing is reported lost."""
    source = (ROOT / "fixtures" / "runnable" / "ddp_torchrun.py").read_text()
    on_xla = migrate(source, target=target, path="ddp_torchrun.py", data_parallel="xm")
    assert "xm.optimizer_step(optimizer)" in on_xla.code and "DDP(" not in on_xla.code
    result = migrate(on_xla.code, target="torchtpu", path="ddp_torchrun.py")
    code = result.code
    assert "    model = torch.nn.parallel.DistributedDataParallel(model)\n    optimizer = " in code
    assert 'dist.init_process_group("tpu_dist" if torch.accelerator.is_available() else "gloo")' in code
    assert 'os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(index)' in code
    assert "        torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=nprocs)\n" in code
    assert "mp.spawn(_mp_fn, args=" in code and "nprocs=nprocs)" in code
    assert "torch.save(model.module.state_dict()" in code  # the checkpoint keeps its keys
    assert "collective_broadcast" not in code and "optimizer.step()" in code
    messages = " ".join(f.message for f in result.findings)
    assert "no longer reduced" not in messages and "collective" not in messages
    assert migrate(code, target="torchtpu", path="ddp_torchrun.py").code == code


def test_xm_form_without_a_launcher_keeps_the_finding():
    """No launcher to start the workers (a torchrun-style xm form): no DDP is made up; the lost reduction is
    reported, as before."""
    source = ("import torch\nimport torch_xla.core.xla_model as xm\n\nmodel = torch.nn.Linear(2, 1)\n"
              "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nprint(xm.xrt_world_size())\n"
              "model(torch.ones(2)).sum().backward()\nxm.optimizer_step(opt)\n")
    result = migrate(source, target="torchtpu")
    assert "DistributedDataParallel" not in result.code and "opt.step()" in result.code
    assert any("no longer reduced" in f.message for f in result.findings)


def test_the_xla_targets_leave_the_upgrade_alone():
    """Under the torch_xla targets code on XLA stays as it is: the upgrade is torchtpu's alone."""
    for target in XLA_TARGETS:
        source, _ = upgraded("amp_clip", target)
        assert migrate(source, target=target).code == source
