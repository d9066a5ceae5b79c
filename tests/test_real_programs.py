"""The real-programs suite's own logic (benchmarks/real_programs.py and real_programs_measure.py), without torch:
torch_xla's metrics file read per step marker, the loss comparisons, the suite's verdict and its agreement
with verify's, the comparison of two runs' JSON, the recipes themselves, and the copy/launcher plumbing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import real_programs as rp  # noqa: E402
import real_programs_measure as measure  # noqa: E402
from _recipe import Recipe, Substitution  # noqa: E402


def metrics_block(step: int, compiles: int, cached: int, uncached: int, reads: int = 0, extra: str = "") -> str:
    """One block as torch_xla's metrics_saver writes it (metrics with their samples, counters with a value)."""
    return (f"[MetricsData; step={step}]\n"
            f"Metric: CompileTime\n  TotalSamples: {compiles}\n  Accumulator: 1s\n  Percentiles: 1%=1ms\n"
            f"Metric: ExecuteTime\n  TotalSamples: {cached + uncached}\n  Accumulator: 2ms\n"
            f"Counter: CachedCompile\n  Value: {cached}\n"
            f"Counter: UncachedCompile\n  Value: {uncached}\n"
            f"Counter: aten::_local_scalar_dense\n  Value: {reads}\n{extra}\n")


def test_metrics_file_gives_per_step_figures_after_verify_warmup():
    # 8 markers (warm-up: the first 4, half of a run this short): 1 graph per step up to marker 5, then 2 per
    # step (a read mid-step); a third compilation at marker 7; one host read per step; a fallback op at the end.
    executions = [1, 2, 3, 4, 5, 7, 9, 11]
    compiles = [1, 2, 2, 2, 2, 2, 3, 3]
    blocks = [metrics_block(step, compiles[step], executions[step] - compiles[step], compiles[step], reads=step + 1,
                            extra="Counter: aten::nonzero\n  Value: 4\n" if step == 7 else "")
              for step in range(8)]
    parsed = measure.parse_metrics_file("".join(blocks))
    assert len(parsed) == 8
    assert parsed[6]["metrics"]["CompileTime"] == 3 and parsed[6]["counters"]["CachedCompile"] == 6
    figures = measure.metrics_figures(parsed)
    assert figures["markers"] == 8 and figures["warmup"] == 4 and figures["after_warmup"] == 4
    assert figures["compiles_after_warmup"] == 1
    assert figures["executions_per_step"] == (11 - 4) / 4
    assert figures["reads_per_step"] == 1.0
    assert figures["fallbacks"] == {"aten::nonzero": 4}


def traced(ops: dict[str, int]) -> str:
    return "".join(f"Counter: xla::{op}\n  Value: {n}\n" for op, n in ops.items())


def run_of(steps: list[tuple[str, int]]) -> list[dict]:
    """A metrics file of steps (graph, compiles at that step): each graph traces its own ops, once a step."""
    graph_ops = {"train": ("mm", "addmm", "mse_loss_backward"), "eval": ("addmm", "max", "eq"),
                 "cnn": ("convolution_overrideable", "convolution_backward_overrideable")}
    counts: dict[str, int] = {}
    compiles, blocks = 0, []
    for step, (graph, compiled) in enumerate(steps):
        for op in graph_ops[graph]:
            counts[op] = counts.get(op, 0) + 1
        compiles += compiled
        blocks.append(metrics_block(step, compiles, step + 1 - compiles, compiles, extra=traced(counts)))
    return measure.parse_metrics_file("".join(blocks))


def test_a_new_graph_first_reached_after_warmup_is_its_own_warmup():
    # training compiles at its first two steps; after warm-up an evaluation graph and another model's graph
    # compile theirs (two steps each), then run from the cache: first compiles, not recompilations
    steps = [("train", 1), ("train", 1)] + [("train", 0)] * 6 + [("eval", 1), ("eval", 1), ("eval", 0)]
    steps += [("cnn", 1), ("cnn", 1)] + [("cnn", 0)] * 4 + [("train", 0)] * 3
    figures = measure.metrics_figures(run_of(steps))
    assert figures["compiles_after_warmup"] == 4
    assert (figures["first_compiles_after_warmup"], figures["recompiles_after_warmup"]) == (4, 0)
    assert measure.own_problems({"exit_status": 0}, figures, {"ok": True}) == []


