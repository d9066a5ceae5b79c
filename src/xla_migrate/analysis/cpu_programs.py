"""Programs that never leave the CPU: no file of the program uses CUDA or places anything on a device.

Such a program (reinforcement-learning scripts whose models and tensors stay on the CPU, Hogwild workers that
update one shared-memory CPU model) is not a CUDA program to migrate: the step recipe on its CPU optimizers
would only start the XLA runtime in every process (on a TPU host each process claims the chips for a model
that stays on the CPU). It is left as it is, with one finding where it trains saying how to put it on XLA.

The test is wide on purpose: a word of CUDA, device placement, mixed precision, a launcher or a library that
places devices itself, anywhere in the program (code, string or comment), makes it a program the rules
migrate, as before. Only a program with an entry (a ``__main__`` block) qualifies: a snippet or a module
without one may be one part of a CUDA program.
"""

from __future__ import annotations

import re

PLACEMENT = re.compile(
    r"cuda|device|\.to\(|\bxla\b|torch_xla|\bxm\b|\bmps\b|accelerat|transformers|lightning|deepspeed|"
    r"distributed|spawn\(|DataParallel|autocast|GradScaler|\.half\(|\bamp\b|apex|nccl|torchrun|launch",
    re.IGNORECASE)
MAIN_GUARD = re.compile(r"""^if\s+__name__\s*==\s*['"]__main__['"]\s*:""", re.MULTILINE)
TRAINING = re.compile(r"\.(?:step|backward)\(")

CODE = "XLA004"
MESSAGE = ("the program never uses CUDA or places anything on a device (no file of it names CUDA, a device, "
           "`.to()`, mixed precision or a launcher): it is left as it runs, on the CPU; the step recipe on CPU "
           "optimizers would only start the XLA runtime in each process")
FIX = ("to train on XLA, place the model and each batch on a device (`device = \"cuda\"`, `model.to(device)`, "
       "`x.to(device)`) and migrate again, or write it with torch_xla.device() by hand")


def never_placed(text: str) -> bool:
    """No word of device placement anywhere in ``text``."""
    return PLACEMENT.search(text) is None


def has_entry(text: str) -> bool:
    return MAIN_GUARD.search(text) is not None


def cpu_only_script(text: str) -> bool:
    """A script migrated alone that is a whole CPU program."""
    return has_entry(text) and never_placed(text)


def training_line(text: str) -> int | None:
    """The line of the first ``.step(`` or ``.backward(`` (where the step recipe would have gone)."""
    match = TRAINING.search(text)
    return None if match is None else text.count("\n", 0, match.start()) + 1
