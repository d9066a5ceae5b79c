"""XLA604 hf-dataloader-workers: TrainingArguments that leave dataloader_num_workers at 0 are reported.

What it does:
    Reports ``TrainingArguments(...)`` (and ``Seq2SeqTrainingArguments``, ``SFTConfig``, the script's own
    subclasses) without ``dataloader_num_workers`` or with it at ``0``, and arguments parsed from the command
    line by ``HfArgumentParser`` that the script never gives a ``dataloader_num_workers`` (the default is 0
    unless ``--dataloader_num_workers`` is passed). Nothing is rewritten: the right number depends on the
    machine.

Why:
    The seeds: the data pipeline must be faster than the training step, so ``dataloader_num_workers`` (and
    ``preprocessing_num_workers``) should be at least the number of devices and below the number of CPUs.
    With 0 workers the batches are prepared in the training process, between steps, and the compiled XLA
    step waits for them.

Example:
    args = TrainingArguments(output_dir="out")

Use instead:
    args = TrainingArguments(output_dir="out", dataloader_num_workers=4)  # >= devices, < CPUs
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.hf import hf_common
from xla_migrate.transforms.common import short

FIX = "pass dataloader_num_workers=<at least the number of devices, fewer than the CPUs>"


class HfDataloaderWorkers(Rule):
    code = "XLA604"
    reports_on_xla_code = True  # a rerun on its own output keeps the findings (issue 33)
    name = "hf-dataloader-workers"
    summary = "TrainingArguments with dataloader_num_workers left at 0 are reported (use at least the device count)"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._local = hf_common.local_training_args_classes(ctx.module, ctx)
        self._parsers: dict[str, int] = {}
        self._reported: set[str] = set()
        self._assigned: bool | None = None  # see _assigns_workers: walked only when a parse call needs it

    def visit_Assign(self, node: cst.Assign) -> None:
        self._parsers.update(hf_common.parsers_of_training_args(self.ctx, node, self._local))

    def visit_Call(self, node: cst.Call) -> None:
        if hf_common.is_training_args_class(self.ctx, node.func, self._local):
            workers = patterns.keyword(node, "dataloader_num_workers")
            if workers is None and not hf_common.has_star_kwargs(node):
                self.finding(node, f"{short(node.func)}(...) leaves dataloader_num_workers at 0", FIX)
            elif workers is not None and isinstance(workers.value, cst.Integer) and workers.value.evaluated_value == 0:
                self.finding(workers, "dataloader_num_workers=0: batches are prepared between steps", FIX)
            return
        method = patterns.method_call(node, *hf_common.PARSE_METHODS)
        if method is None:
            return
        parser = patterns.dotted_name(method.value)
        if parser in self._parsers and parser not in self._reported and not self._assigns_workers():
            self._reported.add(parser)
            self.finding(node, "parsed TrainingArguments keep dataloader_num_workers at 0 unless the command line "
                               "passes --dataloader_num_workers",
                         "pass --dataloader_num_workers N (at least the number of devices, fewer than the CPUs)")

    def _assigns_workers(self) -> bool:
        """The script sets ``<args>.dataloader_num_workers = ...`` somewhere (a whole-module walk, made once,
        for the first parse of TrainingArguments)."""
        if self._assigned is None:
            finder = _WorkersAssignment()
            if self.ctx.facts.is_hf_script:  # only Hugging Face scripts can have TrainingArguments to check
                self.ctx.module.visit(finder)
            self._assigned = finder.found
        return self._assigned


class _WorkersAssignment(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.found = False

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            if isinstance(target.target, cst.Attribute) and target.target.attr.value == "dataloader_num_workers":
                self.found = True