def test_a_graph_that_compiles_again_after_its_warmup_is_recompiling():
    # the training graph compiles at every step (a shape or a Python value changes): the same ops each time
    steps = [("train", 1)] * 12 + [("eval", 1), ("eval", 1)]
    figures = measure.metrics_figures(run_of(steps))
    assert (figures["first_compiles_after_warmup"], figures["recompiles_after_warmup"]) == (2, 7)
    assert measure.own_problems({"exit_status": 0}, figures, {"ok": True}) == ["recompilation"]
    # a known graph that ran from the cache and compiles again: two steps of new warm-up (new shapes once: a
    # test set), and recompiling from the third compiling step in a row on
    late = measure.metrics_figures(run_of([("train", 1), ("train", 1)] + [("train", 0)] * 8 + [("train", 1)] * 4))
    assert (late["first_compiles_after_warmup"], late["recompiles_after_warmup"]) == (2, 2)


def test_executions_per_step_skip_markers_that_ran_nothing_and_are_judged_on_whole_counts():
    # 3 epochs of 4 steps, each step two graphs (a read mid-step), then 2 markers with nothing to run
    launched, blocks = 0, []
    for epoch in range(3):
        for work in [2, 2, 2, 2, 0, 0]:
            launched += work
            blocks.append(metrics_block(len(blocks), 1, launched - 1, 1))
    figures = measure.metrics_figures(measure.parse_metrics_file("".join(blocks)))
    assert (figures["after_warmup"], figures["busy_steps"], figures["executions_after_warmup"]) == (13, 8, 16)
    assert figures["executions_per_step"] == 2.0
    assert measure.own_problems({"exit_status": 0}, figures, {"ok": True}) == ["executions"]
    # 8 executions in 7 steps is within the spare one: 1.143 x 7 once rounded up to a ninth
    spare = dict(figures, after_warmup=7, busy_steps=7, executions_after_warmup=8, executions_per_step=1.143)
    assert measure.own_problems({"exit_status": 0}, spare, {"ok": True}) == []


def test_no_metrics_means_no_device_work():
    figures = measure.metrics_figures([])
    assert figures["markers"] == 0 and figures["executions"] == 0 and figures["executions_per_step"] is None
    problems = measure.own_problems({"exit_status": 0}, figures, {"ok": True})
    assert problems == ["not-on-xla"] and measure.status_of(problems) == "not-on-xla"


def test_fp32_losses_are_compared_value_by_value():
    same = measure.compare_losses([1.0, 0.9, 0.8], [1.0, 0.9, 0.8005], amp=False, random=False)
    assert same["ok"] and same["mode"] == "fp32" and same["max_delta"] == pytest.approx(5e-4)
    off = measure.compare_losses([1.0, 0.95, 0.8], [1.0, 0.9, 0.8], amp=False, random=False)
    assert off["ok"] is False and off["max_delta"] == pytest.approx(0.05)
    short = measure.compare_losses([1.0, 0.9], [1.0, 0.9, 0.8], amp=False, random=False)
    assert short["ok"] is False and "2 loss values, the original 3" in short["note"]
    assert measure.compare_losses([], [1.0], amp=False, random=False)["ok"] is False
    assert measure.compare_losses([1.0], [], amp=False, random=False)["ok"] is None  # nothing to compare with


