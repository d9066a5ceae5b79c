"""Jupyter notebooks through the CLI: cell by cell, outputs kept, IPython lines left alone, a valid
notebook out, cells named in the report."""

from __future__ import annotations

import json

import nbformat
import pytest
from helpers import CUDA_SCRIPT, tree_snapshot
from typer.testing import CliRunner

from xla_migrate import cli, migrate
from xla_migrate.notebooks import mask, unmask

runner = CliRunner()

MAGIC_CELL = "%matplotlib inline\n!pip install -q timm\nfiles = !ls\nmodel = torch.nn.Linear(4, 2).cuda()\nmodel?"


def invoke(*args: str):
    return runner.invoke(cli.app, list(args))


def make_notebook(path):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Train on cuda\nUse `.cuda()` here."),
        nbformat.v4.new_code_cell("import torch", execution_count=1),
        nbformat.v4.new_code_cell(MAGIC_CELL, execution_count=2, outputs=[
            nbformat.v4.new_output("stream", name="stdout", text="Linear(in_features=4)\n"),
            nbformat.v4.new_output("execute_result", data={"text/plain": "42"}, execution_count=2),
        ]),
        nbformat.v4.new_code_cell("%%bash\necho cuda"),
        nbformat.v4.new_code_cell(CUDA_SCRIPT.rstrip("\n")),
    ]
    path.write_text(nbformat.writes(nb) + "\n")
    return nb


def test_mask_round_trip():
    masked, saved = mask(MAGIC_CELL)
    assert "%" not in masked and "!" not in masked and len(saved) == 4
    assert masked.count("\n") == MAGIC_CELL.count("\n")
    assert unmask(masked, saved) == MAGIC_CELL


def test_notebook_in_place(tmp_path):
    path = tmp_path / "nb.ipynb"
    before = make_notebook(path)
    result = invoke("--in", str(path), "--in-place", "-v")
    assert result.exit_code == 0, result.stderr
    after = nbformat.read(str(path), as_version=4)
    nbformat.validate(after)
    assert len(after.cells) == 5
    assert after.cells[0].source == before.cells[0].source  # markdown untouched
    assert after.cells[1].source == "import torch"
    cell = after.cells[2].source
    lines = cell.splitlines()
    assert lines[0] == "import torch_xla.core.xla_model as xm"  # the cell's own import, as for a script
    assert [line for line in lines if line[:1] in "%!" or "= !" in line] == [
        "%matplotlib inline", "!pip install -q timm", "files = !ls"]
    assert cell.splitlines()[-1] == "model?"
    assert ".cuda()" not in cell and "xla_device()" in cell
    assert after.cells[2].outputs == before.cells[2].outputs and after.cells[2].execution_count == 2
    assert after.cells[3].source == "%%bash\necho cuda"
    assert after.cells[4].source == migrate(CUDA_SCRIPT.rstrip("\n")).code
    assert f"{path}:cell 3:line 4: XLA101" in result.stderr
    assert f"{path}:cell 5:line 3: XLA101" in result.stderr
    # Migrated once, nothing left to do: the round trip is stable.
    again = invoke("--in", str(path), "--check")
    assert again.exit_code == 0, again.stderr


def test_notebook_out_and_diff(tmp_path):
    path = tmp_path / "nb.ipynb"
    make_notebook(path)
    original = path.read_bytes()
    diff = invoke("--in", str(path), "--diff")
    assert diff.exit_code == 0 and diff.stdout.startswith(f"diff --git a/{str(path).lstrip('/')}")
    assert path.read_bytes() == original
    out = tmp_path / "nb_xla.ipynb"
    assert invoke("--in", str(path), "--out", str(out)).exit_code == 0
    assert path.read_bytes() == original
    nbformat.validate(nbformat.read(str(out), as_version=4))
    assert json.loads(out.read_text())["cells"][2]["outputs"] == json.loads(original)["cells"][2]["outputs"]


def test_notebooks_in_a_tree_and_a_broken_cell(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    make_notebook(folder / "good.ipynb")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import torch"), nbformat.v4.new_code_cell("x = torch.zeros(1,\ny.cuda()")]
    (folder / "bad.ipynb").write_text(nbformat.writes(nb))
    (folder / "junk.ipynb").write_text("{not json")
    bad_before = (folder / "bad.ipynb").read_bytes()
    result = invoke("--in", str(folder), "--in-place")
    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 2
    assert errors[0].startswith(f"error: {folder}/bad.ipynb:cell 2:line ")
    assert errors[1].startswith(f"error: {folder}/junk.ipynb: not a valid notebook")
    assert (folder / "bad.ipynb").read_bytes() == bad_before
    assert "xla_device" in (folder / "good.ipynb").read_text()


def test_unchanged_notebook_is_not_rewritten(tmp_path):
    path = tmp_path / "plain.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import torch\nx = torch.zeros(3)")]
    text = json.dumps(nb, indent=4)  # not nbformat's own layout: rewriting would show
    path.write_text(text)
    snapshot = tree_snapshot(tmp_path)
    assert invoke("--in", str(path), "--in-place").exit_code == 0
    assert tree_snapshot(tmp_path) == snapshot


@pytest.mark.parametrize("language", ["R", "julia"])
def test_other_kernels_are_left_alone(tmp_path, language):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": language, "language": language, "display_name": language}
    nb.cells = [nbformat.v4.new_code_cell("x.cuda()")]
    path = tmp_path / "nb.ipynb"
    path.write_text(nbformat.writes(nb))
    assert invoke("--in", str(path), "--check").exit_code == 0
