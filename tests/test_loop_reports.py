"""Loop-family reports of CPU fallbacks: the CTC loss (XLA317, session 14) and weight norm's fused kernel
(XLA318, session 16), reported on their lines with the fix, the code left as it was; and the host reads of
torch.distributions' argument checks in a step, turned off once after the imports (XLA319, session 16)."""

from __future__ import annotations

from pathlib import Path

import pytest

from xla_migrate import migrate

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_ctc_loss_is_reported_at_construction_and_functional_call(target):
    source = (FIXTURES / "XLA317" / "ctc_loss.in.py").read_text()
    result = migrate(source, select=["XLA317"], target=target)
    assert result.code == source
    assert [f.line for f in result.findings] == [7, 16]
    assert result.findings[0].message.startswith("nn.CTCLoss: CTC loss has no XLA lowering")
    assert result.findings[1].message.startswith("ctc_loss(...): CTC loss has no XLA lowering")
    assert all("logsumexp" in f.fix for f in result.findings)


def test_other_losses_are_not_reported():
    source = "import torch.nn as nn\ncriterion = nn.CrossEntropyLoss()\nctc = 'nn.CTCLoss'\n"
    assert not migrate(source, select=["XLA317"], target="2.9").findings


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_no_read_finding_on_a_cpu_tensor_and_interval_reads_say_so(target):
    """Issue 33: a tensor built without a device and filled with .item() (llama2.c's estimate_loss) is on the
    CPU: comparing it is no device sync. A device read under `if step % eval_interval == 0` runs every
    eval_interval steps, not every step."""
    source = (FIXTURES / "XLA311" / "cpu_tensor_at_interval.in.py").read_text()
    result = migrate(source, select=["XLA311"], target=target)
    assert result.code == source
    found = {f.line: f.message for f in result.findings}
    assert sorted(found) == [15, 31], found
    assert "every evaluation batch" in found[15]
    assert "every eval_interval steps (under the test at line 25)" in found[31] and "every step" not in found[31]


def test_a_tensor_moved_to_the_device_is_not_a_cpu_tensor():
    source = ("import torch\nmodel = torch.nn.Linear(2, 1).cuda()\n"
              "def estimate_loss():\n    losses = torch.zeros(4)\n    losses = losses.to('cuda')\n"
              "    losses[0] = model(torch.ones(2, device='cuda')).sum()\n    return losses.mean()\n"
              "for step in range(10):\n    val_loss = estimate_loss()\n    if val_loss < 1.0:\n        print('low')\n"
              "    loss = model(torch.ones(2, device='cuda')).sum()\n    loss.backward()\n")
    found = migrate(source, select=["XLA311"], target="2.9").findings
    assert [f.line for f in found] == [10], [(f.line, f.message) for f in found]


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_fixed_padding_under_an_unmasked_mean_is_reported(target):
    """Issue 36: the collate is padded to max_length (one graph) and the finding names the forward that
    averages over the padded axis without a mask (line 14); the masked model (line 20) is not named."""
    source = (FIXTURES / "XLA316" / "unmasked_mean_over_padding.in.py").read_text()
    result = migrate(source, select=["XLA316"], target=target)
    assert "new_zeros((max_length," in result.code
    found = [(f.line, f.message) for f in result.findings]
    assert len(found) == 1 and found[0][0] == 25, found
    assert "NBoW.forward reduces over the padded axis without a mask at line 14" in found[0][1]
    assert "MaskedNBoW" not in found[0][1]


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_hf_rules_report_on_xla_code_without_editing_it(target):
    """Issue 33: XLA601-604 run on a script already on torch_xla (a rerun on the tool's own output keeps their
    findings), their edits reported instead of made."""
    source = (FIXTURES / "XLA603" / "already_on_xla.in.py").read_text()
    result = migrate(source, select=["XLA603"], target=target)
    assert result.code == source
    found = sorted((f.line, f.message.split(":")[0]) for f in result.findings)
    assert found == [(7, "DataCollatorWithPadding(tokenizer, padding=True)"),
                     (7, "not applied (the script already runs on torch_xla)"),
                     (8, 'tokenizer(["a b", "c"], padding="max_length", truncation=...')], found


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_a_fabric_rank_test_is_no_host_read(target):
    """Issue 30: fabric.backward(loss) takes the tensor as its argument; the Fabric object holds host values
    (`if fabric.global_rank == 0:` reads nothing), while the loss tested under the same interval does read."""
    source = (FIXTURES / "XLA311" / "fabric_rank_test.in.py").read_text()
    found = {f.line: f.message for f in migrate(source, select=["XLA311"], target=target).findings}
    assert sorted(found) == [24], found
    assert found[24].startswith("loss > 10.0") and "every 20 steps" in found[24], found


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_weight_norm_hook_computes_the_weight_with_ops_that_lower(target):
    source = (FIXTURES / "XLA318" / "weight_norm.in.py").read_text()
    result = migrate(source, select=["XLA318"], target=target)
    # the hook API (any import name, not dim=None) gets one assignment after the imports, before the class
    assert result.code.count(".WeightNorm.compute_weight = ") == 1
    assert result.code.index("compute_weight") < result.code.index("class TemporalBlock")
    [change] = [c for c in result.changes if c.code == "XLA318"]
    assert "line 9" in change.message and "same parameters, state dict and weight" in change.message
    # the parametrization (a private class of torch) is reported, with the form that lowers
    assert [f.line for f in result.findings] == [10]
    assert result.findings[0].message.startswith("weight_norm(...): weight norm has no XLA lowering")
    assert "norm_except_dim" in result.findings[0].fix
    # its own output is left as it is
    assert migrate(result.code, select=["XLA318"], target=target).code == result.code


