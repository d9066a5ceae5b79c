"""Call paths: which function of the module a call runs (``f(x)``, ``self.method(x)``, an object of a local
class and its ``__call__``, ``self.attr.method(x)``), what one call does (its events, followed
``MAX_DEPTH`` calls deep), and what a call into another module of the project does (from the project
index). A part of ``StepModel`` (a base class of it), kept apart because it is the one place that follows
calls."""

from __future__ import annotations

import libcst as cst

from ...syntax import patterns
from .kinds import BACKWARD, CALL, FORWARD, READ, STEP, Event, Function, Loop, Region


# How many functions handed in as arguments are followed one inside another (``f(g)`` where ``g`` calls its
# own parameter ...): real scripts need at most 7; files concatenated from hundreds of scripts chained over 200
# and ran out of Python's stack (issue 38).
MAX_PASSING_DEPTH = 40


class CallPaths:
    """``StepModel``'s call resolution (see the module docstring)."""

    MAX_DEPTH = 6  # calls followed from a loop body

    # Callees -----------------------------------------------------------------------------------------------
    def callee(self, call: cst.Call) -> cst.FunctionDef | None:
        """The function of this module a call runs: ``f(x)``, ``self.method(x)``, ``obj(x)`` (a local class's
        ``__call__``), ``obj.method(x)``, ``self.attr(x)`` / ``self.attr.method(x)``."""
        if call in self._callees:
            return self._callees[call]
        function = self._c.where.get(call, (None, None))[0]
        found = self._resolve(call.func, function)
        self._callees[call] = found
        return found

    def _resolve(self, func: cst.BaseExpression, function: Function) -> cst.FunctionDef | None:
        c = self._c
        if isinstance(func, cst.Name):
            scope: Function = function
            while True:
                key = (scope, func.value)
                if scope is not None and _parameter(scope, func.value) is not None and key not in self._resolving:
                    # A function handed in as an argument: the one every call site passes, if they agree. A
                    # parameter already being resolved (a recursive call passing it on) adds nothing.
                    self._resolving.add(key)
                    try:
                        passed = {self._resolve(arg, caller)
                                  for arg, caller in self.passed_arguments(scope, func.value)
                                  if (caller, patterns.code_of(arg)) not in self._resolving}
                    finally:
                        self._resolving.discard(key)
                    if len(passed) == 1 and None not in passed:
                        return passed.pop()
                if (scope, func.value) in c.defs:
                    return c.defs[(scope, func.value)]
                if (scope, func.value) in c.instances:
                    return self._method(c.instances[(scope, func.value)], "__call__")
                if scope is None:
                    held = self._instance_anywhere(func.value)
                    return self._method(held, "__call__") if held else None
                scope = c.function_parent.get(scope)
        if not isinstance(func, cst.Attribute):
            return None
        base, attr = func.value, func.attr.value
        own_class = c.function_class.get(function) if function is not None else None
        if isinstance(base, cst.Name) and base.value == "self" and own_class is not None:
            method = self._method(own_class, attr)
            if method is not None:
                return method
            held = c.self_instances.get((own_class, attr))
            return self._method(held, "__call__") if held else None
        if (isinstance(base, cst.Attribute) and isinstance(base.value, cst.Name) and base.value.value == "self"
                and own_class is not None):
            held = c.self_instances.get((own_class, base.attr.value))
            return self._method(held, attr) if held else None
        if isinstance(base, cst.Name):
            scope = function
            while True:
                if (scope, base.value) in c.instances:
                    return self._method(c.instances[(scope, base.value)], attr)
                if scope is None:
                    held = self._instance_anywhere(base.value)
                    return self._method(held, attr) if held else None
                scope = c.function_parent.get(scope)
        return None

    def external_effects(self, call: cst.Call) -> tuple[str, ...]:
        """What a call into another module of the project does to the gradients (BACKWARD, STEP), from the
        project index: an imported helper (``train_step(...)``, ``utils.train_step(...)``), or an object of
        a project class made elsewhere and passed in under the same name (``loss_scaler(loss)``,
        ``stepper.update(loss)``). Empty without a project."""
        project = self.ctx.project
        if project is None:
            return ()
        kinds: tuple[str, ...] = ()
        for name in sorted(self.ctx.qualnames(call.func)):
            kinds = project.helper_effects(name) or project.helper_effects(name + ".__call__")
            if kinds:
                break
        if not kinds:
            func = call.func
            if isinstance(func, cst.Name):
                kinds = project.instance_effects(func.value)
            elif isinstance(func, cst.Attribute) and isinstance(func.value, (cst.Name, cst.Attribute)):
                holder = patterns.dotted_name(func.value)
                if holder is not None:
                    kinds = project.instance_effects(holder.rsplit(".", 1)[-1], func.attr.value)
        from ..project import BACKWARD as HELPER_BACKWARD

        return tuple(BACKWARD if kind == HELPER_BACKWARD else STEP for kind in kinds)

    def forward_of(self, call: cst.Call) -> cst.FunctionDef | None:
        """The ``forward`` a model call runs, when the model is an object of a torch module class of this
        module (``model = Net().to(device)`` ... ``model(x)``, ``self.decoder(x)``); else what ``callee``
        finds."""
        found = self.callee(call)
        if found is not None:
            return found
        function = self._c.where.get(call, (None, None))[0]
        held = self._held_class(call.func, function)
        if held is None or held not in self._module_classes:
            return None
        return self._method(held, "forward")

    def _held_class(self, func: cst.BaseExpression, function: Function) -> str | None:
        c = self._c
        if isinstance(func, cst.Name):
            scope: Function = function
            while True:
                if (scope, func.value) in c.instances:
                    return c.instances[(scope, func.value)]
                if scope is None:
                    return self._instance_anywhere(func.value)
                scope = c.function_parent.get(scope)
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self":
            own_class = c.function_class.get(function) if function is not None else None
            return c.self_instances.get((own_class, func.attr.value)) if own_class else None
        return None

    def external_read(self, call: cst.Call) -> tuple[str, int, str] | None:
        """Where a call into another module of the project reads a tensor's value to the host (the project
        index: an imported helper that returns ``loss.item()``, a clipping helper reading every parameter's
        norm): (file, line, code), or None. None without a project."""
        project = self.ctx.project
        if project is None or self.callee(call) is not None:
            return None
        func, function = call.func, self.function_of(call)
        candidates = [func]
        if isinstance(func, cst.Name) and function is not None and _parameter(function, func.value) is not None:
            # A helper handed in as an argument (``train_step(..., accuracy_fn=accuracy_fn)``, issue 30).
            candidates = [arg for arg, _ in self.passed_arguments(function, func.value)]
        for candidate in candidates:
            for name in sorted(self.ctx.qualnames(candidate)):
                found = project.helper_reads(name) or project.helper_reads(name + ".__call__")
                if found:
                    return found
        held = self._held_project_class(call)
        return project.method_reads(*held) if held is not None else None

    def passed_arguments(self, function: cst.FunctionDef, parameter: str) -> list[tuple[cst.BaseExpression, Function]]:
        """What the module's calls of ``function`` pass for its ``parameter``: (argument expression, the caller's
        function), by keyword or position (a method's ``self`` skipped), at every call site the model resolves."""
        key = (function, parameter)
        if key in self._passed:
            return self._passed[key]
        found: list[tuple[cst.BaseExpression, Function]] = []
        if self._passing_depth >= MAX_PASSING_DEPTH:
            return found  # not kept: asked again nearer the top, the question is followed
        self._passed[key] = []  # a call site inside the function itself, or a cycle, adds nothing
        position = _parameter(function, parameter)
        self._passing_depth += 1
        try:
            calls = [call for call in self._calls_that_may_run(function) if self.callee(call) is function]
        finally:
            self._passing_depth -= 1
        for call in calls:
            shift = 1 if isinstance(call.func, cst.Attribute) and self._c.function_class.get(function) else 0
            for index, arg in enumerate(call.args):
                if arg.star:
                    break
                if (arg.keyword is not None and arg.keyword.value == parameter) or (
                        arg.keyword is None and position is not None and index + shift == position):
                    found.append((arg.value, self.function_of(call)))
        self._passed[key] = found
        return found

    def _calls_that_may_run(self, function: cst.FunctionDef) -> list[cst.Call]:
        """The module's calls (CALL and FORWARD events, in the model's order) whose callee may be ``function``;
        the others cannot be, whatever is asked first. ``_resolve`` finds a function by its name (a ``def``,
        a method, ``obj.name``) or, for a call of a parameter, by what the call sites pass, and what is passed
        is found the same way: so a call runs ``function`` only if it names it (``name(...)``,
        ``x.name(...)``), or calls a parameter and ``function``'s name is passed as an argument somewhere
        (``mp.spawn(name, ...)``), or ``function`` is a ``__call__`` (an object's call). An index built once:
        scanning every call of the module for every parameter called grew with the square of the module
        (issue 38)."""
        if self._call_index is None:
            calls: list[cst.Call] = []
            by_name: dict[str, list[int]] = {}
            parameter_calls: list[int] = []
            passed: set[str] = set()
            for raws in self._c.raw.values():
                for raw in raws:
                    call = raw.node
                    if raw.kind not in (CALL, FORWARD) or not isinstance(call, cst.Call):
                        continue
                    at = len(calls)
                    calls.append(call)
                    func = call.func
                    if isinstance(func, cst.Name):
                        by_name.setdefault(func.value, []).append(at)
                        if self._calls_a_parameter(call, func.value):
                            parameter_calls.append(at)
                    elif isinstance(func, cst.Attribute):
                        by_name.setdefault(func.attr.value, []).append(at)
                    for arg in call.args:
                        value = arg.value
                        if isinstance(value, cst.Name):
                            passed.add(value.value)
                        elif isinstance(value, cst.Attribute):
                            passed.add(value.attr.value)
            self._call_index = (calls, by_name, parameter_calls, passed)
        calls, by_name, parameter_calls, passed = self._call_index
        name = function.name.value
        if name == "__call__":
            return calls
        positions = by_name.get(name, [])
        if name in passed and parameter_calls:
            positions = sorted({*positions, *parameter_calls})
        return [calls[at] for at in positions]

    def _calls_a_parameter(self, call: cst.Call, name: str) -> bool:
        """Whether ``_resolve`` may take ``name(...)`` for a call of a parameter (of the function holding it, or
        of one enclosing that)."""
        scope: Function = self.function_of(call)
        while scope is not None:
            if _parameter(scope, name) is not None:
                return True
            scope = self._c.function_parent.get(scope)
        return False

    def _held_project_class(self, call: cst.Call) -> tuple[str, str] | None:
        """(class as this module spells it, method) for ``self.attr.method(...)`` where ``__init__`` bound
        ``self.attr`` to an object of a class this module imports (``self.mp_trainer.optimize(opt)``)."""
        func = call.func
        if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Attribute)
                and isinstance(func.value.value, cst.Name) and func.value.value.value == "self"):
            return None
        function = self.function_of(call)
        own_class = self._c.function_class.get(function) if function is not None else None
        held = self._c.self_instances.get((own_class, func.value.attr.value)) if own_class else None
        return (held, func.attr.value) if held is not None and held not in self._c.methods else None

    def _instance_anywhere(self, name: str) -> str | None:
        """The local class an object of this name is made from anywhere in the module, when only one is: an
        object made in ``main`` and passed on as a parameter of the same name (``loss_scaler``)."""
        if self._instances_by_name is None:
            self._instances_by_name = {}
            for (_, bound), cls in self._c.instances.items():
                if cls in self._c.methods:
                    self._instances_by_name.setdefault(bound, set()).add(cls)
        classes = self._instances_by_name.get(name, set())
        return next(iter(classes)) if len(classes) == 1 else None

    def _method(self, class_name: str, name: str, seen: frozenset[str] = frozenset()) -> cst.FunctionDef | None:
        c = self._c
        if class_name not in c.methods or class_name in seen:
            return None
        if name in c.methods[class_name]:
            return c.methods[class_name][name]
        for base in c.bases.get(class_name, ()):
            found = self._method(base.rsplit(".", 1)[-1], name, seen | {class_name})
            if found is not None:
                return found
        return None

    def sites(self, kind: str) -> list[tuple[Function, cst.CSTNode]]:
        """Every node of this kind in the module (``STEP``, ``BACKWARD``...), in any function, whether a loop
        reaches it or not, with the function holding it."""
        return [(function, raw.node) for function, raws in self._c.raw.items() for raw in raws if raw.kind == kind]

    def function_of(self, node: cst.CSTNode) -> Function:
        """The function whose own code holds ``node`` (None: the module's code)."""
        return self._c.where.get(node, (None, None))[0]

    def effects(self, function: cst.FunctionDef, depth: int = 0) -> list[Event]:
        """What one call of ``function`` does: its events, following its own calls (paths start below it)."""
        if function in self._effects:
            return self._effects[function]
        self._effects[function] = []  # recursion: a function that calls itself adds nothing more
        events = self._events_of(function, None, depth) if depth < self.MAX_DEPTH else []
        self._effects[function] = events
        return events

    def _events_of(self, function: Function, loop: Loop | None, depth: int) -> list[Event]:
        """The events of ``function``'s code below ``loop`` (its whole body when None), callees followed."""
        events: list[Event] = []
        for raw in self._c.raw.get(function, ()):
            inner = self._inner_loop(raw.loop, loop)
            if inner is False:
                continue
            kind = raw.kind
            if kind == FORWARD and self._named_like_a_model(raw.node):  # type: ignore[arg-type]
                kind = CALL  # a helper whose name holds "model": what it runs counts, not its name
            if kind == FORWARD:
                # A model of this module: what its forward reads to the host, the step reads (issue 30).
                target = self.forward_of(raw.node)  # type: ignore[arg-type]
                if target is not None and target is not function:
                    events += [Event(READ, e.node, (raw.node, *e.path), e.inner_loop or inner)  # type: ignore[arg-type]
                               for e in self.effects(target, depth + 1) if e.kind == READ]
            if kind == CALL:
                target = self.callee(raw.node)  # type: ignore[arg-type]
                if target is None:
                    events += [Event(effect, raw.node, (), inner, external=True)
                               for effect in self.external_effects(raw.node)]  # type: ignore[arg-type]
                    continue
                if target is function:
                    continue
                for event in self.effects(target, depth + 1):
                    events.append(Event(event.kind, event.node, (raw.node, *event.path),  # type: ignore[arg-type]
                                        event.inner_loop or inner))
                continue
            events.append(Event(raw.kind, raw.node, (), inner))
        return events

    def _named_like_a_model(self, call: cst.Call) -> bool:
        """A call whose name says model (``self._match_models(a, b)``) but that runs a plain function or
        method of this module, not a torch module's forward or an object's ``__call__``: a helper, whose
        own code says whether a model runs (issue 30: a host-side table filled by ``_align_models``)."""
        target = self.callee(call)
        if target is None or target.name.value in ("forward", "__call__"):
            return False
        owner = self._c.function_class.get(target)
        return owner is None or owner not in self._module_classes

    def called_region(self, node: cst.CSTNode) -> Region | None:
        """Where a node of a function a step loop calls runs, when the step model has no region for it (the
        function holds no event: ``mel_spectrogram(y)`` whose only read is ``if torch.min(y) < -1.:``): the
        first call path from a step loop's body, followed ``MAX_DEPTH`` calls deep. Only XLA311 asks."""
        function = self.function_of(node)
        if function is None:
            return None
        if self._called_from_steps is None:
            self._called_from_steps = self._calls_from_steps()
        found = self._called_from_steps.get(function)
        return Region(found[0], found[1], function) if found is not None else None

    def _calls_from_steps(self) -> dict[cst.FunctionDef, tuple]:
        c = self._c
        found: dict[cst.FunctionDef, tuple] = {}
        with_loops = {c.loop_function[s.loop] for s in self.loops.values()}  # type: ignore[attr-defined]
        todo: list[tuple] = []
        for step in self.loops.values():  # type: ignore[attr-defined]
            for raw in c.raw.get(c.loop_function[step.loop], ()):
                if raw.kind in (CALL, FORWARD) and self._inner_loop(raw.loop, step.loop) is not False:
                    todo.append((step, (raw.node,)))
        while todo:
            step, path = todo.pop(0)
            call = path[-1]
            target = self.forward_of(call) if isinstance(call, cst.Call) else None
            if target is None or target in found or target in with_loops or len(path) > self.MAX_DEPTH:
                continue
            found[target] = (step, path)
            todo += [(step, (*path, raw.node)) for raw in c.raw.get(target, ()) if raw.kind in (CALL, FORWARD)]
        return found

    def _inner_loop(self, raw_loop: Loop | None, loop: Loop | None) -> Loop | None | bool:
        """For a node whose innermost loop is ``raw_loop``: None when it runs once per iteration of ``loop``
        (once per call when ``loop`` is None), the loop below ``loop`` that repeats it, or False when it
        lies outside ``loop``. A loop over the optimizers (``for optimizer in optimizers: optimizer.step()``)
        repeats nothing of the step: each optimizer's update runs once, so its nodes count as its parent's."""
        while raw_loop is not loop and raw_loop in self._c.optimizer_loops:
            raw_loop = self._c.loop_parent.get(raw_loop)
        if raw_loop is loop:
            return None
        current = raw_loop
        while current is not None:
            parent = self._c.loop_parent.get(current)
            if parent is loop:
                return raw_loop
            current = parent
        return raw_loop if loop is None else False


def _parameter(function: cst.FunctionDef, name: str) -> int | None:
    """The position of ``function``'s parameter ``name`` (-1 for keyword-only), or None when it has none."""
    params = function.params
    for index, param in enumerate([*params.posonly_params, *params.params]):
        if param.name.value == name:
            return index
    return -1 if any(p.name.value == name for p in params.kwonly_params) else None
