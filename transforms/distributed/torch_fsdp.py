"""XLA415 torch-fsdp: torch FSDP1 becomes FSDPv2 in the spmd form; elsewhere FSDP is reported with the form to use.

What it does:
    Reports every call of torch's FSDP: FSDP1 ``FullyShardedDataParallel(model, ...)`` (``FSDP`` as it is
    usually imported) and FSDP2 ``fully_shard(model, ...)`` (``torch.distributed.fsdp`` or
    ``torch.distributed._composable.fsdp``), in every form and target. The finding says what to use: on
    ``2.9``, ``--data-parallel spmd`` (FSDPv2: ``SpmdFullyShardedDataParallel`` from
    ``torch_xla.experimental.spmd_fully_sharded_data_parallel`` over a ``("fsdp", "model")`` mesh, the batch
    sharded on ``"fsdp"``) or torch_xla's ``XlaFullyShardedDataParallel``
    (``torch_xla.distributed.fsdp``); on ``sagemaker``, ``XlaFullyShardedDataParallel``.

    In the spmd form (``--data-parallel spmd``) an FSDP1 wrap becomes FSDPv2:
    ``FSDP(model, device_id=local_rank, use_orig_params=True)`` ->
    ``fsdpv2.SpmdFullyShardedDataParallel(model, mesh=xs.Mesh(np.arange(n), (n, 1), ("fsdp", "model")))``
    with ``n = xr.global_runtime_device_count()``: the same devices in the same order as the ``"data"`` mesh
    the loader shards the batch on (XLA414), so the batch is sharded on ``"fsdp"``. The options FSDPv2
    derives or has no use for go (``device_id``, ``use_orig_params``, ``sync_module_states``,
    ``process_group``, ``limit_all_gathers``, ``forward_prefetch``, ``backward_prefetch``).
    ``auto_wrap_policy=`` is kept when the script's policies are torch's ``transformer_auto_wrap_policy``,
    ``size_based_auto_wrap_policy`` or ``lambda_auto_wrap_policy`` (imported by name from
    ``torch.distributed.fsdp.wrap``): that import becomes ``torch_xla.distributed.fsdp.wrap``'s, whose
    policies FSDPv2's recursive wrap calls (torch's take ``nonwrapped_numel=``, it passes
    ``unwrapped_params=``). A wrap with any other option (another policy such as ``ModuleWrapPolicy``,
    ``mixed_precision``, ``sharding_strategy``, ``cpu_offload``, ``param_init_fn``...) is reported, not
    rewritten.

    FSDP2 ``fully_shard`` in the spmd form: the root call (the last one outside a loop, on a name or an
    attribute: ``fully_shard(model)``) becomes ``model = fsdpv2.SpmdFullyShardedDataParallel(model, mesh=...)``
    on the same mesh; the per-block calls (in a loop, or on a part of the root: ``fully_shard(model.layers[0])``)
    go, with the loop that only made them: the root's FSDPv2 shards every parameter, and the compiler schedules
    the all-gathers a block's wrap would. ``mesh`` and ``reshard_after_forward`` go (the mesh, the compiler
    decide); any other option (``mp_policy=MixedPrecisionPolicy(...)``, ``offload_policy``,
    ``ignored_params``...) goes too and is reported with its line: FSDPv2 has no equivalent (the model
    computes in its parameters' dtype). A script whose calls do not fit that shape (no root, a call inside an
    expression) is reported, not rewritten.

Why:
    torch's FSDP shards parameters over a process group of CUDA (or CPU) devices: on an XLA device it
    raises (torch 2.9, torch_xla 2.9: "Device 'xla:0' does not have a corresponding backend registered as
    'torch.xla'" at ``FSDP(...)``), and without a migration the script keeps it silently. torch_xla shards a
    model its own ways: SPMD FSDPv2 (one program, the compiler inserts the collectives) or its FSDP wrapper
    for the replica forms. Their arguments (auto-wrap policies, mixed precision, state-dict types) differ.

Example:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    model = FSDP(model, device_id=local_rank, use_orig_params=True)

Use instead:
    # --target 2.9 --data-parallel spmd:
    model = fsdpv2.SpmdFullyShardedDataParallel(model, mesh=xs.Mesh(np.arange(xr.global_runtime_device_count()), (xr.global_runtime_device_count(), 1), ("fsdp", "model")))

Example (FSDP2):
    for block in model.blocks:
        fully_shard(block, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    fully_shard(model)

Use instead:
    # --target 2.9 --data-parallel spmd (mp_policy reported: FSDPv2 has no mixed-precision policy):
    model = fsdpv2.SpmdFullyShardedDataParallel(model, mesh=xs.Mesh(np.arange(xr.global_runtime_device_count()), (xr.global_runtime_device_count(), 1), ("fsdp", "model")))
"""

