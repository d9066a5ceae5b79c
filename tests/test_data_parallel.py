"""The data-parallel forms (DESIGN.md section 7): the option and its defaults per target, refusals, the
report header, and what the ddp form keeps and changes."""

from __future__ import annotations

import json
import textwrap

import jsonschema
import pytest
from test_report import SCHEMA
from typer.testing import CliRunner

from xla_migrate import migrate
from xla_migrate.cli import app
from xla_migrate.report.formats import json_report, summary

TORCHRUN_DDP = textwrap.dedent('''\
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler


    def main():
        local_rank = int(os.environ["LOCAL_RANK"])
        dist.init_process_group(backend="nccl", init_method="env://", world_size=2, rank=0, timeout=None)
        torch.cuda.set_device(local_rank)
        model = torch.nn.Linear(2, 2).cuda()
        model = DDP(model, device_ids=[local_rank], output_device=local_rank)
        loader = DataLoader(dataset, sampler=DistributedSampler(dataset))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in loader:
            opt.zero_grad()
            loss = model(x.cuda()).sum()
            loss.backward()
            opt.step()
            dist.all_reduce(loss)
        if dist.get_rank() == 0:
            print(model.module)
        dist.barrier()
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
''')

SINGLE = "import torch\nmodel = torch.nn.Linear(2, 2).cuda()\n"


@pytest.mark.parametrize(("target", "form"), [("2.9", "ddp"), ("sagemaker", "xm")])
def test_default_form_per_target(target, form):
    result = migrate(TORCHRUN_DDP, target=target)
    assert result.error is None and result.data_parallel == form
    assert ("DDP(model" in result.code) == (form == "ddp")


def test_ddp_form_keeps_torch_distributed_on_the_xla_backend():
    code = migrate(TORCHRUN_DDP, target="2.9").code
    assert "import torch_xla.distributed.xla_backend\n" in code
    assert 'dist.init_process_group("xla", init_method="xla://", timeout=None)\n' in code
    assert "model = DDP(model, gradient_as_bucket_view=True)\n" in code
    assert "set_device" not in code and ".cuda(" not in code
    # DDP reduces in the backward: the step stays, no explicit reduction is added
    assert "        opt.step()\n" in code and "optimizer_step" not in code and "_fetch_gradients" not in code
    # helpers and env ranks keep working as written; the launcher (torchrun) stays
    for kept in ('int(os.environ["LOCAL_RANK"])', "dist.all_reduce(loss)", "dist.get_rank() == 0",
                 "print(model.module)", "dist.barrier()", "dist.destroy_process_group()",
                 "DistributedSampler(dataset)", "    main()\n"):
        assert kept in code, kept
    assert "_mp_fn" not in code and "launch" not in code


def test_xm_form_on_2_9_is_the_seeds_recipe():
    code = migrate(TORCHRUN_DDP, target="2.9", data_parallel="xm").code
    assert "DDP(" not in code and "init_process_group" not in code
    assert "xm.optimizer_step(opt)" in code and "torch_xla.launch(_mp_fn" in code


def test_ddp_form_output_is_left_alone_the_second_time():
    once = migrate(TORCHRUN_DDP, target="2.9")
    twice = migrate(once.code, target="2.9")
    assert twice.code == once.code and twice.changes == []


def test_ddp_with_sagemaker_raises():
    """A mistake in the call (issue 33): raised, as a bad selection is, not an error result."""
    with pytest.raises(ValueError, match="data_parallel=ddp needs torch_xla 2.1 or later"):
        migrate(TORCHRUN_DDP, target="sagemaker", data_parallel="ddp")


def test_unknown_form_raises():
    with pytest.raises(ValueError, match="data_parallel=fsdp: unknown form"):
        migrate(TORCHRUN_DDP, target="2.9", data_parallel="fsdp")


def test_mp_spawn_becomes_the_xla_launcher_in_the_ddp_form():
    source = textwrap.dedent('''\
        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp


        def worker(gpu, args):
            dist.init_process_group("nccl", init_method="tcp://127.0.0.1:23456", world_size=2, rank=gpu)
            model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2).cuda(gpu), device_ids=[gpu])


        if __name__ == "__main__":
            mp.spawn(worker, nprocs=2, args=(None,))
    ''')
    code = migrate(source, target="2.9").code
    assert "torch_xla.launch(worker, args=(None,))" in code
    assert 'dist.init_process_group("xla", init_method="xla://")' in code
    assert "DistributedDataParallel(torch.nn.Linear(2, 2).to(device), gradient_as_bucket_view=True)" in code


