"""The pipeline: one parse, one metadata resolution, one facts pass, one batched traversal of all rules,
one apply, imports fixed once, the output gate, then render. See DESIGN.md section 3.

    bytes -> parse -> MetadataWrapper -> facts -> rules (visit_batched) -> apply -> imports -> gate -> bytes
"""

from __future__ import annotations

import ast
import codecs
import functools
import gc
import io
import re
import tokenize
import warnings
from dataclasses import dataclass

import libcst as cst

from . import gate, input_checks, leftovers, suppressions
from ..syntax import large_files, native_parse, nesting, positions, walk
from ..syntax.walk import fast_visits
from .apply import Applied, apply_edits
from .context import MigrationContext, root_name
from ..analysis import cpu_programs
from ..analysis.cuda_paths import CudaPaths
from .imports import add_imports, remove_dead_imports
from .records import Change, Finding, InputError
from .rule import Rule
from .targets import Target


@dataclass
class PipelineOutput:
    code: str
    # The input module's code (rendered once, with the positions): what ``code`` is when nothing changed.
    input_code: str
    output_bytes: bytes
    encoding: str
    changes: list[Change]
    findings: list[Finding]
    concepts: set[str]
    # The script was migrated as a distributed one (the data-parallel form applied to it).
    distributed: bool = False
    # The data-parallel form it got ("ddp" / "xm") and, when --data-parallel auto chose it, why.
    data_parallel: str = ""
    data_parallel_reason: str = ""


def cyclic_gc_paused(function):
    """``function`` runs with Python's cyclic garbage collector paused (turned back on after it, when it
    was on). A migration allocates millions of objects that live until it ends (the tree, its metadata,
    the edits); each collection meanwhile scans them all, which was 45% of the time on a 1 MB script.
    Reference counting still frees what is dropped at once; cycles wait for the next collection."""
    @functools.wraps(function)
    def paused(*args, **kwargs):
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return function(*args, **kwargs)
        finally:
            walk.forget_large()  # the nodes of a large tree, kept for the migration's walks
            if was_enabled:
                gc.enable()
    return paused


def check_input(data: bytes) -> InputError | str:
    """The source text, or why these bytes are not Python source: binary, UTF-16, undecodable."""
    if data.startswith((codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)):
        return InputError("UTF-32 is not supported: save the file as UTF-8 (Python reads source as UTF-8)")
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return InputError("UTF-16 is not supported: save the file as UTF-8 (Python reads source as UTF-8)")
    if b"\0" in data:
        return InputError("binary file (contains NUL bytes), not Python source")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as error:
        # detect_encoding also fails when the first lines are not UTF-8: say so rather than blame a cookie.
        if not error.msg.startswith("invalid or missing encoding declaration"):
            return InputError(f"cannot read: {error.msg}")
        encoding = "utf-8"
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        declared = codecs.lookup(encoding).name
        return InputError(f"not valid {declared}: byte 0x{data[error.start]:02x} cannot be decoded", line,
                          error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1)


def parse(source: bytes | str) -> cst.Module | InputError:
    """Bytes are decoded as Python would (coding cookie, BOM); a str is taken as the text itself."""
    if isinstance(source, bytes):
        text = check_input(source)
        if isinstance(text, InputError):
            return text
    elif "\0" in source:
        return InputError("contains NUL characters, not Python source")
    else:
        text = source
    deep, top_level = nesting.scan(text)
    if deep is not None:
        return too_deep_error(*deep)
    if top_level is not None:
        too_large = input_checks.statement_error(text, top_level.statement_lines)
        if too_large is not None:
            return too_large
    if top_level is not None and large_files.is_large(text):
        encoding = _libcst_encoding(source)
        module = large_files.parse_in_pieces(text, top_level, encoding) if encoding is not None else None
        if module is not None:
            return module
    try:
        return native_parse.parse_module(source)
    except cst.ParserSyntaxError as error:
        return _syntax_error(source, error)
    except RecursionError:
        return too_deep_error()
    except MemoryError:
        return InputError("cannot parse: out of memory")


def source_encoding(source: bytes) -> str:
    """The encoding of source bytes as libcst records it (``utf-8-sig`` with a BOM)."""
    return _libcst_encoding(source) or "utf-8"


