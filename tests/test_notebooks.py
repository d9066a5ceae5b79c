"""Jupyter notebooks through the CLI: the code cells as one program, edits back in their cells, outputs
kept, IPython lines left alone, a valid notebook out, cells named in every report format."""

from __future__ import annotations

import bisect
import json

import nbformat
import pytest
from helpers import CUDA_SCRIPT, ROOT, run_cli, tree_snapshot
from typer.testing import CliRunner

from xla_migrate import cli
from xla_migrate import migrate
from xla_migrate.cli.notebooks import mask, unmask

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
    # One program: the import goes into the first code cell, after its own imports, and the device is bound
    # there once for every later cell.
    assert after.cells[1].source.splitlines() == [
        "import torch", "import torch_xla.core.xla_model as xm", "xla_device = xm.xla_device()"]
    cell = after.cells[2].source
    assert [line for line in cell.splitlines() if line[:1] in "%!" or "= !" in line] == [
        "%matplotlib inline", "!pip install -q timm", "files = !ls"]
    assert cell.splitlines()[-1] == "model?"
    assert cell.splitlines()[3] == "model = torch.nn.Linear(4, 2).to(xla_device)"
    assert after.cells[2].outputs == before.cells[2].outputs and after.cells[2].execution_count == 2
    assert after.cells[3].source == "%%bash\necho cuda"
    assert ".cuda()" not in after.cells[4].source and "import" not in after.cells[4].source.split("\n", 1)[1]
    assert f"{path}:cell 3:line 4: XLA101" in result.stderr
    assert f"{path}:cell 5:line 3: XLA101" in result.stderr
    # Migrated once, nothing left to do: the round trip is stable.
    again = invoke("--in", str(path), "--check")
    assert again.exit_code == 0, again.stderr


# The notebook: the import in one cell, the training code in the next ones.
SPLIT_CELLS = [
    "import torch\nimport torch.nn as nn",
    "device = torch.device(\"cuda\")\nmodel = nn.Linear(4, 2).cuda()\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "loader = [(torch.randn(8, 4), torch.randn(8, 2)) for _ in range(3)]",
    "%%time\nfor x, y in loader:\n    x, y = x.to(device), y.to(device)\n    loss = ((model(x) - y) ** 2).mean()\n"
    "    opt.zero_grad()\n    loss.backward()\n    opt.step()",
    "torch.save(model.state_dict(), \"model.pt\")\nmodel",
]


