"""XLA906 hf-cuda-loading: quantized loading (bitsandbytes) and ``device_map`` placement in
``from_pretrained`` are reported: neither puts a model on the XLA device.

What it does:
    Reports ``load_in_8bit=`` / ``load_in_4bit=`` (anything but ``False``) and ``BitsAndBytesConfig(...)``
    (bitsandbytes' CUDA kernels), peft's ``prepare_model_for_int8_training`` /
    ``prepare_model_for_kbit_training`` (made for such a model), and ``device_map=`` on a ``from_pretrained``
    call (accelerate's placement). Nothing is rewritten.

Why:
    bitsandbytes quantizes with CUDA kernels: on an XLA host the load fails or the weights stay on the CPU.
    ``device_map`` makes accelerate place the weights on CUDA devices (an integer or ``{"": i}`` is a CUDA
    ordinal) or the CPU, never on XLA, and the ``Trainer`` then does not move a model that has an
    ``hf_device_map``: training runs off the XLA device, or stops.

Example:
    model = AutoModelForCausalLM.from_pretrained(name, load_in_8bit=True, device_map={"": local_rank})
    model = prepare_model_for_int8_training(model)

Use instead:
    model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)
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
_PLACE_FIX = ("drop device_map: the Trainer (or model.to(device)) moves the model to the XLA device; an integer or "
              "{\"\": rank} in it is a CUDA ordinal, not an XLA one")


class HfCudaLoading(Rule):
    code = "XLA906"
    name = "hf-cuda-loading"
    summary = "from_pretrained(load_in_8bit/4bit, BitsAndBytesConfig, device_map=...) reported: not on the XLA device"

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
            elif (keyword == "device_map" and last == "from_pretrained"
                  and patterns.code_of(arg.value).strip() != "None"):
                self.finding(arg, f"device_map={patterns.code_of(arg.value).strip()}: accelerate places the "
                             "weights on CUDA devices or the CPU, never on XLA, and the Trainer then leaves the "
                             "model where it is", _PLACE_FIX)
