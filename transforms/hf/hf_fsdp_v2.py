"""XLA606 hf-fsdp-v2: a Trainer's FSDP options become the Trainer's own XLA FSDPv2 settings in the spmd form.

What it does:
    With ``--data-parallel spmd`` (``2.9`` target), ``TrainingArguments(..., fsdp=..., fsdp_config={...})`` (and
    ``Seq2SeqTrainingArguments``, trl's ``SFTConfig``, the script's subclasses) gets ``"xla": True`` and
    ``"xla_fsdp_v2": True`` in its ``fsdp_config`` dict (added when missing; the other keys kept:
    ``transformer_layer_cls_to_wrap`` still picks the blocks FSDPv2 wraps), and the ``__main__`` block starts
    with ``xr.use_spmd()``: the Trainer then wraps the model with ``SpmdFullyShardedDataParallel`` on a
    ``("fsdp", "tensor")`` mesh of every device and shards each batch on ``"fsdp"`` itself. An ``fsdp_config``
    that is not a dict literal (a JSON file's path, a variable) or a script with no ``__main__`` block is
    reported, not rewritten; so are ``activation_checkpointing`` (FSDPv2's is ``"xla_fsdp_grad_ckpt": True``)
    and ``fp16=True`` (XLA601 reports it). ``average_tokens_across_devices=False`` is added when the call does not
    set it: by default (transformers 4.57.1) the Trainer gathers each step's token count over the processes
    with accelerate, whose gather marks a step: two graph executions per step instead of one (measured on
    4 CPU devices), for a count that under SPMD (one process, the global batch) is already global. A
    ``transformer_layer_cls_to_wrap`` naming ``GPT2Block`` is reported: the Trainer's FSDPv2 cannot shard
    GPT-2's output (ValueError at the first forward, transformers 4.57.1).

    In the other forms a Trainer with ``fsdp=`` is reported: its torch FSDP does not run on XLA devices; set
    ``"xla": True`` in ``fsdp_config`` (torch_xla's XlaFullyShardedDataParallel) or migrate with
    ``--data-parallel spmd``.

Why:
    Hugging Face's Trainer builds FSDP from these arguments; on an XLA device it uses torch_xla's FSDP only when
    ``fsdp_config["xla"]`` is set, and FSDPv2 (SPMD: one program, the compiler inserts the collectives) only
    with ``"xla_fsdp_v2"`` too, which needs SPMD turned on before the model reaches the device.

Example:
    args = TrainingArguments(output_dir="out", fsdp="full_shard", fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]})

    if __name__ == "__main__":
        main()

Use instead:
    args = TrainingArguments(output_dir="out", fsdp="full_shard", average_tokens_across_devices=False, fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"], "xla": True, "xla_fsdp_v2": True})

    if __name__ == "__main__":
        xr.use_spmd()
        main()
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.engine.rule import Rule
from xla_migrate.syntax import patterns
from xla_migrate.transforms.common import short
from xla_migrate.transforms.hf import hf_common

_XLA_KEYS = ("xla", "xla_fsdp_v2")
_AVERAGE_TOKENS = "average_tokens_across_devices"


class HfFsdpV2(Rule):
    code = "XLA606"
    name = "hf-fsdp-v2"
    summary = 'spmd form: TrainingArguments(fsdp=...) -> fsdp_config {"xla": True, "xla_fsdp_v2": True}, xr.use_spmd()'
    fix_safety = "review"
    targets = ("2.9",)
    # tests/goldens.py: this rule's cases are also migrated in the spmd form.
    golden_forms = ("spmd",)

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._local = hf_common.local_training_args_classes(ctx.module, ctx)
        self._converted = False
        self._has_setup = False

    def visit_Call(self, node: cst.Call) -> None:
        if "torch_xla.runtime.use_spmd" in self.ctx.qualnames(node.func):
            self._has_setup = True
        elif hf_common.is_training_args_class(self.ctx, node.func, self._local):
            fsdp = patterns.keyword(node, "fsdp")
            if fsdp is None or patterns.string_value(fsdp.value) == "":
                return
            if self.ctx.data_parallel == "spmd":
                self._to_fsdpv2(node)
            else:
                self.finding(fsdp, f"{short(fsdp)}: the Trainer's torch FSDP does not run on XLA devices",
                             'migrate with --data-parallel spmd (the Trainer\'s FSDPv2: fsdp_config {"xla": True, '
                             '"xla_fsdp_v2": True}), or set "xla": True in fsdp_config (XlaFullyShardedDataParallel)')

    def _to_fsdpv2(self, node: cst.Call) -> None:
        config = patterns.keyword(node, "fsdp_config")
        if config is not None and not isinstance(config.value, cst.Dict):
            self.finding(config, f"{short(config)}: not a dict literal, the XLA FSDPv2 keys cannot be added",
                         'set "xla": true and "xla_fsdp_v2": true in the FSDP config, and call xr.use_spmd() '
                         "first thing when the script runs")
            return
        present = {}
        if config is not None:
            for element in config.value.elements:
                key = patterns.string_value(element.key) if isinstance(element, cst.DictElement) else None
                if key is not None:
                    present[key] = element
        blocks = present.get("transformer_layer_cls_to_wrap")
        if blocks is not None and "GPT2Block" in {patterns.string_value(e.value) for e in getattr(
                blocks.value, "elements", ())}:
            self.finding(blocks, "GPT-2: the Trainer's FSDPv2 shards the model's output only when it is a tensor, a "
                         "tuple or CausalLMOutputWithPast, and GPT2LMHeadModel returns CausalLMOutputWithCrossAttentions "
                         "(transformers 4.57.1: ValueError at the first forward)",
                         "pass return_dict=False to the model's config (a tuple) or use a model that returns "
                         "CausalLMOutputWithPast (Llama, Mistral, Qwen2...)")
        if "activation_checkpointing" in present:
            self.finding(present["activation_checkpointing"], "activation_checkpointing is torch FSDP's key",
                         'use "xla_fsdp_grad_ckpt": True (FSDPv2\'s gradient checkpointing)')
        missing = [key for key in _XLA_KEYS if key not in present]
        self._converted = True
        fsdp = patterns.keyword(node, "fsdp")
        assert fsdp is not None
        # The token count's gather: one process under SPMD, whose batch is already the global one.
        gather_off = patterns.keyword(node, _AVERAGE_TOKENS) is None
        if not missing and not gather_off:
            return
        added = [cst.DictElement(cst.SimpleString(f'"{key}"'), cst.Name("True")) for key in missing]
        comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        keys = "fsdp_config gets " + ", ".join(f'"{key}": True' for key in missing) + " (the Trainer's XLA FSDPv2)"
        gather = (f"{_AVERAGE_TOKENS}=False (its gather of the token count is a graph cut, one more execution "
                  "per step, and under SPMD the count is already global; transformers 4.57.1 measured: drop it "
                  "on a release that lacks the argument)")
        if config is not None and missing:
            # The dict, not the call: XLA601 edits the call (optim=), and edits inside it are kept.
            def with_xla(updated: cst.Dict) -> cst.Dict:
                elements = list(updated.elements)
                if elements and not isinstance(elements[-1].comma, cst.Comma):
                    elements[-1] = elements[-1].with_changes(comma=comma)
                return updated.with_changes(elements=[*elements, *[e.with_changes(comma=comma) for e in added[:-1]],
                                                      added[-1]])

            self.replace(config.value, with_xla, f"{short(node.func)}(...): {keys}")
        new_config = added if config is None else []  # the dict keys, as a new fsdp_config argument
        if not new_config and not gather_off:
            return
        said = " and ".join([*([keys] if new_config else []), *([gather] if gather_off else [])])

        def with_arguments(updated: cst.Arg) -> cst.FlattenSentinel:
            # fsdp=... followed by fsdp_config={...} and average_tokens_across_devices=False: the last new
            # argument takes the fsdp argument's comma.
            new = []
            if new_config:
                new.append(cst.Arg(value=cst.Dict([*[e.with_changes(comma=comma) for e in new_config[:-1]],
                                                   new_config[-1]]),
                                   keyword=cst.Name("fsdp_config"), equal=fsdp.equal))
            if gather_off:
                new.append(cst.Arg(value=cst.Name("False"), keyword=cst.Name(_AVERAGE_TOKENS), equal=fsdp.equal))
            new = [arg.with_changes(comma=comma) for arg in new[:-1]] + [
                new[-1].with_changes(comma=updated.comma, whitespace_after_arg=updated.whitespace_after_arg)]
            separator = updated.comma if isinstance(updated.comma, cst.Comma) else comma
            return cst.FlattenSentinel([updated.with_changes(comma=separator,
                                                             whitespace_after_arg=cst.SimpleWhitespace("")), *new])

        self.replace(fsdp, with_arguments, f"{short(node.func)}(...): {said}")

    def leave_Module(self, original_node: cst.Module) -> None:
        if not self._converted or self._has_setup:
            return
        guard = self.ctx.facts.main_guard
        body = guard.body if guard is not None else None
        if not isinstance(body, cst.IndentedBlock):
            module = self.ctx.module
            where = guard if guard is not None else (module.body[0] if module.body else module)
            self.finding(where, "no __main__ block to turn SPMD on in (the Trainer's FSDPv2 needs it)",
                         "call xr.use_spmd() (torch_xla.runtime) first thing when the script runs")
            return
        first = body.body[0]
        self.insert_before(first, [self.ctx.statement(self.ctx.spell("use_spmd"))],
                           f"{self.ctx.spell('use_spmd')} first in the entry: the Trainer's FSDPv2 runs one SPMD "
                           "program over every device")