def test_random_and_amp_programs_are_compared_by_verify_s_curve_definition():
    reference = [2.0, 1.8, 1.7, 1.5, 1.4, 1.3, 1.2, 1.1]
    noisy = [2.05, 1.75, 1.72, 1.48, 1.42, 1.28, 1.22, 1.08]  # another draw of the same learning curve
    close = measure.compare_losses(noisy, reference, amp=False, random=True)
    assert close["mode"] == "random" and close["ok"] and close["relative_l1"] < 0.1 and close["r2"] > 0.8
    assert "R² >= 0.8" in close["tolerance"]
    flat = measure.compare_losses([2.0] * 8, reference, amp=False, random=True)  # stopped learning
    assert flat["ok"] is False and flat["relative_l1"] > 0.1
    # AMP: the bf16 curve comparison, as verify's (a decreasing curve 30% off is no longer enough)
    bf16 = [v * 1.0005 for v in reference]
    assert measure.compare_losses(bf16, reference, amp=True, random=False)["ok"]
    off = measure.compare_losses([v * 1.3 for v in reference], reference, amp=True, random=False)
    assert off["mode"] == "amp" and off["ok"] is False and measure.losses_cell(off).startswith("DIFF~")
    assert not measure.compare_losses([2.0, float("nan"), 1.5, 1.2], [1.0] * 4, amp=True, random=False)["ok"]
    # unseeded weight init: other models, judged by the level alone (as verify does)
    quick = [0.35, 0.336, 0.331, 0.336, 0.335, 0.327, 0.336, 0.329, 0.33, 0.329, 0.326, 0.327]
    steady = [0.354, 0.348, 0.349, 0.341, 0.342, 0.336, 0.339, 0.347, 0.336, 0.331, 0.328, 0.332]
    assert measure.compare_losses(quick, steady, amp=False, random=True)["ok"] is False
    assert measure.compare_losses(quick, steady, amp=False, random=True, different_start=True)["ok"] is True
    short = measure.compare_losses([1.0, 0.9], [1.0, 0.8], amp=False, random=True)
    assert short["ok"] is None and measure.losses_cell(short) == "random -"


def figures(markers=10, executions_per_step=1.0, compiles_late=0, fallbacks=None):
    return {"markers": markers, "after_warmup": markers - 5, "executions": 10, "compiles_after_warmup": compiles_late,
            "executions_per_step": executions_per_step, "fallbacks": fallbacks or {}}


def test_own_verdict_uses_verify_thresholds():
    assert measure.own_problems({"exit_status": 1}, figures(), {"ok": True}) == ["crash"]
    assert measure.own_problems({"exit_status": None, "timed_out": True}, figures(), {}) == ["crash"]
    assert measure.own_problems({"exit_status": 0}, figures(), {"ok": True}) == []
    # 5 steps after warm-up: one spare execution is allowed, two are not
    assert measure.own_problems({"exit_status": 0}, figures(executions_per_step=1.2), {}) == []
    assert measure.own_problems({"exit_status": 0}, figures(executions_per_step=1.4), {}) == ["executions"]
    assert measure.own_problems({"exit_status": 0}, figures(compiles_late=3), {}) == ["recompilation"]
    kinds = measure.own_problems({"exit_status": 0}, figures(fallbacks={"aten::nonzero": 2}), {"ok": False})
    assert kinds == ["fallback", "losses"] and measure.status_of(kinds) == "divergence"


def verify_report(status: str, *kinds: str) -> dict:
    return {"verdict": {"status": status, "exit_code": 0 if status == "clean" else 1, "line": f"verdict: {status}",
                        "problems": [{"kind": k, "message": k} for k in kinds]}}


def test_agreement_is_judged_on_the_kinds_both_measure():
    assert measure.agreement([], verify_report("clean")) == (True, "")
    # verify's host-read finding has no independent counterpart: it neither agrees nor disagrees
    assert measure.agreement([], verify_report("slowdown", "host-reads")) == (True, "")
    assert measure.agreement(["crash"], verify_report("crash", "timeout")) == (True, "")
    agrees, why = measure.agreement(["losses"], verify_report("clean"))
    assert agrees is False and why == "verify misses losses"
    agrees, why = measure.agreement([], verify_report("divergence", "losses"))
    assert agrees is False and why == "verify also says losses"
    agrees, why = measure.agreement(["not-on-xla"], verify_report("clean"))
    assert agrees is False and "not-on-xla" in why
    assert measure.agreement([], None) == (None, "verify gave no report")


def variant(label="2.9", exit_status=0, ok=True, per_step=1.0, status="clean", agrees=True, resume="n/a"):
    return {"label": label, "run": {"exit_status": exit_status}, "losses": {"ok": ok},
            "own": {"executions_per_step": per_step, "compiles_after_warmup": 0, "reads_per_step": 0.0,
                    "fallbacks": {}},
            "verify": {"report": verify_report(status)}, "agrees": agrees, "resume": {"status": resume}}


