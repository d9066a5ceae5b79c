"""XLA501 torch-save-to-xm-save: checkpoints are written with xm.save, which moves XLA tensors to the CPU.

What it does:
    Rewrites calls of ``torch.save`` in any spelling (``torch.save``, ``T.save`` after ``import torch as T``,
    ``save`` after ``from torch import save``, ``torch.serialization.save``) to the target's ``xm.save``
    with the same arguments. Calls that pass options ``xm.save`` does not take (``pickle_module=``,
    ``pickle_protocol=``, ``_use_new_zipfile_serialization=``, ``*args``/``**kwargs``) are left as they are
    and reported. A ``torch.save`` guarded by a rank or master test (``if rank == 0:``) is rewritten and
    the test reported (once, however many saves it holds): ``xm.save`` writes from the master already, and
    in torch_xla 1.x (the seeds' generation) it ends with a rendezvous of every process, which hangs when
    only the master calls it (2.6 and 2.9 have no rendezvous there: verified in their source). Calling it
    on every process is right for both.

Why:
    ``torch.save`` of XLA tensors pickles device tensors: the checkpoint then needs an XLA device to load and
    the save forces a device-to-host transfer per tensor. ``xm.save`` moves the data to the CPU first
    and, by default, writes only from the master process (the seeds' recipe).

Example:
    torch.save(model.state_dict(), "model.pt")

Use instead:
    xm.save(model.state_dict(), "model.pt")
"""

from __future__ import annotations

import re

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule

TORCH_SAVE = ("torch.save", "torch.serialization.save")
# xm.save(data, file_or_path, master_only=True, global_master=False)
_ACCEPTED = 2
_RANK_TEST = re.compile(r"rank|ordinal|master|is_main|main_process", re.IGNORECASE)


class TorchSaveToXmSave(Rule):
    code = "XLA501"
    name = "torch-save-to-xm-save"
    summary = "torch.save(...) -> xm.save(...) (moves XLA tensors to the CPU, writes from the master)"
    fix_safety = "review"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._reported_guards: set[cst.If] = set()  # one finding per rank test, however many saves it holds

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        if not ctx.is_call_to(node, *TORCH_SAVE):
            return
        save = ctx.spell("save")
        if (len(patterns.positional(node)) > _ACCEPTED or any(a.star for a in node.args)
                or any(a.keyword is not None and a.keyword.value not in ("obj", "f") for a in node.args)):
            self.finding(node, "torch.save with options xm.save does not take",
                         f"drop the options and use {save}, or move the tensors to the CPU (.cpu()) before saving")
            return
        args = [a.with_changes(keyword=cst.Name("file_or_path")) if a.keyword and a.keyword.value == "f"
                else a.with_changes(keyword=cst.Name("data")) if a.keyword and a.keyword.value == "obj" else a
                for a in node.args]
        renamed = any(a.keyword is not None for a in node.args)
        func = patterns.parsed_expression(save)

        def to_xm_save(updated: cst.Call) -> cst.Call:
            new_args = updated.args
            if renamed:
                new_args = [a.with_changes(keyword=b.keyword) for a, b in zip(updated.args, args)]
            return updated.with_changes(func=func, args=new_args)

        self.replace(node, to_xm_save, f"{patterns.code_of(node.func)}(...) -> {save}(...)")
        for module, name in (("torch", "save"), ("torch.serialization", "save")):
            self.import_may_be_dead(module, name)
        guard = self._rank_guard(node)
        if guard is not None and guard not in self._reported_guards:
            self._reported_guards.add(guard)
            hang = ("and torch_xla 1.x's xm.save waits for every process there (a hang)"
                    if self.ctx.target.name == "sagemaker" else
                    "so the rank test is redundant (torch_xla 1.x's xm.save, which waits for every process, "
                    "would hang under it)")
            self.finding(guard, f"{save} is called under a rank test: it writes from the master only already, {hang}",
                         f"call {save} on every process and drop the rank test")

    def _rank_guard(self, node: cst.CSTNode) -> cst.If | None:
        current = self.ctx.parent(node)
        while current is not None and not isinstance(current, (cst.FunctionDef, cst.Module)):
            if isinstance(current, cst.If) and _RANK_TEST.search(patterns.code_of(current.test)):
                return current
            current = self.ctx.parent(current)
        return None
