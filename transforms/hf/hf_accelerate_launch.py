"""XLA605 accelerate-runs-as-is: Accelerate scripts keep their device code and run on XLA through accelerate launch.

What it does:
    Reports where a script builds an ``accelerate.Accelerator(...)``: Accelerate already places the model
    and the batches (``accelerator.device``, ``accelerator.prepare``), wraps the prepared loaders in
    torch_xla's device loader (which marks the step) and all-reduces the gradients in the prepared
    optimizer's step on XLA, so the device rules leave those alone in such a script (XLA101 devices,
    XLA204 optimizer steps, XLA301 device loaders, XLA302 step barriers). What Accelerate does not cover is
    still rewritten or reported by the other rules (padding, logging, the ``_mp_fn`` entry point, CUDA-only
    APIs). ``mixed_precision="fp16"`` is reported: XLA trains in bfloat16. Nothing is rewritten.

Why:
    The script runs on XLA as is: ``accelerate config`` (choose TPU/XLA) and ``accelerate launch script.py``.
    Rewriting its device code as well would move tensors twice and step the optimizer through two
    all-reduces.

Example:
    accelerator = Accelerator(mixed_precision="fp16")
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

Use instead:
    accelerator = Accelerator(mixed_precision="bf16")  # then: accelerate launch script.py
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.analysis.facts import ACCELERATORS
from xla_migrate.engine.rule import Rule


class AccelerateRunsAsIs(Rule):
    code = "XLA605"
    name = "accelerate-runs-as-is"
    summary = "Accelerator() scripts are left to Accelerate (device code untouched) and run with accelerate launch"

    def visit_Call(self, node: cst.Call) -> None:
        if not self.ctx.is_call_to(node, *ACCELERATORS):
            return
        self.finding(node, "Accelerate script: Accelerate handles the XLA device, loaders and optimizer steps; "
                           "its device code is left as it is",
                     "run it on XLA as is: accelerate config (TPU/XLA), then accelerate launch <script>")
        precision = patterns.keyword(node, "mixed_precision")
        if precision is not None and patterns.string_value(precision.value) == "fp16":
            self.finding(precision, 'mixed_precision="fp16": XLA trains in bfloat16', 'use mixed_precision="bf16"')
