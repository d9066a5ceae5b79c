"""The defect classes of the expert review's eighth round (real programs migrated as trees: distributed_tutorial,
WassersteinGAN, BigGAN-PyTorch, attention-is-all-you-need-pytorch, pytorch-a2c-ppo-acktr-gail, deepspeech.pytorch,
detectron2's tools and engine, fairseq's trainer, llama-recipes, litgpt's finetune scripts, aws-neuron-samples'
training scripts, optimum-tpu's examples), one test per new class on the self-written fixtures in
``fixtures/review/<issue>-<class>/`` (their READMEs say what is wrong today, what was measured, and what right
looks like).

Same contract as tests/test_review_classes.py (whose helpers this module reuses): each test asserts the RIGHT
behaviour; a class the tool still gets wrong is marked ``known_defect(issue, what)``, a strict xfail that only an
AssertionError satisfies. When one XPASSes, check the output against its README and delete the mark.
"""

from __future__ import annotations

import ast

import pytest

from test_review_classes import BOTH, _show, known_defect, migrated  # noqa: F401


def _calls(code: str, *names: str) -> list[ast.Call]:
    return [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call) and ast.unparse(n.func) in names]


def _function(code: str, name: str) -> ast.FunctionDef:
    return next(n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.FunctionDef) and n.name == name)


SEED_CALLS = ("torch_xla.manual_seed", "xm.set_rng_state")


# Severity C (a crash the original did not have) ---------------------------------------------------------------


@BOTH
def test_functional_data_parallel_becomes_a_module_call(migrated, target):
    run = migrated("29-functional-data-parallel-becomes-bare-module", target)
    forward = _function(run.code["train.py"], "forward")
    values = [n.value for n in ast.walk(forward) if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "out"]
    not_called = [ast.unparse(v) for v in values if not isinstance(v, ast.Call)]
    assert values and not not_called, f"`out` assigned {not_called}; findings: {_show(run.findings['train.py'])}"


@BOTH
def test_functional_data_parallel_is_not_kept(migrated, target):
    # The control: the multi-GPU call itself is gone on both targets (one XLA device per process).
    code = migrated("29-functional-data-parallel-becomes-bare-module", target).code["train.py"]
    assert "data_parallel" not in code and "self.main(x)" in code, code


@BOTH
def test_cuda_seed_argument_reaches_xla_as_an_int(migrated, target):
    run = migrated("29-cuda-seed-argument-passed-unconverted", target)
    seeds = _calls(run.code["train.py"], *SEED_CALLS)
    strings = [ast.unparse(c) for c in seeds if c.args and isinstance(c.args[0], ast.Call)
               and ast.unparse(c.args[0].func) == "str"]
    assert seeds and not strings, f"XLA seed calls given a string: {strings}; code:\n{run.code['train.py']}"


@BOTH
def test_no_process_group_call_left_without_a_process_group(migrated, target):
    run = migrated("29-seed-from-removed-process-group", target)
    code = run.code["train.py"]
    if "init_process_group" not in code:
        left = [ast.unparse(c) for c in _calls(code, "dist.get_rank", "dist.get_world_size")]
        assert not left, f"process-group calls with no process group: {left}; code:\n{code}"


@BOTH
def test_seed_from_rank_uses_the_xla_ordinal(migrated, target):
    # The control: the seed's own argument is rewritten to the XLA ordinal (what the tool gets right today).
    code = migrated("29-seed-from-removed-process-group", target).code["train.py"]
    ordinal = "xr.global_ordinal()" if target == "2.9" else "xm.get_ordinal()"
    assert f"torch.manual_seed({ordinal})" in code, code


@BOTH
def test_lightning_trainer_from_config_is_reported(migrated, target):
    run = migrated("29-lightning-trainer-from-config-unreported", target)
    reported = [f for f in run.findings["train.py"] if f.code == "XLA908" or "accelerator" in f.message]
    assert reported, f"findings: {_show(run.findings['train.py'])}"


@BOTH
def test_per_rank_checkpoint_is_written_by_every_replica(migrated, target):
    run = migrated("29-per-rank-checkpoint-becomes-master-only-save", target)
    helper = _function(run.code["train.py"], "save_shard")
    master_only = [ast.unparse(c) for c in ast.walk(helper) if isinstance(c, ast.Call)
                   and ast.unparse(c.func) == "xm.save"
                   and not any(k.arg == "master_only" and ast.unparse(k.value) == "False" for k in c.keywords)]
    assert not master_only, f"master-only save of a per-rank file: {master_only}"


def _autocast_devices(code: str) -> list[str]:
    """The devices given to torch_xla's autocast where no test of the device keeps the CPU away from it
    (``xla_amp.autocast(device) if "xla" in str(device) else ...``: the sagemaker form, torch.autocast("xla")
    needing torch 2.1)."""
    tree = ast.parse(code)
    guarded = [n.body for n in ast.walk(tree) if isinstance(n, ast.IfExp)
               and "xla" in ast.unparse(n.test) and "device" in ast.unparse(n.test)]
    return [ast.unparse(c.args[0]) for c in ast.walk(tree) if isinstance(c, ast.Call) and c.args
            and ast.unparse(c.func) in ("xla_amp.autocast", "autocast") and not any(c is g for g in guarded)]


