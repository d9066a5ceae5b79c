"""verify --devices N: the collectives the SPMD partitioner put in the compiled graphs (issue 31).

GSPMD inserts the collectives when it compiles, so torch_xla's metrics never count them; the compiled HLO
does. The child dumps each graph XLA compiles (``--xla_dump_to``, text, after optimizations) into verify's
working folder, and this module reads the all-gathers of the training step's graph: the largest graph
compiled (the step, with its forward, backward and optimizer update; a loss read or a save is smaller). It
runs at every step once compilation has stopped (verify checks that), so its all-gathers are per step.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# `%all-gather.3 = f32[12,24]{0,1} all-gather(%bitcast.2), ...` (and the async form, all-gather-start).
_ALL_GATHER = re.compile(r"=\s+(\S.*?)\s+all-gather(?:-start)?\(")
_LAYOUT = re.compile(r"\{[^}]*\}")
SHAPES_SHOWN = 6


def dump_flags(folder: Path, existing: str | None) -> str:
    """XLA_FLAGS that add the dump of every compiled graph's optimized HLO, as text, to ``folder``."""
    ours = (f"--xla_dump_to={os.fspath(folder)} --xla_dump_hlo_as_text "
            "--xla_dump_hlo_module_re=SyncTensorsGraph")
    return f"{existing} {ours}".strip() if existing else ours


def all_gathers(folder: Path) -> dict | None:
    """The training step graph's all-gathers: {"per_step": count, "shapes": [result shapes, the first few]};
    None when nothing was dumped (the run compiled nothing, or the dump was not asked for)."""
    graphs = sorted(path for path in folder.glob("*after_optimizations.txt")
                    if path.name.endswith((".cpu_after_optimizations.txt", ".after_optimizations.txt")))
    if not graphs:
        return None
    texts = [path.read_text(errors="replace") for path in graphs]
    step = max(texts, key=lambda text: text.count("\n"))
    shapes = [_LAYOUT.sub("", shape) for shape in _ALL_GATHER.findall(step)]
    return {"per_step": len(shapes), "shapes": shapes[:SHAPES_SHOWN]}