def test_a_function_of_another_name_is_not_weight_norm():
    source = "import torch.nn as nn\n\n\ndef weight_norm(m):\n    return m\n\n\nlayer = weight_norm(nn.Linear(2, 2))\n"
    assert not migrate(source, select=["XLA318"], target="2.9").findings


SETTER = "torch.distributions.Distribution.set_default_validate_args(False)"


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_distribution_checks_are_turned_off_once_where_a_step_builds_one(target):
    source = (FIXTURES / "XLA319" / "policy_step.in.py").read_text()
    result = migrate(source, select=["XLA319"], target=target)
    # once, after the leading imports (a Categorical and a D.Normal in the step's methods)
    assert result.code.count("set_default_validate_args") == 1
    assert result.code.index(SETTER) < result.code.index("class Agent")
    assert result.code.index("from torch.distributions import Categorical") < result.code.index(SETTER)
    [change] = [c for c in result.changes if c.code == "XLA319"]
    assert "debug checks that read the device" in change.message and "line 16" in change.message
    # its own output is left as it is
    assert migrate(result.code, select=["XLA319"], target=target).code == result.code


@pytest.mark.parametrize("case", ["not_per_step", "default_already_set"])
def test_no_distribution_change_where_no_step_builds_one_or_the_default_is_set(case):
    source = (FIXTURES / "XLA319" / f"{case}.in.py").read_text()
    result = migrate(source, select=["XLA319"], target="2.9")
    assert result.code == source and not result.changes


def test_distribution_classes_are_told_from_the_package_helpers():
    from xla_migrate.transforms.loop.distribution_validation import is_distribution

    assert is_distribution("torch.distributions.Categorical")
    assert is_distribution("torch.distributions.normal.Normal")
    assert not is_distribution("torch.distributions.kl_divergence")
    assert not is_distribution("torch.distributions.constraints.Real")
    assert not is_distribution("torch.distributions.TanhTransform")
    assert not is_distribution("numpy.random.Generator")


def test_a_distribution_in_a_model_another_module_trains_turns_the_checks_off_there(tmp_path):
    from test_review_classes import _tree_run

    project = tmp_path / "project"
    project.mkdir()
    (project / "model.py").write_text(
        "import torch\nfrom torch import nn\nfrom torch.distributions import Normal\n\n\n"
        "class Actor(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.mu = nn.Linear(4, 2)\n\n    def forward(self, x):\n"
        "        return Normal(self.mu(x), torch.ones(2, device=x.device)).rsample()\n")
    (project / "train.py").write_text(
        "import torch\nfrom model import Actor\n\n\ndef main():\n"
        "    device = torch.device(\"cuda\" if torch.cuda.is_available() else \"cpu\")\n"
        "    actor = Actor().to(device)\n    optimizer = torch.optim.Adam(actor.parameters())\n"
        "    for step in range(10):\n        loss = actor(torch.randn(8, 4, device=device)).pow(2).mean()\n"
        "        optimizer.zero_grad()\n        loss.backward()\n        optimizer.step()\n\n\n"
        "if __name__ == \"__main__\":\n    main()\n")
    run = _tree_run(project, "2.9", tmp_path / "work")
    assert run.code["model.py"].count(SETTER) == 1, run.code["model.py"]
    assert "set_default_validate_args" not in run.code["train.py"]
