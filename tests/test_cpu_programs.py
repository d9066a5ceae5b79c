"""XLA004: a program that never uses CUDA or a device is left as it runs (issue 36, review round 7's
36-cpu-only-program-gets-xla-step). A tree is one program; a file migrated alone is its own; a file without an
entry may be one part of a CUDA program and migrates as before."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from xla_migrate import cli, migrate
from xla_migrate.analysis import cpu_programs

TRAIN = textwrap.dedent("""\
    import torch
    from model import Policy


    def main():
        policy = Policy()
        optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
        for episode in range(10):
            loss = policy(torch.randn(8, 4)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


    if __name__ == "__main__":
        main()
    """)
MODEL = textwrap.dedent("""\
    import torch.nn as nn


    class Policy(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(4, 2)

        def forward(self, x):
            return self.body(x)
    """)


def tree(root: Path, **files: str) -> Path:
    root.mkdir()
    for name, text in files.items():
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize("target", ["2.9", "sagemaker"])
def test_a_cpu_program_alone_is_left_as_it_runs_with_one_finding_where_it_trains(target):
    result = migrate(TRAIN, target=target, path="train.py")
    assert result.ok and result.code == TRAIN and not result.changes
    (finding,) = result.findings
    assert (finding.line, finding.code) == (11, "XLA004")  # loss.backward()
    assert "never uses CUDA" in finding.message and "migrate again" in finding.fix


def test_without_an_entry_or_with_a_word_of_placement_it_migrates_as_before():
    snippet = TRAIN.split("\n\nif __name__")[0] + "\n"
    assert "xm.optimizer_step" in migrate(snippet, target="2.9", path="train.py").code
    placed = TRAIN.replace("policy = Policy()", "policy = Policy().to(\"cuda\")")
    result = migrate(placed, target="2.9", path="train.py")
    assert "torch_xla.sync()" in result.code and not any(f.code == "XLA004" for f in result.findings)


def test_the_noqa_and_ignore_of_xla004_hold():
    quiet = TRAIN.replace("loss.backward()", "loss.backward()  # noqa: XLA004")
    assert not migrate(quiet, target="2.9", path="train.py").findings
    assert not migrate(TRAIN, target="2.9", path="train.py", ignore=["XLA004"]).findings


def test_a_tree_is_one_program_a_cuda_word_in_any_file_makes_it_migrate(tmp_path):
    runner = CliRunner()
    cpu = tree(tmp_path / "cpu", **{"train.py": TRAIN, "model.py": MODEL})
    result = runner.invoke(cli.app, [str(cpu), "--out", str(tmp_path / "cpu-out"), "--target", "2.9"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "cpu-out" / "train.py").read_text() == TRAIN if (tmp_path / "cpu-out" / "train.py").exists() \
        else True
    assert "XLA004" in result.output and "train.py:11:1" in result.output
    # the same program whose model module picks a CUDA device: the loop in train.py gets the step recipe
    gpu = tree(tmp_path / "gpu", **{"train.py": TRAIN, "model.py": MODEL + "\nDEVICE = \"cuda\"\n"})
    result = runner.invoke(cli.app, [str(gpu), "--out", str(tmp_path / "gpu-out"), "--target", "2.9"])
    assert result.exit_code == 0, result.output
    assert "xm.optimizer_step" in (tmp_path / "gpu-out" / "train.py").read_text()
    assert "XLA004" not in result.output


def test_a_tree_with_a_notebook_is_not_judged_by_its_python_files_alone(tmp_path):
    from xla_migrate.cli.discovery import Ignorer, index_for

    root = tree(tmp_path / "p", **{"train.py": TRAIN, "model.py": MODEL, "explore.ipynb": "{}"})
    assert not index_for(str(root), Ignorer(True, [])).cpu_only
    (root / "explore.ipynb").unlink()
    assert index_for(str(root), Ignorer(True, [])).cpu_only


def test_the_placement_words():
    assert cpu_programs.never_placed("x = torch.randn(3)\nfrom torch.distributions import Categorical\n")
    for word in ("x.cuda()", "x.to(d)", "torch.device('cpu')", "import torch_xla", "autocast()", "mp.spawn(f)",
                 "from accelerate import Accelerator", "# runs on CUDA"):
        assert not cpu_programs.never_placed(word), word


EXPLICIT_CPU = textwrap.dedent("""\
    import torch
    import torch.nn as nn

    # The CPU baseline beside the project's torch_xla scripts.


    def main():
        device = "cpu"
        model = nn.Linear(4, 2).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(10):
            x = torch.randn(8, 4, device=torch.device("cpu")).to(device, torch.float32)
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        torch.save(model.state_dict(), "model.pt")


    if __name__ == "__main__":
        main()
    """)


@pytest.mark.parametrize("target", ["2.9", "sagemaker"])
def test_a_program_on_the_cpu_it_names_itself_is_left_as_it_runs(target):
    """Issue 36 (review round 8, 36-explicit-cpu-model-gets-device-loader): `device = "cpu"` by choice."""
    result = migrate(EXPLICIT_CPU, target=target, path="train_cpu.py")
    assert result.ok and result.code == EXPLICIT_CPU and not result.changes
    assert [(f.line, f.code) for f in result.findings] == [(15, "XLA004")]


@pytest.mark.parametrize("other", ['device = args.device', 'device = "cuda"', 'device = "xla"'])
def test_a_device_that_may_not_be_the_cpu_migrates_as_before(other):
    placed = EXPLICIT_CPU.replace('device = "cpu"', other)
    result = migrate(placed, target="2.9", path="train_cpu.py")
    assert "torch_xla.sync()" in result.code and not any(f.code == "XLA004" for f in result.findings)


def test_the_explicit_cpu_placements():
    assert cpu_programs.never_placed(EXPLICIT_CPU)
    assert not cpu_programs.never_placed(EXPLICIT_CPU.replace(".to(device, torch.float32)", ".to(other)"))
    assert not cpu_programs.never_placed(EXPLICIT_CPU.replace("# The CPU", "x = 'cuda'  # The CPU"))
    assert not cpu_programs.never_placed("device = 'cpu'\nmodel.to(device)\ndevice = get()\n")


def test_distributed_asked_for_migrates_a_cpu_program_as_asked():
    result = migrate(TRAIN, target="2.9", path="train.py", distributed=True)
    assert "torch_xla.sync()" in result.code and not any(f.code == "XLA004" for f in result.findings)
