"""The data-parallel forms (DESIGN.md section 7, issue 28): ``auto`` (the default for both targets) and how it
chooses, the ddp form on both targets (torch_xla 1.13's process group on ``sagemaker``), the xm form's
guarantee (every update reduced once, replicas equal) and its findings when asked for by name, the report
header and the command line."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

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


@pytest.mark.parametrize("target", ["2.9", "sagemaker"])
def test_auto_is_the_default_and_says_why(target):
    result = migrate(TORCHRUN_DDP, target=target)
    assert result.error is None and result.data_parallel == "xm"
    assert result.data_parallel_reason == ("auto: one update (line 21: opt.step()) after its backward in main(): "
                                           "reduced once; weights broadcast from ordinal 0")
    assert "DDP(model" not in result.code
    # DDP's initial broadcast is kept, as torch_xla's own collective, where the wrapper was
    assert ("    for tensor in [*model.parameters(), *model.buffers()]:\n"
            "        xm.collective_broadcast([tensor], root_ordinal=0)\n") in result.code
    explicit = migrate(TORCHRUN_DDP, target=target, data_parallel="xm")
    assert explicit.code == result.code and explicit.data_parallel_reason == ""


def test_ddp_form_keeps_torch_distributed_on_the_xla_backend():
    code = migrate(TORCHRUN_DDP, target="2.9", data_parallel="ddp").code
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


@pytest.mark.parametrize("target", ["2.9", "sagemaker"])
def test_ddp_form_output_is_left_alone_the_second_time(target):
    once = migrate(TORCHRUN_DDP, target=target, data_parallel="ddp")
    twice = migrate(once.code, target=target, data_parallel="ddp")
    assert twice.code == once.code and twice.changes == []


def test_ddp_form_on_sagemaker_is_torch_xla_1_13s():
    """torch_xla 1.13 has the xla process group (no xla://): joined with the XLA ordinals after
    MASTER_ADDR/MASTER_PORT defaults, the workers started by xmp.spawn, so the ranks come from xm."""
    result = migrate(TORCHRUN_DDP, target="sagemaker", data_parallel="ddp")
    assert result.error is None and result.data_parallel == "ddp"
    code = result.code
    assert "import torch_xla.distributed.xla_backend\n" in code
    assert ('    local_rank = xm.get_local_ordinal()\n'
            '    os.environ.setdefault("MASTER_ADDR", "localhost")\n'
            '    os.environ.setdefault("MASTER_PORT", "12355")\n'
            '    dist.init_process_group("xla", rank=xm.get_ordinal(), world_size=xm.xrt_world_size(), timeout=None)\n'
            ) in code
    assert "model = DDP(model, gradient_as_bucket_view=True)\n" in code and "        opt.step()\n" in code
    assert "optimizer_step" not in code and "_fetch_gradients" not in code and "collective_broadcast" not in code
    assert "def _mp_fn(index):\n" in code and "xmp.spawn(_mp_fn, args=())" in code
    assert "if xm.is_master_ordinal(local=False):" in code and "dist.all_reduce(loss)" in code
    assert result.releases == ((1, 13), (2, 7))


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


def test_report_header_says_the_form_and_why_only_for_distributed_scripts():
    auto = migrate(TORCHRUN_DDP, target="2.9", path="train.py")
    ddp = migrate(TORCHRUN_DDP, target="2.9", path="train.py", data_parallel="ddp")
    single = migrate(SINGLE, target="2.9", path="one.py")
    assert "(target 2.9; data parallel xm (auto: one update (line 21: opt.step()) after" in summary(auto, "train.py")
    assert "(target 2.9; data parallel ddp; output runs on" in summary(ddp, "train.py")
    assert "data parallel" not in summary(single, "one.py") and single.data_parallel == ""
    report = json.loads(json.dumps(json_report([auto, ddp, single])))
    jsonschema.validate(report, SCHEMA)
    assert [f["data_parallel"] for f in report["files"]] == ["xm", "ddp", None]
    assert report["files"][0]["data_parallel_reason"].startswith("auto: one update")
    assert [f["data_parallel_reason"] for f in report["files"][1:]] == [None, None]
    assert "data parallel ddp" in repr(ddp)


def _invoke(*args):
    return CliRunner().invoke(app, list(args))


def test_cli_refuses_an_unknown_form_in_one_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_DDP)
    result = _invoke(str(script), "--data-parallel", "fsdp", "--diff")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert lines == ["error: --data-parallel fsdp: unknown form (known: auto, ddp, xm, spmd)"]
    assert result.stdout == ""
    sagemaker_spmd = _invoke(str(script), "--target", "sagemaker", "--data-parallel", "spmd", "--diff")
    assert sagemaker_spmd.exit_code == 2 and sagemaker_spmd.stdout == ""
    assert sagemaker_spmd.stderr.strip().splitlines() == [
        "error: --data-parallel spmd: the sagemaker target (torch_xla 1.13 API) has no SPMD; use --target 2.9"]
    sagemaker_ddp = _invoke(str(script), "--target", "sagemaker", "--data-parallel", "ddp", "--out", "-")
    assert sagemaker_ddp.exit_code == 0 and 'dist.init_process_group("xla", rank=xm.get_ordinal()' in sagemaker_ddp.stdout


def test_cli_form_flag_and_header(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_DDP)
    ddp = _invoke(str(script), "--target", "2.9", "--data-parallel", "ddp", "--out", "-")
    assert ddp.exit_code == 0 and "DDP(model, gradient_as_bucket_view=True)" in ddp.stdout
    assert "data parallel ddp;" in ddp.stderr.strip().splitlines()[-1]
    default = _invoke(str(script), "--target", "2.9", "--out", "-")
    assert default.exit_code == 0 and "xm.optimizer_step(opt)" in default.stdout
    assert "data parallel xm (auto: one update" in default.stderr.strip().splitlines()[-1]
    (tmp_path / "one.py").write_text(SINGLE)
    tree = _invoke(str(tmp_path), "--target", "2.9", "--data-parallel", "ddp", "--check", "-j", "1")
    assert tree.exit_code == 1 and "(target 2.9; data parallel ddp" in tree.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("key", ["data-parallel", "data_parallel"])
def test_config_key(tmp_path, key):
    (tmp_path / "pyproject.toml").write_text(f'[tool.xla-migrate]\ntarget = "2.9"\n{key} = "ddp"\n')
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_DDP)
    result = _invoke(str(script), "--out", "-")
    assert result.exit_code == 0 and "gradient_as_bucket_view=True" in result.stdout
    flag_wins = _invoke(str(script), "--out", "-", "--data-parallel", "xm")
    assert "xm.optimizer_step(opt)" in flag_wins.stdout


def test_config_form_must_be_known(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.xla-migrate]\ndata-parallel = "fsdp"\n')
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_DDP)
    bad = _invoke(str(script), "--diff")
    assert bad.exit_code == 2 and "data-parallel must be one of 'auto', 'ddp', 'xm'" in bad.stderr


# How auto chooses (issue 28's shapes; fixtures/scripts and fixtures/projects hold runnable ones) ------------------

def _ddp_program(helpers: str, body: str, seed: str = "") -> str:
    """A torchrun DDP script: ``helpers`` at module level, ``body`` in the training loop of main()."""
    return textwrap.dedent('''\
        import os

        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        {helpers}

        def main(use_amp=False):
            dist.init_process_group("nccl")
            local_rank = int(os.environ["LOCAL_RANK"])
            model = torch.nn.Linear(4, 1).cuda()
            model = DDP(model, device_ids=[local_rank])
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            scaler = torch.cuda.amp.GradScaler()
            for x in range(4):
                loss = model(torch.randn(2, 4).cuda()).sum()
    ''').format(helpers=textwrap.dedent(helpers)) + textwrap.indent(textwrap.dedent(body), " " * 8)


LOSS_SCALER = """
    class LossScaler:
        def __init__(self):
            self._scaler = torch.cuda.amp.GradScaler()

        def __call__(self, loss, optimizer):
            self._scaler.scale(loss).backward()
            self._scaler.step(optimizer)
            self._scaler.update()


    loss_scaler = LossScaler()
"""

AUTO_CASES = {
    "two alternative update paths": ("", """\
        if use_amp:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    """, "auto: 2 optimizer updates (line 21 scaler.step(opt), line 26 opt.step())"),
    "a loss scaler's __call__": (LOSS_SCALER, """\
        loss_scaler(loss, opt)
    """, "auto: line 13: the update runs in an object's __call__ (a loss scaler)"),
    "a helper it cannot follow handed the model": ("", """\
        loss.backward()
        dispatch_clip_grad(model.parameters(), 1.0)
        opt.step()
    """, "auto: line 18: dispatch_clip_grad(model.parameters(), 1.0) is handed the model or the optimizer "
         "between the backward and the update: it may read the gradients"),
    "two optimizers": ("", """\
        loss.backward()
        opt.step()
        d_opt = torch.optim.Adam(model.parameters())
    """, "auto: 2 optimizers (line 13, line 19)"),
    "the program's own gradient all-reduce": ("""
    def average_gradients(model):
        for p in model.parameters():
            dist.all_reduce(p.grad.data)
    """, """\
        loss.backward()
        average_gradients(model)
        opt.step()
    """, "auto: the program reduces gradients itself (line 9 dist.all_reduce(p.grad.data)): the xm form would "
         "reduce them a second time"),
}


@pytest.mark.parametrize("shape", sorted(AUTO_CASES))
def test_auto_takes_the_ddp_form_where_the_guarantee_is_not_shown(shape):
    helpers, body, reason = AUTO_CASES[shape]
    source = _ddp_program(helpers, body)
    result = migrate(source, target="2.9")
    assert result.error is None and result.data_parallel == "ddp", result.data_parallel_reason
    assert result.data_parallel_reason == reason


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
    # Proven elsewhere, with why: launched_device launches one worker itself and initialises a process group
    # only when world > 1, with no DDP wrapper: no update to reduce, nothing the replica probe could show
    # (tests/xla/test_gates_proof.py runs it for what it is about, no XLA device before the launcher).
    # ddp_spmd, fsdp_spmd and fsdp2_spmd are the spmd form's proof on 4 devices (tests/xla/test_spmd_proof.py);
    # the ddp and xm forms of ddp_spmd are those of ddp_torchrun, which is listed; torch FSDP has no ddp or xm
    # form (XLA415).
    # torchrun_collectives_spmd is the spmd form's helper collectives on 4 devices
    # (tests/xla/test_spmd_collectives_proof.py); its xm/ddp collectives are ddp_helpers'.
    # fsdp2_checkpoint_spmd is the spmd form's FSDP state-dict APIs, saved and loaded on 4 devices
    # (tests/xla/test_spmd_checkpoint_proof.py).
    elsewhere = {"launched_device", "ddp_spmd", "fsdp_spmd", "fsdp2_spmd", "torchrun_collectives_spmd",
                 "fsdp2_checkpoint_spmd", "fsdp1_autowrap_spmd"}
    assert distributed and distributed - elsewhere <= set(listed), distributed - elsewhere - set(listed)
    assert elsewhere <= distributed, "an exemption no longer needed: remove it"
    for name in listed:
        assert (root / "fixtures" / "runnable" / f"{name}.py").exists() or (
            root / "fixtures" / "scripts" / f"{name}.in.py").exists(), name
    # the single copy of ddp_env_flag is the whole-script golden's input
    assert "ddp_env_flag" in listed and not (root / "fixtures" / "runnable" / "ddp_env_flag.py").exists()


# The xm form asked for by name: every update reduced where it can be, each one it cannot reported ----------------

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


@pytest.mark.parametrize("target", ["2.9", "sagemaker"])
def test_xm_form_reduces_each_branch_and_each_update_of_its_own(target):
    """The AMP branch and the fp32 branch each get their all-reduce after their own backward (not one block in
    one branch); a GAN's four updates each reduce in xm.optimizer_step (none left stepping local gradients)."""
    branches = migrate((FIXTURES / "XLA406" / "amp_and_fp32_branches.in.py").read_text(), target=target,
                       data_parallel="xm")
    assert branches.unreduced_updates == []
    fetches = branches.code.count("gradients = xm._fetch_gradients(optimizer)")
    # 2.9 has no GradScaler: both branches become the same and fold into one
    assert fetches == (2 if target == "sagemaker" else 1), branches.code
    lines = branches.code.splitlines()
    for index, line in enumerate(lines):
        if line.strip().startswith("gradients = xm._fetch_gradients"):
            assert lines[index - 2].strip().endswith(".backward()"), lines[index - 2]
    source = (FIXTURES / "scripts" / "gan_four_updates.in.py").read_text()
    result = migrate(source, target=target, data_parallel="xm")
    assert result.unreduced_updates == [] and "_fetch_gradients" not in result.code
    assert [line.strip() for line in result.code.splitlines() if "optimizer_step(" in line] == [
        "xm.optimizer_step(d_optim)", "xm.optimizer_step(d_optim)", "xm.optimizer_step(g_optim)",
        "xm.optimizer_step(g_optim)"]
    auto = migrate(source, target=target)
    assert auto.data_parallel == "ddp" and auto.data_parallel_reason.startswith("auto: 4 optimizer updates")


def test_xm_form_reduces_before_a_helper_it_cannot_follow():
    """``dispatch_clip_grad(model.parameters(), ...)`` (timm) may read the gradients: auto keeps DDP; the xm form
    asked for by name all-reduces right after the backward, before the helper, and steps without reducing."""
    source = (FIXTURES / "XLA406" / "helper_handed_the_model.in.py").read_text()
    assert migrate(source, target="2.9").data_parallel == "ddp"
    result = migrate(source, target="2.9", data_parallel="xm")
    assert result.unreduced_updates == []
    assert ("        loss.backward()\n"
            "        # All-reduce the gradients once, before they are read (unscale_/clip); the step does not reduce again.\n"
            "        gradients = xm._fetch_gradients(optimizer)\n"
            "        xm.all_reduce(\"sum\", gradients, scale=1.0 / xr.world_size())\n"
            "        dispatch_clip_grad(model.parameters(), 1.0, mode=\"agc\")\n"
            "        optimizer.step()\n") in result.code


def test_xm_form_reports_each_update_it_leaves_unreduced_and_exits_1(tmp_path):
    source = (FIXTURES / "XLA413" / "update_helper_without_backward.in.py").read_text()
    reported = migrate(source, target="sagemaker", data_parallel="xm").unreduced_updates
    assert [f.line for f in reported] == [14] and "steps the local gradients" in reported[0].message
    on_2_9 = migrate(source, target="2.9", data_parallel="xm").unreduced_updates
    assert [f.line for f in on_2_9] == [13] and "each replica clips by its own norm" in on_2_9[0].message
    assert migrate(source, target="2.9").data_parallel == "ddp", "auto never gives the xm form to it"
    script = tmp_path / "train.py"
    script.write_text(source)
    forced = _invoke(str(script), "--target", "2.9", "--data-parallel", "xm", "--out", str(tmp_path / "out.py"))
    assert forced.exit_code == 1 and "XLA413" in forced.stderr and (tmp_path / "out.py").exists()
    assert _invoke(str(script), "--target", "2.9", "--out", str(tmp_path / "auto.py")).exit_code == 0
    tree = _invoke(str(tmp_path), "--target", "2.9", "--data-parallel", "xm", "--out", str(tmp_path / "tree"),
                   "-j", "1")
    assert tree.exit_code == 1


# What auto chooses for the runnable fixtures and fixture projects (the proof tier runs both forms of each) --------

AUTO_FORMS = {"ddp_torchrun": "xm", "ddp_helpers": "xm", "ddp_world_size_arg": "xm",
              "ddp_amp_branches": "ddp", "gan_four_updates": "ddp",
              # module-level torchrun scripts: the ddp form where torchrun's rendezvous exists (xla://, 2.9);
              # sagemaker's ddp form needs xmp.spawn too, so its xm form stays (XLA407 reports no entry function)
              "ddp_env_flag": {"sagemaker": "xm", "2.9": "ddp"},
              "torchrun_module_level": {"sagemaker": "xm", "2.9": "ddp"}}
PROJECT_FORMS = {
    "ddp_project": ("ddp", "utils.py:45: the update runs in LossScaler.__call__, which no training loop of its "
                           "module calls (a helper another module's loop calls)"),
    "scaler_project": ("ddp", "utils.py:37: the update runs in NativeScaler.__call__, which no training loop"),
    "clip_helper_project": ("ddp", "train.py:36: clip_gradients(model, 0.3) is handed the model or the optimizer"),
    "allreduce_hooks_project": ("ddp", "the program reduces gradients itself (distributed.py:14 "
                                       "dist.all_reduce(coalesced))"),
}


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
@pytest.mark.parametrize("name", sorted(AUTO_FORMS))
def test_auto_form_of_each_runnable_fixture(name, target):
    path = FIXTURES / "runnable" / f"{name}.py"
    path = path if path.exists() else FIXTURES / "scripts" / f"{name}.in.py"
    result = migrate(path.read_bytes(), target=target, path=path.name)
    expected = AUTO_FORMS[name] if isinstance(AUTO_FORMS[name], str) else AUTO_FORMS[name][target]
    assert result.data_parallel == expected, result.data_parallel_reason


@pytest.mark.parametrize("name", sorted(PROJECT_FORMS))
def test_auto_form_of_each_fixture_project_is_one_for_all_its_modules(name):
    from xla_migrate.analysis.project import build_index

    root = FIXTURES / "projects" / name
    files = sorted(root.glob("*.py"))
    index = build_index(str(root), [str(f) for f in files])
    form, reason = PROJECT_FORMS[name]
    for target in ("sagemaker", "2.9"):
        results = [migrate(f.read_bytes(), target=target, path=str(f), project=index) for f in files]
        assert {r.data_parallel for r in results} - {""} == {form}, name
        reasons = {r.data_parallel_reason for r in results} - {""}
        assert len(reasons) == 1 and reasons.pop().startswith(f"auto: {reason}"), name


# The rest of issue 28's list --------------------------------------------------------------------------------------


def test_a_loop_variable_named_rank_is_no_process_rank():
    source = textwrap.dedent('''\
        import torch
        import torch.distributed as dist


        def main(scores):
            dist.init_process_group("nccl")
            rank = dist.get_rank()
            for rank_position, (rank, score) in enumerate(sorted(scores)):
                if rank == 0:
                    print("best", score)
            best = [s for rank, s in scores if rank == 0]
            if rank == 0:
                print(best)
        ''')
    code = migrate(source, target="sagemaker", data_parallel="xm").code
    # the loop variable and the comprehension's: a position in a ranking; the process rank: rewritten
    assert code.count("if rank == 0:") == 1 and "s for rank, s in scores if rank == 0]" in code
    assert code.count("xm.is_master_ordinal(local=False)") == 0 or "rank = xm.get_ordinal()" in code


def test_an_env_rank_zero_test_is_a_master_test_not_a_launcher_flag():
    source = _ddp_program("", "loss.backward()\nopt.step()\n") + textwrap.indent(textwrap.dedent('''\
            if os.getenv("RANK", "0") == "0":
                torch.save(model.state_dict(), "ckpt.pt")
        '''), "    ")
    for target, master in (("sagemaker", "xm.is_master_ordinal(local=False)"), ("2.9", "xm.is_master_ordinal(local=False)")):
        code = migrate(source, target=target, data_parallel="xm").code
        assert f"    if {master}:\n" in code and "world_size() == 1" not in code and "xrt_world_size() == 1" not in code


@pytest.mark.parametrize("form", ["ddp", "xm"])
def test_sync_batchnorm_conversion_goes_in_both_forms(form):
    source = _ddp_program("", "loss.backward()\nopt.step()\n").replace(
        "    model = DDP(model, device_ids=[local_rank])\n",
        "    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"
        "    model = DDP(model, device_ids=[local_rank])\n")
    result = migrate(source, target="2.9", data_parallel=form)
    assert "SyncBatchNorm" not in result.code
    assert any("each replica normalises its own batch" in c.message for c in result.changes)


def test_collectives_with_the_defaults_spelled_out_are_rewritten_and_others_keep_the_group():
    source = textwrap.dedent('''\
        import torch
        import torch.distributed as dist


        def main(t, tensors):
            dist.init_process_group("nccl")
            dist.all_reduce(t, dist.ReduceOp.SUM, async_op=False)
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=dist.group.WORLD)
            torch.distributed.all_gather(tensors, t, async_op=False)
            torch.distributed.broadcast(t, src=0, group=None)
        ''')
    code = migrate(source, target="sagemaker", data_parallel="xm").code
    assert code.count('xm.all_reduce("sum", [t])') == 2 and "xm.collective_broadcast([t], root_ordinal=0)" in code
    assert "init_process_group" not in code and "dist." not in code
    kept = migrate(source + "    dist.all_reduce(t, async_op=True)\n", target="sagemaker", data_parallel="xm")
    assert 'dist.init_process_group("xla", rank=xm.get_ordinal(), world_size=xm.xrt_world_size())' in kept.code
    assert any(f.code == "XLA410" and "the process group stays" in f.message for f in kept.findings)


def test_the_group_stays_for_a_collective_of_another_module(tmp_path):
    """MoCo's shape: builder.py's concat_all_gather uses dist.all_gather_object (no xm form); main.py sets up the
    group. One program: main.py keeps the group on the xla backend."""
    from xla_migrate.analysis.project import build_index

    (tmp_path / "builder.py").write_text(textwrap.dedent('''\
        import torch.distributed as dist


        def gather_names(name):
            names = [None] * dist.get_world_size()
            dist.all_gather_object(names, name)
            return names
        '''))
    (tmp_path / "main.py").write_text(textwrap.dedent('''\
        import torch
        import torch.distributed as dist

        from builder import gather_names


        def main():
            dist.init_process_group("nccl")
            print(gather_names("me"))


        if __name__ == "__main__":
            main()
        '''))
    index = build_index(str(tmp_path), [str(tmp_path / "builder.py"), str(tmp_path / "main.py")])
    main = migrate((tmp_path / "main.py").read_text(), path=str(tmp_path / "main.py"), target="sagemaker",
                   project=index, data_parallel="xm")
    assert 'dist.init_process_group("xla", rank=xm.get_ordinal(), world_size=xm.xrt_world_size())' in main.code
    assert any("builder.py:6 dist.all_gather_object(names, name)" in f.message for f in main.findings)


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_an_object_collective_is_told_to_run_on_a_gloo_group(target):
    """Review round 11: the xla backend refuses the object collectives (their objects are pickled into CPU tensors:
    "Expected XLA tensor" on torch_xla 2.9.0): the finding says so and gives the gloo group's workaround."""
    source = textwrap.dedent('''\
        import torch.distributed as dist


        def main():
            dist.init_process_group("nccl")
            names = [None] * dist.get_world_size()
            dist.all_gather_object(names, "me")
            print(names)


        if __name__ == "__main__":
            main()
        ''')
    result = migrate(source, target=target, data_parallel="xm")
    notes = [f for f in result.findings if "all_gather_object" in f.message]
    assert notes and "it raises there" in notes[0].message and 'new_group(backend="gloo")' in notes[0].message, \
        [f.message for f in result.findings]


def test_nothing_reads_the_xla_runtime_before_the_spawn():
    source = textwrap.dedent('''\
        import os
        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp


        def worker(gpu, ngpus_per_node, world_size, batch_size):
            dist.init_process_group("nccl", rank=gpu, world_size=world_size)
            print(batch_size // ngpus_per_node)


        def main():
            world_size = int(os.environ["WORLD_SIZE"])
            ngpus_per_node = torch.cuda.device_count()
            mp.spawn(worker, nprocs=ngpus_per_node, args=(ngpus_per_node, world_size, 256))


        if __name__ == "__main__":
            main()
        ''')
    result = migrate(source, target="2.9", data_parallel="xm")
    assert '    world_size = int(os.environ["WORLD_SIZE"])\n' in result.code, "read in the launcher: reported"
    assert any(f.code == "XLA401" and "read before the launch" in f.message for f in result.findings)
    # the device count the launcher passed is CUDA's (0): the worker rebinds it to the XLA world size
    assert ("def worker(gpu, ngpus_per_node, world_size, batch_size):\n"
            "    # The XLA launcher starts one process per XLA device: the launcher's count was CUDA's (0 here).\n"
            "    ngpus_per_node = xr.world_size()\n") in result.code
    assert "torch_xla.launch(worker, args=(ngpus_per_node, world_size, 256))" in result.code


def test_module_under_the_scripts_own_flag_goes_with_the_wrapper():
    """hifi-gan's shape: `model = DistributedDataParallel(model, ...).to(device)` under `if num_gpus > 1:` and
    `(model.module if num_gpus > 1 else model).state_dict()` at the checkpoint: the xm form has no wrapper, so
    both branches are the model; the broadcast goes after the wrapper's assignment (after the move)."""
    source = textwrap.dedent('''\
        import torch
        import torch.multiprocessing as mp
        from torch.distributed import init_process_group
        from torch.nn.parallel import DistributedDataParallel


        def train(rank, num_gpus):
            if num_gpus > 1:
                init_process_group(backend="nccl", init_method="tcp://localhost:54321", world_size=num_gpus, rank=rank)
            device = torch.device("cuda:{:d}".format(rank))
            model = torch.nn.Linear(4, 1).to(device)
            if num_gpus > 1:
                model = DistributedDataParallel(model, device_ids=[rank]).to(device)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
            for step in range(5):
                loss = model(torch.randn(8, 4, device=device)).sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            torch.save({"model": (model.module if num_gpus > 1 else model).state_dict()}, "g.pt")


        if __name__ == "__main__":
            mp.spawn(train, nprocs=2, args=(2,))
        ''')
    code = migrate(source, target="sagemaker", data_parallel="xm").code
    assert "xm.save({\"model\": (model).state_dict()}, \"g.pt\")" in code and ".module" not in code
    assert ("        model = model.to(device)\n"
            "        # Every replica starts from ordinal 0's weights and buffers, as DDP broadcast them when it wrapped the model.\n"
            "        for tensor in [*model.parameters(), *model.buffers()]:\n"
            "            xm.collective_broadcast([tensor], root_ordinal=0)\n") in code
    assert migrate(source, target="sagemaker").data_parallel == "xm"


# A torchrun script whose training code runs at module level (llama2.c's train.py): the ddp form --------------------

TRAINING = """\
model = DDP(torch.nn.Linear(2, 2).to(device))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in loader:
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
"""
HEAD = "import os\n\nimport torch\nimport torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\n"
TORCHRUN_REASON = ("auto: a torchrun script whose training code runs at module level (line {line}: {what}) with no "
                   "function to launch on each XLA worker")
MODULE_LEVEL = {
    "init_process_group with no init_method": (
        'dist.init_process_group(backend="nccl")\ndevice = "cuda"\n' + TRAINING, 7,
        "dist.init_process_group(backend='nccl')"),
    "init_process_group env://": (
        'dist.init_process_group("nccl", "env://")\ndevice = "cuda"\n' + TRAINING, 7,
        "dist.init_process_group('nccl', 'env://')"),
    "xla:// (a script already in the ddp form)": (
        'dist.init_process_group("xla", init_method="xla://")\ndevice = "cuda"\n' + TRAINING, 7,
        "dist.init_process_group('xla', init_method='xla://')"),
    "an env rank under a launcher flag": (
        'ddp = int(os.environ.get("RANK", -1)) != -1\ndevice = "cuda"\n' + TRAINING, 7,
        "reads RANK from the environment"),
    "a rank test in a module-level if": (
        'if "LOCAL_RANK" in os.environ:\n    device = "cuda"\n' + TRAINING, 7,
        "reads LOCAL_RANK from the environment"),
}
NOT_MODULE_LEVEL = {
    # a function the xm form launches: XLA407 wraps it in _mp_fn
    "a __main__ block calling main": 'def main():\n    dist.init_process_group("nccl")\n    device = "cuda"\n'
                                     + "".join(f"    {line}\n" for line in TRAINING.splitlines())
                                     + 'if __name__ == "__main__":\n    main()\n',
    "evidence only in a helper function": 'def setup():\n    return int(os.environ["LOCAL_RANK"])\n\n\n'
                                          'device = "cuda"\n' + TRAINING,
    "a tcp:// rendezvous (not torchrun's)": 'dist.init_process_group("nccl", init_method="tcp://10.0.0.1:23456", '
                                            'rank=0, world_size=2)\ndevice = "cuda"\n' + TRAINING,
    "the script spawns its workers": 'import torch.multiprocessing as mp\nrank = int(os.environ["RANK"])\n'
                                     'def worker(i):\n    device = "cuda"\n'
                                     + "".join(f"    {line}\n" for line in TRAINING.splitlines())
                                     + "mp.spawn(worker, nprocs=2)\n",
}


@pytest.mark.parametrize("shape", sorted(MODULE_LEVEL))
def test_auto_gives_a_module_level_torchrun_script_the_ddp_form_where_torchrun_rendezvous_exists(shape):
    body, line, what = MODULE_LEVEL[shape]
    result = migrate(HEAD + body, target="2.9")
    assert result.error is None and result.data_parallel == "ddp"
    assert result.data_parallel_reason.startswith(TORCHRUN_REASON.format(line=line, what=what)), \
        result.data_parallel_reason
    assert "init_process_group(\"xla\", init_method=\"xla://\")" in result.code or "dist." not in body
    # sagemaker's ddp form is launched by xmp.spawn, which needs the same missing function: no such reason there
    assert "torchrun" not in migrate(HEAD + body, target="sagemaker").data_parallel_reason


@pytest.mark.parametrize("shape", sorted(NOT_MODULE_LEVEL))
def test_a_script_with_a_launchable_function_or_no_torchrun_evidence_at_module_level_keeps_xm(shape):
    result = migrate(HEAD + NOT_MODULE_LEVEL[shape], target="2.9")
    assert result.error is None and result.data_parallel == "xm", result.data_parallel_reason


def test_a_project_with_a_module_level_torchrun_entry_is_ddp_in_every_module(tmp_path):
    """The entry script runs its training at module level; its helper module (imported, so not a script) reads
    RANK at module level too. Every module gets the ddp form with the entry's line; the same helper imported
    by an entry that has a main() is no evidence."""
    from xla_migrate.analysis.project import build_index

    (tmp_path / "utils.py").write_text('import os\nimport torch.distributed as dist\n\nRANK = int(os.environ.get('
                                       '"RANK", 0))\n\n\ndef is_master():\n    return dist.get_rank() == 0\n')
    (tmp_path / "train.py").write_text(HEAD + "import utils\n" + 'dist.init_process_group("nccl")\n'
                                       'device = "cuda"\n' + TRAINING)
    files = sorted(tmp_path.glob("*.py"))
    index = build_index(str(tmp_path), [str(f) for f in files])
    results = {f.name: migrate(f.read_bytes(), target="2.9", path=str(f), project=index) for f in files}
    assert {r.data_parallel for r in results.values()} == {"ddp"}
    assert {r.data_parallel_reason for r in results.values()} == {
        results["train.py"].data_parallel_reason}
    assert "(train.py:8: dist.init_process_group('nccl'))" in results["train.py"].data_parallel_reason
    (tmp_path / "train.py").write_text(HEAD + "import utils\n\n\ndef main():\n    dist.init_process_group("
                                       '"nccl")\n    device = "cuda"\n'
                                       + "".join(f"    {line}\n" for line in TRAINING.splitlines())
                                       + '\n\nif __name__ == "__main__":\n    main()\n')
    index = build_index(str(tmp_path), [str(f) for f in files])
    entry = migrate((tmp_path / "train.py").read_bytes(), target="2.9", path=str(tmp_path / "train.py"),
                    project=index)
    assert entry.data_parallel == "xm", entry.data_parallel_reason


IGNITE_UTILS = textwrap.dedent('''\
    import torch.nn as nn
    import torch.optim as optim
    import ignite.distributed as idist


    def initialize(config):
        model = idist.auto_model(nn.Linear(8, 2))
        optimizer = optim.SGD(model.parameters(), lr=config["lr"])
        optimizer = idist.auto_optim(optimizer)
        return model, optimizer, nn.CrossEntropyLoss()
    ''')
IGNITE_MAIN = textwrap.dedent('''\
    import torch
    from torch.amp import GradScaler, autocast
    import ignite.distributed as idist
    from ignite.engine import Engine

    import utils


    def create_trainer(model, optimizer, criterion, config):
        scaler = GradScaler(enabled=config["with_amp"])

        def train_step(engine, batch):
            x, y = batch[0].cuda(), batch[1].cuda()
            with autocast("cuda", enabled=config["with_amp"]):
                loss = criterion(model(x), y)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            return {"batch loss": loss.item()}

        return Engine(train_step)


    def training(local_rank, config):
        model, optimizer, criterion = utils.initialize(config)
        create_trainer(model, optimizer, criterion, config).run(config["data"])


    if __name__ == "__main__":
        with idist.Parallel(backend="xla-tpu", nproc_per_node=8) as parallel:
            parallel.run(training, {"lr": 0.1, "with_amp": False, "data": []})
    ''')


@pytest.mark.parametrize("target", ["2.9", "sagemaker"])
@pytest.mark.parametrize("distributed", [None, True])
def test_an_ignite_auto_optim_optimizer_steps_as_it_is_across_modules(tmp_path, target, distributed):
    """pytorch/ignite's examples: idist.auto_optim (in utils.py) returns an optimizer whose step() on XLA is
    xm.optimizer_step(opt, barrier=True); main.py steps it through a GradScaler in an Engine's process
    function. No xm.optimizer_step around it (the gradients would be reduced twice), no finding; a note says
    why."""
    from xla_migrate.analysis.project import build_index

    (tmp_path / "utils.py").write_text(IGNITE_UTILS)
    (tmp_path / "main.py").write_text(IGNITE_MAIN)
    index = build_index(str(tmp_path), [str(tmp_path / "utils.py"), str(tmp_path / "main.py")])
    main = migrate(IGNITE_MAIN, path=str(tmp_path / "main.py"), target=target, project=index,
                   distributed=distributed)
    assert main.error is None
    assert "optimizer_step" not in main.code
    # The Engine's step barrier stays: on backends other than xla-tpu auto_optim changes nothing, and without it
    # the graph grows (one compile per step, measured); after barrier=True it finds nothing pending.
    assert main.code.count("torch_xla.sync()" if target == "2.9" else "xm.mark_step()") == 1, main.code
    assert not [f for f in main.findings if "optimizer" in f.message], main.findings
    if target == "2.9":  # no GradScaler on 2.9: the scaler's step becomes the optimizer's own
        assert "        optimizer.step()\n" in main.code
        assert any("idist.auto_optim" in c.message and c.line == 18 for c in main.changes), main.changes
    else:
        assert "scaler.step(optimizer)" in main.code
    # Alone (no project: the binding is not in view), the same file gets the torch_xla step and its barrier.
    alone = migrate(IGNITE_MAIN, target="2.9")
    assert "xm.optimizer_step(optimizer)" in alone.code and "torch_xla.sync()" in alone.code


def test_an_ignite_auto_optim_plain_step_is_left_with_a_note():
    source = textwrap.dedent('''\
        import torch
        import ignite.distributed as idist


        def train(model, loader):
            optimizer = idist.auto_optim(torch.optim.SGD(model.parameters(), lr=0.1))
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
        ''')
    for target in ("2.9", "sagemaker"):
        result = migrate(source, target=target)
        assert "        optimizer.step()\n" in result.code and "optimizer_step" not in result.code
        assert "pl.MpDeviceLoader(loader" in result.code, result.code  # the loop's step marked as before
        notes = [c for c in result.changes if c.line == 9]
        assert notes and "already xm.optimizer_step(optimizer, barrier=True)" in notes[0].message
        assert not result.findings


@pytest.mark.parametrize("target", ["2.9", "sagemaker"])
def test_the_step_barrier_goes_after_the_steps_collectives(target):
    """dist.gather and dist.reduce after opt.step() (XLA410/411's xm collectives are lazy): the barrier goes after
    them, so every replica runs them in the step's graph; right after the step, rank 0's read would run them in a
    graph of its own on rank 0 alone (2 replicas hung; tests/xla/test_collectives_after_step_proof.py)."""
    source = (Path(__file__).resolve().parent.parent / "fixtures" / "XLA302" / "collectives_after_step.in.py")
    result = migrate(source.read_text().replace("def train(", "def main():\n    dist.init_process_group('nccl')\n\n\n"
                                                "def train("), target=target, data_parallel="xm")
    lines = [line.strip() for line in result.code.splitlines()]
    spelled = "torch_xla.sync()" if target == "2.9" else "xm.mark_step()"
    barriers = [index for index, line in enumerate(lines) if line == spelled]
    # XLA411's gather runs at a barrier of its own before dst copies its chunks; the step's goes after the reduce.
    assert len(barriers) == 2, result.code
    assert lines[barriers[0] - 1].startswith("all_gathered = xm.all_gather("), result.code
    assert lines[barriers[1] - 1] == 'xm.all_reduce("sum", [total])', result.code
    assert lines[barriers[1] + 1] == "if xm.is_master_ordinal(local=False):", result.code


LOGGING_BRANCH = textwrap.dedent('''\
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    def main():
        dist.init_process_group("nccl")
        rank, world = dist.get_rank(), dist.get_world_size()
        model = DDP(torch.nn.Linear(4, 1).cuda())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(6):
            loss = model(torch.randn(8, 4).cuda()).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 2 == 0:
                loss_t = loss.detach().clone()
                dist.all_reduce(loss_t)
                if rank == 0:
                    print(step, loss_t.item() / world)
            if step % 3 == 0:
                losses = [torch.zeros_like(loss) for _ in range(world)] if rank == 0 else None
                dist.gather(loss.detach(), losses, dst=0)
                if rank == 0:
                    print(torch.stack(losses).tolist())


    if __name__ == "__main__":
        main()
    ''')


@pytest.mark.parametrize("target", ["2.9", "sagemaker"])
def test_a_collective_in_a_logging_branch_after_the_step_gets_a_barrier_right_after_it(target):
    """Issue 28: ``if step % k == 0: dist.all_reduce(loss_t); if rank == 0: print(loss_t.item())`` after the
    step. The step's barrier stays right after the update (one graph per step on the other steps); the
    collective gets a barrier right after it in its branch, so every replica runs it in one graph on the logging
    steps (left to the read, rank 0 ran it alone: 2 replicas hung, tests/xla/test_logging_collectives_proof.py).
    A gather there runs at XLA411's own barrier, then dst copies, then the branch's barrier."""
    result = migrate(LOGGING_BRANCH, target=target, data_parallel="xm")
    assert result.error is None
    spelled = "torch_xla.sync()" if target == "2.9" else "xm.mark_step()"
    lines = [line.strip() for line in result.code.splitlines()]
    barriers = [index for index, line in enumerate(lines) if line == spelled]
    assert len(barriers) == 4, result.code
    assert lines[barriers[0] - 1] == "xm.optimizer_step(opt)", result.code
    assert lines[barriers[1] - 1] == 'xm.all_reduce("sum", [loss_t])', result.code
    assert lines[barriers[1] + 1] == "if xm.is_master_ordinal(local=False):", result.code
    assert lines[barriers[2] - 1].startswith("all_gathered = xm.all_gather(loss.detach().unsqueeze(0), "
                                             "pin_layout=False)"), result.code
    assert lines[barriers[3] - 1] == "gathered_tensor.copy_(chunk)", result.code  # the branch's (XLA302)
    assert lines[barriers[3] + 1] == "if xm.is_master_ordinal(local=False):", result.code
    assert not [f for f in result.findings if "collective" in f.message.lower()], result.findings


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_xm_form_guarantee_on_a_trainer_method_that_reads_the_gradients_and_a_seed_through_a_helper(target):
    """Issue 28 point 1 on two shapes of its list no fixture had: a trainer method (``self._log_grad_norm()``,
    no argument: it reads ``self.model``'s gradients) between the backward and the clip, and a per-rank seed
    spelled through a variable and a helper (``seed = args.seed + get_rank()``) before a model built by a helper.
    In the xm form: each update reduces once, after the backward and before the first read, and the replicas
    start from ordinal 0's weights (broadcast right after the move, before the optimizer is built)."""
    trainer = migrate((FIXTURES / "scripts" / "ddp_trainer_grad_norm_log.in.py").read_text(), target=target,
                      data_parallel="xm")
    assert trainer.error is None and trainer.unreduced_updates == []
    lines = [line.strip() for line in trainer.code.splitlines()]
    step = lines[lines.index("def train_step(self, x, y):"):lines.index("return loss.detach()")]
    reduce_at = next(i for i, line in enumerate(step) if line.startswith('xm.all_reduce("sum", gradients'))
    assert step[reduce_at - 3] == "loss.backward()" and step[reduce_at + 1] == "self._log_grad_norm()", step
    assert step[-1] == "self.optimizer.step()" and sum("all_reduce" in line for line in step) == 1, step
    init = lines[lines.index("def __init__(self, model, local_rank, lr=0.1, clip=1.0):"):]
    broadcast = init.index("xm.collective_broadcast([tensor], root_ordinal=0)")
    assert init[broadcast - 3] == "self.model = model.to(device)", init
    assert init[broadcast + 1] == "self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr)", init

    seeded = migrate((FIXTURES / "scripts" / "ddp_seed_through_helper.in.py").read_text(), target=target,
                     data_parallel="xm")
    assert seeded.error is None and seeded.unreduced_updates == []
    lines = [line.strip() for line in seeded.code.splitlines()]
    moved = lines.index("model = build_model(args.width).to(device)")
    assert lines[moved + 3] == "xm.collective_broadcast([tensor], root_ordinal=0)", seeded.code
    assert lines[moved + 4] == "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)", seeded.code
    assert [line for line in lines if "optimizer_step(" in line] == ["xm.optimizer_step(optimizer)"]
    for source in ("ddp_trainer_grad_norm_log", "ddp_seed_through_helper"):  # auto shows the guarantee: xm
        auto = migrate((FIXTURES / "scripts" / f"{source}.in.py").read_text(), target=target)
        assert auto.data_parallel == "xm", auto.data_parallel_reason
