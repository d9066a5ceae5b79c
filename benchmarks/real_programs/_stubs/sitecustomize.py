"""The real-programs suite's dashboard: with REAL_PROGRAMS_SHOW_SCALARS=1, TensorBoard's
``SummaryWriter.add_scalar`` also prints ``tensorboard TAG=VALUE step=STEP`` on stdout, so a program that reports
its loss only to TensorBoard (cleanrl's, say) still has a loss curve to compare. The value is read as TensorBoard
reads it (a tensor becomes a number). Nothing is imported until the program imports the writer itself.

With REAL_PROGRAMS_SEED=N (a recipe's ``seed``), every process starts with torch's CPU generator, Python's
``random`` and NumPy's seeded with N, before the program runs: an unseeded program's two runs (the original, and
the output on torch_xla) then start from the same weights, shuffle order and crops, so the suite's comparison
and verify's judge the migration rather than two draws of the program. What the program draws on the device
still differs (torch_xla has its own generator).

verify's loader (its own sitecustomize, first on PYTHONPATH) runs this one too.
"""

import importlib.abc
import os
import sys

_TARGET = "torch.utils.tensorboard.writer"


def _patch(module) -> None:
    writer = getattr(module, "SummaryWriter", None)
    if writer is None or getattr(writer.add_scalar, "_shows", False):
        return
    original = writer.add_scalar

    def add_scalar(self, tag, scalar_value, global_step=None, *args, **kwargs):
        try:
            value = float(scalar_value)
        except (TypeError, ValueError):
            value = scalar_value
        print(f"tensorboard {tag}={value} step={global_step}", flush=True)
        return original(self, tag, scalar_value, global_step, *args, **kwargs)

    add_scalar._shows = True
    writer.add_scalar = add_scalar


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                break
        else:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("REAL_PROGRAMS_SHOW_SCALARS"):
    sys.meta_path.insert(0, _Finder())

if os.environ.get("REAL_PROGRAMS_PLACEMENT"):  # the suite's own placement probe (benchmarks/real_programs_placement.py)
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "real_programs_placement", os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir,
                                                "real_programs_placement.py"))
    _probe = importlib.util.module_from_spec(_spec)
    sys.modules["real_programs_placement"] = _probe
    _spec.loader.exec_module(_probe)

if os.environ.get("REAL_PROGRAMS_SEED"):
    _seed = int(os.environ["REAL_PROGRAMS_SEED"])
    import random

    random.seed(_seed)
    try:
        import numpy

        numpy.random.seed(_seed)
    except ImportError:
        pass
    try:
        import torch

        torch.manual_seed(_seed)
    except ImportError:  # a process of the suite's that is not a program (none imports torch otherwise)
        pass
