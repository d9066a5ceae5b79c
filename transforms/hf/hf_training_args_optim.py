"""XLA601 hf-xla-optimizer: Hugging Face TrainingArguments get optim="adamw_torch_xla" (the syncfree AdamW).

What it does:
    ``TrainingArguments(...)``, ``Seq2SeqTrainingArguments(...)``, trl's ``SFTConfig(...)`` and the script's own
    subclasses of them get ``optim="adamw_torch_xla"``: added when missing, replacing an AdamW name
    (``adamw_torch``, ``adamw_hf``, ``adamw_torch_fused``). Another optimizer the script chose (``adafactor``,
    ``sgd``, ``adagrad``, ``rmsprop``...) runs on XLA and is kept: replacing it would change the algorithm and
    the optimizer state. One that needs CUDA kernels (``adamw_bnb_8bit``, ``paged_*``, ``adamw_apex_fused``...)
    is replaced and reported (the optimizer changed).
    When the arguments come from the command line or a file through ``HfArgumentParser``
    (``parse_args_into_dataclasses()``, ``parse_json_file(...)``...), the value is set on the parsed object once,
    right after the statement that parses it (after the whole ``if``/``else`` when each branch parses).
    ``fp16=True`` is reported (XLA trains in bfloat16: ``bf16=True``); an ``optim`` that is not a string
    literal, ``TrainingArguments(**kwargs)`` and a Trainer (``Trainer``, ``Seq2SeqTrainer``, trl's
    ``SFTTrainer``...) built without arguments (its defaults use ``adamw_torch``) are reported, not rewritten.

Why:
    The seeds' Trainer checklist: use the syncfree optimizer by setting ``optim`` to ``adamw_torch_xla``; the
    default AdamW reads a value back to the host at every step (a device sync), the syncfree one does not.
    The Trainer itself needs no device changes: it detects XLA and uses the device loader and
    ``xm.optimizer_step``.

Example:
    training_args = TrainingArguments(output_dir="out", optim="adamw_torch", fp16=True)

    model_args, data_args, training_args = parser.parse_args_into_dataclasses()

Use instead:
    training_args = TrainingArguments(output_dir="out", optim="adamw_torch_xla", bf16=True)

    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    training_args.optim = "adamw_torch_xla"
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.hf import hf_common
from xla_migrate.transforms.common import short, with_keyword


class HfXlaOptimizer(Rule):
    code = "XLA601"
    reports_on_xla_code = True  # a rerun on its own output keeps the findings (issue 33)
    name = "hf-xla-optimizer"
    summary = 'TrainingArguments / Seq2SeqTrainingArguments / SFTConfig -> optim="adamw_torch_xla" (also after parsing)'
    fix_safety = "review"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._local = hf_common.local_training_args_classes(ctx.module, ctx)
        # Parser spelling -> index of the TrainingArguments class among the dataclasses it parses.
        self._parsers: dict[str, int] = {}
        self._anchored: set[cst.CSTNode] = set()

    # Inline arguments ------------------------------------------------------------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        if hf_common.is_training_args_class(self.ctx, node.func, self._local):
            self._arguments(node)
        elif hf_common.is_trainer(self.ctx, node.func):
            if patterns.keyword(node, "args") is None and len(patterns.positional(node)) < 2 and not any(
                    a.star for a in node.args):
                self.finding(node, f"{short(node.func)}(...) without args= trains with the default "
                                   'optim="adamw_torch"',
                             f"pass args=TrainingArguments(..., optim={self.ctx.spell('hf_xla_optim')})")
        elif patterns.method_call(node, *hf_common.PARSE_METHODS):
            self._parsed(node)

    def _arguments(self, node: cst.Call) -> None:
        optim = self.ctx.spell("hf_xla_optim")
        value = patterns.parsed_expression(optim)
        fp16 = patterns.keyword(node, "fp16")
        if fp16 is not None and patterns.dotted_name(fp16.value) == "True":
            self.finding(fp16, "fp16=True: XLA trains in bfloat16, float16 needs loss scaling",
                         "use bf16=True instead of fp16=True")
        arg, current = hf_common.string_arg(node, "optim")
        if arg is None:
            if hf_common.has_star_kwargs(node):
                self.finding(node, f"{short(node)}: optim may come from **kwargs",
                             f'set "optim": {optim} in the keyword arguments')
                return
            self.replace(node, lambda updated: with_keyword(updated, "optim", value),
                         f"{short(node.func)}(...): added optim={optim}")
        elif current is None:
            self.finding(arg, f"optim={short(arg.value)} is not known to be {optim}", f"pass optim={optim}")
        else:
            self._chosen(arg.value, current, f"optim={short(arg.value)}", f"optim={short(arg.value)} -> optim={optim}",
                         value)

    def _chosen(self, node: cst.CSTNode, current: str, shown: str, note: str, value: cst.BaseExpression) -> None:
        """The user's optimizer name: AdamW becomes the XLA AdamW, another algorithm is kept (issue 36)."""
        optim = self.ctx.spell("hf_xla_optim")
        choice = hf_common.optimizer_choice(current)
        if choice == "replace":
            self.replace(node, value, note)
        elif choice == "cuda":
            self.replace(node, value, note)
            self.finding(node, f"{shown} needs CUDA kernels: replaced by {optim}, another optimizer (its update "
                               "rule, learning rate and state size differ)",
                         "check the learning rate and the memory; pick an XLA optimizer (adafactor, sgd, "
                         f"adamw_torch_xla) yourself if {optim} does not fit")

    # Parsed arguments --------------------------------------------------------------------------------------
    def visit_Assign(self, node: cst.Assign) -> None:
        self._parsers.update(hf_common.parsers_of_training_args(self.ctx, node, self._local))

    def _parsed(self, node: cst.Call) -> None:
        method = node.func
        assert isinstance(method, cst.Attribute)
        parser = patterns.dotted_name(method.value)
        if parser not in self._parsers:
            return
        index = self._parsers[parser]
        target = self._parsed_name(node, index)
        statement = self.ctx.enclosing_statement(node)
        if target is None or statement is None:
            self.finding(node, f"{short(node)}: the parsed TrainingArguments are not bound to a name here",
                         f"set training_args.optim = {self.ctx.spell('hf_xla_optim')} after parsing")
            return
        anchor = self._anchor(statement)
        if anchor in self._anchored:
            return
        self._anchored.add(anchor)
        optim = self.ctx.spell("hf_xla_optim")
        existing = self._existing_assignment(anchor, target)
        if existing is not None:
            value = existing.value
            current = patterns.string_value(value)
            if current is None:
                self.replace(value, patterns.parsed_expression(optim), f"{target}.optim = {short(value)} -> {optim}")
            else:
                self._chosen(value, current, f"{target}.optim = {short(value)}",
                             f"{target}.optim = {short(value)} -> {optim}", patterns.parsed_expression(optim))
            return
        self.insert_after(anchor, [self.ctx.statement(f"{target}.optim = {optim}")],
                          f"{target}.optim = {optim} after parsing the arguments")

    def _parsed_name(self, node: cst.Call, index: int) -> str | None:
        parent = self.ctx.parent(node)
        if isinstance(parent, cst.Subscript):
            # `training_args = parser.parse_args_into_dataclasses()[0]`
            elements = parent.slice
            if len(elements) == 1 and isinstance(elements[0].slice, cst.Index):
                number = elements[0].slice.value
                if isinstance(number, cst.Integer) and number.evaluated_value == index:
                    assign = self.ctx.parent(parent)
                    if isinstance(assign, cst.Assign) and assign.value is parent and len(assign.targets) == 1:
                        return patterns.dotted_name(assign.targets[0].target)
            return None
        if not isinstance(parent, cst.Assign) or parent.value is not node:
            return None
        for target in parent.targets:
            if isinstance(target.target, (cst.Tuple, cst.List)):
                elements = target.target.elements
                if index < len(elements) and not isinstance(elements[index], cst.StarredElement):
                    return patterns.dotted_name(elements[index].value)
        return None

    def _anchor(self, statement: cst.CSTNode) -> cst.CSTNode:
        """The statement after which the parsed value is final: climbs out of ``if``/``elif``/``else``."""
        current = statement
        while True:
            parent = self.ctx.parent(current)
            if isinstance(parent, cst.IndentedBlock):
                parent = self.ctx.parent(parent)
            if isinstance(parent, cst.Else):
                parent = self.ctx.parent(parent)
            if isinstance(parent, cst.If):
                current = parent
                continue
            return current

    def _existing_assignment(self, anchor: cst.CSTNode, target: str) -> cst.Assign | None:
        """``<target>.optim = ...`` right after the anchor (this rule's own line on a second run)."""
        block = self.ctx.parent(anchor)
        body = getattr(block, "body", None)
        if not isinstance(body, (list, tuple)) or anchor not in body:
            return None
        position = list(body).index(anchor)
        for statement in body[position + 1:position + 2]:
            if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
                small = statement.body[0]
                if (isinstance(small, cst.Assign) and len(small.targets) == 1
                        and patterns.dotted_name(small.targets[0].target) == f"{target}.optim"):
                    return small
        return None
