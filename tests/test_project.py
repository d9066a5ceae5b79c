"""Projects (issue 14): the project index, the step analysis and XLA407 reading it, one decision per project,
the project summary, --requirements, and file-by-file runs with --project agreeing with a tree run."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from xla_migrate import cli
from xla_migrate import migrate
from xla_migrate.analysis.project import _index_module, build_index
from xla_migrate.report.summary import CUDA_FAMILIES, family
from xla_migrate.cli.discovery import Ignorer, index_for

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
    # A save helper as the importing module names it (XLA501 follows a rank test one call away).
    assert index.save_helper("main.py", "save_on_master") == "utils.py"
    assert index.save_helper("engine.py", "reduce_mean") is None
    assert index.save_helper("main.py", "Regressor") is None
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


def test_star_imports_and_hubconf_are_no_entry_files_for_the_compile_cache(tmp_path):
    # PyTorch-VAE's models/__init__.py star-imports each model; yolov5's hubconf.py is imported by torch.hub
    # into a running program. XLA315's xr.initialize_cache there would run after the first computation.
    model = "import torch\n\ndevice = torch.device('cuda')\n\n\nclass VAE(torch.nn.Module):\n    pass\n"
    hubconf = "import torch\n\n\ndef vae():\n    return torch.nn.Linear(2, 2).cuda()\n\n\n" \
              "if __name__ == '__main__':\n    vae()\n"
    write(tmp_path, {"models/__init__.py": "from .vae import *\n", "models/vae.py": model, "hubconf.py": hubconf,
                     "train.py": "import torch\nfrom models import VAE\n\nif __name__ == '__main__':\n"
                                 "    device = torch.device('cuda')\n    VAE().to(device)\n"})
    index = index_of(tmp_path)
    assert index.edges["models/__init__.py"] == ("models/vae.py",)
    assert not index.is_entry("models/vae.py")
    for name, cached in (("models/vae.py", False), ("hubconf.py", False), ("train.py", True)):
        result = migrate((tmp_path / name).read_text(), path=str(tmp_path / name), target="2.9", project=index)
        assert ("initialize_cache" in result.code) is cached, name


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
    # utils.py's setup makes the whole program distributed; it wraps no model in DDP: auto keeps the ddp form
    assert result.data_parallel == "ddp" and result.data_parallel_reason.startswith("auto: no DistributedDataParallel")


def test_two_entry_files_sharing_a_helper_are_two_programs(tmp_path):
    # Issue 33 (cleanrl): a torchrun script and a one-process script both import a logging helper; only the
    # torchrun script's program is distributed. A module the distributed entry imports through another
    # module (model.py via lib.py) still belongs to that program.
    write(tmp_path, {"logs.py": "def report(x):\n    print(x)\n",
                     "lib.py": "import torch.distributed as dist\nimport model\n\n\ndef setup():\n"
                               "    dist.init_process_group('nccl')\n",
                     "model.py": "import torch\n",
                     "multi.py": "import torch\nimport lib\nfrom logs import report\n\nlib.setup()\n",
                     "single.py": "import torch\nfrom logs import report\n\nreport(torch.ones(1))\n"})
    index = index_of(tmp_path)
    assert index.component("single.py") == ["logs.py", "single.py"]
    assert index.component("multi.py") == ["lib.py", "logs.py", "model.py", "multi.py"]
    assert index.component("logs.py") == ["lib.py", "logs.py", "model.py", "multi.py", "single.py"]
    assert not index.view(str(tmp_path / "single.py")).distributed
    assert all(index.view(str(tmp_path / name)).distributed for name in ("multi.py", "lib.py", "model.py", "logs.py"))


def test_methods_of_a_model_whose_base_class_is_imported_are_outside_the_steps(tmp_path):
    # Issue 30 (PyTorch-VAE's LVAE(BaseVAE), BaseVAE(nn.Module) in models/base.py): a loop over the blocks in
    # the model's methods is its forward, not an evaluation loop: no barrier there, one per step in train.py.
    base = "from torch import nn\n\n\nclass Base(nn.Module):\n    pass\n\n\nclass Deeper(Base):\n    pass\n"
    model = ("import torch\nfrom torch import nn\nfrom base import Deeper\n\n\nclass Plain:\n    pass\n\n\n"
             "class Ladder(Deeper):\n    def encode(self, x):\n        for encoder_block in self.encoders:\n"
             "            x = encoder_block(x)\n        return x\n")
    train = ("import torch\nfrom model import Ladder\n\nmodel = Ladder().cuda()\nopt = torch.optim.SGD(model.parameters())\n"
             "for i in range(3):\n    loss = model(torch.ones(4).cuda()).sum()\n    loss.backward()\n    opt.step()\n")
    write(tmp_path, {"base.py": base, "model.py": model, "train.py": train})
    index = index_of(tmp_path)
    assert index.torch_module_class("model.py", "Deeper")  # Deeper -> Base -> nn.Module, across modules
    assert not index.torch_module_class("model.py", "Plain") and not index.torch_module_class("model.py", "Nope")
    with_project = migrate(model, path=str(tmp_path / "model.py"), target="2.9", project=index)
    assert "torch_xla.sync()" not in with_project.code, with_project.code
    alone = migrate(model, path=str(tmp_path / "model.py"), target="2.9")
    assert "torch_xla.sync()" in alone.code  # alone, the base is unknown: the loop looks like an evaluation loop
    trained = migrate(train, path=str(tmp_path / "train.py"), target="2.9", project=index)
    assert trained.code.count("torch_xla.sync()") == 1


def test_a_base_class_re_exported_by_a_package_is_followed(tmp_path):
    # PyTorch-VAE: models/lvae.py does `from models import BaseVAE`, models/__init__.py `from .base import *`.
    (tmp_path / "models").mkdir()
    write(tmp_path, {"models/__init__.py": "from .base import *\nfrom .lvae import *\n",
                     "models/base.py": "from torch import nn\n\n\nclass BaseVAE(nn.Module):\n    pass\n",
                     "models/lvae.py": "from models import BaseVAE\n\n\nclass LVAE(BaseVAE):\n    pass\n"})
    index = index_of(tmp_path)
    assert index.torch_module_class("models/lvae.py", "BaseVAE")
    assert not index.torch_module_class("models/lvae.py", "Missing")


def test_a_method_only_one_project_class_defines_tells_what_a_factory_built_object_does(tmp_path):
    # Issue 30 (stylegan2-ada: `loss = construct_class_by_name(...)`, then `loss.accumulate_gradients(...)`
    # runs the backward in training/loss.py): the loop that steps the optimizer after it is a training step.
    losses = ("import torch\n\n\nclass Loss:\n    def accumulate_gradients(self, x):  # a subclass defines it\n"
              "        raise NotImplementedError()\n\n\n"
              "class PairLoss(Loss):\n    def accumulate_gradients(self, x):\n"
              "        x.sum().backward()\n\n    def report(self, x):\n        pass\n\n\n"
              "class Other:\n    def report(self, x):\n        pass\n")
    train = ("import torch\n\n\ndef build(name):\n    return None\n\n\ndef main(opt, x):\n    loss = build('losses.PairLoss')\n"
             "    for i in range(3):\n        loss.accumulate_gradients(x)\n        opt.step()\n\n\n"
             "if __name__ == '__main__':\n    main(None, torch.ones(2).cuda())\n")
    write(tmp_path, {"losses.py": losses, "train.py": train})
    index = index_of(tmp_path)
    assert index.sole_method_effects("accumulate_gradients") == ("backward",)
    assert index.sole_method_effects("report") == ()  # two classes define it: unknown
    result = migrate(train, path=str(tmp_path / "train.py"), target="2.9", project=index)
    assert "        xm.optimizer_step(opt)\n        torch_xla.sync()\n" in result.code, result.code
    alone = migrate(train, path=str(tmp_path / "train.py"), target="2.9")
    assert "torch_xla.sync()" not in alone.code


def test_reads_in_the_forward_of_a_model_imported_by_a_star_import_are_reads_of_every_step(tmp_path):
    # Issue 30 (Image-Captioning's `from models import *`): the forward and the helper it calls, each in its
    # own module, run every step of train.py's loop; a method reached through self reads for its caller.
    models = ("import torch\nfrom helpers import longest\n\n\nclass Net(torch.nn.Module):\n"
              "    def forward(self, x, n):\n        k = self.count(n)\n        return x[:longest(n)] * k\n\n"
              "    def count(self, n):\n        return n.sum().item()\n\n\n"
              "class Unused(torch.nn.Module):\n    def forward(self, n):\n        return n.tolist()\n")
    helpers = "import torch\n\n\ndef longest(n):\n    return int(n.max().item())\n"
    train = ("import torch\nfrom models import *\n\nmodel = Net().cuda()\nfor i in range(3):\n"
             "    out = model(torch.ones(4).cuda(), torch.tensor([1, 2]).cuda())\n")
    write(tmp_path, {"models.py": models, "helpers.py": helpers, "train.py": train})
    index = index_of(tmp_path)
    assert index.per_step("models.py", "Net.forward") == "the loop at train.py:5: model(...)"
    assert index.per_step("models.py", "Net.count") == "the loop at train.py:5: model(...) -> self.count(...)"
    assert index.per_step("helpers.py", "longest").endswith("-> longest(...) (helpers.py)")
    assert index.per_step("models.py", "Unused.forward") is None  # no loop runs it
    assert index.modules["models.py"].read_helpers["Net.forward"] == (11, "n.sum().item()")  # through self.count
    found = {}
    for name in ("models.py", "helpers.py"):
        result = migrate((tmp_path / name).read_text(), path=str(tmp_path / name), target="2.9", project=index)
        found[name] = [(f.line, f.code) for f in result.findings if f.code == "XLA311"]
    assert found == {"models.py": [(11, "XLA311")], "helpers.py": [(5, "XLA311")]}
    alone = migrate(models, path=str(tmp_path / "models.py"), target="2.9")
    assert not [f for f in alone.findings if f.code == "XLA311"]  # migrated alone: nothing runs it per step


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


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_an_entry_that_never_spells_torch_is_launched_when_its_helpers_are_distributed(tmp_path, target):
    """An entry file that only calls the project's helpers (no torch, no cuda in its text) is still the
    program's launcher: it gets _mp_fn and the spawn, as one spelling "torch" does."""
    entry = "from pkg import setup, train\n\n\ndef main():\n    setup()\n    train()\n\n\n" \
            "if __name__ == \"__main__\":\n    main()\n"
    helpers = ("import torch\nimport torch.distributed as dist\n\n\ndef setup():\n"
               "    dist.init_process_group(\"nccl\")\n\n\ndef train():\n    model = torch.nn.Linear(2, 2).cuda()\n"
               "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    for _ in range(2):\n"
               "        model(torch.zeros(2).cuda()).sum().backward()\n        opt.step()\n")
    write(tmp_path, {"main.py": entry, "pkg/__init__.py": helpers})
    result = migrate(entry, path=str(tmp_path / "main.py"), target=target, project=index_of(tmp_path),
                     data_parallel="xm")  # the xm form: the XLA launcher replaces torchrun
    assert "def _mp_fn(index):" in result.code and "(_mp_fn, args=())" in result.code
    helper = migrate(helpers, path=str(tmp_path / "pkg" / "__init__.py"), target=target, project=index_of(tmp_path))
    assert "_mp_fn" not in helper.code


