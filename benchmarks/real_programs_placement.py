"""Where the trained parameters lived: the real-programs suite's own probe, independent of verify's loader.

Loaded at start-up by the suite's sitecustomize (benchmarks/real_programs/_stubs) when REAL_PROGRAMS_PLACEMENT
names a folder. Once torch's optimizer module is imported it registers torch's global optimizer step post-hook;
each step records, per optimizer, the elements of its parameters by device type (cpu, xla, ...). A process that
imported torch_xla writes ``<pid>.json`` there on its 1st, 2nd, 4th, 8th... step and at exit (a spawned
replica may end without running atexit). The original on CPU torch never imports torch_xla and writes nothing.
Standard library only until torch is there; nothing is imported on the program's behalf.
"""

import atexit
import json
import os
import sys

_FOLDER = os.environ.get("REAL_PROGRAMS_PLACEMENT", "")
_optimizers: dict[int, dict] = {}
_registered = False


def _devices(optimizer) -> dict[str, int]:
    counts: dict[str, int] = {}
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            kind = parameter.device.type
            counts[kind] = counts.get(kind, 0) + parameter.numel()
    return counts


def _write() -> None:
    if not _optimizers or "torch_xla" not in sys.modules:
        return
    path = os.path.join(_FOLDER, f"{os.getpid()}.json")
    try:
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            json.dump({"pid": os.getpid(), "optimizers": list(_optimizers.values())}, handle)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


def _after_step(optimizer, args, kwargs) -> None:
    record = _optimizers.setdefault(id(optimizer), {"optimizer": type(optimizer).__name__, "steps": 0})
    record["steps"] += 1
    record["devices"] = _devices(optimizer)
    if record["steps"] & (record["steps"] - 1) == 0:  # a power of two
        _write()


def _register(event: str, args) -> None:
    global _registered
    if _registered or event != "import":
        return
    module = sys.modules.get("torch.optim.optimizer")
    # registered once the module has run far enough to have both (imports inside it fire this hook too)
    if module is not None and hasattr(module, "register_optimizer_step_post_hook") \
            and hasattr(module, "_global_optimizer_post_hooks"):
        _registered = True
        module.register_optimizer_step_post_hook(_after_step)


if _FOLDER:
    sys.addaudithook(_register)
    atexit.register(_write)
