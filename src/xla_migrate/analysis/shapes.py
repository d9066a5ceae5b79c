"""Batch shapes that change from step to step (issue 30, point 3).

XLA compiles one graph per set of input shapes. Besides a smaller last batch and data-dependent sizes
(XLA312), two shapes give a new graph at nearly every step:

- a ``collate_fn`` (a function, or a collate object's ``__call__``) that pads each batch to its own longest
  sequence (``pad_sequence(seqs, batch_first=True)``, ``max(len(s) for s in batch)``; detection collators
  padding images to the batch's largest): one graph per distinct length (measured: 14 compilations where a fixed length gives 2). Where the script has its own
  maximum length (a module-level ``MAX_LEN = 64``, ``max_seq_len``, ``block_size``...), ``pad_sequence`` pads
  to it: a zero sequence of that length joins the batch and is dropped again, so the batch's longest is that
  length (``[*seqs, seqs[0].new_zeros((MAX_LEN, *seqs[0].shape[1:]))]`` ... ``[:-1]``). Models that mask the
  padding compute the same; a model that reads the padding (a mean over every position, an RNN's last state)
  does not, hence a review-safety fix;
- a corpus kept on the device and sliced with Python offsets inside the loop (``source[i:i + seq_len]``, the
  word-language-model ``batchify``/``get_batch`` shape): the offsets are constants of the graph, so every
  offset is a new graph (about 3,000 for one wikitext-2 epoch). The corpus stays on the host (``batchify``
  returns it unmoved) and each slice moves to the device (``get_batch`` returns ``data.to(device)``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from ..syntax import patterns
from .facts import DATALOADERS

if TYPE_CHECKING:
    from ..engine.context import MigrationContext

PAD_SEQUENCE = ("torch.nn.utils.rnn.pad_sequence",)
COLLATE_CLASS_NAME = re.compile(r"collat", re.IGNORECASE)  # PadCollate, TextMelCollate, BatchCollator
MAX_LENGTH_NAME = re.compile(r"^(max_?(seq(uence)?_?)?len(gth)?|max_?seq|block_?size|seq(uence)?_?len(gth)?|"
                             r"context_?len(gth)?|maxlen|max_?tokens)$", re.IGNORECASE)


@dataclass(frozen=True)
class PaddedCollate:
    """A collate function that pads to the batch's longest: ``pad`` (a ``pad_sequence`` call, rewritten when
    ``length`` names the script's maximum length) or ``maximum`` (``max(len(...) ...)``, reported)."""

    function: cst.FunctionDef
    node: cst.Call
    kind: str  # "pad_sequence" or "max"
    length: str | None = None


@dataclass(frozen=True)
class DeviceCorpus:
    """``batchify`` returns ``moved`` (``data.to(device)``); ``get_batch`` slices its parameter with Python
    offsets and returns ``returned``: the corpus stays on the host, the slices move."""

    producer: cst.FunctionDef
    move: cst.Call
    slicer: cst.FunctionDef
    slices: tuple[cst.Subscript, ...]
    returned: cst.Return | None


def collate_functions(ctx: MigrationContext) -> list[cst.FunctionDef]:
    """Functions of this module given to a DataLoader as ``collate_fn=``: a function by name, or the
    ``__call__`` of an object of a class of this module (``collate_fn=PadCollate()``, or ``collate_fn=collate``
    with ``collate = PadCollate()`` bound in the module); and the ``__call__`` of a class whose name says it
    collates, which another module hands to its loader (vits ``TextAudioCollate``, tacotron2 ``TextMelCollate``
    in data_utils.py, used by train.py)."""
    names: set[str] = set()
    classes: set[str] = set()
    for call in patterns.find_all(ctx.module, lambda n: isinstance(n, cst.Call)):
        if not ctx.qualnames(call.func) & set(DATALOADERS):  # type: ignore[attr-defined]
            continue
        collate = patterns.keyword(call, "collate_fn")  # type: ignore[arg-type]
        if collate is None:
            continue
        made = collate.value.func if isinstance(collate.value, cst.Call) else None
        name = patterns.dotted_name(made if made is not None else collate.value)
        if name is not None:
            (classes if made is not None else names).add(name.rsplit(".", 1)[-1])
    classes |= _instance_classes(ctx, names)
    functions = [f for f in patterns.find_all(ctx.module, lambda n: isinstance(n, cst.FunctionDef))
                 if f.name.value in names]  # type: ignore[attr-defined]
    return functions + [method for owner in patterns.find_all(ctx.module, lambda n: isinstance(n, cst.ClassDef) and (
        n.name.value in classes or COLLATE_CLASS_NAME.search(n.name.value)))  # type: ignore[attr-defined]
        for method in owner.body.body  # type: ignore[attr-defined]
        if isinstance(method, cst.FunctionDef) and method.name.value == "__call__"]


