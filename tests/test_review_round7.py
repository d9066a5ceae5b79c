"""The defect classes of the expert review's seventh round (real programs migrated as trees: SimCLR, minimalRL,
waveglow, ssd.pytorch, PyTorch-YOLOv3, semantic-segmentation-pytorch, TinyLlama, yolov5, pytorch/ignite's
examples), one test per new class on the self-written fixtures in ``fixtures/review/<issue>-<class>/`` (their
READMEs say what is wrong today, what was measured, and what right looks like).

Same contract as tests/test_review_classes.py (whose helpers this module reuses): each test asserts the RIGHT
behaviour; a class the tool still gets wrong is marked ``known_defect(issue, what)``, a strict xfail that only an
AssertionError satisfies. When one XPASSes, check the output against its README and delete the mark.
"""

from __future__ import annotations

import ast

from test_review_classes import BOTH, REVIEW, _show, known_defect, migrated  # noqa: F401


def _calls(code: str, *names: str) -> list[int]:
    return [n.lineno for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call) and ast.unparse(n.func) in names]


def _loop_bodies_with(code: str, call: str) -> list[ast.For]:
    """The ``for`` loops whose own body (not a nested loop's) holds a call to ``call``."""
    loops = []
    for loop in (n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.For)):
        for stmt in loop.body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and ast.unparse(stmt.value.func) == call:
                loops.append(loop)
    return loops


# Severity C (a crash the original did not have) ---------------------------------------------------------------


@BOTH
def test_cuda_default_tensor_type_is_dropped_or_reported(migrated, target):
    run = migrated("29-default-tensor-type-cuda-kept", target)
    code = run.code["train.py"]
    kept = [n.lineno for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call)
            and ast.unparse(n.func) == "torch.set_default_tensor_type" and "cuda" in ast.unparse(n.args[0])]
    reported = [f for f in run.findings["train.py"] if f.code != "XLA900" and "default" in f.message.lower()]
    assert not kept or reported, f"CUDA default tensor type kept at {kept}; findings: {_show(run.findings['train.py'])}"


@BOTH
def test_cuda_default_tensor_type_fixture_moves_the_rest(migrated, target):
    # The control: everything around the default type is migrated (the model, the batches, the loss's .cuda()).
    run = migrated("29-default-tensor-type-cuda-kept", target)
    code = run.code["train.py"]
    assert ".cuda()" not in code and code.count(".to(device)") >= 3, code


@BOTH
def test_cuda_device_context_is_dropped(migrated, target):
    run = migrated("29-cuda-device-context-kept", target)
    kept = _calls(run.code["train.py"], "torch.cuda.device")
    assert not kept, f"torch.cuda.device kept at {kept}; findings: {_show(run.findings['train.py'])}"


# Severity G (more graphs or recompilations per step) ---------------------------------------------------------


@BOTH
def test_step_over_an_optimizer_list_gets_a_barrier(migrated, target):
    run = migrated("30-optimizer-list-loop-step-no-barrier", target)
    code = run.code["train.py"]
    barrier = "torch_xla.sync" if target == "2.9" else "xm.mark_step"
    step_loops = [loop for loop in _loop_bodies_with(code, barrier) if "range(epoch_iters)" in ast.unparse(loop.iter)]
    device_loader = "MpDeviceLoader" in code
    assert step_loops or device_loader, f"no barrier in the step loop; findings: {_show(run.findings['train.py'])}"


@BOTH
def test_optimizer_list_steps_become_xm_steps(migrated, target):
    # The control: each optimizer of the list is stepped the xm way (what the tool gets right today).
    run = migrated("30-optimizer-list-loop-step-no-barrier", target)
    assert _calls(run.code["train.py"], "xm.optimizer_step"), run.code["train.py"]


@BOTH
def test_bool_mask_indexing_in_step_callees_is_reported(migrated, target):
    run = migrated("30-bool-mask-indexing-in-step-callee-unreported", target)
    in_method = run.notes_at("train.py", (18, 25), "XLA312")
    in_import = run.notes_at("losses.py", (11, 12, 13, 14), "XLA312") + [
        f for f in run.notes_at("train.py", (25,), "XLA312") if "contrastive_loss" in f.message]
    assert in_method and in_import, (
        f"train.py: {_show(run.findings['train.py'])}; losses.py: {_show(run.findings['losses.py'])}")


@BOTH
def test_variable_box_count_targets_are_reported(migrated, target):
    run = migrated("30-variable-box-count-targets-recompile", target)
    reported = [f for f in run.findings["train.py"] if f.code == "XLA312" and f.line in range(20, 50)]
    assert reported, f"findings: {_show(run.findings['train.py'])}"


# Severity L (the report is wrong) ------------------------------------------------------------------------------


@BOTH
def test_rewritten_typed_tensor_is_not_reported_left(migrated, target):
    run = migrated("33-typed-tensor-rewritten-but-reported-left", target)
    assert "torch.cuda." not in run.code["model.py"].replace('"torch.cuda.HalfTensor"', ""), run.code["model.py"]
    false_left = run.notes_at("model.py", (15, 17), "XLA900")
    assert not false_left, f"findings: {_show(false_left)}"


@BOTH
def test_typed_tensor_construction_is_rewritten(migrated, target):
    # The control: the construction itself is migrated (the output runs on torch_xla 2.9, checked by hand).
    code = migrated("33-typed-tensor-rewritten-but-reported-left", target).code["model.py"]
    assert "torch.FloatTensor(cond.size(0), 8).to(device).normal_()" in code, code


# Severity R (the migration changes what the program is) --------------------------------------------------------


@BOTH
def test_cpu_only_program_is_left_alone(migrated, target):
    run = migrated("36-cpu-only-program-gets-xla-step", target)
    code = run.code["hogwild.py"]
    step_recipe = _calls(code, "xm.optimizer_step", "torch_xla.sync", "xm.mark_step")
    findings = _show(run.findings["hogwild.py"])
    assert not step_recipe, f"xm step recipe on a CPU optimizer at {step_recipe}; findings: {findings}"
    assert code == (REVIEW / "36-cpu-only-program-gets-xla-step" / "hogwild.py").read_text()
    said = run.notes_at("hogwild.py", (37,), "XLA004")  # the worker's loss.backward()
    assert len(said) == 1 and "never uses CUDA" in said[0].message, findings
