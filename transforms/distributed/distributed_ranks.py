"""XLA401 distributed-ranks: torchrun ranks and torch.distributed rank calls become the target's ordinals.

What it does:
    In a distributed script, rewrites every read of a rank or the world size to the target's call:
    ``int(os.environ["LOCAL_RANK"])``, ``os.environ.get("LOCAL_RANK", 0)``, ``os.getenv("LOCAL_RANK")`` ->
    ``xm.get_local_ordinal()``; ``RANK`` and ``dist.get_rank()`` -> ``xm.get_ordinal()``; ``WORLD_SIZE``
    and ``dist.get_world_size()`` -> ``xm.xrt_world_size()`` (``--target 2.9``: ``xr.local_ordinal()``,
    ``xr.global_ordinal()``, ``xr.world_size()``). The ``int(...)`` around an environment read goes too.
    A rank used as a CUDA device index (``model.to(local_rank)``, ``x.to(args.gpu)``) becomes the XLA
    device. Reads inside a ``rank == 0`` guard that XLA402 rewrites are left to it. ``dist.get_rank(group)``
    (a process group) and a ``--local_rank`` command-line option (torch.distributed.launch's) are
    reported. Launcher flags (``ddp = int(os.environ.get("RANK", -1)) != -1``, ``os.environ.get("RANK") is
    not None``, ``"WORLD_SIZE" in os.environ``) become ``xm.xrt_world_size() > 1`` (``== 1`` for the
    negated forms): true exactly when more than one XLA process runs. A rank or world size read before the
    launch (at module level, or as an argparse default in the ``__main__`` block, of a script whose
    ``__main__`` block starts the workers, or in the function that calls ``mp.spawn`` before that call) is
    reported, not rewritten: the launcher's process has no ordinal, and reading the XLA runtime there
    starts it before the spawn ("Runtime is already initialized"); so is a launcher flag tested there
    (Swin's ``if "RANK" in os.environ and "WORLD_SIZE" in os.environ:`` in its ``__main__`` block): it is
    False there under the XLA launcher, as written. Single-device scripts are left alone. In the ddp data-parallel form of the ``2.9`` target
    torchrun still starts the workers, so the ranks are left as written; only a rank used as a device index
    becomes the XLA device. The ddp form of ``sagemaker`` launches with ``xmp.spawn`` (no ``xla://`` in the
    1.13 API), so its ranks are rewritten as in the xm form.

Why:
    Under ``xmp.spawn`` / ``torch_xla.launch`` nothing sets torchrun's environment variables, and without
    a process group ``torch.distributed.get_rank()`` fails; the XLA runtime knows each worker's ordinal.
    ``xm.xrt_world_size``/``xm.get_ordinal`` were removed in torch_xla 2.7: the ``2.9`` target uses
    ``torch_xla.runtime``. An integer device index means a CUDA device to ``.to()``.

Example:
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = dist.get_world_size()
    model = Net().to(local_rank)

Use instead:
    local_rank = xm.get_local_ordinal()
    world_size = xm.xrt_world_size()
    model = Net().to(device)
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.analysis.facts import TORCHRUN_VARIABLES, environment_variable
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.distributed import distributed_common as common
from xla_migrate.transforms.common import short


class DistributedRanks(Rule):
    code = "XLA401"
    name = "distributed-ranks"
    summary = "LOCAL_RANK/RANK/WORLD_SIZE and dist.get_rank()/get_world_size() -> the target's ordinal calls"
    fix_safety = "review"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        common.register(ctx, self.code)
        # Environment reads that are part of a launcher flag this rule rewrites as a whole.
        self._flag_reads: set[cst.CSTNode] = set()

    def _read(self, node: cst.BaseExpression) -> None:
        if not self.ctx.xla_launched:
            return  # torchrun starts the ddp form's workers: env ranks and dist.get_rank() work as written
        concept = common.rank_read(self.ctx, node)
        if concept is None or node in self._flag_reads:
            return
        outer = common.outer_int(self.ctx, node)
        if self._in_master_guard(outer) or self._cuda_device_index(outer) or self._in_device_map(outer):
            return
        if common.before_launch(self.ctx, node):
            spelled = self.ctx.target.spelling(concept).template.format(xm="xm", xr="xr")
            self.finding(outer, f"{short(outer)} is read before the launch, in the launcher's process: the XLA "
                         "launcher sets no torchrun variables there, and reading the XLA ordinal there would "
                         "start the runtime before the spawn (\"Runtime is already initialized\")",
                         f"read {spelled} inside the worker (in main or _mp_fn) and use that value")
            return
        new = self.ctx.spell_expression(concept)
        self.replace(outer, lambda updated: new.with_changes(lpar=updated.lpar, rpar=updated.rpar),
                     f"{short(outer)} -> {patterns.code_of(new)}")
        if isinstance(node, cst.Call):
            common.free_imports(self, node)

    def _in_device_map(self, read: cst.CSTNode) -> bool:
        """A CUDA ordinal for accelerate's placement (``device_map = {"": LOCAL_RANK}``): an XLA ordinal would
        still be read as a CUDA one; XLA906 reports the device_map."""
        current = self.ctx.parent(read)
        while current is not None and not isinstance(current, cst.BaseStatement):
            if isinstance(current, cst.Arg) and current.keyword is not None and current.keyword.value == "device_map":
                return True
            if isinstance(current, cst.Assign) and any(
                    (patterns.dotted_name(t.target) or "").rsplit(".", 1)[-1] == "device_map" for t in current.targets):
                return True
            current = self.ctx.parent(current)
        return False

    def _cuda_device_index(self, read: cst.CSTNode) -> bool:
        """The index of ``torch.device("cuda", read)`` or of ``f"cuda:{read}"``: the device rule (XLA101)
        replaces the whole device, so rewriting the rank inside it too would withdraw that edit (one run would
        leave a CUDA device for a second run to finish)."""
        parent = self.ctx.parent(read)
        if isinstance(parent, cst.Arg):
            call = self.ctx.parent(parent)
            return isinstance(call, cst.Call) and self.ctx.is_call_to(call, "torch.device") and bool(call.args) \
                and call.args[0] is not parent and patterns.string_value(call.args[0].value) == "cuda"
        if isinstance(parent, cst.FormattedStringExpression):
            string = self.ctx.parent(parent)
            first = string.parts[0] if isinstance(string, cst.FormattedString) and string.parts else None
            return isinstance(first, cst.FormattedStringText) and first.value == "cuda:" and len(string.parts) == 2
        return False

    def _in_master_guard(self, node: cst.CSTNode) -> bool:
        parent = self.ctx.parent(node)
        if isinstance(parent, cst.ComparisonTarget):
            parent = self.ctx.parent(parent)
        return (isinstance(parent, cst.Comparison) and common.active(self.ctx, "XLA402")
                and common.master_guard(self.ctx, parent) is not None)

    def visit_Comparison(self, node: cst.Comparison) -> None:
        """Launcher flags: ``int(os.environ.get("RANK", -1)) != -1``, ``os.environ.get("RANK") is not None``,
        ``"WORLD_SIZE" in os.environ`` ask whether torchrun started the script. Under the XLA launcher those
        variables are unset (the first is always False, a rewritten read always True), so the flag becomes
        the test it meant: more than one XLA process runs."""
        if not self.ctx.xla_launched or len(node.comparisons) != 1:
            return
        target = node.comparisons[0]
        operator, right = target.operator, target.comparator
        positive = None
        read = None
        if isinstance(operator, (cst.In, cst.NotIn)) and "os.environ" in self.ctx.qualnames(right):
            if patterns.string_value(node.left) in TORCHRUN_VARIABLES:
                positive = isinstance(operator, cst.In)
        else:
            read, default = self._env_read_with_default(node.left)
            if read is not None and isinstance(operator, (cst.NotEqual, cst.Equal, cst.IsNot, cst.Is)):
                literal = patterns.code_of(right).strip()
                if isinstance(operator, (cst.IsNot, cst.Is)) and literal == "None" and default is None:
                    positive = isinstance(operator, cst.IsNot)
                elif default is not None and literal == default:
                    positive = isinstance(operator, (cst.NotEqual, cst.IsNot))
        if positive is None:
            return
        if common.master_guard(self.ctx, node) is not None and common.active(self.ctx, "XLA402"):
            return  # os.getenv("RANK", "0") == "0" asks "am I rank 0", not "did torchrun start me" (XLA402)
        if common.before_launch(self.ctx, node):
            # In the launcher's process the flag is False under the XLA launcher as written (it sets no torchrun
            # variables), and asking the world size there would start the runtime before the spawn.
            self.finding(node, f"{short(node)} is tested before the launch, in the launcher's process: the XLA "
                         "launcher sets no torchrun variables, so it is False there, and what it guards (a rank, a "
                         "process group) belongs to each worker", "move this setup into the launched function "
                         f"(main or _mp_fn), where the flag becomes {self.ctx.spell('world_size')} > 1")
            return
        if read is not None:
            self._flag_reads.add(read)
        world = self.ctx.spell("world_size")
        new = patterns.parsed_expression(f"{world} > 1" if positive else f"{world} == 1")
        self.replace(node, lambda updated: new.with_changes(lpar=updated.lpar, rpar=updated.rpar),
                     f"{short(node)} -> {patterns.code_of(new)}: the XLA launcher sets no torchrun variables; "
                     "the flag asks whether several processes run")

    def _env_read_with_default(self, node: cst.BaseExpression) -> tuple[cst.CSTNode | None, str | None]:
        """(the read, its default as code or None) for ``[int(]os.environ.get("RANK"[, -1])[)]``."""
        if isinstance(node, cst.Call) and self.ctx.is_call_to(node, "builtins.int") and len(node.args) == 1:
            node = node.args[0].value
        if environment_variable(node, self.ctx.qualnames) not in TORCHRUN_VARIABLES or not isinstance(node, cst.Call):
            return None, None
        return node, (patterns.code_of(node.args[1].value).strip() if len(node.args) > 1 else None)

    def visit_Subscript(self, node: cst.Subscript) -> None:
        self._read(node)

    def visit_Call(self, node: cst.Call) -> None:
        if not self.ctx.distributed:
            return
        self._read(node)
        self._device_index(node)
        if not self.ctx.xla_launched:
            return
        self._local_rank_argument(node)
        name = common.dist_call(self.ctx, node, *common.DIST_CONCEPTS)
        if name is not None and node.args:
            self.finding(node, f"{short(node)}: a rank in a process group has no XLA ordinal form",
                         "use xm.get_ordinal() / xm.xrt_world_size() over all replicas, or xm collectives "
                         "with groups=")

    def _local_rank_argument(self, node: cst.Call) -> None:
        """``parser.add_argument("--local_rank", ...)``: torch.distributed.launch passed it; no XLA launcher does."""
        if not patterns.method_call(node, "add_argument"):
            return
        flags = [patterns.string_value(a.value) for a in patterns.positional(node)]
        if any(flag in ("--local_rank", "--local-rank") for flag in flags):
            self.finding(node, f"{short(node)}: no XLA launcher passes --local_rank; args.local_rank keeps its "
                         "default in every worker", f"use {self.ctx.spell('local_ordinal')} where the script "
                         "reads args.local_rank (guards and .to(args.local_rank) are rewritten)")

    def _device_index(self, node: cst.Call) -> None:
        """``model.to(local_rank)``: an integer device index is a CUDA device."""
        if not patterns.method_call(node, "to"):
            return
        args = patterns.positional(node)
        if not args:
            return
        index = args[0].value
        name = patterns.dotted_name(index)
        if name is None or not common.RANK_INDEX_NAME.match(name.rsplit(".", 1)[-1]):
            return
        if isinstance(index, cst.Name) and not common.is_process_rank(self.ctx, index):
            return
        device = self.ctx.device_reference(node, self.code)
        self.replace(index, patterns.parsed_expression(device), f".to({name}) -> .to({device}): the rank was a CUDA "
                     "device index")
