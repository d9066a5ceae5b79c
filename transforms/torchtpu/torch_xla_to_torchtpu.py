"""XLA703 torch-xla-to-torchtpu: code already on torch_xla is upgraded to TorchTPU's eager form (torchtpu).

What it does:
    Only for ``--target torchtpu``, on scripts of any torch_xla generation (this tool's ``sagemaker`` and
    ``2.9`` outputs included). ``xm.xla_device()`` / ``torch_xla.device()`` / ``torch.device("xla")`` become
    the accelerator device with the CPU fallback; ``xm.mark_step()`` / ``torch_xla.sync()`` statements are
    removed; ``xm.wait_device_ops()`` becomes ``torch.accelerator.synchronize()`` where there is an
    accelerator; ``xm.optimizer_step(opt)`` becomes ``opt.step()``; ``pl.MpDeviceLoader(loader, device)`` and
    ``pl.ParallelLoader(loader, [device]).per_device_loader(device)`` become ``loader``, and a loop over it
    whose batch the body does not move gets ``a, b = a.to(device), b.to(device)``; ``xm.save`` becomes
    ``torch.save`` (inside ``if <local rank> == 0:`` in a distributed script where it is not guarded already,
    as xm.save saved on the master only); ``xm.add_step_closure(f, args=(a,))`` becomes ``f(a)``; the
    syncfree optimizers become ``torch.optim``'s; ``torch_xla.amp.autocast(device)`` becomes
    bf16 ``torch.autocast`` on the accelerator's type (``"tpu"``; ``"cpu"`` without one), ``"xla"`` in
    ``torch.autocast`` that type, and in ``torch.amp.GradScaler`` ``"tpu"`` (XLA202 removes torch_xla's GradScaler); ``xm.set_rng_state(n)``
    / ``torch_xla.manual_seed(n)`` become ``torch.manual_seed(n)`` (removed where the script calls it);
    ``xr.initialize_cache(...)`` is removed; ``xm.xla_device_hw(d)`` becomes ``torch.device(d).type.upper()``
    ("TPU" or "CPU", as a gate such as ``!= "CPU"`` reads it). In a distributed script without DDP, the reduction
    ``xm.optimizer_step`` did is reported. XLA704 does ranks, launch, collectives and SPMD.

Why:
    TorchTPU (torch_tpu 0.2.0) replaces torch_xla, whose 2.9.0 is the last release. It runs eagerly: there is
    no step barrier, no device loader, and a plain optimizer step. Nothing here was run on a TPU.

Example:
    device = xm.xla_device()
    for x, y in pl.MpDeviceLoader(loader, device):
        loss = model(x).sum()
        loss.backward()
        xm.optimizer_step(optimizer)
        xm.mark_step()

Use instead:
    device = torch.accelerator.current_accelerator(check_available=True) or torch.device("cpu")
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = model(x).sum()
        loss.backward()
        optimizer.step()
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.analysis.facts import DDP
from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.common import short
from xla_migrate.transforms.torchtpu import torch_xla_names as names
from xla_migrate.transforms.torchtpu import xm_form_ddp

# Parents under which the accelerator device's `a or b` needs parentheses.
_TIGHT = (cst.Attribute, cst.Subscript, cst.BinaryOperation, cst.Comparison, cst.UnaryOperation,
          cst.BooleanOperation)
DDP_REDUCES = ("wrap the model in DistributedDataParallel on the tpu_dist process group "
               "(dist.init_process_group(\"tpu_dist\"); DDP(model)): xm.optimizer_step all-reduced the gradients, "
               "optimizer.step() alone does not")


class TorchXlaToTorchTpu(Rule):
    code = "XLA703"
    name = "torch-xla-to-torchtpu"
    summary = "torch_xla device, mark_step/sync, optimizer_step, MpDeviceLoader, xm.save, closures, AMP -> TorchTPU"
    targets = ("torchtpu",)
    on_xla_code = True
    fix_safety = "review"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        calls = patterns.find_all(ctx.module, lambda n: isinstance(n, cst.Call)) if "xla" in ctx.input_code else []
        # The functions (None: module level) that call torch.manual_seed, which seeds the TPU under TorchTPU.
        self._seeded = {self._function_of(n) for n in calls if ctx.is_call_to(n, "torch.manual_seed")}
        self._distributed = ctx.distributed or any(ctx.is_call_to(n, *names.DISTRIBUTED) for n in calls)
        # DDP reduces: the script's own, or the one the xm form gets back (XLA704, xm_form_ddp).
        self._ddp = bool(ctx.facts.ddp_models) or any(ctx.is_call_to(n, *DDP) for n in calls) or (
            ctx.facts.upgrades_xla_code and xm_form_ddp.plan(ctx) is not None)
        for statement in ctx.module.body:  # every torch_xla import: removed once nothing reads it
            for small in statement.body if isinstance(statement, cst.SimpleStatementLine) else ():
                if isinstance(small, cst.Import):
                    for alias in small.names:
                        module = patterns.dotted_name(alias.name) or ""
                        if names.is_torch_xla(module):
                            self.import_may_be_dead(module)
                elif isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
                    module = patterns.dotted_name(small.module) or ""
                    if names.is_torch_xla(module) and not isinstance(small.names, cst.ImportStar):
                        for alias in small.names:
                            self.import_may_be_dead(module, alias.evaluated_name)

    def _function_of(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        current = self.ctx.parent(node)
        while current is not None and not isinstance(current, cst.FunctionDef):
            current = self.ctx.parent(current)
        return current

    def _statement_of(self, node: cst.Call) -> cst.Expr | None:
        parent = self.ctx.parent(node)
        return parent if isinstance(parent, cst.Expr) and parent.value is node else None

    def _line_of(self, node: cst.Call) -> cst.SimpleStatementLine | None:
        """The line ``node`` is the only statement of."""
        statement = self._statement_of(node)
        line = self.ctx.parent(statement) if statement is not None else None
        return line if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        if ctx.is_call_to(node, *names.DEVICE) or (
                ctx.is_call_to(node, "torch.device") and len(node.args) == 1
                and (patterns.string_value(node.args[0].value) or "").split(":")[0] == "xla"):
            self._device(node)
        elif ctx.is_call_to(node, *names.BARRIER):
            self._removed(node, "TorchTPU runs eagerly: no step barrier")
        elif ctx.is_call_to(node, *names.CACHE):
            self._removed(node, "torch_xla's compilation cache (TorchTPU runs eagerly)")
        elif ctx.is_call_to(node, *names.SEEDS):
            self._seed(node)
        elif ctx.is_call_to(node, *names.WAIT):
            self._wait(node)
        elif ctx.is_call_to(node, *names.DEVICE_HW) and len(node.args) == 1 and not node.args[0].star:
            self.replace(node, lambda updated: patterns.parsed_expression(ctx.spell("device_hw", patterns.code_of(
                updated.args[0].value))), f"{short(node)} -> the device type in capitals (\"TPU\", \"CPU\")")
        elif ctx.is_call_to(node, *names.OPTIMIZER_STEP):
            self._optimizer_step(node)
        elif ctx.is_call_to(node, *names.DEVICE_LOADER):
            self._loader(node, node)
        elif patterns.method_call(node, "per_device_loader") and isinstance(node.func.value, cst.Call) and \
                ctx.is_call_to(node.func.value, *names.PARALLEL_LOADER):
            self._loader(node, node.func.value)
        elif ctx.is_call_to(node, *names.SAVE):
            self._save(node)
        elif ctx.is_call_to(node, *names.STEP_CLOSURE):
            self._closure(node)
        elif ctx.is_call_to(node, *names.SYNCFREE):
            optimizer = sorted(n for n in ctx.qualnames(node.func) if n in names.SYNCFREE)[0].rsplit(".", 1)[1]
            func = patterns.parsed_expression(ctx.spell("optimizer_class", optimizer))
            self.replace(node, lambda updated: updated.with_changes(func=func),
                         f"{short(node.func)} -> {patterns.code_of(func)}: TorchTPU steps torch's optimizers")
        elif ctx.is_call_to(node, *names.AUTOCAST):
            self._autocast(node)
        elif ctx.is_call_to(node, *names.TYPED[:3]):
            self._device_type(node)

    # The device ------------------------------------------------------------------------------------------
    def _device(self, node: cst.Call) -> None:
        code = names.quoted_for(self.ctx.spell("device"), names.fstring_quote(self.ctx, node))
        new = patterns.parsed_expression(code)
        if isinstance(self.ctx.parent(node), _TIGHT):
            new = new.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        self.replace(node, new, f"{short(node)} -> the accelerator device (the CPU without one)")

    def _device_type(self, node: cst.Call) -> None:
        arg = patterns.keyword(node, "device_type") or (patterns.positional(node) or [None])[0]
        if arg is None or patterns.string_value(arg.value) != "xla" or not isinstance(arg.value, cst.SimpleString):
            return
        quote = arg.value.value[-1]
        if self.ctx.is_call_to(node, *names.TYPED[:2]):  # autocast: the accelerator's type, else the CPU's
            self.replace(arg.value, patterns.parsed_expression(self.ctx.spell("device_string")),
                         f'{short(node)}: "xla" -> the accelerator\'s type ("tpu"), else "cpu"')
            return
        self.replace(arg.value, cst.SimpleString(self.ctx.spell("device_type").replace('"', quote)),
                     f'{short(node)}: "xla" -> "tpu", TorchTPU\'s device type')

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        """Any other ``"xla"`` device string (``device_type = "xla"``, a ``--device`` option's default and
        choices, ``device.type == "xla"``): TorchTPU's ``"tpu"``."""
        parent = self.ctx.parent(node)
        if not is_xla_device_string(node) or (isinstance(parent, cst.Arg) and isinstance(
                self.ctx.parent(parent), cst.Call) and self.ctx.is_call_to(self.ctx.parent(parent), *names.TYPED)):
            return  # the calls above rewrite their own
        if isinstance(parent, cst.Arg) and isinstance(self.ctx.parent(parent), cst.Call) and self.ctx.is_call_to(
                self.ctx.parent(parent), "torch.distributed.init_process_group"):
            return  # XLA704's
        if isinstance(parent, cst.Arg) and parent.keyword is not None and parent.keyword.value == "default" and \
                patterns.method_call(self.ctx.parent(parent), "add_argument"):
            # An option's default: the accelerator's type where there is one, else "cpu" (the torch_xla script
            # had no CPU fallback to keep; "tpu" alone fails on a machine without one).
            new = patterns.parsed_expression(self.ctx.spell("device_string"))
            self.replace(node, new, f"{node.value} -> the accelerator's type, else \"cpu\": the option's default")
            return
        quote = node.value[-1]
        self.replace(node, cst.SimpleString(self.ctx.spell("device_type").replace('"', quote)),
                     f'{node.value} -> "tpu", TorchTPU\'s device type')

    # Statements that go --------------------------------------------------------------------------------------
    def _removed(self, node: cst.Call, why: str) -> None:
        statement = self._statement_of(node)
        if statement is not None:
            self.remove(statement, f"removed {short(node)}: {why}")
        else:
            self.finding(node, f"{short(node)}: its value is used; {why}", "remove it by hand")

    def _seed(self, node: cst.Call) -> None:
        statement = self._statement_of(node)
        args = patterns.positional(node)
        if statement is not None and self._function_of(node) in self._seeded:
            self.remove(statement, f"removed {short(node)}: torch.manual_seed, which the script calls, seeds the TPU")
        elif len(args) >= 1:
            func = patterns.parsed_expression(self.ctx.spell("manual_seed", "_").rsplit("(", 1)[0])
            self.replace(node, lambda updated: updated.with_changes(func=func, args=[updated.args[0].with_changes(
                comma=cst.MaybeSentinel.DEFAULT)]), f"{short(node)} -> {patterns.code_of(func)}(...): it seeds the TPU")

    def _wait(self, node: cst.Call) -> None:
        line = self._line_of(node)
        if line is None:
            self.finding(node, f"{short(node)}: TorchTPU has no wait_device_ops",
                         "call torch.accelerator.synchronize() where there is an accelerator")
            return
        guarded = patterns.parsed_statement(
            f"if {self.ctx.spell('accelerator_available')}:\n    {self.ctx.spell('wait_device_ops')}\n")
        self.replace(line, lambda updated: guarded.with_changes(leading_lines=updated.leading_lines),
                     f"{short(node)} -> torch.accelerator.synchronize() where there is an accelerator")

    # The step ----------------------------------------------------------------------------------------------
    def _optimizer_step(self, node: cst.Call) -> None:
        positional = patterns.positional(node)
        optimizer = positional[0] if positional else patterns.keyword(node, "optimizer")
        if optimizer is None:
            return
        index = node.args.index(optimizer)
        extra = patterns.keyword(node, "optimizer_args")

        def step(updated: cst.Call) -> cst.Call:
            receiver = updated.args[index].value
            args = []
            if extra is not None:
                value = updated.args[node.args.index(extra)].value
                args = [cst.Arg(value=value, star="**")]
            return cst.Call(func=cst.Attribute(value=receiver, attr=cst.Name("step")), args=args)

        self.replace(node, step, f"{short(node)} -> {patterns.code_of(optimizer.value)}.step(): TorchTPU steps "
                                 "the optimizer as it is")
        if self._distributed and not self._ddp:
            self.finding(node, f"{short(node)}: the gradients are no longer reduced over the replicas",
                         DDP_REDUCES)

    def _loader(self, node: cst.Call, loader_call: cst.Call) -> None:
        positional = patterns.positional(loader_call)
        if not positional:
            return
        if patterns.keyword(loader_call, "input_sharding") is not None:
            self.finding(node, f"{short(node)}: a batch sharded over an SPMD mesh, not migrated mechanically",
                         'shard the batch as a DTensor on init_device_mesh("tpu", ...) by hand')
            return
        index = loader_call.args.index(positional[0])
        assign = self.ctx.parent(node)
        source = positional[0].value
        if isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(source, cst.Name) and \
                patterns.code_of(assign.targets[0].target) == source.value and self._line_of_assign(assign):
            # loader = pl.MpDeviceLoader(loader, device): the line goes (it would read `loader = loader`).
            self.remove(self.ctx.parent(assign), f"removed {short(node)}: TorchTPU reads the plain loader")
            if not self._batches_moved(node, source.value):
                self.finding(node, f"{short(node)}: the loader's batches are no longer moved to the device",
                             "move each batch with .to(device) where the loop reads it")
            return
        self.replace(node, lambda updated: _loader_arg(updated, node is loader_call, index).with_changes(
            comma=cst.MaybeSentinel.DEFAULT).value, f"{short(node)} -> {short(positional[0].value)}: TorchTPU reads "
                                                    "the plain loader")
        self._move_batches(node, positional[1].value if len(positional) > 1 else None)

    def _line_of_assign(self, assign: cst.Assign) -> bool:
        line = self.ctx.parent(assign)
        return isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1

    def _batches_moved(self, node: cst.Call, loader: str) -> bool:
        """Every loop over ``loader`` (or ``enumerate(loader)``) in ``node``'s function moves what it reads."""
        scope = self._function_of(node) or self.ctx.module
        loops = [n for n in patterns.find_all(scope, lambda n: isinstance(n, cst.For)) if patterns.code_of(
            n.iter) in (loader, f"enumerate({loader})")]
        return bool(loops) and all(".to(" in patterns.code_of(loop.body) for loop in loops)

    def _move_batches(self, node: cst.Call, device: cst.BaseExpression | None) -> None:
        loop, iterated = self.ctx.parent(node), node
        enumerated = isinstance(loop, cst.Arg) and isinstance(self.ctx.parent(loop), cst.Call) and patterns.call_name(
            self.ctx.parent(loop)) == "enumerate"
        if enumerated:  # for step, (x, y) in enumerate(loader)
            iterated = self.ctx.parent(loop)
            loop = self.ctx.parent(iterated)
        if not (isinstance(loop, cst.For) and loop.iter is iterated and isinstance(loop.body, cst.IndentedBlock)) or (
                enumerated and not (isinstance(loop.target, cst.Tuple) and len(loop.target.elements) == 2)):
            self.finding(node, f"{short(node)}: the loader's batches are no longer moved to the device",
                         "move each batch with .to(device) where the loop reads it")
            return
        target = loop.target.elements[1].value if enumerated else loop.target
        elements = [e.value for e in target.elements] if isinstance(target, (cst.Tuple, cst.List)) else [target]
        if not all(isinstance(e, cst.Name) for e in elements):
            return self.finding(node, f"{short(node)}: the loader's batches are no longer moved to the device",
                                "move each batch with .to(device) where the loop reads it")
        body = patterns.code_of(loop.body)
        if any(f"{e.value}.to(" in body for e in elements):
            return  # the body moves the batch already (the CUDA original did)
        if not isinstance(target, (cst.Tuple, cst.List)):
            return self.finding(node, f"{short(node)}: the batch `{elements[0].value}` is no longer moved to the "
                                "device", "move it with .to(device) where the loop reads it")
        where = patterns.code_of(device) if isinstance(device, (cst.Name, cst.Attribute)) else self.ctx.spell("device")
        moved = ", ".join(f"{e.value}.to({where})" for e in elements)
        line = self.ctx.statement(f"{', '.join(e.value for e in elements)} = {moved}")
        self.insert_before(loop.body.body[0], [line], f"the batch is moved to {where} (MpDeviceLoader did it)")

    # Checkpoints and closures ------------------------------------------------------------------------------
    def _save(self, node: cst.Call) -> None:
        master_only = patterns.keyword(node, "master_only")
        global_master = patterns.keyword(node, "global_master")
        func = patterns.parsed_expression(self.ctx.spell("save"))
        dropped = ("master_only", "global_master")

        def save(updated: cst.Call) -> cst.Call:
            kept = [a for a in updated.args if a.keyword is None or a.keyword.value not in dropped]
            kept = [a for i, a in enumerate(kept) if i < 2 or a.keyword is not None]  # xm.save's 3rd: master_only
            return updated.with_changes(func=func, args=patterns.without_trailing_comma(kept))

        self.replace(node, save, f"{short(node.func)} -> {patterns.code_of(func)}")
        off = master_only is not None and patterns.code_of(master_only.value) == "False"
        line = self._line_of(node)
        if not self._distributed or off or self._guarded(node):
            return
        concept = "is_global_master" if global_master is not None and patterns.code_of(
            global_master.value) == "True" else "is_master"
        if line is None:
            self.finding(node, f"{short(node)}: xm.save saved on the master only", f"save under `if "
                         f"{self.ctx.spell(concept)}:`")
            return
        test = patterns.parsed_expression(self.ctx.spell(concept))
        self.replace(line, lambda updated: cst.If(
            test=test, body=cst.IndentedBlock(body=[updated.with_changes(leading_lines=[])]),
            leading_lines=updated.leading_lines), "torch.save on the master only, as xm.save was")

    def _guarded(self, node: cst.CSTNode) -> bool:
        current = self.ctx.parent(node)
        while current is not None:
            if isinstance(current, cst.If) and any(word in patterns.code_of(current.test).lower() for word in (
                    "master", "rank", "ordinal")):
                return True
            if isinstance(current, cst.FunctionDef):
                return False
            current = self.ctx.parent(current)
        return False

    def _closure(self, node: cst.Call) -> None:
        positional = patterns.positional(node)
        if not positional:
            return
        args = patterns.keyword(node, "args") or (positional[1] if len(positional) > 1 else None)
        statement = self._statement_of(node)
        fn_index, args_index = node.args.index(positional[0]), node.args.index(args) if args else None

        def called(updated: cst.Call) -> cst.BaseExpression:
            target = updated.args[fn_index].value
            if isinstance(target, cst.Lambda) and not target.params.params and args_index is None:
                return target.body
            if isinstance(target, cst.Lambda) and args_index is not None and _passes_own_names(
                    target, updated.args[args_index].value):
                return target.body  # lambda step, loss: ..., args=(step, loss): the body reads the same names
            if isinstance(target, cst.Lambda):
                target = target.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            call_args: list[cst.Arg] = []
            if args_index is not None:
                value = updated.args[args_index].value
                if isinstance(value, cst.Tuple):
                    call_args = [cst.Arg(value=e.value) for e in value.elements]
                else:
                    call_args = [cst.Arg(value=value, star="*")]
            return cst.Call(func=target, args=[a.with_changes(comma=cst.Comma(
                whitespace_after=cst.SimpleWhitespace(" "))) for a in call_args[:-1]] + call_args[-1:])

        if statement is None:
            self.finding(node, f"{short(node)}: its value is used", "call the closure directly (TorchTPU is eager)")
            return
        self.replace(node, called, f"{short(node)}: the closure is called now (TorchTPU is eager)")

    # AMP ---------------------------------------------------------------------------------------------------
    def _autocast(self, node: cst.Call) -> None:
        base = patterns.parsed_expression(self.ctx.spell("autocast"))
        assert isinstance(base, cst.Call)
        skipped = {"device", "device_type", "dtype"}
        first = patterns.positional(node)[:1]
        indexes = [i for i, a in enumerate(node.args) if a not in first and (
            a.keyword is None or a.keyword.value not in skipped)]

        def autocast(updated: cst.Call) -> cst.Call:
            kept = [updated.args[i] for i in indexes]
            args = [*base.args, *kept]
            return base.with_changes(args=[a.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(
                " "))) for a in args[:-1]] + [args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)])

        self.replace(node, autocast, f"{short(node)} -> {patterns.code_of(base)}: TorchTPU's bf16 autocast")
        dtype = patterns.keyword(node, "dtype")
        if dtype is not None and "bfloat16" not in patterns.code_of(dtype.value):
            self.finding(node, f"{short(node)}: autocast to {patterns.code_of(dtype.value)}",
                         "TorchTPU's autocast is bfloat16 (no GradScaler): check the loss scale is not needed")


def _loader_arg(updated: cst.Call, is_loader: bool, index: int) -> cst.Arg:
    loader_call = updated if is_loader else updated.func.value
    return loader_call.args[index]


def is_xla_device_string(node: cst.CSTNode) -> bool:
    """``"xla"`` or ``"xla:0"``: a device (type) named as a string in torch_xla code."""
    value = patterns.string_value(node) if isinstance(node, cst.SimpleString) else None
    return value is not None and (value == "xla" or (value.startswith("xla:") and value[4:].isdigit()))


def _passes_own_names(function: cst.Lambda, args: cst.BaseExpression) -> bool:
    """``lambda a, b: ...`` given ``args=(a, b)``: each parameter receives the variable of its own name."""
    params = function.params
    if params.star_arg is not cst.MaybeSentinel.DEFAULT or params.kwonly_params or params.star_kwarg or \
            params.posonly_params or any(p.default is not None for p in params.params):
        return False
    if not isinstance(args, cst.Tuple) or len(args.elements) != len(params.params):
        return False
    return all(isinstance(e.value, cst.Name) and e.value.value == p.name.value
               for e, p in zip(args.elements, params.params))
