"""The defect classes of the expert review's fourth round (13 real programs migrated as trees: PyTorch-VAE,
stylegan2-ada-pytorch, DeepLabV3Plus, pytorch-wgan, Deformable-DETR, qlora, pytorch-sentiment-analysis, vits,
hifi-gan, guided-diffusion, alpaca-lora, practical-pytorch, open_clip), one test per new class on the self-written fixtures in
``fixtures/review/<issue>-<class>/`` (their READMEs say what is wrong today and what right looks like).

Same contract as tests/test_review_classes.py (whose helpers this module reuses): each test asserts the RIGHT
behaviour; a class the tool still gets wrong is marked ``known_defect(issue, what)``, a strict xfail that only an
AssertionError satisfies. When one XPASSes, check the output against its README and delete the mark.
"""

from __future__ import annotations

import ast

from test_review_classes import BOTH, REVIEW, _function, _show, known_defect, migrated  # noqa: F401 (fixture)
from xla_migrate import migrate

BARRIERS = ("torch_xla.sync", "xm.mark_step")


def _barriers(tree: ast.AST) -> list[int]:
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) in BARRIERS]


# Severity C (a crash the original did not have) ---------------------------------------------------------------


@BOTH
def test_folded_gate_leaves_no_name_unbound(migrated, target):
    run = migrated("29-folded-gate-leaves-name-unbound", target)
    plan, text = _function(run.code["train.py"], "memory_plan")
    bound = any(isinstance(s, ast.Assign) and any(ast.unparse(t) == "n_gpus" for t in s.targets) for s in plan.body)
    reported = [n for n in run.notes_at("train.py", range(12, 18)) if "n_gpus" in n.message]
    assert bound or reported, f"memory_plan() today:\n{text}\nfindings: {_show(run.findings['train.py'])}"


@BOTH
def test_lightning_trainer_on_gpus_is_rewritten_or_reported(migrated, target):
    run = migrated("29-lightning-trainer-gpus-unreported", target)
    trainer = next(n for n in ast.walk(ast.parse(run.code["run.py"]))
                   if isinstance(n, ast.Call) and ast.unparse(n.func) == "Trainer")
    keywords = {k.arg: ast.unparse(k.value) for k in trainer.keywords}
    rewritten = "gpus" not in keywords and keywords.get("accelerator") in ("'tpu'", "'xla'")
    reported = [n for n in run.notes_at("run.py", (26,)) if n.code != "XLA900" or "gpus" in n.message]
    assert rewritten or reported, f"Trainer({keywords}); findings: {_show(run.findings['run.py'])}"


@BOTH
def test_a_renamed_selector_still_passes_its_own_check(migrated, target):
    run = migrated("29-impl-selector-renamed-past-its-check", target)
    op, text = _function(run.code["ops.py"], "scaled_act")
    default = ast.literal_eval(op.args.defaults[-1])
    check = next(n for n in ast.walk(op) if isinstance(n, ast.Assert))
    allowed = ast.literal_eval(check.test.comparators[0])
    assert default in allowed, f"scaled_act() today:\n{text}"


@BOTH
def test_lightning_fabric_strategy_is_rewritten_or_reported(migrated, target):
    run = migrated("29-lightning-fabric-strategy-unreported", target)
    code = run.code["pretrain.py"]
    torch_fsdp_kept = "FSDPStrategy(" in code.replace("XLAFSDPStrategy(", "")
    rewritten = not torch_fsdp_kept and 'accelerator="tpu"' in code
    reported = [n for n in run.notes_at("pretrain.py", (7, 8)) if n.code != "XLA900"]
    assert rewritten or reported, f"findings: {_show(run.findings['pretrain.py'])}"


@BOTH
def test_the_step_of_a_fabric_optimizer_is_left_to_fabric(migrated, target):
    # Fabric's strategy (XLAStrategy once XLA908's fix is made) reduces the gradients and runs the update: an
    # xm.optimizer_step would reduce again, a barrier after it cuts the step Fabric's loader already marks.
    run = migrated("29-lightning-fabric-strategy-unreported", target)
    main, text = _function(run.code["pretrain.py"], "main")
    assert "optimizer.step()" in text and "optimizer_step" not in text and not _barriers(main), text


@BOTH
def test_no_xla_device_named_by_the_local_rank(migrated, target):
    run = migrated("29-device-string-from-local-rank", target)
    init, text = _function(run.code["train.py"], "init_device")
    by_rank = [ast.unparse(n) for n in ast.walk(init) if isinstance(n, ast.JoinedStr) and "local_rank" in ast.unparse(n)]
    reported = [n for n in run.notes_at("train.py", (13,)) if n.code != "XLA900"]
    assert not by_rank or reported, f"init_device() today:\n{text}\nfindings: {_show(run.findings['train.py'])}"


# Severity G (extra graphs / host reads per step) --------------------------------------------------------------


@BOTH
def test_no_barrier_inside_a_model_of_a_project_base_class(migrated, target):
    run = migrated("30-barrier-in-model-of-project-base", target)
    in_model = _barriers(ast.parse(run.code["model.py"]))
    in_train = _barriers(ast.parse(run.code["train.py"]))
    assert in_train, f"train.py lost its step barrier:\n{run.code['train.py']}"
    assert not in_model, f"barriers in model.py at lines {in_model}; changes: {_show(run.changes['model.py'])}"


@BOTH
def test_a_model_deriving_from_nn_module_directly_gets_no_barrier(target):
    # The control: the same model with `nn.Module` as its base is left alone today (the class is the base).
    source = (REVIEW / "30-barrier-in-model-of-project-base" / "model.py").read_text()
    source = source.replace("from base import BaseModel\n", "").replace("(BaseModel)", "(nn.Module)")
    result = migrate(source.encode(), target=target, path="model.py")
    assert result.error is None and not _barriers(ast.parse(result.code)), result.code


@BOTH
def test_step_with_backward_out_of_sight_gets_a_barrier_or_a_finding(migrated, target):
    run = migrated("30-backward-in-factory-built-loss-no-barrier", target)
    loop, text = _function(run.code["train.py"], "training_loop")
    body_barriers = _barriers(loop)
    reported = [n for n in run.notes_at("train.py", range(22, 29)) if n.code != "XLA900"]
    assert body_barriers or reported, f"training_loop() today:\n{text}\nfindings: {_show(run.findings['train.py'])}"


@BOTH
def test_collate_class_padding_to_the_batch_max_is_reported(migrated, target):
    run = migrated("30-collate-class-pads-to-batch-max-unreported", target)
    reported = [n for n in run.notes_at("train.py", (*range(16, 29), 35)) if n.code != "XLA900"]
    assert reported, f"findings: {_show(run.findings['train.py'])}"


def test_trainer_script_counts_as_training_for_torch_compile(migrated):
    run = migrated("30-trainer-script-compile-kept-as-inference", "2.9")
    code = run.code["finetune.py"]
    forward_only = [n for n in run.changes["finetune.py"] if "only runs models forward" in n.message]
    assert "torch.compile(" not in code and not forward_only, (
        f"changes: {_show(run.changes['finetune.py'])}; findings: {_show(run.findings['finetune.py'])}")


# Severity R (the report) --------------------------------------------------------------------------------------


@BOTH
def test_conditions_without_tensor_values_are_not_reported(migrated, target):
    run = migrated("33-false-findings-3", target)
    false = run.notes_at("train.py", (34, 39), "XLA311")
    assert not false, f"false findings: {_show(false)}"
