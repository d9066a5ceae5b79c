"""XLA105 legacy-cuda-tensor-types: torch.cuda.FloatTensor and friends get their XLA form (dtype and device).

What it does:
    The legacy CUDA tensor types (``torch.cuda.FloatTensor``, ``LongTensor``, ``ByteTensor``, ...) and the
    names bound to them are rewritten where they are used. A name is bound to one in any spelling where every
    binding is of the same dtype: ``Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor``,
    ``... else torch.Tensor`` (``torch.Tensor`` is the float32 type), or ``Tensor = torch.FloatTensor`` then
    ``if cuda: Tensor = torch.cuda.FloatTensor``:

    - a construction ``torch.cuda.FloatTensor(*args)`` / ``Tensor(*args)`` becomes the CPU type's, moved to the
      XLA device: ``torch.FloatTensor(*args).to(device)`` (same sizes-or-data meaning of the arguments);
    - a conversion ``x.type(torch.cuda.FloatTensor)`` / ``x.type(Tensor)`` / ``x.type("torch.cuda.FloatTensor")``
      becomes ``x.to(device=device, dtype=torch.float32)``;
    - a CUDA default type, ``torch.set_default_tensor_type("torch.cuda.FloatTensor")`` (ssd.pytorch), becomes
      the CPU type of its dtype: tensors built without a device start on the CPU, and the script's own moves
      (now to the XLA device) place them, as the change note says.

    The binding itself stays (naming the type does not need CUDA) unless XLA104 drops its CUDA branch; it and
    any other use of a legacy CUDA type left in the output (``isinstance(x, torch.cuda.FloatTensor)``) are
    reported with their line.

Why:
    The legacy types allocate on a CUDA device: on an XLA machine they raise "no CUDA GPUs are available".
    When XLA104 folds a ``cuda = torch.cuda.is_available()`` flag to True, ``Tensor = torch.cuda.FloatTensor if
    cuda else ...`` picks the CUDA type, so the output would crash where the original ran on the CPU.

Example:
    Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
    valid = Tensor(imgs.size(0), 1).fill_(1.0)
    real_imgs = imgs.type(Tensor)

Use instead:
    Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
    valid = torch.FloatTensor(imgs.size(0), 1).to(device).fill_(1.0)
    real_imgs = imgs.to(device=device, dtype=torch.float32)
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.analysis.cuda_only import CudaOnly
from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule, torch_names_only
from xla_migrate.transforms.common import short

# Legacy type name -> the dtype it holds.
DTYPES = {"FloatTensor": "float32", "DoubleTensor": "float64", "HalfTensor": "float16",
          "BFloat16Tensor": "bfloat16", "ByteTensor": "uint8", "CharTensor": "int8", "ShortTensor": "int16",
          "IntTensor": "int32", "LongTensor": "int64", "BoolTensor": "bool"}


class LegacyCudaTensorTypes(Rule):
    code = "XLA105"
    name = "legacy-cuda-tensor-types"
    summary = "torch.cuda.FloatTensor(...) and x.type(torch.cuda.FloatTensor) -> CPU type .to(device) / x.to(device, dtype)"
    on_xla_code = True  # CUDA remnants in code that already runs on XLA are migrated too

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._aliases: dict[str, str] = {}  # spelling bound to a legacy CUDA type -> its type name
        # Spelling -> the dtypes of its bindings (CUDA and CPU types): an alias when they agree.
        self._bindings: dict[str, tuple[set[str], set[str]]] = {}
        self._calls: list[cst.Call] = []
        # Every construct this rule handles spells a type name (`torch.cuda.FloatTensor`, an import of one,
        # `.type("torch.cuda.FloatTensor")`): a script that holds none has nothing for it.
        self._spells_types = any(name in ctx.input_code for name in DTYPES)
        self._references: list[cst.CSTNode] = []  # every torch.cuda.<legacy type> in the script
        self._rewritten: set[cst.CSTNode] = set()

    def _legacy_type(self, node: cst.BaseExpression) -> str | None:
        """The legacy type name a CUDA type expression, or a name bound to one, stands for."""
        for name in self.ctx.torch_names(node):
            module, _, type_name = name.rpartition(".")
            if module == "torch.cuda" and type_name in DTYPES:
                return type_name
        spelling = patterns.dotted_name(node)
        return self._aliases.get(spelling) if spelling is not None else None

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) != 1 or not self._spells_types:
            return
        spelling = patterns.dotted_name(node.targets[0].target)
        if spelling is None:
            return
        value = node.value
        branches = [value.body, value.orelse] if isinstance(value, cst.IfExp) else [value]
        cuda_types = {t for t in map(self._legacy_type, branches) if t is not None}
        cpu_types = {self._cpu_type(name) for b in branches for name in self.ctx.torch_names(b)
                     if name.rpartition(".")[0] == "torch"}
        if not cuda_types and not cpu_types - {None}:
            if spelling in self._bindings:
                self._bindings[spelling][1].add("other")  # bound to something else too: not an alias
            return
        cuda, cpu = self._bindings.setdefault(spelling, (set(), set()))
        cuda |= cuda_types
        cpu |= cpu_types

    def _cpu_type(self, qualname: str) -> str | None:
        """The legacy type a ``torch.<name>`` stands for: ``torch.FloatTensor``, or ``torch.Tensor`` (float32)."""
        name = qualname.rpartition(".")[2]
        return "FloatTensor" if name == "Tensor" else name if name in DTYPES else None

    def _aliases_found(self) -> None:
        """Names whose every binding is a legacy type of one dtype, with a CUDA one among them."""
        for spelling, (cuda, cpu) in self._bindings.items():
            if len(cuda) == 1 and cpu <= cuda:
                self._aliases[spelling] = next(iter(cuda))

    def visit_Call(self, node: cst.Call) -> None:
        if self._spells_types:
            self._calls.append(node)

    @torch_names_only
    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._reference(node)

    @torch_names_only
    def visit_Name(self, node: cst.Name) -> None:
        parent = self.ctx.parent(node)
        if not (isinstance(parent, cst.Attribute) and parent.attr is node):
            self._reference(node)

    def _reference(self, node: cst.BaseExpression) -> None:
        if any(n.rpartition(".")[0] == "torch.cuda" and n.rpartition(".")[2] in DTYPES for n in self.ctx.torch_names(node)):
            self._references.append(node)

    def leave_Module(self, original_node: cst.Module) -> None:
        # Decided at the end: a name bound to a type may be used in a function defined above its binding.
        self._aliases_found()
        for node in self._calls:
            type_name = self._legacy_type(node.func)
            if type_name is not None:
                self._construction(node, type_name)
            elif patterns.method_call(node, "type") and len(node.args) == 1 and node.args[0].keyword is None:
                type_name = self._named_type(node.args[0].value)
                if type_name is not None:
                    self._conversion(node, type_name)
            elif "torch.set_default_tensor_type" in self.ctx.qualnames(node.func) and len(node.args) == 1:
                self._default_type(node)
        checker = CudaOnly(self.ctx)
        for node in self._references:
            if node not in self._rewritten and not checker.dropped(node):
                self.finding(node, f"CUDA tensor type: {short(node)} (constructions and .type() conversions of it "
                                   "are rewritten to the XLA device; this use is not)",
                             "create tensors on the XLA device with a dtype (torch.zeros(n, dtype=torch.float32, "
                             "device=device)); test x.dtype and x.device instead of the tensor type")

    def _construction(self, node: cst.Call, type_name: str) -> None:
        self._rewritten.add(node.func)
        device = self.ctx.device_reference(node, self.code)
        torch = self.ctx.local_name("torch", "torch")
        func = patterns.parsed_expression(f"{torch}.{type_name}")

        def on_device(updated: cst.Call) -> cst.Call:
            built = updated.with_changes(func=func, lpar=[], rpar=[])
            return cst.Call(func=cst.Attribute(value=built, attr=cst.Name("to")),
                            args=[cst.Arg(patterns.parsed_expression(device))], lpar=updated.lpar, rpar=updated.rpar)

        self.replace(node, on_device, f"{short(node)} -> {short(on_device(node), 80)}")

    def _conversion(self, node: cst.Call, type_name: str) -> None:
        self._rewritten.add(node.args[0].value)
        device = self.ctx.device_reference(node, self.code)
        torch = self.ctx.local_name("torch", "torch")
        args = patterns.parsed_expression(f"f(device={device}, dtype={torch}.{DTYPES[type_name]})").args

        def to_device(updated: cst.Call) -> cst.Call:
            return updated.with_changes(func=updated.func.with_changes(attr=cst.Name("to")), args=args)

        self.replace(node, to_device, f"{short(node)} -> {short(to_device(node), 80)}")

    def _named_type(self, argument: cst.BaseExpression) -> str | None:
        """The legacy CUDA type an argument names: a type expression, a name bound to one, or its string
        (``"torch.cuda.FloatTensor"``)."""
        type_name = self._legacy_type(argument)
        text = patterns.string_value(argument)
        if type_name is None and text is not None and text.startswith("torch.cuda."):
            type_name = text.rpartition(".")[2] if text.rpartition(".")[2] in DTYPES else None
        return type_name

    def _default_type(self, node: cst.Call) -> None:
        """``torch.set_default_tensor_type("torch.cuda.FloatTensor")`` (ssd.pytorch): the CPU type of that dtype
        (a CUDA default raises on an XLA host: no driver, or no CUDA type in a CPU build of torch)."""
        argument = node.args[0].value
        type_name = self._named_type(argument)
        if type_name is None:
            return
        self._rewritten.add(argument)
        torch = self.ctx.local_name("torch", "torch")
        # A string keeps its quotes and prefix (`'torch.cuda.FloatTensor'` -> `'torch.FloatTensor'`).
        cpu = argument.with_changes(value=argument.value.replace("torch.cuda.", "torch.", 1)) \
            if isinstance(argument, cst.SimpleString) else patterns.parsed_expression(f"{torch}.{type_name}")
        self.replace(argument, lambda updated: cpu,
                     f"{short(node)}: the default tensor type stays on the CPU ({short(cpu)}): tensors built "
                     "without a device (torch.Tensor(n), torch.zeros(n)) start on the CPU, where the original's "
                     "started on the GPU; the script's moves, now to the XLA device, place them")
