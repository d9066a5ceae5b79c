"""XLA201 cuda-autocast-to-xla: CUDA autocast becomes the target's XLA autocast.

What it does:
    Rewrites every CUDA autocast the script opens, in every spelling: ``torch.cuda.amp.autocast(...)``,
    ``torch.autocast("cuda", ...)``, ``torch.autocast(device_type="cuda", ...)``, ``torch.amp.autocast("cuda")``,
    from-imports (``from torch.cuda.amp import autocast``) and module aliases (``import torch.cuda.amp as amp``),
    as a context manager, a decorator or a value. ``enabled=`` and ``cache_enabled=`` are kept (positional
    ones become keywords). The seeds' target keeps ``dtype=`` and gets ``torch_xla.amp.autocast(device, ...)``;
    the ``2.9`` target gets ``torch.autocast("xla", dtype=torch.bfloat16, ...)``: its AMP is bfloat16 without
    a loss scaler, so a float16 (or any other) ``dtype`` becomes bfloat16 and the change message says so.
    A device type held in a variable (``device_type = "cuda" if "cuda" in device else "cpu"``, nanoGPT) is
    followed to its definition, which becomes ``"xla"`` so the script's other ``device_type`` checks take the
    XLA branch; a device type the rule cannot trace is reported, not guessed. Other device types (``"cpu"``)
    are left alone. On the seeds' target the autocast is entered only where torch_xla's autocast works: on
    XLA hardware other than the CPU (``xla_amp.autocast(device, ...) if xm.xla_device_hw(device) != "CPU" else
    contextlib.nullcontext()``: on PJRT_DEVICE=CPU, where tests and ``verify`` run, torch_xla up to 2.6 skips
    torch.autocast's setup and entering it raises AttributeError), and, where the device may be the CPU
    (``device = torch.device("cuda" if use_cuda else "cpu")``, a ``--device`` option), only on the XLA path:
    ``... if "xla" in str(device) and xm.xla_device_hw(device) != "CPU" else contextlib.nullcontext()``
    (``torch_xla.amp.autocast`` asserts an XLA device even when disabled, and ``torch.autocast("xla")``, which
    would take either, needs torch 2.1; CUDA autocast did nothing for the CPU path's tensors). A decorator
    keeps the plain call (``nullcontext()`` does not decorate).

Why:
    CUDA autocast does nothing on an XLA device: the model silently runs in float32. torch_xla's autocast
    (``torch_xla.amp.autocast(device)``, the form in the seeds) or torch's own ``torch.autocast("xla")``
    casts for XLA. torch_xla 2.9 has no GradScaler; its AMP is bfloat16, which needs no loss scaling.

Example:
    with torch.cuda.amp.autocast(enabled=use_amp):
        loss = model(x)

Use instead:
    with xla_amp.autocast(device, enabled=use_amp) if xm.xla_device_hw(device) != "CPU" else contextlib.nullcontext():
        loss = model(x)                                        # --target sagemaker
    with torch.autocast("xla", dtype=torch.bfloat16, enabled=use_amp):   # --target 2.9
        loss = model(x)
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import Assignment

from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import ALL_TARGETS, Rule, torch_names_only
from xla_migrate.transforms.common import imported_from, joined, keyword_arg, short

# torch.cuda.amp.autocast(enabled=True, dtype=torch.float16, cache_enabled=True)
CUDA_AMP_AUTOCASTS = ("torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast")
# torch.autocast(device_type, dtype=None, enabled=True, cache_enabled=None)
DEVICE_AUTOCASTS = ("torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast")
_HALF_DTYPES = ("torch.float16", "torch.half", "torch.bfloat16")
_FULL_DTYPES = ("torch.float32", "torch.float", "torch.float64", "torch.double")
_PARAMETERS = {
    CUDA_AMP_AUTOCASTS: ("enabled", "dtype", "cache_enabled"),
    DEVICE_AUTOCASTS: ("device_type", "dtype", "enabled", "cache_enabled"),
}


class CudaAutocastToXla(Rule):
    code = "XLA201"
    name = "cuda-autocast-to-xla"
    summary = "CUDA autocast (torch.cuda.amp.autocast, torch.autocast('cuda')) -> the target's XLA autocast"
    fix_safety = "review"
    on_xla_code = True  # CUDA remnants in code that already runs on XLA are migrated too
    targets = (*ALL_TARGETS, "torchtpu")

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        # Device-type definitions already rewritten to "xla" (several autocasts may share one).
        self._rewritten_definitions: set[cst.CSTNode] = set()

    # Autocast calls --------------------------------------------------------------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        names = self.ctx.qualnames(node.func)
        for family, parameters in _PARAMETERS.items():
            matched = names & set(family)
            if matched:
                self._autocast(node, parameters, sorted(matched)[0])
                return

    def _autocast(self, node: cst.Call, parameters: tuple[str, ...], qualname: str) -> None:
        bound: dict[str, int] = {}
        for index, arg in enumerate(node.args):
            if arg.star:
                self.finding(node, f"{short(node)}: autocast with unpacked arguments is not rewritten",
                             "make it the target's autocast by hand")
                return
            if arg.keyword is None:
                if index >= len(parameters):
                    return
                bound[parameters[index]] = index
            elif arg.keyword.value in parameters:
                bound[arg.keyword.value] = index
            else:
                return
        if "device_type" in parameters:
            if "device_type" not in bound:
                return
            verdict = self._device_type_is_cuda(node.args[bound["device_type"]].value)
            if verdict is False:
                return
            if verdict is None:
                device_type = short(node.args[bound["device_type"]].value)
                self.finding(node, f"{short(node)}: cannot tell whether {device_type} is 'cuda'",
                             f"if it is, use {self._spelled_preview()}")
                return
        self._rewrite(node, bound, qualname)

    def _spelled_preview(self) -> str:
        template = self.ctx.target.spelling("autocast").template
        return template.replace("{0}", "device").replace("{xla_amp}", "torch_xla.amp").replace("{torch}", "torch")

    def _rewrite(self, node: cst.Call, bound: dict[str, int], qualname: str) -> None:
        ctx = self.ctx
        template = ctx.target.spelling("autocast").template
        device = ctx.device_reference(node, self.code) if "{0}" in template else ""
        spelled = patterns.parsed_expression(ctx.spell("autocast", device))
        assert isinstance(spelled, cst.Call)
        fixed = {a.keyword.value for a in spelled.args if a.keyword is not None}
        kept = sorted((index, name) for name, index in bound.items() if name != "device_type" and name not in fixed)

        user_dtype = self._user_dtype(node, bound) if "dtype" in fixed and ctx.target.autocast_dtype else None
        # torch_xla.amp.autocast asserts an XLA device even when disabled: where the device may be the CPU (the
        # user's flag), the CPU path gets no autocast, as CUDA autocast did nothing for CPU tensors there. On an
        # XLA device whose hardware is the CPU (PJRT_DEVICE=CPU: tests, verify) torch_xla (up to 2.6) skips
        # torch.autocast's setup and entering it raises AttributeError; there it is not entered either (a
        # decorator keeps the call: nullcontext() does not decorate).
        may_be_cpu = bool(device) and ctx.device_flow.may_be_cpu_at(node)
        decorator = isinstance(ctx.parent(node), cst.Decorator)
        cpu_guard = (f"{ctx.local_name('contextlib', 'contextlib')}.nullcontext()"
                     if device and (may_be_cpu or not decorator) else "")
        hardware = (f'{ctx.local_name("torch_xla.core.xla_model", "xm")}.xla_device_hw({device}) != "CPU"'
                    if cpu_guard and not decorator else "")
        test = " and ".join(t for t in ((f'"xla" in str({device})' if may_be_cpu else ""), hardware) if t)

        def to_xla(updated: cst.Call) -> cst.Call:
            args = []
            for index, name in kept:
                arg = updated.args[index]
                args.append(keyword_arg(name, arg.value) if arg.keyword is None else arg)
            base = list(spelled.args)
            if user_dtype is not None:
                value = user_dtype(updated.args[bound["dtype"]].value)
                base = [a.with_changes(value=value) if a.keyword is not None and a.keyword.value == "dtype" else a
                        for a in base]
            call = spelled.with_changes(args=joined([*base, *args]), lpar=updated.lpar, rpar=updated.rpar)
            if not cpu_guard:
                return call
            guarded = f"{patterns.code_of(call)} if {test} else {cpu_guard}"
            # In a `with` or a decorator it reads alone; elsewhere (``nullcontext() if ... else <it>``) in
            # parentheses.
            alone = isinstance(ctx.parent(node), (cst.WithItem, cst.Decorator))
            return patterns.parsed_expression(guarded if alone else f"({guarded})")

        preview = to_xla(node)
        note = ""
        if "dtype" in fixed and ctx.target.autocast_dtype:
            wanted = ctx.target.autocast_dtype
            if "dtype" not in bound:
                note = f" (float16 -> {wanted}: the target's AMP dtype)"
            elif user_dtype is not None:
                written = patterns.code_of(node.args[bound["dtype"]].value)
                note = (f" (the script's dtype {written} kept: float32 stays float32, only float16 becomes {wanted}, "
                        "the target's AMP dtype)")
            else:
                written = patterns.code_of(node.args[bound["dtype"]].value)
                if not written.endswith(wanted):
                    note = f" (dtype {written} -> {wanted}: the target's AMP dtype)"
        elif "dtype" not in fixed and "dtype" in bound and not self._bfloat16(node, bound):
            # sagemaker: torch_xla's autocast keeps a float16 dtype on XLA:GPU (SageMaker's hardware, the seeds'
            # recipe); on a TPU (up to 2.6) it warns and turns itself off for any dtype but bfloat16 (issue 29).
            # Without a dtype it picks bfloat16 on a TPU itself.
            note = (" (float16 as on CUDA: SageMaker's XLA:GPU runs it; on a TPU torch_xla turns a float16 autocast "
                    "off with a warning and trains in float32: there use --target 2.9, whose AMP is bfloat16)")
        if may_be_cpu:
            note += f" (only where {device} is an XLA device: torch_xla's autocast asserts one, and {device} may be the CPU)"
        if hardware:
            note += (" (not on an XLA device whose hardware is the CPU, PJRT_DEVICE=CPU: torch_xla's autocast cannot "
                     "be entered there)")
        self.replace(node, to_xla, f"{short(node)} -> {short(preview, 80)}{note}")
        for dead in imported_from(ctx, node.func, qualname):
            self.import_may_be_dead(*dead)

    def _bfloat16(self, node: cst.Call, bound: dict[str, int]) -> bool:
        """The autocast names bfloat16 itself (``dtype=torch.bfloat16``): a TPU runs it as it is."""
        return "dtype" in bound and "torch.bfloat16" in self.ctx.qualnames(node.args[bound["dtype"]].value)

    def _user_dtype(self, node: cst.Call, bound: dict[str, int]):
        """For a ``dtype`` the script chooses (a variable, a config lookup: ``dtype=ptdtype``) or spells as
        float32: how the XLA autocast's dtype is written from it (issue 36: never change numerics the user
        chose). A literal float16/bfloat16 (or none) is mixed precision: the target's dtype. None then."""
        if "dtype" not in bound:
            return None
        value = node.args[bound["dtype"]].value
        names = self.ctx.qualnames(value)
        if names & set(_HALF_DTYPES):
            return None
        torch = self.ctx.local_name("torch", "torch")
        wanted = self.ctx.target.autocast_dtype
        if names & set(_FULL_DTYPES):
            return lambda updated: updated  # float32: autocast then casts nothing, as the original did
        template = f"{torch}.{wanted} if {patterns.HOLE} == {torch}.float16 else {patterns.HOLE}"

        def mapped(updated: cst.BaseExpression) -> cst.BaseExpression:
            code = patterns.code_of(updated)
            return patterns.parsed_expression(template.replace(patterns.HOLE, code))

        return mapped

    # Device types ------------------------------------------------------------------------------------------
    def _device_type_is_cuda(self, node: cst.BaseExpression) -> bool | None:
        """True for a CUDA device type, False for another known one, None when it cannot be told."""
        if isinstance(node, cst.IfExp):
            return patterns.is_cuda_value(node)
        value = patterns.string_value(node)
        if value is not None:
            return value == "cuda" or value.startswith("cuda:")
        if isinstance(node, cst.Attribute) and node.attr.value == "type":
            return True if self._is_device(node.value) else None
        if isinstance(node, cst.Name):
            return self._variable_is_cuda(node)
        return None

    def _is_device(self, node: cst.BaseExpression) -> bool:
        """``device.type``: a name (or ``self`` attribute) the facts know holds the device."""
        name = patterns.dotted_name(node)
        if name is None:
            return False
        if any(name in self.ctx.facts.device_names.get(scope, ()) for scope in self.ctx.visible_scopes(node)):
            return True
        return name.startswith("self.") and name[5:] in self.ctx.facts.class_device_attrs.values()

    def _variable_is_cuda(self, node: cst.Name) -> bool | None:
        scope = self.ctx.scopes.get(node)
        if scope is None:
            return None
        definitions = []
        for assignment in scope[node.value]:
            if not isinstance(assignment, Assignment) or not isinstance(assignment.node, cst.Name):
                return None
            target = assignment.node
            statement = self.ctx.parent(target)
            if isinstance(statement, cst.AssignTarget):
                statement = self.ctx.parent(statement)
            if not isinstance(statement, (cst.Assign, cst.AnnAssign)) or statement.value is None:
                return None
            definitions.append((target, statement.value))
        if not definitions:
            return None
        verdicts = {patterns.is_cuda_value(value) if not isinstance(value, cst.Name) else None for _, value in definitions}
        if verdicts == {False} and all(patterns.string_value(v) is not None for _, v in definitions):
            return False
        if verdicts != {True}:
            return None
        for target, value in definitions:
            # A name without "type" in it holds a device, not a device type: XLA101 rewrites its definition.
            if "type" in target.value and value not in self._rewritten_definitions:
                self._rewritten_definitions.add(value)
                quote = "'" if isinstance(value, cst.SimpleString) and value.value.startswith("'") else '"'
                if isinstance(value, cst.IfExp) and isinstance(value.body, cst.SimpleString):
                    quote = "'" if value.body.value.startswith("'") else '"'
                kind = self.ctx.target.spelling("device_type").template.strip('"')  # read, not spelled
                self.replace(value, cst.SimpleString(f"{quote}{kind}{quote}"),
                             f"{target.value} = {short(value)} -> {quote}{kind}{quote} (the autocast device type)")
        return True

    # Autocast as a value (``partial(torch.autocast, ...)``, ``ctx = torch.cuda.amp.autocast``) --------------
    @torch_names_only
    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._reference(node)

    @torch_names_only
    def visit_Name(self, node: cst.Name) -> None:
        self._reference(node)

    def _reference(self, node: cst.BaseExpression) -> None:
        parent = self.ctx.parent(node)
        if isinstance(parent, cst.Call) and parent.func is node:
            return
        if isinstance(parent, (cst.ImportAlias, cst.Attribute)):
            return
        names = self.ctx.torch_names(node)
        if names & {*CUDA_AMP_AUTOCASTS, *DEVICE_AUTOCASTS}:
            self.finding(node, f"{short(node)} used as a value: it is not rewritten",
                         f"make it the target's autocast ({self._spelled_preview()}) by hand")
