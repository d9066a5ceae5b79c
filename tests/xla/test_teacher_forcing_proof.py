"""Proof tier, XLA312's coin-toss finding on real torch_xla 2.9 (issue 30): the finding's claim and its fix.

fixtures/runnable/teacher_forcing.py (pytorch-seq2seq's shape) tosses a coin at every decoder time step to
choose the next input. The tool cannot rewrite that choice without changing which inputs the model sees, so it
reports it (XLA312). This test shows the report is true: the migrated script compiles a new graph for nearly
every step, and the finding's fix (the tosses drawn on the device, both inputs computed, torch.where choosing)
compiles once (the random targets give no curve to compare: the tosses now come from another generator).
"""

from __future__ import annotations

import math

import pytest
import xla_proof as xp

pytestmark = pytest.mark.xla

ENV = "current"
NAME = "teacher_forcing"
TOSS = "            teacher_force = random.random() < ratio\n"
CHOICE = "            token = targets[t] if teacher_force else step_logits.argmax(1)\n"
# The finding's second fix, applied by hand: tosses drawn on the device, both inputs computed, one graph.
DEVICE_TOSSES = "        tosses = torch.rand(targets.shape[0], device=targets.device) < ratio\n"
DEVICE_CHOICE = "            token = torch.where(tosses[t], targets[t], step_logits.argmax(1))\n"


def test_a_coin_toss_per_time_step_recompiles_and_the_findings_fix_compiles_once():
    from xla_migrate import migrate

    python = xp.require_env(ENV)
    path = xp.RUNNABLE / f"{NAME}.py"
    result = migrate(path.read_text(), target="2.9", path=str(path))
    assert result.error is None
    tosses = [f for f in result.findings if f.code == "XLA312" and "coin toss" in f.message]
    assert [f.line for f in tosses] == [33], result.findings
    assert TOSS in result.code and CHOICE in result.code, "the fixture's toss is no longer spelled as the test edits it"
    fixed = result.code.replace(TOSS, "").replace(CHOICE, DEVICE_CHOICE)
    fixed = fixed.replace("        logits = []\n", "        logits = []\n" + DEVICE_TOSSES, 1)

    migrated = xp.run_script(python, result.code, f"tosses migrated {NAME}", xla=True)
    by_fix = xp.run_script(python, fixed, f"tosses fixed {NAME}", xla=True)
    for run in (migrated, by_fix):
        assert run.returncode == 0, run.describe()
        assert len(run.losses) == 12 and run.final is not None, run.describe()
    # 12 steps of 5 tosses: nearly every step is a pattern not seen before, so a new graph.
    assert migrated.final.compiles >= 8, migrated.describe()
    assert by_fix.final.compiles <= xp.WARMUP_STEPS + xp.LATE_COMPILES, by_fix.describe()
    assert all(math.isfinite(loss) for loss in by_fix.losses), by_fix.losses
