"""XLA704 torch-xla-distributed-to-torchtpu: torch_xla's ranks, launcher and process group -> TorchTPU (torchtpu).

What it does:
    Only for ``--target torchtpu``, on code already on torch_xla. ``xm.get_ordinal()`` /
    ``xr.global_ordinal()``, ``xm.xrt_world_size()`` / ``xr.world_size()``, ``xm.get_local_ordinal()`` /
    ``xr.local_ordinal()`` and ``xm.is_master_ordinal(...)`` become reads of torchrun's ``RANK``,
    ``WORLD_SIZE`` and ``LOCAL_RANK`` (0, 1 and 0 in a lone process). ``xmp.spawn(fn, args=(...))`` /
    ``torch_xla.launch(fn, args=(...))`` become ``fn(<local rank>, ...)``, with a finding on how to launch
    the workers. ``init_process_group("xla", init_method="xla://")`` becomes
    ``init_process_group("tpu_dist" if torch.accelerator.is_available() else "gloo")`` (gloo: the CPU).

    A launched script (``xmp.spawn`` / ``torch_xla.launch`` of a module-level worker) gets TorchTPU's data
    parallelism instead (transforms/torchtpu/xm_form_ddp.py): the xm form's reduction (``xm.optimizer_step``,
    or ``xm._fetch_gradients`` + ``xm.all_reduce``) becomes ``model = DistributedDataParallel(model)`` where
    the optimizer is built (no ``device_ids``; the broadcast loop of rank 0's weights goes, reads DDP does not
    forward go through ``model.module``), the worker sets ``RANK``/``LOCAL_RANK`` from its index and joins
    the process group, and the launch becomes ``torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=n)``
    (on a TPU) then ``mp.spawn(fn, args=..., nprocs=n)``. The ddp form (DDP kept) gets the same launch.
    There, ``xm.rendezvous`` -> ``dist.barrier()``, ``xm.all_reduce("sum", [t])`` -> ``dist.all_reduce(t)``,
    ``xm.collective_broadcast([t], root_ordinal=r)`` -> ``dist.broadcast(t, src=r)``, ``xm.all_gather(t)`` ->
    ``torch.cat(torch.distributed.nn.functional.all_gather(t))``. Reported, not rewritten: other collectives,
    SPMD meshes and sharding (not mechanical: DTensor on ``init_device_mesh("tpu", ...)``), and any other
    torch_xla name left.

Why:
    TorchTPU's workers are torch.distributed processes on the ``tpu_dist`` backend, started by torchrun
    after ``python -m torch.tpu.distributed`` or by ``mp.spawn`` after
    ``torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=N)``; torchrun's variables hold the ranks
    before and after the process group is joined. Nothing here was run on a TPU.

Example:
    rank, world = xm.get_ordinal(), xm.xrt_world_size()
    xmp.spawn(_mp_fn, args=())

Use instead:
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    _mp_fn(int(os.environ.get("LOCAL_RANK", 0)))
"""

from __future__ import annotations

import re

import libcst as cst

from xla_migrate.analysis.facts import INIT_PROCESS_GROUP
from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.common import short
from xla_migrate.transforms.torchtpu import torch_xla_names as names
from xla_migrate.transforms.torchtpu import xm_form_ddp

_TIGHT = (cst.Attribute, cst.Subscript, cst.BinaryOperation, cst.Comparison)
LAUNCH = ("launch the workers with torchrun after `python -m torch.tpu.distributed` (it exports TorchTPU's "
          "variables), or call torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=N) before mp.spawn")
SPMD = 'not migrated mechanically: shard with DTensor or FSDP2 fully_shard on init_device_mesh("tpu", ...) by hand'


