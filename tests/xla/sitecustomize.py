"""Test-only shim for the proof tier (tests/xla). NEVER part of the product or its output.

The harness copies this file into a temporary folder that goes on PYTHONPATH after xla-migrate verify's own
loader (src/xla_migrate/verify/child.py, which records the metrics and then runs this file). It does two
things, each only when asked:

- XLA_REPLICA_PROBE_FILE=path: install the replica checker's probe (src/xla_migrate/verify/replica_probe.py,
  which the harness copies beside this file): one line per optimizer update in ``path`` says whether its
  gradients were all-reduced since the backward and whether the replicas started from broadcast weights.
- XLA_PROOF_SERIALIZE_STEPS=1: with several replicas as threads of one process (PJRT CPU, CPU_NUM_DEVICES=N),
  let the replicas enter torch_xla's step marker strictly in turn (ordinal 0, 1, ..., N-1, 0, ...), so their
  collectives rendezvous (see docs/proof.md, "Two replicas"); without it the replicas deadlock in their first
  all-reduce. (The replicas share torch's global RNG: scripts run this way seed from a local generator.)
- XLA_PROOF_SHARDING_FILE=path: write the sharding (``torch_xla._XLAC._get_xla_sharding_spec``) and shape of
  every tensor of the first batch a device loader delivers (``batch<TAB>shape<TAB>spec`` lines) and of every
  parameter an FSDPv2 wrapper holds once built (``param<TAB>...``): the spmd form's proof,
  tests/xla/test_spmd_proof.py.
"""

import os
import sys
import threading

_turn = threading.Condition()
_state = {"next": 0}
_inside = threading.local()


def _step_marker(step_marker):
    """Lets the replicas (threads of one process) enter a step marker (xm.mark_step, torch_xla.sync) in ordinal
    order, one at a time. In 2.9 xm.mark_step calls torch_xla.sync: a nested call goes straight through."""

    def wrapper(*args, **kwargs):
        if getattr(_inside, "depth", 0):
            return step_marker(*args, **kwargs)
        import torch_xla.runtime as xr

        ordinal, world = xr.global_ordinal(), xr.world_size()
        with _turn:
            _turn.wait_for(lambda: _state["next"] == ordinal)
        _inside.depth = 1
        try:
            return step_marker(*args, **kwargs)
        finally:
            _inside.depth = 0
            with _turn:
                _state["next"] = (ordinal + 1) % world
                _turn.notify_all()

    return wrapper


def _patch_xla_model(xm):
    if not getattr(xm, "_xla_proof_patched", False):
        xm._xla_proof_patched = True
        xm.mark_step = _step_marker(xm.mark_step)


def _patch_torch_xla(torch_xla):
    if hasattr(torch_xla, "sync"):
        torch_xla.sync = _step_marker(torch_xla.sync)
    xm = sys.modules.get("torch_xla.core.xla_model")
    if xm is not None:
        _patch_xla_model(xm)


if os.environ.get("XLA_PROOF_SERIALIZE_STEPS") == "1":
    # The verify loader runs this file as the sitecustomize it shadows; its import hook is the one to use.
    loader = sys.modules.get("sitecustomize")
    if not hasattr(loader, "PatchAfterImport"):
        raise RuntimeError("tests/xla/sitecustomize.py runs only after xla-migrate verify's loader")
    sys.meta_path.insert(0, loader.PatchAfterImport({"torch_xla": _patch_torch_xla,
                                                     "torch_xla.core.xla_model": _patch_xla_model}))

if os.environ.get("XLA_REPLICA_PROBE_FILE"):
    import replica_probe

    replica_probe.install()


def _record_first_batch(parallel_loader):
    """Wraps the device loader's ``__next__`` to write the first batch's shardings to XLA_PROOF_SHARDING_FILE."""
    loader_class = parallel_loader.PerDeviceLoader
    original = loader_class.__next__
    done = []

    def __next__(self):
        batch = original(self)
        if not done:
            done.append(True)
            import torch
            import torch_xla

            tensors = batch if isinstance(batch, (list, tuple)) else list(batch.values()) if isinstance(
                batch, dict) else [batch]
            _write_shardings("batch", [t for t in tensors if isinstance(t, torch.Tensor)])
        return batch

    loader_class.__next__ = __next__


def _write_shardings(kind, tensors):
    import torch_xla

    with open(os.environ["XLA_PROOF_SHARDING_FILE"], "a") as handle:
        for tensor in tensors:
            handle.write(f"{kind}\t{list(tensor.shape)}\t{torch_xla._XLAC._get_xla_sharding_spec(tensor)}\n")


def _record_fsdpv2_parameters(module):
    """Wraps SpmdFullyShardedDataParallel's ``__init__`` to write its parameters' shardings once it is built."""
    wrapper = module.SpmdFullyShardedDataParallel
    original = wrapper.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _write_shardings("param", list(self.parameters()))

    wrapper.__init__ = __init__


if os.environ.get("XLA_PROOF_SHARDING_FILE"):
    loader = sys.modules.get("sitecustomize")
    if not hasattr(loader, "PatchAfterImport"):
        raise RuntimeError("tests/xla/sitecustomize.py runs only after xla-migrate verify's loader")
    sys.meta_path.insert(0, loader.PatchAfterImport({
        "torch_xla.distributed.parallel_loader": _record_first_batch,
        "torch_xla.experimental.spmd_fully_sharded_data_parallel": _record_fsdpv2_parameters}))
