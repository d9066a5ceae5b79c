"""Proof tier for notebooks: a training notebook split over cells (imports in one, the model in the next,
the loop under %%time in a third) is migrated as one program, then executed cell by cell by nbclient in a
real IPython kernel on torch_xla (PJRT CPU). Its losses must equal the original's, run on plain torch in
the same environment: cell 1's imports and cell 2's device reach the later cells, and the IPython lines
still run."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import nbclient  # nbclient and ipykernel come with the test extra
import nbformat
import pytest

import xla_proof as xp

pytestmark = pytest.mark.xla

ROOT = Path(__file__).resolve().parents[2]
CELLS = [
    "%matplotlib --list\nimport torch\nimport torch.nn as nn\ntorch.manual_seed(0)",
    'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\n'
    "model = nn.Linear(4, 2).to(device)\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "data = torch.utils.data.TensorDataset(torch.randn(40, 4), torch.randn(40, 2))\n"
    "loader = torch.utils.data.DataLoader(data, batch_size=8)",
    "%%time\nlosses = []\nfor x, y in loader:\n    x, y = x.to(device), y.to(device)\n"
    "    loss = ((model(x) - y) ** 2).mean()\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
    "    losses.append(loss.item())",
    "!echo shell lines still run",
    'import json\nprint("LOSSES", json.dumps(losses))\ntorch.save(model.state_dict(), "model.pt")',
]


def _kernel(tmp_path: Path, python: Path) -> str:
    """A kernelspec running `python` (a torch_xla environment, which has no ipykernel of its own) with this
    environment's ipykernel appended to its path, so the torch environment's own packages win."""
    ours = [p for p in site.getsitepackages() if p.startswith(sys.prefix)]
    launch = ("import sys; sys.path.extend(%r); from ipykernel.kernelapp import launch_new_instance; "
              "launch_new_instance()" % ours)
    spec = tmp_path / "jupyter" / "kernels" / "xla-proof"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-c", launch, "-f", "{connection_file}"], "display_name": "xla proof",
        "language": "python", "env": {"PJRT_DEVICE": "CPU", "TF_CPP_MIN_LOG_LEVEL": "2"}}))
    return str(tmp_path / "jupyter")


def _execute(path: Path, workdir: Path) -> list[float]:
    nb = nbformat.read(str(path), as_version=4)
    nbclient.NotebookClient(nb, kernel_name="xla-proof", timeout=600,
                            resources={"metadata": {"path": str(workdir)}}).execute()
    printed = "".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                      for out in cell.outputs if out.get("output_type") == "stream")
    assert "shell lines still run" in printed
    (line,) = [line for line in printed.splitlines() if line.startswith("LOSSES ")]
    return json.loads(line[len("LOSSES "):])


@pytest.mark.parametrize("env", list(xp.TARGETS))
def test_a_migrated_notebook_runs_on_torch_xla_cell_by_cell(env, tmp_path, monkeypatch):
    python = xp.require_env(env)
    monkeypatch.setenv("JUPYTER_PATH", _kernel(tmp_path, python))
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "xla-proof", "language": "python", "display_name": "xla proof"}
    nb.cells = [nbformat.v4.new_markdown_cell("# Training on CUDA")] + [nbformat.v4.new_code_cell(c) for c in CELLS]
    original, migrated = tmp_path / "original", tmp_path / "migrated"
    original.mkdir()
    migrated.mkdir()
    nbformat.write(nb, str(original / "train.ipynb"))
    nbformat.write(nb, str(migrated / "train.ipynb"))
    done = subprocess.run([str(Path(sys.executable).with_name("xla-migrate")), "train.ipynb", "--in-place",
                           "--target", xp.TARGETS[env]], cwd=migrated, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    cells = [c.source for c in nbformat.read(str(migrated / "train.ipynb"), as_version=4).cells]
    assert "import torch_xla" in cells[1] and not any("import torch_xla" in c for c in cells[2:])
    assert "MpDeviceLoader" in cells[3] and "opt.step()" not in cells[3] and "torch.save" not in cells[5]
    expected = _execute(original / "train.ipynb", original)
    losses = _execute(migrated / "train.ipynb", migrated)
    assert len(losses) == len(expected) == 5
    assert max(abs(a - b) for a, b in zip(losses, expected)) < 1e-5, (losses, expected)
    assert (migrated / "model.pt").is_file()