def test_compare_lists_what_got_better_and_worse():
    old = {"programs": [{"name": "a", "variants": [variant(exit_status=1, ok=None, status="crash", per_step=None)]},
                        {"name": "b", "variants": [variant(per_step=1.0), variant("sagemaker")]}]}
    new = {"programs": [{"name": "a", "variants": [variant()]},
                        {"name": "b", "variants": [variant(per_step=2.0, status="slowdown")]},
                        {"name": "c", "variants": [variant()]}]}
    lines = measure.compare(old, new)
    text = "\n".join(lines)
    better = text.split("worse")[0]
    worse = text.split("worse")[1]
    assert "a [2.9]: runs no -> yes" in better and "a [2.9]: verify verdict crash -> clean" in better
    assert "b [2.9]: graph executions per step 1 -> 2" in worse and "b [2.9]: verify verdict clean -> slowdown" in worse
    assert "new: c [2.9]" in lines and "gone: b [sagemaker]" in lines


def test_table_summary_and_notes_from_records():
    program = {"name": "p", "original": {"exit_status": 0}, "variants": [
        {**variant(), "migrate": {"exit_status": 0, "changes": 7, "findings": 2}, "status": "clean", "problems": [],
         "losses": {"mode": "fp32", "ok": True, "max_delta": 1e-6, "values": 3, "original": 3}},
        {**variant("sagemaker", exit_status=1, status="crash"), "migrate": {"exit_status": 0, "changes": 5,
         "findings": 1}, "status": "crash", "problems": ["crash"], "losses": {"note": "no loss in the output's run"},
         "run": {"exit_status": 1, "last_error_line": "RuntimeError: boom"}}]}
    table = measure.render_table([program])
    assert table[0].split()[:4] == ["program", "target", "chg/find", "run"]
    assert "=1e-06" in table[2] and "7/2" in table[2] and " crash " in table[3]
    notes = measure.render_notes([program])
    assert "p [sagemaker]: crash: RuntimeError: boom" in notes
    summary = measure.summarize([program])
    assert summary["2.9"]["ran_clean_exit"] == 1 and summary["2.9"]["losses_equal"] == 1
    assert summary["sagemaker"]["new_crashes"] == 1 and summary["sagemaker"]["ran_clean_exit"] == 0
    # a crash both verify and the suite see is an agreement: counted among the runs verify agrees on
    assert summary["sagemaker"]["verify_agrees"] == 1 and summary["2.9"]["verify_agrees"] == 1
    assert "verify agrees on 1 of 1 run" in measure.render_summary(summary)[1]


def test_parameters_never_on_xla_are_not_on_xla_measured_by_the_suite_s_own_probe(tmp_path):
    # the probe's records (benchmarks/real_programs_placement.py), one per process: an optimizer built before
    # the model moved steps its CPU parameters though graphs ran on the device
    (tmp_path / "11.json").write_text(json.dumps({"pid": 11, "optimizers": [
        {"optimizer": "RMSprop", "steps": 8, "devices": {"cpu": 1200}}]}))
    (tmp_path / "12.json.tmp").write_text("{half written")
    off = measure.placement_figures(measure.read_placement(tmp_path))
    assert off == {"optimizer_steps": 8, "parameters": {"cpu": 1200}, "on_xla": False}
    late = figures()
    problems = measure.own_problems({"exit_status": 0}, {**late, "placement": off}, {"ok": False})
    assert problems == ["not-on-xla"] and measure.status_of(problems) == "not-on-xla"  # losses not judged
    assert measure.agreement(problems, verify_report("not-on-xla", "not-on-xla")) == (True, "")
    # one optimizer on XLA (a second process's): on XLA; no optimizer stepped: nothing to tell
    (tmp_path / "12.json").write_text(json.dumps({"pid": 12, "optimizers": [
        {"optimizer": "AdamW", "steps": 2, "devices": {"xla": 1200}}]}))
    assert measure.placement_figures(measure.read_placement(tmp_path))["on_xla"] is True
    assert measure.placement_figures([])["on_xla"] is None
    assert measure.own_problems({"exit_status": 0}, {**late, "placement": measure.placement_figures([])},
                                {"ok": True}) == []


