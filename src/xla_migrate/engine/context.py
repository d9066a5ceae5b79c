"""What every rule sees while the batched traversal runs: metadata, facts, the target, and the edit log.

Edits are recorded against ORIGINAL nodes and applied afterwards in one pass (see ``apply.py``), so rules
never see each other's output and one traversal serves them all.

Over the house's 600-line bar (about 630 lines) because it is the one interface rules see: the rule contract
in one place. What should leave it next is the construction of the per-file analyses the data-parallel
work added here (they belong in ``analysis``, built by the pipeline).
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import CodeRange, Scope
from libcst.metadata.scope_provider import ClassScope, ComprehensionScope, FunctionScope, GlobalScope, ImportAssignment

from ..syntax import patterns, walk
from ..analysis.cuda_paths import CudaPaths, collect_cuda_paths
from ..analysis.device_flow import DeviceFlow
from ..analysis.facts import Facts, collect_facts
from ..analysis.launcher_side import functions_before_launch
from ..syntax.positions import Positions
from ..analysis.project import ProjectFile
from ..analysis.scopes import QualifiedNames, referent_parts, resolve_scopes
from ..analysis.steps import StepModel
from .records import Change, Finding
from .targets import MODULE_PLACEHOLDERS, SPMD_CONCEPTS, Target

_BUILTIN_NAMES = frozenset(dir(builtins))
NodeFactory = Callable[[cst.CSTNode], cst.CSTNode]
Statement = cst.SimpleStatementLine | cst.BaseCompoundStatement


def root_name(node: cst.CSTNode) -> str | None:
    """The first name of the dotted name libcst resolves for ``node`` (through attributes, calls and
    subscripts, as ``get_full_name_for_node`` does); None when it has none."""
    while True:
        if isinstance(node, cst.Name):
            return node.value
        if isinstance(node, (cst.Attribute, cst.Subscript)):
            node = node.value
        elif isinstance(node, cst.Call):
            node = node.func
        elif isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            node = node.name
        elif isinstance(node, cst.Decorator):
            node = node.decorator
        else:
            return None


class FixedReplacement:
    """A replacement that ignores the updated node; the applier refuses it over a subtree that another
    edit changed, since applying it would silently drop that edit."""

    def __init__(self, node: cst.CSTNode) -> None:
        self.node = node

    def __call__(self, updated: cst.CSTNode) -> cst.CSTNode:
        return self.node


@dataclass
class Edits:
    """Edits keyed by original nodes. Each entry keeps the change record it was reported with, so an edit
    that cannot be applied (an overlap) or that the output gate rejects can be taken back out of the report
    and turned into a finding."""

    # node -> [(change, factory(updated_node) -> new node)]
    replace: dict[cst.CSTNode, list[tuple[Change, NodeFactory]]] = field(default_factory=dict)
    # statement -> [(change, statements inserted before / after it)]
    before: dict[cst.CSTNode, list[tuple[Change, list[cst.BaseStatement]]]] = field(default_factory=dict)
    after: dict[cst.CSTNode, list[tuple[Change, list[cst.BaseStatement]]]] = field(default_factory=dict)
    # statement -> the change that removes it
    remove: dict[cst.CSTNode, Change] = field(default_factory=dict)
    # A derived edit's change (by identity) -> the changes it follows from (an emptied function's removal
    # needs the removals that emptied it): kept only with all of them.
    requires: dict[int, list[Change]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.replace or self.before or self.after or self.remove)

    def records(self) -> list[tuple[str, Change]]:
        """Every edit's change record with its kind (insert, replace, remove), each record once."""
        seen: set[int] = set()
        out: list[tuple[str, Change]] = []
        for kind, changes in (
            ("insert", (c for table in (self.before, self.after) for entries in table.values() for c, _ in entries)),
            ("replace", (c for entries in self.replace.values() for c, _ in entries)),
            ("remove", self.remove.values()),
        ):
            for change in changes:
                if id(change) not in seen:
                    seen.add(id(change))
                    out.append((kind, change))
        return out

    def keeping(self, kept: set[int]) -> Edits:
        """Only the edits whose change record (by identity) is in ``kept``, and derived edits only with
        the edits they follow from."""
        kept = set(kept)
        dropped = True
        while dropped:
            dropped = {c for c in kept if c in self.requires and any(id(r) not in kept for r in self.requires[c])}
            kept -= dropped

        def entries(table):
            out = {node: [e for e in items if id(e[0]) in kept] for node, items in table.items()}
            return {node: items for node, items in out.items() if items}
        return Edits(replace=entries(self.replace), before=entries(self.before), after=entries(self.after),
                     remove={node: c for node, c in self.remove.items() if id(c) in kept},
                     requires=self.requires)


