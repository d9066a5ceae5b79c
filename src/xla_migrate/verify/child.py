"""The loader `xla-migrate verify` puts into the interpreter that runs the script it checks.

It is never imported by xla-migrate itself, never written into a migrated script, and needs nothing but the
standard library, torch and torch_xla: verify copies this file as ``sitecustomize.py`` into a temporary
folder that it puts first on PYTHONPATH of that one child process, so Python imports it at start-up. It
observes the run and writes what it sees as JSON lines to ``$XLA_MIGRATE_VERIFY_RECORD.<pid>``:

- at every step marker (``xm.mark_step`` or ``torch_xla.sync``, which the device loader and
  ``xm.optimizer_step(barrier=True)`` call too): torch_xla's counters (compilations, graph
  executions, values read to the host, transfers from the device, ops that fell back to the CPU), the time,
  the size of torch_xla's debug file (so verify can tell which compilations came after warm-up) and the
  source lines that read XLA tensors to the host since the last marker;
- what step closures (``xm.add_step_closure``) read, counted apart: those reads cost no extra graph run;
- torch_xla deprecation warnings (unhidden, also those raised outside ``__main__``);
- the same counters at exit, with the random ops torch_xla lowered (``random_ops``: they draw from XLA's
  generator, not CPU torch's);
- through its second file (:mod:`xla_migrate.verify.child_hooks`, copied beside it as
  ``xla_migrate_verify_hooks.py``): what else makes the run's random numbers differ (dropout in train mode,
  unseeded generators), where the trained parameters live, mixed precision and what chose the device.
- through its third file (:mod:`xla_migrate.verify.replica_probe`, copied as ``xla_migrate_replica_probe.py``):
  whether each optimizer update of a data-parallel run stepped gradients all-reduced once, and from replicas
  that started equal.

The same loader runs in the original's process on plain torch (no torch_xla there): it records the
randomness and the optimizers, and ``--deterministic`` switches dropout off there too.

``$XLA_MIGRATE_VERIFY_STEPS=N`` ends the run (exit status 0) when the script reaches its step marker N+1, so
N steps have run and their step closures too. torch_xla 2.6.1 only: with ``XLA_METRICS_FILE`` set its metrics
writer calls ``xm.get_local_ordinal(defval=-1)``, a keyword 2.6.1 removed (TypeError at every step marker);
the loader lets the keyword through. A ``sitecustomize`` that this one shadows on sys.path still runs.
"""

import atexit
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import threading
import time
import warnings

_RECORD = os.environ.get("XLA_MIGRATE_VERIFY_RECORD")
_STOP_AFTER = int(os.environ.get("XLA_MIGRATE_VERIFY_STEPS") or 0)
_DEBUG_FILE = os.environ.get("PT_XLA_DEBUG_FILE")
_HERE = os.path.dirname(os.path.abspath(__file__))

# torch_xla counts every op it lowers (``xla::<op>``); these draw random numbers on the device, from XLA's own
# generator, so the same seed gives other numbers than CPU torch.
RANDOM_OPS = frozenset({
    "bernoulli", "bernoulli_", "native_dropout", "normal", "normal_", "uniform_", "random_", "randperm",
    "multinomial", "exponential_", "cauchy_", "geometric_", "log_normal_", "rrelu_with_noise", "randint",
    "rand", "randn", "rand_like", "randn_like", "randint_like", "poisson", "binomial", "_standard_gamma",
    "_sample_dirichlet"})


_lock = threading.RLock()
_local = threading.local()  # .reading: inside a read wrapper; .in_closure: inside step closures
_state = {"markers": 0, "closure_reads": 0, "closure_transfers": 0, "sites": {}, "patched": set(),
          "skip_dirs": [_HERE], "device": None, "spmd_devices": None, "stopping": False,
          "ops": {}}


def _write(event: dict) -> None:
    with _lock, open(f"{_RECORD}.{os.getpid()}", "a") as handle:
        handle.write(json.dumps(event) + "\n")


# torch_xla's counters ---------------------------------------------------------------------------------------


