"""XLA905 packed-sequence: pack_padded_sequence / pack_sequence / pad_packed_sequence are reported (no XLA kernel).

What it does:
    Reports every call of ``torch.nn.utils.rnn.pack_padded_sequence``, ``pack_sequence`` and
    ``pad_packed_sequence`` in a migrated script, with the static-shape form to use instead. Where the packed
    result's ``.data`` is taken (packing only drops the padded steps, e.g. before the loss), the fix is a
    mask over the padded positions of the loss; otherwise (a PackedSequence fed to an RNN) it is the RNN on
    the padded batch. A loop that moves some batch fields to the device and keeps one on the host
    (``length = batch["length"]``, the packing's CPU lengths) is reported at that field: the device loader
    the migration wraps around the loader moves it too. Nothing is rewritten.

Why:
    The packing's backward (and an RNN over a PackedSequence) has no XLA kernel: on XLA tensors the first
    step stops with "RuntimeError: The tensor has a non-zero number of elements, but its data is not
    allocated yet" (torch_xla 2.9 and 2.6.1: in ``loss.backward()`` for packing before the loss, in the
    RNN's forward for a packed RNN). Packing also makes the shapes depend on the lengths, which
    XLA would compile once per batch. A mask keeps the shapes static and gives the same mean over the real
    tokens.

Example:
    scores = pack_padded_sequence(scores, lengths, batch_first=True).data
    targets = pack_padded_sequence(targets, lengths, batch_first=True).data
    loss = criterion(scores, targets)

Use instead:
    mask = torch.arange(targets.shape[1], device=device)[None] < lengths[:, None]
    per_token = F.cross_entropy(scores.transpose(1, 2), targets, reduction="none")
    loss = (per_token * mask).sum() / mask.sum()
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.engine.rule import Rule
from xla_migrate.syntax import patterns

PACKING = ("torch.nn.utils.rnn.pack_padded_sequence", "torch.nn.utils.rnn.pack_sequence",
           "torch.nn.utils.rnn.pad_packed_sequence")
LOSS_FIX = ("mask the padded positions of the loss instead: a per-token loss (reduction=\"none\") times mask = "
            "torch.arange(T, device=device)[None] < lengths[:, None], summed and divided by mask.sum() (or "
            "ignore_index on the padded targets); not scores[mask], whose shape changes with the lengths")
RNN_FIX = ("run the RNN on the padded batch (static shapes) and take each sequence's last real step with the "
           "lengths (output[torch.arange(B), lengths - 1]), masking the padded steps in the loss; a "
           "bidirectional RNN needs the padding masked out of its backward direction too")


class PackedSequence(Rule):
    code = "XLA905"
    name = "packed-sequence"
    summary = "pack_padded_sequence / pack_sequence / pad_packed_sequence (no XLA kernel) are reported with a mask"

    def visit_For(self, node: cst.For) -> None:
        """``for batch in loader:`` that moves some fields (``batch["ids"].to(device)``) and keeps one on the
        host (``length = batch["length"]``, for the packing's CPU lengths): the device loader the migration
        puts around the loader moves every field, that one too."""
        if "pack_padded_sequence" not in self.ctx.input_code or not isinstance(node.target, cst.Name):
            return
        batch = node.target.value
        moved, kept = False, []
        for statement in patterns.find_all(node.body, lambda n: isinstance(n, cst.Assign)):
            value = statement.value
            if patterns.method_call(value, "to") and isinstance(value.func.value, cst.Subscript):
                moved = moved or patterns.dotted_name(value.func.value.value) == batch
            elif isinstance(value, cst.Subscript) and patterns.dotted_name(value.value) == batch:
                kept.append(statement)
        if moved:
            for statement in kept:
                self.finding(statement, f"{patterns.code_of(statement.value).strip()} stays on the host here (the "
                             "packing takes CPU lengths) while the other fields go to the device: a device loader "
                             "(MpDeviceLoader) around this loader moves it to XLA too",
                             "pass the lengths to the model as a mask over the padded batch (the packing has to go "
                             f"on XLA anyway: {RNN_FIX})")

    def visit_Call(self, node: cst.Call) -> None:
        names = sorted(self.ctx.qualnames(node.func) & set(PACKING))
        if not names:
            return
        parent = self.ctx.parent(node)
        data_only = isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value == "data"
        what = f"{names[0].rsplit('.', 1)[-1]}(...){'.data' if data_only else ''}"
        self.finding(node, f"{what}: packed sequences do not run on XLA (the packing's backward and packed RNNs "
                           "have no XLA kernel: RuntimeError at the first step)", LOSS_FIX if data_only else RNN_FIX)
