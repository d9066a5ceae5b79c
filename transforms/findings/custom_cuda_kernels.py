"""XLA901 custom-cuda-kernels: custom CUDA kernels (cpp_extension, cupy, triton, numba.cuda, pycuda) are reported.

What it does:
    Reports every import of a custom-kernel toolkit (``torch.utils.cpp_extension``, ``cupy``, ``triton``,
    ``numba.cuda``, ``pycuda``) and every extension build call (``load``, ``load_inline``,
    ``CUDAExtension``), with the line and what to do. Nothing is rewritten.

Why:
    XLA compiles the PyTorch operations of a step into one program for the accelerator; a hand-written CUDA
    kernel is opaque to it and cannot run on a TPU or inside an XLA graph. The kernel has to be replaced by
    PyTorch operations (which XLA fuses itself) or, on TPU, by a Pallas kernel.

Example:
    import triton
    from torch.utils.cpp_extension import load
    fused = load(name="fused_adam", sources=["fused_adam.cu"])

Use instead:
    # the same computation in PyTorch operations, e.g. torch.optim.AdamW;
    # on TPU, a Pallas kernel (torch_xla.experimental.custom_kernel)
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
FIX = ("rewrite it with PyTorch operations, which XLA compiles and fuses; on TPU a Pallas kernel "
       "(torch_xla.experimental.custom_kernel) can replace it")


def _toolkit(module: str) -> str | None:
    for name in TOOLKITS:
        if module == name or module.startswith(name + "."):
            return name
    return None


class CustomCudaKernels(Rule):
    code = "XLA901"
    name = "custom-cuda-kernels"
    summary = "custom CUDA kernels (cpp_extension, cupy, triton, numba.cuda, pycuda) are reported, never rewritten"
    on_xla_code = True  # it only reports, on code already on XLA too (its CUDA paths included)
    reports_only = True

    def _report(self, node: cst.CSTNode, toolkit: str, what: str) -> None:
        self.finding(node, f"{what}: {TOOLKITS[toolkit]} cannot run on XLA", FIX)

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            module = patterns.dotted_name(alias.name) or ""
            toolkit = _toolkit(module)
            if toolkit is not None:
                self._report(node, toolkit, f"import {module}")

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.module is None or node.relative:
            return
        module = patterns.dotted_name(node.module) or ""
        names = [] if isinstance(node.names, cst.ImportStar) else [a.evaluated_name for a in node.names]
        toolkit = _toolkit(module) or next((t for n in names if (t := _toolkit(f"{module}.{n}"))), None)
        if toolkit is not None:
            self._report(node, toolkit, f"from {module} import {', '.join(names) or '*'}")

    def visit_Call(self, node: cst.Call) -> None:
        names = self.ctx.qualnames(node.func) & set(BUILD_CALLS)
        if names:
            self._report(node, "torch.utils.cpp_extension", f"{min(names).rsplit('.', 1)[-1]}(...)")
