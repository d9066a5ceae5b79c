"""XLA312's host-random geometry on device tensors (issue 30): a slice of a device tensor whose bounds a
Python or NumPy random draw gives (a random crop in the step or a helper it calls), a known batch
augmentation that pastes a host-drawn box into the device batch (timm's ``Mixup`` with CutMix, torchvision's
``v2.CutMix``), and a coin toss per time step choosing what the next step computes (teacher forcing:
``x = trg[t] if random.random() < ratio else pred``). The bounds and the choices are constants of the
traced graph: a new compilation for each draw."""

from __future__ import annotations

import re

import libcst as cst

from xla_migrate.syntax import patterns

# Calls whose result is a host random number (what a crop offset is drawn with).
RANDOM_PREFIXES = ("random.", "numpy.random.")
# Batch augmentations that paste a box drawn on the host into the batch they are given.
CUTMIX_CLASSES = ("timm.data.Mixup", "timm.data.mixup.Mixup", "torchvision.transforms.v2.CutMix")
_AUGMENTATION_NAME = re.compile(r"mixup|cutmix", re.IGNORECASE)
_MOVES = ("to", "cuda")

CROP_FIX = ("crop on the host before the move (in the Dataset, or before .to(device)), or gather with device index "
            "tensors (torch.gather / index_select with offsets drawn by torch.randint on the device) so the "
            "offsets are data, not constants of the graph")
TOSS_FIX = ("decide once per batch (one toss before the loop: two graphs in all), or draw the tosses on the device "
            "(tf = torch.rand(steps, device=x.device) < ratio) and compute both inputs, selecting with "
            "torch.where(tf[t], trg[t], pred): one graph for every pattern of tosses")
CUTMIX_FIX = ("apply the mixup/cutmix on the host before the transfer (in a collate_fn or before .to(device) / the "
              "device loader: timm's Mixup runs on CPU tensors), or paste a fixed-size box with device-side offsets "
              "(a mask built from device random indices)")


def random_names(ctx, function: cst.CSTNode) -> set[str]:
    """Names the function's own code binds to a host random draw (``top = random.randint(0, h - p)``)."""
    names: set[str] = set()
    for assign in patterns.find_all(function, lambda n: isinstance(n, cst.Assign)):
        draws = patterns.find_all(assign.value, lambda n: is_draw(ctx, n))
        if draws:
            names.update(t.target.value for t in assign.targets if isinstance(t.target, cst.Name))
    return names


def is_draw(ctx, node: cst.CSTNode) -> bool:
    """A call whose result is a host random number (``random.random()``, ``np.random.rand()``)."""
    return isinstance(node, cst.Call) and any(q.startswith(RANDOM_PREFIXES) for q in ctx.qualnames(node.func))


def tossed(ctx, test: cst.BaseExpression, names: set[str]) -> bool:
    """A condition decided by a host random draw: it holds one (``random.random() < ratio``) or a name bound
    to one (``teacher_force``)."""
    return bool(patterns.find_all(test, lambda n: is_draw(ctx, n) or (isinstance(n, cst.Name) and n.value in names)))


def inner_loop(ctx, node: cst.CSTNode, stop: cst.CSTNode | None) -> cst.CSTNode | None:
    """The innermost ``for``/``while`` around ``node`` below ``stop`` (its function) that is not a step
    loop: a loop the step repeats (a decoder's time steps). None when a step loop is met first."""
    current = ctx.parent(node)
    while current is not None and current is not stop:
        if isinstance(current, (cst.For, cst.While)):
            return None if ctx.steps.loop(current) is not None else current
        current = ctx.parent(current)
    return None


def random_bounds(node: cst.Subscript, names: set[str]) -> bool:
    """A slice of the subscript has a bound that mentions one of ``names``."""
    for element in node.slice:
        if not isinstance(element.slice, cst.Slice):
            continue
        for bound in (element.slice.lower, element.slice.upper):
            if bound is not None and patterns.find_all(
                    bound, lambda n: isinstance(n, cst.Name) and n.value in names):
                return True
    return False


