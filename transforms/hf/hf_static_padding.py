"""XLA603 hf-static-padding: tokenizers and data collators pad to a fixed length, not to the longest in the batch.

What it does:
    Tokenizer calls (``tokenizer(...)``, ``tokenizer.pad(...)``, ``tokenizer.batch_encode_plus(...)``,
    ``self.tokenizer(...)``, processors) and Hugging Face data collators with ``padding=True``,
    ``padding="longest"`` or ``PaddingStrategy.LONGEST`` get ``padding="max_length"``; ``DataCollatorWithPadding``,
    ``DataCollatorForSeq2Seq`` and ``DataCollatorForTokenClassification`` without ``padding`` (their default
    is ``True``) get it added. A ``max_length`` already given is kept; without one the call is reported, since
    ``"max_length"`` then pads to the tokenizer's ``model_max_length`` (often 512, sometimes unbounded) and a
    length must be chosen (also where ``padding="max_length"`` was written so, or by a first run: a rerun on
    the output keeps the finding). ``False``, ``"do_not_pad"`` and non-literal values are left alone. On a
    script already on torch_xla the rewrite is reported, not made (as XLA601, XLA602 and XLA604 do).

Why:
    The seeds: use ``padding='max_length'``, not ``'longest'``: padding to the longest sequence of each batch
    changes the input shape from batch to batch, and every new shape recompiles the XLA graph. Fixed shapes
    compile once. (``pad_to_multiple_of`` bounds the shapes to a few buckets when full-length padding costs
    too much compute.)

Example:
    encoded = tokenizer(texts, padding="longest", truncation=True, max_length=128)
    collator = DataCollatorWithPadding(tokenizer)

Use instead:
    encoded = tokenizer(texts, padding="max_length", truncation=True, max_length=128)
    collator = DataCollatorWithPadding(tokenizer, padding="max_length")  # and choose max_length=...
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.hf import hf_common
from xla_migrate.transforms.common import short, with_keyword

# Collators whose ``padding`` defaults to True (pad to the longest in the batch).
DYNAMIC_COLLATORS = {
    f"transformers.{name}" for name in ("DataCollatorWithPadding", "DataCollatorForSeq2Seq",
                                        "DataCollatorForTokenClassification")
} | {
    f"transformers.data.data_collator.{name}" for name in ("DataCollatorWithPadding", "DataCollatorForSeq2Seq",
                                                           "DataCollatorForTokenClassification")
}


def _is_tokenizer_call(node: cst.Call) -> bool:
    name = patterns.dotted_name(node.func)
    if name is None:
        return False
    return any("tokeniz" in part.lower() or "processor" in part.lower() or part in ("tok", "tokens")
               for part in name.split("."))


def _is_dynamic(value: cst.BaseExpression) -> bool:
    text = patterns.string_value(value)
    if text is not None:
        return text == "longest"
    name = patterns.dotted_name(value)
    return name == "True" or (name is not None and name.endswith("PaddingStrategy.LONGEST"))


class HfStaticPadding(Rule):
    code = "XLA603"
    reports_on_xla_code = True  # a rerun on its own output keeps the findings (issue 33)
    name = "hf-static-padding"
    summary = 'tokenizer and collator padding=True/"longest" -> padding="max_length" (a max_length must be chosen)'
    fix_safety = "review"

    def visit_Call(self, node: cst.Call) -> None:
        collator = bool(self.ctx.qualnames(node.func) & DYNAMIC_COLLATORS)
        if not collator and not _is_tokenizer_call(node):
            return
        padding = patterns.keyword(node, "padding")
        if padding is None:
            if not collator or hf_common.has_star_kwargs(node):
                return
            value = cst.SimpleString('"max_length"')
            self.replace(node, lambda updated: with_keyword(updated, "padding", value),
                         f"{short(node.func)}(...) pads to the longest in the batch by default: "
                         'added padding="max_length"')
        elif _is_dynamic(padding.value):
            quote = padding.value.quote if isinstance(padding.value, cst.SimpleString) else '"'
            value = cst.SimpleString(f"{quote}max_length{quote}")
            self.replace(padding.value, value, f"padding={short(padding.value)} -> padding={value.value}")
            self._enum_import_may_be_dead(padding.value)
        elif patterns.string_value(padding.value) != "max_length":
            return
        # padding="max_length" as written (or as a first run wrote it): the same finding, so a rerun on the
        # output keeps it (issue 33).
        if patterns.keyword(node, "max_length") is None:
            self.finding(node, f"{short(node)}: padding=\"max_length\" without max_length pads to the tokenizer's "
                               "model_max_length", "pass max_length=<the longest sequence the task needs>")

    def _enum_import_may_be_dead(self, value: cst.BaseExpression) -> None:
        """``from transformers.utils import PaddingStrategy`` may be unused once ``PaddingStrategy.LONGEST`` goes."""
        if isinstance(value, cst.Attribute) and isinstance(value.value, cst.Name):
            for qualified in self.ctx.qualnames(value.value):
                module, _, name = qualified.rpartition(".")
                if module and name == value.value.value:
                    self.import_may_be_dead(module, name)