class MigrationContext:
    def __init__(self, wrapper: cst.MetadataWrapper, target: Target, distributed: bool | None = None,
                 data_parallel: str | None = None, rule_codes: frozenset[str] | None = None,
                 project: ProjectFile | None = None) -> None:
        self.module = wrapper.module
        self.target = target
        # Qualified names are asked of the scopes per node, when a rule asks (what libcst's
        # QualifiedNameProvider does for every node of the module up front).
        self.scopes: dict[cst.CSTNode, Scope] = resolve_scopes(wrapper)
        self._star_torch: bool | None = None  # (asked by qualnames from here on)
        self._qualnames: dict[cst.CSTNode, frozenset[str]] = {}
        self._qualified_names = QualifiedNames(self.scopes, referent_parts(wrapper))
        # Rendered here, not when a record first needs a position: that is deep inside the rules' traversal,
        # and rendering the module on top of that stack overflows on input at the nesting limit. The output
        # needs the render anyway (the input's code, for the gate and for an unchanged file).
        self._positions = Positions(self.module)
        self.input_code: str = self._positions.code
        # The input's code with its top-level statements' spans (outputs reuse the text of those they keep).
        self.input_text = self._positions.input_text
        self._parents = self._positions.parents
        self.facts: Facts = collect_facts(self.module, self.qualnames, self.scopes)
        self.facts.upgrades_xla_code = target.upgrades_xla_code
        # This file's view of the project index (project.py), or None: migrated alone.
        self.project = project
        # Distributed mode: forced by the caller (--distributed / --single), else detected by the facts pass.
        self.distributed: bool = self.facts.distributed if distributed is None else distributed
        # The data-parallel form (DESIGN.md section 7): "ddp" keeps torch.distributed and DDP on the xla
        # process group, "xm" rebuilds the script on torch_xla's collectives (the seeds' recipe); "auto" is
        # decided below, once the step model is built (analysis/data_parallel.py), and says why.
        self.data_parallel: str = target.default_data_parallel if data_parallel is None else data_parallel
        self.data_parallel_reason: str = ""
        # The codes of the rules in this run (None: every rule), so a rule can tell whether another one runs.
        self._rule_codes = rule_codes
        # Analyses more than one rule asks for, computed once per file (see ``once``); the step model asks too.
        self._once: dict[object, object] = {}
        # The step model: per loop, what one training or evaluation step does (analysis/steps/).
        self.steps = StepModel(self)
        if self.data_parallel == "auto" and self.distributed:
            from ..analysis.data_parallel import choose_form

            verdict = choose_form(self, self._project_file_context)
            self.data_parallel, self.data_parallel_reason = verdict.form, f"auto: {verdict.reason}"
        self.edits = Edits()
        self.changes: list[Change] = []
        self.findings: list[Finding] = []
        # (module, alias or None) the output needs; added once after all edits.
        self.imports: set[tuple[str, str | None]] = set()
        # Those of them the script imports itself further down: import -> the top-level statement doing it
        # (added only where something may read the name before that statement runs).
        self.late_imports: dict[tuple[str, str | None], cst.BaseStatement] = {}
        # (module, name or None) whose import may have become dead; removed only if nothing uses it any more.
        self.maybe_dead_imports: set[tuple[str, str | None]] = set()
        # Target concepts the output uses: they decide which torch_xla releases it runs on.
        self.concepts: set[str] = set()
        # Scope -> name of the device variable this run bound there (so it is bound once per scope).
        self._bound_devices: dict[Scope, str] = {}
        # Module -> the name new code uses for it (see local_name).
        self._module_names: dict[str, str] = {}
        self._scopes_list: list[Scope] | None = None
        self._torch_bound_locally: bool | None = None
        self._cuda_paths: CudaPaths | None = None
        self._device_flow: DeviceFlow | None = None

    def _project_file_context(self, rel: str) -> MigrationContext | str:
        """The analysis of another file of this file's project (the module holding the program's update, for
        ``--data-parallel auto``), or why there is none."""
        from ..syntax import native_parse

        path = os.path.join(self.project.index.root, rel)
        try:
            with open(path, "rb") as handle:
                module = native_parse.parse_module(handle.read())
        except (OSError, cst.ParserSyntaxError, RecursionError, MemoryError, ValueError):
            return f"{rel}, which holds the update, cannot be read or parsed"
        with walk.fast_visits():
            wrapper = cst.MetadataWrapper(module, unsafe_skip_copy=True)
            return MigrationContext(wrapper, self.target, distributed=True, data_parallel="xm",
                                    project=self.project.index.view(path))

    def set_rule_codes(self, codes: frozenset[str]) -> None:
        """The rules of this run, once the engine has chosen them (after the facts say whether the script
        already runs on XLA)."""
        self._rule_codes = codes

    def runs(self, code: str) -> bool:
        """The rule with this code is part of this run."""
        return self._rule_codes is None or code in self._rule_codes

    def on_live_cuda_path(self, node: cst.CSTNode) -> bool:
        """In a script that already runs on XLA, ``node`` is on a CUDA path it chooses at run time (under a
        CUDA gate, or outside the XLA branches of a file that tests whether it runs on XLA): that code runs
        on GPU hosts only, so it is left as it is (XLA900 reports it). Walked once, on the first question."""
        return self.facts.runs_on_xla and self.cuda_paths.on_cuda_path(node)

    @property
    def device_flow(self) -> DeviceFlow:
        """Where devices come from (options, config, conditionals) and whether one may be the CPU at run
        time (analysis/device_flow.py). Walked once, on the first question."""
        if self._device_flow is None:
            self._device_flow = DeviceFlow(self)
        return self._device_flow

    @property
    def import_time_device_is_lazy(self) -> bool:
        """The XLA device must not be made when the module is imported: the program launches worker
        processes (a distributed script or project: xmp.spawn refuses a runtime started before it), so a
        module-level device is the plain value ``torch.device("xla")``."""
        return self.distributed or (self.project is not None and self.project.distributed)

    @property
    def cuda_paths(self) -> CudaPaths:
        if self._cuda_paths is None:
            self._cuda_paths = collect_cuda_paths(self.module, self.qualnames, self.parent)
        return self._cuda_paths

    def once(self, key: object, compute: Callable[[], object]) -> object:
        """``compute()``, computed on the first ask for ``key`` in this file and kept: for an analysis that
        walks the whole module and that several rules (or one rule per node) ask for (issue 38)."""
        if key not in self._once:
            self._once[key] = compute()
        return self._once[key]

    # Metadata --------------------------------------------------------------------------------------------
    def qualnames(self, node: cst.CSTNode) -> frozenset[str]:
        """The node's qualified names (libcst's QualifiedNameProvider, by name), resolved on first ask."""
        names = self._qualnames.get(node)
        if names is None:
            names = self._qualified_names(node)
            if not names and self._torch_from_star_import() and isinstance(node, (cst.Name, cst.Attribute)):
                dotted = patterns.dotted_name(node)
                names = frozenset({dotted}) if dotted and dotted.split(".", 1)[0] == "torch" else names
            self._qualnames[node] = names
        return names

    def _torch_from_star_import(self) -> bool:
        """``from utils import *`` and no binding of ``torch`` in the file, which uses it: the star import is
        what binds ``torch`` (issue 29: the device line of such a script was left on CUDA, its loop on XLA)."""
        if self._star_torch is None:
            scope = self.scopes.get(self.module)
            self._star_torch = scope is not None and not scope.assignments["torch"] and any(
                isinstance(small, cst.ImportFrom) and isinstance(small.names, cst.ImportStar)
                for statement in self.module.body if isinstance(statement, cst.SimpleStatementLine)
                for small in statement.body)
        return self._star_torch

    def torch_names(self, node: cst.CSTNode) -> set[str]:
        """The qualified names of ``node`` in torch (``torch`` or ``torch.*``): ``qualnames`` filtered, without
        asking the scopes where none can be. A qualified name comes from an import binding the root of the
        node's dotted name, or is a local one: the binding's own dotted name under its scope's prefix
        (``f.<locals>.x``), in torch only for a root ``torch`` or a module-level non-import binding of
        ``torch`` (``def torch``). The rules that look for torch.cuda in every name and attribute ask this."""
        root = root_name(node)
        if root is None or not (root == "torch" or root in self.facts.import_bound_names
                                or self._binds_torch_locally()):
            return set()
        return {name for name in self.qualnames(node) if name == "torch" or name.startswith("torch.")}

    def torch_roots(self) -> frozenset[str] | None:
        """The first names a node must start with for ``torch_names`` to give anything (None: any name may,
        since the script binds ``torch`` itself)."""
        if self._binds_torch_locally():
            return None
        return frozenset({"torch", *self.facts.import_bound_names})

    def _binds_torch_locally(self) -> bool:
        if self._torch_bound_locally is None:
            scope = self.scopes.get(self.module)
            self._torch_bound_locally = scope is not None and any(
                not isinstance(assignment, ImportAssignment) for assignment in scope.assignments["torch"])
        return self._torch_bound_locally

    def is_call_to(self, node: cst.CSTNode, *names: str) -> bool:
        return isinstance(node, cst.Call) and not self.qualnames(node.func).isdisjoint(names)

    def position(self, node: cst.CSTNode) -> tuple[int, int]:
        """(line, column) where ``node`` starts, both from 1; (0, 0) for a node not in the input."""
        start = self._positions.start(node)
        return (start[0], start[1] + 1) if start is not None else (0, 0)

    def code_range(self, node: cst.CSTNode) -> CodeRange | None:
        """libcst's PositionProvider range of a node of the input (None for a node not in it)."""
        return self._positions.range(node)

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self._parents.get(node)

    def enclosing_statement(self, node: cst.CSTNode) -> Statement | None:
        """The statement (in a block or the module) that holds ``node``; None inside a one-line suite
        (``if x: y()``), where no statement can be inserted beside it."""
        current: cst.CSTNode | None = node
        while current is not None:
            parent = self.parent(current)
            if isinstance(current, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                return current
            if isinstance(current, cst.SimpleStatementSuite):
                return None
            current = parent
        return None

    def is_write_target(self, node: cst.CSTNode) -> bool:
        """``node`` is written, not read: an assignment, augmented-assignment, annotated, ``del``, ``for``,
        ``with ... as``, ``except ... as`` or walrus target, or an element of one (``a, b = ...``). The index of
        a subscript target and the object of an attribute target are reads (``x[i] = 1`` reads ``i``)."""
        current, parent = node, self.parent(node)
        while isinstance(parent, (cst.Element, cst.StarredElement, cst.Tuple, cst.List)):
            current, parent = parent, self.parent(parent)
        if isinstance(parent, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.Del, cst.For, cst.CompFor,
                               cst.NamedExpr)):
            return parent.target is current
        return isinstance(parent, cst.AsName) and parent.name is current

    def sole_if_around(self, statement: cst.BaseSmallStatement) -> cst.If | None:
        """The ``if`` (no ``else``, in a block or the module) whose whole body is this one statement, as in
        ``if clip: scaler.unscale_(opt)``: removing the statement may take the ``if`` with it."""
        line = self.parent(statement)
        owner = None
        if isinstance(line, cst.SimpleStatementSuite) and len(line.body) == 1:
            owner = self.parent(line)
        elif isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            block = self.parent(line)
            if isinstance(block, cst.IndentedBlock) and len(block.body) == 1:
                owner = self.parent(block)
        if (isinstance(owner, cst.If) and owner.orelse is None
                and isinstance(self.parent(owner), (cst.IndentedBlock, cst.Module))):
            return owner
        return None

    def function_scope(self, node: cst.CSTNode) -> Scope | None:
        """The function or module scope whose locals ``node`` sees (comprehensions and lambdas skipped)."""
        scope = self.scopes.get(node)
        while isinstance(scope, ComprehensionScope) or (
            isinstance(scope, FunctionScope) and isinstance(scope.node, cst.Lambda)
        ):
            scope = scope.parent
        return scope

    def visible_scopes(self, node: cst.CSTNode) -> list[Scope]:
        """Innermost first: the scopes a name used at ``node`` can resolve in (class bodies excluded)."""
        scopes: list[Scope] = []
        scope = self.scopes.get(node)
        while scope is not None:
            if not isinstance(scope, ClassScope):
                scopes.append(scope)
            if isinstance(scope, GlobalScope):
                break
            scope = scope.parent
        return scopes

    # Spelling the target's API ---------------------------------------------------------------------------
    def local_name(self, module: str, alias: str) -> str:
        """The name new code uses for ``module``, decided once per run: the script's own module-level import
        of it when nothing else in the script binds that name; else ``import module as alias`` is added, under
        another name (``xla_model``, ``xm_2``...) where ``alias`` means something else in the script
        (``xm = 3``, ``for pl in ...``). Added imports go after the script's leading imports, so a name the
        script binds only further down (in a ``try`` below the first use) is imported there too."""
        if module not in self._module_names:
            self._module_names[module] = self._choose_module_name(module, alias)
        return self._module_names[module]

    def imported_name(self, qualified: str) -> str | None:
        """The name the script's own ``from module import name`` among its leading imports binds for
        ``qualified`` (``contextlib.nullcontext``), when nothing else in the script binds that name; else
        None (new code then spells it through its module)."""
        for name, node in self.facts.module_imports.get(qualified, []):
            if (isinstance(node, cst.ImportFrom) and not self._name_taken(name, qualified)
                    and self._in_leading_imports(self._top_level_statement(node))):
                return name
        return None

    def _choose_module_name(self, module: str, alias: str) -> str:
        for name, node in self.facts.module_imports.get(module, []):
            if not self._name_taken(name, module):
                statement = self._top_level_statement(node)
                if not self._in_leading_imports(statement):
                    item = (module, None if name == module else name)
                    self.imports.add(item)
                    if self._runs_when_reached(node, statement):
                        self.late_imports.setdefault(item, statement)
                return name
        last = module.rsplit(".", 1)[-1]
        candidates = [alias, *([last] if last != alias else []), *(f"{alias}_{n}" for n in range(2, 100))]
        name = next(n for n in candidates if not self._name_taken(n, module))
        self.imports.add((module, None if name == module else name))
        return name

    def _name_taken(self, name: str, module: str) -> bool:
        """``name`` means something other than ``module`` somewhere in the script: bound in any function,
        class or comprehension, or at module level by anything but an import of ``module`` (or the fallback
        of a ``try`` importing it: ``except ImportError: xm = None``), read without a binding (a builtin, a
        star import), or chosen for another module in this run."""
        if name in self._module_names.values() or name in _BUILTIN_NAMES:
            return True
        for scope in self._all_scopes():
            for assignment in scope.assignments[name]:
                if not (isinstance(scope, GlobalScope) and self._binds_module(assignment.node, name, module)):
                    return True
            if any(not access.referents for access in scope.accesses[name]):
                return True
        return False

    def _binds_module(self, binding: cst.CSTNode, name: str, module: str) -> bool:
        imports = [node for local, node in self.facts.module_imports.get(module, []) if local == name]
        if binding in imports:
            return True
        handler = self._enclosing(binding, cst.ExceptHandler)
        trying = self.parent(handler) if handler is not None else None
        return trying is not None and any(self._enclosing(node, cst.Try) is trying for node in imports)

    def _enclosing(self, node: cst.CSTNode, kind: type) -> cst.CSTNode | None:
        current = self.parent(node)
        while current is not None and not isinstance(current, (kind, cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            current = self.parent(current)
        return current if isinstance(current, kind) else None

    def _runs_when_reached(self, node: cst.CSTNode, statement: cst.BaseStatement) -> bool:
        """The import runs whenever its top-level statement does: a plain import line, or one in the body of
        a ``try`` (not under an ``if``, in a handler or in a loop)."""
        if statement is self.parent(node):
            return True
        return (isinstance(statement, cst.Try) and self.parent(self.parent(node)) is statement.body
                and self.parent(self.parent(self.parent(node))) is statement)

    def _top_level_statement(self, node: cst.CSTNode) -> cst.BaseStatement:
        statement = node
        while self.parent(statement) is not self.module:
            statement = self.parent(statement)
        return statement

    def _in_leading_imports(self, statement: cst.BaseStatement) -> bool:
        """A statement of the module's leading imports, after which added imports go."""
        from .imports import insertion_index

        body = list(self.module.body)
        return patterns.is_import_line(statement) and body.index(statement) < insertion_index(body)

    def _all_scopes(self) -> list[Scope]:
        if self._scopes_list is None:
            self._scopes_list = list({id(s): s for s in self.scopes.values() if s is not None}.values())
        return self._scopes_list

    @property
    def device_words(self) -> str:
        """How messages name the device the output runs on: torch_xla's, or TorchTPU's accelerator."""
        return "accelerator device" if self.target.runtime == "torch_tpu" else "XLA device"

    def spell(self, concept: str, *args: str) -> str:
        """Code for a target concept, e.g. ``spell("optimizer_step", "opt")`` -> ``xm.optimizer_step(opt)``."""
        if self.spmd_form and concept in SPMD_CONCEPTS:
            concept = f"spmd_{concept}"
        template = self.target.spelling(concept).template
        self.concepts.add(concept)
        names = {
            placeholder: self.local_name(module, alias)
            for placeholder, (module, alias) in MODULE_PLACEHOLDERS.items()
            if "{" + placeholder + "}" in template
        }
        return template.format(*args, **names)

    def spell_expression(self, concept: str, *args: str) -> cst.BaseExpression:
        return patterns.parsed_expression(self.spell(concept, *args))

    def statement(self, code: str) -> cst.SimpleStatementLine:
        parsed = patterns.parsed_statement(code)
        assert isinstance(parsed, cst.SimpleStatementLine)
        return parsed

    # The device, as code a rule can use at a node ----------------------------------------------------------
    def device_reference(self, node: cst.CSTNode, code: str) -> str:
        """A name holding the XLA device where ``node`` is: the script's device variable when one is
        visible (``device``, a ``device`` parameter, ``self.device``), else ``device = <target device>``
        bound once at the top of the enclosing function (or after the imports), recorded under ``code``.
        Where the code runs when a function is defined (a default argument, a decorator) it is the plain
        value ``torch.device("xla")``, which starts no runtime, and so is a module-level binding in a program
        that launches worker processes (``import_time_device_is_lazy``)."""
        if self.evaluated_at_definition(node):
            return self.spell("lazy_device")
        own_scope = self.function_scope(node)
        for scope in self.visible_scopes(node):
            names = {n for n in self.facts.device_names.get(scope, set()) if self._usable(n, scope, own_scope, node)}
            bound = self._bound_devices.get(scope)
            # This run's own binding: from an outer scope only when the own scope does not bind that name too
            # (a later `device = ...` there makes it an unbound local up to that line).
            if bound is not None and (scope is own_scope or own_scope is None or not own_scope.assignments[bound]):
                names.add(bound)
            if names:
                return "device" if "device" in names else sorted(names)[0]
            # In a method, the instance's device comes before any module-level one.
            attribute = self._self_device_attribute(node) if scope is own_scope else None
            if attribute is not None:
                return attribute
        scope = self.function_scope(node)
        anchor = self._binding_anchor(scope) if scope is not None else None
        if scope is None or anchor is None or self._before_launch(scope):
            return self.spell("device")
        name = "device"
        while name in scope:
            name = "xla_" + name
        self._bound_devices[scope] = name
        lazy = isinstance(scope, GlobalScope) and self.import_time_device_is_lazy
        value = self.spell("lazy_device" if lazy else "device")
        statement = self.statement(f"{name} = {value}")
        where, anchor_statement = anchor
        target_list = self.edits.after if where == "after" else self.edits.before
        change = self.record_change(code, anchor_statement, f"bound the {self.device_words} once: {name} = {value}")
        target_list.setdefault(anchor_statement, []).append((change, [statement]))
        return name

    def _before_launch(self, scope: Scope) -> bool:
        """``scope`` is a function the launcher's process runs before it starts the workers: a device bound at
        its top would start the runtime there on every path, so each use spells the device itself (made only on
        the paths that used CUDA, as in the original)."""
        if not (self.import_time_device_is_lazy and isinstance(scope, FunctionScope)):
            return False
        before = self.once("functions_before_launch", lambda: functions_before_launch(
            self.module, self.qualnames, self.position))
        return scope.node in before  # type: ignore[operator]

    def evaluated_at_definition(self, node: cst.CSTNode) -> bool:
        """``node`` runs when its function or class is defined, at import for a module-level one: in a
        parameter's default or a decorator."""
        child, current = node, self.parent(node)
        while current is not None and not isinstance(current, (cst.IndentedBlock, cst.Module,
                                                                cst.SimpleStatementSuite, cst.Lambda)):
            if isinstance(current, cst.Param) and current.default is child:
                return True
            if isinstance(current, cst.Decorator):
                return True
            child, current = current, self.parent(current)
        return False

    def _usable(self, name: str, scope: Scope, own_scope: Scope | None, node: cst.CSTNode) -> bool:
        """A device variable of ``scope`` holds the device at ``node``. In the node's own scope: the binding
        of the name that comes last before the node is one that assigns a device (``device = None`` first,
        or ``x = batch.cuda()`` before ``x = torch.device(...)``, does not). From an outer scope: the own
        scope does not bind the name (a later ``device = ...`` makes it an unbound local up to there), and
        every binding of it there assigns a device (which one a call sees depends on when it runs)."""
        if own_scope is None:
            return True
        bindings = [a.node for a in scope.assignments[name] if isinstance(a.node, cst.CSTNode)]
        if scope is not own_scope:
            # A global bound only in the `__main__` block is not there when the module is imported (a library
            # class the script also runs): a function does not start to depend on it.
            guard = self.facts.main_guard
            if guard is not None and bindings and all(self._inside(b, guard) for b in bindings):
                return False
            return not own_scope.assignments[name] and all(b in self.facts.device_bindings for b in bindings)
        where = self._start(node)
        before = [(self._bound_at(b), b) for b in bindings]
        before = [(point, b) for point, b in before if point is not None and point <= where
                  and not self._in_sibling_branch(b, node)]
        if not before:
            return False
        last = max(before, key=lambda pair: pair[0])[1]
        return last in self.facts.device_bindings or self._other_branch_binds_device(last, bindings)

    def _inside(self, node: cst.CSTNode, outer: cst.CSTNode) -> bool:
        current: cst.CSTNode | None = node
        while current is not None and current is not outer:
            current = self.parent(current)
        return current is outer

    def _in_sibling_branch(self, binding: cst.CSTNode, node: cst.CSTNode) -> bool:
        """``binding`` is in one branch of an ``if`` and ``node`` in another: it never reaches ``node``
        (issue 29: ``model.to(device_id)`` in the ``else`` of the ``if`` that bound ``device_id``)."""
        child, current = binding, self.parent(binding)
        while current is not None and not isinstance(current, (cst.FunctionDef, cst.ClassDef, cst.Module)):
            if isinstance(current, cst.If):
                towards = self._child_towards(node, current)
                if towards is not None and child is not current.test and towards not in (child, current.test):
                    return True
            child, current = current, self.parent(current)
        return False

    def _other_branch_binds_device(self, binding: cst.CSTNode, bindings: list[cst.CSTNode]) -> bool:
        """``binding`` is in a branch of an ``if`` or ``try`` another branch of which assigns the device: the
        CPU fallback (``if torch.cuda.is_available(): device = torch.device("cuda") else: device = "cpu"``),
        which one reaches the use depends on the run, as it did before the migration."""
        devices = [b for b in bindings if b in self.facts.device_bindings]
        child, current = binding, self.parent(binding)
        while current is not None and not isinstance(current, (cst.FunctionDef, cst.ClassDef, cst.Module)):
            if isinstance(current, (cst.If, cst.Try)):
                for device in devices:
                    branch = self._child_towards(device, current)
                    if branch is not None and branch is not child:
                        return True
            child, current = current, self.parent(current)
        return False

    def _child_towards(self, node: cst.CSTNode, ancestor: cst.CSTNode) -> cst.CSTNode | None:
        """The child of ``ancestor`` that holds ``node`` (None when ``node`` is not below it)."""
        child, current = node, self.parent(node)
        while current is not None and current is not ancestor:
            child, current = current, self.parent(current)
        return child if current is ancestor else None

    def _start(self, node: cst.CSTNode) -> tuple[int, int]:
        return self._positions.start(node) or (0, 0)

    def _bound_at(self, binding: cst.CSTNode) -> tuple[int, int] | None:
        """Where a binding takes effect: after the value of an assignment (``x = f(x)`` reads the old
        ``x``), at the start of the function for a parameter, after the target elsewhere (``for``, ``with``)."""
        if isinstance(binding, cst.Param):
            return (0, 0)
        current: cst.CSTNode | None = binding
        while current is not None and not isinstance(current, (cst.BaseSmallStatement, cst.NamedExpr,
                                                                 cst.BaseCompoundStatement, cst.CompFor)):
            current = self.parent(current)
        if not isinstance(current, (cst.Assign, cst.AnnAssign, cst.AugAssign, cst.NamedExpr)):
            current = binding
        return self._positions.end(current)

    def _self_device_attribute(self, node: cst.CSTNode) -> str | None:
        scope = self.function_scope(node)
        if not isinstance(scope, FunctionScope) or not isinstance(scope.node, cst.FunctionDef):
            return None
        params = scope.node.params.params
        if not params or not isinstance(scope.parent, ClassScope):
            return None
        attribute = self.facts.class_device_attrs.get(scope.parent.node)
        return f"{params[0].name.value}.{attribute}" if attribute else None

    def _binding_anchor(self, scope: Scope) -> tuple[str, Statement] | None:
        """Where a scope's device binding goes: before its first statement (after a docstring or the
        module's imports). None for one-line function bodies, which have no room for it."""
        if isinstance(scope, GlobalScope):
            body = list(self.module.body)
            for statement in body:
                if not (patterns.is_docstring(statement) or patterns.is_import_line(statement)
                        or patterns.is_ipython_placeholder(statement)):
                    return "before", statement
            return ("after", body[-1]) if body else None
        if isinstance(scope, FunctionScope) and isinstance(scope.node, cst.FunctionDef):
            block = scope.node.body
            if not isinstance(block, cst.IndentedBlock):
                return None
            first = block.body[0]
            if patterns.is_docstring(first):
                return "after", first
            return "before", first
        return None

    @property
    def ddp_form(self) -> bool:
        """A distributed migration in the ddp form: torch.distributed stays, on the xla backend."""
        return self.distributed and self.data_parallel == "ddp"

    @property
    def xm_form(self) -> bool:
        """A distributed migration in the xm form (the seeds' recipe)."""
        return self.distributed and self.data_parallel == "xm"

    @property
    def spmd_form(self) -> bool:
        """A distributed migration in the spmd form (DESIGN.md section 9): one program per host over a device
        mesh, no DDP, no process group, no launcher."""
        return self.distributed and self.data_parallel == "spmd"

    @property
    def xla_launched(self) -> bool:
        """The XLA launcher starts the workers (``xmp.spawn`` / ``torch_xla.launch``), so torchrun's variables
        are unset there and ranks come from the XLA runtime: the xm form, and the ddp form of a target
        without ``xla://`` (the 1.13 API: the group is joined with the XLA ordinals). The spmd form runs one
        process per host, its ranks from the runtime too (process index and count)."""
        return self.xm_form or self.spmd_form or (self.ddp_form and not self.target.torchrun_rendezvous)

    # Recording -------------------------------------------------------------------------------------------
    def record_change(self, code: str, node: cst.CSTNode, message: str) -> Change:
        line, column = self.position(node)
        change = Change(line, column, code, message, None, *self._end(node))
        self.changes.append(change)
        return change

    def withdraw(self, change: Change, message: str, fix: str, code: str | None = None) -> None:
        """Take an edit's change record back out of the report (it was not applied) and report instead
        what a person has to do."""
        self.changes = [c for c in self.changes if c is not change]
        self.findings.append(Finding(change.line, change.column, code or change.code, message, fix, None,
                                     change.end_line, change.end_column))

    def record_finding(self, code: str, node: cst.CSTNode, message: str, fix: str = "") -> None:
        line, column = self.position(node)
        self.findings.append(Finding(line, column, code, message, fix, None, *self._end(node)))

    def _end(self, node: cst.CSTNode) -> tuple[int, int]:
        """(line, 1-based column just past the node) where it ends in the input; (0, 0) if not in it."""
        end = self._positions.end(node)
        return (end[0], end[1] + 1) if end is not None else (0, 0)
