"""XLA409 torch-load-map-location: checkpoints mapped to a CUDA device load on the CPU instead.

What it does:
    Rewrites the ``map_location`` of ``torch.load`` when it names a device that is CUDA's in the input and
    so the XLA device in the output: ``"cuda"``, ``"cuda:0"``, ``f"cuda:{rank}"``, ``"cuda:{}".format(gpu)``,
    ``"cuda:%d" % rank``, ``torch.device("cuda", rank)``, any ``torch.device(...)``, ``{"cuda:0":
    f"cuda:{rank}"}``, a ``lambda storage, loc: storage.cuda(rank)``, a name bound to one of those in the
    same function (``loc = f"cuda:{gpu}"``), the script's device variable or a ``device`` parameter
    (``map_location=device``), a device attribute or option (``self.device``, ``args.device``), or a helper
    that returns the device (``dist_util.dev()``, ``get_device()``, ``xm.xla_device()``) ->
    ``map_location="cpu"``. When the loaded value (or a part of it, ``torch.load(p)["state_dict"]``) goes
    into ``load_state_dict`` or peft's ``set_peft_model_state_dict`` (directly, or through the name it is
    assigned to, or returned by a loading helper whose every call does so: hifi-gan's ``load_checkpoint``)
    nothing else is needed: loading
    a state dict copies each tensor onto the device of the parameter it fills. Otherwise a finding says to
    move the loaded tensors to the device. The device's string or type (``str(device)``, ``f"{device}"``,
    ``device.type``) counts as the device. Applies to every script, distributed or not.

    A ``torch.load`` without a ``map_location`` whose value goes into ``load_state_dict`` gets
    ``map_location="cpu"`` too (not in code that already runs on XLA, whose checkpoints ``xm.save`` wrote on
    the CPU; not a whole pickled module used as loaded, which the program may have saved from the XLA device
    itself and must get back there, TCN's ``model = torch.load(f)``): without one, torch
    restores each storage onto the device it was saved from, and what a CUDA program saved (its own
    checkpoints, a published pretrained model) names a CUDA device that an XLA host does not have ("Attempting
    to deserialize object on a CUDA device but torch.cuda.is_available() is False"). So does a load of whole
    pickled models read out of it (``decoder = checkpoint["decoder"]``) when every one of them is moved with
    ``.to(device)`` before use (image captioning's eval.py).

Why:
    There is no CUDA device on XLA, so a CUDA ``map_location`` fails, and ``torch.load`` cannot restore
    onto an XLA device either ("don't know how to restore data location ... (tagged with xla:0)", torch_xla
    2.6.1 and 2.9), so every resume would crash. Loading onto the XLA device directly
    is not the fix either: every worker would hold a second copy of the checkpoint on its device. The CPU
    copy is moved into place by ``load_state_dict``.

Example:
    checkpoint = torch.load(path, map_location=f"cuda:{local_rank}")
    model.load_state_dict(checkpoint["model"])

Use instead:
    checkpoint = torch.load(path, map_location="cpu")
    model.load_state_dict(checkpoint["model"])
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import Scope

from xla_migrate.syntax import patterns
from xla_migrate.analysis.facts import is_cuda_device_expr, is_xla_device_expr
from xla_migrate.analysis.values import bound_values
from xla_migrate.engine.rule import ALL_TARGETS, Rule
from xla_migrate.transforms.common import short, with_keyword

LOADS = ("torch.load", "torch.serialization.load")
# Functions that copy a state dict into a model's parameters (each onto its parameter's device).
STATE_DICT_LOADERS = ("set_peft_model_state_dict", "set_model_state_dict", "set_optimizer_state_dict",
                      "load_state_dict")
# Helpers that return the process's device (guided-diffusion's dist_util.dev(), get_device()).
DEVICE_HELPERS = ("dev", "device", "get_device", "current_device", "xla_device", "default_device")


def _device_word(name: str) -> bool:
    """A name that says it holds a device: ``device``, ``dev``, ``self.device``, ``train_device``, ``loc``."""
    words = name.lower().split("_")
    return bool({"device", "dev", "loc", "location"} & set(words))


class TorchLoadMapLocation(Rule):
    code = "XLA409"
    name = "torch-load-map-location"
    summary = "torch.load(..., map_location='cuda:N' / f'cuda:{rank}') -> map_location='cpu'"
    targets = (*ALL_TARGETS, "torchtpu")  # TorchTPU checkpoints load on the CPU too
    on_xla_code = True  # CUDA remnants in code that already runs on XLA are migrated too

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._following: set[cst.FunctionDef] = set()  # loading helpers whose callers are being followed

    def visit_Call(self, node: cst.Call) -> None:
        if not self.ctx.is_call_to(node, *LOADS):
            return
        location = patterns.keyword(node, "map_location")
        if location is None:
            positional = patterns.positional(node)
            location = positional[1] if len(positional) > 1 else None
        if location is None:
            self._map_absent(node)
            return
        if not self._is_cuda(location.value):
            return
        new = cst.SimpleString('"cpu"')
        self.replace(location.value, new, f"map_location={short(location.value)} -> \"cpu\" "
                     "(load_state_dict copies onto the device)")
        if not self._feeds_state_dict(node):
            self.finding(node, f"{short(node)}: the checkpoint now loads on the CPU",
                         "move the loaded tensors to the XLA device (.to(device)) or load them with load_state_dict")

    def _map_absent(self, node: cst.Call) -> None:
        """``torch.load(f)``: storages go back to the device they were saved from, CUDA's in a CUDA program."""
        positional = patterns.positional(node)
        if self.ctx.facts.runs_on_xla or any(arg.star for arg in node.args) or not positional:
            return
        whole_models = not self._feeds_state_dict(node)
        if whole_models and not self._models_moved_after(node):
            # A whole pickled module or tensor used as loaded: the program's own torch.save(model) of XLA tensors
            # loads back onto the device (TCN's word_cnn_test.py); on the CPU it would meet XLA inputs.
            return
        at = [i for i, arg in enumerate(node.args) if arg is positional[0]][0] + 1
        cpu = cst.SimpleString('"cpu"')
        then = ("the program's .to(device) moves the models it holds" if whole_models else
                "load_state_dict puts its tensors on the XLA device")
        self.replace(node, lambda updated: with_keyword(updated, "map_location", cpu, at),
                     f"{short(node)}: map_location=\"cpu\" added (a checkpoint a CUDA run saved "
                     f"names a CUDA device, which an XLA host lacks; {then})")

    def _models_moved_after(self, node: cst.Call) -> bool:
        """``checkpoint = torch.load(path)`` ... ``decoder = checkpoint["decoder"]`` ... ``decoder =
        decoder.to(device)``: whole pickled models read out of the checkpoint, each moved to the device before
        use (image captioning's eval.py), so loading them on the CPU changes nothing on XLA. Every model read out
        of it must be moved: one used as loaded stays where it was saved (TCN's own XLA save)."""
        bound = self._bound_name(self.ctx.parent(node))
        if bound is None:
            return False
        target, scope = bound
        pulled = set()
        for access in scope.accesses[target.value]:
            subscript = self.ctx.parent(access.node)
            assign = self.ctx.parent(subscript) if isinstance(subscript, cst.Subscript) else None
            if (isinstance(assign, cst.Assign) and assign.value is subscript and len(assign.targets) == 1
                    and isinstance(assign.targets[0].target, cst.Name)):
                pulled.add(assign.targets[0].target.value)
        used: dict[str, set[str]] = {name: set() for name in pulled}  # name -> how: "moved", "model"
        for access in (a for name in pulled for a in scope.accesses[name]):
            attribute = self.ctx.parent(access.node)
            call = self.ctx.parent(attribute)
            name = access.node.value  # type: ignore[attr-defined]
            if isinstance(attribute, cst.Attribute) and isinstance(call, cst.Call) and call.func is attribute:
                method = attribute.attr.value
                if method in ("to", "cuda"):
                    used[name].add("moved")
                elif method in ("eval", "train", "parameters", "forward", "half", "float"):
                    used[name].add("model")
            elif isinstance(attribute, cst.Call) and attribute.func is access.node:
                used[name].add("model")
        models = [how for how in used.values() if how]
        return bool(models) and all("moved" in how for how in models)

    def _is_cuda(self, node: cst.BaseExpression, depth: int = 0) -> bool:
        """``node`` names a device that is the XLA device after the migration (or a mapping onto one)."""
        if is_cuda_device_expr(node, self.ctx.qualnames) or is_xla_device_expr(node, self.ctx.qualnames):
            return True
        # The device's string or type: str(device), f"{device}", device.type ("xla:0" / "xla" on XLA).
        if (isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "str"
                and len(node.args) == 1 and not node.args[0].star):
            return self._is_cuda(node.args[0].value, depth)
        if isinstance(node, cst.FormattedString) and len(node.parts) == 1 and \
                isinstance(node.parts[0], cst.FormattedStringExpression):
            return self._is_cuda(node.parts[0].expression, depth)
        if isinstance(node, cst.Attribute) and node.attr.value == "type":
            return self._is_cuda(node.value, depth)
        if isinstance(node, cst.Dict):
            return any(isinstance(e, cst.DictElement) and (patterns.is_cuda_string(e.value) or
                                                           patterns.is_cuda_string(e.key)) for e in node.elements)
        if isinstance(node, cst.Lambda):
            return bool(patterns.find_all(node.body, lambda n: patterns.method_call(n, "cuda") is not None))
        if isinstance(node, cst.Call):
            args = patterns.positional(node)
            if (self.ctx.is_call_to(node, "torch.device") and args
                    and (patterns.string_value(args[0].value) or "").split(":")[0] == "cpu"):
                return False  # torch.device("cpu"): it loaded on the CPU before too
            if self.ctx.is_call_to(node, "torch.device", "torch.cuda.current_device"):
                return True
            name = patterns.dotted_name(node.func)
            return name is not None and name.rsplit(".", 1)[-1] in DEVICE_HELPERS
        if isinstance(node, cst.Attribute):
            return _device_word(node.attr.value)
        if isinstance(node, cst.Name) and depth < 3:
            return any(self._is_cuda(value, depth + 1) if value is not None else _device_word(node.value)
                       for value in bound_values(self.ctx, node))
        return False

    def _feeds_state_dict(self, node: cst.Call) -> bool:
        """The loaded value, or a part of it (``torch.load(p)["state_dict"]``), goes into a state-dict loader
        (``model.load_state_dict``, peft's ``set_peft_model_state_dict``), inline or through the name it is
        assigned to."""
        ctx = self.ctx
        if _into_state_dict(ctx, node):
            return True
        value: cst.CSTNode = node
        parent = ctx.parent(node)
        while isinstance(parent, cst.Subscript) and parent.value is value:
            value, parent = parent, ctx.parent(parent)
        bound = self._bound_name(parent)
        if bound is None:
            return False
        target, scope = bound
        uses = [access.node for assignment in scope.assignments[target.value] if assignment.node is target
                for access in assignment.references]
        if not uses:
            uses = [access.node for access in scope.accesses[target.value]]
        return any(_into_state_dict(ctx, use) or self._returned_into_state_dict(use) for use in uses)

    def _bound_name(self, statement: cst.CSTNode | None) -> tuple[cst.Name, Scope] | None:
        """``name = <value>``: the name and the scope it is bound in (None for any other statement)."""
        if not (isinstance(statement, cst.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0].target, cst.Name)):
            return None
        target = statement.targets[0].target
        scope = self.ctx.scopes.get(target)
        return (target, scope) if scope is not None else None

    def _returned_into_state_dict(self, use: cst.CSTNode) -> bool:
        """``return checkpoint_dict`` from a loading helper (hifi-gan's ``load_checkpoint(path, device)``) whose
        every call in the module goes into a state-dict loader, as ``sd = load_checkpoint(...)`` then
        ``model.load_state_dict(sd["generator"])``."""
        ctx = self.ctx
        if not isinstance(ctx.parent(use), cst.Return):
            return False
        function = ctx.parent(use)
        while function is not None and not isinstance(function, cst.FunctionDef):
            function = ctx.parent(function)
        if function is None:
            return False
        if function in self._following:
            return False  # a helper that returns its own call's value
        self._following.add(function)
        name = function.name.value
        calls = patterns.find_all(ctx.module, lambda n: isinstance(n, cst.Call) and isinstance(n.func, cst.Name)
                                  and n.func.value == name)
        try:
            return bool(calls) and all(self._feeds_state_dict(call) for call in calls)
        finally:
            self._following.discard(function)


def _into_state_dict(ctx, use: cst.CSTNode) -> bool:
    """``use`` is an argument of a state-dict loader, or a part of one (``sd["model"]``)."""
    current = ctx.parent(use)
    while isinstance(current, (cst.Arg, cst.Subscript, cst.SubscriptElement, cst.Index)):
        current = ctx.parent(current)
        if isinstance(current, cst.Call) and (patterns.method_call(current, "load_state_dict") or (
                (patterns.dotted_name(current.func) or "").rsplit(".", 1)[-1] in STATE_DICT_LOADERS)):
            return True
    return False
