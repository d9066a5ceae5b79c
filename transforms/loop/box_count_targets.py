"""XLA312's detection targets sized by the batch's box count (issue 30): a ``collate_fn`` that concatenates each
image's boxes into one ``(N, 6)`` tensor (``torch.cat(targets, 0)``, PyTorch-YOLOv3) or returns the per-image
``(n_i, 5)`` tensors as a list (ssd.pytorch's ``detection_collate``), whose targets a training loop moves to the
device. N (each n_i) is data: every distinct count is a new input shape, so a new compilation of the step
(measured: 12 compilations in 16 steps). The finding goes where the targets move (or, for a loop over a device
loader, at the collate), with the static form: pad to a fixed maximum number of boxes with a validity mask."""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from xla_migrate.analysis import shapes
from xla_migrate.analysis.facts import DATALOADERS, DEVICE_LOADERS
from xla_migrate.syntax import patterns
from xla_migrate.transforms.common import short

# Names that say a batch element holds detection targets (boxes, annotations, ground truth, labels of objects).
_TARGET_NAME = re.compile(r"box|target|ann|gt|obj|label|det", re.IGNORECASE)
_MOVES = ("to", "cuda")

BOX_FIX = ("pad each image's boxes to a fixed maximum (a constant of the script, e.g. MAX_BOXES = 100) in the "
           "collate: a (batch, MAX_BOXES, 6) tensor filled per image plus a validity mask (rows in use), and mask "
           "the loss with it (reduction='none' times the mask, divided by mask.sum()): one shape for every batch")


@dataclass(frozen=True)
class CountedElement:
    """Element ``index`` of what ``function`` (a collate) returns is sized by the batch's box count: ``node``
    is the ``torch.cat(...)`` or the list's name; ``how`` says which."""

    function: cst.FunctionDef
    index: int
    node: cst.CSTNode
    how: str


def counted_elements(ctx) -> list[CountedElement]:
    """The collate outputs whose first dimension is a count of the batch's items (see the module docstring)."""
    found: list[CountedElement] = []
    for function in shapes.collate_functions(ctx):
        for returned in patterns.find_all(function.body, lambda n: isinstance(n, cst.Return)):
            value = returned.value  # type: ignore[attr-defined]
            elements = [e.value for e in value.elements] if isinstance(value, cst.Tuple) else [value]
            for index, element in enumerate(elements):
                how = _counted(ctx, function, element) if element is not None else None
                if how is not None:
                    found.append(CountedElement(function, index, element, how))
    return found


def _counted(ctx, function: cst.FunctionDef, element: cst.BaseExpression) -> str | None:
    if isinstance(element, cst.Call) and "torch.cat" in ctx.qualnames(element.func):
        args = patterns.positional(element)
        dim = patterns.keyword(element, "dim")
        dim_value = dim.value if dim is not None else (args[1].value if len(args) > 1 else None)
        if dim_value is not None and not (isinstance(dim_value, cst.Integer) and dim_value.value == "0"):
            return None
        if args and _per_item_list(ctx, function, args[0].value, _TARGET_NAME):
            return "the images' boxes concatenated into one tensor"
    if isinstance(element, cst.Name) and _TARGET_NAME.search(element.value) and _per_item_list(
            ctx, function, element, None, tensors_only=True):
        return "a list of per-image box tensors"
    return None


def _per_item_list(ctx, function: cst.FunctionDef, node: cst.BaseExpression, name_hint: re.Pattern | None,
                   tensors_only: bool = False) -> bool:
    """``node`` is a list built per item of the batch (a comprehension, or a name the collate binds to one or to
    ``[]`` and appends to), whose items are not made one-row (``x.unsqueeze(0)``, ``x[None]``: a stack)."""
    if isinstance(node, (cst.ListComp, cst.GeneratorExp)):
        return _varying(ctx, node.elt, tensors_only)
    if not isinstance(node, cst.Name) or (name_hint is not None and not name_hint.search(node.value)):
        return False
    for assign in patterns.find_all(function.body, lambda n: isinstance(n, cst.Assign)):
        value = _bound_value(assign, node.value)  # type: ignore[arg-type]
        if value is None:
            continue
        if isinstance(value, cst.ListComp):
            return _varying(ctx, value.elt, tensors_only)
        if isinstance(value, cst.List) and not value.elements:
            appended = [patterns.positional(c)[0].value for c in patterns.find_all(function.body, lambda n: (
                patterns.method_call(n, "append") is not None and patterns.dotted_name(n.func.value) == node.value
                and len(patterns.positional(n)) == 1))]  # type: ignore[attr-defined]
            return bool(appended) and all(_varying(ctx, a, tensors_only) for a in appended)
    return False


def _bound_value(assign: cst.Assign, name: str) -> cst.BaseExpression | None:
    """What ``assign`` binds ``name`` to: ``x = v``, or ``a, x = [], []`` element by element."""
    for target in assign.targets:
        if patterns.dotted_name(target.target) == name:
            return assign.value
        if isinstance(target.target, cst.Tuple) and isinstance(assign.value, cst.Tuple) and len(
                target.target.elements) == len(assign.value.elements):
            for left, right in zip(target.target.elements, assign.value.elements):
                if patterns.dotted_name(left.value) == name:
                    return right.value
    return None


