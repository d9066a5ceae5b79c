"""The replica checker's probe (issue 28): loaded only into the interpreter that runs a migrated script (the
proof tier, or a checker), never into the product's output. Standard library, torch and torch_xla only.

A data-parallel program trains right only when every optimizer update steps gradients that were all-reduced
across the replicas exactly once since the backward that made them, and the replicas start from equal
weights. At world size 1 nothing differs between replicas, so the probe records what would make them differ:

- every backward (``Tensor.backward``, ``torch.autograd.backward``) starts a new set of gradients;
- every gradient reduction: ``xm.reduce_gradients`` (what ``xm.optimizer_step`` calls: at world size 1 it
  reduces nothing, so the probe records the gradients it would reduce) and ``xm.all_reduce`` given a list of
  tensors (in place: the explicit ``xm._fetch_gradients`` + ``xm.all_reduce``), by the tensors it got,
  and all-reduces while a backward runs (on the ``xla`` process group, ``ProcessGroupXla.allreduce``, or
  ``xm.all_reduce`` itself): DDP's reducer all-reduces its gradient buckets then, and so do a program's own
  gradient hooks (``by``: "ddp" or "hooks"; with an xm reduction as well, "both" and ``reduced_twice``); a
  metric's ``dist.all_reduce`` after the backward does not count;
- every optimizer update (a global step pre-hook, so ``opt.step()``, ``scaler.step(opt)`` and
  ``xm.optimizer_step(opt)`` alike): whether each gradient it steps was reduced since the last backward, and
  how many times;
- the initial replicas: whether each parameter of the update was broadcast (``xm.collective_broadcast``)
  or belongs to a module DDP wrapped (DDP broadcasts rank 0's weights when it wraps the module);
- an update whose parameters have no gradient at all after a backward ("steps_nothing"): the optimizer holds
  parameters the model no longer uses (built before ``Module.to`` moved the model to XLA, which makes new
  parameter objects there), so the weights never change.
- whether the update runs in a data-parallel program ("distributed"): a process group is initialised, the
  process was started by ``xmp.spawn`` / ``torch_xla.launch`` (which call it) or by torchrun. Unreduced updates
  matter only there: a single-device program's ``optimizer.step()`` reduces nothing, rightly.

With ``XLA_REPLICA_PROBE_FILE=path`` set, one JSON line per update is appended to ``path`` (one file for the
launcher's worker processes too: each appends its own lines, with its pid):
``{"pid", "update", "optimizer", "gradients", "reduced", "reduced_twice", "by", "broadcast"}``. ``summarize``
reads them back. Install it with ``install()`` before the script runs (the proof tier's shim does, when the
variable is set).
"""

from __future__ import annotations

import json
import os
import sys
import threading

_STATE = {"backwards": 0, "updates": 0, "ddp_reductions": 0, "installed": False}
_LOCK = threading.Lock()
# id(parameter) -> times its gradient was reduced since the last backward. Keyed by the parameter: on XLA each
# read of ``p.grad`` makes a new Python tensor object, so gradients are told apart by their parameter.
_REDUCED: dict[int, int] = {}
# id(tensor) -> (the tensor, id of its parameter) for the gradients ``xm._fetch_gradients`` handed out
_FETCHED: dict[int, tuple[object, int]] = {}
# ids of tensors broadcast from ordinal 0, and of the parameters of modules DDP wrapped
_BROADCAST: set[int] = set()
_DDP_PARAMETERS: set[int] = set()
# Reductions on the xla process group during the last backward (DDP's reducer, or the program's own gradient
# hooks, all-reduce while the backward runs; a metric's dist.all_reduce after it does not count).
_DDP_SINCE: dict[str, int] = {"count": 0}
_IN_BACKWARD = threading.local()


def _record_backward() -> None:
    with _LOCK:
        _STATE["backwards"] += 1
        _REDUCED.clear()
        _FETCHED.clear()
        _DDP_SINCE["count"] = 0