def test_a_torch_free_project_reading_torchrun_variables_is_not_distributed(tmp_path):
    """A numpy program over MPI reads RANK too: nothing there is torch's, so the project is not distributed
    and every file comes back as it was."""
    files = {"main.py": "import os\nfrom work import run\n\nif __name__ == \"__main__\":\n"
                        "    run(int(os.environ[\"RANK\"]))\n",
             "work.py": "import numpy as np\n\n\ndef run(rank):\n    print(np.ones(3) * rank)\n"}
    write(tmp_path, files)
    index = index_of(tmp_path)
    assert not index.view(str(tmp_path / "main.py")).distributed
    for name, text in files.items():
        assert migrate(text, path=str(tmp_path / name), project=index).code == text


def test_without_a_project_single_file_output_is_unchanged(tmp_path):
    # A folder with no [tool.xla-migrate]: a single-file run builds no index (goldens are single files).
    write(tmp_path, {"utils.py": SCALER_UTILS, "engine.py": SCALER_ENGINE, "main.py": SCALER_MAIN})
    result = invoke(str(tmp_path / "utils.py"), "--out", "-", "-q")
    assert result.exit_code == 0
    assert result.stdout == migrate(SCALER_UTILS, path=str(tmp_path / "utils.py")).code


# 5. File by file with --project agrees with the tree run ------------------------------------------------------


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_files_one_by_one_with_project_match_the_tree_run(tmp_path, target):
    tree_out = tmp_path / "tree"
    result = invoke(str(FIXTURE), "--out", str(tree_out), "--target", target, "-q")
    assert result.exit_code == 0, result.output
    for path in sorted(FIXTURE.glob("*.py")):
        one = invoke(str(path), "--project", str(FIXTURE), "--out", "-", "--target", target, "-q")
        assert one.exit_code == 0, one.output
        assert one.stdout_bytes == (tree_out / path.name).read_bytes(), path.name
    # Alone, utils.py is a different program: it gets the entry-point finding (the xm form of sagemaker).
    if target == "sagemaker":
        alone = invoke(str(FIXTURE / "utils.py"), "--no-project", "--check")
        assert "XLA407" in alone.stderr
        with_project = invoke(str(FIXTURE / "utils.py"), "--project", str(FIXTURE), "--check")
        assert "XLA407" not in with_project.stderr