def _varying(ctx, item: cst.BaseExpression, tensors_only: bool) -> bool:
    if patterns.method_call(item, "unsqueeze", "view", "reshape") or (
            isinstance(item, cst.Subscript) and patterns.find_all(item.slice[0], lambda n: (
                isinstance(n, cst.Name) and n.value == "None"))):
        return False
    if not tensors_only:
        return True
    # A list returned as it is: only tensors (torch.FloatTensor(ann), torch.tensor(...), torch.cat(...)).
    return isinstance(item, cst.Call) and any(n.startswith("torch.") for n in ctx.qualnames(item.func))


@dataclass(frozen=True)
class CountedMove:
    """Where a training loop moves a counted collate output to the device (``node``), or the loop over a device
    loader that does (``node`` is the collate's element, reported there)."""

    node: cst.CSTNode
    element: CountedElement
    loop: cst.For


def counted_moves(ctx) -> list[CountedMove]:
    elements = counted_elements(ctx)
    if not elements:
        return []
    by_collate = {shapes.collate_name(ctx, e.function).rsplit(".", 1)[0]: e for e in elements}
    loaders = _loaders_with(ctx, by_collate)
    found: list[CountedMove] = []
    for loop in ctx.steps.training_loops:
        if not isinstance(loop, cst.For):
            continue
        iterated = ctx.steps.loop_iterable(loop)
        on_device = False
        if isinstance(iterated, cst.Call) and ctx.qualnames(iterated.func) & set(DEVICE_LOADERS):
            args = patterns.positional(iterated)
            iterated, on_device = (args[0].value if args else iterated), True
        element = loaders.get(patterns.dotted_name(iterated) or "") if not isinstance(iterated, cst.Call) else (
            _collate_of(ctx, iterated, by_collate))
        if element is None:
            continue
        name = _element_name(loop.target, element.index)
        move = _move_of(loop.body, name) if name is not None else None
        if move is not None:
            found.append(CountedMove(move, element, loop))
        elif on_device or ctx.steps.is_device_loader(iterated):
            found.append(CountedMove(element.node, element, loop))
    return found


def _collate_of(ctx, call: cst.Call, by_collate: dict[str, CountedElement]) -> CountedElement | None:
    if not ctx.qualnames(call.func) & set(DATALOADERS):
        return None
    collate = patterns.keyword(call, "collate_fn")
    if collate is None:
        return None
    value = collate.value.func if isinstance(collate.value, cst.Call) else collate.value
    name = patterns.dotted_name(value)
    return by_collate.get(name.rsplit(".", 1)[-1]) if name is not None else None


def _loaders_with(ctx, by_collate: dict[str, CountedElement]) -> dict[str, CountedElement]:
    """Names bound to a DataLoader whose ``collate_fn`` is a counted collate (``loader = DataLoader(...)``)."""
    found: dict[str, CountedElement] = {}
    for assign in patterns.find_all(ctx.module, lambda n: isinstance(n, cst.Assign) and isinstance(n.value, cst.Call)):
        element = _collate_of(ctx, assign.value, by_collate)  # type: ignore[attr-defined]
        if element is not None:
            for target in assign.targets:  # type: ignore[attr-defined]
                name = patterns.dotted_name(target.target)
                if name is not None:
                    found[name] = element
    return found


def _element_name(target: cst.BaseExpression, index: int) -> str | None:
    """The loop variable bound to element ``index`` of the batch (``for images, targets in loader``, through
    ``for i, (images, targets) in enumerate(loader)``)."""
    if isinstance(target, cst.Tuple):
        elements = [e.value for e in target.elements]
        if len(elements) == 2 and isinstance(elements[1], cst.Tuple):
            return _element_name(elements[1], index)
        if index < len(elements) and isinstance(elements[index], cst.Name):
            return elements[index].value  # type: ignore[attr-defined]
    return None


def _move_of(body: cst.CSTNode, name: str) -> cst.CSTNode | None:
    """``targets.cuda()``, ``targets.to(device)``, ``[ann.cuda() for ann in targets]``: the first in the body."""
    for node in patterns.find_all(body, lambda n: isinstance(n, (cst.Call, cst.ListComp))):
        if isinstance(node, cst.Call) and patterns.method_call(node, *_MOVES) and \
                patterns.dotted_name(node.func.value) == name:  # type: ignore[attr-defined]
            return node
        if isinstance(node, cst.ListComp) and patterns.dotted_name(node.for_in.iter) == name and patterns.find_all(
                node.elt, lambda n: patterns.method_call(n, *_MOVES) is not None):
            return node
    return None


def message(ctx, move: CountedMove) -> str:
    element = move.element
    collate = shapes.collate_name(ctx, element.function)
    line = ctx.position(element.node)[0]
    sized = ("each image's tensor has that image's box count as its first dimension" if "list" in element.how
             else "their first dimension is the batch's box count")
    return (f"{short(move.node)}: the batch's targets from {collate}() ({element.how} at line {line}: "
            f"{short(element.node, 40)}): {sized}, so every distinct count is a new input shape and a new "
            "compilation of the step")