def tensor_like(node: cst.Subscript, tensors: set[str]) -> bool:
    """Indexed like a tensor: several dimensions or ``...`` (a list takes one), or a name known to hold one."""
    if len(node.slice) > 1 or any(isinstance(e.slice, cst.Index) and isinstance(e.slice.value, cst.Ellipsis)
                                  for e in node.slice):
        return True
    return patterns.dotted_name(node.value) in tensors


def cutmix_bindings(ctx) -> dict[str, cst.Call]:
    """Names bound to a batch augmentation that can paste a box: ``Mixup(...)`` with ``cutmix_alpha`` (or
    ``cutmix_minmax``) not zero, ``v2.CutMix(...)``."""
    found: dict[str, cst.Call] = {}
    for assign in patterns.find_all(ctx.module, lambda n: isinstance(n, cst.Assign) and isinstance(n.value, cst.Call)):
        call = assign.value
        if not ctx.qualnames(call.func) & set(CUTMIX_CLASSES):
            continue
        if "CutMix" not in (patterns.dotted_name(call.func) or "") and not _cutmix_on(call):
            continue
        for target in assign.targets:
            name = patterns.dotted_name(target.target)
            if name is not None:
                found[name] = call
    return found


def _cutmix_on(call: cst.Call) -> bool:
    alpha, minmax = patterns.keyword(call, "cutmix_alpha"), patterns.keyword(call, "cutmix_minmax")
    if minmax is not None and patterns.dotted_name(minmax.value) != "None":
        return True
    if alpha is None:
        return len(patterns.positional(call)) >= 2  # Mixup(mixup_alpha, cutmix_alpha, ...)
    return not (isinstance(alpha.value, (cst.Integer, cst.Float)) and float(alpha.value.value) == 0)


def is_cutmix_call(ctx, node: cst.Call, bindings: dict[str, cst.Call]) -> bool:
    """A call of a box-pasting augmentation: a name bound to one, or a name that says so (``mixup_fn``
    handed in as a parameter) in a module that imports timm's Mixup or torchvision's CutMix."""
    name = patterns.dotted_name(node.func)
    if name is None or len(node.args) < 1:
        return False
    if name in bindings:
        return True
    if not _AUGMENTATION_NAME.search(name.rsplit(".", 1)[-1]):
        return False
    return any(q.startswith(CUTMIX_CLASSES) for q in _imported(ctx)) and name not in _all_bound(ctx)


def _imported(ctx) -> set[str]:
    names: set[str] = set()
    for node in patterns.find_all(ctx.module, lambda n: isinstance(n, (cst.Name, cst.Attribute))):
        if isinstance(node, cst.Name) and node.value in ("Mixup", "CutMix"):
            names |= set(ctx.qualnames(node))
    return names


def _all_bound(ctx) -> set[str]:
    """Names bound by an assignment anywhere in the module (a bound name is known, not guessed from its name)."""
    return {patterns.dotted_name(t.target) for a in patterns.find_all(ctx.module, lambda n: isinstance(n, cst.Assign))
            for t in a.targets} - {None}


def moved_to_device(ctx, node: cst.Call, scope: cst.CSTNode) -> bool:
    """An argument of the call was moved to a device before it in ``scope`` (``x = x.to(device)``)."""
    arguments = {patterns.dotted_name(a.value) for a in node.args} - {None}
    start = ctx.position(node)
    for assign in patterns.find_all(scope, lambda n: isinstance(n, cst.Assign)):
        if ctx.position(assign) >= start or not patterns.find_all(
                assign.value, lambda n: isinstance(n, cst.Call) and patterns.method_call(n, *_MOVES) is not None):
            continue
        bound: set[str | None] = set()
        for target in assign.targets:
            elements = target.target.elements if isinstance(target.target, (cst.Tuple, cst.List)) else None
            bound |= {patterns.dotted_name(e.value) for e in elements} if elements else {
                patterns.dotted_name(target.target)}
        if bound & arguments:
            return True
    return False