def _samples(met, name: str) -> int:
    data = met.metric_data(name)
    return int(data[0]) if data else 0


def _counters() -> dict:
    import torch_xla.debug.metrics as met

    fallbacks = {}
    for name in met.counter_names():
        if name.startswith("aten::"):
            fallbacks[name] = int(met.counter_value(name) or 0)
    # Graphs launched: each looks its executable up in the compilation cache, at once; ExecuteTime samples come
    # when an (asynchronous) execution ends, so at a step marker they may lag by one.
    launched = sum(int(met.counter_value(name) or 0) for name in ("CachedCompile", "UncachedCompile"))
    random_ops, ops = {}, {}
    for name in met.counter_names():
        if name.startswith("xla::"):
            ops[name[5:]] = int(met.counter_value(name) or 0)
            if name[5:] in RANDOM_OPS:
                random_ops[name[5:]] = ops[name[5:]]
    # the ops traced since the previous snapshot: what graph this step built (verify's key of a graph, and the
    # real-programs suite's, which reads the same counters from torch_xla's metrics file)
    traced = sorted(op for op, n in ops.items() if n > _state["ops"].get(op, 0))
    _state["ops"] = ops
    return {
        "compiles": _samples(met, "CompileTime"),
        "executions": max(launched, _samples(met, "ExecuteTime")),
        "transfers": _samples(met, "TransferFromDeviceTime"),
        "reads": fallbacks.pop("aten::_local_scalar_dense", 0),
        "fallbacks": fallbacks,
        "random_ops": random_ops,
        "traced": traced,
    }


def _snapshot(event: str, **extra) -> dict:
    record = {"event": event, "time": time.perf_counter(), **_counters(),
              "closure_reads": _state["closure_reads"], "closure_transfers": _state["closure_transfers"],
              "debug_offset": os.path.getsize(_DEBUG_FILE) if _DEBUG_FILE and os.path.exists(_DEBUG_FILE) else 0,
              "sites": [[where, count, in_closure] for (where, in_closure), count in _state["sites"].items()]}
    _state["sites"] = {}
    record.update(extra)
    return record


def _spmd_devices():
    """The devices one SPMD program spans (0 when the script did not turn SPMD on): verify --devices."""
    try:
        import torch_xla.runtime as xr

        return xr.global_runtime_device_count() if xr.is_spmd() else 0
    except Exception:  # only informative: never break the user's run for it
        return None


def _device_type():
    try:
        import torch_xla

        devices = torch_xla._XLAC._xla_real_devices()
        return devices[0].split(":")[0] if devices else None
    except Exception:  # only informative: never break the user's run for it
        return None


# Step markers -------------------------------------------------------------------------------------------------


def _stop() -> None:
    """N steps ran: end the run now, cleanly for the caller (exit status 0), before the next step executes."""
    _state["stopping"] = True
    try:
        import torch_xla.core.xla_model as xm

        xm.wait_device_ops()  # so the executions of the N steps are all counted
    except Exception:
        pass
    _write(_snapshot("exit", markers=_state["markers"], stopped=True))
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(0)


def _wrap_step_marker(step_marker):
    """Wraps a step marker (xm.mark_step, torch_xla.sync) from the outside, so torch_xla still sees its own
    function as the one that asked for the graph (its debug output names the cause from that frame). In 2.9
    xm.mark_step calls torch_xla.sync: a nested call goes straight through."""

    def step_marker_observed(*args, **kwargs):
        if getattr(_local, "in_marker", False):
            return step_marker(*args, **kwargs)
        if _STOP_AFTER and _state["markers"] >= _STOP_AFTER and not _state["stopping"]:
            _stop()
        _local.in_marker = True
        try:
            result = step_marker(*args, **kwargs)
        finally:
            _local.in_marker = False
        with _lock:
            _state["markers"] += 1
            if _state["device"] is None:
                _state["device"] = _device_type()
                _state["spmd_devices"] = _spmd_devices()
            _write(_snapshot("marker", index=_state["markers"], device=_state["device"],
                             spmd_devices=_state["spmd_devices"]))
        return result

    step_marker_observed.__wrapped__ = step_marker
    return step_marker_observed


