"""The defect classes of the expert review's tenth round (real programs of the corpus that round 9 did not read:
DiT, Swin-Transformer, stylegan2 (rosinality), vits, tacotron2, deep-text-recognition-benchmark, bentrevett's
seq2seq notebooks, sgrvinod's image captioning, ignite, TinyLlama, guided-diffusion, Deformable-DETR, open_clip;
notes in /work/notes/s17/expert-review-10.md), one test per new class on the self-written fixtures in
``fixtures/review/<issue>-<class>/`` (their READMEs say what is wrong today, what was measured, and what right
looks like), plus a passing control next to each.

Same contract as tests/test_review_classes.py (whose helpers this module reuses): each test asserts the RIGHT
behaviour; a class the tool still gets wrong is marked ``known_defect(issue, what)``, a strict xfail that only an
AssertionError satisfies. When one XPASSes, check the output against its README and delete the mark.
"""

from __future__ import annotations

import ast

import pytest

from test_review_classes import BARRIER, BOTH, REVIEW, _show, _tree_run, known_defect, migrated  # noqa: F401
from xla_migrate import migrate


def _calls(code: str, *suffixes: str) -> list[ast.Call]:
    return [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call)
            and any(ast.unparse(n.func).endswith(s) for s in suffixes)]


def _migrate_file(path, target):
    return migrate(path.read_bytes(), target=target, path=str(path))


# Severity C (the tool refuses a valid script, or the output crashes where the original ran) --------------------

RECURSIVE = REVIEW / "33-recursive-helper-refused-as-too-deeply-nested" / "train.py"


@BOTH
def test_recursive_helper_with_a_function_parameter_migrates(target):
    result = _migrate_file(RECURSIVE, target)
    assert result.error is None, f"error: {result.error}"
    assert "torch.cuda.is_available()" not in result.code and _calls(result.code, "optimizer_step"), result.code


@BOTH
def test_the_same_helper_without_recursion_migrates(target):
    # The control: apply_to_tensors handling one level of lists without calling itself migrates as usual.
    source = RECURSIVE.read_text()
    flat = source.replace("apply_to_tensors(item, fn) for item in x", "fn(item) for item in x")
    flat = flat.replace("apply_to_tensors(v, fn) for k, v in x.items()", "fn(v) for k, v in x.items()")
    assert flat.count("apply_to_tensors(") == 2  # the definition and to_device's call
    result = migrate(flat, target=target, path="train.py")
    assert result.error is None and _calls(result.code, "optimizer_step"), result.error or result.code


def _unmapped_loads(code: str) -> list[str]:
    return [ast.unparse(c) for c in _calls(code, "torch.load")
            if len(c.args) < 2 and not any(k.arg == "map_location" for k in c.keywords)]


@BOTH
def test_torch_load_without_map_location_loads_on_the_cpu(migrated, target):
    run = migrated("29-torch-load-without-map-location-kept", target)
    unmapped = _unmapped_loads(run.code["train.py"])
    reported = [n for n in run.findings["train.py"] if n.line in (18, 20) and "map_location" in n.message]
    assert not unmapped or len(reported) >= 2, f"kept: {unmapped}; findings: {_show(run.findings['train.py'])}"


_CUDA_MAP_LOCATION = """\
import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Linear(4, 2).to(device)
model.load_state_dict(torch.load("model.pth", map_location="cuda:0"))
"""


@BOTH
def test_cuda_map_location_becomes_the_cpu(target):
    # The control: XLA409 rewrites a map_location that names CUDA.
    code = migrate(_CUDA_MAP_LOCATION, target=target, path="load.py").code
    assert not _unmapped_loads(code) and 'map_location="cpu"' in code, code


@BOTH
def test_map_location_of_the_device_as_a_string_becomes_the_cpu(migrated, target):
    run = migrated("29-map-location-str-of-device-kept", target)
    loads = _calls(run.code["caption.py"], "torch.load")
    locations = [ast.unparse(k.value) for c in loads for k in c.keywords if k.arg == "map_location"]
    reported = [n for n in run.findings["caption.py"] if n.line == 22 and "map_location" in n.message]
    assert locations == ["'cpu'"] or reported, \
        f"map_location {locations}; findings: {_show(run.findings['caption.py'])}"


