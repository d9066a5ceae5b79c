"""Hugging Face (XLA6xx) and lazy-tensor (XLA31x) rules: the findings, on their lines, with their messages; the
accelerate hand-off to Accelerate; and step closures that run and log what the original logged."""

from __future__ import annotations

import contextlib
import io
import sys
import types
from pathlib import Path

import pytest

from xla_migrate import migrate

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
TARGETS = ["sagemaker", "2.9"]


def run(path: str, code: str, target: str = "sagemaker"):
    source = (FIXTURES / path).read_text()
    result = migrate(source, select=[code], target=target)
    return [(f.line, f.message) for f in result.findings if f.code == code], result


@pytest.mark.parametrize("target", TARGETS)
def test_training_arguments_findings(target):
    found, result = run("XLA601/inline_arguments.in.py", "XLA601", target)
    assert found == [
        (13, "fp16=True: XLA trains in bfloat16, float16 needs loss scaling"),
        (21, 'optim=OPTIMIZER is not known to be "adamw_torch_xla"'),
        (22, "TrainingArguments(**config): optim may come from **kwargs"),
        (24, 'Trainer(...) without args= trains with the default optim="adamw_torch"'),
    ]
    assert result.findings[0].fix == "use bf16=True instead of fp16=True"
    assert [c.line for c in result.changes] == [9, 12, 15, 20, 23]


def test_parsed_arguments_get_optim_once_after_the_if_else():
    _, result = run("XLA601/hf_argument_parser.in.py", "XLA601")
    assert result.code.count('training_args.optim = "adamw_torch_xla"') == 2  # main() and evaluate_only()
    lines = result.code.splitlines()
    at = lines.index('    training_args.optim = "adamw_torch_xla"')
    assert lines[at - 1].strip() == "model_args, data_args, training_args = parser.parse_args_into_dataclasses()"
    assert lines[at - 2].strip() == "else:"


def test_optim_already_set_after_parsing_is_replaced_not_doubled():
    source = (
        "from transformers import HfArgumentParser, TrainingArguments\n"
        "parser = HfArgumentParser((TrainingArguments,))\n"
        "(args,) = parser.parse_args_into_dataclasses()\n"
        'args.optim = "adamw_torch"\n'
    )
    result = migrate(source, select=["XLA601"])
    assert result.code.endswith('(args,) = parser.parse_args_into_dataclasses()\nargs.optim = "adamw_torch_xla"\n')
    # Another algorithm the script chose after parsing is kept (issue 36): no second assignment either.
    chosen = source.replace('"adamw_torch"', '"adafactor"')
    assert migrate(chosen, select=["XLA601"]).code == chosen


def test_mp_fn_needs_a_main():
    found, result = run("XLA602/no_main.in.py", "XLA602")
    assert found == [(1, "the script has no main(): the XLA launchers call _mp_fn(index), which needs a main() to call")]
    assert "def _mp_fn" not in result.code


@pytest.mark.parametrize("case", ["not_hf", "pipeline_inference", "with_mp_fn_already"])
def test_mp_fn_not_added(case):
    found, result = run(f"XLA602/{case}.in.py", "XLA602")
    assert found == [] and not result.changes


def test_padding_without_max_length_is_reported():
    found, result = run("XLA603/tokenizer_padding.in.py", "XLA603")
    assert [line for line, _ in found] == [11, 17]
    assert found[1] == (17, "DataCollatorWithPadding(tokenizer): padding=\"max_length\" without max_length pads to "
                            "the tokenizer's model_max_length")
    assert "PaddingStrategy" not in result.code  # the import made dead goes
    assert [c.line for c in result.changes] == [8, 11, 12, 13, 17, 18]