def collate_name(ctx: MigrationContext, function: cst.FunctionDef) -> str:
    """``pad_collate`` or, for a collate class, ``PadCollate.__call__``."""
    block = ctx.parent(function)  # type: ignore[attr-defined]
    owner = ctx.parent(block) if block is not None else None  # type: ignore[attr-defined]
    name = function.name.value
    return f"{owner.name.value}.{name}" if isinstance(owner, cst.ClassDef) else name


def _instance_classes(ctx: MigrationContext, names: set[str]) -> set[str]:
    """The classes that ``names`` are bound to objects of (``collate = TextAudioCollate()``)."""
    classes: set[str] = set()
    for assign in patterns.find_all(ctx.module, lambda n: isinstance(n, cst.Assign) and isinstance(n.value, cst.Call)):
        made = patterns.dotted_name(assign.value.func)  # type: ignore[attr-defined]
        if made is not None and any(patterns.dotted_name(t.target) in names
                                    for t in assign.targets):  # type: ignore[attr-defined]
            classes.add(made.rsplit(".", 1)[-1])
    return classes


def padded_collates(ctx: MigrationContext) -> list[PaddedCollate]:
    """Once per file (two rules ask; each call walks the whole module twice)."""
    return ctx.once(padded_collates, lambda: _padded_collates(ctx))  # type: ignore[return-value]


def _padded_collates(ctx: MigrationContext) -> list[PaddedCollate]:
    length = max_length_constant(ctx)
    found: list[PaddedCollate] = []
    for function in collate_functions(ctx):
        for call in patterns.find_all(function.body, lambda n: isinstance(n, cst.Call)):
            names = ctx.qualnames(call.func)  # type: ignore[attr-defined]
            if names & set(PAD_SEQUENCE):
                found.append(PaddedCollate(function, call, "pad_sequence", length))  # type: ignore[arg-type]
            elif "builtins.max" in names and _over_lengths(ctx, call):  # type: ignore[arg-type]
                found.append(PaddedCollate(function, call, "max"))  # type: ignore[arg-type]
    return found


def _over_lengths(ctx: MigrationContext, call: cst.Call) -> bool:
    """``max(len(s) for s in batch)``, ``max(x.size(0) for x in ...)``, ``max(img.shape[1] ...)``."""
    return bool(patterns.find_all(call, lambda n: (isinstance(n, cst.Call) and (
        "builtins.len" in ctx.qualnames(n.func) or bool(patterns.method_call(n, "size")))) or (
        isinstance(n, cst.Attribute) and n.attr.value == "shape")))


def max_length_constant(ctx: MigrationContext) -> str | None:
    """A module-level ``NAME = <int>`` whose name says it is the script's maximum sequence length."""
    for statement in ctx.module.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target,
                                                                                         cst.Name):
                name = small.targets[0].target.value
                if MAX_LENGTH_NAME.match(name) and isinstance(small.value, cst.Integer):
                    return name
    return None


# A corpus on the device, sliced with Python offsets -------------------------------------------------------


def device_corpora(ctx: MigrationContext) -> list[DeviceCorpus]:
    """Once per file (two rules ask): ``_device_corpora``."""
    return ctx.once(device_corpora, lambda: _device_corpora(ctx))  # type: ignore[return-value]