def _patch_backward(torch) -> None:
    original_tensor_backward = torch.Tensor.backward
    original_autograd_backward = torch.autograd.backward

    def running(function, *args, **kwargs):
        _IN_BACKWARD.depth = getattr(_IN_BACKWARD, "depth", 0) + 1
        _STATE["backwards_running"] = _STATE.get("backwards_running", 0) + 1
        try:
            return function(*args, **kwargs)
        finally:
            _IN_BACKWARD.depth -= 1
            _STATE["backwards_running"] -= 1

    def tensor_backward(self, *args, **kwargs):
        _record_backward()
        return running(original_tensor_backward, self, *args, **kwargs)

    def autograd_backward(*args, **kwargs):
        if not getattr(_IN_BACKWARD, "depth", 0):
            _record_backward()
        return running(original_autograd_backward, *args, **kwargs)

    # Tensor.backward calls torch.autograd.backward: a backward counts once (the counter only clears state).
    torch.Tensor.backward = tensor_backward
    torch.autograd.backward = autograd_backward


def _patch_xla_model(xm) -> None:
    if getattr(xm, "_replica_probe", False):
        return
    xm._replica_probe = True
    all_reduce = xm.all_reduce
    collective_broadcast = getattr(xm, "collective_broadcast", None)

    def probed_all_reduce(reduce_type, inputs, *args, **kwargs):
        if isinstance(inputs, (list, tuple)) and not _STATE.get("in_reduce_gradients"):
            with _LOCK:
                for tensor in inputs:
                    fetched = _FETCHED.get(id(tensor))
                    if fetched is not None and fetched[0] is tensor:
                        _REDUCED[fetched[1]] = _REDUCED.get(fetched[1], 0) + 1
                if _STATE.get("backwards_running", 0):
                    # an all-reduce while a backward runs: a gradient hook's (the program's own, or DDP's
                    # through the xla process group)
                    _DDP_SINCE["count"] += 1
        return all_reduce(reduce_type, inputs, *args, **kwargs)

    xm.all_reduce = probed_all_reduce
    fetch_gradients = xm._fetch_gradients

    def probed_fetch_gradients(optimizer):
        gradients = fetch_gradients(optimizer)
        parameters = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if len(parameters) == len(gradients):
            with _LOCK:
                for tensor, parameter in zip(gradients, parameters):
                    _FETCHED[id(tensor)] = (tensor, id(parameter))
        return gradients

    xm._fetch_gradients = probed_fetch_gradients
    reduce_gradients = xm.reduce_gradients

    def probed_reduce_gradients(optimizer, *args, **kwargs):
        # xm.optimizer_step's reduction; at world size 1 it skips its all_reduce, so it is recorded here.
        with _LOCK:
            for group in optimizer.param_groups:
                for parameter in group["params"]:
                    if parameter.grad is not None:
                        _REDUCED[id(parameter)] = _REDUCED.get(id(parameter), 0) + 1
        _STATE["in_reduce_gradients"] = True
        try:
            return reduce_gradients(optimizer, *args, **kwargs)
        finally:
            _STATE["in_reduce_gradients"] = False

    xm.reduce_gradients = probed_reduce_gradients
    if collective_broadcast is not None:
        def probed_broadcast(tensors, *args, **kwargs):
            with _LOCK:
                _BROADCAST.update(id(t) for t in tensors)
            return collective_broadcast(tensors, *args, **kwargs)

        xm.collective_broadcast = probed_broadcast


def _patch_process_group(backend) -> None:
    group = getattr(backend, "ProcessGroupXla", None)
    if group is None or getattr(group, "_replica_probe", False):
        return
    group._replica_probe = True
    allreduce = group.allreduce

    def probed_allreduce(self, *args, **kwargs):
        # The reducer's thread may differ from the one that called backward: any backward running counts.
        with _LOCK:
            _STATE["ddp_reductions"] += 1
            if _STATE.get("backwards_running", 0):
                _DDP_SINCE["count"] += 1
        return allreduce(self, *args, **kwargs)

    group.allreduce = probed_allreduce


def _patch_ddp(torch) -> None:
    ddp = torch.nn.parallel.DistributedDataParallel
    init = ddp.__init__

    def probed_init(self, module, *args, **kwargs):
        with _LOCK:
            _DDP_PARAMETERS.update(id(p) for p in module.parameters())
        return init(self, module, *args, **kwargs)

    ddp.__init__ = probed_init