from __future__ import annotations

from typing import ClassVar

import libcst as cst

from xla_migrate.engine.rule import Rule
from xla_migrate.syntax import patterns
from xla_migrate.transforms.common import imported_from, short
from xla_migrate.transforms.distributed.fsdp2_to_fsdpv2 import fsdp2_to_fsdpv2

_MODULES = ("torch.distributed.fsdp.", "torch.distributed._composable.fsdp.")
_WRAPPERS = {"FullyShardedDataParallel": "FSDP1", "fully_shard": "FSDP2"}
# FSDP1 options FSDPv2 derives (the device, the process group: the mesh) or has no use for.
DROPPED = ("device_id", "use_orig_params", "sync_module_states", "process_group", "limit_all_gathers",
           "forward_prefetch", "backward_prefetch")
# torch's auto-wrap policy functions whose torch_xla twins (torch_xla.distributed.fsdp.wrap, the same names and
# options) FSDPv2's recursive wrap calls: it passes unwrapped_params= where torch's take nonwrapped_numel=.
_TORCH_WRAP = "torch.distributed.fsdp.wrap"
_XLA_WRAP = "torch_xla.distributed.fsdp.wrap"
POLICIES = ("transformer_auto_wrap_policy", "size_based_auto_wrap_policy", "lambda_auto_wrap_policy")


def fsdp_call(names: frozenset[str] | set[str]) -> str | None:
    """"FSDP1" or "FSDP2" when one of a call's qualified names is torch's FSDP wrapper, else None."""
    for name in names:
        last = name.rsplit(".", 1)[-1]
        if last in _WRAPPERS and name.startswith(_MODULES):
            return _WRAPPERS[last]
    return None


