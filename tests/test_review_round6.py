"""The defect classes of the expert review's sixth round (14 real programs migrated as trees: SupContrast, barlowtwins,
vit_10b_fsdp_example, DiT, Pytorch-UNet, Diffusion-Models-pytorch, llama2.c, tacotron2, rosinality stylegan2-pytorch,
deep-text-recognition-benchmark, the two sgrvinod tutorials, TCN, SRGAN-PyTorch), one test per new class on the
self-written fixtures in ``fixtures/review/<issue>-<class>/`` (their READMEs say what is wrong today and what right
looks like).

Same contract as tests/test_review_classes.py (whose helpers this module reuses): each test asserts the RIGHT
behaviour; a class the tool still gets wrong is marked ``known_defect(issue, what)``, a strict xfail that only an
AssertionError satisfies. When one XPASSes, check the output against its README and delete the mark.
"""

from __future__ import annotations

import ast

import pytest

from test_review_classes import BOTH, _show, known_defect, migrated  # noqa: F401


def _calls(code: str, *names: str) -> list[int]:
    return [n.lineno for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call) and ast.unparse(n.func) in names]


# Severity C (a crash the original did not have) ---------------------------------------------------------------


def test_removed_xm_names_are_rewritten_on_2_9(migrated):
    run = migrated("29-removed-xm-api-in-xla-script-left", "2.9")
    code = run.code["train_fsdp.py"]
    removed = _calls(code, "xm.get_ordinal", "xm.xrt_world_size")
    findings = _show(run.findings["train_fsdp.py"])
    assert not removed, f"removed torch_xla APIs still called at {removed}; findings: {findings}"
    assert _calls(code, "xr.world_size") and _calls(code, "xr.global_ordinal"), code


def test_removed_xm_names_stay_on_sagemaker(migrated):
    # The control: torch_xla 1.13 and 2.6.1 still have both names; an XLA script is left as it is there.
    run = migrated("29-removed-xm-api-in-xla-script-left", "sagemaker")
    assert len(_calls(run.code["train_fsdp.py"], "xm.get_ordinal", "xm.xrt_world_size")) == 3
    assert not [n for n in run.findings["train_fsdp.py"] if n.code == "XLA904"]


@BOTH
def test_cuda_stream_prefetcher_is_rewritten(migrated, target):
    run = migrated("29-cuda-stream-prefetcher-left", target)
    left = _calls(run.code["train.py"], "torch.cuda.Stream", "torch.cuda.stream", "torch.cuda.current_stream")
    assert not left, f"CUDA stream calls left at {left}; findings: {_show(run.findings['train.py'])}"


@BOTH
def test_dist_reduce_becomes_an_all_reduce(migrated, target):
    run = migrated("29-dist-reduce-kept-on-xla-process-group", target)
    code = run.code["train.py"]
    kept = _calls(code, "dist.reduce", "torch.distributed.reduce")
    assert not kept, f"dist.reduce kept at {kept}; findings: {_show(run.findings['train.py'])}"
    assert _calls(code, "xm.all_reduce", "dist.all_reduce"), code


@BOTH
def test_integer_device_ordinals_are_rewritten_or_reported(migrated, target):
    run = migrated("29-integer-device-ordinal-kept", target)
    tree = ast.parse(run.code["metric.py"])
    kept = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func).endswith(".to")
            and any("gpu_ids" in ast.unparse(a) for a in [*n.args, *(k.value for k in n.keywords)])]
    reported = [n for n in run.findings["metric.py"] if n.line in kept]
    assert not kept or len(reported) >= len(kept), (
        f"integer device ordinals kept at {kept}; findings: {_show(run.findings['metric.py'])}")


@BOTH
def test_tied_weights_are_tied_again_after_the_move(migrated, target):
    # The control: Module.to(xla) unties shared parameters; the tie is made again before the optimizer is built.
    run = migrated("29-tied-weights-after-to-device", target)
    tree = ast.parse(run.code["train.py"])
    moves = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "model.to"]
    ties = [n.lineno for n in tree.body if isinstance(n, ast.Assign)
            and ast.unparse(n) == "model.tok_embeddings.weight = model.output.weight"]
    optimizers = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call)
                  and ast.unparse(n.func) == "torch.optim.AdamW"]
    assert moves and ties and optimizers, run.code["train.py"]
    assert moves[0] < ties[0] < optimizers[0], run.code["train.py"]


# Severity G (extra graphs / host reads per step) --------------------------------------------------------------


@BOTH
def test_ctc_loss_is_reported(migrated, target):
    run = migrated("30-ctc-loss-cpu-fallback-unreported", target)
    reported = [n for n in run.notes_at("train.py", range(20, 29)) if "ctc" in n.message.lower()]
    assert reported, f"findings: {_show(run.findings['train.py'])}"


# Severity L (a finding that sends a human to code that is fine) -----------------------------------------------


@BOTH
def test_no_read_finding_on_a_cpu_tensor(migrated, target):
    run = migrated("33-false-finding-on-cpu-tensor-compare", target)
    real = run.notes_at("train.py", [18], "XLA311")
    assert real, f"the real .item() read lost its finding: {_show(run.findings['train.py'])}"
    false = run.notes_at("train.py", [26], "XLA311")
    assert not false, f"false findings: {_show(false)}"


@pytest.mark.parametrize("name", ["29-removed-xm-api-in-xla-script-left", "30-ctc-loss-cpu-fallback-unreported",
                                  "33-false-finding-on-cpu-tensor-compare", "29-tied-weights-after-to-device",
                                  "29-cuda-stream-prefetcher-left",
                                  "29-dist-reduce-kept-on-xla-process-group",
                                  "29-integer-device-ordinal-kept"])
def test_single_file_fixtures_migrate_without_error(name, migrated):
    # The control: each fixture migrates (a crash of the tool would hide a class behind an error).
    run = migrated(name, "2.9")
    assert all(code.strip() for code in run.code.values())