def write_split_notebook(path, first_cell: str | None = None):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    cells = [nbformat.v4.new_markdown_cell("# Training")]
    if first_cell is not None:
        cells.append(nbformat.v4.new_code_cell(first_cell))
    cells += [nbformat.v4.new_code_cell(source) for source in SPLIT_CELLS]
    nb.cells = cells
    nbformat.write(nb, str(path))
    return nb


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_a_notebook_migrates_as_one_program(tmp_path, target):
    """Cell 2's code depends on cell 1's import: it migrates as the same code does in one .py file."""
    path = tmp_path / "train.ipynb"
    write_split_notebook(path)
    done = run_cli(str(path.name), "--in-place", "--target", target, "-v", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    after = nbformat.read(str(path), as_version=4)
    nbformat.validate(after)
    cells = [cell.source for cell in after.cells[1:]]
    # (XLA315's compile cache is for scripts: a notebook's kernel outlives one run, so it is left out there.)
    script = migrate("\n".join(s.replace("%%time\n", "") for s in SPLIT_CELLS) + "\n", target=target,
                     ignore="XLA315" if target == "2.9" else None)
    joined = "\n".join(c.replace("%%time\n", "") for c in cells) + "\n"
    assert joined == script.code  # the same program, cut at the same places
    assert not any('"cuda"' in c or ".cuda()" in c or "opt.step()" in c or "torch.save" in c for c in cells)
    assert cells[0].startswith("import torch\nimport torch.nn as nn\nimport torch_xla")  # imports: first cell
    assert all("import torch_xla" not in c for c in cells[1:])
    assert cells[2].startswith("%%time\n")
    stderr = done.stderr.decode()
    # Each change at its cell (markdown counted: the code cells are 2 to 5) and its line within the cell
    # (the notebook's cell 4 has its %%time line first).
    starts = [1, 3, 7, 13]  # the script's first line of each cell
    assert len(script.changes) >= 5
    for change in script.changes:
        index = bisect.bisect_right(starts, change.line) - 1
        line = change.line - starts[index] + 1 + (1 if index == 2 else 0)
        assert f"train.ipynb:cell {index + 2}:line {line}: {change.code}" in stderr


def test_imports_go_after_a_leading_pip_install(tmp_path):
    path = tmp_path / "colab.ipynb"
    write_split_notebook(path, first_cell="!pip install -q torch_xla")
    assert invoke(str(path), "--in-place").exit_code == 0
    after = nbformat.read(str(path), as_version=4)
    assert after.cells[1].source == "!pip install -q torch_xla"  # a shell-only cell: left as it is
    assert after.cells[2].source.startswith("import torch\nimport torch.nn as nn\nimport torch_xla")
    # Within a cell, IPython lines before the imports stay first.
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%pip install timm\nx = 1"), nbformat.v4.new_code_cell("import torch\ny = torch.zeros(1).cuda()")]
    other = tmp_path / "pip.ipynb"
    nbformat.write(nb, str(other))
    assert invoke(str(other), "--in-place").exit_code == 0
    first = nbformat.read(str(other), as_version=4).cells[0].source.splitlines()
    assert first[0] == "%pip install timm" and first[1].startswith("import torch_xla") and first[-1] == "x = 1"


def test_notebook_findings_and_errors_name_the_cell_in_every_format(tmp_path):
    import jsonschema

    path = tmp_path / "nb.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("intro"), nbformat.v4.new_code_cell("import torch"),
                nbformat.v4.new_code_cell("x = torch.zeros(1)\ns = torch.cuda.Stream()")]
    nbformat.write(nb, str(path))
    text = run_cli("nb.ipynb", "--check", cwd=tmp_path).stderr.decode()
    (finding,) = [line for line in text.splitlines() if "XLA103" in line]
    assert finding.startswith("nb.ipynb:cell 3:line 2: XLA103 CUDA streams")
    code = finding.split(": ")[1].split()[0]
    assert finding.endswith(f"[xla-migrate rule {code}]")
    done = run_cli("nb.ipynb", "--check", "--format", "json-report", cwd=tmp_path)
    report = json.loads(done.stdout)
    jsonschema.validate(report, json.loads((ROOT / "docs" / "report.schema.json").read_text()))
    (entry,) = report["files"]
    assert [(f["cell"], f["line"], f["code"]) for f in entry["findings"]] == [(3, 2, code)]
    github = run_cli("nb.ipynb", "--check", "--format", "github", cwd=tmp_path).stdout.decode()  # ruff's: stdout
    assert f"::warning file=nb.ipynb,title={code}::cell 3, line 2: " in github
    # A cell that is not Python: left out as it is, a finding names the cell and the line within it.
    nb.cells.append(nbformat.v4.new_code_cell("y = 1\nz = (1,"))
    nbformat.write(nb, str(path))
    left = run_cli("nb.ipynb", "--in-place", cwd=tmp_path)
    assert left.returncode == 0, left.stderr
    assert "nb.ipynb:cell 4:line 2: XLA001 code cell left as it is: it is not Python" in left.stderr.decode()
    assert nbformat.read(str(path), as_version=4).cells[3].source == "y = 1\nz = (1,"
    entry = json.loads(run_cli("nb.ipynb", "--check", "--format", "json-report", cwd=tmp_path).stdout)["files"][0]
    assert [(f["cell"], f["line"], f["code"]) for f in entry["findings"]][-1] == (4, 2, "XLA001")


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
    assert len(errors) == 1
    assert errors[0].startswith(f"error: {folder}/junk.ipynb: not a valid notebook")
    # The broken cell is left out with a finding; nothing else in that notebook needed a change.
    assert f"{folder}/bad.ipynb:cell 2:line 1: XLA001" in result.stderr
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