def test_single_file_finds_the_project_root_as_the_config_lookup_does(tmp_path):
    """pre-commit passes staged files one by one (or a few): the root is the config's folder, so they agree
    with a tree run over that folder."""
    root = tmp_path / "repo"
    shutil.copytree(FIXTURE, root)
    (root / "pyproject.toml").write_text('[tool.xla-migrate]\ntarget = "sagemaker"\n')
    tree = invoke(str(root), "--diff", "-q")
    one = invoke(str(root / "utils.py"), "--diff", "-q")
    assert "XLA407" not in one.stderr and one.exit_code == 0
    assert one.stdout in tree.stdout and "+import torch_xla" in one.stdout
    two = invoke(str(root / "engine.py"), str(root / "utils.py"), "--diff", "-q")  # several files: a tree run
    patches = ["diff --git" + part for part in two.stdout.split("diff --git")[1:]]
    assert len(patches) == 2 and all(patch in tree.stdout for patch in patches) and "XLA407" not in two.stderr


def test_project_and_no_project_are_exclusive_and_root_must_be_a_folder(tmp_path):
    assert invoke(str(FIXTURE / "utils.py"), "--project", str(FIXTURE), "--no-project", "--check").exit_code == 2
    bad = invoke(str(FIXTURE / "utils.py"), "--project", str(tmp_path / "nope"), "--check")
    assert bad.exit_code == 2 and "not a folder" in bad.stderr


