"""XLA906 hf-cuda-loading: quantized loading (bitsandbytes), ``device_map`` placement and FlashAttention-2 in
``from_pretrained`` are reported: none puts a model on the XLA device.

What it does:
    Reports ``load_in_8bit=`` / ``load_in_4bit=`` (anything but ``False``) and ``BitsAndBytesConfig(...)``
    (bitsandbytes' CUDA kernels), peft's ``prepare_model_for_int8_training`` /
    ``prepare_model_for_kbit_training`` (made for such a model), and ``device_map=`` on a ``from_pretrained``
    call (accelerate's placement), and the attention implementation ``"flash_attention_2"`` /
    ``"flash_attention_3"`` wherever the program chooses it (``attn_implementation=``, a default, a
    variable; a comparison with it only tests the choice) and ``use_flash_attention_2=`` (anything but
    ``False``). Nothing is rewritten.

Why:
    bitsandbytes quantizes with CUDA kernels: on an XLA host the load fails or the weights stay on the CPU.
    ``device_map`` makes accelerate place the weights on CUDA devices (an integer or ``{"": i}`` is a CUDA
    ordinal) or the CPU, never on XLA, and the ``Trainer`` then does not move a model that has an
    ``hf_device_map``: training runs off the XLA device, or stops. transformers checks FlashAttention-2 when
    the model loads: it needs the flash_attn package and a CUDA device, so ``from_pretrained`` raises
    ImportError on an XLA host; ``"sdpa"`` runs on XLA.

Example:
    model = AutoModelForCausalLM.from_pretrained(name, load_in_8bit=True, device_map={"": local_rank},
                                                 attn_implementation="flash_attention_2")
    model = prepare_model_for_int8_training(model)

Use instead:
    model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16, attn_implementation="sdpa")
    # the Trainer (or model.to(device)) moves it to the XLA device; LoRA trains on the bf16 weights
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.engine.rule import Rule
from xla_migrate.syntax import patterns

_QUANTIZED_KEYWORDS = ("load_in_8bit", "load_in_4bit")
_QUANTIZED_CALLS = ("BitsAndBytesConfig", "prepare_model_for_int8_training", "prepare_model_for_kbit_training")
_LOAD_FIX = ("load the weights in bf16 on XLA (torch_dtype=torch.bfloat16, no load_in_8bit/load_in_4bit/"
             "quantization_config) and drop prepare_model_for_int8_training / prepare_model_for_kbit_training")
_FLASH_IMPLEMENTATIONS = ("flash_attention_2", "flash_attention_3")
_FLASH_FIX = ("use attn_implementation=\"sdpa\" (or \"eager\") on XLA: transformers' SDPA attention runs on the XLA "
              "device")
_PLACE_FIX = ("drop device_map: the Trainer (or model.to(device)) moves the model to the XLA device; an integer or "
              "{\"\": rank} in it is a CUDA ordinal, not an XLA one")


class HfCudaLoading(Rule):
    code = "XLA906"
    name = "hf-cuda-loading"
    summary = ("from_pretrained(load_in_8bit/4bit, BitsAndBytesConfig, device_map=..., "
               "attn_implementation=\"flash_attention_2\") reported: not on the XLA device")

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = patterns.string_value(node)
        # `if attn == "flash_attention_2":` only tests the choice; the choice itself is reported.
        if value not in _FLASH_IMPLEMENTATIONS or isinstance(self.ctx.parent(node), (cst.Comparison, cst.ComparisonTarget)):
            return
        self.finding(node, f"\"{value}\": transformers' FlashAttention needs the flash_attn package and a CUDA "
                     "device: from_pretrained raises ImportError on an XLA host", _FLASH_FIX)

    def visit_Call(self, node: cst.Call) -> None:
        callee = patterns.dotted_name(node.func) or ""
        last = callee.rsplit(".", 1)[-1]
        if last in _QUANTIZED_CALLS:
            self.finding(node, f"{last}(...): quantized loading needs CUDA (bitsandbytes kernels); XLA has none",
                         _LOAD_FIX)
            return
        for arg in node.args:
            keyword = arg.keyword.value if arg.keyword is not None else None
            if keyword in _QUANTIZED_KEYWORDS and patterns.code_of(arg.value).strip() != "False":
                self.finding(arg, f"{keyword}={patterns.code_of(arg.value).strip()}: quantized loading needs CUDA "
                             "(bitsandbytes kernels); XLA has none", _LOAD_FIX)
            elif keyword == "use_flash_attention_2" and patterns.code_of(arg.value).strip() != "False":
                self.finding(arg, f"use_flash_attention_2={patterns.code_of(arg.value).strip()}: transformers' "
                             "FlashAttention-2 needs the flash_attn package and a CUDA device: from_pretrained "
                             "raises ImportError on an XLA host", _FLASH_FIX)
            elif (keyword == "device_map" and last == "from_pretrained"
                  and patterns.code_of(arg.value).strip() != "None"):
                self.finding(arg, f"device_map={patterns.code_of(arg.value).strip()}: accelerate places the "
                             "weights on CUDA devices or the CPU, never on XLA, and the Trainer then leaves the "
                             "model where it is", _PLACE_FIX)
