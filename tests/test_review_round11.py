"""The defect classes of the expert review's eleventh round (real programs of the corpus that rounds 9 and 10 did
not read: litgpt, torchtitan, LLaVA, FastChat, llama-recipes, qlora, alpaca-lora, DeepLabV3Plus, Pytorch-UNet,
hifi-gan, barlowtwins, sentiment-analysis notebooks, Diffusion-Models, stylegan2-ada, iatransfer; notes in
/work/notes/s18/expert-review-11.md), one test per new class on the self-written fixtures in
``fixtures/review/<issue>-<class>/`` (their READMEs say what is wrong today, what was measured, and what right
looks like), plus a passing control next to each.

Same contract as tests/test_review_classes.py (whose helpers this module reuses): each test asserts the RIGHT
behaviour; a class the tool still gets wrong is marked ``known_defect(issue, what)``, a strict xfail that only an
AssertionError satisfies. When one XPASSes, check the output against its README and delete the mark.
"""

from __future__ import annotations

import ast

from test_review_classes import BARRIER, BOTH, REVIEW, _show, _tree_run, known_defect, migrated  # noqa: F401
from xla_migrate import migrate


def _calls(code: str, *suffixes: str) -> list[ast.Call]:
    return [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call)
            and any(ast.unparse(n.func).endswith(s) for s in suffixes)]


def _function(code: str, name: str) -> ast.FunctionDef:
    return next(n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.FunctionDef) and n.name == name)


# Severity C (the output crashes where the original ran) ----------------------------------------------------------

def _unmapped_loads(code: str) -> list[str]:
    return [ast.unparse(c) for c in _calls(code, "torch.load")
            if len(c.args) < 2 and not any(k.arg == "map_location" for k in c.keywords)]


@BOTH
def test_torch_load_subscript_into_a_name_loads_on_the_cpu(migrated, target):
    run = migrated("29-torch-load-subscript-into-name-kept", target)
    unmapped = _unmapped_loads(run.code["train.py"])
    reported = [n for n in run.findings["train.py"] if n.line in (22, 34) and "map_location" in n.message]
    assert not unmapped or len(reported) >= len(unmapped), \
        f"kept: {unmapped}; findings: {_show(run.findings['train.py'])}"


_SUBSCRIPT_INLINE = """\
import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Linear(4, 2).to(device)
model.load_state_dict(torch.load("model.pth")["model"])
"""


@BOTH
def test_torch_load_subscript_inside_load_state_dict_gets_the_cpu(target):
    # The control: the subscript used inline in load_state_dict is followed (XLA409 adds map_location="cpu").
    code = migrate(_SUBSCRIPT_INLINE, target=target, path="load.py").code
    assert not _unmapped_loads(code) and 'map_location="cpu"' in code, code


_LIGHTNING_NAMES = {"'auto'", "'cpu'", "'tpu'"}


@BOTH
def test_fabric_accelerator_name_stays_a_lightning_name(migrated, target):
    run = migrated("29-fabric-accelerator-name-becomes-xla", target)
    code = run.code["generate.py"]
    distribute = _function(code, "distribute")
    names = {ast.unparse(n.value) for n in ast.walk(distribute) if isinstance(n, ast.Assign)
             and [ast.unparse(t) for t in n.targets] == ["accelerator"]}
    counted = "CUDAAccelerator.auto_device_count()" in ast.unparse(distribute)
    gated = "accelerator == 'cuda'" in ast.unparse(distribute)
    reported = [n for n in run.findings["generate.py"] if n.line in range(11, 26)]
    assert names <= _LIGHTNING_NAMES or reported, f"accelerator names {names}; findings: {_show(reported)}"
    assert not counted or gated or reported, f"CUDA count kept ungated: {ast.unparse(distribute)}"
    fabric = [n for n in run.findings["generate.py"] if n.code == "XLA908" and "line 13" in n.message]
    assert fabric, f"no finding at the Fabric naming the accelerator's binding: {_show(run.findings['generate.py'])}"


_TORCH_DEVICE_CHAIN = """\
import torch
from torch import nn

if torch.cuda.is_available():
    device = "cuda"
else:
    device = "cpu"
model = nn.Linear(4, 2).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.randn(2, 4).to(device)).sum()
    loss.backward()
    optimizer.step()
"""


@BOTH
def test_a_torch_device_name_chain_becomes_the_xla_device(target):
    # The control: the same chain naming a torch device is right to become the XLA device's name.
    code = migrate(_TORCH_DEVICE_CHAIN, target=target, path="train.py").code
    assert "'cuda'" not in code and '"cuda"' not in code and ("xla" in code), code


# Severity G (extra graph executions per step) ---------------------------------------------------------------------

CHUNKED = REVIEW / "30-barrier-in-chunked-loss-loop" / "train.py"


@BOTH
def test_no_barrier_inside_a_chunked_loss_loop(migrated, target):
    run = migrated("30-barrier-in-chunked-loss-loop", target)
    code = run.code["train.py"]
    loss_call = ast.unparse(_function(code, "__call__"))
    assert BARRIER[target] not in loss_call, loss_call
    assert BARRIER[target] in ast.unparse(_function(code, "main")), code


@BOTH
def test_a_training_loop_with_backward_gets_its_barrier(target):
    # The control: the step loop in main (backward through the loss, then the update) keeps one barrier.
    code = migrate(CHUNKED.read_text(), target=target, path="train.py").code
    main = ast.unparse(_function(code, "main"))
    assert main.count(BARRIER[target]) == 1 and "optimizer_step" in main, main


