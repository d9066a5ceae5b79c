"""The defect classes of the expert review's third round (12 real programs migrated as trees: Swin-Transformer,
Pytorch-UNet, DiT, llama2.c, stylegan2-pytorch, tacotron2, barlowtwins, Diffusion-Models-pytorch, SupContrast,
Image-Captioning, deep-text-recognition-benchmark, TinyLlama), one test per class on the self-written fixtures in
``fixtures/review/<issue>-<class>/`` (their READMEs say what is wrong today and what right looks like).

Same contract as tests/test_review_classes.py (whose helpers this module reuses): each test asserts the RIGHT
behaviour; a class the tool still gets wrong is marked ``known_defect(issue, what)``, a strict xfail that only an
AssertionError satisfies. When one XPASSes, check the output against its README and delete the mark.
"""

from __future__ import annotations

import ast
import re

from test_review_classes import BOTH, DEVICE, _function, _show, known_defect, migrated  # noqa: F401 (fixture)

RUNTIME_WORLD = {"2.9": ("xr.world_size()", "torch_xla.runtime.world_size()"),
                 "sagemaker": ("xm.xrt_world_size()", "xr.world_size()")}


# Severity S (silent wrong training) ----------------------------------------------------------------------------


@BOTH
def test_dropped_sync_batchnorm_is_replaced_or_reported(migrated, target):
    run = migrated("28-syncbn-dropped-silently", target)
    code = run.code["train.py"]
    replaced = re.search(r"torch_xla[\w.]*\.SyncBatchNorm|\bxf\.SyncBatchNorm", code)
    reported = run.notes_at("train.py", (28,))
    assert replaced or reported, f"findings: {_show(run.findings['train.py'])}"


@BOTH
def test_manual_seed_also_seeds_the_xla_generator(migrated, target):
    run = migrated("36-manual-seed-leaves-xla-rng-unseeded", target)
    main, text = _function(run.code["train.py"], "main")
    # xm.set_rng_state(seed) on both generations; torch_xla.manual_seed(seed) (which calls it) on 2.9.
    seeds_device = [n for n in ast.walk(main) if isinstance(n, ast.Call)
                    and ast.unparse(n.func) in ("xm.set_rng_state", "torch_xla.manual_seed")
                    and "seed" in ast.unparse(n)]
    reported = run.notes_at("train.py", (11, 12))
    assert seeds_device or reported, f"main() today:\n{text}\nfindings: {_show(run.findings['train.py'])}"


# Severity C (a crash the original did not have) ---------------------------------------------------------------


@BOTH
def test_device_count_named_gpu_stays_a_number(migrated, target):
    run = migrated("29-device-count-named-gpu-becomes-device", target)
    tree = ast.parse(run.code["train.py"])
    counts = {ast.unparse(t): ast.unparse(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
              for t in n.targets if ast.unparse(t) in ("opt.num_gpu", "n_gpu")}
    assert set(counts) == {"opt.num_gpu", "n_gpu"}, counts
    devices = {name: value for name, value in counts.items() if value == DEVICE[target]}
    assert not devices, f"counts bound to the device: {devices}"
    # Kept as a CUDA count, it is reported (XLA103: a number, 0 on a TPU host, like the original on a CPU).
    kept = {name for name, value in counts.items() if value == "torch.cuda.device_count()"}
    unreported = [name for name, line in (("opt.num_gpu", 27), ("n_gpu", 31))
                  if name in kept and not run.notes_at("train.py", (line,), "XLA103")]
    assert not unreported, f"findings: {_show(run.findings['train.py'])}"


@BOTH
def test_pack_padded_sequence_for_the_loss_is_reported(migrated, target):
    run = migrated("29-pack-padded-sequence-for-loss-unreported", target)
    code = run.code["train.py"]
    kept = "pack_padded_sequence(scores" in code
    reported = [n for n in run.notes_at("train.py", (29, 30)) if "pack" in n.message.lower()]
    assert not kept or reported, f"findings: {_show(run.findings['train.py'])}"


@BOTH
def test_cuda_kernel_library_imports_are_reported(migrated, target):
    run = migrated("29-cuda-kernel-imports-unreported", target)
    missing = []
    for rel, line, fragment in (("model.py", 3, "from flash_attn import"), ("model.py", 4, "from xformers"),
                                ("fused_rope.py", 1, "import rotary_emb"),
                                ("fused_rope.py", 9, "rotary_emb.apply_rotary(")):
        if fragment in run.code[rel] and not run.notes_at(rel, (line,)):
            missing.append(f"{rel}:{line} {fragment}")
    assert not missing, f"kept without a finding: {missing}; findings: {_show(run.findings['model.py'])}"


@BOTH
def test_world_size_from_a_device_count_comes_from_the_runtime(migrated, target):
    run = migrated("28-device-count-kept-as-world-size", target)
    code = run.code["train.py"]
    worker, text = _function(code, "worker")
    rebound = any(isinstance(n, ast.Assign) and any(ast.unparse(t) == "args.world_size" for t in n.targets)
                  and ast.unparse(n.value) in RUNTIME_WORLD[target] for n in ast.walk(worker))
    assert "torch.cuda.device_count()" not in code or rebound, f"worker() today:\n{text}"


# Severity G (extra graphs / host reads per step) --------------------------------------------------------------


@BOTH
def test_reads_in_an_imported_models_forward_are_reported(migrated, target):
    run = migrated("30-reads-in-imported-model-forward-unreported", target)
    forward = run.notes_at("model.py", (15,), "XLA311")
    helper = run.notes_at("utils.py", (5,), "XLA311")
    assert forward and helper, (f"model.py: {_show(run.findings['model.py'])}; "
                                f"utils.py: {_show(run.findings['utils.py'])}")


@BOTH
def test_library_cutmix_on_the_device_batch_is_reported(migrated, target):
    run = migrated("30-library-mixup-cutmix-on-device-unreported", target)
    reported = run.notes_at("train.py", (13, 23))
    assert reported, f"findings: {_show(run.findings['train.py'])}"
