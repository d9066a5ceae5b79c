"""CUDA in a notebook's IPython lines (XLA003): ``%timeit torch.cuda.synchronize()``, ``!nvidia-smi``,
``%env CUDA_VISIBLE_DEVICES=0`` and the body of a shell cell (``%%bash``). Those lines are masked out of the
program the rules see (notebooks.py), so nothing rewrites them; each is reported with its cell and line."""

from __future__ import annotations

import re

from ..engine.records import Finding

CODE = "XLA003"
_CUDA = re.compile(r"\bcuda\b|\.cuda\(|nvidia-smi|\bnvcc\b|CUDA_VISIBLE_DEVICES|\bnccl\b", re.IGNORECASE)
_SHELL_CELLS = ("%%bash", "%%sh", "%%script", "%%system")


def cuda_in_ipython_lines(path: str, cell: int, source: str, ipython_line: re.Pattern) -> list[tuple[str, Finding]]:
    """(label, finding) for each IPython line of the cell (``ipython_line``: notebooks.IPYTHON_LINE), or line
    of a shell cell, that mentions CUDA."""
    lines = source.split("\n")
    first = source.lstrip().split("\n", 1)[0].split()
    shell_cell = bool(first) and first[0] in _SHELL_CELLS
    found = []
    for number, line in enumerate(lines, 1):
        if not (shell_cell and number > 1) and not ipython_line.match(line):
            continue
        match = _CUDA.search(line)
        if match is None:
            continue
        text = line.strip()
        found.append((f"{path}:cell {cell}:line {number}", Finding(
            number, match.start() + 1, CODE,
            f"CUDA in {'a shell cell' if shell_cell else 'an IPython line'}, which xla-migrate does not rewrite: "
            f"`{text}`", "rewrite it for XLA by hand (xm.wait_device_ops() for torch.cuda.synchronize(); there is "
            "no GPU for nvidia-smi)", cell=cell, end_line=number, end_column=len(line) + 1)))
    return found