def test_recipes_load_and_name_no_repository_kept_for_the_independent_evaluation():
    kept_out = {"pytorch/examples", "pytorch/xla", "huggingface/transformers", "huggingface/accelerate",
                "huggingface/trl", "huggingface/peft", "huggingface/pytorch-image-models",
                "huggingface/alignment-handbook", "karpathy/nanogpt", "karpathy/mingpt", "karpathy/build-nanogpt",
                "kellerjordan/modded-nanogpt", "facebookresearch/mae", "facebookresearch/moco",
                "facebookresearch/detr", "facebookresearch/deit", "facebookresearch/dino",
                "facebookresearch/convnext", "eriklindernoren/pytorch-gan", "yunjey/pytorch-tutorial",
                "kuangliu/pytorch-cifar", "lucidrains/denoising-diffusion-pytorch", "openai/improved-diffusion",
                "tatsu-lab/stanford_alpaca"}
    recipes = rp.load_recipes()
    assert len({r.name for r in recipes}) == len(recipes) >= 3
    for recipe in recipes:
        assert recipe.repo.lower() not in kept_out, recipe.name
        assert "/" in recipe.repo and recipe.entry and recipe.style
        for sub in (*recipe.substitutions, *recipe.original_substitutions):  # never a line of the program
            assert "\n" not in sub.old and len(sub.old) <= 40, (recipe.name, sub.old)


def test_a_missing_repository_is_one_line_naming_it(tmp_path, capsys):
    (tmp_path / "extras").mkdir()
    (tmp_path / "extras" / ".complete").write_text("")
    code = rp.main(["--cache", str(tmp_path / "empty"), "--extras", str(tmp_path / "extras"), "--only", "llama2c",
                    "--python-current", sys.executable, "--python-sagemaker", sys.executable])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "karpathy/llama2.c is not in the cache" in err[0] and "karpathy+llama2.c" in err[0]


def test_copy_substitutions_must_match_and_launcher_runs_the_original_in_its_folder(tmp_path):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "helper.py").write_text("WIDTH = 64\n")
    (repo / "train.py").write_text(
        "import os, sys\nfrom pkg.helper import WIDTH\nimport lib\n"
        "print('cwd', os.getcwd()); print('argv', sys.argv[1:]); print('width', WIDTH); print('lib', lib.WHERE)\n")
    (repo / "lib.py").write_text("WHERE = 'original'\n")
    recipe = Recipe(name="t", repo="o/r", entry="train.py", style="test",
                    substitutions=(Substitution("pkg/helper.py", "64", "8"),), files={"cfg/tiny.yaml": "a: 1\n"},
                    data=lambda root: (root / "data.txt").write_text("x"))
    dest = tmp_path / "copy"
    rp.prepare_copy(recipe, repo, dest)
    assert (dest / "pkg" / "helper.py").read_text() == "WIDTH = 8\n"
    assert (dest / "cfg" / "tiny.yaml").exists() and (dest / "data.txt").exists()
    bad = Recipe(name="t", repo="o/r", entry="train.py", style="test",
                 substitutions=(Substitution("pkg/helper.py", "64", "8", count=2),))
    with pytest.raises(rp.RecipeError, match="found 1 times, expected 2"):
        rp.prepare_copy(bad, repo, tmp_path / "copy2")
    # the output's tree: another lib.py, which the original must not import
    out = tmp_path / "out"
    out.mkdir()
    (out / "lib.py").write_text("WHERE = 'output'\n")
    launcher = rp.write_launcher(tmp_path / "original.py", dest / "train.py", dest, ("--device=cpu",), [dest], [out])
    proc = subprocess.run([sys.executable, str(launcher), "--steps=2"], capture_output=True, text=True, cwd=out,
                          env={"PYTHONPATH": str(out)})
    assert proc.returncode == 0, proc.stderr
    assert f"cwd {dest}" in proc.stdout and "argv ['--steps=2', '--device=cpu']" in proc.stdout
    assert "width 8" in proc.stdout and "lib original" in proc.stdout


