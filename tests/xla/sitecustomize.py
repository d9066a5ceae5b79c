"""Test-only shim for the proof tier (tests/xla). NEVER part of the product or its output.

The harness copies this file into a temporary folder and puts that folder first on PYTHONPATH of the interpreter
that runs a migrated script, so Python imports it at start-up. It only observes, except where asked to
serialize replicas:

- XLA_PROOF_FINAL_METRICS=path: at exit, when torch_xla was imported, write torch_xla's final metrics report
  there (XLA_METRICS_FILE only writes at step markers, so reads and runs after the last one would be missed).
  A script whose replicas run in a spawned child (torch_xla.launch, xmp.spawn) has none: the child ends
  through os._exit; the harness then uses the last XLA_METRICS_FILE block.
- XLA_PROOF_CLOSURE_READS=path: count the host reads (aten::_local_scalar_dense) made inside functions given to
  xm.add_step_closure, and write the count to path.<pid> after each closure; the harness subtracts them to get
  the reads made outside step closures.
- XLA_METRICS_FILE set, torch_xla 2.6.1 only: its metrics writer calls xm.get_local_ordinal(defval=-1), a
  keyword 2.6.1 removed, so every step marker raises TypeError; the shim lets the keyword through.
- XLA_PROOF_SERIALIZE_STEPS=1: with several replicas as threads of one process (PJRT CPU, CPU_NUM_DEVICES=N),
  let the replicas enter torch_xla's step marker strictly in turn (ordinal 0, 1, ..., N-1, 0, ...), so their
  collectives rendezvous (see docs/proof.md, "Two replicas"); without it the replicas deadlock in their first
  all-reduce. (The replicas share torch's global RNG: scripts run this way seed from a local generator.)
- XLA_PROOF_STEP_TIMES=path: append to path.<pid> when each step marker returns (benchmarks/xla_step.py
  computes steps per second after warm-up from them).
"""

import atexit
import importlib.abc
import importlib.util
import os
import sys
import threading
import time

_closure_reads = [0]
_lock = threading.Lock()


def _reads():
    import torch_xla.debug.metrics as met

    return met.counter_value("aten::_local_scalar_dense") or 0


def _write_closure_reads():
    # Per process, and at every closure: a replica launched in a spawned child exits through os._exit,
    # which skips atexit.
    with open(f"{os.environ['XLA_PROOF_CLOSURE_READS']}.{os.getpid()}", "w") as handle:
        handle.write(str(_closure_reads[0]))


def _patch_xla_model(xm):
    if getattr(xm, "_xla_proof_patched", False):
        return
    xm._xla_proof_patched = True
    if os.environ.get("XLA_METRICS_FILE"):
        _fix_metrics_file(xm)
    if os.environ.get("XLA_PROOF_CLOSURE_READS"):
        original = xm.add_step_closure

        def add_step_closure(closure, args=(), run_async=False):
            def counted(*a, **k):
                before = _reads()
                try:
                    return closure(*a, **k)
                finally:
                    with _lock:
                        _closure_reads[0] += _reads() - before
                        _write_closure_reads()

            return original(counted, args=args, run_async=run_async)

        xm.add_step_closure = add_step_closure
    if _WRAP_STEPS:
        xm.mark_step = _step_marker(xm.mark_step)


def _patch_torch_xla(torch_xla):
    if _WRAP_STEPS and hasattr(torch_xla, "sync"):
        torch_xla.sync = _step_marker(torch_xla.sync)
    xm = sys.modules.get("torch_xla.core.xla_model")
    if xm is not None:
        _patch_xla_model(xm)


def _fix_metrics_file(xm):
    """torch_xla 2.6.1's XLA_METRICS_FILE writer calls xm.get_local_ordinal(defval=-1), which 2.6.1 no longer
    accepts (TypeError at the first step marker); let it take and ignore the keyword."""
    import inspect

    original = xm.get_local_ordinal
    if "defval" in inspect.signature(original).parameters:
        return

    def get_local_ordinal(*args, defval=None, **kwargs):
        return original(*args, **kwargs)

    xm.get_local_ordinal = get_local_ordinal


_SERIALIZE = os.environ.get("XLA_PROOF_SERIALIZE_STEPS") == "1"
_TIMES = os.environ.get("XLA_PROOF_STEP_TIMES")
_WRAP_STEPS = _SERIALIZE or bool(_TIMES)
_turn = threading.Condition()
_state = {"next": 0}
_inside = threading.local()


def _step_marker(step_marker):
    """Wraps a step marker (xm.mark_step, torch_xla.sync): records when each step marker returns (for the
    benchmark) and, with XLA_PROOF_SERIALIZE_STEPS=1, lets the replicas (threads of one process) enter it in
    ordinal order, one at a time. In 2.9 xm.mark_step calls torch_xla.sync: a nested call goes straight
    through."""

    def wrapper(*args, **kwargs):
        if getattr(_inside, "depth", 0):
            return step_marker(*args, **kwargs)
        ordinal = world = None
        if _SERIALIZE:
            import torch_xla.runtime as xr

            ordinal, world = xr.global_ordinal(), xr.world_size()
            with _turn:
                _turn.wait_for(lambda: _state["next"] == ordinal)
        _inside.depth = 1
        try:
            return step_marker(*args, **kwargs)
        finally:
            _inside.depth = 0
            if _TIMES:
                # Appended at every marker, per process: a spawned replica process skips atexit.
                with open(f"{_TIMES}.{os.getpid()}", "a") as handle:
                    handle.write(f"{time.perf_counter()!r}\n")
            if _SERIALIZE:
                with _turn:
                    _state["next"] = (ordinal + 1) % world
                    _turn.notify_all()

    return wrapper


class _Finder(importlib.abc.MetaPathFinder):
    """Patches torch_xla and torch_xla.core.xla_model right after they are first imported (and only then)."""

    names = {"torch_xla": _patch_torch_xla, "torch_xla.core.xla_model": _patch_xla_model}

    def find_spec(self, name, path, target=None):
        patch = self.names.get(name)
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


def _at_exit():
    if "torch_xla" not in sys.modules:
        return
    final = os.environ.get("XLA_PROOF_FINAL_METRICS")
    if final:
        import torch_xla.debug.metrics as met

        with open(final, "w") as handle:
            handle.write(met.metrics_report())


if os.environ.get("XLA_PROOF_FINAL_METRICS") or os.environ.get("XLA_PROOF_CLOSURE_READS") or _WRAP_STEPS:
    sys.meta_path.insert(0, _Finder())
    atexit.register(_at_exit)
