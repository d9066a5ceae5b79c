"""The step model: what one training (or evaluation) step does, for every loop that runs device work per
iteration. Computed once per module, after the facts pass, from one read-only walk; the loop rules (XLA301,
XLA302, XLA310, XLA311, XLA313, XLA406, ...) ask it and never walk the tree themselves.

Per loop it knows the batches (a DataLoader, a device loader, ``next(it)``, a batch function), the forward
calls, the backward calls, the update (optimizer ``step``, ``scaler.step``/``update``, ``zero_grad``,
schedulers), the gradient reads between them (``unscale_``, clipping, ``p.grad``), existing barriers and step
closures, and the host reads, each with its call path: events in functions the loop calls are followed
(module-level and nested functions, methods through ``self``, objects of the module's own classes and their
``__call__``), so a loop whose backward and step happen in ``self.train_step(batch)`` or in a loss-scaler
object's ``__call__`` is a training loop like any other.

Kinds of loop:

- training loop: its step runs an optimizer update and a backward pass. The backward may sit in nested loops
  (micro-steps: gradient accumulation) or the update under ``if (i + 1) % k == 0:`` (accumulation by guard);
  a loop that calls backward with no update in sight is a training loop whose update is unknown.
- evaluation loop: no backward, a model forward per iteration (``model(x)``, ``self.net(x)``, in a callee too).
- micro-step loop: the nested loop of an accumulating training loop; it is part of that loop's step.

The barrier (XLA302) goes after the update, so one graph runs per optimizer step; an evaluation loop gets it
per batch. The device loader (XLA301) marks the step at every batch, so a loop that accumulates by a guard gets
the barrier instead (a device loader would run one graph per micro-step).

The modules: ``kinds`` (the vocabulary and the records the rules get), ``collect`` (the one walk),
``call_paths`` (following calls, into the module's own models' ``forward`` and the project's helpers too),
``model`` (``StepModel``: loops, where a step ends, queries), ``not_steps`` (code where no step lives: a
module's methods, import-time code), ``step_end`` (the barrier past the step's device work; an evaluation
batch's before its read), ``epoch_reads`` (a value read several times after a loop), ``reductions`` (XLA406's
gradient reduction), ``reads`` (host reads at the expression level, what a step closure takes and when it
cannot take a statement), ``closure_safety`` (what a step closure must not change: try, with, exits),
``closure_args`` (host values taken at the step), ``host_reads`` (the reads XLA313, XLA314 and XLA310 move),
``library_training`` (a script that trains through a library's trainer: ``Trainer(...).train()``).
The names the rules use are imported here.
"""

from .collect import is_model_call, is_optimizer_name, is_optimizer_step
from .host_reads import DeviceReturn, DeviceSum, FiniteCheck, LoggedRead
from .library_training import trains_through_a_trainer
from .kinds import BarrierSite, Batches, Event, Function, Loop, Reduction, Region, StepLoop
from .model import StepModel
from .reads import (appends_to_log, captured_names, describe_path, in_logging_compound, in_step_closure,
                    is_logging_call, is_logging_read, is_read_call, logging_compound, logging_statement, may_read,
                    mentions, reads)
from .reductions import step_optimizer

__all__ = ["BarrierSite", "Batches", "DeviceReturn", "DeviceSum", "Event", "FiniteCheck", "Function", "LoggedRead",
           "Loop", "Reduction", "Region", "StepLoop", "StepModel", "appends_to_log", "captured_names",
           "describe_path", "in_logging_compound", "in_step_closure", "is_logging_call", "is_logging_read",
           "is_model_call", "is_optimizer_name", "is_optimizer_step", "is_read_call", "logging_compound", "logging_statement", "may_read",
           "mentions", "reads", "step_optimizer", "trains_through_a_trainer"]
