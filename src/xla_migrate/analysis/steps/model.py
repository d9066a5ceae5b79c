"""``StepModel``: the step analysis of one module (see the package docstring): its loops classified
(training, evaluation, micro-step), where each step ends (the barrier's place), and the queries the rules ask
(regions, tensors, loaders). Following calls is ``call_paths.py``; the gradient reduction is
``reductions.py``."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

import libcst as cst

from ...syntax import patterns
from ..facts import DATALOADERS, DEVICE_LOADERS
from .call_paths import CallPaths
from . import host_batch, not_steps
from .collect import _Collector, _receiver, is_model_call, runs_a_submodule
from .epoch_reads import RepeatedRead, repeated_reads
from .host_reads import _HostReadPlan
from .library_training import fabric_backward
from .kinds import (_ACCUMULATION_NAME, _LOADER_NAME, _TENSOR_CALLEES, BACKWARD, BARRIER, CALL, FORWARD, PASS_THROUGH,
                    READ, STEP, BarrierSite, Batches, Event, Function, Loop, Region, StepLoop)
from .reads import is_read_call, mentions, reads
from .reductions import GradientReductions
from .step_end import barrier_follows, collective_sites, final_sites

if TYPE_CHECKING:
    from ...engine.context import MigrationContext

# Engines that run a process function once per batch in a loop of their own (ignite).
ENGINES = ("ignite.engine.Engine", "ignite.engine.engine.Engine", "ignite.engine.DeterministicEngine")
# Methods of a model that run no forward (a rollout loop's evidence is a call that does).
_NOT_A_FORWARD = frozenset({"parameters", "named_parameters", "train", "eval", "state_dict", "load_state_dict",
                            "to", "cpu", "cuda", "zero_grad", "modules", "children", "requires_grad_"})


# The model -----------------------------------------------------------------------------------------------


class StepModel(CallPaths, GradientReductions):
    """The step analysis of one module (see the package docstring). Built by the context, once."""

    def __init__(self, ctx: MigrationContext) -> None:
        self.ctx = ctx
        collector = _Collector(ctx)
        ctx.module.visit(collector)
        self._c = collector
        self._effects: dict[cst.FunctionDef, list[Event]] = {}
        self._callees: dict[cst.Call, cst.FunctionDef | None] = {}
        self._instances_by_name: dict[str, set[str]] | None = None
        self._resolving: set[tuple[Function, str]] = set()
        self._passed: dict[tuple[cst.FunctionDef, str], list[tuple[cst.BaseExpression, Function]]] = {}
        self._passing_depth = 0  # passed_arguments' nesting (call_paths.MAX_PASSING_DEPTH)
        self._call_index: tuple | None = None  # the module's calls by name, built on first need (call_paths.py)
        self._called_from_steps: dict[cst.FunctionDef, tuple] | None = None
        self._backward_sites: dict[Function, list[cst.CSTNode]] = {}
        self.loops: dict[Loop, StepLoop] = {}
        # Micro-step loop -> the training loop whose step it is part of.
        self.micro_of: dict[Loop, StepLoop] = {}
        # Step function -> (step loop, path to it): functions a step loop calls, with the first path found.
        self.step_functions: dict[cst.FunctionDef, tuple[StepLoop, tuple[cst.Call, ...]]] = {}
        # Loop -> its barrier site once the host-read plan is known (step_end.py); None until first asked.
        self._final_sites: dict[cst.CSTNode, BarrierSite] | None = None
        self._finalizing = False
        self._collective_sites: dict[cst.CSTNode, list[BarrierSite]] = {}
        self._module_classes = not_steps.module_classes(ctx, collector.classes)
        self._import_time = not_steps.import_time_module(ctx)
        self._fabric_updates: tuple[int, dict[int, cst.CSTNode]] | None = None
        self._submodule_forwards: set[cst.CSTNode] = set()  # submodule calls counted as forwards (decode loops)
        self._submodule_calls_run_forward()
        self._classify()
        self._tensor_names: dict[object, set[str]] = {}

    # Classification ------------------------------------------------------------------------------------------
    def outside_steps(self, function: Function) -> bool:
        """No step loop lives in ``function`` (not_steps.py): a method of a torch module class (or a function
        nested in one), or the module-level code of a module imported by the project's entry files."""
        if function is None:
            return self._import_time
        current: Function = function
        while current is not None:
            owner = self._c.function_class.get(current)
            if owner is not None and owner in self._module_classes:
                return True
            current = self._c.function_parent.get(current)
        return False

    def _submodule_calls_run_forward(self) -> None:
        """A call of a model's submodule (``decoder.cell(...)`` in a greedy decode loop) runs a forward: the loop
        is an evaluation step like one calling ``decoder(...)`` (issue 30: its reads were left unreported)."""
        submodules = {attribute for (owner, attribute), held in self._c.self_instances.items()
                      if owner in self._module_classes and held[:1].isupper()}
        if self.ctx.project is not None:  # a model class of another module (image captioning's models.py)
            submodules |= self.ctx.project.index.submodule_attributes()
        if not submodules:
            return
        for raws in self._c.raw.values():
            for raw in raws:
                if raw.kind == CALL and runs_a_submodule(raw.node, self.ctx, submodules):  # type: ignore[arg-type]
                    raw.kind = FORWARD
                    self._submodule_forwards.add(raw.node)

    def is_decode_loop(self, step: StepLoop) -> bool:
        """An evaluation loop that runs a model's submodules one call at a time (a greedy or beam decode: each
        iteration makes one token from the last)."""
        return step.kind == "eval" and any(e.kind == FORWARD and e.node in self._submodule_forwards
                                           for e in step.events)

    def _classify(self) -> None:
        candidates: dict[Loop, list[Event]] = {}
        for loop in self._c.loops:
            if self.outside_steps(self._c.loop_function[loop]):
                continue
            candidates[loop] = self._events_of(self._c.loop_function[loop], loop, 0)
        micro: set[Loop] = set()
        trains: list[StepLoop] = []
        for loop in self._c.loops:  # outer loops first: they claim their micro-step loops
            if loop in micro or loop not in candidates:
                continue
            events = candidates[loop]
            direct_steps = [e for e in events if e.kind == STEP and not e.nested]
            direct_backward = [e for e in events if e.kind == BACKWARD and not e.nested]
            nested_backward = [e for e in events if e.kind == BACKWARD and e.nested]
            any_step = any(e.kind == STEP for e in events)
            if direct_steps and direct_backward:
                step = self._new(loop, "train", events)
            elif direct_steps and nested_backward:
                step = self._new(loop, "train", events)
                step.accumulation = "micro-steps"
                step.micro_loops = list(dict.fromkeys(e.inner_loop for e in nested_backward if e.inner_loop))
                micro.update(step.micro_loops)
            elif direct_backward and not any_step:
                step = self._new(loop, "train", events)
            else:
                continue
            trains.append(step)
        for step in self._parts_of_other_steps(trains):
            trains.remove(step)
            del self.loops[step.loop]
        for step in trains:
            for inner in step.micro_loops:
                self.micro_of[inner] = step
                self.loops.pop(inner, None)
        for loop in self._c.loops:
            if loop in self.loops or loop in micro or loop not in candidates or self._feeds_backward(loop):
                continue
            events = candidates[loop]
            if any(e.kind == BACKWARD for e in events) or any(e.kind == STEP for e in events):
                continue
            if any(e.kind == FORWARD and not e.nested for e in events):
                self._new(loop, "eval", events)
        for step in self.loops.values():
            self._finish(step)
        with_loops = {self._c.loop_function[s.loop] for s in self.loops.values()}
        for step in self.loops.values():
            for event in step.events:
                for index, call in enumerate(event.path):
                    target = self.forward_of(call)
                    if target is not None and target not in self.step_functions and target not in with_loops:
                        self.step_functions[target] = (step, event.path[: index + 1])

    def _parts_of_other_steps(self, trains: list[StepLoop]) -> list[StepLoop]:
        """Loops with a backward but no update that a stepping loop runs through its calls (torchtitan's chunked
        cross-entropy: a backward per chunk in the loss's ``__call__``, the trainer's loop steps): part of that
        step, recorded as its micro-step loops (no barrier of their own: one per chunk cost a graph each)."""
        found = []
        for step in trains:
            if any(e.kind == STEP for e in step.events):
                continue
            if self._run_by_another_modules_step(step.loop):
                found.append(step)
                continue
            owner = next((t for t in trains if t is not step and any(e.kind == STEP for e in t.events)
                          and any(e.path and e.inner_loop is step.loop for e in t.events)), None)
            if owner is not None:
                self.micro_of[step.loop] = owner
                found.append(step)
        return found

    def _run_by_another_modules_step(self, loop: Loop) -> bool:
        """The loop's function is one a loop of another project module runs every step (the project index)."""
        function = self._c.loop_function[loop]
        if self.ctx.project is None or function is None or self._c.function_parent.get(function) is not None:
            return False
        owner = self._c.function_class.get(function)
        return bool(self.ctx.project.per_step(f"{owner}.{function.name.value}" if owner else function.name.value))

    def _feeds_backward(self, loop: Loop) -> bool:
        """A backward pass follows the loop in its function (in the function's own code or in one it calls):
        the loop is the forward part of a training step (an RNN's time steps, an encoder over tokens), not
        an evaluation loop. A validation loop after the update, or in a function with no backward, is one."""
        function = self._c.loop_function[loop]
        if function not in self._backward_sites:
            sites = [e.site for e in self._events_of(function, None, 0) if e.kind == BACKWARD]
            self._backward_sites[function] = sites
        start = self.ctx.position(loop)
        return any(self.ctx.position(site) > start and not self._within(site, loop)
                   for site in self._backward_sites[function])

    def _within(self, node: cst.CSTNode, loop: Loop) -> bool:
        current = self._c.where.get(node, (None, None))[1]
        while current is not None:
            if current is loop:
                return True
            current = self._c.loop_parent.get(current)
        return False

    def _new(self, loop: Loop, kind: str, events: list[Event]) -> StepLoop:
        step = StepLoop(loop, kind, self._c.loop_function[loop], self._batches(loop, events), events)
        self.loops[loop] = step
        return step

    def _batches(self, loop: Loop, events: list[Event]) -> Batches:
        if isinstance(loop, cst.For) and not isinstance(loop.iter, cst.BaseComp):
            iterated = self.loop_iterable(loop)
            if self.is_device_loader(iterated):
                return Batches("device_loader", iterated)
            if self.is_data_loader(iterated):
                return Batches("loader", iterated)
        for raw in self._c.raw.get(self._c.loop_function[loop], ()):
            if raw.loop is loop and raw.kind == CALL and isinstance(raw.node, cst.Call):
                parent = self.ctx.parent(raw.node)
                if isinstance(parent, cst.Assign):
                    if self.ctx.is_call_to(raw.node, "builtins.next"):
                        return Batches("iterator", raw.node)
                    name = (patterns.dotted_name(raw.node.func) or "").rsplit(".", 1)[-1]
                    if self.callee(raw.node) is not None or "batch" in name.lower():
                        return Batches("function", raw.node)
        if isinstance(loop, cst.For):
            return Batches("iterable", loop.iter)
        return Batches("none")

    def _finish(self, step: StepLoop) -> None:
        step.iterates_device_loader = step.batches.how == "device_loader"
        step.has_barrier = any(e.kind == BARRIER and (not e.nested or e.inner_loop in step.micro_loops)
                               for e in step.events)
        if step.batches.how == "loader":
            step.loader = step.batches.node  # type: ignore[assignment]
        step.barrier_site = self._barrier_site(step)
        if step.kind == "train" and step.accumulation is None and step.barrier_site is not None and \
                step.barrier_site.block is not step.loop.body:
            step.accumulation = "guard"

    # Where the step ends ---------------------------------------------------------------------------------------
    def _chain(self, node: cst.CSTNode, loop: Loop) -> list[tuple[cst.CSTNode, cst.CSTNode]]:
        """(block, statement) pairs from the loop's body down to ``node``, outermost first: each block (an
        indented block or a one-line suite) and its child that holds ``node``. Empty outside the body."""
        pairs: list[tuple[cst.CSTNode, cst.CSTNode]] = []
        current: cst.CSTNode | None = node
        while current is not None and current is not loop.body:
            parent = self.ctx.parent(current)
            if isinstance(parent, (cst.IndentedBlock, cst.SimpleStatementSuite)):
                pairs.append((parent, current))
            current = parent
        if current is None:
            return []
        pairs.reverse()
        return pairs

    def _barrier_site(self, step: StepLoop) -> BarrierSite | None:
        """After the update: the last statement, in the block that holds every optimizer step, that holds
        a step or a later update (``scaler.update()``, ``zero_grad()``, a scheduler). The block is the loop's
        body, or the ``if`` of an accumulation (``if (i + 1) % k == 0:``), so the barrier runs once per
        optimizer step. Without a step in sight (or in an evaluation loop): the end of the body."""
        body = step.loop.body
        if isinstance(body, cst.SimpleStatementSuite):
            return BarrierSite(body, body, bool(step.steps))
        if not isinstance(body, cst.IndentedBlock) or not body.body:
            return None
        chains = [c for c in (self._chain(e.site, step.loop) for e in step.steps) if c]
        if step.kind == "eval" or not chains:
            return BarrierSite(body.body[-1], body, False)
        depth = 0
        while all(len(c) > depth + 1 and c[depth + 1][0] is chains[0][depth + 1][0] for c in chains):
            depth += 1
        while depth > 0 and not self._accumulation_guard(chains[0][depth][0]):
            depth -= 1
        block = chains[0][depth][0]
        if isinstance(block, cst.SimpleStatementSuite):
            return BarrierSite(block, block, True)
        statements = list(block.body)  # type: ignore[attr-defined]
        last = max(statements.index(c[depth][1]) for c in chains)
        # Later updates join the step unless a host read comes first (``scheduler.step(loss.item())``).
        reads = [self._index_in(e.site, block, depth, step, statements) for e in step.of_kind(READ, nested=False)]
        stop = min([i for i in reads if i is not None and i > last], default=len(statements))
        for event in step.updates:
            index = self._index_in(event.site, block, depth, step, statements)
            if index is not None and last < index < stop:
                last = index
        return BarrierSite(statements[last], block, True)

    def _index_in(self, node: cst.CSTNode, block: cst.CSTNode, depth: int, step: StepLoop,
                  statements: list[cst.CSTNode]) -> int | None:
        chain = self._chain(node, step.loop)
        if len(chain) > depth and chain[depth][0] is block:
            return statements.index(chain[depth][1])
        return None

    def _accumulation_guard(self, block: cst.CSTNode) -> bool:
        """The block is the body of an ``if`` that accumulates: ``if (i + 1) % k == 0:``, ``if step % accum:``."""
        owner = self.ctx.parent(block)
        if not isinstance(owner, cst.If) or owner.body is not block:
            return False
        return bool(patterns.find_all(owner.test, lambda n: isinstance(n, cst.Modulo) or (
            isinstance(n, cst.Name) and bool(_ACCUMULATION_NAME.search(n.value)))))

    # Queries ---------------------------------------------------------------------------------------------------
    def loop(self, node: cst.CSTNode) -> StepLoop | None:
        return self.loops.get(node)  # type: ignore[arg-type]

    @cached_property
    def training_loops(self) -> list[Loop]:
        return [s.loop for s in self.loops.values() if s.kind == "train"]

    def region(self, node: cst.CSTNode) -> Region | None:
        """Where ``node`` runs once per step: in a step loop's body, in a loop below a training loop (its
        micro-steps, a loop over the parameters), or in a function a step loop calls (the first call path
        found; functions with step loops of their own are not per-step helpers). Only nodes the walk marks
        (calls, expression statements, ifs, whiles, assignments, returns, subscripts)."""
        where = self._c.where.get(node)
        if where is None:
            return None
        function, loop = where
        current, innermost = loop, True
        while current is not None:
            step = self.loops.get(current) or self.micro_of.get(current)
            if step is not None and (innermost or step.kind == "train"):
                return self._region_in(step, function)
            innermost = False
            current = self._c.loop_parent.get(current)
        if function is not None and function in self.step_functions:
            step, path = self.step_functions[function]
            return Region(step, path, function)
        return None

    def foreign_step(self, node: cst.CSTNode) -> str | None:
        """`` in Decoder.forward (run every step by the loop at train.py:12: model(...))`` when ``node`` lies
        in a function that a loop of another module runs every step (the project index: the forward of a
        model class imported there, and the functions it calls); else None. Only for nodes no loop of this
        module reaches (``region`` is None)."""
        project = self.ctx.project
        function = self.function_of(node)
        if project is None or function is None or self._c.function_parent.get(function) is not None:
            return None
        owner = self._c.function_class.get(function)
        qualified = f"{owner}.{function.name.value}" if owner else function.name.value
        how = project.per_step(qualified)
        return f" in {qualified} (run every step by {how})" if how else None

    def engine_step(self, call: cst.Call) -> cst.FunctionDef | None:
        """The process function an ignite ``Engine(train_step)`` runs once per iteration, when it is a
        function of this module that runs a whole training step (a backward and an optimizer update, not in
        a loop of its own) and marks no step: the engine's loop is ignite's, so no loop here gets the barrier
        (issue 30: one graph grew over 50 iterations). Else None."""
        if not self.ctx.qualnames(call.func) & set(ENGINES):
            return None
        args = patterns.positional(call)
        if not args or not isinstance(args[0].value, cst.Name):
            return None
        target = self._resolve(args[0].value, self.function_of(call))
        if target is None or not isinstance(target.body, cst.IndentedBlock):
            return None
        events = self.effects(target)
        kinds = {e.kind for e in events if not e.nested}
        if BACKWARD in kinds and STEP in kinds and not any(e.kind == BARRIER for e in events):
            return target
        return None

    # Rollout loops (issue 30) ------------------------------------------------------------------------------------
    @cached_property
    def rollouts(self) -> dict[Loop, tuple[StepLoop, StepLoop, Loop]]:
        """Loops that run the trained model every iteration beside the training loop, in a loop enclosing
        both (cleanrl's ppo/pqn: ``for iteration ...: for step in range(num_steps): ... envs.step(action.cpu(
        ).numpy())``, then ``for epoch ...: ... optimizer.step()``). No step loop: the backward that follows
        makes it no evaluation loop, and no rule marks a step there; only XLA311 asks, for the reads that run
        every rollout step. Loop -> (a record of kind "rollout", not among ``loops``; the training loop
        beside it; the enclosing loop)."""
        found: dict[Loop, tuple[StepLoop, StepLoop, Loop]] = {}
        trains = [s for s in self.loops.values() if s.kind == "train"]
        for loop in self._c.loops:
            function = self._c.loop_function[loop]
            parent = self._c.loop_parent.get(loop)
            if parent is None or self.outside_steps(function) or self._under_a_step(loop):
                continue
            if isinstance(loop, cst.For) and self.is_data_loader(self.loop_iterable(loop)):
                continue  # a validation pass over a loader before the update: batches, not environment steps
            inside = self._loops_within(loop)
            beside = [s for s in trains if s.function is function and s.loop in self._loops_within(parent)
                      and s.loop not in inside]
            if not beside:
                continue
            events = self._events_of(function, loop, 0)
            if any(e.kind in (BACKWARD, STEP) for e in events):
                continue
            trained = self._trained_models(function)
            if any(e.kind == FORWARD for e in events) or self._calls_a_model(inside, function, trained):
                record = StepLoop(loop, "rollout", function, Batches("iterable", getattr(loop, "iter", None)), events)
                found[loop] = (record, beside[0], parent)
        return found

    def _under_a_step(self, loop: Loop) -> bool:
        current: Loop | None = loop
        while current is not None:
            if current in self.loops or current in self.micro_of:
                return True
            current = self._c.loop_parent.get(current)
        return False

    def _trained_models(self, function: Function) -> set[str]:
        """What the optimizers of ``function`` (or of the module's code) train: ``agent`` for
        ``optim.Adam(agent.parameters(), ...)``."""
        cache = self.__dict__.setdefault("_trained_cache", {})
        if function in cache:
            return cache[function]
        models: set[str] = set()
        cache[function] = models
        for node, (owner, _) in self._c.where.items():
            if owner is not function and owner is not None or not isinstance(node, cst.Call):
                continue
            method = patterns.method_call(node, "parameters", "named_parameters")
            name = patterns.dotted_name(method.value) if method is not None else None
            if name is not None:
                models.add(name)
        return models

    def _calls_a_model(self, loops: set[Loop], function: Function, models: set[str]) -> bool:
        """A call in ``loops`` runs one of ``models``: ``actor(obs)``, ``agent.get_action_and_value(obs)``."""
        for node, (owner, loop) in self._c.where.items():
            if owner is not function or loop not in loops or not isinstance(node, cst.Call):
                continue
            name = patterns.dotted_name(node.func)
            if name is None:
                continue
            if name in models or (name.rsplit(".", 1)[0] in models
                                  and name.rsplit(".", 1)[1] not in _NOT_A_FORWARD):
                return True
        return False

    def rollout_region(self, node: cst.CSTNode) -> Region | None:
        """The rollout loop (``rollouts``) whose own code runs ``node`` every iteration, as a region of its
        record; None where a step loop holds it (``region`` answers) or no rollout loop does."""
        where = self._c.where.get(node)
        if where is None:
            return None
        function, current = where
        while current is not None:
            if current in self.loops or current in self.micro_of:
                return None
            if current in self.rollouts:
                return Region(self.rollouts[current][0], (), function)
            current = self._c.loop_parent.get(current)
        return None

    def _region_in(self, step: StepLoop, function: Function) -> Region:
        if function is step.function or function not in self.step_functions:
            return Region(step, (), function)
        _, path = self.step_functions[function]  # type: ignore[index]
        return Region(step, path, function)

    @cached_property
    def host_reads(self) -> _HostReadPlan:
        """The reads XLA313 (running sums, per-step helpers) and XLA314 (finite checks) move."""
        return _HostReadPlan(self)

    @cached_property
    def repeated_reads(self) -> list[RepeatedRead]:
        """Device values read several times outside the steps (epoch_reads.py): XLA302 marks the step once
        before the first read."""
        return repeated_reads(self) if not self.ctx.facts.uses_accelerate else []

    def class_of(self, function: cst.FunctionDef) -> str | None:
        """The name of the class a function is a method of, else None."""
        return self._c.function_class.get(function)

    def moves_read(self, node: cst.CSTNode) -> bool:
        """A read that a rule of this run moves off the step (XLA313, XLA314)."""
        return node in self.host_reads.moved

    def training_region(self, node: cst.CSTNode) -> Region | None:
        region = self.region(node)
        return region if region is not None and region.step.kind == "train" else None

    def gets_device_loader(self, step: StepLoop) -> bool:
        """XLA301 wraps the loop's DataLoader: a training or evaluation loop over a DataLoader, not one that
        accumulates by a guard (the device loader would mark every micro-step), not in an Accelerate script,
        not where the device may be the CPU at run time (a device option: a device loader fails on the CPU,
        and the step barrier XLA302 puts instead works on both), not where the batch has an element the program
        keeps on the host (the device loader would move it too: ``host_batch_elements``)."""
        return (self.device_loader_fits(step) and not self.host_batch_elements(step)
                and not self.runs_before_the_device(step))

    def runs_before_the_device(self, step: StepLoop) -> bool:
        """The loop runs on the CPU because the program has no device yet: it moves nothing to a device
        (host_batch.moves_to_a_device), no device is bound in its function, and the module binds its device
        only further down (a notebook that trains its first model on the CPU, then defines ``device``). A
        device loader would hand XLA batches to that CPU model. A module that binds no device at all is not
        such a program (its model may be moved elsewhere): its loops keep the device loader."""
        loop = step.loop
        if not isinstance(loop, cst.For) or host_batch.moves_to_a_device(loop, self._is_device_value):
            return False
        scopes = self.ctx.visible_scopes(loop)
        if any(self.ctx.facts.device_names.get(scope) for scope in scopes[:-1]):
            return False
        module_scope = scopes[-1] if scopes else None
        if module_scope is None or not self.ctx.facts.device_names.get(module_scope):
            return False
        start = self.ctx.position(loop)
        bindings = [b for b in self.ctx.facts.device_bindings if self.ctx.scopes.get(b) is module_scope]
        return bool(bindings) and all(self.ctx.position(b) > start for b in bindings)

    def _is_device_value(self, node: cst.BaseExpression) -> bool:
        name = patterns.dotted_name(node)
        if name is None:
            return False
        if name.rsplit(".", 1)[-1] in ("device", "dev", "xla_device") or name.endswith("_device"):
            return True
        return any(name in self.ctx.facts.device_names.get(scope, ()) for scope in self.ctx.visible_scopes(node))

    def device_loader_fits(self, step: StepLoop) -> bool:
        """``gets_device_loader`` but for the batch elements kept on the host."""
        return (step.loader is not None and not self.ctx.facts.uses_accelerate and not self.ctx.facts.fabric_loaders
                and step.accumulation != "guard"
                and not step.has_barrier and not self.ctx.device_flow.may_be_cpu_at(step.loader))

    def host_batch_elements(self, step: StepLoop) -> list[str]:
        """Elements of the loop's batch that the program keeps on the host (host_batch.py): a device loader
        would move them too."""
        loop = step.loop
        if not isinstance(loop, cst.For) or step.loader is None:
            return []
        enumerated = isinstance(loop.iter, cst.Call) and "builtins.enumerate" in self.ctx.qualnames(loop.iter.func)
        return host_batch.host_kept(loop, host_batch.batch_names(loop, enumerated), self.ctx.parent,
                                    self.ctx.qualnames)

    def iterates_device_loader(self, step: StepLoop) -> bool:
        """After migration the loop iterates a device loader: it already does, or XLA301 runs and wraps it."""
        return step.iterates_device_loader or (self.ctx.runs("XLA301") and self.gets_device_loader(step))

    def end_of_step(self, step: StepLoop) -> BarrierSite | None:
        """Where the step's barrier goes: ``step.barrier_site``, refined once the host-read plan is known
        (step_end.py: past the device work that follows the update; an evaluation batch's before its first
        read). While the plan itself is being made it answers the unrefined site."""
        if self._final_sites is None:
            if self._finalizing:
                return step.barrier_site
            self._finalizing = True
            try:
                self._final_sites = final_sites(self)
            finally:
                self._finalizing = False
        return self._final_sites.get(step.loop, step.barrier_site)

    def collective_barriers(self, step: StepLoop) -> list[BarrierSite]:
        """Where XLA302 adds barriers after the collectives that follow the step's barrier (step_end.py)."""
        if not self.needs_barrier(step):
            return []
        if step.loop not in self._collective_sites:
            self._collective_sites[step.loop] = collective_sites(self, step)
        return self._collective_sites[step.loop]

    def barrier_follows(self, statement: cst.CSTNode) -> bool:
        """Every replica runs ``statement``'s device work at a step barrier that follows it in its block before
        anything reads a value to the host: XLA302's (the step's or one after a collective) or a device
        loader's, at the next batch (``statement`` in the loop's body)."""
        sites: list[tuple[StepLoop, BarrierSite]] = []
        for step in self.loops.values():
            if self.needs_barrier(step) and self.ctx.runs("XLA302"):
                site = self.end_of_step(step)
                sites += [(step, s) for s in ([site] if site is not None else []) + self.collective_barriers(step)]
            elif self.iterates_device_loader(step) and isinstance(step.loop.body, cst.IndentedBlock):
                sites.append((step, BarrierSite(step.loop.body.body[-1], step.loop.body, False)))
        return barrier_follows(self, statement, sites)

    def needs_barrier(self, step: StepLoop) -> bool:
        if (self.ctx.facts.uses_accelerate or step.has_barrier or step.barrier_site is None
                or self.fabric_owned(step)):
            return False
        if not self.iterates_device_loader(step):
            return True
        site = self.end_of_step(step)
        return site is not None and site.before_read

    def fabric_owned(self, step: StepLoop) -> bool:
        """Lightning Fabric runs this step's updates: its backward is ``fabric.backward(loss)``
        (library_training.py); Fabric's strategy reduces and steps."""
        return any(e.kind == BACKWARD and fabric_backward(self.ctx, e.node) for e in step.events)

    def fabric_update(self, node: cst.CSTNode) -> bool:
        """``node`` is an update of a step Lightning Fabric owns (``optimizer.step()`` after
        ``fabric.backward(loss)``): XLA204 leaves it as it is."""
        # The updates of every such step, found once (asked for every call of the module, a walk of every
        # loop's events each time grew with the square of the module; issue 38); again if loops were added.
        if self._fabric_updates is None or self._fabric_updates[0] != len(self.loops):
            updates = {id(e.node): e.node for step in self.loops.values() if step.kind == "train"
                       and self.fabric_owned(step) for e in step.events if e.kind == STEP}
            self._fabric_updates = (len(self.loops), updates)
        return self._fabric_updates[1].get(id(node)) is node

    def after_step_end(self, node: cst.CSTNode, region: Region) -> bool:
        """``node`` runs after the step's graph ran: after a barrier in the same block of the loop body, or
        after the update where XLA302 puts the barrier (in a loop that gets no device loader). Its reads cost
        no extra graph run. In a device-loader loop the step ends at the next batch: nothing is after it."""
        if region.in_callee:
            return False
        step = region.step
        loop = step.loop
        for event in step.of_kind(BARRIER, nested=False):
            if not event.path and self._follows(node, event.node, loop):
                return True
        if not self.needs_barrier(step):
            return False
        site = self.end_of_step(step)
        if site is None or not (site.after_update or site.before_read) or isinstance(site.block,
                                                                                   cst.SimpleStatementSuite):
            return False
        return self._follows(node, site.statement, loop)

    def _follows(self, node: cst.CSTNode, statement: cst.CSTNode, loop: Loop) -> bool:
        """``node`` lies in a statement after ``statement``'s own statement, in the same block."""
        anchor_chain = self._chain(statement, loop)
        node_chain = self._chain(node, loop)
        if not anchor_chain:
            return False
        block, anchor = anchor_chain[-1]
        for node_block, node_statement in node_chain:
            if node_block is block:
                statements = list(block.body)  # type: ignore[attr-defined]
                return statements.index(node_statement) > statements.index(anchor)
        return False

    # Tensors and host reads --------------------------------------------------------------------------------------
    def tensor_names(self, region: Region) -> set[str]:
        """Names that hold tensors where the region's code runs: what ``backward()`` is called on, what a
        model, criterion or loss call returns, and what is computed from those (to a fixed point). Values
        read with ``.item()`` are not."""
        names = set(self.base_tensor_names(region))
        if not region.in_callee:
            names |= {n for (loop, n) in self.host_reads.device_values if loop is region.step.loop}
        return names

    def base_tensor_names(self, region: Region) -> set[str]:
        """``tensor_names`` without the values XLA313 keeps on the device (what the source itself says)."""
        key: object = region.function if region.in_callee else region.step.loop
        if key in self._tensor_names:
            return self._tensor_names[key]
        names: set[str] = set()
        if region.in_callee:
            function = region.function
            assignments = [(n, v) for n, v, _ in self._c.assignments.get(function, ())]
            backwards = [r.node for r in self._c.raw.get(function, ()) if r.kind == BACKWARD]
        else:
            loop = region.step.loop
            function = self._c.loop_function[loop]
            within = self._loops_within(loop)
            assignments = [(n, v) for n, v, owner in self._c.assignments.get(function, ()) if owner in within]
            backwards = [r.node for r in self._c.raw.get(function, ()) if r.kind == BACKWARD and r.loop in within]
        for call in backwards:
            receiver = _receiver(call)  # type: ignore[arg-type]
            if receiver is not None and receiver.rsplit(".", 1)[-1].lower().endswith(("accelerator", "fabric")):
                # accelerator.backward(loss), Lightning's fabric.backward(loss): the tensor is the argument, the
                # receiver holds host values (fabric.global_rank is an int, issue 30)
                receiver = patterns.dotted_name(call.args[0].value) if call.args else None  # type: ignore[attr-defined]
            if receiver is not None:
                names.add(receiver)
        changed = True
        while changed:
            changed = False
            for targets, value in assignments:
                missing = [t for t in targets if t not in names]
                if missing and self._produces_tensor(value, names):
                    names.update(missing)
                    changed = True
        self._tensor_names[key] = names
        return names

    def _loops_within(self, loop: Loop) -> set[Loop]:
        within = {loop}
        for other in self._c.loops:
            current = self._c.loop_parent.get(other)
            while current is not None:
                if current is loop:
                    within.add(other)
                    break
                current = self._c.loop_parent.get(current)
        return within

    def _produces_tensor(self, value: cst.BaseExpression, names: set[str]) -> bool:
        if reads(self.ctx, value, set()) or is_read_call(self.ctx, value, names):
            return False  # `loss_value = loss.item()` holds a float
        if isinstance(value, cst.Call):
            callee = (patterns.dotted_name(value.func) or "").rsplit(".", 1)[-1].lower()
            if any(word in callee for word in _TENSOR_CALLEES):
                return True
        # ``(model(x) - y).pow(2).mean()``: computed from a model's output (or a submodule's: a decode loop).
        if patterns.find_all(value, lambda n: isinstance(n, cst.Call) and (
                is_model_call(n, self.ctx) or n in self._submodule_forwards)):
            return True
        return bool(mentions(value, names))

    # Loaders --------------------------------------------------------------------------------------------------
    def loop_iterable(self, loop: cst.For) -> cst.BaseExpression:
        node = loop.iter
        while isinstance(node, cst.Call) and self.ctx.qualnames(node.func) & set(PASS_THROUGH):
            args = patterns.positional(node)
            if not args:
                break
            node = args[0].value
        return node

    def is_device_loader(self, node: cst.BaseExpression) -> bool:
        """Already delivers batches on the XLA device: ``pl.MpDeviceLoader(...)``, ``.per_device_loader(...)``,
        or a name bound to one."""
        if isinstance(node, cst.Call):
            return bool(self.ctx.qualnames(node.func) & set(DEVICE_LOADERS)) or bool(
                patterns.method_call(node, "per_device_loader"))
        name = patterns.dotted_name(node)
        return name is not None and name in self.ctx.facts.device_loaders

    def is_data_loader(self, node: cst.BaseExpression) -> bool:
        """A DataLoader: one the script builds, a name bound to one, or a name that says it is one (loaders
        are often parameters: ``def train(model, device, train_loader)``)."""
        if isinstance(node, cst.Call):
            return bool(self.ctx.qualnames(node.func) & set(DATALOADERS))
        name = patterns.dotted_name(node)
        if name is None or name in self.ctx.facts.device_loaders:
            return False
        return name in self.ctx.facts.loaders or bool(_LOADER_NAME.search(name.rsplit(".", 1)[-1]))
