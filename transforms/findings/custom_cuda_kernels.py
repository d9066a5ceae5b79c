"""XLA901 custom-cuda-kernels: custom CUDA kernels (cpp_extension, cupy, triton, numba.cuda, pycuda) and CUDA
kernel libraries (flash_attn, xformers, rotary_emb, liger_kernel, DeepSpeed, ...) are reported.

What it does:
    Reports every import of a custom-kernel toolkit (``torch.utils.cpp_extension``, ``cupy``, ``triton``,
    ``numba.cuda``, ``pycuda``) and every extension build call (``load``, ``load_inline``,
    ``CUDAExtension``), with the line and what to do. Imports of a library of CUDA kernels (``flash_attn``,
    ``xformers``, ``rotary_emb``, flash-attn's ``fused_dense_lib`` / ``dropout_layer_norm``,
    ``liger_kernel``, ``transformer_engine``, ``mamba_ssm``, ``causal_conv1d``, and DeepSpeed, whose engine
    and ZeRO run on CUDA devices only) are reported with the plain-PyTorch form to use, and so is every call
    into one that no CUDA test guards (a call on the ``device.type == "cuda"`` branch goes with that branch).
    So is ``TrainingArguments(deepspeed=...)``, the Trainer's DeepSpeed integration. An import inside
    ``try`` / ``except ImportError`` is the program's own fallback and is not reported. Nothing is rewritten.

Why:
    XLA compiles the PyTorch operations of a step into one program for the accelerator; a hand-written CUDA
    kernel is opaque to it and cannot run on a TPU or inside an XLA graph. The kernel has to be replaced by
    PyTorch operations (which XLA fuses itself) or, on TPU, by a Pallas kernel.

Example:
    import triton
    from flash_attn import flash_attn_func
    from torch.utils.cpp_extension import load
    fused = load(name="fused_adam", sources=["fused_adam.cu"])

Use instead:
    # the same computation in PyTorch operations, e.g. torch.optim.AdamW;
    # on TPU, a Pallas kernel (torch_xla.experimental.custom_kernel)
    # flash_attn_func(q, k, v, causal=True) ->
    F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule

TOOLKITS = {
    "torch.utils.cpp_extension": "a C++/CUDA extension",
    "cupy": "CuPy",
    "triton": "a Triton kernel",
    "numba.cuda": "a Numba CUDA kernel",
    "pycuda": "PyCUDA",
}
BUILD_CALLS = ("torch.utils.cpp_extension.load", "torch.utils.cpp_extension.load_inline",
               "torch.utils.cpp_extension.CUDAExtension")
# Libraries of prebuilt CUDA kernels: no TPU build exists (pip cannot install them there), and their ops take
# CUDA tensors only. Name -> (what it is, the plain-PyTorch form to use).
_SDPA = ("torch.nn.functional.scaled_dot_product_attention, which XLA compiles (it takes q, k, v as (batch, heads, "
         "seq, dim): transpose the kernel's (batch, seq, heads, dim))")
LIBRARIES = {
    "flash_attn": ("flash-attn's CUDA kernels",
                   f"use {_SDPA}; on TPU, torch_xla.experimental.custom_kernel.flash_attention is a Pallas flash "
                   "attention; flash-attn's rotary / layer-norm / fused-dense ops become their PyTorch forms"),
    "xformers": ("xformers' CUDA kernels",
                 f"memory_efficient_attention -> {_SDPA}; SwiGLU -> w3(F.silu(w1(x)) * w2(x)) with nn.Linear "
                 "layers; other ops -> their PyTorch forms"),
    "rotary_emb": ("flash-attn's CUDA rotary-embedding kernel",
                   "apply the rotary embedding in PyTorch: with x1, x2 the two halves of x, "
                   "cat(x1 * cos - x2 * sin, x2 * cos + x1 * sin)"),
    "fused_dense_lib": ("flash-attn's fused-dense CUDA kernel", "use nn.Linear (XLA fuses the bias and activation)"),
    "dropout_layer_norm": ("flash-attn's fused dropout+layer-norm CUDA kernel",
                           "use F.dropout then nn.LayerNorm / nn.RMSNorm (XLA fuses them)"),
    "liger_kernel": ("Liger's Triton kernels",
                     "drop the Liger patches (apply_liger_kernel_to_*, Liger* modules): the model's own PyTorch "
                     "modules run on XLA"),
    "transformer_engine": ("NVIDIA Transformer Engine (CUDA, FP8)",
                           "use the torch.nn layers (te.Linear -> nn.Linear, te.LayerNorm -> nn.LayerNorm) under "
                           "bf16 autocast; FP8 recipes have no XLA form"),
    "mamba_ssm": ("Mamba's CUDA selective-scan kernels",
                  "use a PyTorch selective scan (a loop or associative scan over the sequence)"),
    "deepspeed": ("DeepSpeed's engine, ZeRO and launcher need CUDA devices",
                  "train without DeepSpeed on XLA: the Trainer's FSDP (--fsdp full_shard with fsdp_config "
                  "{\"xla\": true}, FSDPv2 under SPMD) shards the parameters as ZeRO-3 does; launch with torchrun "
                  "or python + torch_xla.launch, not the deepspeed launcher; unsharded parameters need no ZeRO "
                  "gathering (zero.GatheredParameters)"),
    "causal_conv1d": ("the causal-conv1d CUDA kernel",
                      "use nn.Conv1d(groups=channels, padding=k - 1) and keep the first seq_len outputs"),
}
# Libraries that do install on a TPU host but find no accelerator there.
_NO_XLA_ACCELERATOR = {"deepspeed": "DeepSpeed has no XLA accelerator"}
FIX = ("rewrite it with PyTorch operations, which XLA compiles and fuses; on TPU a Pallas kernel "
       "(torch_xla.experimental.custom_kernel) can replace it")


def _toolkit(module: str) -> str | None:
    for name in (*TOOLKITS, *LIBRARIES):
        if module == name or module.startswith(name + "."):
            return name
    return None


def _library(name: str) -> str | None:
    return next((library for library in LIBRARIES if name == library or name.startswith(library + ".")), None)


_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def _in_import_try(node: cst.CSTNode, parent) -> bool:
    """``node`` is in the body of a ``try`` with a bare ``except`` or one catching ImportError."""
    child, current = node, parent(node)
    while current is not None:
        if isinstance(current, cst.Try) and child is current.body:
            for handler in current.handlers:
                caught = handler.type
                kinds = caught.elements if isinstance(caught, cst.Tuple) else [caught] if caught else []
                names = {patterns.dotted_name(k.value if isinstance(k, cst.Element) else k) for k in kinds}
                if caught is None or names & _IMPORT_ERRORS:
                    return True
        child, current = current, parent(current)
    return False


class CustomCudaKernels(Rule):
    code = "XLA901"
    name = "custom-cuda-kernels"
    summary = ("custom CUDA kernels (cpp_extension, cupy, triton, numba.cuda, pycuda) and CUDA kernel libraries "
               "(flash_attn, xformers, rotary_emb, ...) are reported with the PyTorch form, never rewritten")
    on_xla_code = True  # it only reports, on code already on XLA too (its CUDA paths included)
    reports_only = True

    def _report(self, node: cst.CSTNode, toolkit: str, what: str) -> None:
        if toolkit in LIBRARIES:
            kind, fix = LIBRARIES[toolkit]
            failure = ("a CUDA kernel, which XLA tensors cannot run" if isinstance(node, cst.Call)
                       else "no build for a TPU host, so an ImportError there")
            failure = _NO_XLA_ACCELERATOR.get(toolkit, failure)
            self.finding(node, f"{what}: CUDA-only ({kind}): {failure}", fix)
        else:
            self.finding(node, f"{what}: {TOOLKITS[toolkit]} cannot run on XLA", FIX)

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            module = patterns.dotted_name(alias.name) or ""
            toolkit = _toolkit(module)
            if toolkit is not None and not self._guarded_library(node, toolkit):
                self._report(node, toolkit, f"import {module}")

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.module is None or node.relative:
            return
        module = patterns.dotted_name(node.module) or ""
        names = [] if isinstance(node.names, cst.ImportStar) else [a.evaluated_name for a in node.names]
        toolkit = _toolkit(module) or next((t for n in names if (t := _toolkit(f"{module}.{n}"))), None)
        if toolkit is not None and not self._guarded_library(node, toolkit):
            self._report(node, toolkit, f"from {module} import {', '.join(names) or '*'}")

    def visit_Call(self, node: cst.Call) -> None:
        qualnames = self.ctx.qualnames(node.func)
        names = qualnames & set(BUILD_CALLS)
        if names:
            self._report(node, "torch.utils.cpp_extension", f"{min(names).rsplit('.', 1)[-1]}(...)")
            return
        if (patterns.dotted_name(node.func) or "").endswith("TrainingArguments"):
            option = patterns.keyword(node, "deepspeed")
            if option is not None and patterns.code_of(option.value).strip() != "None":
                self._report(option, "deepspeed", f"deepspeed={patterns.code_of(option.value).strip()}")
        called = sorted(n for n in qualnames if _library(n) is not None)
        if called and not self.ctx.cuda_paths.under_cuda_gate(node):
            self._report(node, _library(called[0]), f"{called[0]}(...)")

    def _guarded_library(self, node: cst.CSTNode, toolkit: str) -> bool:
        """A kernel library imported under a CUDA test, or in a ``try`` that catches its ImportError: the
        program already has a path without it."""
        if toolkit not in LIBRARIES:
            return False
        return self.ctx.cuda_paths.under_cuda_gate(node) or _in_import_try(node, self.ctx.parent)
