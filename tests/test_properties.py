"""Properties over generated programs (hypothesis + hypothesmith): the engine never raises, its output
parses, migrating the output again changes nothing, and a program that never mentions torch or cuda comes
back byte for byte. Budgets are the profiles in conftest.py (2,000 generated programs in CI).

Mutated realistic scripts (``mutated_scripts.py``: pieces of ``fixtures/realistic/`` with lines deleted,
names renamed to the tool's own, wrapped in a function/class/``if True:``, idioms inserted): no exception,
no error, output that compiles and passes the output gate (no name undefined that the input defined, unless
a withdrawn edit's XLA000 finding reports it), idempotent. Half the profile's budget: 1,000 cases in CI."""

from __future__ import annotations

from pathlib import Path

import hypothesmith
import libcst as cst
from hypothesis import given, settings
from hypothesis import strategies as st

from mutated_scripts import make_case, problems

from xla_migrate import migrate
from xla_migrate.engine.targets import TARGETS

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _snippets() -> list[str]:
    """Top-level statements of every golden input: the CUDA idioms the rules know, as building blocks."""
    found: set[str] = set()
    for path in sorted(FIXTURES.glob("XLA*/*.in.py")) + sorted(FIXTURES.glob("scripts/*.in.py")):
        module = cst.parse_module(path.read_bytes())
        for statement in module.body:
            found.add(module.code_for_node(statement).strip("\n") + "\n")
    return sorted(found)


SNIPPETS = _snippets()
targets = st.sampled_from(sorted(TARGETS))


@given(hypothesmith.from_grammar(), targets)
def test_programs_without_torch_come_back_byte_for_byte(source, target):
    result = migrate(source, target=target)
    if result.error is not None:  # hypothesmith emits some programs Python itself rejects
        assert result.error.message.startswith(("cannot parse", "not valid", "binary"))
        return
    assert result.code == source
    assert not result.changes and not result.findings


# Each example migrates a whole script twice (about 50 times the cost of a generated program), so this one
# runs an eighth of the profile's budget: 250 in CI.
@settings(max_examples=max(10, settings.default.max_examples // 8))
@given(st.lists(st.sampled_from(SNIPPETS), min_size=1, max_size=12), targets)
def test_cuda_scripts_built_from_known_idioms_migrate_cleanly(parts, target):
    # Snippets come from many files: give them the import every real script has, or qualified names
    # would only resolve once the first migration added it.
    source = "import torch\n" + "".join(parts)
    result = migrate(source, target=target)
    assert result.error is None, result.error
    cst.parse_module(result.code)
    compile(result.code, "<migrated>", "exec")
    again = migrate(result.output_bytes, target=target)
    assert again.error is None
    assert again.code == result.code, f"not idempotent:\n{again.diff}"


# About 0.16 s a case here (two migrations of 15-40 lines and the checks): 1,000 cases in CI take under 3 min.
@settings(max_examples=max(10, settings.default.max_examples // 2))
@given(st.integers(min_value=0, max_value=2**32 - 1), targets)
def test_mutated_realistic_scripts_migrate_cleanly(seed, target):
    case = make_case(seed)
    # An edit the gate withdrew is reported (an XLA000 finding): allowed here, listed by mutated_scripts.py.
    found = [(kind, detail) for kind, detail in problems(case.source, target) if kind != "withdrawn"]
    assert not found, (f"{case.piece} with {'+'.join(case.mutations) or 'no mutation'} ({target}):\n"
                       f"{case.source}\n" + "\n".join(f"{kind}: {detail}" for kind, detail in found))
