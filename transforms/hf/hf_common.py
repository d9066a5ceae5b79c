"""What the Hugging Face rules (XLA6xx) share: the classes they recognise and how a keyword is added to a call
in the call's own layout (one line or one argument per line, trailing comma or not)."""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.engine.context import MigrationContext

# TrainingArguments and the subclasses that take the same arguments.
TRAINING_ARGS = (
    "transformers.TrainingArguments", "transformers.training_args.TrainingArguments",
    "transformers.Seq2SeqTrainingArguments", "transformers.training_args_seq2seq.Seq2SeqTrainingArguments",
    "trl.SFTConfig", "trl.trainer.sft_config.SFTConfig", "trl.trainer.SFTConfig",
)
ARG_PARSERS = ("transformers.HfArgumentParser", "transformers.hf_argparser.HfArgumentParser", "trl.TrlParser",
               "trl.scripts.utils.TrlParser")
# HfArgumentParser methods that return the dataclasses, in the order the parser was given them.
PARSE_METHODS = ("parse_args_into_dataclasses", "parse_json_file", "parse_yaml_file", "parse_dict",
                 "parse_args_and_config")
XLA_OPTIM = "adamw_torch_xla"
# The AdamW spellings whose algorithm the syncfree XLA AdamW keeps (issue 36): only these are replaced.
ADAMW_OPTIMS = ("adamw_hf", "adamw_torch", "adamw_torch_fused")
# Spellings of optimizers that need CUDA kernels (bitsandbytes, apex, NPU, paged memory): replaced, and reported
# because the algorithm or its state changes.
CUDA_ONLY_OPTIM_MARKS = ("bnb", "8bit", "4bit", "paged_", "apex", "npu", "anyprecision")


def optimizer_choice(name: str) -> str:
    """What XLA601 does with ``optim=name``: "keep" (XLA's own), "replace" (an AdamW), "cuda" (needs CUDA;
    replaced with a finding) or "other" (the user's algorithm, kept: replacing it changes the training)."""
    if name == XLA_OPTIM:
        return "keep"
    if name in ADAMW_OPTIMS:
        return "replace"
    if any(mark in name for mark in CUDA_ONLY_OPTIM_MARKS):
        return "cuda"
    return "other"


def local_training_args_classes(module: cst.Module, ctx: MigrationContext) -> set[str]:
    """Classes the script derives (directly or through each other) from TrainingArguments."""
    found: set[str] = set()
    changed = True
    classes = [s for s in module.body if isinstance(s, cst.ClassDef)]
    while changed:
        changed = False
        for cls in classes:
            if cls.name.value in found:
                continue
            for base in cls.bases:
                if ctx.qualnames(base.value) & set(TRAINING_ARGS) or patterns.dotted_name(base.value) in found:
                    found.add(cls.name.value)
                    changed = True
                    break
    return found


def is_trainer(ctx: MigrationContext, node: cst.BaseExpression) -> bool:
    """``Trainer``, ``Seq2SeqTrainer``, trl's ``SFTTrainer``, ``DPOTrainer``..."""
    return any(name.startswith(("transformers.", "trl.")) and name.rsplit(".", 1)[-1].endswith("Trainer")
               for name in ctx.qualnames(node))


def is_training_args_class(ctx: MigrationContext, node: cst.BaseExpression, local: set[str]) -> bool:
    return bool(ctx.qualnames(node) & set(TRAINING_ARGS)) or patterns.dotted_name(node) in local


def parsers_of_training_args(ctx: MigrationContext, node: cst.Assign, local: set[str]) -> dict[str, int]:
    """For ``parser = HfArgumentParser((ModelArguments, TrainingArguments))``: {"parser": 1}, the position of
    the TrainingArguments among the dataclasses its parse methods return."""
    if not ctx.is_call_to(node.value, *ARG_PARSERS):
        return {}
    classes = patterns.positional(node.value)
    first = classes[0].value if classes else None
    elements = [e.value for e in first.elements] if isinstance(first, (cst.Tuple, cst.List)) else [first]
    found: dict[str, int] = {}
    for index, element in enumerate(elements):
        if element is not None and is_training_args_class(ctx, element, local):
            for target in node.targets:
                name = patterns.dotted_name(target.target)
                if name is not None:
                    found[name] = index
    return found


def with_keyword_value(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    """``call`` with the value of its ``name=`` keyword replaced (layout kept)."""
    return call.with_changes(args=[a.with_changes(value=value) if a.keyword is not None and a.keyword.value == name
                                   else a for a in call.args])


def string_arg(call: cst.Call, name: str) -> tuple[cst.Arg | None, str | None]:
    arg = patterns.keyword(call, name)
    return arg, (patterns.string_value(arg.value) if arg is not None else None)


def has_star_kwargs(call: cst.Call) -> bool:
    return any(a.star == "**" for a in call.args)
