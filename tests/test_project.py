"""Projects (issue 14): the project index, the step analysis and XLA407 reading it, one decision per project,
the project summary, --requirements, and file-by-file runs with --project agreeing with a tree run."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from xla_migrate import cli, migrate
from xla_migrate.project import build_index, index_for
from xla_migrate.summary import CUDA_FAMILIES, family
from xla_migrate.tree import Ignorer

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "fixtures" / "projects" / "ddp_project"
runner = CliRunner()

UTILS = """\
import torch


def train_step(model, batch, optimizer):
    x, y = batch
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss


def only_backward(loss):
    loss.backward()


def log(value):
    print(value)
"""

ENGINE = """\
import torch

from utils import train_step


def train(model, batches, optimizer):
    for batch in batches:
        loss = train_step(model, batch, optimizer)
        print(loss.item())
"""

SCALER_UTILS = """\
import os

import torch
import torch.distributed as dist


def setup():
    dist.init_process_group("nccl", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))


class Stepper:
    def __init__(self, optimizer):
        self.optimizer = optimizer

    def __call__(self, loss):
        loss.backward()
        self.optimizer.step()
"""

SCALER_ENGINE = """\
import torch


def train(model, criterion, batches, stepper):
    for x, y in batches:
        loss = criterion(model(x), y)
        stepper(loss)
"""

SCALER_MAIN = """\
import torch

from engine import train
from utils import Stepper, setup


def main():
    setup()
    model = torch.nn.Linear(2, 1).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    stepper = Stepper(optimizer)
    train(model, torch.nn.MSELoss(), [], stepper)


if __name__ == "__main__":
    main()
