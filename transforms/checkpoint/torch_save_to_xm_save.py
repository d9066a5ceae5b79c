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
    on every process is right for both. The same holds one call away: a helper that saves (a function or
    method of this module, or a project module's, ``utils.save_checkpoint``) called under a rank test is
    reported at that test.

    A save whose file is each replica's own (the rank or ordinal in its path: ``f"ckpt-rank{rank}.pt"``, a
    per-rank directory, also through a path bound in the same function) and that no rank test guards becomes
    ``xm.save(..., master_only=False)``: the master-only form writes from the master ordinal only, and the
    other replicas' files (their optimizer shards, their data-loader positions) would never be written.

    ``torch.save`` in Dataset code (a class derived from a ``Dataset``, or one with ``__getitem__``) stays:
    it writes host data from DataLoader workers, where ``xm.save`` would write from the master ordinal only
    (the other replicas lose their cache) and start the XLA runtime in the worker.

    A checkpoint that holds whole ``nn.Module`` or optimizer objects (``torch.save({"model": model,
    "optimizer": optimizer}, path)``, ``torch.save(model, path)``, also through a dict bound in the same
    function) keeps ``torch.save``, with a finding.

Why:
    ``torch.save`` of XLA tensors pickles device tensors: the checkpoint then needs an XLA device to load and
    the save forces a device-to-host transfer per tensor. ``xm.save`` moves the data to the CPU first
    and, by default, writes only from the master process (the seeds' recipe). It moves the tensors of plain
    containers and of optimizers, not those inside a module object: a checkpoint of whole objects written
    with it mixes devices, and the first step after resuming from it fails ("Expected XLA tensor. Got:
    torch.FloatTensor", torch_xla 2.9 and 2.6.1). ``torch.save`` of the same objects loads back as it was.

Example:
    torch.save(model.state_dict(), "model.pt")

Use instead:
    xm.save(model.state_dict(), "model.pt")
"""

from __future__ import annotations

import re

import libcst as cst

from xla_migrate.analysis.values import bound_values
from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule

TORCH_SAVE = ("torch.save", "torch.serialization.save")
# xm.save(data, file_or_path, master_only=True, global_master=False)
_ACCEPTED = 2
_RANK_TEST = re.compile(r"rank|ordinal|master|is_main|main_process", re.IGNORECASE)
# A name in a checkpoint's path that makes the file each replica's own.
_REPLICA_NAME = re.compile(r"rank|ordinal", re.IGNORECASE)
# Names that hold a module or an optimizer object (a checkpoint of whole objects): the last word of the name
# (``model``, ``ema_model``, ``decoder_optimizer``; not ``model_args`` or ``model_data``), or ``netG``.
_OBJECT_WORDS = {"model", "models", "net", "network", "module", "encoder", "decoder", "generator", "discriminator",
                 "backbone", "optimizer", "optimizers", "optim", "opt", "critic", "actor", "policy"}
_NET_NAME = re.compile(r"^(net|model)[A-Z0-9]")


def _object_name(name: str) -> bool:
    return name.lower().rsplit("_", 1)[-1] in _OBJECT_WORDS or bool(_NET_NAME.match(name))


class TorchSaveToXmSave(Rule):
    code = "XLA501"
    name = "torch-save-to-xm-save"
    summary = "torch.save(...) -> xm.save(...) (moves XLA tensors to the CPU, writes from the master)"
    fix_safety = "review"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._reported_guards: set[cst.If] = set()  # one finding per rank test, however many saves it holds
        self._save_helpers: dict[str, str] | None = None

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        if not ctx.is_call_to(node, *TORCH_SAVE):
            self._helper_under_rank_test(node)
            return
        save = ctx.spell("save")
        # Dataset code runs in DataLoader workers, on host data: xm.save would write from the master ordinal
        # only (the other replicas lose their cache) and start the XLA runtime in the worker.
        if self._dataset_method(node) is not None:
            return
        if (len(patterns.positional(node)) > _ACCEPTED or any(a.star for a in node.args)
                or any(a.keyword is not None and a.keyword.value not in ("obj", "f") for a in node.args)):
            self.finding(node, "torch.save with options xm.save does not take",
                         f"drop the options and use {save}, or move the tensors to the CPU (.cpu()) before saving")
            return
        whole = self._whole_objects(node)
        if whole:
            self.finding(node, f"the checkpoint holds whole objects ({', '.join(whole)}): torch.save is kept "
                         f"({save} would move the optimizers' tensors to the CPU and leave the modules' on the "
                         "XLA device, and the resumed run would mix devices); it loads back on the XLA device, "
                         "not with plain CPU torch", "save state dicts (model.state_dict(), "
                         "optimizer.state_dict()) to make the checkpoint portable")
            return
        args = [a.with_changes(keyword=cst.Name("file_or_path")) if a.keyword and a.keyword.value == "f"
                else a.with_changes(keyword=cst.Name("data")) if a.keyword and a.keyword.value == "obj" else a
                for a in node.args]
        renamed = any(a.keyword is not None for a in node.args)
        func = patterns.parsed_expression(save)
        # A file each replica writes for itself: the master-only xm.save would leave the others' unwritten.
        every_replica = ("{xm}" in self.ctx.target.spelling("save").template and self._rank_guard(node) is None
                         and self._per_replica_path(node))

        def to_xm_save(updated: cst.Call) -> cst.Call:
            new_args = list(updated.args)
            if renamed:
                new_args = [a.with_changes(keyword=b.keyword) for a, b in zip(updated.args, args)]
            if every_replica:
                new_args[-1] = new_args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                new_args.append(cst.Arg(cst.Name("False"), keyword=cst.Name("master_only"),
                                        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                              whitespace_after=cst.SimpleWhitespace(""))))
            return updated.with_changes(func=func, args=new_args)

        if every_replica:
            self.replace(node, to_xm_save, f"{patterns.code_of(node.func)}(...) -> {save}(..., master_only=False) "
                         "(the file name holds the rank: every replica writes its own)")
            for module, name in (("torch", "save"), ("torch.serialization", "save")):
                self.import_may_be_dead(module, name)
            return
        self.replace(node, to_xm_save, f"{patterns.code_of(node.func)}(...) -> {save}(...)")
        for module, name in (("torch", "save"), ("torch.serialization", "save")):
            self.import_may_be_dead(module, name)
        self._report_rank_test(node, save, save)

    def _report_rank_test(self, node: cst.CSTNode, what: str, save: str, fix: str = "") -> None:
        guard = self._rank_guard(node)
        if guard is None or guard in self._reported_guards:
            return
        self._reported_guards.add(guard)
        hang = ("and torch_xla 1.x's xm.save waits for every process there (a hang)"
                if self.ctx.target.name == "sagemaker" else
                "so the rank test is redundant (torch_xla 1.x's xm.save, which waits for every process, "
                "would hang under it)")
        self.finding(guard, f"{what} is called under a rank test: {save} writes from the master only already, "
                     f"{hang}", fix or f"call {save} on every process and drop the rank test")

    def _helper_under_rank_test(self, node: cst.Call) -> None:
        """``if rank == 0: utils.save_checkpoint(...)`` where the helper (this module's or a project module's)
        saves with torch.save, which this rule makes xm.save: the same rank test, one call away."""
        name = patterns.dotted_name(node.func)
        if name is None or self._rank_guard(node) is None:
            return
        where = self._local_save_helpers().get(name)
        if where is None and self.ctx.project is not None:
            where = self.ctx.project.save_helper(name)
        if where is None:
            return
        save = self.ctx.spell("save")
        self._report_rank_test(node, f"{name}(...), which saves with {save} ({where}),", save,
                               f"call {name} on every process and drop the rank test (or save "
                               "{k: v.cpu() ...} state with torch.save in the helper)")

    def _local_save_helpers(self) -> dict[str, str]:
        """This module's functions and methods that call torch.save (by the name a call in it uses)."""
        if self._save_helpers is None:
            self._save_helpers = {}
            for function in patterns.find_all(self.ctx.module, lambda n: isinstance(n, cst.FunctionDef)):
                saves = patterns.find_all(function.body, lambda n: isinstance(n, cst.Call)
                                          and self.ctx.is_call_to(n, *TORCH_SAVE))
                if saves:
                    line = self.ctx.position(saves[0])[0]
                    key = function.name.value
                    if isinstance(self.ctx.parent(self.ctx.parent(function)), cst.ClassDef):
                        key = f"self.{key}"
                    self._save_helpers.setdefault(key, f"line {line}")
        return self._save_helpers

    def _per_replica_path(self, node: cst.Call) -> bool:
        """Whether the file ``node`` saves to names the replica: a name in its path (or in the value a path
        variable of the same function was bound to) says rank or ordinal (``rank``, ``args.local_rank``,
        ``dist.get_rank()``, ``xm.get_ordinal()``); the text of string literals does not count."""
        second = patterns.positional(node)[1:2]
        path = second[0].value if second else getattr(patterns.keyword(node, "f"), "value", None)
        if path is None:
            return False
        paths = [path]
        if isinstance(path, cst.Name):
            paths += [v for v in bound_values(self.ctx, path) if v is not None]
        for expression in paths:
            for name in patterns.find_all(expression, lambda n: isinstance(n, cst.Name)):
                if _REPLICA_NAME.search(name.value):
                    return True
        return False

    def _dataset_method(self, node: cst.CSTNode) -> str | None:
        """The ``Class.method`` of a Dataset that holds ``node`` (a class derived from a Dataset, or one with
        ``__getitem__``), or None."""
        current = self.ctx.parent(node)
        method = None
        while current is not None and not isinstance(current, cst.Module):
            if isinstance(current, cst.FunctionDef) and method is None:
                method = current.name.value
            if isinstance(current, cst.ClassDef):
                bases = [patterns.dotted_name(b.value) or "" for b in current.bases]
                methods = {s.name.value for s in current.body.body if isinstance(s, cst.FunctionDef)}
                if any(b.rsplit(".", 1)[-1].endswith("Dataset") for b in bases) or "__getitem__" in methods:
                    return f"{current.name.value}.{method}" if method else current.name.value
                return None
            current = self.ctx.parent(current)
        return None

    def _whole_objects(self, node: cst.Call) -> list[str]:
        """The module or optimizer objects a checkpoint holds as they are (not their state dicts)."""
        first = patterns.positional(node)
        obj = first[0].value if first else getattr(patterns.keyword(node, "obj"), "value", None)
        values = [obj] if obj is not None else []
        if isinstance(obj, cst.Name) and not _object_name(obj.value):
            values = [v for v in bound_values(self.ctx, obj) if v is not None]
        found: list[str] = []
        for value in values:
            elements = [e.value for e in value.elements if isinstance(e, cst.DictElement)] if isinstance(
                value, cst.Dict) else [value]
            for element in elements:
                spelling = patterns.dotted_name(element)
                if spelling is not None and _object_name(spelling.rsplit(".", 1)[-1]):
                    found.append(spelling)
        return found

    def _rank_guard(self, node: cst.CSTNode) -> cst.If | None:
        current = self.ctx.parent(node)
        while current is not None and not isinstance(current, (cst.FunctionDef, cst.Module)):
            if isinstance(current, cst.If) and _RANK_TEST.search(patterns.code_of(current.test)):
                return current
            current = self.ctx.parent(current)
        return None
