"""The step model's vocabulary: the callee names it knows (barriers, step closures, clipping, host reads,
logging), the kinds of events a step is made of, and the records it hands the rules (``StepLoop``,
``Region``, ``Reduction``, ...)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst


Loop = cst.For | cst.While
Function = cst.FunctionDef | None  # None: the module's own code

STEP_BARRIERS = ("torch_xla.core.xla_model.mark_step", "torch_xla.sync")
OPTIMIZER_STEP = "torch_xla.core.xla_model.optimizer_step"
STEP_CLOSURES = ("torch_xla.core.xla_model.add_step_closure",)
FETCH_GRADIENTS = "torch_xla.core.xla_model._fetch_gradients"
XLA_ALL_REDUCE = "torch_xla.core.xla_model.all_reduce"
CLIP_GRADS = ("torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad_value_", "torch.nn.utils.clip_grad_norm",
              "torch.nn.utils.clip_grad.clip_grad_norm_", "torch.nn.utils.clip_grad.clip_grad_value_")
# Calls that pass an iterable through (the loader is their first argument).
PASS_THROUGH = ("builtins.enumerate", "tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.std.tqdm")
# Methods that copy a tensor's value to the host, and conversions that do when given a tensor.
READ_METHODS = ("item", "tolist", "cpu", "numpy")
CONVERSIONS = ("builtins.float", "builtins.int", "builtins.bool")
# Attributes of a tensor known without running the graph.
STATIC_ATTRIBUTES = ("shape", "dtype", "device", "size", "ndim", "dim", "requires_grad", "numel", "grad_fn",
                     "is_leaf", "names", "layout")
LOG_METHODS = ("info", "debug", "warning", "warn", "error", "critical", "exception", "log", "add_scalar",
               "add_scalars", "log_metric", "log_metrics", "set_postfix", "set_postfix_str", "set_description",
               "write")
# A call's callee name that says it produces tensors: outputs = model(x), loss = criterion(out, y).
_TENSOR_CALLEES = ("model", "criterion", "loss", "net", "forward", "encoder", "decoder")
# A callee that is a model: model(x), self.net(x), ddp_model(x), backbone(x) (not model.parameters()).
_MODEL_NAME = re.compile(r"(model|^net$|^net_|_net$|^netg$|^netd$|^module$|backbone|encoder|decoder)", re.IGNORECASE)
# Names with "model" in them that hold no model to run forward: a verb's helper (``_set_model``,
# ``build_model``), a class (``comp_model_cls``, ignite's loop over its computation model classes), a helper
# over several models (``self._match_models(a, b)``, iatransfer's layer matcher: a model is one, not many).
_NOT_A_MODEL_NAME = re.compile(r"^_*(set|get|load|save|build|create|make|init|register|wrap|prepare|setup)_|"
                               r"_(cls|class|classes|type|types|models)$", re.IGNORECASE)
_OPTIMIZER_NAME = re.compile(r"optim|^opt", re.IGNORECASE)
_SCHEDULER_NAME = re.compile(r"sched|^lr", re.IGNORECASE)
# A name that says it holds a loader: train_loader, self.val_loader, dataloader, train_dl.
_LOADER_NAME = re.compile(r"(loader|^dl$|_dl$|^dl_)", re.IGNORECASE)
# An ``if`` around the update that makes it an accumulation: ``(i + 1) % k == 0``, ``step % accum_steps``.
_ACCUMULATION_NAME = re.compile(r"accum|update_freq|grad_acc", re.IGNORECASE)

# Event kinds.
BACKWARD, STEP, SCALER_UPDATE, ZERO_GRAD, SCHEDULE = "backward", "step", "scaler_update", "zero_grad", "schedule"
UNSCALE, CLIP, GRAD = "unscale", "clip", "grad"
BARRIER, CLOSURE, FETCH, FORWARD, READ, CALL = "barrier", "closure", "fetch_gradients", "forward", "read", "call"
UPDATE_KINDS = (STEP, SCALER_UPDATE, ZERO_GRAD, SCHEDULE)


@dataclass(frozen=True)
class Event:
    """Something a step does. ``node`` lies in the function the path leads to: ``path`` is the calls from
    the loop's own code down to that function (empty when the loop body holds the node itself)."""

    kind: str
    node: cst.CSTNode
    path: tuple[cst.Call, ...] = ()
    # The innermost loop holding the node in its own function, when that loop lies below the step's loop
    # (a micro-step loop, a loop over the parameters); None when the node runs once per step.
    inner_loop: Loop | None = None
    # What a call into another module of the project does (the project index says so): ``node`` is that
    # call; nothing inside it is known here, so no rule edits it as a backward or a step.
    external: bool = False

    @property
    def site(self) -> cst.CSTNode:
        """What the loop's own code runs: the node itself, or the first call of its path."""
        return self.path[0] if self.path else self.node

    @property
    def nested(self) -> bool:
        return self.inner_loop is not None