@BOTH
def test_map_location_of_the_device_becomes_the_cpu(target):
    # The control: the device variable itself (XLA409's documented case) is rewritten.
    source = (REVIEW / "29-map-location-str-of-device-kept" / "caption.py").read_text()
    assert "map_location=str(device)" in source
    code = migrate(source.replace("map_location=str(device)", "map_location=device"), target=target,
                   path="caption.py").code
    assert 'torch.load(args.model, map_location="cpu")' in code, code


_RUNTIME_PREFIXES = ("xm.", "xr.", "torch_xla.", "dist.", "torch.distributed.")
_LAUNCHES = ("torch_xla.launch", "xmp.spawn")


def _runtime_calls_before_launch(code: str) -> list[str]:
    """Calls into the XLA runtime or torch.distributed in the `__main__` block, before its launch statement."""
    tree = ast.parse(code)
    block = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
    found = []
    for statement in block.body:
        calls = [n for n in ast.walk(statement) if isinstance(n, ast.Call)]
        names = [ast.unparse(c.func) for c in calls]
        if any(name in _LAUNCHES for name in names):
            break
        found += [ast.unparse(c) for c, name in zip(calls, names)
                  if name.startswith(_RUNTIME_PREFIXES) and not name.endswith("initialize_cache")]
    return found


@BOTH
def test_nothing_before_the_launch_starts_the_runtime(migrated, target):
    run = migrated("29-runtime-calls-written-before-launch", target)
    code = run.code["train.py"]
    assert _calls(code, *_LAUNCHES), code
    early = _runtime_calls_before_launch(code)
    reported = {n.line for n in run.findings["train.py"] if "launch" in n.message}
    assert not early or {26, 33} <= reported, f"before the launch: {early}; findings: {_show(run.findings['train.py'])}"


@pytest.mark.parametrize("target", ["sagemaker"])
def test_ddp_form_initialises_the_group_in_each_worker(target):
    # sagemaker's ddp form launches with xmp.spawn: the group the script started before the launch starts in
    # _mp_fn instead (run on torch_xla 2.6.1, PJRT CPU: rc 0), and nothing before the launch touches the runtime.
    source = (REVIEW / "29-runtime-calls-written-before-launch" / "train.py").read_text()
    result = migrate(source, target=target, path="train.py", data_parallel="ddp")
    assert not _runtime_calls_before_launch(result.code), result.code
    worker = result.code.split("def _mp_fn(", 1)[1].split("\n\n", 1)[0]
    assert 'init_process_group("xla"' in worker and worker.index("init_process_group") < worker.index("main(args)")
    assert migrate(result.code, target=target, path="train.py", data_parallel="ddp").code == result.code


_SETUP_IN_MAIN = """\
import argparse
import os

import torch
import torch.distributed as dist
from torch import nn


def main(args):
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank = int(os.environ["RANK"])
    else:
        rank = -1
    torch.cuda.set_device(args.local_rank)
    dist.init_process_group(backend="nccl", init_method="env://")
    dist.barrier()
    model = nn.parallel.DistributedDataParallel(nn.Linear(16, 4).cuda(), device_ids=[args.local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for step in range(10):
        loss = model(torch.randn(8, 16).cuda()).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.1)
    main(parser.parse_args())
"""


@BOTH
def test_setup_inside_main_leaves_the_launcher_block_clean(target):
    # The control: the same setup inside main(): the launcher block only parses and launches (its 2.9 output runs).
    code = migrate(_SETUP_IN_MAIN, target=target, path="train.py").code
    assert _calls(code, *_LAUNCHES) and not _runtime_calls_before_launch(code), code


def _launched_function(code: str) -> ast.FunctionDef | None:
    launches = _calls(code, *_LAUNCHES)
    if not launches:
        return None
    name = ast.unparse(launches[0].args[0])
    return next(n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.FunctionDef) and n.name == name)


def _called_names(function: ast.FunctionDef) -> set[str]:
    return {ast.unparse(n.func) for n in ast.walk(function) if isinstance(n, ast.Call)}


LAUNCH_FIXTURE = REVIEW / "29-launch-wraps-helper-call-not-training" / "train.py"


