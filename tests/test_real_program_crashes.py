"""Crash classes the real-programs suite found (issue 27; issues 29 and 30): edge cases of XLA109 (inference
mode), XLA205 (fused optimizers), and XLA301's loops that keep their DataLoader (labels kept on the host, CPU
loops before the device) that the golden fixtures do not show. The runnable fixtures inference_mode_eval,
fused_adamw, host_labels and cpu_before_device prove each on torch_xla (tests/xla)."""

from __future__ import annotations

import pytest

from xla_migrate import migrate

AMP_FUSED = """import torch

device = torch.device("cuda")
model = torch.nn.Linear(4, 2).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
scaler = torch.cuda.amp.GradScaler()
for x in [torch.randn(2, 4)]:
    with torch.cuda.amp.autocast():
        loss = model(x.to(device)).sum()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
"""


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_an_amp_optimizer_loses_fused_once_whichever_rule_rewrites_it(target):
    result = migrate(AMP_FUSED, target=target)
    assert "fused" not in result.code
    assert not [f for f in result.findings if f.code == "XLA000" or "overlap" in f.message]
    codes = [c.code for c in result.changes]
    assert codes.count("XLA203") == 1 and "XLA205" not in codes  # syncfree.AdamW, without fused=
    # an option syncfree lacks: XLA203 leaves the optimizer (a finding), XLA205 drops fused= from it
    kept = migrate(AMP_FUSED.replace("fused=True", "fused=True, maximize=True"), target=target)
    assert "torch.optim.AdamW(model.parameters(), lr=1e-3, maximize=True)" in kept.code
    assert [c.code for c in kept.changes].count("XLA205") == 1


def test_inference_mode_aliased_module_and_nested_call_keep_other_edits():
    source = ("import torch as T\n\ndevice = T.device('cuda')\n\n"
              "def run(m, x):\n    with T.inference_mode(mode=x.is_cuda):\n        return m(x.to(device))\n")
    result = migrate(source, target="2.9")
    assert "with (T.no_grad() if x.is_cuda else T.enable_grad()):" in result.code
    assert "inference_mode" not in result.code


EVAL = """import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def evaluate(model, loader, criterion):
    labels = []
    with torch.no_grad():
        for x, y in loader:
            out = model(x.to(device))
            {use}
    return labels
"""


@pytest.mark.parametrize("use,wrapped", [
    ("labels.append(y)", False),
    ("labels += [y.detach()]", False),
    ("labels.extend(y.data.numpy())", False),
    ("labels.append(y.tolist())", True),  # .tolist() works on XLA tensors too
    ("labels.append(criterion(out, y))", True),  # used on the device: the program must move it somewhere
    ("labels.append(y); criterion(out, y.to(device))", True),
    ("labels.append(len(y))", True),
])
def test_a_batch_element_kept_on_the_host_keeps_the_loader(use, wrapped):
    result = migrate(EVAL.format(use=use), target="2.9", select=["XLA301"])
    assert ("MpDeviceLoader" in result.code) == wrapped
    assert bool([f for f in result.findings if f.code == "XLA301"]) == (not wrapped)


CPU_FIRST = """import torch

model_0 = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model_0.parameters(), lr=0.1)
for x, y in train_loader:
    {body}
    opt.step()
device = "cuda" if torch.cuda.is_available() else "cpu"
model_1 = torch.nn.Linear(4, 2).to(device)
"""


@pytest.mark.parametrize("body,on_cpu", [
    ("torch.nn.functional.mse_loss(model_0(x), y).backward()", True),
    ("torch.nn.functional.mse_loss(model_0(x.cuda()), y.cuda()).backward()", False),
    ("x, y = prepare(x, y, device=device); model_0(x).sum().backward()", False),
])
def test_a_loop_before_the_device_that_moves_nothing_stays_on_the_cpu(body, on_cpu):
    result = migrate(CPU_FIRST.format(body=body), target="2.9")
    assert ("MpDeviceLoader(train_loader" not in result.code) == on_cpu
    # the device is acquired before the CPU backward, once, ahead of the loop
    acquired = result.code.count("\ntorch_xla.device()\n")
    assert acquired == (1 if on_cpu else 0)
    if on_cpu:
        assert result.code.index("\ntorch_xla.device()\n") < result.code.index("for x, y in train_loader")