@pytest.mark.parametrize("target", TARGETS)
def test_dataloader_workers(target):
    found, result = run("XLA604/training_arguments.in.py", "XLA604", target)
    assert found == [
        (3, "TrainingArguments(...) leaves dataloader_num_workers at 0"),
        (4, "dataloader_num_workers=0: batches are prepared between steps"),
        (11, "parsed TrainingArguments keep dataloader_num_workers at 0 unless the command line passes "
             "--dataloader_num_workers"),
    ]
    assert result.code == (FIXTURES / "XLA604/training_arguments.in.py").read_text()
    assert run("XLA604/workers_set_after_parsing.in.py", "XLA604", target)[0] == []


@pytest.mark.parametrize("target", TARGETS)
def test_accelerate_script_is_left_to_accelerate(target):
    path = FIXTURES / "XLA605/accelerate_script.in.py"
    source = path.read_text()
    result = migrate(source, target=target)  # every rule
    assert {c.code for c in result.changes} == {"XLA602"}  # only the entry point: no device, loader, step, barrier
    entry = "def _mp_fn(index):\n    # Called once per XLA worker (index: the worker's ordinal).\n    main()\n"
    assert result.code == source.replace('\n\n\nif __name__', f"\n\n\n{entry}\n\nif __name__")
    found = [(f.line, f.message) for f in result.findings if f.code == "XLA605"]
    assert found == [
        (8, "Accelerate script: Accelerate handles the XLA device, loaders and optimizer steps; its device code "
            "is left as it is"),
        (8, 'mixed_precision="fp16": XLA trains in bfloat16'),
    ]


def test_device_rules_still_apply_without_accelerate():
    source = (FIXTURES / "XLA605/accelerate_script.in.py").read_text().replace(
        '    accelerator = Accelerator(mixed_precision="fp16")\n', "")
    codes = {c.code for c in migrate(source).changes}
    assert {"XLA204", "XLA301"} <= codes


@pytest.mark.parametrize("target", TARGETS)
def test_host_reads(target):
    found, result = run("XLA311/accumulated_and_control_flow.in.py", "XLA311", target)
    sync = "every step (a device sync: the graph runs mid-step)"
    assert found == [
        (15, f"loss.item(): reads a tensor's value to the host {sync}"),
        (16, f"float(loss): reads a tensor's value to the host {sync}"),
        (17, f"output.argmax(dim=1).cpu().numpy(): reads a tensor's value to the host {sync}"),
        (18, f"loss.item() > 100: a condition on a tensor's value reads it to the host {sync}"),
        (20, f"torch.isnan(loss): a condition on a tensor's value reads it to the host {sync}"),
        # evaluate: an evaluation loop (a model forward per batch) reads its count every batch.
        (33, "(model(x).argmax(1) == y).sum().item(): reads a tensor's value to the host every evaluation batch "
             "(a device sync: the graph runs mid-step)"),
        # train_with_barrier: the condition before the step is reported, the sum after xm.mark_step() is not.
        (41, f"loss.item() > 100: a condition on a tensor's value reads it to the host {sync}"),
    ]
    assert "detach" in result.findings[0].fix


def test_logging_is_moved_not_reported():
    """XLA310 moves logging statements; XLA311 reports none of them, before or after the move."""
    path = "XLA310/print_every_n_steps.in.py"
    assert run(path, "XLA311")[0] == []  # the per-epoch print after the step loop reads once an epoch
    migrated = migrate((FIXTURES / path).read_text(), select=["XLA310"]).code
    after = migrate(migrated, select=["XLA311"])
    assert [(f.line, f.code) for f in after.findings] == []


@pytest.mark.parametrize("target", TARGETS)
def test_dynamic_shapes(target):
    found, _ = run("XLA312/masks_and_last_batch.in.py", "XLA312", target)
    last_batch = "a smaller last batch has a new shape and compiles the step again"
    mask = "boolean-mask indexing gives a shape that depends on the data"
    assert found == [
        (7, f"training DataLoader without drop_last=True: {last_batch}"),
        (14, f"output[valid]: {mask}"),
        (14, f"y[valid]: {mask}"),
        (15, "(y > 0).nonzero(): the result's size depends on the data"),
        (16, f"output[~valid]: {mask}"),
        (17, "torch.masked_select(output, y.unsqueeze(1) < 0): the result's size depends on the data"),
        (18, "torch.where(y > 0): the result's size depends on the data"),
        (25, f"training DataLoader with drop_last=False: {last_batch}"),
    ]


