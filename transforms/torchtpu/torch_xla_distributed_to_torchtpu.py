"""XLA704 torch-xla-distributed-to-torchtpu: torch_xla's ranks, launcher and process group -> TorchTPU (torchtpu).

What it does:
    Only for ``--target torchtpu``, on code already on torch_xla. ``xm.get_ordinal()`` /
    ``xr.global_ordinal()``, ``xm.xrt_world_size()`` / ``xr.world_size()``, ``xm.get_local_ordinal()`` /
    ``xr.local_ordinal()`` and ``xm.is_master_ordinal(...)`` become reads of torchrun's ``RANK``,
    ``WORLD_SIZE`` and ``LOCAL_RANK`` (0, 1 and 0 in a lone process). ``xmp.spawn(fn, args=(...))`` /
    ``torch_xla.launch(fn, args=(...))`` become ``fn(<local rank>, ...)``, with a finding on how to launch
    the workers. ``init_process_group("xla", init_method="xla://")`` becomes
    ``init_process_group("tpu_dist")``. Reported, not rewritten: torch_xla's collectives
    (``xm.all_reduce``, ``xm.collective_broadcast``, ``xm.rendezvous``...), SPMD meshes and sharding (not
    mechanical: DTensor on ``init_device_mesh("tpu", ...)``), and any other torch_xla name left.

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

import libcst as cst

from xla_migrate.analysis.facts import INIT_PROCESS_GROUP
from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.common import short
from xla_migrate.transforms.torchtpu import torch_xla_names as names

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

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        qualnames = ctx.qualnames(node.func)
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

    def _process_group(self, node: cst.Call) -> None:
        backend = patterns.keyword(node, "backend") or (patterns.positional(node) or [None])[0]
        if backend is None or patterns.string_value(backend.value) != "xla":
            return
        method = patterns.keyword(node, "init_method")
        quote = backend.value.value[-1] if isinstance(backend.value, cst.SimpleString) else '"'
        new = cst.SimpleString(self.ctx.spell("process_group_backend").replace('"', quote))
        drop = method is not None and patterns.string_value(method.value) == "xla://"
        backend_index = node.args.index(backend)
        method_index = node.args.index(method) if drop else None

        def tpu_dist(updated: cst.Call) -> cst.Call:
            args = [a.with_changes(value=new) if i == backend_index else a for i, a in enumerate(updated.args)
                    if i != method_index]
            return updated.with_changes(args=patterns.without_trailing_comma(args))

        self.replace(node, tpu_dist, f"{short(node)}: the xla process group -> {new.value}" + (
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