# 3 and 4. One decision per project, the summary ----------------------------------------------------------------


def _json_run(*args: str) -> dict:
    result = invoke(*args, "--format", "json-report")
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


def test_summary_counts_match_the_change_records(tmp_path):
    report = _json_run(str(FIXTURE), "--check", "--target", "sagemaker")
    project = report["project"]
    files = report["files"]
    changes = [c for f in files for c in f["changes"]]
    findings = [(f["path"], x) for f in files for x in f["findings"]]
    assert project["files"] == len(files) == 4
    assert project["changed"] == sum(f["changed"] for f in files) == 3
    by_family: dict[str, int] = {}
    for change in changes:
        by_family[family(change["code"])] = by_family.get(family(change["code"]), 0) + 1
    assert project["changes_by_family"] == dict(sorted(by_family.items()))
    converted = sum(1 for c in changes if family(c["code"]) in CUDA_FAMILIES)
    left = [x for _, x in findings if family(x["code"]) in CUDA_FAMILIES]
    constructs = project["cuda_constructs"]
    assert constructs == {"total": converted + len(left), "converted": converted, "left": len(left),
                          "left_findings": constructs["left_findings"]}
    assert [f["code"] for f in constructs["left_findings"]] == [x["code"] for x in left] == ["XLA501"]
    assert converted > 10 and by_family["loop"] == 2  # the two device loaders in engine.py
    assert project["install"] == ["torch==2.6.0", "torch-xla==2.6.1"]
    assert project["index"]["entry_files"] == ["main.py"]
    assert project["index"]["step_helpers"] == ["utils.py:LossScaler.__call__"]
    assert project["index"]["save_helpers"] == ["utils.py:save_on_master"]


