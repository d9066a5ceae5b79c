"""XLA404 process-group-to-xla: the NCCL process group goes; barriers become rendezvous.

What it does:
    In a distributed script:

    - ``dist.init_process_group("nccl", ...)`` (any backend, any arguments) and
      ``dist.destroy_process_group()`` are removed, each with a change record; an ``if`` left with nothing
      to do (``if dist.is_initialized(): dist.destroy_process_group()``) goes with them.
    - ``dist.barrier()`` -> ``xm.rendezvous("barrier")``; one in the launcher's process, before the XLA launch,
      goes (no group there, and a rendezvous would start the runtime before the spawn).
    - ``dist.is_initialized()`` -> ``xm.xrt_world_size() > 1`` (``xr.world_size() > 1`` on ``2.9``): the
      code it guarded ran when the script ran on several workers.
    - Where the script calls a collective without an xm form (``scatter``, ``all_gather_object``, or a call
      XLA410/XLA411 cannot rewrite: ``group=``, ``async_op=``, its value used), the process group is kept
      instead, on the ``xla`` backend (as in the ddp form); each such call is reported with what that backend
      does with it: ``reduce``, ``gather``, ``scatter``, ``all_to_all``, ``send``/``recv`` raise
      NotImplementedError on torch_xla 2.6.1 (the sagemaker target's runtime), and ``reduce``, ``gather``,
      ``send``/``recv`` run a ``torch_xla.sync()`` inside on 2.9.

    In the ddp form (``--data-parallel ddp``, or what ``auto`` chooses) the process group stays, on
    torch_xla's backend: ``dist.init_process_group("nccl", init_method="env://", world_size=w, rank=r)`` ->
    ``dist.init_process_group("xla", init_method="xla://")`` with ``import torch_xla.distributed.xla_backend``
    (``xla://``, torch_xla 2.1+, derives the rank and world size; other keywords such as ``timeout=`` stay).
    On ``sagemaker`` (the 1.13 API, no ``xla://``) it becomes torch_xla 1.13's form,
    ``dist.init_process_group("xla", rank=xm.get_ordinal(), world_size=xm.xrt_world_size())``, after
    ``os.environ.setdefault("MASTER_ADDR", "localhost")`` and ``os.environ.setdefault("MASTER_PORT",
    "12355")``. Barriers, ``is_initialized()``, collectives and ``destroy_process_group()`` keep working as
    written. Where ``sagemaker``'s ddp form launches with ``xmp.spawn`` and the script initialised its group in
    the launcher's process (its ``__main__`` block, before the launch), that call goes and each worker
    initialises the group in ``_mp_fn`` (XLA407): the launcher has no ordinal, and asking for one there
    would start the runtime before the spawn.

    In the spmd form (``--data-parallel spmd``) the process group goes whatever the script calls: one
    program per host needs none, the compiler inserts the collectives of the sharded step. Barriers and
    ``is_initialized()`` are rewritten as above (over the hosts: ``xr.process_count() > 1``); a mean over
    the replicas goes (XLA410) and every other ``torch.distributed`` collective is reported, since its
    replicas no longer exist.

    A script that shards with DTensor tensor parallelism (``parallelize_module``, ``distribute_tensor``, on an
    ``init_device_mesh`` mesh: torchtitan's shard tests) keeps its process group in the xm form, and its mesh
    and parallelize calls are reported (xm and ddp forms): DTensor has no torch_xla multi-process path
    (``parallelize_module`` fails on the xla process group); the XLA way is SPMD (``xs.Mesh`` and
    ``xs.mark_sharding``).

    Whatever the form, a ``world_size=`` or ``rank=`` the script computed from ``torch.cuda.device_count()``
    (``world_size = torch.cuda.device_count()``) is reported with its line: 0 on an XLA host, and the
    script's own ``batch_size // world_size`` still reads it (fix: bind it to ``xm.xrt_world_size()`` /
    ``xr.world_size()``). What an ``mp.spawn`` worker is passed, XLA407 rebinds in the worker.

    In a script that is distributed but migrated with ``--single`` nothing distributed is rewritten, and
    one finding says so. ``torch.cuda.set_device(local_rank)`` is removed by XLA102.

Why:
    The process group exists for DDP and ``torch.distributed`` collectives. The migrated script keeps no
    DDP wrapper (XLA405) and reduces gradients with torch_xla's own collectives (``xm.optimizer_step``,
    ``xm.all_reduce``, XLA406), which need no process group: ``xmp.spawn`` / ``torch_xla.launch`` set up
    the replicas. Keeping ``init_process_group("xla", init_method="xla://")`` (torch_xla 2.1+, with
    ``import torch_xla.distributed.xla_backend``) would work on ``2.9`` but does nothing for this script
    and does not exist in the seeds' API generation; removing it is the xm form. The ddp form keeps DDP
    (XLA405), which needs the process group: torch_xla's ``xla`` backend runs its collectives on the XLA
    devices, and ``xla://`` (torch_xla 2.1+) works under torchrun and the XLA launcher alike.
    A script that keeps other ``torch.distributed`` collectives gets a finding for each (``all_reduce`` is
    XLA410's; XLA900 reports the ``"nccl"`` string when the call cannot be removed).

Example:
    dist.init_process_group(backend="nccl")
    dist.barrier()
    if dist.is_initialized():
        dist.destroy_process_group()

Use instead:
    xm.rendezvous("barrier")
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.analysis.facts import MP_SPAWN
from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.distributed import dist_all_reduce_to_xm as all_reduce_rule
from xla_migrate.transforms.distributed import dist_gather_broadcast_to_xm as gather_broadcast
from xla_migrate.transforms.distributed import distributed_common as common
from xla_migrate.transforms.common import short

REMOVED = {
    "init_process_group": "no process group is needed: the XLA launcher starts the replicas and the gradients "
                          "are reduced with xm collectives",
    "destroy_process_group": "there is no process group to destroy",
}
# torch.distributed functions a guard may test without side effects.
_GUARDS = ("is_initialized", "is_available", "is_nccl_available", "is_torchelastic_launched")
# init_process_group arguments xla:// derives (or that name another rendezvous): dropped in the ddp form.
DERIVED = ("backend", "init_method", "world_size", "rank", "store")
XLA_BACKEND = "torch_xla.distributed.xla_backend"
# The rendezvous port of the 1.13 form (torch_xla's docs/ddp.md uses 12355): a default, so a launcher's wins.
MASTER_PORT = "12355"
# Other torch.distributed collectives: reported, their XLA form is an xm collective.
# DTensor's tensor parallelism, and the meshes it runs on (FSDP2's fully_shard on a mesh is XLA415's).
TENSOR_PARALLEL = ("torch.distributed.tensor.parallel.parallelize_module",
                   "torch.distributed.tensor.parallel.api.parallelize_module",
                   "torch.distributed.tensor.distribute_tensor", "torch.distributed.tensor.distribute_module",
                   "torch.distributed._tensor.distribute_tensor", "torch.distributed._tensor.distribute_module")
DEVICE_MESHES = ("torch.distributed.device_mesh.init_device_mesh", "torch.distributed.device_mesh.DeviceMesh")
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_object", "broadcast", "broadcast_object_list", "reduce",
               "reduce_scatter", "gather", "scatter", "all_to_all", "send", "recv", "new_group",
               "all_gather_into_tensor", "reduce_scatter_tensor", "monitored_barrier")


class ProcessGroupToXla(Rule):
    code = "XLA404"
    name = "process-group-to-xla"
    summary = "init/destroy_process_group removed, dist.barrier() -> xm.rendezvous, is_initialized() -> world size > 1"
    fix_safety = "review"

    def visit_Module(self, node: cst.Module) -> None:
        facts = self.ctx.facts
        if not self.ctx.distributed and facts.distributed:
            first = facts.distributed_signals[0]
            self.finding(first, f"{short(first)}: the script is distributed, but it is migrated as a single-device "
                         "script: DDP, the process group, ranks and samplers are left as they are",
                         "migrate without --single to convert them, or remove them by hand")
        if self.ctx.distributed and not self.ctx.spmd_form:
            for site in self._tensor_parallel():
                self.finding(site, f"{short(site)}: DTensor tensor parallelism (DeviceMesh, parallelize_module) has "
                             "no torch_xla multi-process path: on the xla process group parallelize_module fails, "
                             "and the process group stays for it",
                             "shard with SPMD instead (xs.Mesh and xs.mark_sharding on the weights the plan splits: "
                             "--data-parallel spmd for what the migration can do), or keep this program on CUDA")

    def _tensor_parallel(self) -> list[cst.Call]:
        """The script's DTensor tensor-parallel calls (``parallelize_module``, ``distribute_tensor``) and the
        meshes they need (``init_device_mesh``), once per module."""
        def find() -> list[cst.Call]:
            ctx = self.ctx
            calls = patterns.find_all(ctx.module, lambda n: isinstance(n, cst.Call) and bool(
                ctx.qualnames(n.func) & {*TENSOR_PARALLEL, *DEVICE_MESHES}))
            if not any(ctx.qualnames(c.func) & set(TENSOR_PARALLEL) for c in calls):
                return []
            return calls
        return self.ctx.once("XLA404 tensor parallel", find)  # type: ignore[return-value]

    def visit_Call(self, node: cst.Call) -> None:
        if not self.ctx.distributed:
            return
        ctx = self.ctx
        name = common.dist_call(ctx, node, *REMOVED, "barrier", "is_initialized", *COLLECTIVES)
        if name is None:
            return
        if name == "init_process_group":
            self._arguments_from_cuda_count(node)
        if ctx.ddp_form:
            if node in common.launcher_side_inits(ctx):
                self._remove(ctx.parent(node), f"removed {short(node)} from the launcher's process: each XLA "
                             "worker initialises the xla process group in _mp_fn (XLA407), before the entry")
            elif name == "barrier" and ctx.xla_launched and common.before_launch(ctx, node) and \
                    isinstance(ctx.parent(node), cst.Expr):
                self._remove(ctx.parent(node), f"removed {short(node)}: before the launch, in the launcher's "
                             "process (no process group there; the workers' group starts in _mp_fn)")
            elif name == "init_process_group":
                self._on_xla_backend(node)
            return  # the process group stays: helpers and collectives work as written
        if ctx.spmd_form:
            if not (name in ("all_reduce", "reduce") and common.active(ctx, "XLA410")
                    and all_reduce_rule.spmd_mean(ctx, node) is not None):
                self._spmd(node, name)  # XLA410 removes a mean over the replicas
            return
        if name in REMOVED and self._tensor_parallel():
            return  # DTensor needs its group (and cannot run on XLA's: visit_Module reports it)
        if name in ("all_reduce", "reduce") and common.active(ctx, "XLA410"):
            if all_reduce_rule.rewritable(ctx, node) is None:
                self._deferred.append((node, "all_reduce_kept"))  # XLA410 reports it; the group stays for it
            return  # XLA410 rewrites it
        if common.active(ctx, "XLA411") and gather_broadcast.arguments(ctx, node) is not None:
            return  # XLA411 rewrites it into an xm collective
        if name in (*REMOVED, "is_initialized") or name in COLLECTIVES:
            # Decided at the end: a collective without an xm form keeps the process group (on 2.x targets).
            self._deferred.append((node, name))
            return
        self._rewrite(node, name)

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._deferred: list[tuple[cst.Call, str]] = []

    def leave_Module(self, original_node: cst.Module) -> None:
        # all_reduce has an xm form (XLA410), unless XLA410 cannot rewrite the call; the others have none. A
        # collective without one anywhere in the program (another module of a project) keeps the group too.
        unmapped = [node for node, name in self._deferred if name == "all_reduce_kept" or (
            name in COLLECTIVES and name != "all_reduce")]
        elsewhere = self._unmapped_elsewhere()
        keep = bool(unmapped or elsewhere) and "xla_process_group" in self.ctx.target.spellings
        for node, name in self._deferred:
            if name == "all_reduce_kept":
                continue
            if keep and name == "init_process_group" and elsewhere and not unmapped:
                self.finding(node, f"{short(node)}: the process group stays, on the xla backend, for a collective "
                             f"without an xm form in another module of the program ({elsewhere})",
                             "replace that collective with an xm one, and the process group can go")
            if not keep:
                self._rewrite(node, name)
            elif name == "init_process_group":
                self._on_xla_backend(node)
            elif name in COLLECTIVES and name != "all_reduce":
                group = self.ctx.target.spelling("xla_process_group").template.format(xm="xm", xr="xr")
                self.finding(node, f"{short(node)}: this torch.distributed collective has no xm form here, so the "
                             f"process group stays, on the xla backend (init_process_group({group})); "
                             f"{_on_the_xla_backend(name)}",
                             f"replace it with an xm collective ({self.ctx.spell('all_gather')}, "
                             f"{self.ctx.spell('all_reduce')}) and the process group can go")

    def _unmapped_elsewhere(self) -> str:
        """Where another module of the program calls a collective without an xm form ("" when none does)."""
        project = self.ctx.project
        if project is None:
            return ""
        from xla_migrate.analysis.update_sites import program_of

        program = program_of(project.index, project.rel)
        found = [f"{rel}:{site.line} {site.what}" for rel, site in program.sites("collectives_without_xm")
                 if rel != project.rel]
        return ", ".join(found[:3])

    def _rewrite(self, node: cst.Call, name: str) -> None:
        ctx = self.ctx
        statement = ctx.parent(node)
        alone = isinstance(statement, cst.Expr) and statement.value is node
        if name in REMOVED:
            if not alone:
                self.finding(node, f"{short(node)}: its value is used", "remove the process group by hand")
                return
            self._remove(statement, f"removed {short(node)}: {REMOVED[name]}")
        elif name == "barrier" and alone and ctx.xla_launched and common.before_launch(ctx, node):
            # The launcher's process has no process group left and must not start the runtime before the spawn;
            # the launch itself waits for every worker.
            self._remove(statement, f"removed {short(node)}: before the launch, in the launcher's process (no "
                         "process group there; a rendezvous would start the XLA runtime before the spawn)")
        elif name == "barrier":
            new = ctx.spell_expression("rendezvous", '"barrier"')
            self.replace(node, new, f"{short(node)} -> {patterns.code_of(new)}")
        elif name == "is_initialized":
            if self._guards_removed_only(node):
                return
            new = patterns.parsed_expression(f"{ctx.spell('world_size')} > 1")
            self.replace(node, new, f"{short(node)} -> {patterns.code_of(new)}: no process group on XLA")
        else:
            self.finding(node, f"{short(node)}: a torch.distributed collective needs a process group, which the "
                         "migration removes", f"use the xm collective (e.g. {ctx.spell('all_reduce')}(\"sum\", "
                         "[tensor]) reduces in place)")
            return
        common.free_imports(self, node)

    def _spmd(self, node: cst.Call, name: str) -> None:
        """The spmd form: no process group at all (one program per host; the compiler inserts the collectives)."""
        if name in COLLECTIVES:
            self.finding(node, f"{short(node)}: a torch.distributed collective between DDP replicas; the spmd form "
                         "runs one program over the device mesh, with no process group and no replicas to "
                         "reduce over", "remove it (a value computed from the sharded batch is already global), "
                         "or migrate with --data-parallel ddp")
        elif name in REMOVED:
            statement = self.ctx.parent(node)
            if not (isinstance(statement, cst.Expr) and statement.value is node):
                self.finding(node, f"{short(node)}: its value is used", "remove the process group by hand")
                return
            self._remove(statement, f"removed {short(node)}: one SPMD program per host needs no process group "
                         "(the compiler inserts the collectives)")
            common.free_imports(self, node)
        else:
            self._rewrite(node, name)

    def _on_xla_backend(self, node: cst.Call) -> None:
        """``init_process_group(<any backend>, ...)`` -> ``init_process_group("xla", init_method="xla://")``; on
        a target without ``xla://`` (the 1.13 API) -> ``init_process_group("xla", rank=xm.get_ordinal(),
        world_size=xm.xrt_world_size())`` after MASTER_ADDR/MASTER_PORT defaults (its env:// rendezvous
        reads them; the XLA launcher sets neither)."""
        kept = [a for a in node.args if a.keyword is not None and a.keyword.value not in DERIVED and not a.star]
        dropped = [a for a in node.args if a not in kept]
        if any(a.star for a in node.args):
            self.finding(node, f"{short(node)}: unpacked arguments", f"call init_process_group("
                         f"{self.ctx.target.spelling('xla_process_group').template.format(xm='xm')}) "
                         "(import torch_xla.distributed.xla_backend first)")
            return
        statement = self.ctx.enclosing_statement(node)
        needs_master = not self.ctx.target.torchrun_rendezvous
        if needs_master and statement is None:
            self.finding(node, f"{short(node)}: in a one-line block, where the MASTER_ADDR/MASTER_PORT defaults "
                         "the xla process group needs cannot be added", "put it on its own line")
            return
        arguments = self.ctx.spell("xla_process_group")
        extra = "".join(f", {patterns.code_of(a.keyword)}={patterns.code_of(a.value)}" for a in kept)
        new_args = patterns.parsed_expression(f"f({arguments}{extra})").args
        self.ctx.imports.add((XLA_BACKEND, None))
        derived = "xla:// derives them" if not needs_master else "the XLA ordinals replace them"
        self.replace(node, lambda updated: updated.with_changes(args=new_args),
                     f"{short(node)} -> the xla process group ({arguments}"
                     f"{'; ' + ', '.join(_arg_name(a) for a in dropped) + ' dropped: ' + derived if dropped else ''})")
        if needs_master:
            environ = f"{self.ctx.local_name('os', 'os')}.environ"
            defaults = [self.ctx.statement(f'{environ}.setdefault("{key}", "{value}")')
                        for key, value in (("MASTER_ADDR", "localhost"), ("MASTER_PORT", MASTER_PORT))]
            self.insert_before(statement, defaults, "MASTER_ADDR/MASTER_PORT defaulted for the xla process "
                               "group's rendezvous (the XLA launcher sets neither)")

    def _arguments_from_cuda_count(self, node: cst.Call) -> None:
        """``world_size=``/``rank=`` computed from ``torch.cuda.device_count()`` (``world_size =
        torch.cuda.device_count()``): 0 on an XLA host, and the group no longer replaces it, so the script's own
        ``batch_size // world_size`` divides by 0. Reported (XLA407 rebinds what a spawned worker is passed)."""
        ctx = self.ctx
        spawns = bool(patterns.find_all(ctx.module, lambda n: ctx.is_call_to(n, *MP_SPAWN)))
        scope = ctx.parent(node)
        while scope is not None and not isinstance(scope, cst.FunctionDef):
            scope = ctx.parent(scope)
        for keyword_name, concept in (("world_size", "world_size"), ("rank", "ordinal")):
            argument = patterns.keyword(node, keyword_name)
            if argument is None or not isinstance(argument.value, (cst.Name, cst.Attribute)):
                continue
            if isinstance(argument.value, cst.Attribute) and spawns:
                continue  # an object passed to spawned workers: XLA407 rebinds it there
            code = patterns.code_of(argument.value)
            where = scope if isinstance(argument.value, cst.Name) and scope is not None else ctx.module
            for assign in patterns.find_all(where, lambda n: isinstance(n, cst.Assign)):
                if not (any(patterns.code_of(t.target) == code for t in assign.targets) and patterns.find_all(
                        assign.value, lambda n: ctx.is_call_to(n, "torch.cuda.device_count"))):
                    continue
                line = ctx.position(assign)[0]
                spelled = ctx.target.spelling(concept).template.format(xm="xm", xr="xr")  # no import for a finding
                self.finding(node, f"{keyword_name}={code}: {code} is computed from torch.cuda.device_count() (line "
                             f"{line}), 0 on an XLA host; the migrated process group does not take it, but the "
                             f"script's own uses of it still do (batch_size // {code} divides by 0)",
                             f"bind {code} = {spelled} on line {line}")
                break

    def _removable_if(self, statement: cst.Expr) -> cst.If | None:
        """The ``if`` around ``statement`` when it is the only thing it does and its test only asks
        whether torch.distributed is set up (``if dist.is_initialized():``)."""
        owner = self.ctx.sole_if_around(statement)
        if owner is None:
            return None
        calls = patterns.find_all(owner.test, lambda n: isinstance(n, cst.Call))
        if all(common.dist_call(self.ctx, c, *_GUARDS) for c in calls) and not patterns.find_all(
                owner.test, lambda n: isinstance(n, (cst.Await, cst.NamedExpr, cst.Yield))):
            return owner
        return None

    def _guards_removed_only(self, node: cst.Call) -> bool:
        current = self.ctx.parent(node)
        while current is not None and not isinstance(current, cst.If):
            current = self.ctx.parent(current)
        if not isinstance(current, cst.If):
            return False
        body = current.body.body
        if len(body) != 1:
            return False
        line = body[0]
        small = line if isinstance(current.body, cst.SimpleStatementSuite) else (
            line.body[0] if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None)
        return (isinstance(small, cst.Expr) and common.dist_call(self.ctx, small.value, *REMOVED) is not None
                and self._removable_if(small) is current)

    def _remove(self, statement: cst.Expr, message: str) -> None:
        owner = self._removable_if(statement)
        if owner is not None:
            self.remove(owner, f"{message} (with the `if` around it)")
        else:
            self.remove(statement, message)