@BOTH
def test_launch_runs_the_training_not_a_helper(target):
    # Launch nothing and say so (XLA407, the launch rule: "no single entry function to launch"), or launch train.
    result = _migrate_file(LAUNCH_FIXTURE, target)
    launched = _launched_function(result.code)
    no_main = [f for f in result.findings if f.code in ("XLA407", "XLA602") and "entry function" in f.message]
    assert (launched is None and no_main) or (launched is not None and _called_names(launched) & {"train", "main"}), \
        f"{ast.unparse(launched) if launched else 'no launch'}\nfindings: {[(f.line, f.code) for f in result.findings]}"


@BOTH
def test_launch_wraps_train_when_it_is_the_only_call(target):
    # The control: without the EMA initialisation call (line 38) the launched function calls train(...).
    source = LAUNCH_FIXTURE.read_text()
    assert "    accumulate(ema, model, 0)\n" in source
    result = migrate(source.replace("    accumulate(ema, model, 0)\n", ""), target=target, path="train.py")
    launched = _launched_function(result.code)
    assert launched is not None and "train" in _called_names(launched), result.code


NESTED = "29-launch-nested-in-project-launcher"


def _launch_lines(code: str) -> list[str]:
    return [ast.unparse(c) for c in _calls(code, *_LAUNCHES)]


@BOTH
def test_one_launch_when_the_project_has_its_own_launcher(migrated, target):
    # The project's launcher (launcher.py's mp.start_processes) is the launch; the entry says which was kept.
    # Run on torch_xla 2.9 (PJRT CPU): --num-gpus 1 and 2, rc 0.
    run = migrated(NESTED, target)
    launches = {rel: _launch_lines(code) for rel, code in run.code.items() if _launch_lines(code)}
    assert len(launches) == 1 and len(next(iter(launches.values()))) == 1, launches
    assert [n for n in run.findings["train.py"] if n.code == "XLA407" and "launcher.py" in n.message], \
        _show(run.findings["train.py"])


@BOTH
def test_entry_without_a_project_launcher_is_launched_once(target, tmp_path):
    # The control: the same entry calling main(args) itself (no launcher module) gets one launch in __main__.
    source = (REVIEW / NESTED / "train.py").read_text()
    assert "    launch(main, args.num_gpus, args=(args,))\n" in source
    source = source.replace("    launch(main, args.num_gpus, args=(args,))\n", "    main(args)\n")
    source = source.replace("from launcher import get_world_size, launch\n", "")
    source = source.replace("if get_world_size() > 1:", "if torch.distributed.is_initialized():")
    result = migrate(source, target=target, path="train.py")
    assert result.error is None and len(_launch_lines(result.code)) == 1, result.code


# Severity G (extra work or graph executions per step) -----------------------------------------------------------

SRC_LAYOUT = "28-src-layout-engine-reduced-twice"


@BOTH
def test_engine_of_a_src_layout_package_keeps_ddp_step(migrated, target):
    run = migrated(SRC_LAYOUT, target)
    main, engine = run.code["src/trainpkg/main.py"], run.code["src/trainpkg/engine.py"]
    assert _calls(main, "DistributedDataParallel"), main
    assert not _calls(engine, "xm.optimizer_step"), engine


@BOTH
def test_engine_beside_its_entry_keeps_ddp_step(target, tmp_path):
    # The control: the same two modules at the top of the folder (`from engine import ...`) are decided together.
    fixture = REVIEW / SRC_LAYOUT / "src" / "trainpkg"
    folder = tmp_path / "flat"
    folder.mkdir()
    (folder / "engine.py").write_text((fixture / "engine.py").read_text())
    main = (fixture / "main.py").read_text()
    assert "from trainpkg.engine import" in main
    (folder / "main.py").write_text(main.replace("from trainpkg.engine import", "from engine import"))
    run = _tree_run(folder, target, tmp_path / "work")
    assert _calls(run.code["main.py"], "DistributedDataParallel"), run.code["main.py"]
    assert not _calls(run.code["engine.py"], "xm.optimizer_step"), run.code["engine.py"]