class TorchFsdp(Rule):
    code = "XLA415"
    name = "torch-fsdp"
    summary = "torch FSDP (FullyShardedDataParallel, fully_shard): FSDPv2 with --data-parallel spmd, else reported"
    fix_safety = "review"
    # tests/goldens.py: this rule's cases are also migrated in the spmd form.
    golden_forms: ClassVar[tuple[str, ...]] = ("spmd",)
    on_xla_code = True  # torch FSDP fails on XLA devices wherever it is left

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._fully_shards: list[tuple[cst.Call, frozenset[str]]] = []
        # (``from . import x`` has no module name)
        self._policy_imports = [small for line in ctx.module.body if isinstance(line, cst.SimpleStatementLine)
                                for small in line.body if isinstance(small, cst.ImportFrom)
                                and small.module is not None and patterns.code_of(small.module) == _TORCH_WRAP]
        self._policies_move = False

    def _policies_map(self) -> bool:
        """Every import from torch.distributed.fsdp.wrap names only policy functions torch_xla has too (a
        module-level ``from ... import``): the policy then moves with its import."""
        return bool(self._policy_imports) and all(
            not isinstance(node.names, cst.ImportStar) and all(
                isinstance(alias.name, cst.Name) and alias.name.value in POLICIES for alias in node.names)
            for node in self._policy_imports)

    def visit_Call(self, node: cst.Call) -> None:
        names = self.ctx.qualnames(node.func)
        kind = fsdp_call(names)
        if kind is None:
            return
        if kind == "FSDP1" and self.ctx.spmd_form and self._to_fsdpv2(node, names):
            return
        if kind == "FSDP2" and self.ctx.spmd_form:
            self._fully_shards.append((node, names))  # converted together, per function, at the end
            return
        self._report(node, kind)

    def leave_Module(self, original_node: cst.Module) -> None:
        groups: dict[cst.CSTNode | None, list[tuple[cst.Call, frozenset[str]]]] = {}
        for call, names in self._fully_shards:
            groups.setdefault(self._function_of(call), []).append((call, names))
        for calls in groups.values():
            if not fsdp2_to_fsdpv2(self, calls):
                for call, _ in calls:
                    self._report(call, "FSDP2")

    def _function_of(self, node: cst.CSTNode) -> cst.CSTNode | None:
        current = self.ctx.parent(node)
        while current is not None and not isinstance(current, cst.FunctionDef):
            current = self.ctx.parent(current)
        return current

    def _report(self, node: cst.Call, kind: str) -> None:
        why = (f"{short(node)}: torch {kind} does not run on XLA devices (\"Device 'xla:0' does not have a "
               "corresponding backend registered as 'torch.xla'\")")
        if "use_spmd" in self.ctx.target.spellings:
            if self.ctx.spmd_form:
                fix = ("not converted (the fully_shard calls are not per-block calls plus one root call on a "
                       "model name or attribute): wrap the model with SpmdFullyShardedDataParallel "
                       "(torch_xla.experimental.spmd_fully_sharded_data_parallel) over a (\"fsdp\", \"model\") mesh "
                       "and shard the batch on \"fsdp\"")
            else:
                fix = ("migrate with --data-parallel spmd and use FSDPv2 (SpmdFullyShardedDataParallel over a "
                       "(\"fsdp\", \"model\") mesh), or torch_xla.distributed.fsdp.XlaFullyShardedDataParallel")
        else:
            fix = ("use torch_xla.distributed.fsdp.XlaFullyShardedDataParallel, or migrate with --target 2.9 "
                   "--data-parallel spmd (FSDPv2)")
        self.finding(node, why, fix)

    def _to_fsdpv2(self, node: cst.Call, names) -> bool:
        """``FSDP(model, <dropped options>)`` -> FSDPv2 over the mesh of every device; False when the wrap has
        an option FSDPv2 does not take as it is (then it is reported)."""
        positional = patterns.positional(node)
        module = positional[:1] or [a for a in node.args if a.keyword and a.keyword.value == "module"]
        others = [a for a in node.args if a not in module]
        policy = [a for a in others if not a.star and a.keyword and a.keyword.value == "auto_wrap_policy"]
        if policy and self._policies_map():
            others = [a for a in others if a not in policy]
        else:
            policy = []
        if not module or len(positional) > 1 or any(a.star or a.keyword.value not in DROPPED for a in others):
            kept = [patterns.code_of(a.keyword) if a.keyword else patterns.code_of(a.value)
                    for a in others if a.star or a.keyword is None or a.keyword.value not in DROPPED]
            self.finding(node, f"{short(node)}: torch FSDP1 with options FSDPv2 does not take as they are "
                         f"({', '.join(kept) or 'unpacked arguments'}): not converted",
                         "wrap the model with SpmdFullyShardedDataParallel (torch_xla.experimental."
                         "spmd_fully_sharded_data_parallel) over a (\"fsdp\", \"model\") mesh, mapping those "
                         "options by hand (auto_wrap_policy: torch_xla.distributed.fsdp.wrap's policies)")
            return True
        index = node.args.index(module[0])
        new = patterns.parsed_expression(self.ctx.spell("spmd_fsdp", "HOLE", self.ctx.spell("device_count")))
        assert isinstance(new, cst.Call)

        kept_policy = [node.args.index(a) for a in policy]

        def fsdpv2(updated: cst.Call) -> cst.Call:
            first = new.args[0].with_changes(value=updated.args[index].value)
            comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            rest = [*new.args[1:], *[updated.args[i].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                                     for i in kept_policy]]
            args = [first, *rest]
            args = [a.with_changes(comma=comma) for a in args[:-1]] + [args[-1].with_changes(
                comma=cst.MaybeSentinel.DEFAULT)]
            return new.with_changes(args=args, lpar=updated.lpar, rpar=updated.rpar)

        if policy and not self._policies_move:
            self._policies_move = True
            for node_import in self._policy_imports:
                self.replace(node_import.module, patterns.parsed_expression(_XLA_WRAP),
                             f"{_TORCH_WRAP} -> {_XLA_WRAP}: FSDPv2's auto-wrap calls torch_xla's policies "
                             "(torch's take nonwrapped_numel=, FSDPv2 passes unwrapped_params=)")
        dropped = [a.keyword.value for a in others]
        note = f" ({', '.join(dropped)} dropped: the mesh decides)" if dropped else ""
        note += ", auto_wrap_policy kept" if policy else ""
        self.replace(node, fsdpv2, f"{short(node)} -> FSDPv2 (SpmdFullyShardedDataParallel) over a "
                     f"(\"fsdp\", \"model\") mesh of every device{note}")
        for module_name, name in imported_from(self.ctx, node.func, sorted(names)[0]):
            self.import_may_be_dead(module_name, name)
        return True