def test_decisions_say_where_they_came_from(tmp_path):
    default = _json_run(str(FIXTURE), "--check")["project"]["decisions"]
    assert default["target"] == {"value": "sagemaker", "from": "default"}
    assert default["distributed"]["value"] is True
    assert "utils.py:15 init_process_group" in default["distributed"]["from"]
    assert default["data_parallel"]["value"] == "ddp"  # auto: the update is in utils.py's loss scaler
    assert default["data_parallel"]["from"].startswith("default for the sagemaker target: auto: ")
    flags = _json_run(str(FIXTURE), "--check", "--target", "2.9", "--data-parallel", "xm", "--single")
    decisions = flags["project"]["decisions"]
    assert decisions["target"] == {"value": "2.9", "from": "--target"}
    assert decisions["distributed"] == {"value": False, "from": "--single"}
    assert "data_parallel" not in decisions  # a single-device program has no data-parallel form
    root = tmp_path / "repo"
    shutil.copytree(FIXTURE, root)
    (root / "pyproject.toml").write_text('[tool.xla-migrate]\ntarget = "2.9"\ndata-parallel = "xm"\n')
    configured = _json_run(str(root), "--check")["project"]["decisions"]
    assert configured["target"]["from"].endswith("pyproject.toml [tool.xla-migrate]")
    assert configured["data_parallel"]["value"] == "xm"
    assert configured["data_parallel"]["from"].endswith("pyproject.toml [tool.xla-migrate]")
    # Every file got the project's form: the distributed ones and engine.py, which has no setup of its own.
    report = _json_run(str(root), "--check")
    assert {f["path"].rsplit("/", 1)[-1]: f["data_parallel"] for f in report["files"]} == {
        "engine.py": "xm", "main.py": "xm", "model.py": "xm", "utils.py": "xm"}


def test_text_summary(tmp_path):
    result = invoke(str(FIXTURE), "--check", "--target", "2.9")
    lines = result.stderr.splitlines()
    assert lines[-1].startswith("4 files: 3 would change")  # the run's summary line stays last
    text = "\n".join(lines)
    assert "project: 4 files, 3 would change" in text
    assert "CUDA constructs converted, 1 left for a human:" in text
    assert "install for the target: pip install torch==2.9.0 torch-xla==2.9.0" in text
    assert "decided once: target 2.9 (--target); distributed yes (detected: " in text


# --requirements ------------------------------------------------------------------------------------------------


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(FIXTURE, root)
    return root


def test_requirements_txt_gets_the_pin_once(tmp_path):
    root = _copy(tmp_path)
    (root / "requirements.txt").write_text("torch\nnumpy")
    dry = invoke(str(root), "--check", "--requirements", "--target", "2.9")
    assert "would add torch-xla==2.9.0" in dry.stderr
    assert (root / "requirements.txt").read_text() == "torch\nnumpy"
    done = invoke(str(root), "--in-place", "--requirements", "--target", "2.9")
    assert done.exit_code == 0, done.output
    assert (root / "requirements.txt").read_text() == "torch\nnumpy\ntorch-xla==2.9.0\n"
    again = invoke(str(root), "--in-place", "--requirements", "--target", "2.9")
    assert "already names torch_xla" in again.stderr
    assert (root / "requirements.txt").read_text() == "torch\nnumpy\ntorch-xla==2.9.0\n"


