"""XLA108 data-parallel-removed: torch.nn.DataParallel goes; the model runs on the one XLA device of its process.

What it does:
    ``model = nn.DataParallel(model, device_ids=...)`` is removed (``net = DataParallel(model)`` becomes
    ``net = model``; a ``DataParallel(...)`` call elsewhere becomes its module), in any spelling
    (``torch.nn.DataParallel``, ``nn.parallel.DataParallel``, an import of it). Where the script reaches
    the wrapped module through ``model.module`` (a name it bound to the wrapper, and never to a
    DistributedDataParallel one), that becomes ``model``. When the script saves or loads state dicts, a
    finding says that the keys lose the ``module.`` prefix DataParallel gave them.

Why:
    DataParallel is single-process multi-GPU: it scatters each batch over CUDA devices and replicates the
    model with CUDA kernels. On an XLA host it moves the model to ``cuda:0`` wherever a GPU is visible, and
    fails otherwise. An XLA process drives one device; data parallelism over several is the distributed
    form (one process per device, ``--distributed``). Checkpoints written by the original have keys
    ``module.<name>``; the migrated script's have ``<name>``.

Example:
    model = nn.DataParallel(model).cuda()
    torch.save(model.module.state_dict(), "model.pt")

Use instead:
    model = model.cuda()
    torch.save(model.state_dict(), "model.pt")
"""

from __future__ import annotations

from keyword import iskeyword

import libcst as cst

from xla_migrate.analysis.cuda_only import DATA_PARALLEL
from xla_migrate.engine.rule import Rule
from xla_migrate.syntax import patterns
from xla_migrate.transforms.common import short

STATE_DICT_METHODS = ("state_dict", "load_state_dict")
# The functional form: runs a module on its inputs over the GPUs and returns the output.
FUNCTIONAL = ("torch.nn.parallel.data_parallel", "torch.nn.parallel.data_parallel.data_parallel")


class DataParallelRemoved(Rule):
    code = "XLA108"
    name = "data-parallel-removed"
    summary = "torch.nn.DataParallel(model) -> model (one XLA device per process); model.module -> model"
    fix_safety = "review"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._wrapped: set[str] = set()  # spellings bound to a DataParallel wrapper
        self._modules: list[cst.Attribute] = []  # `<spelling>.module` reads
        self._removals: list[cst.Call] = []
        self._state_dicts = False

    def visit_Call(self, node: cst.Call) -> None:
        if patterns.method_call(node, *STATE_DICT_METHODS):
            self._state_dicts = True
        if self.ctx.is_call_to(node, *FUNCTIONAL):
            self._functional(node)
            return
        if not self.ctx.is_call_to(node, *DATA_PARALLEL):
            return
        args = patterns.positional(node)
        module_arg = args[0] if args else patterns.keyword(node, "module")
        if module_arg is None:
            return
        self._removals.append(node)
        for module in ("torch.nn", "torch.nn.parallel", "torch.nn.parallel.data_parallel"):
            self.import_may_be_dead(module, "DataParallel")
        parent = self.ctx.parent(node)
        target = None
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1 and parent.value is node:
            target = patterns.dotted_name(parent.targets[0].target)
        if target is not None:
            self._wrapped.add(target)
        statement = self.ctx.parent(parent) if isinstance(parent, cst.Assign) else None
        if (target is not None and patterns.dotted_name(module_arg.value) == target
                and isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
            self.remove(parent, f"removed {short(node)}: one XLA device per process, no DataParallel")
            return
        self.replace(node, lambda updated: _module_of(updated),
                     f"{short(node)} -> {short(module_arg.value)}: one XLA device per process, no DataParallel")

    def _functional(self, node: cst.Call) -> None:
        """``data_parallel(module, inputs, device_ids, output_device, dim, module_kwargs)`` runs the module on the
        inputs (a tuple of them unpacked) over the GPUs: on the one XLA device it is the module's call."""
        module = patterns.argument(node, 0, "module")
        inputs = patterns.argument(node, 1, "inputs")
        kwargs = patterns.argument(node, 5, "module_kwargs")
        if module is None or inputs is None or any(arg.star for arg in node.args):
            return  # a **kwargs may hold module_kwargs
        if isinstance(inputs.value, cst.Tuple):
            passed = [cst.Arg(element.value, star="*" if isinstance(element, cst.StarredElement) else "")
                      for element in inputs.value.elements]
        else:
            passed = [cst.Arg(inputs.value)]
        if kwargs is not None:
            passed.extend(_keywords(kwargs.value))
        for name in ("torch.nn.parallel", "torch.nn.parallel.data_parallel"):
            self.import_may_be_dead(name, "data_parallel")
        call = cst.Call(module.value, [arg.with_changes(comma=cst.MaybeSentinel.DEFAULT) for arg in passed])
        self.replace(node, lambda updated: call.with_changes(lpar=updated.lpar, rpar=updated.rpar),
                     f"{short(node)} -> {short(call)}: the module's own call on the one XLA device of the process")

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value == "module":
            self._modules.append(node)

    def leave_Module(self, original_node: cst.Module) -> None:
        ddp = self.ctx.facts.ddp_models
        for node in self._modules:
            spelling = patterns.dotted_name(node.value)
            if spelling in self._wrapped and spelling not in ddp and not self.ctx.is_write_target(node):
                self.replace(node, lambda updated: updated.value,
                             f"{short(node)} -> {spelling}: the model is no longer wrapped in DataParallel")
        if self._state_dicts and self._removals:
            self.finding(self._removals[0], "without DataParallel the state dict keys lose their \"module.\" "
                         "prefix: checkpoints the original wrote do not load as they are, and code that strips "
                         "the prefix (k[7:]) now cuts the names",
                         "load old checkpoints with torch.nn.modules.utils.consume_prefix_in_state_dict_if_present"
                         "(state_dict, \"module.\") before load_state_dict; drop code that strips the prefix")


def _keywords(mapping: cst.BaseExpression) -> list[cst.Arg]:
    """``{"a": 1}`` as ``a=1`` where every key is a string that names a keyword; else ``**mapping``."""
    if isinstance(mapping, cst.Dict):
        keys = [patterns.string_value(element.key) if isinstance(element, cst.DictElement) else None
                for element in mapping.elements]
        if all(key is not None and key.isidentifier() and not iskeyword(key) for key in keys):
            return [cst.Arg(element.value, keyword=cst.Name(key), equal=cst.AssignEqual(
                whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")))
                for key, element in zip(keys, mapping.elements)]
    return [cst.Arg(mapping, star="**")]


def _module_of(call: cst.Call) -> cst.BaseExpression:
    args = patterns.positional(call)
    value = args[0].value if args else patterns.keyword(call, "module").value
    return value.with_changes(lpar=call.lpar, rpar=call.rpar) if call.lpar and not value.lpar else value
