"""The invariant: after migration nothing CUDA-specific is left silently.

For every golden fixture input (every folder, so later fixtures are checked automatically) and every target,
the input is migrated with ALL rules; every CUDA construct that remains in the output must be covered by a
finding on the input line it came from. The output is scanned independently of XLA900 (the scanner lives in
benchmarks/output_checks.py, shared with benchmarks/corpus.py): ``.cuda`` /
``.cudnn`` attributes and bare ``cuda`` / ``cudnn`` names (``torch.cuda.x``, ``x.cuda()``, ``import
torch.backends.cudnn``), ``.pin_memory()`` calls, names that resolve into ``torch.cuda`` (``autocast`` imported from
``torch.cuda.amp``), and device or backend strings (``"cuda"``, ``"cuda:0"``, ``f"cuda:{rank}"``, ``"nccl"``);
none inside a type annotation (it runs no CUDA work).

Output lines are mapped back to input lines with difflib: an unchanged line maps to itself; a changed line to
the input lines of its changed block that hold the same construct text; a construct on a line the migration
inserted maps to nothing, so a rule that introduces CUDA code fails the test too.
"""

from __future__ import annotations

import pytest
from goldens import FIXTURES, NOT_GOLDEN
from output_checks import Construct, cuda_constructs, input_lines_for, source_lines, uncovered_in  # noqa: F401

from xla_migrate import migrate
from xla_migrate.engine.targets import TARGETS


def uncovered(source: str, target: str, ignore: list[str] | None = None) -> list[str]:
    """The CUDA constructs left in the migrated output without a finding on their input line."""
    result = migrate(source, target=target, ignore=ignore)
    assert result.error is None, result.error
    return uncovered_in(result)


def fixture_inputs():
    return sorted(p for p in FIXTURES.glob("*/*.in.py") if p.parent.name not in NOT_GOLDEN)


INPUTS = fixture_inputs()


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("path", INPUTS, ids=[f"{p.parent.name}/{p.name[:-6]}" for p in INPUTS])
def test_no_cuda_construct_is_left_silently(path, target):
    problems = uncovered(path.read_text(), target)
    assert not problems, "\n".join(problems)


LEFTOVERS = '''\
import torch
import torch.distributed as dist
from torch.cuda import nvtx

dist.init_process_group(backend="nccl")
nvtx.range_push("step")
print(torch.version.cuda)
model = (Net()
         .cuda())
'''


# The torch_xla targets: on torchtpu XLA103 does not run, so the nvtx call is XLA900's alone (tests/test_torchtpu.py).
@pytest.mark.parametrize("target", [name for name, spec in TARGETS.items() if spec.runtime == "torch_xla"])
def test_the_check_fails_when_xla900_is_ignored(target):
    assert uncovered(LEFTOVERS, target) == []
    # The distributed rules (XLA4xx) would remove the init_process_group("nccl") call: ignored here too.
    problems = uncovered(LEFTOVERS, target, ignore=["XLA900", "XLA4"])
    # XLA103 reports the nvtx call and XLA101 rewrites the .cuda(); the import of nvtx, "nccl" and
    # torch.version.cuda are left silently without XLA900. (A distributed script's module-level device is
    # torch.device("xla:0"), which needs no torch_xla import line.)
    assert [p.split(" has no finding")[0] for p in problems] == [
        "output line 3: 'cuda' (input lines [3])",
        "output line 6: 'nccl' (input lines [5])",
        "output line 8: 'cuda' (input lines [7])",
    ], problems


def test_scanner_and_line_mapping():
    source = 'import torch\nx = 1\nm = torch.cuda.foo()\n'
    output = 'import torch\nimport torch_xla\nx = 1\nm = torch.cuda.foo()\n'
    assert [c.line for c in cuda_constructs(output)] == [4]
    assert input_lines_for(source, output) == {1: [1], 2: [], 3: [2], 4: [3]}
    assert cuda_constructs('d = "cuda:0"\ne = f"cuda:{r}"\nf = "the cuda kernels"\ng = "nccl"\n') == [
        Construct(1, "cuda:0"), Construct(2, "cuda"), Construct(4, "nccl")]