@BOTH
def test_decode_loop_reads_are_reported(migrated, target):
    run = migrated("30-inference-decode-loop-reads-unreported", target)
    notes = run.findings["evaluate.py"]
    # The barrier goes right before the token read (one graph per token, the read then copies a computed value);
    # the element-wise test of the device tensor after it is reported: a sync per element.
    lines = run.code["evaluate.py"].splitlines()
    read_at = next(i for i, line in enumerate(lines) if "words.append(tokens.tolist())" in line)
    assert lines[read_at - 1].strip() == BARRIER[target], "\n".join(lines[read_at - 3:read_at + 1])
    each = [n for n in notes if n.code == "XLA311" and n.line == 25]
    assert each and "every token of the decode loop at line 21" in each[0].message, _show(notes)
    assert "each element of a device tensor" in each[0].message, _show(notes)
    code = (REVIEW / "30-inference-decode-loop-reads-unreported" / "evaluate.py").read_text()
    fixes = {f.code: f.fix for f in migrate(code, target=target).findings if f.line in (25, 28)}
    assert "tokens != END" in fixes["XLA311"] and "torch.where(done" in fixes["XLA312"], fixes
    shrink = [n for n in notes if n.code == "XLA312" and n.line == 28]
    assert shrink and "as rows finish" in shrink[0].message, _show(notes)


def test_submodule_calls_outside_a_loop_make_no_evaluation_step():
    """A model's submodule called once (a probe before a loop that runs no model) is no evaluation loop: no
    barrier, no finding (the decode loop's evidence is the submodule call inside the loop)."""
    code = (REVIEW / "30-inference-decode-loop-reads-unreported" / "evaluate.py").read_text()
    main = code.index("def greedy(")
    once = code[:main] + (
        "def main():\n"
        "    decoder = Decoder().to(device).eval()\n"
        "    h = decoder.cell(decoder.embed(torch.zeros(4, dtype=torch.long, device=device)), torch.zeros(4, 16))\n"
        "    words = decoder.out(h).argmax(dim=1).tolist()\n"
        "    for word in words:\n"
        "        print(word)\n")
    result = migrate(once, target="2.9")
    assert "torch_xla.sync()" not in result.code, result.code
    assert not [f for f in result.findings if f.line >= once[:main].count("\n") and f.code == "XLA311"], \
        result.findings


_EVAL_LOOP_READ = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Linear(8, 2).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(32, 8)), batch_size=4, drop_last=True)
    for epoch in range(2):
        for (x,) in loader:
            loss = model(x.to(device)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        total = 0.0
        with torch.no_grad():
            for (x,) in loader:
                total += model(x.to(device)).pow(2).mean().item()
        print(epoch, total)
"""


@BOTH
def test_read_in_an_evaluation_loop_of_a_training_script_is_handled(target):
    # The control: a read in the evaluation loop that the epoch loop runs beside the training is handled: summed on
    # the device and read once after the loop (or reported with XLA311, as bentrevett's seq2seq evaluate_fn's
    # per-token read is). An inference-only script's loop gets neither: the fixture's class.
    result = migrate(_EVAL_LOOP_READ, target=target, path="train.py")
    summed = "total += model(x.to(device)).pow(2).mean().detach()" in result.code
    assert summed or [f for f in result.findings if f.code == "XLA311" and f.line == 20], result.code


@BOTH
def test_decode_loop_over_a_model_class_of_another_module(tmp_path, target):
    """Image captioning's eval.py: the decoder's class lives in models.py (and the beam's width is a host number,
    ``k -= len(done)``, not a tensor test): the decode loop is still an evaluation loop, from the project's
    classes' submodules."""
    source = (REVIEW / "30-inference-decode-loop-reads-unreported" / "evaluate.py").read_text()
    start, end = source.index("class Decoder"), source.index("def greedy(")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "models.py").write_text("from torch import nn\n\nVOCAB = 32\n\n\n" + source[start:end].rstrip() + "\n")
    (tree / "evaluate.py").write_text(source[:start].replace("END, START, VOCAB = 1, 0, 32", "END, START = 1, 0")
                                      + "from models import Decoder\n\n\n" + source[end:].replace(
        "        if not alive:\n", "        width = 4\n        width -= len(alive)\n        if width == 0:\n"))
    run = _tree_run(tree, target, tmp_path)
    notes = run.findings["evaluate.py"]
    assert [n for n in notes if n.code == "XLA311" and "decode loop" in n.message], _show(notes)
    assert not [n for n in notes if "width" in n.message], _show(notes)
