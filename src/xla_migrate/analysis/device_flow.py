"""Where a script's device comes from, and whether it can still be the CPU after the migration.

A device chosen by the user stays chosen by the user (issue 36): ``parser.add_argument("--device",
default="cuda")``, a config value (``device = "cuda"`` that a configurator may override), an environment
default (``os.environ.get("DEVICE", "cuda")``), a parameter default (``def f(x, device="cuda")``), a config
entry (``{"device": "cuda"}``). Their CUDA value becomes the XLA device's name, ``"xla"`` (a plain value: it
starts no runtime, so it may be read before the launcher), and ``--device cpu`` keeps choosing the CPU.

``cpu_capable(expr)`` says whether a device expression of the output may hold the CPU at run time: such an
option (or a name bound to one, or ``torch.device`` of one), a device conditional whose test keeps a user's
part after its CUDA gates are folded (``"cuda" if use_cuda else "cpu"`` with ``use_cuda = not args.no_cuda
and torch.cuda.is_available()``), a tensor's ``.device``. Device loaders wrap a loader only when the device
cannot be the CPU there (``may_be_cpu_at``: elsewhere the step barrier marks the step on either device),
and CUDA comparisons of such a device test for XLA instead of being folded.

A parameter whose check lists a word that is no device type (``impl="cuda"`` with ``assert impl in ["ref",
"cuda"]``) selects an implementation: it is no device option (``selectors``, ``selects(literal)``).

``residue(test)``: what remains of a test once its CUDA gates are True (None when nothing does), for the
conditionals above.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import GlobalScope

from ..syntax import patterns
from .values import bound_values

ARGPARSE_ADD = ("add_argument",)
ENV_READS = ("os.environ.get", "os.getenv")
GATE_CALLS = ("torch.cuda.is_available", "torch.accelerator.is_available")
_COUNT = ("torch.cuda.device_count",)
# Device types a device option may name; any other word in its list of choices makes it no device.
_DEVICE_TYPES = {"cpu", "cuda", "gpu", "mps", "xla", "tpu", "xpu", "hip", "meta", "auto", "npu"}


class DeviceFlow:
    def __init__(self, ctx) -> None:
        self.ctx = ctx
        # Literal CUDA values of device options: they become "xla".
        self.option_literals: list[cst.BaseExpression] = []
        # argparse destinations whose default is a CUDA device (``args.device``).
        self.option_dests: set[str] = set()
        # Spellings (names, ``self.x``) that may hold the CPU device at run time.
        self.cpu_spellings: set[str] = set()
        # Parameters that select an implementation (``impl="cuda"`` checked against ``["ref", "cuda"]``).
        self.selectors: set[cst.Param] = set()
        self._assignments: list[tuple[str, cst.BaseExpression, cst.CSTNode]] = []
        self._judging: set[cst.CSTNode] = set()  # names being judged as gates (a flag bound to itself)
        self._collect()

    # Collecting --------------------------------------------------------------------------------------------
    def _collect(self) -> None:
        ctx = self.ctx
        for node in patterns.find_all(ctx.module, lambda n: isinstance(n, (cst.Call, cst.Assign, cst.AnnAssign,
                                                                              cst.Param, cst.DictElement))):
            if isinstance(node, cst.Call):
                self._call(node)
            elif isinstance(node, cst.Param):
                if node.default is not None and patterns.is_cuda_string(node.default) and self._selector(node):
                    self.selectors.add(node)
                elif node.default is not None and patterns.is_cuda_string(node.default):
                    self.option_literals.append(node.default)
                    self.cpu_spellings.add(node.name.value)
            elif isinstance(node, cst.DictElement):
                key = patterns.string_value(node.key) or ""
                if "device" in key and patterns.is_cuda_string(node.value):
                    self.option_literals.append(node.value)
            else:
                target = node.targets[0].target if isinstance(node, cst.Assign) and len(node.targets) == 1 else (
                    node.target if isinstance(node, cst.AnnAssign) else None)
                spelling = patterns.dotted_name(target) if target is not None else None
                if spelling is not None and node.value is not None:
                    self._assignments.append((spelling, node.value, node))
        for spelling, value, node in self._assignments:
            if patterns.is_cuda_string(value) and self._config_level(node):
                self.cpu_spellings.add(spelling)  # a config value a configurator or flag may override
        for _ in range(2):  # names bound to names bound to options
            for spelling, value, _node in self._assignments:
                if spelling not in self.cpu_spellings and self.cpu_capable(value):
                    self.cpu_spellings.add(spelling)

    def _selector(self, param: cst.Param, depth: int = 0) -> bool:
        """``impl="cuda"`` checked by ``assert impl in ["ref", "cuda"]``: the parameter picks an implementation
        (a fused kernel or plain ops), not a device; its values stay as they are, so its check still holds.
        So is one passed on to such a parameter of a function of the module (``upfirdn2d(..., impl=impl)``)."""
        function = self.ctx.parent(param)
        while function is not None and not isinstance(function, cst.FunctionDef):
            function = self.ctx.parent(function)
        if function is None or depth > 3:
            return False

        def passes_on(node: cst.CSTNode) -> bool:
            if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Name):
                return False
            keys = [a.keyword.value for a in node.args if a.keyword is not None and isinstance(a.value, cst.Name)
                    and a.value.value == param.name.value]
            callees = [f for f in self.ctx.module.body if isinstance(f, cst.FunctionDef)
                       and f.name.value == node.func.value]
            return any(p.name.value == key and p.default is not None and patterns.is_cuda_string(p.default)
                       and self._selector(p, depth + 1)
                       for f in callees for p in f.params.params for key in keys)

        if patterns.find_all(function.body, passes_on):
            return True

        def checks_choices(node: cst.CSTNode) -> bool:
            if not (isinstance(node, cst.Comparison) and isinstance(node.left, cst.Name)
                    and node.left.value == param.name.value and len(node.comparisons) == 1
                    and isinstance(node.comparisons[0].operator, cst.In)):
                return False
            choices = node.comparisons[0].comparator
            if not isinstance(choices, (cst.List, cst.Tuple, cst.Set)):
                return False
            words = {patterns.string_value(e.value) for e in choices.elements}
            return any(word is not None and word.split(":")[0] not in _DEVICE_TYPES for word in words)

        return bool(patterns.find_all(function.body, checks_choices))

    def is_selector(self, node: cst.BaseExpression) -> bool:
        """``node`` is a name of a parameter that selects an implementation, not a device (``_selector``)."""
        if not isinstance(node, cst.Name) or not self.selectors:
            return False
        function = self.ctx.parent(node)
        while function is not None and not isinstance(function, cst.FunctionDef):
            function = self.ctx.parent(function)
        return function is not None and any(
            p in self.selectors and p.name.value == node.value for p in function.params.params)

    def selects(self, literal: cst.BaseExpression) -> bool:
        """``literal`` is a value of a selector parameter: its default, a value it is compared with (``impl ==
        "cuda"``), or one of the choices its check lists (``impl in ["ref", "cuda"]``)."""
        if not self.selectors:
            return False
        parent = self.ctx.parent(literal)
        if isinstance(parent, cst.Param) and parent.default is literal:
            return parent in self.selectors
        if isinstance(parent, cst.Element):
            parent = self.ctx.parent(self.ctx.parent(parent))  # the list, then its comparison target
        if isinstance(parent, cst.ComparisonTarget):
            comparison = self.ctx.parent(parent)
            return isinstance(comparison, cst.Comparison) and self.is_selector(comparison.left)
        if isinstance(parent, cst.Comparison) and parent.left is literal:
            return self.is_selector(parent.comparisons[0].comparator)
        return False

    def _call(self, node: cst.Call) -> None:
        ctx = self.ctx
        if patterns.method_call(node, *ARGPARSE_ADD):
            default = patterns.keyword(node, "default")
            if default is None or not patterns.is_cuda_string(default.value):
                return
            self.option_literals.append(default.value)
            choices = patterns.keyword(node, "choices")
            if choices is not None and isinstance(choices.value, (cst.List, cst.Tuple, cst.Set)):
                self.option_literals += [e.value for e in choices.value.elements
                                         if patterns.is_cuda_string(e.value)]
            dest = patterns.keyword(node, "dest")
            name = patterns.string_value(dest.value) if dest is not None else None
            if name is None:
                flags = [patterns.string_value(a.value) or "" for a in patterns.positional(node)]
                long = [f for f in flags if f.startswith("--")] or flags
                name = long[0].lstrip("-").replace("-", "_") if long else None
            if name:
                self.option_dests.add(name)
        elif ctx.qualnames(node.func) & set(ENV_READS) or (
                patterns.method_call(node, "get") and "os.environ" in ctx.qualnames(node.func.value)):
            args = patterns.positional(node)
            if len(args) == 2 and patterns.is_cuda_string(args[1].value):
                self.option_literals.append(args[1].value)

    def _config_level(self, node: cst.CSTNode) -> bool:
        """A module-level or class-level assignment (a script's configuration), not a function's constant."""
        scope = self.ctx.scopes.get(node)
        return isinstance(scope, GlobalScope) or type(scope).__name__ == "ClassScope"

    # Questions ---------------------------------------------------------------------------------------------
    def cpu_capable(self, node: cst.BaseExpression) -> bool:
        """The device expression may hold the CPU at run time in the output."""
        ctx = self.ctx
        if isinstance(node, cst.Attribute) and node.attr.value == "type":
            node = node.value
        if isinstance(node, cst.Call) and patterns.dotted_name(node.func) == "str" and len(node.args) == 1:
            node = node.args[0].value
        if isinstance(node, cst.Attribute):
            if node.attr.value in self.option_dests:
                return True
            if node.attr.value == "device" and patterns.dotted_name(node.value) != "self":
                spelling = patterns.dotted_name(node)
                return spelling in self.cpu_spellings or not (spelling or "").startswith("self.")
        spelling = patterns.dotted_name(node)
        if spelling is not None:
            return spelling in self.cpu_spellings
        if isinstance(node, cst.IfExp):
            return self.residue(node.test) is not None and not patterns.is_cuda_string(node.orelse)
        if isinstance(node, cst.Call) and ctx.is_call_to(node, "torch.device"):
            args = patterns.positional(node)
            if not args:
                return False
            first = args[0].value
            if isinstance(first, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)):
                return False
            return self.cpu_capable(first) or patterns.dotted_name(first) is not None
        return False

    def may_be_cpu_at(self, node: cst.CSTNode) -> bool:
        """The device variable code at ``node`` would use (``ctx.device_reference``'s choice: the innermost
        scope's device names, else the instance's device) may be the CPU at run time."""
        if not self.cpu_spellings and not self.option_dests:
            return False
        ctx = self.ctx
        for scope in ctx.visible_scopes(node):
            names = set(ctx.facts.device_names.get(scope, set()))
            if names:
                return any(name in self.cpu_spellings for name in names)
        function = getattr(ctx.function_scope(node), "node", None)
        for cls, attribute in ctx.facts.class_device_attrs.items():
            if function is not None and function in patterns.find_all(cls, lambda n: n is function):
                return f"self.{attribute}" in self.cpu_spellings
        return False

    def residue(self, test: cst.BaseExpression) -> list[cst.BaseExpression] | None:
        """The parts of ``test`` that still decide it once its CUDA gates are True on XLA (``not
        args.no_cuda``), or None when the gates decide it alone."""
        from .gates import evaluate

        values = {node: True for node in patterns.find_all(test, self._is_gate)}
        known, residue = evaluate(test, values)
        return None if known is not None else residue

    def _is_gate(self, node: cst.CSTNode) -> bool:
        """A CUDA test: availability, a device count compared, a device compared with "cuda" (its device-type
        choice, ``"cuda" if "cuda" in device else "cpu"``, is the AMP rules'), or a flag bound to one."""
        ctx = self.ctx
        if isinstance(node, cst.Call):
            if patterns.method_call(node, "startswith"):
                args = patterns.positional(node)
                return len(args) == 1 and patterns.string_value(args[0].value) == "cuda"
            return ctx.is_call_to(node, *GATE_CALLS)
        if (isinstance(node, cst.Comparison) and len(node.comparisons) == 1
                and isinstance(node.comparisons[0].operator, (cst.Equal, cst.NotEqual, cst.In, cst.NotIn))
                and (patterns.is_cuda_string(node.left) or patterns.is_cuda_string(node.comparisons[0].comparator))):
            return True
        if (isinstance(node, cst.Comparison) and len(node.comparisons) == 1 and isinstance(node.left, cst.Call)
                and ctx.is_call_to(node.left, *_COUNT)):
            return True
        if isinstance(node, cst.Name) and node not in self._judging:
            self._judging.add(node)
            try:
                values = bound_values(ctx, node)
                return bool(values) and all(v is not None and self.residue(v) is None and self._has_gate(v)
                                            for v in values)
            finally:
                self._judging.discard(node)
        return False

    def _has_gate(self, node: cst.CSTNode) -> bool:
        return bool(patterns.find_all(node, lambda n: isinstance(n, (cst.Call, cst.Comparison)) and self._is_gate(n)))
