"""XLA102 cuda-apis-to-xla: torch.cuda calls with an XLA form are rewritten; CUDA-only settings are removed.

What it does:
    - ``torch.cuda.synchronize()`` -> the target's ``xm.wait_device_ops()`` where it brackets a timing (the
      statement before or after it reads a clock: ``time.time()``, ``time.perf_counter()``, ...); elsewhere
      the statement is removed (XLA runs the step's graph at its barrier; draining the device every step
      only stalls it).
    - CUDA events used for timing (``start = torch.cuda.Event(enable_timing=True)``, ``start.record()``,
      ``end.synchronize()``, ``start.elapsed_time(end)``) become host timers: ``start =
      time.perf_counter()`` after ``xm.wait_device_ops()``, ``end.synchronize()`` -> ``xm.wait_device_ops()``,
      ``start.elapsed_time(end)`` -> ``(end - start) * 1000`` (milliseconds, as before). An event used any
      other way is left (XLA103 reports it).
    - ``torch.cuda.manual_seed(s)`` / ``torch.cuda.manual_seed_all(s)`` -> ``xm.set_rng_state(s)`` (once where
      the two follow each other with the same seed). In the launcher process (a function, or the module,
      that starts the workers with ``mp.spawn`` / ``xmp.spawn`` / ``torch_xla.launch``) the call is removed
      instead: the XLA generator belongs to each worker, and seeding it there would start the runtime
      before the launch ("Runtime is already initialized").
    - ``torch.cuda.get_device_name(...)`` -> ``xm.xla_device_hw(device)`` (``"TPU"``, ``"GPU"``, ``"CPU"``).
    - ``x.pin_memory()`` -> ``x``: pinned host memory needs CUDA (without it the call fails), and the XLA
      transfer does not use it. Left alone, and reported, in a script that defines its own ``pin_memory``
      method (a custom batch type the DataLoader pins).
    - Statements that only configure CUDA are removed: ``torch.cuda.set_device(...)``,
      ``torch.cuda.empty_cache()``, ``torch.cuda.reset_peak_memory_stats()`` (and the other statistic
      resets), ``torch.cuda.init()``, ``torch.cuda.ipc_collect()``, and assignments to
      ``torch.backends.cudnn.*`` (``benchmark``, ``deterministic``, ``enabled``, ``allow_tf32``) and
      ``torch.backends.cuda.*`` (``matmul.allow_tf32``). Comments above a removed statement stay, with the
      next statement; a block left empty gets ``pass``.

    Any spelling works (``import torch as T``, ``from torch import cuda``, ``import torch.backends.cudnn as
    cudnn``). The same calls used as values (``x = torch.cuda.empty_cache()``), and the ``torch.cuda`` APIs
    without an XLA form (XLA103), are left for a human.

Why:
    On XLA these calls either fail (no CUDA device: ``set_device``, ``synchronize``), do nothing useful
    (cuDNN and TF32 switches, the CUDA caching allocator), or have a direct XLA form: waiting for the device
    is ``xm.wait_device_ops()``, and the XLA device has its own random generator, seeded with
    ``xm.set_rng_state(seed)``. The XLA generator is not CUDA's: seeded runs give other random numbers
    than on CUDA, so review where results must match bit for bit.

Example:
    torch.backends.cudnn.benchmark = True
    torch.cuda.set_device(local_rank)
    torch.cuda.manual_seed_all(seed)
    torch.cuda.synchronize()

Use instead:
    xm.set_rng_state(seed)
    xm.wait_device_ops()
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.analysis.facts import MP_SPAWN
from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.common import is_backend_flag

REMOVED_CALLS = {
    "torch.cuda.set_device": "the XLA runtime assigns each process its device",
    "torch.cuda.empty_cache": "XLA manages device memory itself",
    "torch.cuda.reset_peak_memory_stats": "CUDA allocator statistics do not exist on XLA",
    "torch.cuda.reset_max_memory_allocated": "CUDA allocator statistics do not exist on XLA",
    "torch.cuda.reset_max_memory_cached": "CUDA allocator statistics do not exist on XLA",
    "torch.cuda.reset_accumulated_memory_stats": "CUDA allocator statistics do not exist on XLA",
    "torch.cuda.init": "the XLA runtime initialises itself",
    "torch.cuda.ipc_collect": "XLA manages device memory itself",
}
SEEDS = ("torch.cuda.manual_seed", "torch.cuda.manual_seed_all", "torch.cuda.random.manual_seed",
         "torch.cuda.random.manual_seed_all")
SYNCHRONIZE = ("torch.cuda.synchronize",)
EVENTS = ("torch.cuda.Event", "torch.cuda.streams.Event")
CLOCKS = ("time.time", "time.perf_counter", "time.monotonic", "time.process_time", "time.time_ns",
          "time.perf_counter_ns", "time.monotonic_ns", "timeit.default_timer", "datetime.datetime.now")
# What a timing event's uses may be (anything else leaves the event as it is).
_EVENT_METHODS = ("record", "elapsed_time", "synchronize", "wait", "query")
DEVICE_NAME = ("torch.cuda.get_device_name",)
LAUNCHERS = (*MP_SPAWN, "torch_xla.distributed.xla_multiprocessing.spawn", "torch_xla.launch")

class CudaApisToXla(Rule):
    code = "XLA102"
    name = "cuda-apis-to-xla"
    summary = ("torch.cuda.synchronize/manual_seed/get_device_name -> XLA forms; set_device, empty_cache, "
               "cudnn and TF32 flags removed")
    on_xla_code = True  # CUDA remnants in code that already runs on XLA are migrated too
    fix_safety = "review"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._pin_calls: list[cst.Call] = []
        self._defines_pin_memory = False
        self._syncs: list[cst.Call] = []
        self._events: dict[str, cst.Assign] = {}  # spelling bound to a CUDA event -> its binding
        self._event_uses: dict[str, list[cst.Attribute]] = {}  # spelling -> `<spelling>.<attr>` uses
        # Read per attribute visited: one scan of the input here, not one per visit (quadratic on large files).
        self._events_seen = "Event" in ctx.input_code

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.name.value == "pin_memory":
            self._defines_pin_memory = True

    def leave_Module(self, original_node: cst.Module) -> None:
        events = self._timing_events()
        for node in self._syncs:
            self._synchronize(node, events)
        for spelling in events:
            self._event_to_timer(spelling)
        self._pin_memory()

    def _pin_memory(self) -> None:
        if self._defines_pin_memory:
            for node in self._pin_calls:
                self.finding(node, f"{self._short(node)}: left as it is (the script defines a pin_memory method of "
                             "its own), but a tensor's pin_memory() needs CUDA",
                             "drop the call where its receiver is a tensor: the XLA transfer does not use pinned "
                             "memory")
            return
        for node in self._pin_calls:
            self.replace(node, lambda updated: updated.func.value,
                         f"{self._short(node)} -> {self._short(node.func.value)}: pinned memory needs CUDA")

    def _short(self, node: cst.CSTNode) -> str:
        text = " ".join(patterns.code_of(node).split())
        return text if len(text) <= 60 else text[:57] + "..."

    def _statement_of(self, node: cst.CSTNode) -> cst.BaseSmallStatement | None:
        """The small statement that is only this expression (``torch.cuda.empty_cache()`` on its own)."""
        parent = self.ctx.parent(node)
        return parent if isinstance(parent, cst.Expr) and parent.value is node else None

    def _may_free_imports(self, node: cst.CSTNode | None = None) -> None:
        """The CUDA imports the rewrite may leave unused (removed at the end when nothing uses them)."""
        for name in self.ctx.qualnames(node) if node is not None else ():
            module, _, attribute = name.rpartition(".")
            if module.startswith(("torch.cuda", "torch.backends")):
                self.import_may_be_dead(module, attribute)
        for module, name in (("torch", "cuda"), ("torch.backends", "cudnn"), ("torch.backends.cudnn", None),
                             ("torch.backends.cuda", None), ("torch.backends", "cuda")):
            self.import_may_be_dead(module, name)

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        names = ctx.qualnames(node.func)
        if patterns.method_call(node, "pin_memory") and not node.args:
            self._pin_calls.append(node)
        elif names & set(SYNCHRONIZE):
            self._syncs.append(node)
            self._may_free_imports(node.func)
        elif names & set(SEEDS):
            args = patterns.positional(node) or [a for a in node.args if a.keyword and a.keyword.value == "seed"]
            if len(args) != 1:
                return
            seed = args[0].value
            statement = self._statement_of(node)
            if statement is not None and self._launches(node):
                self.remove(statement, f"removed {self._short(node)}: this process launches the workers, which "
                            "own the XLA device and its generator")
                self._may_free_imports(node.func)
                return
            if statement is not None and self._seeded_just_before(statement, seed):
                # `torch.cuda.manual_seed(s)` then `torch.cuda.manual_seed_all(s)`: XLA's is seeded once.
                self.remove(statement, f"removed {self._short(node)}: the line before seeds the XLA generator")
                self._may_free_imports(node.func)
                return
            template = patterns.parsed_expression(ctx.spell("set_rng_state", patterns.HOLE))

            def seeded(updated: cst.Call) -> cst.BaseExpression:
                updated_args = patterns.positional(updated) or [
                    a for a in updated.args if a.keyword and a.keyword.value == "seed"]
                value = updated_args[0].value
                # torch.cuda's seeding casts with int(); XLA's takes an int only (a str or float: TypeError)
                if not _int_like(value):
                    value = cst.Call(cst.Name("int"), [cst.Arg(value)])
                return patterns.fill(template, value)

            self.replace(node, seeded, f"{self._short(node)} -> "
                         f"{patterns.code_of(template).replace(patterns.HOLE, self._short(seed))}")
            self._may_free_imports(node.func)
        elif names & set(DEVICE_NAME):
            device = ctx.device_reference(node, self.code)
            new = ctx.spell_expression("device_hw", device)
            self.replace(node, new, f"{self._short(node)} -> {patterns.code_of(new)}")
            self._may_free_imports(node.func)
        else:
            removed = next((REMOVED_CALLS[n] for n in sorted(names) if n in REMOVED_CALLS), None)
            statement = self._statement_of(node)
            if removed is not None and statement is not None:
                self.remove(statement, f"removed {self._short(node)}: {removed}")
                self._may_free_imports(node.func)

    # Timing: synchronize and events ---------------------------------------------------------------------
    def _timing_events(self) -> list[str]:
        """The event names whose every mention in the file is its binding, a ``.record()`` /
        ``.synchronize()`` / ``.wait()`` statement of its own, or a side of ``.elapsed_time()``."""
        if not self._events:
            return []
        mentions: dict[str, list[cst.CSTNode]] = {}
        for node in patterns.find_all(self.ctx.module, lambda n: isinstance(n, (cst.Name, cst.Attribute))):
            spelling = patterns.dotted_name(node)
            parent = self.ctx.parent(node)
            if spelling in self._events and not (isinstance(parent, cst.Attribute) and parent.attr is node):
                mentions.setdefault(spelling, []).append(node)
        arguments = {patterns.positional(self.ctx.parent(use))[0].value for uses in self._event_uses.values()
                     for use in uses if use.attr.value == "elapsed_time" and self._event_use_ok(use)}
        out = []
        for spelling, binding in self._events.items():
            uses = self._event_uses.get(spelling, [])
            if not uses or not all(self._event_use_ok(use) for use in uses):
                continue
            allowed = {binding.targets[0].target, *(use.value for use in uses), *arguments}
            if all(node in allowed for node in mentions.get(spelling, [])):
                out.append(spelling)
        return out

    def _event_use_ok(self, use: cst.Attribute) -> bool:
        call = self.ctx.parent(use)
        if not (isinstance(call, cst.Call) and call.func is use):
            return False
        if use.attr.value == "elapsed_time":
            args = patterns.positional(call)
            return len(args) == 1 and patterns.dotted_name(args[0].value) in self._events
        if use.attr.value == "query":
            return False
        return self._statement_of(call) is not None and isinstance(self.ctx.parent(self._statement_of(call)),
                                                                   cst.SimpleStatementLine)

    def _event_to_timer(self, spelling: str) -> None:
        clock = self.ctx.local_name("time", "time") + ".perf_counter()"
        self.replace(self._events[spelling].value, patterns.parsed_expression(clock),
                     f"{spelling} = torch.cuda.Event(...) -> {clock}: XLA has no events, a host clock times it")
        wait = self.ctx.spell("wait_device_ops")
        for use in self._event_uses.get(spelling, []):
            call = self.ctx.parent(use)
            method = use.attr.value
            if method == "elapsed_time":
                other = patterns.code_of(patterns.positional(call)[0].value)
                new = patterns.parsed_expression(f"({other} - {spelling}) * 1000")
                self.replace(call, new, f"{self._short(call)} -> ({other} - {spelling}) * 1000 (milliseconds)")
                continue
            statement = self._statement_of(call)
            if method == "record":
                line = self.ctx.parent(statement)
                if not self._after_synchronize(line):
                    self.insert_before(line, [self.ctx.statement(wait)], f"{wait} before reading the host clock")
                self.replace(statement, patterns.parsed_statement(f"{spelling} = {clock}").body[0],
                             f"{self._short(call)} -> {spelling} = {clock}")
            else:  # synchronize / wait: the device's work is done
                self.replace(call, patterns.parsed_expression(wait), f"{self._short(call)} -> {wait}")

    def _after_synchronize(self, line: cst.CSTNode) -> bool:
        """The statement line before ``line`` in its block is a ``torch.cuda.synchronize()``."""
        body = list(getattr(self.ctx.parent(line), "body", ()))
        position = next((i for i, s in enumerate(body) if s is line), 0)
        previous = body[position - 1] if position > 0 else None
        return (isinstance(previous, cst.SimpleStatementLine) and len(previous.body) == 1
                and isinstance(previous.body[0], cst.Expr) and previous.body[0].value in self._syncs)

    def _synchronize(self, node: cst.Call, events: list[str]) -> None:
        statement = self._statement_of(node)
        wait = self.ctx.spell_expression("wait_device_ops")
        if statement is None or self._brackets_timing(statement, events):
            self.replace(node, wait, f"{self._short(node)} -> {patterns.code_of(wait)} (it brackets a timing)")
            return
        self.remove(statement, f"removed {self._short(node)}: it brackets no timing, and XLA runs the step at "
                    "its barrier (waiting for the device every step only stalls it)")

    def _brackets_timing(self, statement: cst.BaseSmallStatement, events: list[str]) -> bool:
        """The statement before or after (in the same line or block) reads a clock or records an event."""
        line = self.ctx.parent(statement)
        neighbours: list[cst.CSTNode] = []
        if isinstance(line, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            index = list(line.body).index(statement)
            neighbours += [s for s in line.body[max(0, index - 1):index + 2] if s is not statement]
            block = self.ctx.parent(line)
            body = list(getattr(block, "body", ()))
            if line in body:
                position = body.index(line)
                neighbours += body[max(0, position - 1):position] + body[position + 1:position + 2]
        for neighbour in neighbours:
            calls = patterns.find_all(neighbour, lambda n: isinstance(n, cst.Call))
            for call in calls:
                if self.ctx.qualnames(call.func) & set(CLOCKS):
                    return True
                method = patterns.method_call(call, "record", "elapsed_time")
                if method is not None and patterns.dotted_name(method.value) in events:
                    return True
        return False

    def _launches(self, node: cst.CSTNode) -> bool:
        """``node``'s function (or the module) starts worker processes."""
        scope = self.ctx.function_scope(node)
        owner = getattr(scope, "node", self.ctx.module)
        return bool(patterns.find_all(owner, lambda n: isinstance(n, cst.Call) and n is not node
                                      and self.ctx.is_call_to(n, *LAUNCHERS)
                                      and self.ctx.function_scope(n) is scope))

    def _seeded_just_before(self, statement: cst.BaseSmallStatement, seed: cst.BaseExpression) -> bool:
        """The statement before ``statement`` (in its line or its block) seeds CUDA with the same seed."""
        line = self.ctx.parent(statement)
        if not isinstance(line, cst.SimpleStatementLine):
            return False
        index = line.body.index(statement)
        if index > 0:
            previous = line.body[index - 1]
        else:
            block = self.ctx.parent(line)
            body = list(getattr(block, "body", ()))
            position = next((i for i, s in enumerate(body) if s is line), 0)
            if position == 0 or not isinstance(body[position - 1], cst.SimpleStatementLine):
                return False
            previous = body[position - 1].body[-1]
        if not (isinstance(previous, cst.Expr) and isinstance(previous.value, cst.Call)
                and self.ctx.qualnames(previous.value.func) & set(SEEDS)):
            return False
        args = patterns.positional(previous.value) or [
            a for a in previous.value.args if a.keyword and a.keyword.value == "seed"]
        return len(args) == 1 and patterns.code_of(args[0].value) == patterns.code_of(seed)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if self._events_seen and node.attr.value in _EVENT_METHODS:
            spelling = patterns.dotted_name(node.value)
            if spelling is not None:
                self._event_uses.setdefault(spelling, []).append(node)

    def visit_Assign(self, node: cst.Assign) -> None:
        if (len(node.targets) == 1 and isinstance(node.value, cst.Call)
                and self.ctx.is_call_to(node.value, *EVENTS)):
            spelling = patterns.dotted_name(node.targets[0].target)
            if spelling is not None:
                self._events[spelling] = node
        flags = [self._flag(t.target) for t in node.targets]
        if flags and all(flags):
            self.remove(node, f"removed {self._short(node)}: CUDA/cuDNN setting, no effect on XLA")
            self._may_free_imports()

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None and self._flag(node.target):
            self.remove(node, f"removed {self._short(node)}: CUDA/cuDNN setting, no effect on XLA")
            self._may_free_imports()

    def _flag(self, target: cst.BaseExpression) -> bool:
        return is_backend_flag(self.ctx, target)


def _int_like(value: cst.BaseExpression) -> bool:
    """An int literal, a name or attribute (``seed``, ``args.seed``: ints where a seed is meant), ``int(...)``,
    or arithmetic of those (``seed + rank``): kept as written; anything else is cast as torch.cuda casts it."""
    if isinstance(value, (cst.Integer, cst.Name, cst.Attribute, cst.Subscript)):
        return True
    if isinstance(value, cst.Call):
        return isinstance(value.func, cst.Name) and value.func.value == "int"
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Add, cst.Subtract, cst.Multiply,
                                                                               cst.Modulo, cst.FloorDivide)):
        return _int_like(value.left) and _int_like(value.right)
    return False