def _marks_steps(function) -> bool:
    """Whether a function calls torch_xla's step marker itself. 2.9's xm.mark_step only calls torch_xla.sync
    (through a deprecation wrapper): wrapping it too would make the loader the caller that the deprecation
    warning names."""
    import inspect

    try:
        code = inspect.unwrap(function).__code__
    except (AttributeError, ValueError):
        return False
    return "_xla_step_marker" in code.co_names


def _wrap_step_closures(run_step_closures):
    """Counts what step closures read (they run after the step's graph, so a read there costs no extra run)."""

    def run_step_closures_observed(*args, **kwargs):
        import torch_xla.debug.metrics as met

        before = (met.counter_value("aten::_local_scalar_dense") or 0, _samples(met, "TransferFromDeviceTime"))
        _local.in_closure = True
        try:
            return run_step_closures(*args, **kwargs)
        finally:
            _local.in_closure = False
            with _lock:
                _state["closure_reads"] += (met.counter_value("aten::_local_scalar_dense") or 0) - before[0]
                _state["closure_transfers"] += _samples(met, "TransferFromDeviceTime") - before[1]

    return run_step_closures_observed


# Where the script reads XLA tensors to the host --------------------------------------------------------------

_READERS = ("item", "tolist", "numpy", "cpu", "to", "__bool__", "__float__", "__int__", "__index__",
            "__format__", "__repr__")


def _caller(depth: int = 2) -> str:
    """file:line of the innermost frame outside the loader, torch, torch_xla and the installed libraries."""
    frame = sys._getframe(depth)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not any(filename.startswith(folder) for folder in _state["skip_dirs"]) and not filename.startswith("<frozen"):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def _wrap_reader(name: str, method):
    def reader(self, *args, **kwargs):
        if getattr(_local, "reading", False):
            return method(self, *args, **kwargs)
        _local.reading = True
        try:
            result = method(self, *args, **kwargs)
        finally:
            _local.reading = False
        try:
            on_xla = self.device.type == "xla"
            if on_xla and name == "to":
                on_xla = result is not self and getattr(getattr(result, "device", None), "type", None) == "cpu"
            if on_xla:
                key = (_caller(), bool(getattr(_local, "in_closure", False)))
                with _lock:
                    _state["sites"][key] = _state["sites"].get(key, 0) + 1
        except Exception:  # a tensor-like without a device: not a read
            pass
        return result

    reader.__name__ = getattr(method, "__name__", name)
    reader.__doc__ = getattr(method, "__doc__", None)
    return reader


def _wrap_readers(torch) -> None:
    for name in _READERS:
        method = getattr(torch.Tensor, name, None)
        if method is not None:
            setattr(torch.Tensor, name, _wrap_reader(name, method))


# Patching torch_xla as it is imported ---------------------------------------------------------------------------


def _package_dir(module) -> str:
    return os.path.dirname(os.path.abspath(module.__file__)) + os.sep


