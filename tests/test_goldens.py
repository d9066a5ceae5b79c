"""Every golden fixture: the output is exactly the expected file, parses, and migrating it again changes
nothing (idempotence)."""

from __future__ import annotations

import libcst as cst
import pytest
from goldens import cases, run_case

from xla_migrate import migrate

CASES = cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_golden_output(case):
    assert case.expected.exists(), f"missing expected output {case.expected.name}: run python tests/goldens.py"
    result = run_case(case)
    assert result.error is None, result.error
    assert result.output_bytes.decode(result.encoding) == case.expected.read_bytes().decode(result.encoding)
    assert result.output_bytes == case.expected.read_bytes()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_golden_output_is_idempotent_and_parses(case):
    output = case.expected.read_bytes()
    cst.parse_module(output)
    again = migrate(output, target=case.target, select=case.select, data_parallel=case.data_parallel)
    assert again.error is None
    assert again.output_bytes == output, f"second migration changed the output:\n{again.diff}"
    assert again.changes == []