def test_trainer_loader_drop_last():
    found, _ = run("XLA312/trainer_arguments.in.py", "XLA312")
    again = "the Trainer's smaller last batch has a new shape and compiles the step again"
    assert found == [(3, f"TrainingArguments(...) without dataloader_drop_last=True: {again}"),
                     (4, f"TrainingArguments(...) with dataloader_drop_last=False: {again}")]


def test_accelerate_loop_logging_is_mid_step():
    """Accelerate's prepared loader marks the step at the next batch: logging after optimizer.step() is
    still mid-step (no barrier of XLA302's comes after the step in an accelerate script)."""
    source = (
        "from accelerate import Accelerator\n"
        "accelerator = Accelerator()\n"
        "for batch in train_dataloader:\n"
        "    loss = model(**batch).loss\n"
        "    accelerator.backward(loss)\n"
        "    optimizer.step()\n"
        "    accelerator.print(loss.item())\n"
    )
    result = migrate(source)
    assert "    xm.add_step_closure(lambda loss: accelerator.print(loss.item()), args=(loss,))\n" in result.code
    assert {c.code for c in result.changes} == {"XLA310"}


class _Loss:
    """A stand-in for a 0-d tensor: reading it records a host read."""

    reads = 0

    def __init__(self, value: float) -> None:
        self.value = value

    def item(self) -> float:
        _Loss.reads += 1
        return self.value

    def __float__(self) -> float:
        return self.item()

    def __format__(self, spec: str) -> str:
        return format(self.item(), spec)

    def backward(self) -> None:
        pass


def _run_script(code: str, closures: list | None) -> str:
    """Run ``code`` with a stub torch_xla whose add_step_closure queues closures run at the step's end."""
    xm = types.ModuleType("torch_xla.core.xla_model")

    def add_step_closure(fn, args=()):
        assert closures is not None
        closures.append((fn, args))

    xm.add_step_closure = add_step_closure
    modules = {"torch_xla": types.ModuleType("torch_xla"), "torch_xla.core": types.ModuleType("torch_xla.core"),
               "torch_xla.core.xla_model": xm}
    modules["torch_xla"].core = modules["torch_xla.core"]
    modules["torch_xla.core"].xla_model = xm
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            namespace = {"_Loss": _Loss, "closures": closures}
            exec(compile(code, "<migrated>", "exec"), namespace)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return out.getvalue()


# A torch training loop in all but its imports (the tests run it without torch): the comment is what tells
# xla-migrate there is something to migrate (a file that never mentions torch is left as it is).
LOOP = '''# torch loop
def mark_step(closures):
    while closures:
        fn, args = closures.pop(0)
        fn(*args)

total = 0
for epoch in range(2):
    for step in range(4):
        loss = _Loss(epoch * 10 + step + 0.5)
        loss.backward()
        if step % 2 == 0:
            print(f"epoch {epoch} step {step} loss {loss.item():.2f}")
        print("float", float(loss))
        if closures is not None:
            mark_step(closures)
'''


def test_step_closures_log_what_the_original_logged():
    expected = _run_script(LOOP, None)
    result = migrate(LOOP, select=["XLA310"])
    assert result.code.count("xm.add_step_closure(") == 2
    assert "args=(epoch, step, loss)" in result.code and "args=(loss,)" in result.code
    assert migrate(result.code, select=["XLA310"]).code == result.code  # idempotent
    closures: list = []
    assert _run_script(result.code, closures) == expected
    assert closures == []
