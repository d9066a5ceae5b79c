"""XLA111 edge cases (the goldens hold the whole prefetcher): what is removed, and what is kept and reported."""

from __future__ import annotations

import textwrap

import pytest

from xla_migrate import migrate


def _run(source: str, target: str = "2.9"):
    result = migrate(textwrap.dedent(source), target=target, select=["XLA111"])
    assert result.error is None, result.error
    return result


@pytest.mark.parametrize("target", ["2.9", "sagemaker"])
def test_a_module_level_stream_goes_with_its_uses(target):
    result = _run("""\
        import torch
        s = torch.cuda.Stream()

        def copy(x):
            with torch.cuda.stream(s): y = x.to("cuda", non_blocking=True)
            s.synchronize()
            return y
        """, target)
    assert "torch.cuda" not in result.code.replace('"cuda"', ""), result.code
    assert "s = None" in result.code and "    y = x.to(" in result.code, result.code
    assert not [f for f in result.findings if f.code == "XLA111"]


def test_a_stream_tested_elsewhere_is_kept_and_its_lines_named():
    result = _run("""\
        import torch

        class P:
            def __init__(self):
                self.stream = torch.cuda.Stream()

            def load(self, x):
                with torch.cuda.stream(self.stream):
                    x = x.cuda()
                if self.stream is not None:
                    torch.cuda.current_stream().wait_stream(self.stream)
                return x
        """)
    assert "self.stream = torch.cuda.Stream()" in result.code and "with torch.cuda.stream" in result.code
    findings = [f for f in result.findings if f.code == "XLA111"]
    assert [f.line for f in findings] == [5] and "line 10" in findings[0].message, findings


def test_a_subclass_keeps_the_stream():
    # The subclass may read self.stream in ways this rule does not see from the base class.
    result = _run("""\
        import torch

        class P:
            def __init__(self):
                self.stream = torch.cuda.Stream()

        class Q(P):
            def go(self):
                return self.stream
        """)
    assert "torch.cuda.Stream()" in result.code


def test_a_stream_context_with_other_items_is_kept():
    result = _run("""\
        import torch
        s = torch.cuda.Stream()
        with torch.cuda.stream(s), torch.no_grad():
            pass
        """)
    assert "torch.cuda.Stream()" in result.code and "torch.cuda.stream(s)" in result.code
    assert [f.line for f in result.findings if f.code == "XLA111"] == [2]
