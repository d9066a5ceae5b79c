"""The xm form's data parallelism upgraded to TorchTPU's: DDP on the ``tpu_dist`` process group. Not a rule.

A torch_xla script in the xm form (this tool's ``sagemaker`` output of a DDP script, or ``2.9 --data-parallel
xm``) has no process group and no DDP: ``xm.optimizer_step`` all-reduces the gradients and ``xmp.spawn`` /
``torch_xla.launch`` starts one worker per device. TorchTPU has neither, so the plan here puts DDP back:

- the model an ``xm.optimizer_step``'s optimizer is built from (``opt = Opt(model.parameters(), ...)``) is
  wrapped, ``model = DistributedDataParallel(model)``, right before that line (no ``device_ids``: one device
  per process); its reads after the wrap that DDP does not forward (``model.fc``, ``state_dict``...) read
  ``model.module`` (the checkpoint keeps its keys);
- the launched worker function joins the process group first: ``RANK``/``LOCAL_RANK`` from its index (one
  host), then ``init_process_group("tpu_dist")`` (``"gloo"`` without an accelerator, so it runs on the CPU);
- the launch becomes ``torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=n)`` (on a TPU) then
  ``mp.spawn(fn, args=..., nprocs=n)``, ``n`` the accelerator's device count (1 on the CPU);
- the per-tensor broadcast loop the xm form put where DDP was (``xm.collective_broadcast([t], root_ordinal=0)``
  over the model's parameters and buffers) goes: DDP broadcasts rank 0's weights when it wraps the model.

XLA704 makes these edits; XLA703 then makes ``xm.optimizer_step(opt)`` a plain ``opt.step()`` without its
"no longer reduced" finding. Where the shape is not this one (the optimizer not built from a named model's
parameters, no launcher to start the workers, FSDP or SPMD), there is no plan and the findings stay. The
ddp form (DDP and its process group kept, started by ``xmp.spawn``) gets the same launch and ranks, and no
wrap. Nothing here was run on a TPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from xla_migrate.analysis.facts import DDP, INIT_PROCESS_GROUP
from xla_migrate.syntax import patterns
from xla_migrate.transforms.torchtpu import torch_xla_names as names
from xla_migrate.transforms.torchtpu.not_migrated_for_torchtpu import FSDP

# Attributes of a model that read the same on its DistributedDataParallel wrapper (nn.Module's own API).
# Everything else (a submodule, a custom method, state_dict/load_state_dict, whose keys would gain "module.")
# is read through ``.module`` once the name is the wrapper.
WRAPPER_SAFE = frozenset({
    "parameters", "named_parameters", "buffers", "named_buffers", "train", "eval", "zero_grad", "to", "modules",
    "named_modules", "children", "named_children", "requires_grad_", "apply", "training", "module", "no_sync",
    "register_forward_hook", "register_forward_pre_hook", "cpu", "float", "half", "bfloat16", "double", "type"})


@dataclass(frozen=True)
class Plan:
    # (the optimizer's statement, the model's name): ``model = DDP(model)`` goes right before the statement.
    wraps: tuple[tuple[cst.SimpleStatementLine, str], ...]
    # The launcher call (a statement of its own), and the module-level worker function it starts.
    launch: cst.Call
    worker: cst.FunctionDef
    # ``model.x`` reads after a wrap that go through ``model.module``.
    through_module: tuple[cst.Name, ...]
    # The xm form's broadcast loop of each model (where DDP stood), which the wrap replaces.
    broadcasts: dict[str, cst.For]
    # The xm form's `g = xm._fetch_gradients(opt)` and `xm.all_reduce("sum", g, ...)` lines: DDP reduces.
    fetches: tuple[cst.SimpleStatementLine, ...]
    # The worker joins the process group (the xm form has none; the ddp form joins it already).
    join: bool


def plan(ctx) -> Plan | None:
    return ctx.once("torchtpu-xm-form-ddp", lambda: _plan(ctx))


def _plan(ctx) -> Plan | None:
    if "spawn" not in ctx.input_code and "launch" not in ctx.input_code:
        return None
    module = ctx.module
    calls = patterns.find_all(module, lambda n: isinstance(n, cst.Call))
    if any(ctx.is_call_to(c, *names.SPMD, *FSDP) or any(n.startswith(names.SPMD_PREFIXES) for n in ctx.qualnames(
            c.func)) for c in calls):
        return None  # sharded: FSDP and SPMD are reported (XLA790, XLA704), not made DDP
    launches = [c for c in calls if ctx.is_call_to(c, *names.LAUNCH)]
    worker = _worker(ctx, launches[0]) if len(launches) == 1 else None
    if worker is None:
        return None
    has_ddp = bool(ctx.facts.ddp_models) or any(ctx.is_call_to(c, *DDP) for c in calls)
    joins = any(ctx.is_call_to(c, *INIT_PROCESS_GROUP) for c in calls)
    # The xm form's reductions: xm.optimizer_step(opt), or `g = xm._fetch_gradients(opt)` then
    # `xm.all_reduce("sum", g, scale=...)` (its AMP and clipping shape), each naming its optimizer.
    optimizers, fetches = [], []
    for call in calls:
        if ctx.is_call_to(call, *names.OPTIMIZER_STEP):
            optimizer = (patterns.positional(call) or [patterns.keyword(call, "optimizer")])[0]
        elif ctx.is_call_to(call, f"{names.XM}._fetch_gradients"):
            pair = _fetch_and_reduce(ctx, call)
            if pair is None:
                return None
            fetches += pair
            optimizer = (patterns.positional(call) or [None])[0]
        else:
            continue
        if optimizer is None or not isinstance(optimizer.value, cst.Name):
            return None
        optimizers.append(optimizer.value.value)
    if has_ddp != (not optimizers) or (has_ddp and not joins) or (joins and not has_ddp):
        return None  # the ddp form (DDP and its group, no xm reduction) or the xm form (neither), not a mix
    wraps = []
    for optimizer in optimizers:
        site = _optimizer_site(module, optimizer)
        if site is None:
            return None
        if site not in wraps:
            wraps.append(site)
    if len({name for _, name in wraps}) != len(wraps):
        return None
    through, broadcasts = [], {}
    for statement, model in wraps:
        scope = _scope_of(ctx, statement)
        at = ctx.position(statement)
        loops = [loop for loop in patterns.find_all(scope, lambda n: isinstance(n, cst.For))
                 if ctx.position(loop) < at and _is_broadcast_loop(ctx, loop, model)]
        if len(loops) == 1 and isinstance(ctx.parent(loops[0]), (cst.IndentedBlock, cst.Module)) and \
                ctx.parent(loops[0]) is ctx.parent(statement):
            broadcasts[model] = loops[0]
            at = ctx.position(loops[0])
        through += [n.value for n in patterns.find_all(scope, lambda n: isinstance(n, cst.Attribute))
                    if isinstance(n.value, cst.Name) and n.value.value == model and n.attr.value not in WRAPPER_SAFE
                    and ctx.position(n) > at and not (isinstance(n.attr, cst.Name) and n.attr.value == "module")]
    return Plan(tuple(wraps), launches[0], worker, tuple(through), broadcasts, tuple(fetches), not joins)


def _worker(ctx, launch: cst.Call) -> cst.FunctionDef | None:
    """The module-level function the launcher starts, when the launch is a statement of its own."""
    parent = ctx.parent(launch)
    positional = patterns.positional(launch)
    if not (isinstance(parent, cst.Expr) and isinstance(ctx.parent(parent), cst.SimpleStatementLine)
            and len(ctx.parent(parent).body) == 1) or not positional or not isinstance(positional[0].value, cst.Name):
        return None
    name = positional[0].value.value
    found = [s for s in ctx.module.body if isinstance(s, cst.FunctionDef) and s.name.value == name]
    if len(found) != 1 or not found[0].params.params or not isinstance(found[0].body, cst.IndentedBlock):
        return None
    return found[0]


def _optimizer_site(module: cst.Module, optimizer: str) -> tuple[cst.SimpleStatementLine, str] | None:
    """The one line ``optimizer = Opt(model.parameters(), ...)`` (or ``Opt(params=model.parameters())``)."""
    sites = []
    for line in patterns.find_all(module, lambda n: isinstance(n, cst.SimpleStatementLine)):
        if len(line.body) != 1 or not isinstance(line.body[0], cst.Assign):
            continue
        assign = line.body[0]
        if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name) or \
                assign.targets[0].target.value != optimizer:
            continue
        value = assign.value
        first = patterns.argument(value, 0, "params") if isinstance(value, cst.Call) else None
        method = patterns.method_call(first.value, "parameters") if first is not None else None
        if method is None or not isinstance(method.value, cst.Name) or first.value.args:
            return None
        sites.append((line, method.value.value))
    return sites[0] if len(sites) == 1 else None


def _scope_of(ctx, node: cst.CSTNode) -> cst.CSTNode:
    current = ctx.parent(node)
    while current is not None and not isinstance(current, cst.FunctionDef):
        current = ctx.parent(current)
    return current if current is not None else ctx.module


def _is_broadcast_loop(ctx, loop: cst.For, model: str) -> bool:
    """``for t in [*model.parameters(), *model.buffers()]: xm.collective_broadcast([t], root_ordinal=0)``."""
    body = loop.body.body if isinstance(loop.body, cst.IndentedBlock) else ()
    if len(body) != 1 or not isinstance(body[0], cst.SimpleStatementLine) or len(body[0].body) != 1:
        return False
    call = body[0].body[0].value if isinstance(body[0].body[0], cst.Expr) else None
    if not isinstance(call, cst.Call) or not ctx.is_call_to(call, f"{names.XM}.collective_broadcast"):
        return False
    return f"{model}.parameters()" in patterns.code_of(loop.iter) and not loop.orelse


def _fetch_and_reduce(ctx, call: cst.Call) -> list[cst.SimpleStatementLine] | None:
    """``g = xm._fetch_gradients(opt)`` and the next line, ``xm.all_reduce("sum", g, ...)``."""
    assign = ctx.parent(call)
    line = ctx.parent(assign) if isinstance(assign, cst.Assign) else None
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1 or len(assign.targets) != 1 or \
            not isinstance(assign.targets[0].target, cst.Name):
        return None
    block = ctx.parent(line)
    body = list(block.body) if isinstance(block, (cst.IndentedBlock, cst.Module)) else []
    following = body[body.index(line) + 1] if line in body and body.index(line) + 1 < len(body) else None
    if not isinstance(following, cst.SimpleStatementLine) or len(following.body) != 1 or not isinstance(
            following.body[0], cst.Expr) or not isinstance(following.body[0].value, cst.Call):
        return None
    reduce = following.body[0].value
    args = patterns.positional(reduce)
    if not ctx.is_call_to(reduce, f"{names.XM}.all_reduce") or len(args) < 2 or patterns.code_of(
            args[1].value) != assign.targets[0].target.value:
        return None
    return [line, following]
