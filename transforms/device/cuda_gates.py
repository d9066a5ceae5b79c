"""XLA104 cuda-gates: CUDA availability tests and device comparisons take the accelerator branch on XLA.

What it does:
    Finds the tests a script uses to choose its accelerator path: ``torch.cuda.is_available()``,
    ``device == "cuda"``, ``device.type == "cuda"``, ``args.device == "cuda"``, ``"cuda" in device``,
    ``device.startswith("cuda")`` (and their negations ``!=``, ``not in``, ``not ...``). On XLA every one of
    them is False, so the migrated script would silently leave the accelerator path (no AMP, no
    ``pin_memory``, a CPU device). Each is folded to the value it has on the accelerator, and the code around
    it is simplified:

    - ``use_amp = torch.cuda.is_available()`` -> ``use_amp = True``; ``pin_memory=torch.cuda.is_available()``
      -> ``pin_memory=True``.
    - ``not args.no_cuda and torch.cuda.is_available()`` -> ``not args.no_cuda``.
    - ``if torch.cuda.is_available(): x`` -> ``x`` (the taken branch is kept without the ``if``, one level
      less indented; its ``else`` is dropped; statements other rules remove from it do not count);
      ``if device.type != "cuda": ...`` without ``else`` is removed (with an ``elif``, the ``elif`` becomes
      the ``if``), and so is an ``if`` whose branch held only removed CUDA code. An ``if`` line with a
      comment, or a branch ending in one, keeps its ``if`` with the folded test (``if True:``), so no
      comment is lost.
    - ``if not torch.cuda.is_available() or not use_flash: return`` (a function's early ``return``, the code
      after it the CUDA path): that code is the path the test selects, decided like a branch; when it needs
      CUDA (``torch.cuda.get_device_properties``) the early return is always taken on XLA, and the code after
      it, unreachable, goes (a finding names its lines). Code after the guard that does work other rules
      migrate (``model.cuda()``, a device chosen) is the function's work: the guard is dropped instead.
    - ``assert torch.cuda.is_available()`` is removed; an ``assert`` comparing a device with ``"cuda"`` (a
      test's ``assert model.to.call_args.args[0] == "cuda"``) is kept and reported: it checks what the code
      did, which the migration changed.
    - ``a if torch.cuda.is_available() else b`` -> ``a``.
    - Not folded: a comparison of Lightning's accelerator name (``accelerator == "cuda"`` in a module that imports
      Lightning): the name stays Lightning's (XLA101), so the test keeps its meaning.
    - A fused-kernel flag, ``{"fused": device.type == "cuda"}`` or ``make_optimizer(..., fused=<test>)`` (litgpt's
      pretrain hands the dict to AdamW through ``**kwargs``) -> ``False``: CUDA's fused optimizer kernels
      raise on XLA parameters (torch.optim's own ``fused=`` is XLA205's to drop).
    - ``"nccl" if torch.cuda.is_available() else "gloo"`` (a process-group backend chosen by the test) ->
      ``"xla"``: neither backend is XLA's, the choice was the accelerator's. A test of that backend in the same function
      (``if backend == "gloo":``) is then known too, and folded.

    A test is decided by the code its value turns on once the migration is done. When the accelerator value
    would run code that still needs CUDA (``torch.nn.DataParallel`` that no rule removed, CUDA streams,
    events and graphs, memory statistics, ``torch.cuda.get_rng_state()`` and other CUDA-only queries such as
    ``is_bf16_supported()``, legacy CUDA tensor types XLA105 does not rewrite, ``fused=True``, an inductor
    ``torch.compile``, Triton/apex/flash-attn kernels, or only a message about the CUDA device), the test
    takes the value that keeps that code off (``not torch.cuda.is_available() or
    torch.cuda.is_bf16_supported()`` -> the non-CUDA answer), and what was left out is reported. A path that
    only speaks of the GPU (``print("No GPU found")``) is no reason to run CUDA-only code: it is taken. A
    CUDA path that chooses the device (``device = torch.device("cuda")``, ``name = "cuda:0"``) is not lost
    with its CUDA queries: it stays (its device becomes XLA's), without the statements that need CUDA and
    those that read what they computed, and a finding names them; where that cannot be done, the finding
    says that the code now runs on the CPU. A name only the left-out path set (``num_gpus =
    torch.cuda.device_count()``) that a later test reads to choose the launch (``if num_gpus > 1:
    mp.spawn(...)``) is reported at that test: the launch may never run; so is a launch in a branch left
    out (``if torch.cuda.device_count() > 1: mp.spawn(...)``). A function's name bound on the left-out path and
    nowhere before the test but read after it (``range(n_gpus)``) is reported at the read: on XLA it may be
    unbound. Tests of one condition in one
    function whose branches share names (a format bound by the first, used by the second) take one value:
    the one that keeps the CUDA-only code off, unless the other test's accelerator branch does work another
    rule migrates (then the disagreement is reported). A flag bound
    to a test (``cuda = torch.cuda.is_available()``, ``self.is_cuda = device.type == "cuda"``) is folded,
    and each of its uses as a test (``if self.is_cuda:``) is decided the same way. ``torch.cuda.device_count()``
    compared with a number is a test too: one XLA device per process (``device_count() > 1`` is False).

    A comparison with a parameter that selects an implementation, not a device (``impl="cuda"`` checked by
    ``assert impl in ["ref", "cuda"]``), is no test of CUDA: that test stays as it is (on XLA the plain path runs).

    Device expressions that XLA101 or the AMP rules rewrite as a whole (``"cuda" if torch.cuda.is_available()
    else "cpu"``) are left to them.

Why:
    ``torch.cuda.is_available()`` is False on an XLA machine and an XLA device's type is ``"xla"``: left
    alone, these tests turn the migrated script's accelerator code off without a word. Review the result:
    a test can also guard something that must stay off on XLA.

Example:
    use_amp = torch.cuda.is_available()
    loader = DataLoader(ds, batch_size=64, pin_memory=torch.cuda.is_available())
    if torch.cuda.is_available():
        torch.backends.cudnn.benchmark = True

Use instead:
    use_amp = True
    loader = DataLoader(ds, batch_size=64, pin_memory=True)
    torch.backends.cudnn.benchmark = True
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.analysis import gates
from xla_migrate.analysis.cuda_only import CUDA_KEYWORDS, CudaOnly
from xla_migrate.analysis.facts import is_cuda_device_expr
from xla_migrate.engine.rule import Rule
from xla_migrate.syntax import patterns
from xla_migrate.transforms.common import lightning_accelerator
from xla_migrate.transforms.device.cuda_gate_folds import GateFolds
from xla_migrate.transforms.device.cuda_gate_reports import GateReports, short as _short

IS_AVAILABLE = ("torch.cuda.is_available", "torch.accelerator.is_available")
DEVICE_COUNT = ("torch.cuda.device_count",)
# Calls that every replica must make together: a branch that holds one is chosen by the number of replicas.
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce", "reduce_scatter", "broadcast",
               "gather", "scatter", "all_to_all", "barrier", "all_gather_object", "broadcast_object_list",
               "mesh_reduce", "rendezvous")
COLLECTIVE_MODULES = ("torch.distributed", "torch_xla.core.xla_model")
_COMPARE = {cst.GreaterThan: lambda a, b: a > b, cst.GreaterThanEqual: lambda a, b: a >= b,
            cst.LessThan: lambda a, b: a < b, cst.LessThanEqual: lambda a, b: a <= b,
            cst.Equal: lambda a, b: a == b, cst.NotEqual: lambda a, b: a != b}


def _test_leaves(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The operands of a test's ``not`` / ``and`` / ``or`` that are names or attributes (flag candidates)."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return _test_leaves(test.expression)
    if isinstance(test, cst.BooleanOperation):
        return _test_leaves(test.left) + _test_leaves(test.right)
    return [test] if isinstance(test, (cst.Name, cst.Attribute)) else []


def _only_messages(needs: list[tuple[cst.CSTNode, str]]) -> bool:
    return all(what == MESSAGE for _, what in needs)


MESSAGE = "a message about the CUDA device"


class CudaGates(GateFolds, GateReports, Rule):
    code = "XLA104"
    name = "cuda-gates"
    summary = ("torch.cuda.is_available() and device == 'cuda' tests -> their value on the accelerator "
               "(True), unless that turns on code that still needs CUDA")
    # Not on code already on XLA: there a CUDA test is a live switch (False on a TPU host) that selects the
    # script's own XLA path; folding it to True would run the CUDA branch on the TPU.
    fix_safety = "review"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._gates: list[tuple[cst.BaseExpression, bool]] = []
        self._done: set[cst.CSTNode] = set()
        # Names and attributes in test positions (if / elif / while / conditional expressions), by spelling:
        # the uses of flags bound to a gate are found among them.
        self._leaves: dict[str, list[cst.BaseExpression]] = {}
        self._values: dict[cst.CSTNode, bool] = {}
        # Tests whose CUDA path chooses the device: the statements of that path that still need CUDA go.
        self._trims: dict[cst.CSTNode, list[tuple[cst.BaseStatement, list[str]]]] = {}
        # (test, the test of the same condition decided the other way): reported, not changed.
        self._disagreements: list[tuple[cst.BaseExpression, cst.BaseExpression]] = []

    # Finding the tests -------------------------------------------------------------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.is_call_to(node, *IS_AVAILABLE):
            self._gate(node, True)
        elif patterns.method_call(node, "startswith"):
            args = patterns.positional(node)
            if len(args) == 1 and patterns.string_value(args[0].value) == "cuda":
                self._gate(node, True)

    def visit_Comparison(self, node: cst.Comparison) -> None:
        if len(node.comparisons) != 1:
            return
        target = node.comparisons[0]
        operator = target.operator
        left_cuda = patterns.is_cuda_string(node.left)
        right_cuda = patterns.is_cuda_string(target.comparator)
        if self._selects_an_implementation(node):
            return
        if lightning_accelerator(self.ctx, target.comparator if left_cuda else node.left):
            return  # Lightning's accelerator name: its value is Lightning's choice (XLA908), not the torch device
        if isinstance(operator, (cst.Equal, cst.NotEqual)) and left_cuda != right_cuda:
            self._gate(node, isinstance(operator, cst.Equal))
        elif isinstance(operator, (cst.In, cst.NotIn)) and left_cuda and not right_cuda:
            self._gate(node, isinstance(operator, cst.In))
        elif (type(operator) in _COMPARE and isinstance(node.left, cst.Call) and not node.left.args
              and self.ctx.is_call_to(node.left, *DEVICE_COUNT) and isinstance(target.comparator, cst.Integer)):
            if self.ctx.distributed and self._selects_a_collective(node):
                # `if torch.cuda.device_count() > 1: dist.all_reduce(metric)`: in a data-parallel program more
                # than one GPU meant more than one replica, and the collective must stay.
                world = self.ctx.spell("world_size")
                self.replace(node.left, patterns.parsed_expression(world),
                             f"{_short(node.left)} -> {world}: in a data-parallel program more than one CUDA device "
                             "means more than one replica (one XLA device each); the collective it selects stays")
                return
            # One XLA device per process: `torch.cuda.device_count() > 1` (DataParallel) is False on XLA.
            self._gate(node, _COMPARE[type(operator)](1, int(target.comparator.value)))

    def _selects_a_collective(self, node: cst.Comparison) -> bool:
        """The code the test selects calls a collective of torch.distributed (or torch_xla's)."""
        selected = [n for branch in gates.branches(gates.test_top(node, self.ctx.parent), self.ctx.parent)
                    for n in branch]
        return any(patterns.find_all(code, lambda n: isinstance(n, cst.Call) and any(
            name.rsplit(".", 1)[0] in COLLECTIVE_MODULES and name.rsplit(".", 1)[-1] in COLLECTIVES
            for name in self.ctx.qualnames(n.func))) for code in selected)

    def _selects_an_implementation(self, node: cst.Comparison) -> bool:
        """``impl == "cuda" and x.device.type == "cuda" and _init()``: the test of a fused kernel chosen by a
        selector parameter (``impl``, checked against ``["ref", "cuda"]``), no device test: on XLA it stays as
        it is, False, and the plain path runs (its CUDA branch stays unreachable)."""
        flow = self.ctx.device_flow
        top = gates.test_top(node, self.ctx.parent)
        return bool(flow.selectors) and bool(patterns.find_all(top, lambda n: isinstance(n, cst.Comparison) and (
            flow.is_selector(n.left) or any(flow.is_selector(c.comparator) for c in n.comparisons))))

    def visit_If(self, node: cst.If) -> None:
        self._leaves_of(node.test)

    def visit_IfExp(self, node: cst.IfExp) -> None:
        self._leaves_of(node.test)

    def visit_While(self, node: cst.While) -> None:
        self._leaves_of(node.test)

    def _leaves_of(self, test: cst.BaseExpression) -> None:
        for leaf in _test_leaves(test):
            spelling = patterns.dotted_name(leaf)
            if spelling is not None:
                self._leaves.setdefault(spelling, []).append(leaf)

    def _gate(self, node: cst.BaseExpression, value: bool) -> None:
        if self._left_to_others(node):
            return
        self._gates.append((node, value))

    def _left_to_others(self, node: cst.BaseExpression) -> bool:
        current = self.ctx.parent(node)
        while current is not None and not isinstance(current, (cst.BaseSmallStatement, cst.BaseStatement)):
            if isinstance(current, cst.FormattedStringExpression) and current.equal is not None:
                return True  # f"{torch.cuda.is_available()=}" prints its own text: left (XLA900 reports it)
            # A device conditional whose test keeps a user's part: XLA101 keeps the test, folded here.
            if isinstance(current, cst.IfExp) and self._kept_choice(current):
                return False
            # Left to XLA101 / the AMP rules: whole CUDA device expressions and device-type choices.
            if is_cuda_device_expr(current, self.ctx.qualnames) and not isinstance(current, cst.Comparison):
                return True
            if isinstance(current, cst.IfExp) and (patterns.is_cuda_string(current.body)
                                                   or patterns.is_cuda_string(current.orelse)):
                return True
            current = self.ctx.parent(current)
        return False

    def _kept_choice(self, node: cst.IfExp) -> bool:
        """``"cuda" if use_gpu and torch.cuda.is_available() else "cpu"`` (also inside ``torch.device(...)``):
        XLA101 keeps the test, whose user part still chooses the CPU."""
        return (is_cuda_device_expr(node.body, self.ctx.qualnames)
                and not is_cuda_device_expr(node.orelse, self.ctx.qualnames)
                and self.ctx.device_flow.residue(node.test) is not None)

    # Flags: names and attributes bound to a gate ---------------------------------------------------------------
    def _flag_uses(self, positive: dict[cst.CSTNode, bool]) -> list[tuple[cst.BaseExpression, bool]]:
        """(use, pure) for each use as a test of a flag bound to a gate: ``cuda = torch.cuda.is_available()``
        then ``if cuda:``. ``pure``: the flag is the gate's constant on XLA (else it keeps a user's part,
        ``not args.no_cuda``, and stays a live switch)."""
        uses: list[tuple[cst.BaseExpression, bool]] = []
        seen: set[cst.CSTNode] = set()
        for node, _ in self._gates:
            top = gates.test_top(node, self.ctx.parent)
            owner = self.ctx.parent(top)
            if not (isinstance(owner, cst.Assign) and len(owner.targets) == 1 and owner.value is top) and not (
                    isinstance(owner, cst.AnnAssign) and owner.value is top):
                continue
            target = owner.targets[0].target if isinstance(owner, cst.Assign) else owner.target
            if target in seen:
                continue
            seen.add(target)
            known, _ = gates.evaluate(top, positive)
            if known is False:
                continue  # a flag that is False on XLA turns nothing on
            for use in self._uses_of(target):
                if not self._left_to_others(use):
                    uses.append((use, known is True))
        return uses

    def _uses_of(self, target: cst.BaseExpression) -> list[cst.BaseExpression]:
        spelling = patterns.dotted_name(target)
        if spelling is None:
            return []
        leaves = self._leaves.get(spelling, [])
        if isinstance(target, cst.Name):
            scope = self.ctx.scopes.get(target)
            if scope is None:
                return []
            accesses = {access.node for assignment in scope.assignments[spelling] if assignment.node is target
                        for access in assignment.references}
            return [leaf for leaf in leaves if leaf in accesses]
        if spelling.startswith("self."):
            owner = self._class_of(target)
            return [leaf for leaf in leaves if owner is not None and self._class_of(leaf) is owner]
        return list(leaves)

    def _class_of(self, node: cst.CSTNode) -> cst.ClassDef | None:
        current = self.ctx.parent(node)
        while current is not None and not isinstance(current, cst.ClassDef):
            current = self.ctx.parent(current)
        return current

    # Deciding, once every rule has recorded its visit-time edits ------------------------------------------
    def leave_Module(self, original_node: cst.Module) -> None:
        positive = dict(self._gates)
        flag_uses = self._flag_uses(positive)
        candidates = [(node, value, None) for node, value in self._gates]
        candidates += [(use, True, pure) for use, pure in flag_uses]
        # Innermost first: a nested test's decision takes its CUDA-only branch out of the outer test's code.
        candidates.sort(key=lambda c: -self._depth(c[0]))
        checker = CudaOnly(self.ctx)
        decided, off = self._decide_all(candidates, positive, checker, {})
        forced = self._one_value_per_condition(decided, positive)
        if forced:
            decided, off = self._decide_all(candidates, positive, checker, forced)
        # A flag's use that keeps the user's part is not a constant: it is no operand to combine with.
        self._values = {node: choice for node, choice, pure, _ in decided if pure is not False or not choice}
        live = {node for node, choice, pure, _ in decided if pure is None and choice == positive.get(node)
                and self._tests_a_chosen_device(node)}
        folded = {node for node, choice, pure, _ in decided if node not in live and (pure is None or not choice)}
        for node in live:
            self._values.pop(node, None)  # a run-time test: no operand to combine with
        for node, choice, pure, (dropped, left_out) in sorted(decided, key=lambda d: self.ctx.position(d[0])):
            if node in self._trims:
                self._trim(node, self._trims[node])
            if pure is not None and choice:
                continue  # a flag's use stays: the flag holds its value on XLA
            if dropped:
                self._report_dropped(node, dropped, left_out)
                self._report_dead_launch(node, left_out)
                self._report_unbound_reads(node, left_out)
            self._report_launch_left_out(node, left_out)
            if node in live:
                self._test_for_xla(node)
            elif not self._inside_done(node):
                self._fold(node, choice, node)
        for node, other in self._disagreements:
            self.finding(node, f"{_short(node)}: this test takes the accelerator's branch while the same test "
                         f"at line {self.ctx.position(other)[0]} takes the other one (its CUDA path needs CUDA): "
                         "code that relies on both agreeing may break", "make the two tests agree by hand (one "
                         "condition has one value in a run)")
        self._forget_findings_in((off - {node for node, _, _ in candidates}) | folded)

    def _decide_all(self, candidates: list, positive: dict[cst.CSTNode, bool], checker: CudaOnly,
                    forced: dict[cst.CSTNode, bool]) -> tuple[list, set[cst.CSTNode]]:
        """Each test's value (``forced``: those already known) and what the decisions leave out."""
        self._trims = {}
        tentative: dict[cst.CSTNode, bool] = dict(positive)
        # What a decided test leaves out of the output, and the tests themselves (folded away): neither is
        # code an outer test turns on.
        off: set[cst.CSTNode] = {node for node, _, _ in candidates}
        decided: list[tuple[cst.BaseExpression, bool, bool | None, tuple[list, list]]] = []
        for node, value, pure in candidates:
            if node in forced:
                choice, dropped = forced[node], []
            else:
                choice, dropped = self._decide(node, value, tentative, off, checker)
            tentative[node] = choice
            top = gates.test_top(node, self.ctx.parent)
            known, _ = gates.evaluate(top, tentative)
            when_true, when_false = gates.branches(top, self.ctx.parent)
            left_out = when_false if known is True else when_true if known is False else []
            off.update(left_out)
            off.update(statement for statement, _ in self._trims.get(node, ()))
            decided.append((node, choice, pure, (dropped, left_out)))
        return decided, off

    def _one_value_per_condition(self, decided: list, positive: dict[cst.CSTNode, bool]) -> dict[cst.CSTNode, bool]:
        """Tests of one condition in one function that were decided differently (the first ``if
        torch.cuda.is_available():`` picks a format with {memory}, the second, whose CUDA branch reads a CUDA
        memory statistic, the call without memory=): the program evaluates the condition once per run, so
        every one of them takes the value that keeps the CUDA-only code off."""
        groups: dict[tuple[int, str], list[tuple[cst.BaseExpression, bool]]] = {}
        for node, choice, pure, _ in decided:
            if pure is not None or gates.test_top(node, self.ctx.parent) is not node:
                continue
            if not any(gates.branches(node, self.ctx.parent)):
                continue
            scope = self.ctx.parent(node)
            while scope is not None and not isinstance(scope, (cst.FunctionDef, cst.Module)):
                scope = self.ctx.parent(scope)
            groups.setdefault((id(scope), " ".join(patterns.code_of(node).split())), []).append((node, choice))
        forced: dict[cst.CSTNode, bool] = {}
        self._disagreements = []
        for members in groups.values():
            off_value = [node for node, choice in members if choice != positive.get(node)]
            if not off_value or len({choice for _, choice in members}) == 1:
                continue
            others = [node for node, choice in members if choice == positive.get(node)]
            if not any(gates.shares_names(a, b, self.ctx.parent) for a in others for b in off_value):
                continue  # independent tests: each one's own decision stands
            if all(self._may_take_the_other_branch(node) for node in others):
                forced.update((node, not positive[node]) for node, _ in members)
            else:  # a branch that does the accelerator's work (moves, a device): said, not changed
                self._disagreements += [(node, off_value[0]) for node in others]
        return forced

    def _may_take_the_other_branch(self, test: cst.BaseExpression) -> bool:
        """The ``if``/``else`` of ``test`` are two alternatives the program runs without CUDA too (an else
        exists), and the accelerator's branch does nothing another rule migrates or that chooses a device."""
        owner = self.ctx.parent(test)
        if not isinstance(owner, (cst.If, cst.IfExp)) or owner.orelse is None:
            return False
        body = owner.body
        if isinstance(body, cst.IndentedBlock) and any(gates.chooses_cuda_device(s, self.ctx.qualnames)
                                                       for s in body.body):
            return False
        edits = self.ctx.edits
        return not any(gates.inside(self.ctx.parent, edited, body) for edited in [*edits.replace, *edits.remove])

    def _compared(self, node: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
        """(the device expression a comparison or ``startswith`` tests, the ``"cuda"`` literal), else None."""
        if isinstance(node, cst.Comparison):
            right = node.comparisons[0].comparator
            if patterns.is_cuda_string(node.left):
                return right, node.left
            return node.left, right
        method = patterns.method_call(node, "startswith")
        if method is not None:
            return method.value, patterns.positional(node)[0].value
        return None

    def _tests_a_chosen_device(self, node: cst.BaseExpression) -> bool:
        """The test compares a device the user chooses (an option, a conditional that keeps the CPU, a
        tensor's device): it stays a run-time test, of XLA."""
        compared = self._compared(node)
        return compared is not None and patterns.string_value(compared[1]) is not None and \
            self.ctx.device_flow.cpu_capable(compared[0])

    def _test_for_xla(self, node: cst.BaseExpression) -> None:
        device, literal = self._compared(node)
        # `device == "cuda"` compares the option's whole value; `device.type == ...`, `in`, `startswith` its kind.
        whole = (isinstance(node, cst.Comparison) and isinstance(node.comparisons[0].operator, (cst.Equal, cst.NotEqual))
                 and not (isinstance(device, cst.Attribute) and device.attr.value == "type"))
        value = self.ctx.spell("device_name" if whole else "device_type")
        quote = "'" if isinstance(literal, cst.SimpleString) and literal.value.startswith("'") else '"'
        self.replace(literal, cst.SimpleString(value.replace('"', quote)),
                     f"{_short(node)}: tests for {value} (the device is chosen at run time and may be the CPU)")

    def _depth(self, node: cst.CSTNode) -> int:
        depth, current = 0, self.ctx.parent(node)
        while current is not None:
            depth, current = depth + 1, self.ctx.parent(current)
        return depth

    def _decide(self, node: cst.BaseExpression, value: bool, tentative: dict[cst.CSTNode, bool],
                off: set[cst.CSTNode], checker: CudaOnly) -> tuple[bool, list[tuple[cst.CSTNode, str]]]:
        """The value the test takes on XLA: ``value`` (the accelerator's), unless the code it turns on still
        needs CUDA and the other value's does not; then the other one, with what it keeps off."""
        top = gates.test_top(node, self.ctx.parent)
        if isinstance(self.ctx.parent(top), cst.Assert):
            return value, []  # an assert never gets the value that fails it
        needs = self._needs_cuda(top, {**tentative, node: value}, off, checker)
        if not needs:
            return value, []
        other = self._needs_cuda(top, {**tentative, node: not value}, off, checker)
        if other and not (_only_messages(other) and not _only_messages(needs)):
            return value, []  # CUDA code either way: the leftovers are reported (XLA900)
        trimmed = self._trimmable(top, {**tentative, node: value}, needs)
        if trimmed:
            # The CUDA path chooses the device: it stays, without the statements that need CUDA.
            self._trims[node] = trimmed
            return value, []
        # The other path needs nothing, or only speaks of the GPU ("no GPU found": true on XLA), while this one
        # would run CUDA-only code: a message is never worth a crash.
        return not value, needs

    def _trimmable(self, top: cst.BaseExpression, values: dict[cst.CSTNode, bool],
                   needs: list[tuple[cst.CSTNode, str]]) -> list[tuple[cst.BaseStatement, list[str]]]:
        """The statements to take out of the test's branches when the branch holding them chooses the device
        (``name = "cuda:0"``, ``device = torch.device("cuda")``): dropping the whole branch would leave the
        program on the CPU. Each CUDA-only construct must lie in a statement of a branch itself that binds
        nothing read outside it, and that branch must keep its device choice; else none (the branch is dropped,
        as before)."""
        _, residue = gates.evaluate(top, values)
        when_true, when_false = gates.branches(top, self.ctx.parent)
        suites = [b for b in when_true + when_false if isinstance(b, cst.IndentedBlock)]
        statements: dict[cst.BaseStatement, list[str]] = {}
        for construct, what in needs:
            if what == MESSAGE:
                continue
            if any(gates.inside(self.ctx.parent, construct, r) for r in residue):
                return []
            suite = next((suite for suite in suites if gates.inside(self.ctx.parent, construct, suite)), None)
            statement = (next((s for s in suite.body if gates.inside(self.ctx.parent, construct, s)), None)
                         if suite else None)
            group = gates.with_readers(statement, suite, self.ctx) if statement is not None else None
            if group is None:
                return []
            statements.setdefault(statement, []).append(what)
            for reader in group - {statement}:
                statements.setdefault(reader, []).append("reads what those lines computed")
        for suite in suites:
            trimmed = [s for s in suite.body if s in statements]
            kept = [s for s in suite.body if s not in statements]
            if trimmed and not any(gates.chooses_cuda_device(s, self.ctx.qualnames) for s in kept):
                return []
        if not statements:
            return []
        return list(statements.items())

    def _needs_cuda(self, top: cst.BaseExpression, values: dict[cst.CSTNode, bool], off: set[cst.CSTNode],
                    checker: CudaOnly) -> list[tuple[cst.CSTNode, str]]:
        known, code = gates.executed(top, values, self.ctx.parent)
        found: list[tuple[cst.CSTNode, str]] = []
        owner = self.ctx.parent(top)
        if (known is True and isinstance(owner, cst.Arg) and owner.keyword is not None
                and owner.keyword.value in CUDA_KEYWORDS):
            found.append((owner, f"{owner.keyword.value}=True (a CUDA-only implementation)"))
        ignore = tuple(off)
        after = gates.fall_through(owner, self.ctx.parent) if isinstance(owner, cst.If) else []
        if after and self._does_the_work([c for part in after for c, _ in checker.constructs(part, ignore)], after):
            code = [part for part in code if part not in after]  # a guard of the work itself, not of a CUDA path
        for part in code:
            if part in off:
                continue
            found += checker.constructs(part, ignore)
            if isinstance(part, cst.BaseSuite) and checker.messages_only(part):
                found.append((part, MESSAGE))
        return found

    def _does_the_work(self, constructs: list[cst.CSTNode], statements: list[cst.CSTNode]) -> bool:
        """The code after an early return holds work other rules migrate (a device chosen, a model moved)
        outside its CUDA-only constructs: it is the function's work, which XLA runs; the guard is dropped and
        the CUDA-only constructs reported, as before, rather than the work left out."""
        parent = self.ctx.parent
        edits = self.ctx.edits
        # A construct found at its callee (`torch.cuda.get_device_properties`) covers its arguments too.
        constructs = [parent(c) if isinstance(parent(c), cst.Call) and parent(c).func is c else c for c in constructs]
        # What other rules edit there, and the device moves they migrate (also when they do not run).
        moves = [n for s in statements for n in patterns.find_all(s, lambda n: isinstance(n, cst.Call) and (
            patterns.method_call(n, "cuda") is not None or is_cuda_device_expr(n, self.ctx.qualnames)))]
        work = [e for e in [*edits.replace, *edits.remove] if any(gates.inside(parent, e, s) for s in statements)]
        return any(not any(gates.inside(parent, node, c) for c in constructs) for node in [*work, *moves])

    def _trim(self, node: cst.BaseExpression, statements: list[tuple[cst.BaseStatement, list[str]]]) -> None:
        ranges = [r for r in (self.ctx.code_range(s) for s, _ in statements) if r is not None]
        lines = ", ".join(f"{r.start.line}" if r.start.line == r.end.line else f"{r.start.line}-{r.end.line}"
                          for r in sorted(ranges, key=lambda r: r.start.line))
        what = "; ".join(dict.fromkeys(k for _, kinds in statements for k in kinds))
        for statement, _ in statements:
            self.remove(statement, f"line of the CUDA path of {_short(node)} removed: it needs CUDA; the path "
                        "stays, it chooses the device")
        first = min(statements, key=lambda s: self.ctx.position(s[0]))[0]
        self.finding(first, f"{_short(node)}: the CUDA path chooses the device, so it is kept on XLA without "
                     f"line(s) {lines} ({what})", "port what those lines did to XLA by hand if the run needs "
                     "it (xm.get_memory_info(device) gives memory figures, xm.xla_device_hw(device) the kind)")

    # Folding -------------------------------------------------------------------------------------------------
    def _value(self, node: cst.BaseExpression) -> bool | None:
        """The value a gate expression has on XLA (``gate``, ``not gate``), else None."""
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
            inner = self._value(node.expression)
            return None if inner is None else not inner
        return self._values.get(node)

    def _inside_done(self, node: cst.CSTNode) -> bool:
        """Inside an expression already folded, or in the test of an ``if`` already folded (the gates in
        its branches are folded too: its replacement keeps the edits made inside it)."""
        current: cst.CSTNode | None = node
        previous: cst.CSTNode | None = None
        while current is not None:
            if current in self._done and (not isinstance(current, cst.If) or previous is current.test):
                return True
            previous, current = current, self.ctx.parent(current)
        return False