def test_original_only_substitutions_make_a_second_copy_that_is_never_migrated(tmp_path):
    orig = tmp_path / "prog" / "orig"
    orig.mkdir(parents=True)
    (orig / "train.py").write_text('init(backend="nccl")\ndevice = "cuda:0"\n')
    plain = Recipe(name="t", repo="o/r", entry="train.py", style="test")
    assert rp.original_copy(plain, orig) == orig and not (tmp_path / "prog" / "orig-cpu").exists()
    recipe = Recipe(name="t", repo="o/r", entry="train.py", style="test",
                    original_substitutions=(Substitution("train.py", '"nccl"', '"gloo"'),
                                            Substitution("train.py", '"cuda:0"', '"cpu"')))
    cpu = rp.original_copy(recipe, orig)
    assert cpu != orig and cpu.parent == orig.parent
    assert (cpu / "train.py").read_text() == 'init(backend="gloo")\ndevice = "cpu"\n'
    assert (orig / "train.py").read_text() == 'init(backend="nccl")\ndevice = "cuda:0"\n'  # what is migrated
    stale = Recipe(name="t", repo="o/r", entry="train.py", style="test",
                   original_substitutions=(Substitution("train.py", '"mpi"', '"gloo"'),))
    with pytest.raises(rp.RecipeError, match="found 0 times"):
        rp.original_copy(stale, orig)


def test_each_program_gets_its_own_home_and_a_free_port(tmp_path):
    recipe = Recipe(name="t", repo="o/r", entry="train.py", style="test",
                    env={"MASTER_PORT": "{port}", "MASTER_ADDR": "127.0.0.1", "RANK": "0"})
    env = rp.program_env(recipe, tmp_path)
    assert env["HOME"] == str(tmp_path / "home")  # the output's persistent compilation cache starts empty
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["RANK"] == "0"
    assert env["MASTER_PORT"].isdigit() and 0 < int(env["MASTER_PORT"]) < 65536
    import socket
    with socket.socket() as sock:  # free when handed out
        sock.bind(("127.0.0.1", int(env["MASTER_PORT"])))