def test_cells_that_are_not_python_are_left_out_and_the_rest_migrates(tmp_path):
    """Corpus class O4: wildcard help (`torch.*Tensor?`), shell lines without `!`, a shell script in a code
    cell each made the whole notebook an input error."""
    path = tmp_path / "tutorial.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    shell = "git clone https://example.invalid/repo.git\ncd repo\npip install -e ."
    script = 'model=meta/llama\ndocker run --gpus all -e MODEL="$model" server:latest'
    nb.cells = [
        nbformat.v4.new_code_cell("import torch\ntorch.*Tensor?"),
        nbformat.v4.new_code_cell(shell),
        nbformat.v4.new_markdown_cell("Now train."),
        nbformat.v4.new_code_cell("device = torch.device('cuda')\nx = torch.zeros(2).to(device)"),
        nbformat.v4.new_code_cell(script),
    ]
    nbformat.write(nb, str(path))
    done = run_cli("tutorial.ipynb", "--in-place", "--target", "2.9", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    cells = nbformat.read(str(path), as_version=4).cells
    assert cells[0].source.endswith("torch.*Tensor?") and "import torch_xla" in cells[0].source
    assert cells[1].source == shell and cells[4].source == script
    assert cells[3].source.startswith("device = torch_xla.device()")
    stderr = done.stderr.decode()
    assert "tutorial.ipynb:cell 2:line 1: XLA001" in stderr and "tutorial.ipynb:cell 5:line 2: XLA001" in stderr
    assert "cell 1" not in stderr.split("XLA001")[0]  # the help line is IPython, not a left-out cell


def test_unmask_takes_the_indentation_its_placeholder_has_now():
    masked, saved = mask("if ok:\n    info = !nvidia-smi\n    print(info)")
    dedented = "\n".join(line[4:] if line.startswith("    ") else line for line in masked.split("\n")[1:])
    assert unmask(dedented, saved) == "info = !nvidia-smi\nprint(info)"


# A cell that inspects the GPU before training, with shell lines inside its CUDA gate (corpus: a PyTorch 2
# introduction notebook), then a cell whose gate lists the devices and sets a larger batch.
GPU_REPORT_CELL = """\
if torch.cuda.is_available():
    smi = !nvidia-smi
    smi = "\\n".join(smi)
    major, minor = torch.cuda.get_device_capability()
    print(f"compute capability {major}.{minor}")
    %env TOKENIZERS_PARALLELISM=false
else:
    print("No GPU here: training will be slow")"""
TUNING_CELL = """\
if torch.cuda.is_available():
    !ls /dev
    batch_size = 256"""


def _compiles(cell: str) -> bool:
    from xla_migrate.cli.notebooks import IPYTHON_LINE
    code = "\n".join(m.group("indent") + "pass" if (m := IPYTHON_LINE.match(line)) else line
                     for line in cell.split("\n"))
    compile(code, "<cell>", "exec")
    return True


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_a_cuda_gate_with_ipython_lines(tmp_path, target):
    """Issue 29: the gate of the first cell was folded on (its `else` only spoke of the GPU, which counted as
    CUDA code too), turning on get_device_capability(); and the fold dedented the Python lines but not the
    IPython ones, so the cell no longer compiled."""
    path = tmp_path / "intro.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    nb.cells = [nbformat.v4.new_code_cell("import torch"), nbformat.v4.new_code_cell(GPU_REPORT_CELL),
                nbformat.v4.new_code_cell(TUNING_CELL)]
    nbformat.write(nb, str(path))
    done = run_cli("intro.ipynb", "--in-place", "--target", target, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    cells = [cell.source for cell in nbformat.read(str(path), as_version=4).cells]
    assert all(_compiles(cell) for cell in cells)
    # The CUDA path is left out (the message of the other path is right on XLA), and said so.
    assert cells[1] == 'print("No GPU here: training will be slow")'
    stderr = done.stderr.decode()
    assert "intro.ipynb:cell 2:line 1: XLA104" in stderr and "get_device_capability" in stderr
    # A gate folded on moves its IPython lines with the block.
    assert cells[2] == "!ls /dev\nbatch_size = 256"
