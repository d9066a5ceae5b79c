"""Shared test helpers: a small CUDA script and a way to run the real console script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CUDA_SCRIPT = '''import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Linear(4, 2).cuda()
x = torch.randn(8, 4, device="cuda")
'''

NO_CUDA_SCRIPT = "import torch\n\nx = torch.zeros(3)\n"
ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str, cwd: Path, stdin: bytes | None = None, env: dict | None = None, timeout: float = 60):
    """Run ``xla-migrate`` as a user would: a real process from the installed console script."""
    executable = Path(sys.executable).with_name("xla-migrate")
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([str(executable), *args], cwd=cwd, input=stdin, capture_output=True, env=full_env,
                          timeout=timeout)


def tree_snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