def _library_dirs() -> list:
    """Where installed packages and the standard library live: frames there are not the user's."""
    import sysconfig

    folders = {sysconfig.get_paths().get(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    return sorted(os.path.abspath(folder) + os.sep for folder in folders if folder)


def _patch_torch_xla(torch_xla) -> None:
    import torch

    if "torch_xla" in _state["patched"]:
        return
    _state["patched"].add("torch_xla")
    hooks.patch_torch(torch)
    _state["skip_dirs"].append(_package_dir(torch_xla))
    module = sys.modules.get("torch_xla.torch_xla")  # where sync is defined (its own callers use that name)
    for owner in (torch_xla, module):
        if owner is not None and _marks_steps(getattr(owner, "sync", None)):
            owner.sync = _wrap_step_marker(owner.sync)
    _wrap_readers(torch)
    version = getattr(torch_xla, "__version__", None)
    _write({"event": "start", "torch_xla": version, "torch": torch.__version__,
            "skip_dirs": _state["skip_dirs"]})
    xm = sys.modules.get("torch_xla.core.xla_model")
    if xm is not None:
        _patch_xla_model(xm)


def _patch_xla_model(xm) -> None:
    if "xm" in _state["patched"]:
        return
    _state["patched"].add("xm")
    if _marks_steps(getattr(xm, "mark_step", None)):
        xm.mark_step = _wrap_step_marker(xm.mark_step)
    if hasattr(xm, "_run_step_closures"):
        xm._run_step_closures = _wrap_step_closures(xm._run_step_closures)
    if os.environ.get("XLA_METRICS_FILE"):
        _let_defval_through(xm)


def _let_defval_through(xm) -> None:
    """torch_xla 2.6.1's XLA_METRICS_FILE writer calls xm.get_local_ordinal(defval=-1), which 2.6.1 no longer
    accepts; let it take and ignore the keyword."""
    import inspect

    original = xm.get_local_ordinal
    if "defval" in inspect.signature(original).parameters:
        return

    def get_local_ordinal(*args, defval=None, **kwargs):
        return original(*args, **kwargs)

    xm.get_local_ordinal = get_local_ordinal


class PatchAfterImport(importlib.abc.MetaPathFinder):
    """Calls ``patches[name](module)`` right after the module ``name`` is first imported (and only then).
    The proof tier's step-serializing shim (tests/xla/sitecustomize.py, the sitecustomize this loader
    shadows and runs) takes it from here, so both patch torch_xla the same way."""

    def __init__(self, patches: dict) -> None:
        self.patches = patches

    def find_spec(self, name, path, target=None):
        patch = self.patches.get(name)
        if patch is None:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


# Deprecation warnings ---------------------------------------------------------------------------------------------


def _watch_warnings() -> None:
    # torch_xla 2.9 deprecates through typing_extensions.deprecated, whose warnings Python hides outside
    # __main__; show those that name XLA wherever they come from, and record them.
    for category in (DeprecationWarning, FutureWarning):
        warnings.filterwarnings("default", message=r"(?i).*xla", category=category)
    shown = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, (DeprecationWarning, FutureWarning)):
            where = f"{filename}:{lineno}"
            if filename.startswith(_HERE):  # a warning raised from a call the loader wraps: name the caller's line
                where = _caller(1)
            _write({"event": "warning", "category": category.__name__, "message": str(message), "where": where})
        return shown(message, category, filename, lineno, file, line)

    warnings.showwarning = showwarning


def _at_exit() -> None:
    if "torch_xla" in _state["patched"] and not _state["stopping"]:
        try:
            _write(_snapshot("exit", markers=_state["markers"], stopped=False))
        except Exception:  # torch_xla already torn down: the last marker's figures stand
            pass


def _run_shadowed_sitecustomize() -> None:
    """Another sitecustomize further down sys.path (a venv's, a distribution's) still runs."""
    paths = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", paths)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if _RECORD:
    import xla_migrate_verify_hooks as hooks  # the loader's second file, beside this one

    hooks.bind(sys.modules[__name__])
    sys.meta_path.insert(0, PatchAfterImport({"torch": hooks.patch_torch, "torch_xla": _patch_torch_xla,
                                              "torch_xla.core.xla_model": _patch_xla_model,
                                              "numpy.random": hooks.patch_numpy_random}))
    _state["skip_dirs"] += _library_dirs()
    hooks.patch_python_random()
    hooks.patch_argparse()
    _watch_warnings()
    atexit.register(_at_exit)
_run_shadowed_sitecustomize()
# The replica probe (verify sets XLA_REPLICA_PROBE_FILE for the XLA run only); a probe the shadowed
# sitecustomize installed already (the proof tier's copy) is left to record alone.
if _RECORD and os.environ.get("XLA_REPLICA_PROBE_FILE") and "replica_probe" not in sys.modules:
    import xla_migrate_replica_probe

    xla_migrate_replica_probe.install()