@pytest.mark.parametrize("dependencies,expected", [
    ('dependencies = [\n    "torch",  # the model\n    "numpy"\n]\n',
     'dependencies = [\n    "torch",  # the model\n    "numpy",\n    "torch-xla==2.6.1",\n]\n'),
    ('dependencies = ["torch"]\n', 'dependencies = ["torch", "torch-xla==2.6.1"]\n'),
    ('dependencies = []\n', 'dependencies = ["torch-xla==2.6.1"]\n'),
])
def test_pyproject_dependencies_get_the_pin(tmp_path, dependencies, expected):
    root = _copy(tmp_path)
    head = '[project]\nname = "demo"\nversion = "0.1"\n'
    tail = '\n[tool.other]\nx = 1\n'
    (root / "pyproject.toml").write_text(head + dependencies + tail)
    result = invoke(str(root), "--in-place", "--requirements")
    assert result.exit_code == 0, result.output
    assert (root / "pyproject.toml").read_text() == head + expected + tail


@pytest.mark.parametrize("text", ['[project]\nname = "demo"\n', 'not toml = = \n',
                                  '[project]\nname = "demo"\ndependencies = "torch"\n'])
def test_pyproject_that_cannot_take_the_pin_is_left_whole(tmp_path, text):
    root = _copy(tmp_path)
    (root / "pyproject.toml").write_text(text)
    result = invoke(str(root), "--in-place", "--requirements")
    assert result.exit_code == 2
    error = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "pyproject.toml" in error[0]
    assert (root / "pyproject.toml").read_text() == text


def test_requirements_needs_a_tree_run(tmp_path):
    result = invoke(str(FIXTURE / "main.py"), "--check", "--requirements")
    assert result.exit_code == 2 and "--requirements takes a tree run" in result.stderr


def test_project_report_matches_the_schema():
    import jsonschema
    schema = json.loads((ROOT / "docs" / "report.schema.json").read_text())
    report = _json_run(str(FIXTURE), "--check", "--target", "2.9")
    assert "project" in report
    jsonschema.validate(report, schema)


def test_walk_ast_gives_ast_walks_nodes_in_its_order():
    import ast

    from xla_migrate.analysis.project import walk_ast

    root = Path(__file__).resolve().parent.parent / "fixtures"
    trees = [ast.parse(path.read_bytes()) for path in sorted((root / "realistic").glob("*.py"))]
    assert len(trees) > 10
    for tree in trees:
        assert walk_ast(tree) == list(ast.walk(tree))


def test_a_model_made_in_main_and_called_in_the_training_function_is_followed(tmp_path):
    # Image-Captioning's shape: decoder = DecoderWithAttention(...) in main, decoder(imgs, caps) in train().
    models = "import torch\n\n\nclass Dec(torch.nn.Module):\n    def forward(self, n):\n        return n.tolist()\n"
    train = ("import torch\nfrom models import Dec\n\n\ndef train(decoder):\n    for i in range(3):\n"
             "        decoder(torch.ones(2).cuda())\n\n\ndef main():\n    decoder = Dec().cuda()\n    train(decoder)\n")
    write(tmp_path, {"models.py": models, "train.py": train})
    assert index_of(tmp_path).per_step("models.py", "Dec.forward") == "the loop at train.py:6: decoder(...)"


