"""The facts pass: one read-only walk that tells the rules what the script holds.

Rules match meanings, not spellings: names are resolved through imports and aliases (``import torch as T``,
``from torch import cuda``) with libcst's QualifiedNameProvider, resolved once for the whole pipeline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import GlobalScope, Scope

from ..syntax import patterns

QualNames = Callable[[cst.CSTNode], set[str]]

OPTIMIZER_MODULES = ("torch.optim.", "torch_xla.amp.syncfree.")
# Names under torch.optim that are not optimizers.
NOT_OPTIMIZERS = ("lr_scheduler", "swa_utils", "Optimizer")
DATALOADERS = ("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader")
GRAD_SCALERS = ("torch.cuda.amp.GradScaler", "torch.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler",
                "torch.amp.grad_scaler.GradScaler", "torch_xla.amp.GradScaler")
AUTOCASTS = ("torch.cuda.amp.autocast", "torch.autocast", "torch.amp.autocast", "torch.cuda.amp.autocast_mode.autocast",
             "torch_xla.amp.autocast")
XLA_DEVICES = ("torch_xla.core.xla_model.xla_device", "torch_xla.device")
DEVICE_LOADERS = ("torch_xla.distributed.parallel_loader.MpDeviceLoader",)
DDP = ("torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel")
DISTRIBUTED_SAMPLERS = ("torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler")
INIT_PROCESS_GROUP = ("torch.distributed.init_process_group", "torch.distributed.distributed_c10d.init_process_group")
MP_SPAWN = ("torch.multiprocessing.spawn", "torch.multiprocessing.spawn.spawn", "torch.multiprocessing.start_processes")
# torch_xla's own multi-replica calls: a script already migrated stays distributed (idempotence).
XLA_DISTRIBUTED = ("torch_xla.distributed.xla_multiprocessing.spawn", "torch_xla.launch",
                   "torch_xla.core.xla_model.xrt_world_size", "torch_xla.core.xla_model.get_ordinal",
                   "torch_xla.core.xla_model.get_local_ordinal", "torch_xla.core.xla_model.is_master_ordinal",
                   "torch_xla.core.xla_model.all_reduce", "torch_xla.core.xla_model._fetch_gradients",
                   "torch_xla.core.xla_model.rendezvous", "torch_xla.runtime.world_size",
                   "torch_xla.runtime.global_ordinal", "torch_xla.runtime.local_ordinal")
# Calls that make a script distributed (the distributed fact).
DISTRIBUTED_CALLS = (*DDP, *DISTRIBUTED_SAMPLERS, *INIT_PROCESS_GROUP, *MP_SPAWN, *XLA_DISTRIBUTED)
# The environment variables torchrun (and torch.distributed.launch --use_env) sets for each worker.
TORCHRUN_VARIABLES = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def environment_variable(node: cst.CSTNode, qualnames: QualNames) -> str | None:
    """The variable read by ``os.environ["X"]``, ``os.environ.get("X", d)`` or ``os.getenv("X", d)``."""
    if isinstance(node, cst.Subscript) and "os.environ" in qualnames(node.value) and len(node.slice) == 1:
        index = node.slice[0].slice
        return patterns.string_value(index.value) if isinstance(index, cst.Index) else None
    if isinstance(node, cst.Call) and node.args:
        names = qualnames(node.func)
        if "os.getenv" in names or "os.environ.get" in names or (
                isinstance(node.func, cst.Attribute) and node.func.attr.value == "get"
                and "os.environ" in qualnames(node.func.value)):
            first = node.args[0]
            return patterns.string_value(first.value) if first.keyword is None and not first.star else None
    return None
# Hugging Face libraries whose scripts get the HF rules (XLA6xx) rather than the general ones where both would
# apply (the entry point: XLA602 writes ``_mp_fn`` for HF scripts, the distributed entry-point rule for others).
HF_LIBRARIES = ("transformers", "trl", "accelerate")
ACCELERATORS = ("accelerate.Accelerator", "accelerate.accelerator.Accelerator")


def is_cuda_device_expr(node: cst.BaseExpression, qualnames: QualNames) -> bool:
    """A CUDA device as a script spells it: ``torch.device("cuda")``, ``"cuda:0"``, ``f"cuda:{rank}"``,
    ``torch.device("cuda", i)``, ``"cuda" if torch.cuda.is_available() else "cpu"`` or its ``torch.device``."""
    if patterns.is_cuda_string(node):
        return True
    if isinstance(node, cst.IfExp):
        return is_cuda_device_expr(node.body, qualnames)
    if isinstance(node, cst.Call) and "torch.device" in qualnames(node.func):
        args = patterns.positional(node)
        type_arg = patterns.keyword(node, "type")
        first = args[0].value if args else (type_arg.value if type_arg else None)
        return first is not None and is_cuda_device_expr(first, qualnames)
    return False


# Words of a name that says it holds a number of things (``num_gpu``, ``n_gpu``, ``gpu_count``), not an index.
COUNT_WORDS = frozenset({"n", "num", "nb", "number", "count", "counts", "total", "world"})


def is_cuda_ordinal(target: str, value: cst.BaseExpression, qualnames: QualNames) -> bool:
    """``device = rank % torch.cuda.device_count()``, ``gpu = torch.cuda.current_device()``: a CUDA device
    index bound as the device (by a name that says so). A bare ``torch.cuda.device_count()`` is a number of
    devices, whatever the name (``n_gpu = torch.cuda.device_count()``), and so is anything bound to a name
    that says it counts (``num_gpu``, ``ngpus``, ``gpu_count``)."""
    words = set(target.rsplit(".", 1)[-1].lower().split("_"))
    if not words & {"device", "dev", "gpu"} or words & COUNT_WORDS:
        return False
    if isinstance(value, cst.Call) and qualnames(value.func) & {"torch.cuda.device_count"}:
        return False
    return bool(patterns.find_all(value, lambda n: isinstance(n, cst.Call) and bool(
        qualnames(n.func) & {"torch.cuda.device_count", "torch.cuda.current_device"})))


def is_optimizer_param_name(name: str) -> bool:
    """A parameter name that says it holds an optimizer: ``optimizer``, ``opt``, ``base_optimizer``."""
    return name in ("optimizer", "opt") or name.endswith("_optimizer")


def is_xla_device_expr(node: cst.BaseExpression, qualnames: QualNames) -> bool:
    return isinstance(node, cst.Call) and bool(qualnames(node.func) & set(XLA_DEVICES))


@dataclass
class Facts:
    # Module -> the local name the script binds it to (``torch`` -> ``T`` after ``import torch as T``).
    module_aliases: dict[str, str] = field(default_factory=dict)
    # Module -> (local name, import node) of each module-level import binding it (inside a top-level try or
    # if too; not in a function or class), in source order: what new code may reuse (ctx.local_name).
    module_imports: dict[str, list[tuple[str, cst.CSTNode]]] = field(default_factory=dict)
    # Every name bound at module level (new names must not collide with them).
    global_names: set[str] = field(default_factory=set)
    # Every local name an absolute import binds, at any level (``import a.b`` binds ``a``): the only roots
    # through which a name resolves to a module (ctx.torch_names).
    import_bound_names: set[str] = field(default_factory=set)
    # Names that hold a device, per scope (assigned from a device expression, or a parameter named device).
    device_names: dict[Scope, set[str]] = field(default_factory=dict)
    # The bindings that make those names hold a device: assignment targets (Name nodes) and parameters.
    device_bindings: set[cst.CSTNode] = field(default_factory=set)
    # Class -> attribute of self holding its device (``self.device = torch.device("cuda")``).
    class_device_attrs: dict[cst.ClassDef, str] = field(default_factory=dict)
    # Spellings (``optimizer``, ``self.opt``) bound to optimizers, GradScalers, DataLoaders.
    optimizers: set[str] = field(default_factory=set)
    # Function parameters that by their name hold an optimizer (``optimizer``, ``opt``, ``*_optimizer``), per scope.
    optimizer_params: dict[Scope, set[str]] = field(default_factory=dict)
    scalers: set[str] = field(default_factory=set)
    loaders: set[str] = field(default_factory=set)
    # Spellings bound to loaders that already deliver batches on the XLA device (``pl.MpDeviceLoader(...)``,
    # ``pl.ParallelLoader(...).per_device_loader(device)``).
    device_loaders: set[str] = field(default_factory=set)
    # Device loader spelling -> the spelling of the loader it wraps (``pl.MpDeviceLoader(train_loader, d)``).
    device_loader_sources: dict[str, str] = field(default_factory=dict)
    uses_amp: bool = False
    main_function: cst.FunctionDef | None = None
    main_guard: cst.If | None = None
    # Distributed signals (DDP, init_process_group, DistributedSampler, mp.spawn, torchrun's environment
    # variables), in source order; the script is distributed when there is one.
    distributed_signals: list[cst.CSTNode] = field(default_factory=list)
    # Spellings bound to a DistributedDataParallel wrapper (``model = DDP(model, ...)``).
    ddp_models: set[str] = field(default_factory=set)
    # Calls that show the code already runs on XLA: into torch_xla (its device, loaders, step barrier,
    # optimizer step, launcher, runtime), an ``xla`` process group or ``xla://``, ``torch.device("xla")``.
    xla_signals: list[cst.CSTNode] = field(default_factory=list)
    # The target upgrades torch_xla code instead of leaving it (torchtpu: XLA703 and XLA704 rewrite it), so code
    # on torch_xla is migrated as any other.
    upgrades_xla_code: bool = False

    @property
    def distributed(self) -> bool:
        return bool(self.distributed_signals)

    @property
    def runs_on_xla(self) -> bool:
        """The script already runs on torch_xla: it is not migrated a second time, only its CUDA remnants
        are (the rules marked ``on_xla_code``). Not so for a target that upgrades torch_xla code."""
        return bool(self.xla_signals) and not self.upgrades_xla_code
    # The script builds an ``accelerate.Accelerator``: Accelerate owns its device placement, loaders, optimizer
    # steps and launch, so the device rules (XLA101, XLA301, XLA302, XLA204) leave them alone (XLA605 says so).
    uses_accelerate: bool = False
    # The script hands its loaders to Lightning Fabric (``fabric.setup_dataloaders(...)``): under Fabric's XLA
    # strategies they come back as device loaders already; another one around them yields no batch (issue 36).
    fabric_loaders: bool = False

    @property
    def is_hf_script(self) -> bool:
        """The script imports a Hugging Face training library (transformers, trl, accelerate)."""
        return any(module.split(".")[0] in HF_LIBRARIES for module in self.module_aliases)


def _runs_on_xla(node: cst.Call, names: set[str]) -> bool:
    if any(name == "torch_xla" or name.startswith("torch_xla.") for name in names):
        return True
    if names & {"torch.distributed.init_process_group", "torch.device"}:
        return any(patterns.string_value(arg.value) in ("xla", "xla://") for arg in node.args)
    return False


class FactsCollector(cst.CSTVisitor):
    def __init__(self, qualnames: QualNames, scopes: dict[cst.CSTNode, Scope]) -> None:
        super().__init__()
        self.facts = Facts()
        self._qualnames = qualnames
        self._scopes = scopes
        self._function_depth = 0
        self._classes: list[cst.ClassDef] = []

    # Imports ---------------------------------------------------------------------------------------------
    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            module = patterns.dotted_name(alias.name)
            if module is None:
                continue
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                self._import(module, alias.asname.name.value, node)
            else:
                top = module.split(".")[0]
                self._import(top, top, node)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.module is None or node.relative or isinstance(node.names, cst.ImportStar):
            return
        base = patterns.dotted_name(node.module)
        for alias in node.names:
            local = alias.evaluated_alias or alias.evaluated_name
            self._import(f"{base}.{alias.evaluated_name}", local, node)

    def _import(self, module: str, local: str, node: cst.CSTNode) -> None:
        self.facts.import_bound_names.add(local)
        self.facts.module_aliases.setdefault(module, local)
        if isinstance(self._scopes.get(node), GlobalScope):
            self.facts.module_imports.setdefault(module, []).append((local, node))

    # Scopes and definitions --------------------------------------------------------------------------------
    def visit_Module(self, node: cst.Module) -> None:
        scope = self._scopes.get(node)
        if scope is not None:
            self.facts.global_names = {a.name for a in scope.assignments}

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._classes.append(node)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._classes.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if self._function_depth == 0 and not self._classes and node.name.value == "main":
            self.facts.main_function = node
        self._function_depth += 1
        scope = self._scopes.get(node.body)
        for param in [*node.params.params, *node.params.kwonly_params, *node.params.posonly_params]:
            if param.name.value == "device" and scope is not None:
                self.facts.device_names.setdefault(scope, set()).add("device")
                self.facts.device_bindings.add(param)
            if is_optimizer_param_name(param.name.value) and scope is not None:
                self.facts.optimizer_params.setdefault(scope, set()).add(param.name.value)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._function_depth -= 1

    def visit_If(self, node: cst.If) -> None:
        test = node.test
        if (self._function_depth == 0 and isinstance(test, cst.Comparison)
                and patterns.dotted_name(test.left) == "__name__"
                and any(patterns.string_value(c.comparator) == "__main__" for c in test.comparisons)):
            self.facts.main_guard = node

    def visit_Call(self, node: cst.Call) -> None:
        names = self._qualnames(node.func)
        if names & set(AUTOCASTS) or names & set(GRAD_SCALERS):
            self.facts.uses_amp = True
        if names & set(ACCELERATORS):
            self.facts.uses_accelerate = True
        if patterns.method_call(node, "setup_dataloaders"):
            self.facts.fabric_loaders = True
        if names & set(DISTRIBUTED_CALLS) or environment_variable(node, self._qualnames) in TORCHRUN_VARIABLES:
            self.facts.distributed_signals.append(node)
        if _runs_on_xla(node, names) and not self._own_definition(node.func):
            self.facts.xla_signals.append(node)

    def _own_definition(self, func: cst.BaseExpression) -> bool:
        """``torch_xla()`` calls a function of the script's own named so, not torch_xla (its qualified name is
        the bare name): the file does not run on XLA for that."""
        if not isinstance(func, cst.Name):
            return False
        scope = self._scopes.get(func)
        assignments = scope[func.value] if scope is not None else ()
        return bool(assignments) and not any(
            isinstance(getattr(a, "node", None), (cst.Import, cst.ImportFrom)) for a in assignments)

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if environment_variable(node, self._qualnames) in TORCHRUN_VARIABLES:
            self.facts.distributed_signals.append(node)

    # Bindings ----------------------------------------------------------------------------------------------
    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._bind(target.target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._bind(node.target, node.value)

    def _bind(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        spelling = patterns.dotted_name(target)
        if spelling is None:
            return
        if (is_cuda_device_expr(value, self._qualnames) or is_xla_device_expr(value, self._qualnames)
                or self._chosen_device(value) or is_cuda_ordinal(spelling, value, self._qualnames)):
            self._bind_device(target)
        if not isinstance(value, cst.Call):
            return
        names = self._qualnames(value.func)
        if any(n.startswith(OPTIMIZER_MODULES) and not any(x in n for x in NOT_OPTIMIZERS) for n in names):
            self.facts.optimizers.add(spelling)
        elif names & set(GRAD_SCALERS):
            self.facts.scalers.add(spelling)
        elif names & set(DATALOADERS):
            self.facts.loaders.add(spelling)
        elif names & set(DEVICE_LOADERS) or patterns.method_call(value, "per_device_loader"):
            self.facts.device_loaders.add(spelling)
            args = patterns.positional(value)
            source = patterns.dotted_name(args[0].value) if args and names & set(DEVICE_LOADERS) else None
            if source is not None:
                self.facts.device_loader_sources.setdefault(spelling, source)
        elif names & set(DDP):
            self.facts.ddp_models.add(spelling)

    def _chosen_device(self, value: cst.BaseExpression) -> bool:
        """``torch.device(args.device)``: a device made from a value the script chooses (not a literal CPU)."""
        if not (isinstance(value, cst.Call) and "torch.device" in self._qualnames(value.func)):
            return False
        args = patterns.positional(value)
        return bool(args) and patterns.string_value(args[0].value) is None and not isinstance(
            args[0].value, (cst.FormattedString, cst.ConcatenatedString))

    def _bind_device(self, target: cst.BaseExpression) -> None:
        if isinstance(target, cst.Name):
            scope = self._scopes.get(target)
            if scope is not None:
                self.facts.device_names.setdefault(scope, set()).add(target.value)
                self.facts.device_bindings.add(target)
        elif (isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name)
                and target.value.value == "self" and self._classes):
            self.facts.class_device_attrs.setdefault(self._classes[-1], target.attr.value)


def collect_facts(module: cst.Module, qualnames: QualNames, scopes: dict[cst.CSTNode, Scope]) -> Facts:
    collector = FactsCollector(qualnames, scopes)
    module.visit(collector)
    return collector.facts