# What torch_xla's xla backend (ProcessGroupXla) does with a collective, read in its xla_backend.py of 2.6.1 and
# 2.9 (the reduce and gather rows measured: NotImplementedError on 2.6.1).
_NOT_IMPLEMENTED_2_6 = ("reduce", "gather", "scatter", "all_to_all", "monitored_barrier", "send", "recv")
_SYNCS_2_9 = ("reduce", "gather", "send", "recv")
_OBJECT_COLLECTIVES = ("all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list")
_IMPLEMENTED = ("all_gather", "all_gather_into_tensor", "broadcast", "reduce_scatter", "reduce_scatter_tensor")


def _on_the_xla_backend(name: str) -> str:
    if name in _IMPLEMENTED:
        return "the call runs there as written"
    if name in _OBJECT_COLLECTIVES:
        # Measured (review round 11): torch_xla 2.9.0 raises "Expected XLA tensor. Got: torch.LongTensor".
        return ("it raises there (the objects are pickled into CPU tensors, which the xla backend refuses): run "
                "it on a gloo group, group = dist.new_group(backend=\"gloo\"), passed as group=group")
    said = []
    if name in _NOT_IMPLEMENTED_2_6:
        said.append("the backend raises NotImplementedError for it on torch_xla 2.6.1 (the sagemaker target's "
                    "runtime)")
    if name in _SYNCS_2_9:
        said.append("on 2.9 it runs a torch_xla.sync() inside, a graph cut wherever it is called in the step")
    return "; ".join(said) or "check that the xla backend runs it (it implements only some collectives)"


def _arg_name(arg: cst.Arg) -> str:
    return arg.keyword.value if arg.keyword is not None else patterns.code_of(arg.value)
