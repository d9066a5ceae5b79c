"""The one decision "nothing here to migrate", shared by ``migrate``, a single-file run, a tree run and a
notebook: a source that mentions none of these words is returned as it came (after the checks every input
gets), so a program that never touches torch (a tinygrad loop, a numpy MPI script reading ``RANK``) is
byte-identical whichever way it comes in. Keep the list a superset of what any rule looks for: the torch
and CUDA names, and the libraries the Hugging Face and launcher rules read (transformers, trl, accelerate,
lightning)."""

from __future__ import annotations

import re

TRIGGERS = ("cuda", "torch", "Trainer", "nccl", "accelerate", "autocast", "GradScaler", "apex", "transformers",
            "trl", "lightning")
_PATTERN = "|".join(re.escape(t) for t in TRIGGERS)
TRIGGER_RE = re.compile(_PATTERN.encode())
_TRIGGER_TEXT_RE = re.compile(_PATTERN)


def mentions_a_trigger(source: bytes | str) -> bool:
    if isinstance(source, str):
        return _TRIGGER_TEXT_RE.search(source) is not None
    return TRIGGER_RE.search(source) is not None