@dataclass(frozen=True)
class Batches:
    """How a loop gets its batches. ``how``: "loader" (a DataLoader), "device_loader" (one that already
    delivers on the XLA device), "iterator" (``next(it)``), "function" (a batch function the loop calls),
    "iterable" (anything else it iterates), or "none"."""

    how: str
    node: cst.CSTNode | None = None


@dataclass(frozen=True)
class BarrierSite:
    """Where a loop's step ends: after ``statement`` (a statement of an indented block), or appended to a
    one-line body (``for x in data: step(x); xm.mark_step()``) when ``statement`` is that suite."""

    statement: cst.CSTNode
    block: cst.CSTNode
    after_update: bool  # after the update's statements (else: at the end of the body)
    # An evaluation batch's barrier right before its first host read (step_end.py), not at the body's end.
    before_read: bool = False


@dataclass
class StepLoop:
    loop: Loop
    kind: str  # "train" or "eval"
    function: Function
    batches: Batches
    events: list[Event] = field(default_factory=list)
    # Accumulation: "micro-steps" (backward in nested loops, one update per iteration), "guard" (the update
    # under ``if (i + 1) % k == 0:``), or None.
    accumulation: str | None = None
    micro_loops: list[Loop] = field(default_factory=list)
    barrier_site: BarrierSite | None = None
    # Already on torch_xla: iterates a device loader, or marks the step itself (mark_step / sync /
    # xm.optimizer_step(..., barrier=True)).
    iterates_device_loader: bool = False
    has_barrier: bool = False
    # The DataLoader expression the loop iterates (inside enumerate()/tqdm()), when it is one.
    loader: cst.BaseExpression | None = None

    def of_kind(self, *kinds: str, nested: bool | None = None) -> list[Event]:
        return [e for e in self.events if e.kind in kinds and (nested is None or e.nested == nested)]

    @property
    def backwards(self) -> list[Event]:
        return self.of_kind(BACKWARD)

    @property
    def steps(self) -> list[Event]:
        return self.of_kind(STEP, nested=False)

    @property
    def updates(self) -> list[Event]:
        return self.of_kind(*UPDATE_KINDS, nested=False)

    @property
    def forwards(self) -> list[Event]:
        return self.of_kind(FORWARD)

    @property
    def on_xla(self) -> bool:
        """The loop already runs on torch_xla: a device loader or its own step barrier."""
        return self.iterates_device_loader or self.has_barrier


@dataclass(frozen=True)
class Reduction:
    """The explicit gradient all-reduce of a training step (XLA406): after ``backward`` (the last backward
    before the first gradient read) and before ``first_touch``, both in the function ``within`` (the loop's
    own function, or a callee both lie in); ``optimizers`` are the names its steps step there."""

    loop: Loop
    within: cst.CSTNode  # the loop, or the callee's FunctionDef
    backward: cst.CSTNode
    first_touch: cst.CSTNode
    steps: tuple[cst.Call, ...]
    optimizers: tuple[str, ...]
    already_reduced: bool
    # What ``within`` itself runs of the steps: the step calls there, or the calls leading to them.
    local_steps: tuple[cst.CSTNode, ...] = ()


@dataclass(frozen=True)
class Region:
    """Where a node runs per step: the step loop, and the calls from its body into the function holding the
    node (empty when the node is in the loop itself)."""

    step: StepLoop
    path: tuple[cst.Call, ...] = ()
    function: Function = None  # the function holding the node (the callee at the end of the path)

    @property
    def in_callee(self) -> bool:
        return bool(self.path)