class TorchXlaDistributedToTorchTpu(Rule):
    code = "XLA704"
    name = "torch-xla-distributed-to-torchtpu"
    summary = "torch_xla ordinals, xmp.spawn/torch_xla.launch, the xla process group -> TorchTPU; the rest reported"
    targets = ("torchtpu",)
    on_xla_code = True
    fix_safety = "review"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._plan = xm_form_ddp.plan(ctx) if ctx.facts.upgrades_xla_code else None
        if self._plan is not None:
            self._ddp(self._plan)

    def _ddp(self, plan: xm_form_ddp.Plan) -> None:
        """The xm form's data parallelism -> DDP on the tpu_dist process group (transforms/torchtpu/xm_form_ddp.py)."""
        ctx = self.ctx
        for statement, model in plan.wraps:
            wrap = ctx.statement(f"{model} = {ctx.spell('ddp_wrap', model)}")
            message = (f"{model} = DistributedDataParallel({model}): DDP on the tpu_dist process group all-reduces "
                       "the gradients xm.optimizer_step did (no device_ids)")
            loop = plan.broadcasts.get(model)
            if loop is None:
                self.insert_before(statement, [wrap], message)
                continue
            # The xm form's broadcast of rank 0's weights stood where DDP was: the wrap goes back there (DDP
            # broadcasts them), with the loop's blank lines and without its comment, which the loop explained.
            blank = [line for line in loop.leading_lines if line.comment is None]
            self.replace(loop, wrap.with_changes(leading_lines=blank), f"{message}; it broadcasts rank 0's weights "
                         "as the loop of xm.collective_broadcast did")
        for name in plan.through_module:
            self.replace(name, patterns.parsed_expression(f"{name.value}.module"),
                         f"{name.value} -> {name.value}.module: the model inside DDP (a checkpoint keeps its keys)")
        for line in plan.fetches:
            self.remove(line, f"removed {patterns.code_of(line.body[0]).strip()}: DDP all-reduces the gradients")
        worker = plan.worker
        index = worker.params.params[0].name.value
        os_name = ctx.local_name("os", "os")
        first = worker.body.body[0]
        joined = [ctx.statement(f'{os_name}.environ["RANK"] = {os_name}.environ["LOCAL_RANK"] = str({index})')]
        joined += [ctx.statement(ctx.spell("join_process_group"))] if plan.join else []
        message = (f"{worker.name.value} sets its rank from its index (one host)" + (
            " and joins the process group (gloo on the CPU, without an accelerator)" if plan.join else ""))
        if patterns.is_docstring(first):
            self.insert_after(first, joined, message)
        else:
            self.insert_before(first, joined, message)

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        qualnames = ctx.qualnames(node.func)
        if self._plan is not None and any(patterns.find_all(gone, lambda n: n is node) for gone in (
                *self._plan.broadcasts.values(), *self._plan.fetches)):
            return  # replaced or removed with its statement (xm_form_ddp)
        if ctx.is_call_to(node, *names.ORDINAL):
            self._rank(node, "ordinal")
        elif ctx.is_call_to(node, *names.WORLD_SIZE):
            self._rank(node, "world_size")
        elif ctx.is_call_to(node, *names.LOCAL_ORDINAL):
            self._rank(node, "local_ordinal")
        elif ctx.is_call_to(node, *names.IS_MASTER):
            local = patterns.keyword(node, "local")
            glob = local is not None and patterns.code_of(local.value) == "False"
            self._rank(node, "is_global_master" if glob else "is_master")
        elif ctx.is_call_to(node, *names.LAUNCH):
            self._launch(node)
        elif ctx.is_call_to(node, *INIT_PROCESS_GROUP):
            self._process_group(node)
        elif self._plan is not None and isinstance(ctx.parent(node), cst.Expr) and self._collective(node):
            return
        elif self._plan is not None and ctx.is_call_to(node, f"{names.XM}.all_gather") and len(node.args) == 1 and \
                node.args[0].keyword is None and not node.args[0].star:
            new = ctx.spell("all_gather", patterns.code_of(node.args[0].value))
            self.replace(node, lambda updated: patterns.parsed_expression(ctx.spell(
                "all_gather", patterns.code_of(updated.args[0].value))), f"{short(node)} -> {new}: the ranks' "
                "tensors on dim 0, on the process group")
        elif ctx.is_call_to(node, *names.COLLECTIVES):
            self.finding(node, f"{short(node)}: a torch_xla collective, no TorchTPU form",
                         "DDP on the tpu_dist process group reduces the gradients and broadcasts rank 0's weights; "
                         "other collectives: torch.distributed's on tpu_dist")
        elif ctx.is_call_to(node, *names.SPMD) or any(n.startswith(names.SPMD_PREFIXES) for n in qualnames):
            self.finding(node, f"{short(node)}: SPMD, {SPMD.split(':')[0]}", SPMD.split(": ", 1)[1])
        elif any(names.is_torch_xla(n) for n in qualnames) and not ctx.is_call_to(
                node, *names.SINGLE_DEVICE, *names.DISTRIBUTED):
            self.finding(node, f"{short(node)}: torch_xla API with no TorchTPU mapping here",
                         "replace it by hand (torch.accelerator, torch.distributed) or remove it")

    def _collective(self, node: cst.Call) -> bool:
        """A torch_xla collective statement with a torch.distributed twin on the process group the script has
        (or gets): ``xm.rendezvous(...)`` -> ``dist.barrier()``; ``xm.all_reduce("sum", [t])`` ->
        ``dist.all_reduce(t)``; ``xm.collective_broadcast([t], root_ordinal=r)`` -> ``dist.broadcast(t, src=r)``.
        ``xm.all_gather(t)`` (dim 0) is an expression: visit_Call. Others (a scale, several tensors, a result
        used) stay reported."""
        ctx = self.ctx
        args = patterns.positional(node)
        if ctx.is_call_to(node, f"{names.XM}.rendezvous"):
            new = ctx.spell("barrier")
        elif ctx.is_call_to(node, f"{names.XM}.all_reduce") and len(node.args) == 2 and len(args) == 2 and (
                patterns.string_value(args[0].value) == "sum" or patterns.code_of(args[0].value).endswith(
                    "REDUCE_SUM")) and _single(args[1].value):
            new = ctx.spell("all_reduce", patterns.code_of(args[1].value.elements[0].value))
        elif ctx.is_call_to(node, f"{names.XM}.collective_broadcast") and len(args) == 1 and _single(args[0].value):
            root = patterns.keyword(node, "root_ordinal")
            if len(node.args) != (2 if root else 1):
                return False
            new = ctx.spell("broadcast", patterns.code_of(args[0].value.elements[0].value),
                            patterns.code_of(root.value) if root else "0")
        else:
            return False
        self.replace(node, patterns.parsed_expression(new), f"{short(node)} -> {new}: torch.distributed's, on the "
                                                            "process group")
        return True

    def _rank(self, node: cst.Call, concept: str) -> None:
        new = patterns.parsed_expression(names.quoted_for(self.ctx.spell(concept), names.fstring_quote(self.ctx, node)))
        if isinstance(self.ctx.parent(node), _TIGHT) or (concept.startswith("is_") and isinstance(
                self.ctx.parent(node), (cst.UnaryOperation, cst.BooleanOperation))):
            new = new.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        self.replace(node, new, f"{short(node)} -> {patterns.code_of(new)}: torchrun's variable")

    def _launch(self, node: cst.Call) -> None:
        positional = patterns.positional(node)
        if not positional:
            return
        if self._plan is not None and node is self._plan.launch:
            return self._spawn(node)
        args = patterns.keyword(node, "args") or (positional[1] if len(positional) > 1 else None)
        fn_index = node.args.index(positional[0])
        args_index = node.args.index(args) if args is not None else None
        index = patterns.parsed_expression(self.ctx.spell("local_ordinal"))

        def called(updated: cst.Call) -> cst.Call:
            call_args = [cst.Arg(value=index)]
            if args_index is not None:
                value = updated.args[args_index].value
                call_args += [cst.Arg(value=e.value) for e in value.elements] if isinstance(value, cst.Tuple) else [
                    cst.Arg(value=value, star="*")]
            comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            return cst.Call(func=updated.args[fn_index].value,
                            args=[a.with_changes(comma=comma) for a in call_args[:-1]] + call_args[-1:])

        self.replace(node, called, f"{short(node)}: the worker function is called in this process (torchrun "
                                   "starts one per device)")
        self.finding(node, f"{short(node)}: TorchTPU's workers are started outside the script", LAUNCH)

    def _spawn(self, node: cst.Call) -> None:
        """``xmp.spawn(fn, args=a)`` -> TorchTPU's variables, then ``mp.spawn(fn, args=a, nprocs=n)``."""
        ctx = self.ctx
        line = ctx.parent(ctx.parent(node))
        count = "nprocs" if not re.search(r"\bnprocs\b", ctx.input_code) else "nprocs_tpu"
        given = patterns.keyword(node, "nprocs")
        known = given is not None and patterns.code_of(given.value) != "None"
        os_name = ctx.local_name("os", "os")
        before = [ctx.statement(f"{count} = {patterns.code_of(given.value) if known else ctx.spell('worker_count')}"),
                  ctx.statement(f'{os_name}.environ["WORLD_SIZE"] = str({count})'),
                  ctx.statement(f'{os_name}.environ.setdefault("MASTER_ADDR", "localhost")'),
                  ctx.statement(f'{os_name}.environ.setdefault("MASTER_PORT", "12355")'),
                  patterns.parsed_statement(f"if {ctx.spell('on_tpu')}:\n    {ctx.spell('launch_env', count)}\n")]
        self.insert_before(line, before, f"{short(node)}: one worker per device (1 on the CPU); on a TPU, "
                           "set_tpu_launch_env exports TorchTPU's variables first")
        args = patterns.keyword(node, "args") or (patterns.positional(node)[1:2] or [None])[0]
        args_index = node.args.index(args) if args is not None else None
        fn_index = node.args.index(patterns.positional(node)[0])
        spawn = patterns.parsed_expression(ctx.spell("spawn", "_"))

        def spawned(updated: cst.Call) -> cst.Call:
            call_args = [cst.Arg(value=updated.args[fn_index].value)]
            if args_index is not None:
                call_args.append(cst.Arg(keyword=cst.Name("args"), value=updated.args[args_index].value,
                                         equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                               whitespace_after=cst.SimpleWhitespace(""))))
            call_args.append(cst.Arg(keyword=cst.Name("nprocs"), value=cst.Name(count),
                                     equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                           whitespace_after=cst.SimpleWhitespace(""))))
            comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            return spawn.with_changes(args=[a.with_changes(comma=comma) for a in call_args[:-1]] + call_args[-1:])

        self.replace(node, spawned, f"{short(node)} -> mp.spawn: TorchTPU's workers are torch.distributed "
                                    "processes")
        self.finding(node, f"{short(node)}: launched with mp.spawn after set_tpu_launch_env, not run on a TPU here",
                     "check on a TPU host; on several hosts launch with torchrun after `python -m "
                     "torch.tpu.distributed` and call the worker function with LOCAL_RANK instead")

    def _process_group(self, node: cst.Call) -> None:
        backend = patterns.keyword(node, "backend") or (patterns.positional(node) or [None])[0]
        if backend is None or patterns.string_value(backend.value) != "xla":
            return
        method = patterns.keyword(node, "init_method")
        quote = backend.value.value[-1] if isinstance(backend.value, cst.SimpleString) else '"'
        new = patterns.parsed_expression(self.ctx.spell("process_group_backend_or_cpu").replace('"', quote))
        drop = method is not None and patterns.string_value(method.value) == "xla://"
        backend_index = node.args.index(backend)
        method_index = node.args.index(method) if drop else None

        def tpu_dist(updated: cst.Call) -> cst.Call:
            args = [a.with_changes(value=new) if i == backend_index else a for i, a in enumerate(updated.args)
                    if i != method_index]
            return updated.with_changes(args=patterns.without_trailing_comma(args))

        self.replace(node, tpu_dist, f"{short(node)}: the xla process group -> {patterns.code_of(new)}" + (
            " (torchrun's env:// rendezvous)" if drop else ""))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        """A torch_xla name read as a value (not called, not imported): nothing above rewrites it."""
        parent = self.ctx.parent(node)
        if isinstance(parent, cst.Attribute) or (isinstance(parent, cst.Call) and parent.func is node):
            return
        grandparent = self.ctx.parent(parent) if parent is not None else None
        if isinstance(parent, (cst.Import, cst.ImportFrom, cst.ImportAlias)) or isinstance(
                grandparent, (cst.Import, cst.ImportFrom)):
            return
        if any(names.is_torch_xla(n) for n in self.ctx.qualnames(node)):
            self.finding(node, f"{short(node)}: a torch_xla name, no TorchTPU mapping here", "replace it by hand")



def _single(value: cst.BaseExpression) -> bool:
    """``[t]``: a list of one tensor, not starred."""
    return isinstance(value, cst.List) and len(value.elements) == 1 and isinstance(value.elements[0], cst.Element)
