"""Loop-family reports added in session 14: the CTC loss's CPU fallback (XLA317), reported on its lines with
the fix, the code left as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from xla_migrate import migrate

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_ctc_loss_is_reported_at_construction_and_functional_call(target):
    source = (FIXTURES / "XLA317" / "ctc_loss.in.py").read_text()
    result = migrate(source, select=["XLA317"], target=target)
    assert result.code == source
    assert [f.line for f in result.findings] == [7, 16]
    assert result.findings[0].message.startswith("nn.CTCLoss: CTC loss has no XLA lowering")
    assert result.findings[1].message.startswith("ctc_loss(...): CTC loss has no XLA lowering")
    assert all("logsumexp" in f.fix for f in result.findings)


def test_other_losses_are_not_reported():
    source = "import torch.nn as nn\ncriterion = nn.CrossEntropyLoss()\nctc = 'nn.CTCLoss'\n"
    assert not migrate(source, select=["XLA317"], target="2.9").findings
