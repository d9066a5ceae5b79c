"""XLA205 fused-optimizer-on-xla: ``fused=`` goes from torch.optim optimizers whose parameters go to XLA.

What it does:
    Drops the ``fused=`` argument of a ``torch.optim`` optimizer (``AdamW``, ``Adam``, ``SGD`` and the others
    that take it, in every spelling) unless it says ``False`` or ``None``: ``fused=True``, and also a flag the
    program computes, such as nanoGPT-style ``fused=use_fused`` with ``use_fused = 'fused' in
    inspect.signature(torch.optim.AdamW).parameters and device_type == 'cuda'``, whose device test the
    migration makes true. The optimizer then uses its default implementation. ``foreach=`` stays: it works
    on XLA. In AMP scripts the optimizers XLA203 makes syncfree lose ``fused=`` there.

Why:
    The fused kernels exist for CUDA and a few other devices, not XLA: the first ``optimizer.step()`` on XLA
    parameters raises "RuntimeError: `fused=True` requires all the params to be floating point Tensors of
    supported devices" (torch 2.9.0 + torch_xla 2.9.0 and torch 2.6.0 + torch_xla 2.6.1, AdamW, Adam and
    SGD, measured here; karpathy/llama2.c crashed there). The default implementation computes the same
    update (the fused kernel is a speed choice), and on XLA the whole step is compiled into one graph anyway.

Example:
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), fused=use_fused)

Use instead:
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95))
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.amp.syncfree_optimizers import becomes_syncfree
from xla_migrate.transforms.common import joined, short

# Optimizers of torch.optim that take fused= (torch 2.6 to 2.9), in their public and module spellings.
FUSED_OPTIMIZERS = ("Adam", "AdamW", "SGD", "Adagrad")
_QUALNAMES = frozenset({f"torch.optim.{name}" for name in FUSED_OPTIMIZERS}
                       | {f"torch.optim.{name.lower()}.{name}" for name in FUSED_OPTIMIZERS})
_OFF = ("False", "None")


class FusedOptimizerOnXla(Rule):
    code = "XLA205"
    name = "fused-optimizer-on-xla"
    summary = "torch.optim optimizer(..., fused=...) -> without fused= (no fused kernels for XLA parameters)"

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.qualnames(node.func).isdisjoint(_QUALNAMES):
            return
        index = next((i for i, a in enumerate(node.args) if a.keyword is not None and a.keyword.value == "fused"),
                     None)
        if index is None:
            return
        value = node.args[index].value
        if isinstance(value, cst.Name) and value.value in _OFF or becomes_syncfree(self.ctx, node):
            return
        if self._cuda_test(value):
            return  # XLA104 decides it (False: its CUDA branch needs CUDA)

        def without_fused(updated: cst.Call) -> cst.Call:
            return updated.with_changes(args=joined([a for i, a in enumerate(updated.args) if i != index]))

        self.replace(node, without_fused, f"{short(node.func)}(..., fused={short(value, 30)}): fused= dropped "
                                          "(no fused kernels for XLA parameters; the default computes the same update)")

    def _cuda_test(self, value: cst.BaseExpression) -> bool:
        """``value`` tests for CUDA itself (``device.type == "cuda"``, ``torch.cuda.is_available()``)."""
        return bool(patterns.find_all(value, lambda node: (
            isinstance(node, cst.SimpleString) and patterns.is_cuda_string(node)
            or isinstance(node, (cst.Name, cst.Attribute))
            and any(q.startswith("torch.cuda") for q in self.ctx.torch_names(node)))))