@BOTH
def test_tensor_parallel_program_is_reported(migrated, target):
    run = migrated("29-tensor-parallel-group-removed", target)
    code = run.code["infer.py"]
    kept = bool(_calls(code, "parallelize_module"))
    reported = [n for n in run.findings["infer.py"] if n.code != "XLA900"
                and any(w in n.message for w in ("parallelize_module", "DeviceMesh", "DTensor", "mesh"))]
    assert not kept or reported, f"findings: {_show(run.findings['infer.py'])}"
    group_removed = not _calls(code, "init_process_group")
    claims = [c for c in run.changes["infer.py"] if "no process group is needed" in c.message]
    assert not (group_removed and claims), f"changes: {_show(claims)}"


_BROADCAST_ONLY = """\
import torch
import torch.distributed as dist


def run_worker():
    dist.init_process_group("nccl")
    tokens = torch.randn(1, 16, device="cuda")
    dist.broadcast(tokens, src=0)
    print(tokens.sum().item())
    dist.destroy_process_group()


if __name__ == "__main__":
    run_worker()
"""


@BOTH
def test_a_collective_only_script_gets_the_xla_collective(target):
    # The control: without a mesh, the same worker's broadcast becomes xm.collective_broadcast (XLA411).
    code = migrate(_BROADCAST_ONLY, target=target, path="infer.py").code
    assert _calls(code, "xm.collective_broadcast") and not _calls(code, "dist.broadcast"), code


def _statements_before_branch(function: ast.FunctionDef) -> list[str]:
    """The function's statements before its first `if` (what every call runs)."""
    found = []
    for statement in function.body:
        if isinstance(statement, ast.If):
            break
        found.append(ast.unparse(statement))
    return found


_DEVICE_QUERIES = ("torch_xla.device()", "xm.xla_device()")


@BOTH
def test_no_device_query_runs_before_the_launch(migrated, target):
    run = migrated("29-device-hoisted-into-helper-run-before-launch", target)
    code = run.code["train.py"]
    early = [s for s in _statements_before_branch(_function(code, "load_pretrained"))
             if any(q in s for q in _DEVICE_QUERIES)]
    reported = [n for n in run.findings["train.py"] if n.line in (11, 12, 42) and n.code != "XLA103"]
    assert not early or reported, f"run before the launch: {early}; findings: {_show(run.findings['train.py'])}"


_DEVICE_IN_WORKER = """\
import torch
from torch import nn


def build(on_gpu=True):
    model = nn.Linear(8, 2)
    if on_gpu:
        model = model.cuda()
    return model


def main():
    model = build()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        loss = model(torch.randn(4, 8).cuda()).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
"""


@BOTH
def test_a_helper_called_inside_main_moves_its_model(target):
    # The control: the same helper called from main (no launcher before it) moves the model to the XLA device.
    code = migrate(_DEVICE_IN_WORKER, target=target, path="train.py").code
    build = ast.unparse(_function(code, "build"))
    assert ".to(device)" in build and any(q in build for q in _DEVICE_QUERIES), build


def _fused_values(code: str) -> list[str]:
    """The values given to a "fused" key of a dict display or a fused= keyword."""
    values = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Dict):
            values += [ast.unparse(v) for k, v in zip(node.keys, node.values)
                       if isinstance(k, ast.Constant) and k.value == "fused"]
        elif isinstance(node, ast.keyword) and node.arg == "fused":
            values.append(ast.unparse(node.value))
    return values


@BOTH
def test_fused_flag_in_a_kwargs_dict_is_false_on_xla(migrated, target):
    run = migrated("29-fused-flag-in-kwargs-dict-made-true", target)
    values = _fused_values(run.code["train.py"])
    reported = [n for n in run.findings["train.py"] if n.line in (19, 20)]
    assert "True" not in values or reported, f"fused values {values}; findings: {_show(run.findings['train.py'])}"


_FUSED_KEYWORD = """\
import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Linear(4, 2).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=device.type == "cuda")
for step in range(3):
    loss = model(torch.randn(2, 4).to(device)).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


@BOTH
def test_fused_keyword_of_the_optimizer_call_is_dropped(target):
    # The control: fused= written in the optimizer call itself is dropped by XLA205.
    code = migrate(_FUSED_KEYWORD, target=target, path="train.py").code
    assert "True" not in _fused_values(code), code


@BOTH
def test_no_barrier_in_a_chunked_loss_of_another_module(tmp_path, target):
    """The loss class in its own module (torchtitan's components/loss.py), run every step by the trainer's loop in
    another: its chunk loop is part of that step (the project index's per-step functions include a callable
    object's ``__call__``)."""
    tree = tmp_path / "tree"
    tree.mkdir()
    source = CHUNKED.read_text()
    main = source.index("def main():")
    (tree / "loss.py").write_text(source[:main].rstrip() + "\n")
    (tree / "train.py").write_text("import torch\nfrom torch import nn\n\nfrom loss import ChunkedLoss\n\n\n"
                                       + source[main:])
    run = _tree_run(tree, target, tmp_path)
    assert BARRIER[target] not in run.code["loss.py"], run.code["loss.py"]
    assert BARRIER[target] in run.code["train.py"], run.code["train.py"]