def _libcst_encoding(source: bytes | str) -> str | None:
    """The encoding libcst's parse_module records for ``source`` (it detects it as Python does)."""
    if isinstance(source, str):
        return "utf-8"
    try:
        return tokenize.detect_encoding(io.BytesIO(source).readline)[0]
    except SyntaxError:
        return None


def too_deep_error(line: int | None = None, column: int | None = None) -> InputError:
    return InputError(nesting.too_deep_message(), line, column)


def _syntax_error(data: bytes | str, error: cst.ParserSyntaxError) -> InputError:
    """Python's own message and position where it has one (``Missing parentheses in call to 'print'``):
    libcst's are a list of expected tokens, and its reported column is not always the failing one."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ast.parse(data)
    except SyntaxError as python_error:
        return InputError(f"cannot parse: {python_error.msg}", python_error.lineno, python_error.offset)
    except (ValueError, RecursionError, MemoryError):
        pass
    match = re.search(r"error at (\d+):(\d+): (.*)", error.message)
    if match:
        return InputError(f"cannot parse: {match.group(3)}", int(match.group(1)), int(match.group(2)) + 1)
    return InputError(f"cannot parse: {error.message}", error.editor_line, error.editor_column)


class _BatchedRules(cst.CSTVisitor):
    """Runs every rule in one traversal: ``visit_<Node>`` on the way down, ``leave_<Node>`` on the way up.

    Like libcst's ``visit_batched``, but the rule methods per node type are looked up once per rule class
    (libcst inspects every visitor's members on every call: most of the time on a small file). Rules take
    their metadata from the context, which resolved it once, so none is resolved here."""

    def __init__(self, rules: list[Rule], cuda_paths: CudaPaths | None = None) -> None:
        super().__init__()
        # Node type -> the rules' methods for it.
        self.visits: dict[type, list] = {}
        self.leaves: dict[type, list] = {}
        # The same for the rules that only report: all that runs on a CUDA path of code already on XLA.
        self._report_visits: dict[type, list] = {}
        self._report_leaves: dict[type, list] = {}
        for rule in rules:
            tables = (("visit_", self.visits, self._report_visits), ("leave_", self.leaves, self._report_leaves))
            for prefix, table, report_table in tables:
                for name in _handled_node_types(type(rule), prefix):
                    method = getattr(rule, prefix + name)
                    table.setdefault(getattr(cst, name), []).append(method)
                    if rule.reports_only:
                        report_table.setdefault(getattr(cst, name), []).append(method)
        self._cuda_paths = cuda_paths
        # Innermost first: whether the branch being walked is on a CUDA path (outside any gated branch:
        # whether the file tests for XLA, and so has a CUDA path besides it).
        self._on_cuda_path = [cuda_paths.tests_for_xla] if cuda_paths is not None else [False]

    def _entering(self, node: cst.CSTNode) -> bool:
        path = self._cuda_paths.path_of_branch(node) if self._cuda_paths is not None else None
        if path is not None:
            self._on_cuda_path.append(path == "cuda")
        return self._on_cuda_path[-1] and not isinstance(node, cst.Module)

    def on_visit(self, node: cst.CSTNode) -> bool:
        table = self._report_visits if self._entering(node) else self.visits
        for method in table.get(type(node), ()):
            method(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        on_cuda_path = self._on_cuda_path[-1] and not isinstance(original_node, cst.Module)
        if self._cuda_paths is not None and self._cuda_paths.path_of_branch(original_node) is not None:
            self._on_cuda_path.pop()
        for method in (self._report_leaves if on_cuda_path else self.leaves).get(type(original_node), ()):
            method(original_node)


def _with_torch_root_dispatch(visits: dict[type, list], roots: frozenset[str] | None) -> dict[type, list]:
    """``visits`` with the Name and Attribute methods marked ``rule.torch_names_only`` called only for the
    nodes whose root is in ``roots`` (all of them, in their order, for those; the others for the rest)."""
    if roots is None:
        return visits
    dispatched = dict(visits)
    for node_type, root_of in ((cst.Name, _name_value), (cst.Attribute, root_name)):
        methods = visits.get(node_type, [])
        others = [method for method in methods if not getattr(method, "torch_names_only", False)]
        if len(others) < len(methods):
            dispatched[node_type] = [_dispatcher(methods, others, roots, root_of)]
    return dispatched


def _dispatcher(methods: list, others: list, roots: frozenset[str], root_of):
    def dispatch(node: cst.CSTNode) -> None:
        for method in (methods if root_of(node) in roots else others):
            method(node)
    return dispatch


def _name_value(node: cst.Name) -> str:
    return node.value


@functools.lru_cache(maxsize=None)
def _handled_node_types(rule_class: type, prefix: str) -> tuple[str, ...]:
    """Node type names a rule class has its own ``visit_X``/``leave_X`` methods for (attribute hooks
    excluded; libcst's base class defines a no-op for every node type, and calling those for every node and
    every rule cost more than the rules' own work). Only the classes above libcst's can define one, so only
    their own names are read: ``dir()`` of a rule lists libcst's hundreds of no-ops (most of the start-up of
    a small file); the names come out sorted, as ``dir()`` gives them."""
    candidates = {name for name in walk.own_names(rule_class, cst.BatchableCSTVisitor) if name.startswith(prefix)}
    names = [name[len(prefix):] for name in sorted(candidates)
             if getattr(rule_class, name) is not getattr(cst.BatchableCSTVisitor, name, None)]
    return tuple(n for n in names if isinstance(getattr(cst, n, None), type))


def run_pipeline(module: cst.Module, target: Target, rules: list[type[Rule]],
                 distributed: bool | None = None, data_parallel: str | None = None,
                 project=None, ignored_codes: frozenset[str] = frozenset(),
                 report_only: frozenset[str] = frozenset()) -> PipelineOutput:
    """``distributed``: True/False force the distributed or single-device migration; None detects it.
    ``data_parallel``: "auto", "ddp" or "xm" (None: the target's default, auto). ``project``: the file's view of the
    project index (``project.ProjectFile``), None for a file migrated alone. ``ignored_codes``: the engine's
    own codes (codes.py) the run ignores. ``report_only``: rules whose edits become findings instead
    (``fix_safety="safe"``: the rules whose fix needs a review)."""
    # The analysis and the rules only read the tree: their visitors walk it rather than rebuild it. The
    # edits' transformers run outside, on libcst's own path (through the walk's hook they would recurse
    # one frame deeper per level).
    with fast_visits():
        wrapper = cst.MetadataWrapper(module, unsafe_skip_copy=True)
        ctx = MigrationContext(wrapper, target, distributed=distributed, data_parallel=data_parallel,
                               project=project)
        reported_on_xla: frozenset[str] = frozenset()
        # --distributed asks for the multi-process migration of a program whatever its devices say.
        cpu_only = distributed is not True and (project.index.cpu_only if project is not None
                                                else cpu_programs.cpu_only_script(ctx.input_code))
        if cpu_only:
            rules = []  # a CPU program: nothing of it is CUDA's, and the step recipe would start the runtime
        elif ctx.facts.runs_on_xla:
            reported_on_xla = frozenset(r.code for r in rules if r.reports_on_xla_code and not r.on_xla_code)
            rules = [rule for rule in rules if rule.on_xla_code or rule.code in reported_on_xla]
        suppressed = suppressions.scan(ctx.input_code)
        if suppressed.skip_file:
            rules = []
        ctx.set_rule_codes(frozenset(r.code for r in rules))
        if rules:
            cuda_paths = ctx.cuda_paths if ctx.facts.runs_on_xla else None
            batched = _BatchedRules([rule(ctx) for rule in rules], cuda_paths)
            if cuda_paths is None:  # no CUDA paths to hide: the same calls, without the per-node branching
                walk.walk_batched(module, _with_torch_root_dispatch(batched.visits, ctx.torch_roots()),
                                  batched.leaves)
            else:
                module.visit(batched)
    if report_only:
        _report_instead_of_editing(ctx, report_only)
    if reported_on_xla:
        _report_instead_of_editing(ctx, reported_on_xla, "the script already runs on torch_xla",
                                   "make it by hand where it applies")
    applied = _applied(ctx, _apply_with_leftovers(ctx, suppressed))
    # Module.code renders the whole tree each time it is read: render the output once per version (the
    # input's render came with its positions).
    if applied.module is not module:
        output_gate = _Gate(ctx)
        output = output_gate.render(applied.module)
        if output_gate.problem(output) is not None:
            applied = _withdraw_until_clean(ctx, output_gate)
            output = ctx.input_code if applied.module is module else output_gate.render(applied.module)
    else:
        output = ctx.input_code
    applied.report_overlaps(ctx)
    applied.report_folds(ctx)
    if cpu_only:
        line = cpu_programs.training_line(ctx.input_code)
        if line is not None:
            ctx.findings.append(Finding(line, 1, cpu_programs.CODE, cpu_programs.MESSAGE, cpu_programs.FIX))
    _drop_unapplied_derived_changes(ctx)
    if suppressed:
        _drop_suppressed_findings(ctx, suppressed)
    if ignored_codes:
        ctx.findings = [f for f in ctx.findings if f.code not in ignored_codes]
    return PipelineOutput(
        code=output,
        input_code=ctx.input_code,
        output_bytes=output.encode(applied.module.encoding),  # what Module.bytes would render again
        encoding=applied.module.encoding,
        changes=sorted(ctx.changes),
        findings=sorted(ctx.findings),
        concepts=ctx.concepts,
        distributed=ctx.distributed,
        # The forms are torch_xla's (DESIGN.md section 7): none applies on TorchTPU, where DDP stays DDP.
        data_parallel=ctx.data_parallel if ctx.distributed and ctx.target.runtime == "torch_xla" else "",
        data_parallel_reason=ctx.data_parallel_reason if ctx.distributed and ctx.target.runtime == "torch_xla" else "",
    )


# Rounds of "a removed call emptied another function" followed (ddp_setup -> setup -> ...).
_LEFTOVER_ROUNDS = 5


def _apply_with_leftovers(ctx: MigrationContext, suppressed: suppressions.Suppressions) -> Applied:
    """Every edit applied but the suppressed ones; a function the edits left doing nothing goes with its calls
    (leftovers.py)."""
    _drop_suppressed_edits(ctx, suppressed)
    applied = apply_edits(ctx)
    seen: set[cst.FunctionDef] = set()
    for _ in range(_LEFTOVER_ROUNDS):
        if not leftovers.remove_emptied_functions(ctx, applied.emptied_functions, seen):
            break
        _drop_suppressed_edits(ctx, suppressed)
        applied = apply_edits(ctx)
    return applied


def _drop_suppressed_edits(ctx: MigrationContext, suppressed: suppressions.Suppressions) -> None:
    """The edits on lines a ``# noqa`` or an off/on block keeps, and their change records, dropped before
    any is applied (once here for every rule); an edit derived from a dropped one goes with it."""
    if not suppressed:
        return
    # An insertion keeps the lines there as they are (it adds lines beside them, such as the device binding
    # the following lines use): suppressions leave it, as the later edits that need it would be withdrawn.
    dropped = {id(change) for kind, change in ctx.edits.records()
               if kind != "insert" and suppressed.suppresses(change.line, change.code)}
    if dropped:
        ctx.edits = ctx.edits.keeping({id(change) for _, change in ctx.edits.records()} - dropped)
        ctx.changes = [change for change in ctx.changes if id(change) not in dropped]


def _report_instead_of_editing(ctx: MigrationContext, codes: frozenset[str], why: str = "fix safety: review",
                               fix: str = "review it and make it by hand, or run without --safe-only") -> None:
    """--safe-only (or a rule's ``reports_on_xla_code`` on XLA code): the edits of these rules are not applied;
    each is reported for a person instead."""
    dropped = [change for _, change in ctx.edits.records() if change.code in codes]
    if not dropped:
        return
    ids = {id(change) for change in dropped}
    ctx.edits = ctx.edits.keeping({id(change) for _, change in ctx.edits.records()} - ids)
    ctx.changes = [change for change in ctx.changes if id(change) not in ids]
    ctx.findings += [Finding(change.line, change.column, change.code, f"not applied ({why}): "
                             f"{change.message}", fix, None,
                             change.end_line, change.end_column)
                     for change in dropped]


def _drop_suppressed_findings(ctx: MigrationContext, suppressed: suppressions.Suppressions) -> None:
    """The findings on suppressed lines dropped; the ``# noqa`` codes that kept nothing out reported (XLA002)."""
    from .codes import engine_code
    from .registry import all_rules

    codes = {rule.code for rule in all_rules()}
    kept = [f for f in ctx.findings if not suppressed.suppresses(f.line, f.code)]
    unused = suppressed.unused(lambda code: code in codes or engine_code(code) is not None,
                               lambda code: ctx.runs(code) or engine_code(code) is not None)
    ctx.findings = kept + unused


def _drop_unapplied_derived_changes(ctx: MigrationContext) -> None:
    """A derived removal whose sources the gate withdrew was not applied: it is not reported either."""
    reported = {id(c) for c in ctx.changes}
    dropped = True
    while dropped:
        dropped = {derived for derived, sources in ctx.edits.requires.items()
                   if derived in reported and any(id(s) not in reported for s in sources)}
        reported -= dropped
    ctx.changes = [c for c in ctx.changes if id(c) in reported]


def _applied(ctx: MigrationContext, applied: Applied) -> Applied:
    """The applied edits with the imports fixed: dead ones removed, the ones the output needs added."""
    if applied.module is not ctx.module:
        new_module = remove_dead_imports(applied.module, ctx.maybe_dead_imports)
        applied.module = add_imports(new_module, ctx.imports, ctx.late_imports)
    return applied


class _Gate:
    """The output gate of one input, with the render it checks: a large file's outputs are rendered with
    the offsets of their pieces, and checked a piece at a time (gate.py)."""

    def __init__(self, ctx: MigrationContext) -> None:
        self._large = large_files.is_large(ctx.input_code)
        self._input_text = ctx.input_text
        source_pieces = (lambda: _in_pieces(ctx.module, self._input_text)[1]) if self._large else None
        self._gate = gate.OutputGate(ctx.input_code, source_pieces)
        self._pieces: list[int] | None = None  # where the pieces of the output rendered last start

    def render(self, module: cst.Module) -> str:
        """The output's code: the top-level statements the edits left as they were are the input's text."""
        if not self._large:
            return positions.render_module(module, self._input_text)
        code, self._pieces = _in_pieces(module, self._input_text)
        return code

    def problem(self, output: str) -> str | None:
        """What is wrong with ``output``, the code ``render`` returned last."""
        return self._gate.problem(output, self._pieces)


def _in_pieces(module: cst.Module, input_text: positions.InputText) -> tuple[str, list[int]]:
    return positions.render_in_pieces(module, large_files.PIECE_CHARS, input_text)


def _withdraw_until_clean(ctx: MigrationContext, output_gate: _Gate) -> Applied:
    """Withdraw the edits that make the output fail the gate, keep the rest; each withdrawn edit becomes a
    finding that says what it would have produced.

    The culprits are found one at a time by bisection over the change records (insertions first, since
    they bind names later edits read; removals last, since they unbind names), invariant: the kept edits
    pass the gate. Each culprit costs about log2(edits) applications; a clean file costs none."""
    order = {"insert": 0, "replace": 1, "remove": 2}
    pending = [change for kind, change in sorted(ctx.edits.records(), key=lambda r: (order[r[0]], r[1]))]
    kept: list = []

    def probe(changes: list) -> tuple[Applied, str | None]:
        applied = _applied(ctx, apply_edits(ctx, ctx.edits.keeping({id(c) for c in changes})))
        if applied.module is ctx.module:
            return applied, None
        return applied, output_gate.problem(output_gate.render(applied.module))

    applied, problem = probe(pending)
    while problem is not None:
        low, high = 1, len(pending)  # the smallest prefix of `pending` that, with `kept`, fails
        culprit_problem = problem
        while low < high:
            middle = (low + high) // 2
            _, middle_problem = probe(kept + pending[:middle])
            if middle_problem is None:
                low = middle + 1
            else:
                high, culprit_problem = middle, middle_problem
        culprit = pending[low - 1]
        kept += pending[:low - 1]
        pending = pending[low:]
        ctx.withdraw(culprit, f"rewrite withdrawn ({culprit.code}: {culprit.message}): it would have produced "
                     f"{culprit_problem}",
                     "make this change by hand (the output gate found it breaks the script)", code=gate.CODE)
        applied, problem = probe(kept + pending)
    return applied