def test_every_run_of_the_original_starts_from_a_fresh_copy(tmp_path, monkeypatch):
    """A program that resumes from its own checkpoint by itself (barlowtwins, hifigan): the suite's own run of
    the original writes one; neither the migration's input nor verify's run of the original may see it."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "train.py").write_text("print('train')\n")
    seen = {}

    def own_run(recipe, ctx, where):
        (where / "ckpt").mkdir()
        (where / "ckpt" / "last.pth").write_text("epoch 2")
        seen["own"] = where
        return {"exit_status": 0, "losses": []}

    def variant(recipe, ctx, work, orig, original, target, form, cpu, own):
        seen["variant"] = (orig, cpu, own)
        start = rp.fresh_copy(cpu, work / "orig-29")
        return {"label": target, "starts": sorted(p.name for p in start.iterdir()),
                "migrated": sorted(p.name for p in orig.iterdir())}

    monkeypatch.setattr(rp, "run_original", own_run)
    monkeypatch.setattr(rp, "run_variant", variant)
    monkeypatch.setattr(rp, "repo_folder", lambda cache, name: repo)
    for recipe in (Recipe(name="plain", repo="o/r", entry="train.py", style="test"),
                   Recipe(name="subst", repo="o/r", entry="train.py", style="test",
                          original_substitutions=(Substitution("train.py", "'train'", "'cpu'"),))):
        ctx = type("Ctx", (), {"work": tmp_path / "work", "cache": None, "targets": ["2.9"], "keep": True})()
        record = rp.run_program(recipe, ctx)
        (only,) = record["variants"]
        assert only["starts"] == ["train.py"] and only["migrated"] == ["train.py"], (recipe.name, only)
        orig, cpu, own = seen["variant"]
        assert own == seen["own"] and (own / "ckpt" / "last.pth").exists()  # the resume check resumes there
        assert not (cpu / "ckpt").exists() and not (orig / "ckpt").exists()


def test_missing_files_of_the_mirror_are_copied(tmp_path):
    orig, out = tmp_path / "orig", tmp_path / "out"
    (orig / "data").mkdir(parents=True)
    (orig / "data" / "x.bin").write_bytes(b"\x00\x01")
    (orig / "a.py").write_text("a = 1\n")
    out.mkdir()
    (out / "a.py").write_text("a = 2\n")
    assert rp.copy_missing_files(orig, out) == 1
    assert (out / "data" / "x.bin").read_bytes() == b"\x00\x01" and (out / "a.py").read_text() == "a = 2\n"


def test_the_json_of_a_run_round_trips_through_compare(tmp_path):
    doc = {"programs": [{"name": "a", "variants": [variant()]}]}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(doc))
    lines = measure.compare(json.loads(path.read_text()), doc)
    assert lines == ["better (0):", "worse (0):"]


def test_the_replicas_column_reads_verify_s_replica_probe():
    def report(updates=4, data_parallel=True, unreduced=0, reduced_twice=0):
        return {"replicas": {"updates": updates, "data_parallel": data_parallel, "unreduced": unreduced,
                             "reduced_twice": reduced_twice, "unequal_start": 0, "steps_nothing": 0,
                             "reduced_by": ["xm"]}}

    assert measure.replica_cell(None) == "-" and measure.replica_cell({}) == "-"
    assert measure.replica_cell(report(updates=0)) == "-"
    assert measure.replica_cell(report(data_parallel=False, unreduced=4)) == "1 proc"
    assert measure.replica_cell(report()) == "ok"
    assert measure.replica_cell(report(unreduced=3, reduced_twice=1)) == "3 unred, 1 twice"
    program = {"name": "p", "original": {"exit_status": 0}, "variants": [
        {**variant(), "migrate": {"exit_status": 0}, "problems": []},
        {**variant("sagemaker"), "migrate": {"exit_status": 0}, "problems": []}]}
    program["variants"][0]["verify"]["report"].update(report(unreduced=2))
    program["variants"][1]["verify"]["report"].update(report())
    summary = measure.summarize([program])
    assert (summary["2.9"]["data_parallel"], summary["2.9"]["unreduced"]) == (1, 1)
    assert (summary["sagemaker"]["data_parallel"], summary["sagemaker"]["unreduced"]) == (1, 0)
    assert "2 unred" in measure.render_table([program])[2]


def test_every_verify_name_the_harness_uses_exists():
    """The harness is run by hand, not by the tests: a name verify no longer has would fail every program
    (it did once, after verify's split into a package)."""
    import ast

    from xla_migrate import verify

    for path in (ROOT / "benchmarks" / "real_programs.py", ROOT / "benchmarks" / "real_programs_measure.py"):
        used = {node.attr for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "verify"}
        assert used and all(hasattr(verify, name) for name in used), (path.name, sorted(used))


def test_a_recipes_seed_starts_every_process_of_its_runs_seeded(tmp_path):
    """An unseeded program's two runs draw the same numbers at start (the suite's sitecustomize seeds them)."""
    recipe = Recipe(name="p", repo="o/p", entry="e.py", style="s", seed=3)
    args = type("A", (), dict(cache=tmp_path, extras=tmp_path, targets=["2.9"], timeout_scale=1, tool=[],
                              keep=str(tmp_path / "work")))
    env = rp.Context(args, {}).env(recipe, "current", tmp_path)
    assert env["REAL_PROGRAMS_SEED"] == "3"
    draw = [sys.executable, "-c", "import random; print(random.random())"]
    seeded = {subprocess.run(draw, env=env, capture_output=True, text=True, check=True).stdout for _ in range(2)}
    import random
    random.seed(3)
    assert seeded == {f"{random.random()}\n"}
    unseeded_env = rp.Context(args, {}).env(Recipe(name="p", repo="o/p", entry="e.py", style="s"), "current", tmp_path)
    assert "REAL_PROGRAMS_SEED" not in unseeded_env


def test_a_sagemaker_output_entering_torch_xla_autocast_is_recognised(tmp_path):
    """2.6.1 crashes entering torch_xla's amp.autocast on a CPU device even at float32 (llama2c_ddp's fp32 run):
    an output that enters it without testing the hardware is not run, where torch.autocast (unet's) and the
    tool's guarded form are."""
    (tmp_path / "xla").mkdir()
    (tmp_path / "xla" / "train.py").write_text("ctx = xla_amp.autocast(device, dtype=ptdtype)\n")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "train.py").write_text("with torch.autocast(device.type, enabled=amp):\n    pass\n")
    (tmp_path / "guarded").mkdir()
    (tmp_path / "guarded" / "train.py").write_text(
        'ctx = xla_amp.autocast(device) if xm.xla_device_hw(device) != "CPU" else contextlib.nullcontext()\n')
    assert rp.enters_xla_autocast(tmp_path / "xla") and not rp.enters_xla_autocast(tmp_path / "plain")
    assert not rp.enters_xla_autocast(tmp_path / "guarded")  # the tool's own output since XLA201's guard