def _device_corpora(ctx: MigrationContext) -> list[DeviceCorpus]:
    """The ``batchify``/``get_batch`` shape (see the module docstring): a module-level function that returns
    ``x.to(device)``, whose results are passed to a module-level function that slices that parameter with
    a Python offset (``source[i:i + n]``, ``source[i + 1:...]``) inside a loop of the caller."""
    functions = {f.name.value: f for f in ctx.module.body if isinstance(f, cst.FunctionDef)}
    producers: dict[str, tuple[cst.FunctionDef, cst.Call]] = {}
    for name, function in functions.items():
        returns = patterns.find_all(function.body, lambda n: isinstance(n, cst.Return))
        if len(returns) != 1:
            continue
        value = returns[0].value  # type: ignore[attr-defined]
        if isinstance(value, cst.Call) and patterns.method_call(value, "to", "cuda") and _device_argument(value):
            producers[name] = (function, value)
    if not producers:
        return []
    corpus_names = _names_bound_to(ctx, set(producers))
    if not _only_sliced_elsewhere(ctx, corpus_names):
        return []  # the corpus is used on the device directly: it has to stay there (XLA312 reports the slices)
    found: list[DeviceCorpus] = []
    for name, function in functions.items():
        params = [p.name.value for p in function.params.params]
        if not params:
            continue
        slices = tuple(s for s in patterns.find_all(function.body, lambda n: isinstance(n, cst.Subscript))
                       if _offset_slice(s, params[0]))  # type: ignore[arg-type]
        if not slices or not _called_with(ctx, name, corpus_names):
            continue
        returns = patterns.find_all(function.body, lambda n: isinstance(n, cst.Return))
        returned = returns[0] if len(returns) == 1 else None
        for producer, move in producers.values():
            found.append(DeviceCorpus(producer, move, function, slices, returned))  # type: ignore[arg-type]
    return found


def _only_sliced_elsewhere(ctx: MigrationContext, names: set[str]) -> bool:
    """Every use of the corpus names hands them to a function (the batch function, or one that passes them on)
    or asks their size (``len(x)``, ``x.size(0)``, ``x.shape``): nothing computes with them on the device."""
    for name in patterns.find_all(ctx.module, lambda n: isinstance(n, cst.Name) and n.value in names):
        parent = ctx.parent(name)
        if isinstance(parent, cst.AssignTarget) or (isinstance(parent, cst.Arg) and parent.value is name):
            continue
        if isinstance(parent, cst.Attribute) and parent.value is name and parent.attr.value in ("size", "shape",
                                                                                              "dim", "ndim"):
            continue
        return False
    return True


def _device_argument(call: cst.Call) -> bool:
    if patterns.method_call(call, "cuda"):
        return True
    args = call.args
    if not args:
        return False
    name = patterns.dotted_name(args[0].value) or ""
    return "device" in name.lower() or patterns.string_value(args[0].value) in ("cuda",)


def _offset_slice(node: cst.Subscript, parameter: str) -> bool:
    """``parameter[i:i + n]`` with Python arithmetic for the bounds (not a constant slice)."""
    if not (isinstance(node.value, cst.Name) and node.value.value == parameter) or not node.slice:
        return False
    first = node.slice[0].slice
    return isinstance(first, cst.Slice) and first.lower is not None and not isinstance(first.lower, cst.Integer)


def _names_bound_to(ctx: MigrationContext, producers: set[str]) -> set[str]:
    names: set[str] = set()
    for assign in patterns.find_all(ctx.module, lambda n: isinstance(n, cst.Assign)):
        value = assign.value  # type: ignore[attr-defined]
        if isinstance(value, cst.Call) and patterns.dotted_name(value.func) in producers:
            for target in assign.targets:  # type: ignore[attr-defined]
                if isinstance(target.target, cst.Name):
                    names.add(target.target.value)
    return names


def _called_with(ctx: MigrationContext, function: str, corpus: set[str]) -> bool:
    """``get_batch(train_data, i)`` somewhere, in a loop, with a corpus name or a parameter passed one."""
    for call in patterns.find_all(ctx.module, lambda n: isinstance(n, cst.Call) and patterns.dotted_name(
            n.func) == function):
        args = patterns.positional(call)  # type: ignore[arg-type]
        if not args:
            continue
        if not _in_loop(ctx, call):
            continue
        name = patterns.dotted_name(args[0].value)
        if name is not None and (name in corpus or _parameter(ctx, call, name)):
            return True
    return False