def test_a_random_crop_helper_of_another_module_is_reported_at_the_steps_call(tmp_path):
    # SRGAN's imgproc.random_crop_torch applied after .to(device) in train_gan.py (issue 30, XLA312).
    helpers = ("import random\n\n\ndef crop(x, p):\n    top = random.randint(0, x.shape[-2] - p)\n"
               "    rows = [top, top + p]\n    return x[:, :, top:top + p], rows[top:top + 1]\n")
    train = ("import torch\nfrom imgproc import crop\n\nmodel = torch.nn.Conv2d(3, 3, 1).cuda()\n"
             "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor i in range(3):\n"
             "    x, _ = crop(torch.ones(2, 3, 8, 8).cuda(), 4)\n    loss = model(x).sum()\n    loss.backward()\n"
             "    opt.step()\n")
    write(tmp_path, {"imgproc.py": helpers, "train.py": train})
    index = index_of(tmp_path)
    assert index.modules["imgproc.py"].random_slices == {"crop": (7, "x[:, :, top:top + p]")}  # not the list
    result = migrate(train, path=str(tmp_path / "train.py"), target="2.9", project=index)
    found = [(f.line, f.message) for f in result.findings if f.code == "XLA312"]
    assert [line for line, _ in found] == [7] and "imgproc.py:7: x[:, :, top:top + p]" in found[0][1], found


@pytest.mark.parametrize("body, found", [
    ("if torch.min(y) < -1.:\n        pass", (2, "if torch.min(y) < -1.0:")),
    ("t = th.relu(y)\n    while t.max() > 1:\n        t = t / 2", (3, "while t.max() > 1: in a loop")),
    ("assert (F.relu(y) >= 0).all()", (2, "assert (F.relu(y) >= 0).all()")),
    ("if y.max() > 1:  # y may be a number or an array\n        pass", None),
    ("if torch.is_tensor(y) and y.size(0) > 1 and y.shape[0] > 1:\n        pass", None),
    ("m = torch.max(y).item()\n    if m > 1:\n        pass", (2, "torch.max(y).item()")),
    ("if torch.cuda.is_available() and y is not None:\n        pass", None),
    ("tied = torch.equal(y, y)\n    if not tied:  # a Python bool: torch.equal read it\n        pass", None),
])
def test_the_index_finds_truth_tests_of_tensors_with_evidence(body, found):
    """hifi-gan's mel_spectrogram shape: a torch call, or a name bound to one, is the evidence (line - 3: the
    helper's own lines)."""
    source = f"import torch\nimport torch as th\nimport torch.nn.functional as F\ndef check(y):\n    {body}\n"
    info = _index_module("helpers.py", source.encode())
    got = info.read_helpers.get("check")
    assert (got[0] - 3, got[1]) == found if found else got is None


def test_the_index_records_window_helpers_and_device_returning_functions():
    """XLA312's cross-module summaries (round 9): a helper slicing a parameter at another parameter's offset
    (TCN's get_batch), and a function whose every return is a tensor it moved (TCN's batchify)."""
    source = (b"def get_batch(source, i, seq_len):\n"
              b"    return source[:, i:i + seq_len], source[:, i + 1:i + 1 + seq_len]\n\n\n"
              b"def fixed(source, n):\n    return source[:, 0:n]\n\n\n"
              b"def batchify(data, cuda):\n    data = data.view(4, -1)\n    if cuda:\n        data = data.cuda()\n"
              b"    return data\n\n\n"
              b"def on_host(data):\n    return data.view(4, -1)\n")
    info = _index_module("utils.py", source)
    assert info.offset_slices == {"get_batch": (0, 1, 2, "source[:, i:i + seq_len]")}
    assert info.device_returns == ("batchify",)


def test_a_notebook_sees_the_project_without_changing_the_index(tmp_path):
    (tmp_path / "metrics.py").write_text("def accuracy(y, p):\n    return (y == p).sum().item()\n")
    index = build_index(str(tmp_path), [str(tmp_path / "metrics.py")], notebooks=True)
    code = "from metrics import accuracy\nimport torch\n"
    with_notebook = index.with_notebook(str(tmp_path / "train.ipynb"), code)
    assert with_notebook.view(str(tmp_path / "train.ipynb")) is not None
    assert with_notebook.edges["train.ipynb"] == ("metrics.py",)
    assert index.view(str(tmp_path / "train.ipynb")) is None and "train.ipynb" not in index.modules
    assert index.with_notebook("/elsewhere/x.ipynb", code) is index