def _pre_step(optimizer, args, kwargs) -> None:
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    gradients = [p for p in parameters if p.grad is not None]
    with _LOCK:
        _STATE["updates"] += 1
        times = [_REDUCED.get(id(p), 0) for p in gradients]
        by_xm = bool(gradients) and all(t >= 1 for t in times)
        # DDP's reducer, or the program's own gradient hooks, reduced on the xla process group in the backward
        by_ddp = bool(gradients) and _DDP_SINCE["count"] > 0
        hooks = by_ddp and not all(id(p) in _DDP_PARAMETERS for p in parameters)
        record = {
            "pid": os.getpid(),
            "distributed": _distributed(),
            "update": _STATE["updates"],
            "optimizer": type(optimizer).__name__,
            "gradients": len(gradients),
            "reduced": by_xm or by_ddp or not gradients,
            # a backward ran but none of the optimizer's parameters has a gradient: it steps copies the model
            # no longer uses (an optimizer built before Module.to moved the model to XLA: new parameters there)
            "steps_nothing": not gradients and _STATE["backwards"] > 0,
            "reduced_twice": (by_xm and by_ddp) or any(t > 1 for t in times),
            "by": ("both" if by_xm and by_ddp else "xm" if by_xm else "hooks" if hooks else "ddp" if by_ddp
                   else "none"),
            "broadcast": all(id(p) in _BROADCAST or id(p) in _DDP_PARAMETERS for p in parameters),
        }
    path = os.environ.get("XLA_REPLICA_PROBE_FILE")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")


# Set in the launcher's process before it starts the workers, so they inherit it (they run in new interpreters).
_LAUNCHED = "XLA_REPLICA_PROBE_LAUNCHED"


def _distributed() -> bool:
    if os.environ.get(_LAUNCHED) == "1" or os.environ.get("TORCHELASTIC_RUN_ID"):
        return True
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def _patch_launcher(xmp) -> None:
    if getattr(xmp, "_replica_probe", False):
        return
    xmp._replica_probe = True
    spawn = xmp.spawn

    def probed_spawn(*args, **kwargs):
        os.environ[_LAUNCHED] = "1"
        return spawn(*args, **kwargs)

    xmp.spawn = probed_spawn


class _AfterImport:
    """Patches a module right after it is imported (a meta path finder that defers to the others)."""

    def __init__(self, patches) -> None:
        self.patches = patches

    def find_spec(self, name, path=None, target=None):
        if name not in self.patches:
            return None
        import importlib.util

        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _PatchingLoader(spec.loader, self.patches[name])
        return spec


class _PatchingLoader:
    """Loads a module with its own loader, then patches it."""

    def __init__(self, loader, patch) -> None:
        self.loader, self.patch = loader, patch

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.patch(module)


def _patch_torch(torch) -> None:
    _patch_backward(torch)
    _patch_ddp(torch)
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(_pre_step)


def install() -> None:
    """Patch torch and torch_xla now if imported, else when they are."""
    if _STATE["installed"]:
        return
    _STATE["installed"] = True
    patches = {"torch.optim.optimizer": lambda m: _patch_torch(sys.modules["torch"]),
               "torch_xla.core.xla_model": _patch_xla_model,
               "torch_xla.distributed.xla_backend": _patch_process_group,
               "torch_xla.distributed.xla_multiprocessing": _patch_launcher}
    for name, patch in list(patches.items()):
        if name in sys.modules:
            patch(sys.modules[name])
            del patches[name]
    if patches:
        sys.meta_path.insert(0, _AfterImport(patches))


def summarize(path: str) -> dict:
    """What the probe file says: updates, the unreduced ones, those reduced twice, whether every update's
    parameters were broadcast (or DDP-wrapped) before it."""
    records = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            records = [json.loads(line) for line in handle if line.strip()]
    return {
        "updates": len(records),
        "unreduced": [r for r in records if not r["reduced"]],
        "reduced_twice": [r for r in records if r["reduced_twice"]],
        "unequal_start": [r for r in records if not r["broadcast"]],
        "steps_nothing": [r for r in records if r.get("steps_nothing")],
        "by": sorted({r["by"] for r in records}),
        "distributed": any(r.get("distributed") for r in records),
    }