def _in_loop(ctx: MigrationContext, node: cst.CSTNode) -> bool:
    current = ctx.parent(node)
    while current is not None and not isinstance(current, (cst.FunctionDef, cst.Module)):
        if isinstance(current, (cst.For, cst.While)):
            return True
        current = ctx.parent(current)
    return False


def _parameter(ctx: MigrationContext, node: cst.CSTNode, name: str) -> bool:
    """``name`` is a parameter of the function around ``node`` (``def train(source): get_batch(source, i)``)."""
    current = ctx.parent(node)
    while current is not None and not isinstance(current, cst.FunctionDef):
        current = ctx.parent(current)
    return isinstance(current, cst.FunctionDef) and any(p.name.value == name for p in current.params.params)


def offset_slices(ctx: MigrationContext) -> list[cst.Subscript]:
    """In a step loop's body: ``data[i:i + bs]`` of a tensor moved to the device before the loop
    (``data = x.to(device)``, ``torch.randn(..., device=device)``), with bounds computed from the loop's own
    variables: each offset is a constant of a new graph."""
    found: list[cst.Subscript] = []
    moves: dict[int, list] = {}  # per scope, computed once: a walk per loop made this quadratic
    for step in ctx.steps.loops.values():
        loop = step.loop
        loop_names = _loop_variables(loop)
        if not loop_names:
            continue
        on_device = _device_tensors(ctx, step.function, loop, moves)
        for node in patterns.find_all(loop.body, lambda n: isinstance(n, cst.Subscript)):
            value = node.value  # type: ignore[attr-defined]
            if not (isinstance(value, cst.Name) and value.value in on_device):
                continue
            for element in node.slice:  # type: ignore[attr-defined]
                bound = element.slice
                if isinstance(bound, cst.Slice) and any(
                        part is not None and not isinstance(part, cst.Integer) and any(
                            n.value in loop_names for n in patterns.find_all(part, lambda n: isinstance(n, cst.Name)))
                        for part in (bound.lower, bound.upper)):
                    found.append(node)  # type: ignore[arg-type]
                    break
    return found


def _loop_variables(loop: cst.CSTNode) -> set[str]:
    names: set[str] = set()
    if isinstance(loop, cst.For):
        names.update(n.value for n in patterns.find_all(loop.target, lambda n: isinstance(n, cst.Name)))
    for target in patterns.find_all(loop.body, lambda n: isinstance(n, (cst.AssignTarget, cst.AugAssign))):
        bound = target.target  # type: ignore[attr-defined]
        if isinstance(bound, cst.Name):
            names.add(bound.value)
    return names


def _device_tensors(ctx: MigrationContext, function, loop: cst.CSTNode, moves: dict[int, list]) -> set[str]:
    """Names bound before ``loop`` (in its function, or at module level) to a tensor on the device.
    ``moves`` caches each scope's device assignments (position, names) across the loops of one file."""
    names: set[str] = set()
    scopes = [function.body] if function is not None else []
    scopes.append(ctx.module)
    loop_start = ctx.position(loop)
    for scope in scopes:
        found = moves.get(id(scope))
        if found is None:
            found = moves[id(scope)] = _device_moves(ctx, scope)
        for position, bound in found:
            if position < loop_start:
                names.update(bound)
    return names


def _device_moves(ctx: MigrationContext, scope: cst.CSTNode) -> list:
    """(position, names bound) of each assignment in ``scope`` of a tensor moved to or made on the device."""
    found = []
    for assign in patterns.find_all(scope, lambda n: isinstance(n, cst.Assign)):
        value = assign.value  # type: ignore[attr-defined]
        if not isinstance(value, cst.Call):
            continue
        moved = (patterns.method_call(value, "to", "cuda") and _device_argument(value)) or (
            patterns.keyword(value, "device") is not None and any(
                q.startswith("torch.") for q in ctx.qualnames(value.func)))
        if moved:
            bound = [t.target.value for t in assign.targets if isinstance(t.target, cst.Name)]  # type: ignore[attr-defined]
            found.append((ctx.position(assign), bound))
    return found
