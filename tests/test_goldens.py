"""Every golden fixture: the output is exactly the expected file, parses, and migrating it again changes
nothing (idempotence)."""

from __future__ import annotations

import libcst as cst
import pytest
from goldens import cases, cases_on_disk, run_case

from xla_migrate import migrate

# Named by the expected files on disk (collection migrates nothing); the first test checks they are the cases.
CASES = cases_on_disk()


def test_the_expected_files_on_disk_are_every_case():
    wanted, on_disk = {case.id for case in cases()}, {case.id for case in CASES}
    assert wanted - on_disk == set(), "missing expected outputs: run python tests/goldens.py"
    assert on_disk - wanted == set(), "expected outputs no case writes: run python tests/goldens.py"


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
