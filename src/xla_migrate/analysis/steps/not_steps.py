"""Code where no training or evaluation step lives, whatever its loops call (issue 30, point 2).

The step model (steps/model.py) sees a step loop wherever a loop runs a model forward or a backward per iteration.
Some loops that do are not steps of the training program:

- the methods of an ``nn.Module`` subclass (``forward`` looping over decoder time steps or over its blocks,
  ``__init__`` building submodules named ``Encoder(...)``, ``generate`` sampling token by token), and the
  functions nested in them: they run inside the step, so a step barrier there cuts the step's graph into one
  graph per iteration;
- the module-level code of a project module that other modules import and that has no ``__main__`` block:
  it runs at import time, before any training loop.

A barrier never goes there, and their loops are not step loops (their reads belong to the step that calls
them: the caller's loop reports them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from ...syntax import patterns

if TYPE_CHECKING:
    from ...engine.context import MigrationContext

# Bases that make a class a torch module (the qualified names libcst resolves, and what a script spells when
# the import cannot be resolved).
MODULE_BASES = ("torch.nn.Module", "torch.nn.modules.module.Module", "torch.nn.modules.Module")
_MODULE_SPELLINGS = ("nn.Module", "torch.nn.Module", "Module", "nn.Sequential", "nn.ModuleList",
                     "PreTrainedModel", "LightningModule", "pl.LightningModule")


def module_classes(ctx: MigrationContext, classes: dict[str, cst.ClassDef]) -> set[str]:
    """The names of this module's classes that are torch modules: a base that is ``nn.Module`` (or another
    ``torch.nn`` module class, a Hugging Face ``PreTrainedModel``), a class of this module that is one, or a
    project class imported from another module that is one (``class BaseVAE(nn.Module)`` in models/base.py)."""
    project = ctx.project
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, node in classes.items():
            if name in found:
                continue
            for base in node.bases:
                spelled = patterns.dotted_name(base.value) or ""
                qualified = ctx.qualnames(base.value)
                if (qualified & set(MODULE_BASES) or any(q.startswith("torch.nn.") for q in qualified)
                        or spelled in _MODULE_SPELLINGS or spelled.rsplit(".", 1)[-1] in found
                        or spelled.endswith("PreTrainedModel")
                        or (spelled and project is not None and project.torch_module_class(spelled))):
                    found.add(name)
                    changed = True
                    break
    return found


def import_time_module(ctx: MigrationContext) -> bool:
    """This file is a module of the project that others import, not an entry file: its module-level code
    runs at import time."""
    project = ctx.project
    return project is not None and not project.is_entry
