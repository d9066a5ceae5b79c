"""XLA316 static-batch-shapes: batches padded to a fixed length; a corpus kept on the host, sliced, then moved.

What it does:
    Two rewrites that keep the step's input shapes the same from batch to batch (xla_migrate.analysis.shapes):

    - in a ``collate_fn`` that pads with ``pad_sequence(seqs, ...)`` (to the batch's longest sequence), when
      the script has its own maximum length (a module-level ``MAX_LEN = 64``, ``max_seq_len``, ``block_size``,
      ...), the batch is padded to that length: a zero sequence of that length joins the batch and is
      dropped again (``pad_sequence([*seqs, seqs[0].new_zeros((MAX_LEN, *seqs[0].shape[1:]))], ...)[:-1]``;
      ``[:, :-1]`` without ``batch_first=True``). Longer sequences still pad to their own length. Where a
      ``forward`` of the script reduces over the padded axis with no mask or lengths in sight
      (``self.embedding(ids).mean(dim=1)``, ``torch.sum(x, 1)``, max/min/logsumexp too), the rewrite is
      also a finding naming that line: the model now reads more padding (issue 36);
    - a corpus that ``batchify`` moves to the device (``return data.to(device)``) and ``get_batch`` slices with
      Python offsets (``source[i:i + seq_len]``) inside the training and evaluation loops: ``batchify`` returns
      the corpus on the host and ``get_batch`` moves the slices it returns (``data.to(device)``).

    The other shapes (padding to ``max(len(s) for s in batch)``, a collate without a maximum length in the
    script, other slicing of device tensors with loop offsets) are reported by XLA312 with the fix.

Why:
    XLA compiles one graph per set of input shapes, and a slice's offsets are constants of its graph. Padding
    to each batch's longest compiled one graph per distinct length (measured: 14 compilations where a fixed
    length gives 2), and a corpus on the device sliced at every offset compiles one graph per offset (about
    3,000 for one wikitext-2 epoch). On the host the slicing is free and the moved batch has the same shape
    every step (the shorter last slice compiles once more). Padding to a fixed length changes what a model
    computes when it reads the padding (a mean over all positions, an RNN's last state): review it.

Example:
    MAX_LEN = 64

    def collate(batch):
        seqs, labels = zip(*batch)
        seqs = list(seqs)
        return pad_sequence(seqs, batch_first=True, padding_value=0), torch.tensor(labels)

Use instead:
    MAX_LEN = 64

    def collate(batch):
        seqs, labels = zip(*batch)
        seqs = list(seqs)
        return pad_sequence([*seqs, seqs[0].new_zeros((MAX_LEN, *seqs[0].shape[1:]))], batch_first=True,
                            padding_value=0)[:-1], torch.tensor(labels)
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.analysis import shapes
from xla_migrate.engine.rule import Rule
from xla_migrate.syntax import patterns
from xla_migrate.transforms.common import short


class StaticBatchShapes(Rule):
    code = "XLA316"
    name = "static-batch-shapes"
    summary = "collate padding to the batch's longest -> the script's max length; a device corpus sliced per step -> host"
    fix_safety = "review"

    def visit_Module(self, node: cst.Module) -> None:
        self.module_node = node
        for collate in shapes.padded_collates(self.ctx):
            if rewritable(collate):
                self._fixed_length(collate)
        for corpus in shapes.device_corpora(self.ctx):
            if corpus_rewritable(self.ctx, corpus):
                self._host_corpus(corpus)

    # pad_sequence to a fixed length -------------------------------------------------------------------------
    def _fixed_length(self, collate: shapes.PaddedCollate) -> None:
        call = collate.node
        seqs = patterns.code_of(patterns.positional(call)[0].value)
        batch_first = patterns.keyword(call, "batch_first")
        first = batch_first is not None and patterns.dotted_name(batch_first.value) == "True"
        dummy = f"[*{seqs}, {seqs}[0].new_zeros(({collate.length}, *{seqs}[0].shape[1:]))]"
        drop = "[:-1]" if first else "[:, :-1]"

        def padded(updated: cst.Call) -> cst.BaseExpression:
            args = list(updated.args)
            args[0] = args[0].with_changes(value=patterns.parsed_expression(dummy))
            inner = updated.with_changes(args=args, lpar=[], rpar=[])
            return patterns.parsed_expression(patterns.code_of(inner) + drop).with_changes(
                lpar=updated.lpar, rpar=updated.rpar)

        self.replace(call, padded, f"{short(call)} pads to {collate.length} (the script's maximum length), not to "
                                   f"each batch's longest: one shape for every batch (review: padding the model "
                                   "reads changes its result)")
        for reduction, owner in unmasked_reductions(self.ctx, self.module_node, 1 if first else 0):
            line = self.ctx.position(reduction)[0]
            self.finding(call, f"{short(call)} now pads every batch to {collate.length}, and {owner} reduces over "
                               f"the padded axis without a mask at line {line} ({short(reduction)}): the padding "
                               f"it reads grows from the batch's longest to {collate.length}, so the model "
                               "computes a different result (a mean divides by the padded length)",
                         "mask the padded positions in the reduction (mask = ids != pad_index; (x * mask[..., None])"
                         ".sum(1) / mask.sum(1, keepdim=True)), or keep this collate as it was (one compilation "
                         "per batch length) and pad to a few bucket lengths instead")

    # The corpus on the host --------------------------------------------------------------------------------
    def _host_corpus(self, corpus: shapes.DeviceCorpus) -> None:
        move = corpus.move
        receiver = move.func.value  # type: ignore[attr-defined]
        self.replace(move, lambda updated: updated.func.value,  # type: ignore[attr-defined]
                     f"{short(move)} -> {short(receiver)}: the corpus stays on the host; "
                     f"{corpus.slicer.name.value}() moves each slice (a slice of a device tensor at a new offset "
                     "is a new graph)")
        returned = corpus.returned
        assert returned is not None and returned.value is not None
        device = self.ctx.device_reference(returned, self.code)
        for element in moved_elements(corpus):
            self.replace(element, lambda updated: cst.Call(func=cst.Attribute(
                value=_atom(updated), attr=cst.Name("to")), args=[cst.Arg(cst.Name(device))]),
                f"{short(element)} -> {short(element)}.to({device}): the slice moves to the device, the corpus "
                "stays on the host")


# Reductions that read every position of the axis they reduce: over padding, their result depends on its length.
REDUCTIONS = ("mean", "sum", "max", "min", "amax", "amin", "logsumexp", "prod")
_MASK_WORDS = ("mask", "length", "lens")


def unmasked_reductions(ctx, module: cst.Module, axis: int) -> list[tuple[cst.Call, str]]:
    """(call, "Class.forward") for each reduction over ``axis`` (``x.mean(dim=1)``, ``torch.sum(x, 1)``) in the
    ``forward`` of a class of the module that mentions no mask or lengths: a model averaging over the padding."""
    found = []
    for cls in (n for n in module.body if isinstance(n, cst.ClassDef)):
        for forward in (n for n in cls.body.body if isinstance(n, cst.FunctionDef) and n.name.value == "forward"):
            words = {n.value.lower() for n in patterns.find_all(forward, lambda n: isinstance(n, cst.Name))}
            if any(w in name for name in words for w in _MASK_WORDS):
                continue
            for call in patterns.find_all(forward.body, lambda n: isinstance(n, cst.Call)):
                if _reduces_over(ctx, call, axis):
                    found.append((call, f"{cls.name.value}.forward"))
    return found


def _reduces_over(ctx, call: cst.Call, axis: int) -> bool:
    method = patterns.method_call(call, *REDUCTIONS)
    args = patterns.positional(call)
    if method is None:
        names = ctx.qualnames(call.func)
        if not any(n in names for n in (f"torch.{r}" for r in REDUCTIONS)):
            return False
        args = args[1:]
    dim = patterns.keyword(call, "dim")
    value = dim.value if dim is not None else (args[0].value if args else None)
    return isinstance(value, cst.Integer) and int(value.value) == axis


def rewritable(collate: shapes.PaddedCollate) -> bool:
    if collate.kind != "pad_sequence" or collate.length is None:
        return False
    args = patterns.positional(collate.node)
    return bool(args) and isinstance(args[0].value, cst.Name) and not any(a.star for a in collate.node.args)


def moved_elements(corpus: shapes.DeviceCorpus) -> list[cst.BaseExpression]:
    """The returned values that come from the offset slices: the slices themselves, or names bound to them."""
    returned = corpus.returned
    if returned is None or returned.value is None:
        return []
    value = returned.value
    elements = [e.value for e in value.elements] if isinstance(value, cst.Tuple) else [value]
    sliced_names = set()
    for assign in patterns.find_all(corpus.slicer.body, lambda n: isinstance(n, cst.Assign)):
        if any(patterns.find_all(assign.value, lambda n: n is s) for s in corpus.slices):  # type: ignore[attr-defined]
            for target in assign.targets:  # type: ignore[attr-defined]
                if isinstance(target.target, cst.Name):
                    sliced_names.add(target.target.value)
    found = []
    for element in elements:
        if isinstance(element, cst.Name) and element.value in sliced_names:
            found.append(element)
        elif any(patterns.find_all(element, lambda n: n is s) for s in corpus.slices):
            found.append(element)
    return found


def corpus_rewritable(ctx, corpus: shapes.DeviceCorpus) -> bool:
    return corpus.returned is not None and bool(moved_elements(corpus))


def _atom(node: cst.BaseExpression) -> cst.BaseExpression:
    from xla_migrate.transforms.common import parenthesized_for_attribute

    return parenthesized_for_attribute(node)
