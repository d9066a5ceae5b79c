"""Batch elements a loop keeps on the host: the parts of a DataLoader's batch the program never moves to the
device and only collects (``labels.append(y)``) or converts (``y.numpy()``, ``y.tolist()``).

A device loader moves every element of the batch; an element the original left on the CPU then reaches its
host consumer (matplotlib, sklearn, numpy) as an XLA tensor: "can't convert xla:0 device type tensor to numpy"
(Atcold/NYU-DLSP20's VAE notebook collects the test labels for a t-SNE plot). Such a loop keeps its DataLoader
(``StepModel.gets_device_loader``) and gets the step barrier instead. Only names of a tuple target count
(``for x, y in loader``, ``for i, (x, y) in enumerate(loader)``); an element used any other way (passed to a
call, rebound, compared) is left to the device loader as before, since the program may move it elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from ...syntax import patterns

# Uses that neither move the value nor need it on the host.
_NEUTRAL_ATTRIBUTES = ("shape", "size", "numel", "dim", "dtype", "ndim")
# Methods that give the same value on the same device, whose result is classified in turn.
_PASS_ATTRIBUTES = ("detach", "clone", "long", "float", "int", "view", "reshape", "squeeze", "flatten")
_COLLECTORS = ("append", "extend")

Parent = Callable[[cst.CSTNode], cst.CSTNode | None]
Qualnames = Callable[[cst.CSTNode], frozenset[str]]


def batch_names(loop: cst.For, enumerated: bool) -> list[cst.Name]:
    """The names a tuple target binds from each batch (``enumerated``: the loop iterates ``enumerate(...)``,
    whose first element is the index)."""
    target = loop.target
    if enumerated:
        if not isinstance(target, (cst.Tuple, cst.List)) or len(target.elements) != 2:
            return []
        target = target.elements[1].value
    if not isinstance(target, (cst.Tuple, cst.List)):
        return []
    return [e.value for e in target.elements if isinstance(e.value, cst.Name) and e.value.value != "_"]


def host_kept(loop: cst.For, names: list[cst.Name], parent: Parent, qualnames: Qualnames) -> list[str]:
    """The names of ``names`` the loop body only collects or converts on the host (at least one such use,
    no other)."""
    kept = []
    for name in names:
        uses = patterns.find_all(loop.body, lambda node, n=name.value: isinstance(node, cst.Name) and node.value == n)
        kinds = {_use(use, parent, qualnames) for use in uses}
        if "sink" in kinds and kinds <= {"sink", "neutral"}:
            kept.append(name.value)
    return kept


def _use(node: cst.CSTNode, parent: Parent, qualnames: Qualnames) -> str:
    """"sink" (the value must be on the host: collected in a list, ``.numpy()``, a numpy function),
    "neutral" (fine on either device: its shape, ``len``, ``.cpu()``, ``.tolist()``) or "other"."""
    current = node
    while True:
        above = parent(current)
        if isinstance(above, cst.Attribute) and above.value is current:
            call = parent(above)
            is_call = isinstance(call, cst.Call) and call.func is above
            attr = above.attr.value
            if attr in _NEUTRAL_ATTRIBUTES or is_call and attr in ("cpu", "tolist", "item"):
                return "neutral"
            if is_call and attr == "numpy":
                return "sink"
            if attr == "data" or is_call and attr in _PASS_ATTRIBUTES:
                current = call if is_call else above
                continue
            return "other"  # .to(device), .cuda(), any other method
        if isinstance(above, cst.Arg) and above.keyword is None:
            call = parent(above)
            if isinstance(call, cst.Call):
                func = call.func
                if isinstance(func, cst.Name) and func.value == "len":
                    return "neutral"
                if isinstance(func, cst.Attribute) and func.attr.value in _COLLECTORS and len(call.args) == 1:
                    return "sink"
                if any(q.startswith("numpy.") for q in qualnames(func)):
                    return "sink"
            return "other"
        if isinstance(above, cst.Element):  # labels += [y]
            holder = parent(above)
            augmented = parent(holder) if isinstance(holder, cst.List) else None
            if isinstance(augmented, cst.AugAssign) and augmented.value is holder:
                return "sink"
        return "other"


def moves_to_a_device(loop: cst.For, is_device: Callable[[cst.BaseExpression], bool]) -> bool:
    """The loop body moves something to a device: ``.to(...)``, ``.cuda()``, a ``device=`` argument, or a call
    given a device (``prepare(batch, device)``, ``batch_to(self.device, batch)``). A loop over a DataLoader whose
    body does none of this runs its batches where the loader makes them, on the CPU: a notebook's first model,
    trained before it defines ``device``, or an evaluation helper written before the device existed."""
    def moves(node: cst.CSTNode) -> bool:
        if isinstance(node, cst.Call):
            if isinstance(node.func, cst.Attribute) and node.func.attr.value in ("to", "cuda", "to_device"):
                return True
            return any(arg.keyword is not None and arg.keyword.value == "device" or is_device(arg.value)
                       for arg in node.args)
        return False
    return bool(patterns.find_all(loop.body, moves))
