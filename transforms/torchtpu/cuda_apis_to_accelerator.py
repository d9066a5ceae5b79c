"""XLA701 cuda-apis-to-accelerator: torch.cuda calls become torch.accelerator calls on the torchtpu target.

What it does:
    Only for ``--target torchtpu``. Rewrites the ``torch.cuda`` calls that have a device-agnostic form:
    ``is_available``, ``device_count``, ``current_device`` (``current_device_index``), ``synchronize``,
    ``empty_cache`` and the memory statistics (``memory_allocated``, ``max_memory_allocated``,
    ``memory_reserved``, ``max_memory_reserved``, ``memory_stats``, ``reset_peak_memory_stats``,
    ``reset_accumulated_memory_stats``; ``memory_cached`` and ``reset_max_memory_allocated`` by their
    current names) become ``torch.accelerator.<name>(...)`` with the same arguments. ``torch.cuda.manual_seed``
    / ``manual_seed_all`` become ``torch.manual_seed`` (which seeds the TPU), or are removed where the script
    already calls ``torch.manual_seed``. ``torch.cuda.set_device(...)`` statements are removed (one device per
    process), and so are assignments to ``torch.backends.cudnn.*`` and ``torch.backends.cuda.*`` (cuDNN and
    TF32 switches). A device test against ``"cuda"`` (``device.type == "cuda"``, ``"cuda" in str(device)``,
    ``args.device.startswith("cuda")``) tests ``"tpu"`` instead, TorchTPU's device type, so the accelerator
    path stays the accelerator's and the CPU path the CPU's. Any spelling works (``import torch as T``, ``from torch import cuda``). What is not
    listed here stays, and XLA900 reports it.

Why:
    torch_tpu 0.2.0 answers availability, count, synchronize and memory statistics through
    ``torch.accelerator``; its ``torch.tpu`` device helpers raise when called from user code on torch 2.11
    and later. The ``torch.accelerator`` form also runs on the CPU (no accelerator: ``is_available()`` is
    False), so the output keeps the original's CPU fallback.

Example:
    torch.backends.cudnn.benchmark = True
    torch.cuda.manual_seed_all(seed)
    print(torch.cuda.max_memory_allocated() / 2**20)
    torch.cuda.synchronize()

Use instead:
    torch.manual_seed(seed)
    print(torch.accelerator.max_memory_allocated() / 2**20)
    torch.accelerator.synchronize()
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.analysis.facts import is_cuda_device_expr
from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.common import is_backend_flag, short

# torch.cuda.<name> -> torch.accelerator.<name> (all in torch 2.9 and later: tests/test_torchtpu.py checks).
ACCELERATOR = {
    "is_available": "is_available",
    "device_count": "device_count",
    "current_device": "current_device_index",
    "synchronize": "synchronize",
    "empty_cache": "empty_cache",
    "memory_allocated": "memory_allocated",
    "max_memory_allocated": "max_memory_allocated",
    "memory_reserved": "memory_reserved",
    "max_memory_reserved": "max_memory_reserved",
    "memory_cached": "memory_reserved",
    "max_memory_cached": "max_memory_reserved",
    "memory_stats": "memory_stats",
    "reset_peak_memory_stats": "reset_peak_memory_stats",
    "reset_max_memory_allocated": "reset_peak_memory_stats",
    "reset_accumulated_memory_stats": "reset_accumulated_memory_stats",
}
CALLS = {f"torch.cuda.{name}": new for name, new in ACCELERATOR.items()} | {
    f"torch.cuda.memory.{name}": new for name, new in ACCELERATOR.items()}
SEEDS = ("torch.cuda.manual_seed", "torch.cuda.manual_seed_all", "torch.cuda.random.manual_seed",
         "torch.cuda.random.manual_seed_all")
SET_DEVICE = ("torch.cuda.set_device",)


class CudaApisToAccelerator(Rule):
    code = "XLA701"
    name = "cuda-apis-to-accelerator"
    summary = "torch.cuda availability, count, synchronize, memory statistics, seeds -> torch.accelerator (torchtpu)"
    targets = ("torchtpu",)
    on_xla_code = True  # CUDA remnants in code already on XLA are migrated too
    fix_safety = "review"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._torch_seeds = "manual_seed" in ctx.input_code and any(
            ctx.is_call_to(n, "torch.manual_seed") for n in patterns.find_all(ctx.module, lambda n: isinstance(n, cst.Call)))

    def _may_free_imports(self, node: cst.CSTNode | None = None) -> None:
        for name in self.ctx.qualnames(node) if node is not None else ():
            module, _, attribute = name.rpartition(".")
            if module.startswith(("torch.cuda", "torch.backends")):
                self.import_may_be_dead(module, attribute)
        for module, name in (("torch", "cuda"), ("torch.backends", "cudnn"), ("torch.backends.cudnn", None),
                             ("torch.backends.cuda", None), ("torch.backends", "cuda")):
            self.import_may_be_dead(module, name)

    def _statement_of(self, node: cst.CSTNode) -> cst.BaseSmallStatement | None:
        parent = self.ctx.parent(node)
        return parent if isinstance(parent, cst.Expr) and parent.value is node else None

    def visit_Call(self, node: cst.Call) -> None:
        if patterns.method_call(node, "startswith") and len(node.args) == 1:
            self._device_type(node.args[0].value, node)
            return
        names = self.ctx.qualnames(node.func)
        mapped = next((CALLS[n] for n in sorted(names) if n in CALLS), None)
        if mapped is not None and (self._left_to_others(node) or self._test_of_kept_gate(node)):
            return
        if mapped is not None:
            func = patterns.parsed_expression(self.ctx.spell("accelerator_api", mapped))
            self.replace(node, lambda updated: updated.with_changes(func=func),
                         f"{short(node.func)}() -> {patterns.code_of(func)}()")
            self._may_free_imports(node.func)
        elif names & set(SEEDS):
            self._seed(node)
        elif names & set(SET_DEVICE):
            statement = self._statement_of(node)
            if statement is not None:
                self.remove(statement, f"removed {short(node)}: TorchTPU drives one device per process")
                self._may_free_imports(node.func)

    def _left_to_others(self, node: cst.BaseExpression) -> bool:
        """Inside a CUDA device expression that XLA101 (or the AMP rules, a device type) replaces as a whole:
        ``torch.device("cuda" if torch.cuda.is_available() else "cpu")``. A choice whose test keeps a user's
        part (``"cuda" if use_gpu and torch.cuda.is_available() else "cpu"``) keeps its test: rewritten here."""
        current = self.ctx.parent(node)
        while current is not None and not isinstance(current, (cst.BaseSmallStatement, cst.BaseStatement)):
            if isinstance(current, cst.FormattedStringExpression) and current.equal is not None:
                return True  # f"{torch.cuda.is_available()=}" prints its own text
            if isinstance(current, cst.IfExp) and is_cuda_device_expr(current.body, self.ctx.qualnames) and (
                    not is_cuda_device_expr(current.orelse, self.ctx.qualnames)
                    and self.ctx.device_flow.residue(current.test) is not None):
                return False
            if is_cuda_device_expr(current, self.ctx.qualnames) and not isinstance(current, cst.Comparison):
                return True
            if isinstance(current, cst.IfExp) and (patterns.is_cuda_string(current.body)
                                                   or patterns.is_cuda_string(current.orelse)):
                return True
            current = self.ctx.parent(current)
        return False

    def _test_of_kept_gate(self, node: cst.CSTNode) -> bool:
        """In code already on torch_xla the branches of a CUDA test are left as they are (the engine hides them
        from the rules that edit): its test stays too, or the next run would find the branch no longer gated and
        rewrite it then (not idempotent)."""
        if not self.ctx.facts.runs_on_xla:
            return False
        child, current = node, self.ctx.parent(node)
        while current is not None and not isinstance(current, (cst.BaseSmallStatement, cst.SimpleStatementLine)):
            if isinstance(current, (cst.If, cst.While, cst.IfExp)) and child is current.test:
                return True
            if isinstance(current, cst.BaseCompoundStatement):
                return False
            child, current = current, self.ctx.parent(current)
        return False

    def _seed(self, node: cst.Call) -> None:
        args = patterns.positional(node) or [a for a in node.args if a.keyword and a.keyword.value == "seed"]
        statement = self._statement_of(node)
        if len(args) != 1:
            return
        if statement is not None and self._torch_seeds:
            self.remove(statement, f"removed {short(node)}: torch.manual_seed, which the script calls, seeds the TPU")
        else:
            func = patterns.parsed_expression(self.ctx.spell("manual_seed", "_").rsplit("(", 1)[0])
            self.replace(node, lambda updated: updated.with_changes(
                func=func, args=[a.with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT) for a in updated.args]),
                f"{short(node)} -> {patterns.code_of(func)}(...): it seeds the TPU")
        self._may_free_imports(node.func)

    # Device tests: `device.type == "cuda"`, `"cuda" in device`, `args.device.startswith("cuda")` ----------------
    def visit_Comparison(self, node: cst.Comparison) -> None:
        operands = [node.left, *(c.comparator for c in node.comparisons)]
        if any(isinstance(c.operator, (cst.Equal, cst.NotEqual, cst.In, cst.NotIn)) for c in node.comparisons):
            for operand in operands:
                self._device_type(operand, node)

    def _device_type(self, literal: cst.BaseExpression, test: cst.CSTNode) -> None:
        if not (isinstance(literal, cst.SimpleString) and patterns.string_value(literal) == "cuda"):
            return
        if self._left_to_others(literal):  # `device_type = "cuda" if "cuda" in device else "cpu"`: XLA201's
            return
        if self._test_of_kept_gate(literal):
            return
        kind = self.ctx.spell("device_type")  # '"tpu"': the device's type under TorchTPU ("cpu" without it)
        quote = literal.value[-1]
        new = cst.SimpleString(kind.replace('"', quote))
        self.replace(literal, new, f"{short(test)}: {literal.value} -> {new.value}, TorchTPU's device type")

    def visit_Assign(self, node: cst.Assign) -> None:
        flags = [self._flag(t.target) for t in node.targets]
        if flags and all(flags):
            self.remove(node, f"removed {short(node)}: a cuDNN/TF32 switch, no effect on a TPU")
            self._may_free_imports()

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None and self._flag(node.target):
            self.remove(node, f"removed {short(node)}: a cuDNN/TF32 switch, no effect on a TPU")
            self._may_free_imports()

    def _flag(self, target: cst.BaseExpression) -> bool:
        return is_backend_flag(self.ctx, target)
