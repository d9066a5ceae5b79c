"""XLA317 ctc-loss-cpu-fallback: torch.nn.CTCLoss / F.ctc_loss (no XLA lowering) is reported with its cost.

What it does:
    Reports every construction of ``torch.nn.CTCLoss`` and every call of ``torch.nn.functional.ctc_loss`` /
    ``torch.ctc_loss`` in a migrated script, with the choices a torch_xla user has. Nothing is rewritten:
    the loss still computes the same value on XLA, only slower.

Why:
    torch_xla has no lowering for ``aten::_ctc_loss`` nor ``aten::_ctc_loss_backward`` (pytorch/xla issue
    2399, open since 2020): both run on the CPU fallback. Every step the pending graph is executed to hand
    the log-probabilities to the host, the loss runs on the CPU, and its gradient is copied back and cut
    into the backward graph. Measured on a small CTC recogniser migrated for 2.9 (torch_xla 2.9,
    PJRT_DEVICE=CPU, 5 steps, the metrics report): counters ``aten::_ctc_loss.Tensor`` 5 and
    ``aten::_ctc_loss_backward.Tensor`` 5, 15 graph executions (3 per step where 1 is expected) and 4
    compilations. On a TPU each cut also waits for the device and moves the (T, N, C) log-probabilities
    over the host link, both ways, every step.

Example:
    criterion = torch.nn.CTCLoss(zero_infinity=True).to(device)
    loss = criterion(preds.log_softmax(2).permute(1, 0, 2), text, preds_size, length)

Use instead:
    # Either accept the cost (3 graphs per step; the loss is computed right), or write CTC in tensor ops
    # that lower: the forward algorithm in log space over a fixed maximum target length (torch.logsumexp
    # over the alpha recursion, padded targets and a mask), so the whole step stays one graph; or train
    # the attention decoder with cross-entropy instead.
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.engine.rule import Rule

CTC_CLASSES = ("torch.nn.CTCLoss", "torch.nn.modules.loss.CTCLoss")
CTC_FUNCTIONS = ("torch.nn.functional.ctc_loss", "torch.ctc_loss")
COST = ("CTC loss has no XLA lowering (aten::_ctc_loss and its backward run on the CPU fallback): each step is "
        "cut into about 3 graphs and the log-probabilities go to the host and their gradient back, every step")
FIX = ("accept the cost, or compute CTC with tensor ops that lower (the forward algorithm in log space with "
       "torch.logsumexp over a fixed maximum target length, padded targets and a mask: one graph per step), or "
       "train with an attention decoder and cross-entropy")


class CtcLossCpuFallback(Rule):
    code = "XLA317"
    name = "ctc-loss-cpu-fallback"
    summary = "torch.nn.CTCLoss / F.ctc_loss (no XLA lowering, CPU fallback every step) are reported with the fix"

    def visit_Call(self, node: cst.Call) -> None:
        names = self.ctx.qualnames(node.func)
        if names & set(CTC_CLASSES):
            self.finding(node, f"nn.CTCLoss: {COST}", FIX)
        elif names & set(CTC_FUNCTIONS):
            self.finding(node, f"ctc_loss(...): {COST}", FIX)