def test_report_header_says_the_form_only_for_distributed_scripts():
    ddp = migrate(TORCHRUN_DDP, target="2.9", path="train.py")
    single = migrate(SINGLE, target="2.9", path="one.py")
    assert "(target 2.9; data parallel ddp; output runs on" in summary(ddp, "train.py")
    assert "data parallel" not in summary(single, "one.py") and single.data_parallel == ""
    report = json.loads(json.dumps(json_report([ddp, single])))
    jsonschema.validate(report, SCHEMA)
    assert [f["data_parallel"] for f in report["files"]] == ["ddp", None]
    assert "data parallel ddp" in repr(ddp)


def _invoke(*args):
    return CliRunner().invoke(app, list(args))


def test_cli_refuses_ddp_for_sagemaker_in_one_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_DDP)
    result = _invoke(str(script), "--target", "sagemaker", "--data-parallel", "ddp", "--diff")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --data-parallel ddp needs torch_xla 2.1 or later")
    assert result.stdout == ""


def test_cli_form_flag_and_header(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_DDP)
    xm = _invoke(str(script), "--target", "2.9", "--data-parallel", "xm", "--out", "-")
    assert xm.exit_code == 0 and "xm.optimizer_step(opt)" in xm.stdout
    assert "data parallel xm" in xm.stderr.strip().splitlines()[-1]
    default = _invoke(str(script), "--target", "2.9", "--out", "-")
    assert "DDP(model, gradient_as_bucket_view=True)" in default.stdout
    assert "data parallel ddp" in default.stderr.strip().splitlines()[-1]
    (tmp_path / "one.py").write_text(SINGLE)
    tree = _invoke(str(tmp_path), "--target", "2.9", "--data-parallel", "xm", "--check", "-j", "1")
    assert tree.exit_code == 1 and "(target 2.9; data parallel xm" in tree.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("key", ["data-parallel", "data_parallel"])
def test_config_key(tmp_path, key):
    (tmp_path / "pyproject.toml").write_text(f'[tool.xla-migrate]\ntarget = "2.9"\n{key} = "xm"\n')
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_DDP)
    result = _invoke(str(script), "--out", "-")
    assert result.exit_code == 0 and "xm.optimizer_step(opt)" in result.stdout
    flag_wins = _invoke(str(script), "--out", "-", "--data-parallel", "ddp")
    assert "gradient_as_bucket_view=True" in flag_wins.stdout


def test_config_form_with_sagemaker_is_refused(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.xla-migrate]\ndata-parallel = "ddp"\n')
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_DDP)
    result = _invoke(str(script), "--diff")
    assert result.exit_code == 2 and "--data-parallel ddp needs torch_xla 2.1" in result.stderr
    (tmp_path / "pyproject.toml").write_text('[tool.xla-migrate]\ndata-parallel = "fsdp"\n')
    bad = _invoke(str(script), "--diff")
    assert bad.exit_code == 2 and "data-parallel must be one of 'ddp', 'xm'" in bad.stderr


def test_every_distributed_runnable_fixture_runs_in_both_forms_in_the_proof_tier():
    """Each runnable script the tool migrates as distributed (fixtures/runnable/, and whole-script goldens the
    proof runs, such as ddp_env_flag) is in tests/xla/test_data_parallel_proof.py's list, which runs every
    form of both targets on both torch_xla environments."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    proof = (root / "tests" / "xla" / "test_data_parallel_proof.py").read_text()
    listed = next(ast.literal_eval(node.value) for node in ast.parse(proof).body
                  if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "DISTRIBUTED")
    runnable = sorted((root / "fixtures" / "runnable").glob("*.py"))
    distributed = {p.stem for p in runnable if migrate(p.read_bytes(), target="2.9", path=p.name).data_parallel}
    assert distributed and distributed <= set(listed), distributed - set(listed)
    for name in listed:
        assert (root / "fixtures" / "runnable" / f"{name}.py").exists() or (
            root / "fixtures" / "scripts" / f"{name}.in.py").exists(), name
    # the single copy of ddp_env_flag is the whole-script golden's input
    assert "ddp_env_flag" in listed and not (root / "fixtures" / "runnable" / "ddp_env_flag.py").exists()