"""


def write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return folder


def index_of(folder: Path):
    return index_for(str(folder), Ignorer(True, []))


def invoke(*args: str):
    return runner.invoke(cli.app, list(args))


# 1. The index ------------------------------------------------------------------------------------------------


def test_index_resolves_local_imports_and_finds_helpers_entries_setup_and_saves():
    index = index_of(FIXTURE)
    assert sorted(index.modules) == ["engine.py", "main.py", "model.py", "utils.py"]
    assert index.edges["main.py"] == ("engine.py", "model.py", "utils.py")
    assert index.edges["engine.py"] == ("utils.py",)
    assert [rel for rel in index.modules if index.is_entry(rel)] == ["main.py"]
    utils = index.modules["utils.py"]
    assert utils.step_helpers == {"LossScaler.__call__": ("backward", "step")}
    assert utils.save_helpers == ("save_on_master",)
    assert any(what == "init_process_group" for _, what in utils.distributed)
    assert index.modules["model.py"].distributed == ()
    # The loss-scaler object main.py makes is what engine.py's parameter of the same name holds.
    assert index.instance_class("engine.py", "loss_scaler") == ("utils.py", "LossScaler")
    assert index.view(str(FIXTURE / "engine.py")).instance_effects("loss_scaler") == ("backward", "step")
    # Plain data: it travels to worker processes.
    assert pickle.loads(pickle.dumps(index)) == index


def test_index_helpers_relative_imports_and_packages(tmp_path):
    write(tmp_path, {"pkg/__init__.py": "", "pkg/utils.py": UTILS,
                     "pkg/engine.py": ENGINE.replace("from utils import", "from .utils import"),
                     "run.py": "from pkg import engine\n\nif __name__ == '__main__':\n    engine.train(None, [], None)\n",
                     "broken.py": "def f(:\n"})
    index = index_of(tmp_path)
    assert index.modules["pkg/utils.py"].step_helpers == {"train_step": ("backward", "step"),
                                                         "only_backward": ("backward",)}
    assert index.edges["pkg/engine.py"] == ("pkg/utils.py",)
    assert index.edges["run.py"] == ("pkg/engine.py",)
    assert index.helper_effects("pkg/engine.py", "pkg.utils.train_step") == ("backward", "step")
    assert index.helper_effects("pkg/engine.py", "pkg.utils.log") == ()
    assert index.is_entry("run.py") and not index.is_entry("pkg/engine.py") and not index.is_entry("pkg/utils.py")
    assert index.modules["broken.py"].error  # indexed as unreadable; its migration reports the syntax error
    assert index.is_entry("broken.py")  # nothing imports it: a script of its own


def test_a_file_outside_the_root_has_no_view(tmp_path):
    write(tmp_path / "a", {"x.py": "import torch\n"})
    index = build_index(str(tmp_path / "a"), [str(tmp_path / "a" / "x.py")])
    assert index.view(str(tmp_path / "elsewhere.py")) is None
    assert index.view(str(tmp_path / "a" / "x.py")).rel == "x.py"


# 2. The step analysis and XLA407 read it ----------------------------------------------------------------------


def test_loop_whose_step_is_an_imported_helper_is_a_training_loop(tmp_path):
    write(tmp_path, {"utils.py": UTILS, "engine.py": ENGINE})
    index = index_of(tmp_path)
    alone = migrate(ENGINE, path=str(tmp_path / "engine.py"))
    assert not alone.changed  # alone, the loop has no backward, no step, no forward: not a step loop
    result = migrate(ENGINE, path=str(tmp_path / "engine.py"), project=index)
    assert [c.code for c in result.changes] == ["XLA302"]
    assert "after the update" in result.changes[0].message
    assert "        loss = train_step(model, batch, optimizer)\n        xm.mark_step()\n" in result.code
    assert "optimizer_step" not in result.code  # the helper's module steps: nothing is added here
    helper = migrate(UTILS, path=str(tmp_path / "utils.py"), project=index)
    assert helper.code.count("xm.optimizer_step(optimizer)") == 1


def test_object_of_a_project_class_passed_in_steps_the_optimizer(tmp_path):
    write(tmp_path, {"utils.py": SCALER_UTILS, "engine.py": SCALER_ENGINE, "main.py": SCALER_MAIN})
    index = index_of(tmp_path)
    alone = migrate(SCALER_ENGINE, path=str(tmp_path / "engine.py"))
    assert "at the end of each evaluation batch" in alone.changes[0].message  # seen as evaluation alone
    result = migrate(SCALER_ENGINE, path=str(tmp_path / "engine.py"), project=index)
    barrier = [c for c in result.changes if c.code == "XLA302"]
    assert len(barrier) == 1 and "after the update" in barrier[0].message
    assert "        stepper(loss)\n        xm.mark_step()\n" in result.code
    assert result.data_parallel == "xm"  # utils.py's setup makes the whole program distributed


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_helper_modules_get_no_entry_point_finding(tmp_path, target):
    write(tmp_path, {"utils.py": SCALER_UTILS, "engine.py": SCALER_ENGINE, "main.py": SCALER_MAIN})
    index = index_of(tmp_path)
    form = {"data_parallel": "xm"}
    alone = migrate(SCALER_UTILS, path=str(tmp_path / "utils.py"), target=target, **form)
    assert any(f.code == "XLA407" for f in alone.findings)  # alone, utils.py looks like a script to launch
    for name in ("utils.py", "engine.py"):
        result = migrate((tmp_path / name).read_text(), path=str(tmp_path / name), target=target, project=index,
                         **form)
        assert not any(r.code == "XLA407" for r in [*result.findings, *result.changes]), name
        assert "_mp_fn" not in result.code
    entry = migrate(SCALER_MAIN, path=str(tmp_path / "main.py"), target=target, project=index, **form)
    assert "def _mp_fn(index):" in entry.code and "_mp_fn, args=()" in entry.code


def test_without_a_project_single_file_output_is_unchanged(tmp_path):
    # A folder with no [tool.xla-migrate]: a single-file run builds no index (goldens are single files).
    write(tmp_path, {"utils.py": SCALER_UTILS, "engine.py": SCALER_ENGINE, "main.py": SCALER_MAIN})
    result = invoke(str(tmp_path / "utils.py"), "--out", "-", "-q")
    assert result.exit_code == 0
    assert result.stdout == migrate(SCALER_UTILS, path=str(tmp_path / "utils.py")).code
