"""The analysis of the CUDA paths that code already on XLA keeps (xla_migrate.analysis.cuda_paths)."""
import libcst as cst
import pytest

from xla_migrate.api import migrate
from xla_migrate.engine.context import MigrationContext
from xla_migrate.engine.targets import get_target

HEADER = "import torch\nimport torch_xla.core.xla_model as xm\ndevice = xm.xla_device()\n"


def _on_cuda_path(body: str) -> dict[str, bool]:
    """For each `mark("...")` call in ``body``: whether it is on a live CUDA path."""
    module = cst.parse_module(HEADER + body)
    ctx = MigrationContext(cst.MetadataWrapper(module, unsafe_skip_copy=True), get_target("2.9"))
    marks: dict[str, bool] = {}

    class Marks(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if isinstance(node.func, cst.Name) and node.func.value == "mark":
                marks[node.args[0].value.evaluated_value] = ctx.on_live_cuda_path(node)

    module.visit(Marks())
    return marks


@pytest.mark.parametrize("code, expected", [
    ("if torch.cuda.is_available():\n    mark('a')\nelse:\n    mark('b')\n", {"a": True, "b": False}),
    ("if device.type == 'cuda':\n    mark('a')\nelif device.type == 'xla':\n    mark('b')\n", {"a": True, "b": False}),
    ("if not args.no_cuda:\n    mark('a')\n", {"a": True}),
    ("self.cuda and mark('a')\n", {"a": True}),
    ("x = mark('a') if use_cuda else mark('b')\n", {"a": True, "b": False}),
    ("if torch.cuda.is_available() and not cfg.tpu:\n    mark('a')\n", {"a": True}),
    # A remnant: nothing chooses a CUDA path, so the ungated call is migrated.
    ("mark('a')\nif xm.is_master_ordinal():\n    mark('b')\n", {"a": False, "b": False}),
])
def test_cuda_gates(code, expected):
    assert _on_cuda_path(code) == expected


@pytest.mark.parametrize("code", [
    "if self.tpu:\n    mark('x')\nelse:\n    mark('a')\nmark('b')\n",
    "if xm is not None:\n    mark('x')\nmark('a')\nmark('b')\n",
    "if use_xla():\n    mark('x')\nmark('a')\nmark('b')\n",
])
def test_a_file_that_tests_for_xla_keeps_a_cuda_path_outside_its_xla_branches(code):
    assert _on_cuda_path(code) == {"x": False, "a": True, "b": True}


def test_not_asked_on_a_cuda_script():
    marks = _on_cuda_path("")
    assert marks == {}
    result = migrate("import torch\nif torch.cuda.is_available():\n    x = torch.zeros(2).cuda()\n", target="2.9")
    assert ".cuda()" not in result.code  # a CUDA script is migrated: the question is for code on XLA only


def test_a_remnant_in_xla_code_is_still_migrated_but_the_gated_cuda_path_is_not():
    source = HEADER + ("x = torch.zeros(2).cuda()\n"
                       "if torch.cuda.is_available():\n    y = torch.zeros(2).cuda()\n")
    result = migrate(source, target="2.9")
    assert result.code.splitlines()[-1] == "    y = torch.zeros(2).cuda()"
    assert "x = torch.zeros(2).to(device)" in result.code
    assert any(f.line == 6 and f.code == "XLA900" for f in result.findings)
