"""XLA415's FSDP2 half in the spmd form: a function's ``fully_shard`` calls become one FSDPv2 wrap of the root.

FSDP2 shards in place, block by block then the root (``for b in model.blocks: fully_shard(b)`` then
``fully_shard(model)``). torch_xla's FSDPv2 (``SpmdFullyShardedDataParallel``) wraps and returns the root and
marks every parameter under it sharded on the ``"fsdp"`` axis, so the root's wrap alone shards what the block
calls did; what a block's wrap changes in FSDP2 (when its all-gather runs) the XLA compiler schedules itself.
So the root call becomes an assignment of the FSDPv2 wrap and the block calls go (with a loop that only made
them). Options FSDPv2 has no use for go; options it cannot honour are reported with their line.
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.transforms.common import imported_from, short

# Decided by the mesh and the compiler in FSDPv2: they go without a finding.
QUIET = ("mesh", "reshard_after_forward")
_WHY = {
    "mp_policy": ("FSDPv2 has no mixed-precision policy: the model now computes in its parameters' dtype",
                  "for bf16 compute, run the forward and the loss under torch.autocast(\"xla\", "
                  "dtype=torch.bfloat16), or cast the model with model.to(torch.bfloat16)"),
    "offload_policy": ("FSDPv2 does not offload parameters to the host: they stay on the devices, sharded",
                       "check that the sharded parameters and optimizer state fit the devices' memory"),
    "ignored_params": ("FSDPv2 shards every parameter of the root, the ignored ones too",
                       "mark those parameters' sharding yourself (xs.mark_sharding with a replicated spec) after "
                       "the wrap"),
}


def fsdp2_to_fsdpv2(rule, calls: list[tuple[cst.Call, frozenset[str]]]) -> bool:
    """Rewrite one function's ``fully_shard`` calls; False (nothing edited) when they do not fit the shape of
    per-block calls plus one root call on an assignable module."""
    ctx = rule.ctx
    shapes = [_shape(ctx, call) for call, _ in calls]
    if any(shape is None for shape in shapes):
        return False
    roots = [i for i, (call, _) in enumerate(calls) if not _in_loop(ctx, call)]
    if not roots:
        return False
    root_index = roots[-1]
    root_call = calls[root_index][0]
    module = _module_arg(root_call)
    if module is None or not isinstance(module.value, (cst.Name, cst.Attribute)):
        return False
    root_code = patterns.code_of(module.value)
    for i, (call, _) in enumerate(calls):
        if i == root_index or _in_loop(ctx, call):
            continue
        arg = _module_arg(call)
        part = patterns.code_of(arg.value) if arg is not None else ""
        if not part.startswith((root_code + ".", root_code + "[")):
            return False  # a second root outside a loop: not one model's wrap
    for call, _ in calls:
        _report_options(rule, call)
    _drop_option_bindings(rule, [call for call, _ in calls])
    for i, (call, names) in enumerate(calls):
        if i == root_index:
            _wrap_root(rule, call, shapes[i], module)
        else:
            _drop_block(rule, call, shapes[i])
        for module_name, name in imported_from(ctx, call.func, sorted(names)[0]):
            rule.import_may_be_dead(module_name, name)
    return True


def _module_arg(call: cst.Call) -> cst.Arg | None:
    positional = patterns.positional(call)
    return positional[0] if positional else patterns.keyword(call, "module")


def _shape(ctx, call: cst.Call) -> cst.BaseSmallStatement | None:
    """The statement the call is: ``fully_shard(m)`` (an Expr) or ``x = fully_shard(m)`` (an Assign of one
    name or attribute); None inside a larger expression or with arguments past the module that are not
    keywords."""
    if any(a.star for a in call.args) or len(patterns.positional(call)) > 1 or _module_arg(call) is None:
        return None
    parent = ctx.parent(call)
    if isinstance(parent, cst.Expr):
        return parent
    if (isinstance(parent, cst.Assign) and len(parent.targets) == 1
            and isinstance(parent.targets[0].target, (cst.Name, cst.Attribute))):
        return parent
    return None


def _in_loop(ctx, node: cst.CSTNode) -> bool:
    current = ctx.parent(node)
    while current is not None and not isinstance(current, (cst.FunctionDef, cst.Module)):
        if isinstance(current, (cst.For, cst.While)):
            return True
        current = ctx.parent(current)
    return False


def _report_options(rule, call: cst.Call) -> None:
    for arg in call.args:
        if arg.keyword is None or arg.keyword.value in QUIET + ("module",):
            continue
        why, fix = _WHY.get(arg.keyword.value, ("FSDPv2 has no such option", "apply it by hand to the FSDPv2 "
                                                "wrap or the model"))
        option = f"{arg.keyword.value}={short(arg.value, 50)}"
        rule.finding(arg, f"{short(call)}: {option} dropped in the FSDPv2 wrap: {why}", fix)


def _drop_option_bindings(rule, calls: list[cst.Call]) -> None:
    """``mesh = init_device_mesh("cuda", ...)``, ``policy = MixedPrecisionPolicy(...)``: a name bound once to a
    call and read only as the dropped options of these calls goes with them (a CUDA mesh would fail on XLA)."""
    ctx = rule.ctx
    options = {arg.value: call for call in calls for arg in call.args
               if arg.keyword is not None and arg.keyword.value != "module" and isinstance(arg.value, cst.Name)}
    seen: set[str] = set()
    for value, call in options.items():
        scope = ctx.scopes.get(value)
        if scope is None or value.value in seen:
            continue
        seen.add(value.value)
        bindings = list(scope.assignments[value.value])
        if len(bindings) != 1:
            continue
        target = bindings[0].node
        assign = ctx.parent(ctx.parent(target)) if isinstance(ctx.parent(target), cst.AssignTarget) else None
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.value, cst.Call)):
            continue
        if all(access.node in options for access in scope.accesses[value.value]):
            rule.remove(assign, f"{short(assign)} removed: only the dropped fully_shard options used it")
            for name in sorted(ctx.qualnames(assign.value.func)):
                module_name, _, last = name.rpartition(".")
                rule.import_may_be_dead(module_name, last)


def _wrap_root(rule, call: cst.Call, statement: cst.BaseSmallStatement, module: cst.Arg) -> None:
    ctx = rule.ctx
    template = patterns.parsed_expression(ctx.spell("spmd_fsdp", patterns.HOLE, ctx.spell("device_count")))
    assert isinstance(template, cst.Call)
    index = call.args.index(module)

    def fsdpv2(updated: cst.Call) -> cst.Call:
        first = template.args[0].with_changes(value=updated.args[index].value)
        return template.with_changes(args=[first, *template.args[1:]], lpar=updated.lpar, rpar=updated.rpar)

    message = (f"{short(call)} -> FSDPv2 (SpmdFullyShardedDataParallel) of the root over a (\"fsdp\", \"model\") "
               "mesh of every device: it shards every parameter under it")
    if isinstance(statement, cst.Assign):
        rule.replace(call, fsdpv2, message)
        return

    def assign(updated: cst.Expr) -> cst.Assign:
        value = fsdpv2(updated.value)
        target = value.args[0].value
        return cst.Assign(targets=[cst.AssignTarget(target=target)], value=value, semicolon=updated.semicolon)

    rule.replace(statement, assign, message)


def _drop_block(rule, call: cst.Call, statement: cst.BaseSmallStatement) -> None:
    """A block's ``fully_shard`` goes; so does the loop (and the ``if`` in it) that only made such calls."""
    ctx = rule.ctx
    message = f"{short(call)} removed: the root's FSDPv2 wrap shards this block's parameters"
    line = ctx.parent(statement)
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        rule.remove(statement, message)
        return
    holder: cst.CSTNode = line
    owner = ctx.sole_if_around(statement)
    if owner is not None:
        holder = owner
    block = ctx.parent(holder)
    loop = ctx.parent(block) if isinstance(block, cst.IndentedBlock) and len(block.body) == 1 else None
    if isinstance(loop, cst.For) and loop.orelse is None:
        rule.remove(loop, f"{message} (with the loop that wrapped each block)")
    else:
        rule.remove(line, message)
