"""The defect classes of the expert review's fifth round (10 real programs migrated as trees: ignite-playground,
cleanrl, vit-pytorch, iatransfer, pytorch-deep-learning, LLaVA, FastChat, NYU-DLSP20, pytorch-seq2seq, torchtitan),
one test per new class on the self-written fixtures in ``fixtures/review/<issue>-<class>/`` (their READMEs say what
is wrong today and what right looks like).

Same contract as tests/test_review_classes.py (whose helpers this module reuses): each test asserts the RIGHT
behaviour; a class the tool still gets wrong is marked ``known_defect(issue, what)``, a strict xfail that only an
AssertionError satisfies. When one XPASSes, check the output against its README and delete the mark.
"""

from __future__ import annotations

import ast
import types

import pytest

from test_review_classes import BOTH, REVIEW, _function, _show, _tree_run, known_defect, migrated  # noqa: F401

BARRIERS = ("torch_xla.sync", "xm.mark_step")


def _barriers(tree: ast.AST) -> list[int]:
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) in BARRIERS]


def _mentions(notes, word: str) -> list:
    return [n for n in notes if word.lower() in n.message.lower() and n.code != "XLA900"]


# Severity C (a crash the original did not have) ---------------------------------------------------------------


@BOTH
def test_a_negated_cuda_guard_keeps_the_cuda_path_off(migrated, target):
    run = migrated("29-negated-cuda-guard-folded-wrong-way", target)
    init, text = _function(run.code["attend.py"], "__init__")
    queries = [n for n in ast.walk(init)
               if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("get_device_properties")]
    guard = next((n for n in init.body if isinstance(n, ast.If) and isinstance(n.body[0], ast.Return)), None)
    off = not queries or any(isinstance(n, ast.Return) and n.lineno < queries[0].lineno for n in init.body)
    if not off and guard is not None:
        # The guard as a TPU host evaluates it: no CUDA, flash requested. True: the CUDA query stays unreached.
        no_cuda = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False))
        try:
            off = bool(eval(compile(ast.Expression(guard.test), "attend.py", "eval"),
                            {"torch": no_cuda, "use_flash": True}))
        except NameError:
            off = False
    assert off, f"__init__() today:\n{text}\nfindings: {_show(run.findings['attend.py'])}"


def test_no_compile_cache_in_a_module_a_notebook_imports(tmp_path):
    run = _tree_run(REVIEW / "29-compile-cache-in-module-imported-late", "2.9", tmp_path)
    calls = [ast.unparse(n) for n in ast.walk(ast.parse(run.code["predict.py"]))
             if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("initialize_cache")]
    assert not calls, f"predict.py today:\n{run.code['predict.py']}\nchanges: {_show(run.changes['predict.py'])}"


@BOTH
def test_flash_attention_2_is_rewritten_or_reported(migrated, target):
    run = migrated("29-hf-flash-attention-2-unreported", target)
    rewritten = "flash_attention_2" not in run.code["finetune.py"]
    reported = _mentions(run.findings["finetune.py"], "flash")
    assert rewritten or reported, f"findings: {_show(run.findings['finetune.py'])}"


@BOTH
def test_deepspeed_is_reported(migrated, target):
    run = migrated("29-deepspeed-unreported", target)
    reported = _mentions(run.findings["train_lora.py"], "deepspeed")
    assert reported, f"findings: {_show(run.findings['train_lora.py'])}"


# Severity G (extra graphs / host reads per step) --------------------------------------------------------------


@BOTH
def test_no_barrier_in_a_host_loop_without_tensor_work(migrated, target):
    run = migrated("30-barrier-in-host-loop-of-model-named-helper", target)
    assert _barriers(ast.parse(run.code["train.py"])), f"train.py lost its step barrier:\n{run.code['train.py']}"
    in_matcher = _barriers(ast.parse(run.code["matching.py"]))
    assert not in_matcher, f"barriers in matching.py at {in_matcher}; changes: {_show(run.changes['matching.py'])}"


@BOTH
def test_coin_toss_teacher_forcing_is_reported_or_on_the_device(migrated, target):
    run = migrated("30-coin-toss-teacher-forcing-recompiles", target)
    forward, text = _function(run.code["train.py"], "forward")
    tosses = [n for n in ast.walk(forward) if isinstance(n, ast.Call) and ast.unparse(n.func) == "random.random"]
    reported = [n for n in run.notes_at("train.py", range(21, 27)) if n.code != "XLA900"]
    assert not tosses or reported, f"forward() today:\n{text}\nfindings: {_show(run.findings['train.py'])}"


# Severity R (report wrong) ------------------------------------------------------------------------------------


@BOTH
def test_a_single_process_script_gets_no_worker_findings(migrated, target):
    run = migrated("33-distributed-decision-leaks-via-shared-helper", target)
    workers = [n for n in run.findings["single.py"] if n.code in ("XLA408", "XLA407", "XLA401")]
    assert not workers, f"single.py findings: {_show(run.findings['single.py'])}"


@pytest.mark.parametrize("name", ["29-negated-cuda-guard-folded-wrong-way", "29-hf-flash-attention-2-unreported",
                                  "29-deepspeed-unreported", "30-coin-toss-teacher-forcing-recompiles"])
def test_single_file_fixtures_migrate_without_error(name, migrated):
    # The control: each fixture migrates (a crash of the tool would hide a class behind an error).
    run = migrated(name, "2.9")
    assert all(code.strip() for code in run.code.values())
