"""XLA416 fsdp-state-dict: torch FSDP's state-dict and optimizer-state APIs become FSDPv2's plain ones (spmd form).

What it does:
    With ``--data-parallel spmd`` (``2.9`` target), where XLA415 makes torch FSDP FSDPv2
    (``SpmdFullyShardedDataParallel``), the APIs that gathered or scattered FSDP's sharded state go:

    - ``with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, ...):`` -> its body (the ``with``
      goes); ``SHARDED_STATE_DICT`` and ``LOCAL_STATE_DICT`` are reported (a sharded checkpoint is
      ``torch.distributed.checkpoint`` with torch_xla's ``SPMDSavePlanner``/``SPMDLoadPlanner``).
    - ``FSDP.full_optim_state_dict(model, optim)``, ``FSDP.optim_state_dict(model, optim)`` and torch's
      ``get_optimizer_state_dict(model, optim)`` -> ``optim.state_dict()``;
      ``set_optimizer_state_dict(model, optim, state)`` -> ``optim.load_state_dict(state)``.
    - ``get_model_state_dict(model)`` -> ``model.module.state_dict()``, ``set_model_state_dict(model, state)``
      -> ``model.module.load_state_dict(state)`` (``torch.distributed.checkpoint.state_dict``); and
      ``model.state_dict()`` / ``model.load_state_dict(...)`` on a name the FSDP wrap was assigned to (or
      ``fully_shard`` was called on) go through ``.module`` too. ``options=`` (``StateDictOptions``) goes.
    - ``dcp.save``/``dcp.load`` (``torch.distributed.checkpoint``) with no ``planner=`` are reported with the
      SPMD planner to pass.

    In the other forms nothing changes: XLA415 reports the FSDP wrap itself.

Why:
    FSDPv2 keeps one program's global tensors, sharded over the devices by annotations: ``state_dict()`` of
    the wrapped module already holds every parameter whole (logically; ``.cpu()`` gathers it) under the
    original names, and the optimizer's state is the optimizer's. torch's FSDP APIs expect torch FSDP's
    flat parameters and process group: on the FSDPv2 wrapper they raise. The wrapper's own ``state_dict()``
    prefixes every key with ``_orig_module.`` (torch_xla 2.9), so a checkpoint saved through it would not
    load into the plain model: ``.module`` keeps the names FSDP's full state dict had. Measured on 4 CPU
    devices (torch_xla 2.9): ``model.module.state_dict()`` and ``optim.state_dict()`` saved with
    ``torch.distributed.checkpoint`` and ``SPMDSavePlanner``, loaded with ``SPMDLoadPlanner``, round-trip
    exactly and keep each parameter's sharding.

Example:
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=True)):
        state = model.state_dict()
    optim_state = FSDP.full_optim_state_dict(model, optimizer)

Use instead:
    state = model.module.state_dict()
    optim_state = optimizer.state_dict()
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.engine.rule import Rule
from xla_migrate.syntax import patterns
from xla_migrate.transforms.common import imported_from, short
from xla_migrate.transforms.distributed.torch_fsdp import fsdp_call

_FSDP = "torch.distributed.fsdp.FullyShardedDataParallel."
_DCP_STATE = "torch.distributed.checkpoint.state_dict."
_OPTIM_GETTERS = {_FSDP + "full_optim_state_dict", _FSDP + "optim_state_dict", _DCP_STATE + "get_optimizer_state_dict"}
_DCP = {"torch.distributed.checkpoint.save": "SPMDSavePlanner", "torch.distributed.checkpoint.load": "SPMDLoadPlanner",
        "torch.distributed.checkpoint.state_dict_saver.save": "SPMDSavePlanner",
        "torch.distributed.checkpoint.state_dict_loader.load": "SPMDLoadPlanner"}


def _arg(call: cst.Call, index: int, keyword: str) -> cst.Arg | None:
    positional = patterns.positional(call)
    if len(positional) > index:
        return positional[index]
    return patterns.keyword(call, keyword)


class FsdpStateDict(Rule):
    code = "XLA416"
    name = "fsdp-state-dict"
    summary = "spmd form: FSDP state-dict / optimizer-state APIs -> model.module.state_dict(), optim.state_dict()"
    fix_safety = "review"
    targets = ("2.9",)
    # tests/goldens.py: this rule's cases are also migrated in the spmd form.
    golden_forms = ("spmd",)

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._wrapped = self._wrapped_names(ctx.module) if ctx.spmd_form else {}

    def _wrapped_names(self, module: cst.Module) -> dict[str, tuple[int, int]]:
        """Names the FSDP wrap is assigned to (``model = FSDP(model, ...)``) or fully_shard is called on, with
        where the (first) wrap is: only later calls see the wrapper."""
        names: dict[str, tuple[int, int]] = {}
        ctx = self.ctx
        for node in patterns.find_all(module, lambda n: isinstance(n, (cst.Assign, cst.Call))):
            if isinstance(node, cst.Assign):
                if isinstance(node.value, cst.Call) and fsdp_call(ctx.qualnames(node.value.func)) == "FSDP1":
                    for target in node.targets:
                        if isinstance(target.target, cst.Name):
                            names.setdefault(target.target.value, ctx.position(node))
            elif fsdp_call(ctx.qualnames(node.func)) == "FSDP2":
                first = _arg(node, 0, "module")
                if first is not None and isinstance(first.value, cst.Name):
                    names.setdefault(first.value.value, ctx.position(node))
        return names

    def visit_With(self, node: cst.With) -> None:
        if not self.ctx.spmd_form:
            return
        calls = [item.item for item in node.items if isinstance(item.item, cst.Call)
                 and _FSDP + "state_dict_type" in self.ctx.qualnames(item.item.func)]
        if not calls:
            return
        kind = _arg(calls[0], 1, "state_dict_type")
        full = kind is not None and patterns.code_of(kind.value).endswith("FULL_STATE_DICT")
        if not full or len(node.items) > 1 or node.asynchronous is not None:
            self.finding(calls[0], f"{short(calls[0])}: FSDPv2 has no state-dict types (its state_dict() holds "
                         "the global tensors)", "for a sharded checkpoint save model.module.state_dict() with "
                         "torch.distributed.checkpoint.save(..., planner=torch_xla.experimental."
                         "distributed_checkpoint.SPMDSavePlanner()) and load with SPMDLoadPlanner(); for a full "
                         "one drop the with and call model.module.state_dict()")
            return
        self.replace(node, lambda updated: cst.FlattenSentinel(list(updated.body.body)),
                     f"{short(calls[0])}: the with goes (FSDPv2's state_dict() holds the full tensors already)")

    def visit_Call(self, node: cst.Call) -> None:
        if not self.ctx.spmd_form:
            return
        names = self.ctx.qualnames(node.func)
        if names & _OPTIM_GETTERS:
            self._method(node, 1, "optim", "state_dict", [])
        elif _DCP_STATE + "set_optimizer_state_dict" in names:
            self._method(node, 1, "optimizers", "load_state_dict", [(2, "optim_state_dict")])
        elif _DCP_STATE + "get_model_state_dict" in names:
            self._method(node, 0, "model", "state_dict", [], through_module=True)
        elif _DCP_STATE + "set_model_state_dict" in names:
            self._method(node, 0, "model", "load_state_dict", [(1, "model_state_dict")], through_module=True)
        elif names & set(_DCP) and patterns.keyword(node, "planner") is None:
            planner = _DCP[sorted(names & set(_DCP))[0]]
            self.finding(node, f"{short(node)}: torch.distributed.checkpoint's default planner does not know "
                         "torch_xla's sharded tensors", f"pass planner=torch_xla.experimental.distributed_checkpoint"
                         f".{planner}() (import torch_xla.experimental.distributed_checkpoint)")
        elif (isinstance(node.func, cst.Attribute) and node.func.attr.value in ("state_dict", "load_state_dict")
              and isinstance(node.func.value, cst.Name) and node.func.value.value in self._wrapped
              and self.ctx.position(node) > self._wrapped[node.func.value.value]):
            owner = node.func.value
            self.replace(owner, lambda updated: cst.Attribute(updated, cst.Name("module")),
                         f"{owner.value}.{node.func.attr.value}() -> {owner.value}.module.{node.func.attr.value}() "
                         "(the FSDPv2 wrapper's own keys start with _orig_module.)")

    def _method(self, node: cst.Call, owner_index: int, owner_keyword: str, method: str,
                args: list[tuple[int, str]], through_module: bool = False) -> None:
        owner = _arg(node, owner_index, owner_keyword)
        values = [_arg(node, index, keyword) for index, keyword in args]
        if owner is None or any(value is None for value in values):
            self.finding(node, f"{short(node)}: torch FSDP's state API on an FSDPv2 model",
                         f"call .{method}() on the {'model.module' if through_module else 'optimizer'} instead")
            return
        target = owner.value
        if through_module:
            target = cst.Attribute(target, cst.Name("module"))
        new = cst.Call(cst.Attribute(target, cst.Name(method)),
                       [cst.Arg(value.value) for value in values if value is not None])
        self.replace(node, new.with_changes(lpar=node.lpar, rpar=node.rpar),
                     f"{short(node)} -> {patterns.code_of(new)} (FSDPv2 keeps the global tensors: the plain "
                     "state APIs hold them whole)")
        for qualname in sorted(self.ctx.qualnames(node.func)):
            for module_name, name in imported_from(self.ctx, node.func, qualname):
                self.import_may_be_dead(module_name, name)