@pytest.mark.parametrize("target", ["sagemaker"])
def test_xla_autocast_is_not_given_a_cpu_device(migrated, target):
    code = migrated("29-xla-autocast-given-the-cpu-device", target).code["transcribe.py"]
    may_be_cpu = "torch.device(\"cpu\")" in code or "torch.device('cpu')" in code
    assert not (may_be_cpu and _autocast_devices(code)), code


@pytest.mark.parametrize("target", ["2.9"])
def test_xla_autocast_without_device_runs_on_the_cpu_path(migrated, target):
    # The control: the 2.9 form names no device (torch.autocast("xla", ...)), which also runs on the CPU path.
    code = migrated("29-xla-autocast-given-the-cpu-device", target).code["transcribe.py"]
    assert _calls(code, "torch.autocast") and not _autocast_devices(code), code


# Severity D (replicas train or decide differently) -----------------------------------------------------------


@BOTH
def test_metric_all_reduce_survives_the_device_count_fold(migrated, target):
    run = migrated("28-metric-all-reduce-under-device-count-folded", target)
    evaluate = ast.unparse(_function(run.code["train.py"], "evaluate"))
    reduced = any(name in evaluate for name in ("all_reduce", "mesh_reduce", "reduce_scatter"))
    reported = run.notes_at("train.py", (15, 16, 17))
    assert reduced or reported, f"evaluate():\n{evaluate}\nfindings: {_show(run.findings['train.py'])}"


@BOTH
def test_device_count_fixture_keeps_the_update_reduced(migrated, target):
    # The control: the training update is still reduced across replicas (the xm recipe), only the metric is not.
    code = migrated("28-metric-all-reduce-under-device-count-folded", target).code["train.py"]
    assert _calls(code, "xm.optimizer_step"), code


# Severity R (the migration changes what the program is) --------------------------------------------------------


@BOTH
def test_conditional_weight_tie_stays_conditional(migrated, target):
    run = migrated("36-conditional-weight-tie-made-unconditional", target)
    main = _function(run.code["train.py"], "main")
    unconditional = [ast.unparse(s) for s in main.body if isinstance(s, ast.Assign)
                     and ast.unparse(s.targets[0]).endswith(".weight")]
    assert not unconditional, f"re-tied in every run: {unconditional}; changes: {_show(run.changes['train.py'])}"


@BOTH
def test_conditional_tie_fixture_moves_the_model(migrated, target):
    # The control: the model and the batches go to the XLA device.
    code = migrated("36-conditional-weight-tie-made-unconditional", target).code["train.py"]
    assert ".to(device)" in code and "cuda" not in code, code


@BOTH
def test_explicit_cpu_program_is_left_alone(migrated, target):
    run = migrated("36-explicit-cpu-model-gets-device-loader", target)
    code = run.code["train_cpu.py"]
    recipe = [ast.unparse(c.func) for c in _calls(code, "pl.MpDeviceLoader", "xm.optimizer_step", "xm.save")]
    assert not recipe, f"XLA recipe on a CPU program: {recipe}; findings: {_show(run.findings['train_cpu.py'])}"


@BOTH
def test_fabric_managed_loader_is_not_wrapped_again(migrated, target):
    run = migrated("36-device-loader-around-fabric-loader", target)
    wrapped = [ast.unparse(c) for c in _calls(run.code["train.py"], "pl.MpDeviceLoader")]
    assert not wrapped, f"device loader around Fabric's loaders: {wrapped}"


@BOTH
def test_hf_optimizer_choice_that_runs_on_xla_is_kept(migrated, target):
    run = migrated("36-hf-optimizer-choice-replaced-by-adamw", target)
    optims = [ast.unparse(k.value) for c in _calls(run.code["train.py"], "TrainingArguments") for k in c.keywords
              if k.arg == "optim"]
    assert optims == ["'adafactor'"], f"optim={optims}; changes: {_show(run.changes['train.py'])}"


@BOTH
def test_hf_optimizer_fixture_moves_nothing_to_cuda(migrated, target):
    # The control: the model's .to("cuda") is gone (the Trainer places the model on the XLA device).
    assert '"cuda"' not in migrated("36-hf-optimizer-choice-replaced-by-adamw", target).code["train.py"]


# Severity L (the report is wrong) ------------------------------------------------------------------------------


@BOTH
def test_rank_property_compare_is_not_a_host_read(migrated, target):
    run = migrated("30-rank-property-compare-reported-as-host-read", target)
    false = run.notes_at("train.py", (24,), "XLA311")
    assert not false, f"findings: {_show(false)}"


@BOTH
def test_rank_fixture_still_reports_the_cuda_fabric(migrated, target):
    # The control: the Fabric asking for CUDA is reported (XLA908), the finding that matters in this fixture.
    run = migrated("30-rank-property-compare-reported-as-host-read", target)
    assert run.notes_at("train.py", (12,), "XLA908"), _show(run.findings["train.py"])
