"""XLA311 lazy-tensor-host-reads: tensor values read every step for control flow or accumulation are reported.

What it does:
    In a training step or an evaluation batch, as the step model sees them (``xla_migrate.analysis.steps``: the loop's
    body, and the functions it calls, followed through ``self`` methods and objects' ``__call__``), reports
    each read of a tensor's value to the host that is not pure logging: ``loss.item()``, ``float(loss)``,
    ``x.tolist()``, ``x.cpu()``,
    ``x.numpy()`` in assignments, accumulations (``total += loss.item()``), calls (``losses.append(...)``),
    and ``if``/``while`` conditions that test a tensor (``if loss.item() > 10:``, ``if torch.isnan(loss):``).
    A read in a called function names its call path (``loss.item() in Trainer._run_batch (run every step
    by the loop at line 40: self._run_batch(...))``). Nothing is rewritten here. Logging statements are
    XLA310's (moved into a step closure), running sums XLA313's (kept on the device), finite checks that stop
    training XLA314's; when those rules run, the reads they move are not reported. Reads inside
    ``xm.add_step_closure`` are already where they belong, and so are reads
    after the step's end (after a step barrier, or after the optimizer step in a loop without a device
    loader, where XLA302 marks the step).

    Program-wide (issue 30): tests that read a tensor without ``.item()`` (``assert torch.isfinite(loss)``,
    ``assert y.min() >= 0``, ``if not (torch.isinf(p.grad) | torch.isnan(p.grad)).any():``; identity tests
    like ``p.grad is not None`` are not reads, nor membership tests without a step's tensor: ``i in ids`` with ``i``
    enumerate's index, also through ``tqdm(enumerate(loader))``, or ``"mask" in batch``, nor a name bound to a
    call of the module's function that returns only numbers, ``scale = loss_scale_for(n)``), truth tests in a function
    the step calls that reads nothing else (``if torch.min(y) < -1.:``, ``while t.max() > 1:`` with ``t`` bound to a
    torch computation, ``assert (t >= 0).all()``), reads in the ``forward`` of the module's own models
    (``(lengths - 1).tolist()``), calls into another module of the project whose helper reads
    (``metrics.loss_value(loss)`` returning ``loss.item()``; from the project index, with the helper's file
    and line, and a truth test of a tensor in the helper: ``if torch.min(y) < -1.:`` in hifi-gan's
    ``mel_spectrogram``, where a torch call or a name bound to one is the evidence; also a method of an object
    ``__init__`` made from a project class, ``self.mp_trainer.optimize()``, with the reads of the methods it calls
    through ``self``), reads in the ``forward`` of a model class a loop of another module calls (imported, also
    by a star import) and in the project functions that forward calls (reported in their own file, with the loop
    that runs them: ``in Decoder.forward (run every step by the loop at train.py:12: model(...))``), and a kept
    GradScaler's ``get_scale()``/``state_dict()``, and the reads of a rollout loop that runs the trained model
    beside the training loop (cleanrl's ppo/pqn: ``for step in range(num_steps): ...
    envs.step(action.cpu().numpy())`` then the update epochs, both in ``for iteration ...``; the model is a
    forward or what the optimizer trains, ``optim.Adam(agent.parameters())``): every rollout step, with no
    rewrite, since the environment needs the value. A read repeated by a loop below the step (over the
    parameters) says so: as many syncs per step. A logging statement XLA310 leaves in place
    (under a ``try`` or ``with`` of the step) is reported with the reason; one that runs right before leaving
    the loop is not (it runs once). After the step's barrier a read of a value is free, but a read of a
    computation on the step's tensors (``loss_dict[k].mean().item()``) runs one more graph: reported when no
    rule moves it. ``torch.cuda.synchronize()`` in every step (``xm.wait_device_ops()`` on XLA) is reported
    too: the host then waits for the device each step. A greedy or beam decode loop that calls a model's
    submodules one by one (``h = decoder.cell(decoder.embed(tokens), h)``, ``decoder.out(h).argmax(1)``, with
    ``self.cell = nn.GRUCell(...)`` in the module's class) is an evaluation loop: its reads say ``every token
    of the decode loop at line N`` and the fix keeps the batch fixed, masks the finished rows
    (``torch.where(done, END, tokens)``) and reads the tokens once after the loop. A comprehension that tests
    each element of a device tensor (``[i for i, t in zip(alive, tokens) if t != END]``) is a sync per element:
    reported, with the fix to compare on the device and read the mask once.

    Not reads (issue 33): a tensor built on the CPU (a torch factory without ``device=``, ``losses =
    torch.zeros(eval_iters)`` filled with ``.item()``), what is computed from it without a move
    (``losses.mean()``), and a name bound to a call of the module's function returning only such values
    (llama2.c's ``val_loss = estimate_loss()``): comparing or reading them syncs nothing on the device. A
    read under ``if step % eval_interval == 0:`` (also through the calls on its path) says ``every
    eval_interval steps``, not every step.

Why:
    Each read runs the step's graph up to that value before the step ends: a second graph execution every
    step (measured: ``loss.item()`` every step, 2 compiles and 40 executions for 20 steps instead of 1 and
    20). Accumulate on the device and read once (after the loop, or every N steps); decide control flow
    from a value read less often.

Example:
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        total_loss += loss.item()

Use instead:
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        total_loss += loss.detach()  # a device tensor; read it once, after the loop
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.analysis import steps, tensor_tests
from xla_migrate.analysis.steps import closure_safety
from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule
from xla_migrate.analysis.steps import Region
from xla_migrate.transforms.common import short
from xla_migrate.transforms.loop import host_tensors

ACCUMULATE = ("keep the running value on the device (total += loss.detach()) and read it once after the loop "
              "or every N steps, or log it through xm.add_step_closure")
DECODE = ("keep the batch fixed and mask the finished rows (tokens = torch.where(done, END, tokens)) instead of "
          "slicing them away, keep the tokens on the device and read them once after the loop, and test a device-side "
          "done.all() every N tokens")
FOREIGN = ("keep the value on the device (masks from the lengths, a fixed maximum length: torch.arange(MAX_LEN) < "
           "lengths[:, None]) so the forward has one shape, or compute it on the host before the batch moves")
ROLLOUT = ("the read is needed (the environment runs on the host): act with a CPU copy of the policy (load its "
           "state_dict after each update) so the rollout runs no device graph, or step more environments at once "
           "(a vectorized env) so each read serves a whole batch")
ELEMENTS = ("compare on the device and read once: keep = (tokens != END) as a mask (torch.where on it), or read "
            "keep.tolist() once instead of testing each element")
CONTROL = "decide from a value read every N steps (or after the loop), not every step"
CHECK = ("move the check with what it reports into a function run by xm.add_step_closure (it runs once the step's "
         "graph has run), or drop it, or check the batch on the CPU before it moves to the device")
ASSERT = ("check on the device and read once (flags = torch.stack([...]); read them every N steps or after the "
          "loop), or move the check into a function run by xm.add_step_closure; python -O drops asserts")


class LazyTensorHostReads(Rule):
    code = "XLA311"
    name = "lazy-tensor-host-reads"
    summary = "tensor reads per training step or eval batch that no rule moves (if loss > x, x.cpu()) are reported"
    on_xla_code = True  # reports only: it runs on code already on XLA too
    reports_only = True

    def _cpu_names(self, region: Region) -> set[str]:
        """Names holding CPU tensors where the region runs (host_tensors), once per scope."""
        cache = self.__dict__.setdefault("_cpu_cache", {})
        key = id(region.function if region.in_callee else region.step.loop)
        if key not in cache:
            cache[key] = host_tensors.region_cpu_names(self.ctx, region)
        return cache[key]

    def _reads_cpu_tensor(self, node: cst.Call, region: Region) -> bool:
        """``val_loss.item()`` / ``float(val_loss)`` of a CPU tensor: nothing comes from the device."""
        read = node.func.value if isinstance(node.func, cst.Attribute) else (
            node.args[0].value if node.args else None)
        return read is not None and host_tensors.on_cpu(self.ctx, read, self._cpu_names(region))

    def _every(self, node: cst.CSTNode, region: Region) -> tuple[str, str]:
        """How often the read runs (``every step``, ``every evaluation batch``, ``every eval_interval steps``
        under ``if step % eval_interval == 0``) and the call path it runs through."""
        every = "every step" if region.step.kind == "train" else "every evaluation batch"
        if self.ctx.steps.is_decode_loop(region.step):
            every = f"every token of the decode loop at line {self.ctx.position(region.step.loop)[0]}"
        where = steps.describe_path(self.ctx, region)
        sometimes = host_tensors.interval(self.ctx, node, region) if region.step.kind == "train" else ""
        if sometimes:
            every = sometimes
            where = where.replace("run every step by", "run by")
        return every + tensor_tests.repeated(self.ctx, node, region), where

    def _report(self, node: cst.CSTNode, region: Region, fix: str, what: str) -> None:
        every, where = self._every(node, region)
        self.finding(node, f"{short(node)}{where}: {what} {every} (a device sync: the graph runs mid-step)", fix)

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        if not steps.may_read(node):
            self._external(node)
            self._scaler_state(node)
            self._synchronize(node)
            return
        region = ctx.steps.region(node)
        if region is None:
            self._rollout(node)
            self._foreign(node)
            return
        if steps.in_step_closure(ctx, node):
            return
        if ctx.steps.after_step_end(node, region):
            self._computed_after_the_barrier(node, region)
            return
        if not steps.reads(ctx, node, set()) == [node] and not self._is_conversion(node, region):
            return
        if self._reads_cpu_tensor(node, region):
            return
        if steps.is_logging_read(ctx, node) or self._in_condition(node) or ctx.steps.moves_read(node):
            return
        if steps.in_logging_compound(ctx, node) or self._runs_once(node, region):
            return
        if self._is_outermost_read(node, region):
            kept = self._kept_logging(node, region)
            if kept:
                self._report(node, region, kept[1], f"kept in place ({kept[0]}): reads a tensor's value to the host")
                return
            fix = DECODE if self.ctx.steps.is_decode_loop(region.step) else ACCUMULATE
            self._report(node, region, fix, "reads a tensor's value to the host")

    def _foreign(self, node: cst.Call) -> None:
        """A read in a function a loop of another module runs every step (the project index: the forward
        of a model class that module imports, and the helpers it calls)."""
        ctx = self.ctx
        where = ctx.steps.foreign_step(node)
        if where is None or steps.reads(ctx, node, set()) != [node] or steps.is_logging_read(ctx, node):
            return
        if steps.in_logging_compound(ctx, node) or steps.in_step_closure(ctx, node):
            return
        current = ctx.parent(node)
        while current is not None and not isinstance(current, (cst.BaseStatement, cst.BaseSmallStatement)):
            if isinstance(current, cst.Call) and steps.reads(ctx, current, set()) == [current]:
                return  # ``float(x.item())`` is one read: the outer call's
            current = ctx.parent(current)
        self.finding(node, f"{short(node)}{where}: reads a tensor's value to the host every step (a device sync: "
                           "the graph runs mid-step); a loop bound or a shape taken from it compiles a new graph "
                           "per distinct value", FOREIGN)

    def _rollout(self, node: cst.Call) -> None:
        """A read in a rollout loop beside the training loop (``envs.step(action.cpu().numpy())`` in cleanrl's
        ppo/pqn): reported, not moved (the environment runs on the host, so the value is needed there)."""
        ctx = self.ctx
        region = ctx.steps.rollout_region(node)
        if region is None or steps.reads(ctx, node, set()) != [node] or self._reads_cpu_tensor(node, region):
            return
        if steps.is_logging_read(ctx, node) or steps.in_logging_compound(ctx, node) or steps.in_step_closure(ctx, node):
            return
        if self._runs_once(node, region) or not self._is_outermost_read(node, region):
            return
        _, train, outer = ctx.steps.rollouts[region.step.loop]
        line = ctx.position
        self.finding(node, f"{short(node)}: reads a tensor's value to the host every rollout step (the loop at line "
                           f"{line(region.step.loop)[0]}, beside the training loop at line {line(train.loop)[0]} in "
                           f"the loop at line {line(outer)[0]}): a device sync that runs the policy's graph, one more "
                           "graph execution per environment step on top of the updates'",
                     ROLLOUT)

    def _computed_after_the_barrier(self, node: cst.Call, region: Region) -> None:
        """After the step's barrier a read of a value is free, but a read of a computation on the step's
        tensors (``loss_dict[k].mean().item()``, ``out.argmax(1).tolist()``) runs one more graph for it."""
        ctx = self.ctx
        if steps.reads(ctx, node, set()) != [node] or ctx.steps.moves_read(node) or not self._is_outermost_read(
                node, region):
            return
        value = node.func.value if isinstance(node.func, cst.Attribute) else (node.args[0].value if node.args else None)
        if value is None or not patterns.find_all(value, lambda n: isinstance(n, cst.Call)):
            return
        if not steps.mentions(value, ctx.steps.tensor_names(region)) or self._runs_once(node, region):
            return
        every = "every step" if region.step.kind == "train" else "every evaluation batch"
        self.finding(node, f"{short(node)}: computes on the step's tensors after the step's barrier, so the read "
                           f"runs one more graph {every}",
                     "compute the value before the barrier (keep it a tensor: .detach()) and read it after, or "
                     "read it every N steps")

    def _synchronize(self, node: cst.Call) -> None:
        """``torch.cuda.synchronize()`` (``xm.wait_device_ops()`` on XLA) in every step: the host waits for the
        device each step, so tracing the next step no longer overlaps the device's work."""
        ctx = self.ctx
        names = ctx.qualnames(node.func)
        if not names & {"torch.cuda.synchronize", "torch_xla.core.xla_model.wait_device_ops"}:
            return
        region = ctx.steps.region(node)
        if region is None or steps.in_step_closure(ctx, node) or self._runs_once(node, region):
            return
        every = "every step" if region.step.kind == "train" else "every evaluation batch"
        self.finding(node, f"{short(node)}{steps.describe_path(ctx, region)}: the host waits for the device "
                           f"{every} (xm.wait_device_ops() on XLA)",
                     "drop it from the step (time steps with the host clock in a step closure, or wait once "
                     "after the loop)")

    def _external(self, node: cst.Call) -> None:
        """A call into another module of the project that reads a tensor's value (the project index)."""
        ctx = self.ctx
        if ctx.project is None or not isinstance(node.func, (cst.Name, cst.Attribute)):
            return
        region = ctx.steps.region(node)
        if region is None or steps.in_step_closure(ctx, node) or ctx.steps.after_step_end(node, region):
            return
        found = ctx.steps.external_read(node)
        if found is None or self._runs_once(node, region):
            return
        path, line, code = found
        looped = code.endswith(" in a loop")
        code = code.removesuffix(" in a loop")
        test = code.startswith(("if ", "while ", "assert "))
        what = (f"calls {short(node.func)}(), which {'tests a tensor' if test else 'reads a tensor'}'s value "
                f"{'on' if test else 'to'} the host "
                f"({path}:{line}: {code}{', in a loop: once per iteration' if looped else ''})")
        fix = (f"keep the value on the device in {short(node.func)} (return the tensor, .detach()) and read it in a "
               "step closure or every N steps; a check on the device (torch.where, clamp) instead of an `if` on "
               "the value")
        if test:
            fix = f"in {short(node.func)}: {CHECK}"
        self._report(node, region, fix, what)

    def _scaler_state(self, node: cst.Call) -> None:
        """``scaler.get_scale()`` / ``scaler.state_dict()`` of a GradScaler the target keeps: the scale is a
        device tensor, read with ``.item()`` inside (issue 36's Swin shape, on the sagemaker target)."""
        ctx = self.ctx
        method = patterns.method_call(node, "get_scale", "state_dict")
        receiver = patterns.dotted_name(method.value) if method is not None else None
        if receiver is None or not ctx.target.has_grad_scaler or not (
                receiver in ctx.facts.scalers or "scaler" in receiver.rsplit(".", 1)[-1].lower()):
            return
        region = ctx.steps.region(node)
        if region is None or steps.in_step_closure(ctx, node) or ctx.steps.after_step_end(node, region):
            return
        self._report(node, region, "read the scale every N steps, or after the loop (or in a step closure)",
                     f"reads the GradScaler's scale (a device tensor) to the host with {method.attr.value}()")

    def _statement(self, node: cst.CSTNode) -> cst.CSTNode | None:
        current = self.ctx.parent(node)
        while current is not None and not isinstance(current, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
            current = self.ctx.parent(current)
        return current

    def _runs_once(self, node: cst.CSTNode, region: Region) -> bool:
        """The read's statement is followed in its block by ``sys.exit``/``raise``/``return``/``break``: it runs
        once, on the way out, not every step."""
        statement = self._statement(node)
        return statement is not None and closure_safety.leaves_after(self.ctx, statement, region)

    def _kept_logging(self, node: cst.CSTNode, region: Region) -> tuple[str, str] | None:
        """A logging statement XLA310 leaves in place because a step closure would change what it does."""
        statement = self._statement(node)
        if not (isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call)
                and steps.is_logging_call(self.ctx, statement.value)):
            return None
        guard = closure_safety.guard(self.ctx, statement, region)
        if isinstance(guard, cst.Try):
            return ("under a `try` of the step, which a step closure would run outside of",
                    "move the whole try/except into a function and run it with xm.add_step_closure, or log "
                    "less often")
        if isinstance(guard, cst.With):
            return ("under a `with` of the step, whose resource is closed when a step closure runs",
                    "open the resource inside a function run by xm.add_step_closure, or log less often")
        return None

    def _is_conversion(self, node: cst.Call, region: Region) -> bool:
        return steps.reads(self.ctx, node, self.ctx.steps.tensor_names(region)) == [node]

    def _is_outermost_read(self, node: cst.Call, region: Region) -> bool:
        """``float(loss.item())`` is one read: report the outer call only."""
        names = self.ctx.steps.tensor_names(region)
        current = self.ctx.parent(node)
        while current is not None and not isinstance(current, (cst.BaseStatement, cst.BaseSmallStatement)):
            if isinstance(current, cst.Call) and steps.reads(self.ctx, current, names) == [current]:
                return False
            current = self.ctx.parent(current)
        return True

    def _in_condition(self, node: cst.CSTNode) -> bool:
        current, child = self.ctx.parent(node), node
        while current is not None and not isinstance(current, (cst.BaseStatement, cst.BaseSmallStatement)):
            child, current = current, self.ctx.parent(current)
        return isinstance(current, (cst.If, cst.While)) and child is current.test

    def _condition(self, node: cst.If | cst.While | cst.Assert, region: Region | None = None) -> None:
        ctx = self.ctx
        region = region or ctx.steps.region(node) or ctx.steps.called_region(node)
        if region is None or node is region.step.loop or ctx.steps.after_step_end(node, region):
            return
        if ctx.steps.moves_read(node) or self._runs_once(node.test, region):
            return
        names = self._device_names(region)
        # Explicit reads (``.item()``), or a test of a tensor: not its identity or a membership without one.
        if steps.reads(ctx, node.test, set()) or tensor_tests.tensor_valued(ctx, node.test, names,
                                                                            self._batches(region)):
            every, where = self._every(node, region)
            if isinstance(node, cst.Assert):
                self.finding(node.test, f"assert {short(node.test)}{where}: an assert on a tensor's value reads it "
                                        f"to the host {every} (a device sync: the graph runs mid-step)", ASSERT)
                return
            self.finding(node.test, f"{short(node.test)}{where}: a condition on a tensor's value reads it to the "
                                    f"host {every} (a device sync: the graph runs mid-step)",
                         CHECK if self._only_reports(node) else CONTROL)

    def _only_reports(self, node: cst.If | cst.While) -> bool:
        """``if torch.min(y) < -1.: print(...)``: a check whose body only logs, warns or raises."""
        if not isinstance(node, cst.If) or node.orelse is not None:
            return False
        for statement in patterns.find_all(node.body, lambda n: isinstance(n, cst.BaseSmallStatement)):
            if isinstance(statement, cst.Raise):
                continue
            if not (isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call) and (
                    steps.is_logging_call(self.ctx, statement.value)
                    or patterns.dotted_name(statement.value.func) in ("warnings.warn", "logging.warning"))):
                return False
        return True

    def _batches(self, region: Region) -> set[str]:
        return tensor_tests.batch_names(self.ctx, region)

    def visit_Assert(self, node: cst.Assert) -> None:
        region = self._assert_region(node)
        if region is not None:
            self._condition(node, region)

    def _assert_region(self, node: cst.Assert) -> Region | None:
        """An assert is not a node the step model marks: its test's first call or subscript is."""
        return self._first_region(node.test, (cst.Call, cst.Subscript))

    def _first_region(self, tree: cst.CSTNode, kinds: tuple[type, ...]) -> Region | None:
        """The region of the first node of ``kinds`` in ``tree`` that the step model places in one."""
        for inner in patterns.find_all(tree, lambda n: isinstance(n, kinds)):
            region = self.ctx.steps.region(inner) or self.ctx.steps.called_region(inner)
            if region is not None:
                return region
        return None

    def visit_If(self, node: cst.If) -> None:
        self._condition(node)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        """``[i for i, t in zip(alive, tokens) if t != END]``: the comprehension tests each element of a device
        tensor, a device sync per element (a decode loop's finished rows)."""
        if not node.ifs or not isinstance(node.target, (cst.Name, cst.Tuple)):
            return
        region = self._first_region(node.iter, (cst.Call, cst.Subscript, cst.Name))
        if region is None:
            return
        ctx = self.ctx
        names = self._device_names(region)
        iterated = patterns.positional(node.iter) if isinstance(node.iter, cst.Call) and ctx.is_call_to(
            node.iter, "builtins.zip", "builtins.enumerate") else []
        if not any(steps.mentions(part.value, names) for part in iterated) and not (
                isinstance(node.iter, cst.Name) and node.iter.value in names):
            return
        elements = {n.value for n in patterns.find_all(node.target, lambda n: isinstance(n, cst.Name))}
        tested = [test for test in node.ifs if steps.mentions(test.test, elements)]
        if tested:
            every, where = self._every(node, region)
            self.finding(tested[0].test, f"{short(tested[0].test)}{where}: a test of each element of a device "
                         f"tensor ({short(node.iter)}): a device sync per element, {every}", ELEMENTS)

    def _device_names(self, region: Region) -> set[str]:
        """Names that hold device tensors where the region runs: a test of one reads it to the host."""
        ctx = self.ctx
        return (ctx.steps.tensor_names(region) | tensor_tests.torch_bound_names(ctx, region)) - \
            tensor_tests.host_bound_names(ctx, region) - self._cpu_names(region)

    def visit_While(self, node: cst.While) -> None:
        self._condition(node)
