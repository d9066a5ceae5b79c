"""Name resolution: libcst's ScopeProvider and ExpressionContextProvider, computed without their visitors.

libcst builds the scopes with a ``CSTVisitor`` (``ScopeVisitor``) that runs on top of a second one
(``ExpressionContextVisitor``, run as a batched provider). Both pay for the generic traversal on every node
(the name-built ``visit_<Type>`` lookups, and attribute hooks on every field, since ``ScopeVisitor`` defines
``visit_ClassDef_bases``) and were a fifth of the pipeline. Here the same two computations are direct walks
that call the same hooks in the same order on the same nodes, and build libcst's own objects (its ``Scope``
classes, ``Access``, the assignments) through libcst's own methods, so everything that reads them (rules,
facts, ``get_qualified_names_for``) gets what libcst would give.

``resolve_scopes`` stores both mappings in the ``MetadataWrapper``'s cache, where libcst keeps what it has
computed, so a later ``wrapper.resolve`` of either provider returns them instead of computing them again.
tests/test_scopes.py checks, node for node and scope for scope, that the results equal libcst's: a libcst
release that changes its visitors must fail there.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Mapping
from types import MappingProxyType

import libcst as cst
from libcst._nodes.base import CSTNode
from libcst.helpers import get_full_name_for_node
from libcst.metadata import ExpressionContext, ExpressionContextProvider, ScopeProvider
from libcst.metadata.scope_provider import (
    _ASSIGNMENT_LIKE_NODES,
    Access,
    AnnotationScope,
    Assignment,
    BaseAssignment,
    BuiltinAssignment,
    ClassScope,
    ComprehensionScope,
    FunctionScope,
    GlobalScope,
    ImportAssignment,
    Scope,
    _gen_dotted_names,
    _is_assignment,
)

# A child field's value by its type (the walk's table): a node, a sequence of nodes, or neither.
from ..syntax.walk import _NODE, _OTHER, _SEQUENCE, _kind, _value_kinds, _value_kinds_without_layout, child_fields

_LOAD, _STORE, _DEL = ExpressionContext.LOAD, ExpressionContext.STORE, ExpressionContext.DEL


def resolve_scopes(wrapper: cst.MetadataWrapper) -> Mapping[CSTNode, Scope | None]:
    """``wrapper.resolve(ScopeProvider)``, computed here, cached in the wrapper as libcst caches it (with
    its ExpressionContextProvider dependency)."""
    cache = wrapper._metadata
    if ScopeProvider not in cache:
        module = wrapper.module
        if ExpressionContextProvider not in cache:
            cache[ExpressionContextProvider] = MappingProxyType(expression_contexts(module))
        parts: dict = {}
        cache[ScopeProvider] = MappingProxyType(scopes(module, cache[ExpressionContextProvider], parts))
        cache[_SharedReferents] = parts
    return cache[ScopeProvider]


def referent_parts(wrapper: cst.MetadataWrapper) -> dict:
    """How each shared referent set was made (``_SharedReferents``), for ``QualifiedNames``; empty when
    the scopes came from libcst itself."""
    return wrapper._metadata.get(_SharedReferents, {})


# -- ExpressionContextProvider ------------------------------------------------------------------------------
# libcst's ExpressionContextVisitor, case by case: each node type's handler says which children it visits
# and in which context (``node.visit(ExpressionContextVisitor(STORE))`` becomes a STORE entry on the stack).
# A node type without a handler visits all its children in the context it was reached in. Each node is
# reached once, so the order of the walk does not change the mapping.

def expression_contexts(module: cst.Module) -> dict[CSTNode, ExpressionContext]:
    """What ``wrapper.resolve(ExpressionContextProvider)`` gives, as a dict."""
    found: dict[CSTNode, ExpressionContext] = {}
    stack: list[tuple[CSTNode, ExpressionContext]] = [(module, _LOAD)]
    handlers = _CONTEXT_HANDLERS
    push = stack.append
    kinds = _value_kinds_without_layout  # layout nodes hold no names
    while stack:
        node, context = stack.pop()
        node_type = type(node)
        if node_type is cst.Name:
            found[node] = context
            continue
        handler = handlers.get(node_type)
        if handler is not None:
            if handler(node, context, found, push):
                continue
        for field, _ in child_fields(node_type):
            value = getattr(node, field)
            kind = kinds.get(type(value)) or _kind(type(value), kinds)
            if kind == _NODE:
                push((value, context))
            elif kind == _SEQUENCE:
                for child in value:
                    if (kinds.get(type(child)) or _kind(type(child), kinds)) != _OTHER:
                        push((child, context))
    return found


# A handler returns True when it has dealt with the children itself (libcst's visit_* returned False).

def _ctx_assign(node, context, found, push):
    for target in node.targets:
        push((target, _STORE))
    push((node.value, context))
    return True


def _ctx_ann_assign(node, context, found, push):
    push((node.target, _STORE))
    push((node.annotation, context))
    if node.value:
        push((node.value, context))
    return True


def _ctx_target_value(node, context, found, push):  # AugAssign, NamedExpr
    push((node.target, _STORE))
    push((node.value, context))
    return True


def _ctx_as_name(node, context, found, push):
    push((node.name, _STORE))
    return True


def _ctx_comp_for(node, context, found, push):
    push((node.target, _STORE))
    push((node.iter, context))
    for condition in node.ifs:
        push((condition, context))
    if node.inner_for_in:
        push((node.inner_for_in, context))
    return True


def _ctx_for(node, context, found, push):
    push((node.target, _STORE))
    push((node.iter, context))
    push((node.body, context))
    if node.orelse:
        push((node.orelse, context))
    return True


def _ctx_del(node, context, found, push):
    push((node.target, _DEL))
    return True


def _ctx_attribute(node, context, found, push):
    found[node] = context
    push((node.value, _LOAD))  # not attr: libcst gives attribute names no context, as ast does
    return True


def _ctx_subscript(node, context, found, push):
    found[node] = context
    push((node.value, _LOAD))
    sliced = node.slice
    if isinstance(sliced, (tuple, list)):
        for element in sliced:
            push((element, _LOAD))
    else:
        push((sliced, _LOAD))
    return True


def _ctx_collection(node, context, found, push):  # Tuple, List, StarredElement: their children as well
    found[node] = context
    return False


def _ctx_class(node, context, found, push):
    push((node.name, _STORE))
    push((node.body, context))
    for child in (*node.bases, *node.keywords, *node.decorators):
        push((child, context))
    return True


def _ctx_function(node, context, found, push):  # not type_parameters: libcst's visitor skips them
    push((node.name, _STORE))
    push((node.params, context))
    push((node.body, context))
    for decorator in node.decorators:
        push((decorator, context))
    if node.returns:
        push((node.returns, context))
    return True


def _ctx_param(node, context, found, push):
    push((node.name, _STORE))
    if node.annotation:
        push((node.annotation, context))
    if node.default:
        push((node.default, context))
    return True


_CONTEXT_HANDLERS = {
    cst.Assign: _ctx_assign, cst.AnnAssign: _ctx_ann_assign, cst.AugAssign: _ctx_target_value,
    cst.NamedExpr: _ctx_target_value, cst.AsName: _ctx_as_name, cst.CompFor: _ctx_comp_for,
    cst.For: _ctx_for, cst.Del: _ctx_del, cst.Attribute: _ctx_attribute, cst.Subscript: _ctx_subscript,
    cst.Tuple: _ctx_collection, cst.List: _ctx_collection, cst.StarredElement: _ctx_collection,
    cst.ClassDef: _ctx_class, cst.FunctionDef: _ctx_function, cst.Param: _ctx_param,
}


# -- ScopeProvider ------------------------------------------------------------------------------------------

def scopes(module: cst.Module, contexts: Mapping[CSTNode, ExpressionContext],
           parts: dict | None = None) -> dict[CSTNode, Scope | None]:
    """What ``wrapper.resolve(ScopeProvider)`` gives, as a dict in the same order, given the module's
    expression contexts. ``parts`` receives how each shared referent set was made (``_SharedReferents``)."""
    builder = _ScopeBuilder(contexts)
    builder.visit(module)
    builder.infer_accesses(parts if parts is not None else {})
    return builder.found


class _ScopeBuilder:
    """libcst's ScopeVisitor (libcst/metadata/scope_provider.py), method for method: ``visit`` is its
    ``node.visit(self)`` (the ``visit_<Type>`` hook, the children unless the hook returned False, then its
    ``on_leave``), the hooks are its ``visit_*``/``leave_*`` methods. Its attribute hooks
    (``visit_ClassDef_bases``) never run: ``visit_ClassDef`` visits a class's parts itself."""

    def __init__(self, contexts: Mapping[CSTNode, ExpressionContext]) -> None:
        self.contexts = contexts
        self.scope: Scope = GlobalScope()
        self.found: dict[CSTNode, Scope | None] = {}
        # (access, enclosing top-level attribute, enclosing string annotation), resolved at the end
        self.deferred: list[tuple[Access, cst.Attribute | None, cst.BaseString | None]] = []
        self.top_level_attribute: list[cst.Attribute | None] = [None]
        self.in_annotation: list[bool] = [False]
        self.in_type_hint: list[bool] = [False]
        self.in_ignored_subscript: set[cst.Subscript] = set()
        self.last_string_annotation: cst.BaseString | None = None
        # libcst's get_qualified_names_for, without a walk of every binding of a name per question
        self.qualified_names = QualifiedNames(self.found, growing=True)

    def visit(self, node: CSTNode) -> None:
        node_type = type(node)
        visit, leave, assignment_like, fields = _HOOKS.get(node_type) or _hooks(node_type)
        if visit is None or visit(self, node) is not False:
            for field in fields:
                value = getattr(node, field)
                kind = _value_kinds.get(type(value)) or _kind(type(value))
                if kind == _NODE:
                    self.visit(value)
                elif kind == _SEQUENCE:
                    for child in value:
                        self.visit(child)
        scope = self.scope
        self.found[node] = scope
        if assignment_like:
            scope._assignment_count += 1
        if leave is not None:
            leave(self, node)

    # The hooks, in the order of libcst's ScopeVisitor.

    def _visit_import_alike(self, node: cst.Import | cst.ImportFrom) -> bool:
        names = node.names
        if isinstance(names, cst.ImportStar):
            return False
        scope = self.scope
        for name in names:
            self.found[name] = scope
            asname = name.asname
            if asname is not None:
                name_values = _gen_dotted_names(cst.ensure_type(asname.name, cst.Name))
                import_node_asname = asname.name
            else:
                name_values = _gen_dotted_names(name.name)
                import_node_asname = name.name
            for name_value, _ in name_values:
                scope.record_import_assignment(name_value, node, import_node_asname)
        return False

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        stack = self.top_level_attribute
        if stack[-1] is None:
            stack[-1] = node
        self.visit(node.value)  # explicitly not visiting attr
        if stack[-1] is node:
            stack[-1] = None
        return False

    def visit_Call(self, node: cst.Call) -> bool:
        self.top_level_attribute.append(None)
        self.in_type_hint.append(False)
        qnames = self.qualified_names.names_in(self.scope, node)
        if "typing.NewType" in qnames or "typing.TypeVar" in qnames:
            self.visit(node.func)
            self.in_type_hint[-1] = True
            for arg in node.args[1:]:
                self.visit(arg)
            return False
        if "typing.cast" in qnames:
            self.visit(node.func)
            if len(node.args) > 0:
                self.in_type_hint.append(True)
                self.visit(node.args[0])
                self.in_type_hint.pop()
                for arg in node.args[1:]:
                    self.visit(arg)
            return False
        return True

    def leave_Call(self, node: cst.Call) -> None:
        self.top_level_attribute.pop()
        self.in_type_hint.pop()

    def visit_Annotation(self, node: cst.Annotation) -> None:
        self.in_annotation.append(True)

    def leave_Annotation(self, node: cst.Annotation) -> None:
        self.in_annotation.pop()

    def visit_SimpleString(self, node: cst.SimpleString) -> bool:
        self._handle_string_annotation(node)
        return False

    def visit_ConcatenatedString(self, node: cst.ConcatenatedString) -> bool:
        return not self._handle_string_annotation(node)

    def _handle_string_annotation(self, node: cst.SimpleString | cst.ConcatenatedString) -> bool:
        """Whether it handled the string as an annotation (parsed it and visited its names)."""
        if (self.in_type_hint[-1] or self.in_annotation[-1]) and not self.in_ignored_subscript:
            value = node.evaluated_value
            if value:
                top_level_annotation = self.last_string_annotation is None
                if top_level_annotation:
                    self.last_string_annotation = node
                try:
                    self.visit(cst.parse_module(value))
                except cst.ParserSyntaxError:
                    pass  # as libcst (and CPython) do: an annotation that does not parse names nothing
                if top_level_annotation:
                    self.last_string_annotation = None
                return True
        return False

    def visit_Subscript(self, node: cst.Subscript) -> None:
        in_type_hint = False
        if isinstance(node.value, cst.Name):
            qnames = self.qualified_names.names_in(self.scope, node.value)
            if any(qn.startswith(("typing.", "typing_extensions.")) for qn in qnames):
                in_type_hint = True
            if "typing.Literal" in qnames or "typing_extensions.Literal" in qnames:
                self.in_ignored_subscript.add(node)
        self.in_type_hint.append(in_type_hint)

    def leave_Subscript(self, node: cst.Subscript) -> None:
        self.in_type_hint.pop()
        self.in_ignored_subscript.discard(node)

    def visit_Name(self, node: cst.Name) -> None:
        # not every Name has an expression context (an attribute's name, a keyword's)
        context = self.contexts.get(node)
        if context is _STORE:
            self.scope.record_assignment(node.value, node)
        else:
            access = Access(node, self.scope, is_annotation=self.in_annotation[-1],
                            is_type_hint=self.in_type_hint[-1])
            self.deferred.append((access, self.top_level_attribute[-1], self.last_string_annotation))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        outer = self.scope
        outer.record_assignment(node.name.value, node)
        self.found[node.name] = outer
        if node.type_parameters:
            self.scope = AnnotationScope(outer, node, None)
            self.visit(node.type_parameters)
        enclosing = self.scope
        self.scope = FunctionScope(enclosing, node, get_full_name_for_node(node.name))
        self.visit(node.params)
        self.visit(node.body)
        self.scope = enclosing
        for decorator in node.decorators:
            self.visit(decorator)
        if node.returns:
            self.visit(node.returns)
        self.scope = outer
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        outer = self.scope
        self.scope = FunctionScope(outer, node)
        self.visit(node.params)
        self.visit(node.body)
        self.scope = outer
        return False

    def visit_Param(self, node: cst.Param) -> bool:
        scope = self.scope
        scope.record_assignment(node.name.value, node)
        self.found[node.name] = scope
        self.scope = scope.parent
        for field in (node.default, node.annotation):
            if field:
                self.visit(field)
        self.scope = scope
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        # An argument's keyword is neither an assignment nor an access: not visited.
        if node.value:
            self.visit(node.value)
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        outer = self.scope
        outer.record_assignment(node.name.value, node)
        self.found[node.name] = outer
        for decorator in node.decorators:
            self.visit(decorator)
        if node.type_parameters:
            self.scope = AnnotationScope(outer, node, None)
            self.visit(node.type_parameters)
        for base in node.bases:
            self.visit(base)
        for keyword in node.keywords:
            self.visit(keyword)
        enclosing = self.scope
        self.scope = ClassScope(enclosing, node, get_full_name_for_node(node.name))
        for statement in node.body.body:
            self.visit(statement)
        self.scope = outer
        return False

    def visit_Global(self, node: cst.Global) -> bool:
        for name_item in node.names:
            self.scope.record_global_overwrite(name_item.name.value)
        return False

    def visit_Nonlocal(self, node: cst.Nonlocal) -> bool:
        for name_item in node.names:
            self.scope.record_nonlocal_overwrite(name_item.name.value)
        return False

    def _visit_comp_alike(self, node: cst.ListComp | cst.SetComp | cst.DictComp | cst.GeneratorExp) -> bool:
        # The first iterable is evaluated outside the comprehension's scope, the rest inside it.
        for_in = node.for_in
        self.visit(for_in.iter)
        outer = self.scope
        self.found[for_in] = outer
        self.scope = ComprehensionScope(outer, node)
        self.visit(for_in.target)
        self.scope._assignment_count += 1  # what follows can refer to the target
        for condition in for_in.ifs:
            self.visit(condition)
        if for_in.inner_for_in:
            self.visit(for_in.inner_for_in)
        if isinstance(node, cst.DictComp):
            self.visit(node.key)
            self.visit(node.value)
        else:
            self.visit(node.elt)
        self.scope = outer
        return False

    def visit_For(self, node: cst.For) -> bool:
        self.visit(node.target)
        self.scope._assignment_count += 1
        for child in (node.iter, node.body, node.orelse, node.asynchronous):
            if child is not None:
                self.visit(child)
        return False

    def visit_TypeAlias(self, node: cst.TypeAlias) -> bool:
        outer = self.scope
        outer.record_assignment(node.name.value, node)
        self.scope = AnnotationScope(outer, node, None)
        if node.type_parameters is not None:
            self.visit(node.type_parameters)
        self.visit(node.value)
        self.scope = outer
        return False

    def visit_TypeVar(self, node: cst.TypeVar) -> bool:
        self.scope.record_assignment(node.name.value, node)
        if node.bound is not None:
            self.visit(node.bound)
        return False

    def visit_TypeVarTuple(self, node: cst.TypeVarTuple) -> bool:
        self.scope.record_assignment(node.name.value, node)
        return False

    def visit_ParamSpec(self, node: cst.ParamSpec) -> bool:
        self.scope.record_assignment(node.name.value, node)
        return False

    def infer_accesses(self, parts: dict) -> None:
        """libcst's ScopeVisitor.infer_accesses: each access's name (the longest dotted prefix of its
        attribute chain that the scope knows), its referents, and the assignments' references (batched per
        scope and name)."""
        scope_name_accesses: dict[tuple[Scope, str], set[Access]] = defaultdict(set)
        referents = _SharedReferents(parts)
        for access, enclosing_attribute, enclosing_string_annotation in self.deferred:
            name = cst.ensure_type(access.node, cst.Name).value
            if enclosing_attribute is not None:
                for attr_name, node in _gen_dotted_names(enclosing_attribute):
                    if attr_name in access.scope:
                        access.node = node
                        name = attr_name
                        break
            if enclosing_string_annotation is not None:
                access.node = enclosing_string_annotation
            scope_name_accesses[(access.scope, name)].add(access)
            referents.record(access, name)
            access.scope.record_access(name, access)
        for (scope, name), accesses in scope_name_accesses.items():
            _PendingReferences.record(scope, name, accesses)
        self.deferred = []


class _PendingReferences:
    """libcst's last step of ``infer_accesses``, ``assignment.record_accesses(accesses)`` for every assignment
    a group of accesses (one scope, one name) may read, done when an assignment's ``references`` is first read.

    Done for every assignment, it grew with the square of the input: each binding of a name holds every later
    access of it, so a file concatenated from scripts with 322 ``import torch`` lines held 322 copies of
    every access of ``torch`` (2.37 million entries in 5 MB of real scripts), and the rules read the references
    of a few assignments (issue 38). Here each group is kept once, on the scope that holds the assignments it
    reads (``scope.__dict__[_PENDING]``: name -> the groups), and ``references`` (``_references`` below, in
    place of libcst's property) fills an assignment's set from them the first time it is read, with what
    ``record_accesses`` would have added: from another scope, every access of the group; from the same scope,
    the accesses after the assignment. What ``record_accesses`` hands on, the accesses of a local scope before
    its assignments, goes to the parent scope's assignments of the name as libcst's does, as a group of its
    own (read from another scope: all of it). tests/test_scopes.py checks every assignment's references
    against libcst's."""

    @staticmethod
    def record(scope: Scope, name: str, accesses: set[Access]) -> None:
        assignments = scope._resolve_scope_for_access(name, scope)
        if not assignments:
            return
        owner = next(iter(assignments)).scope  # a name's assignments are all of the scope that holds them
        if owner != scope:
            _PendingReferences._keep(owner, name, (accesses, None, None))
            return
        ordered = sorted(accesses, key=lambda access: access._index)
        indexes = [access._index for access in ordered]
        _PendingReferences._keep(owner, name, (accesses, indexes, ordered))
        # record_accesses hands each assignment's earlier accesses to the parent scope's assignments of the
        # name; together, the accesses up to the last assignment (libcst asks the parent once per assignment)
        last = max(assignment._index for assignment in assignments)
        earlier = ordered[:bisect_right(indexes, last)]
        if earlier and scope.parent != scope:
            shadowed = scope.parent[name]
            if shadowed:
                _PendingReferences._keep(next(iter(shadowed)).scope, name, (set(earlier), None, None))

    @staticmethod
    def _keep(owner: Scope, name: str, group: tuple) -> None:
        pending = owner.__dict__.get(_PENDING)
        if pending is None:
            pending = owner.__dict__[_PENDING] = {}
        pending.setdefault(name, []).append(group)

    @staticmethod
    def fill(assignment, pending: dict) -> None:
        groups = pending.get(assignment.name)
        if not groups or assignment.__dict__.get(_PENDING):
            return
        assignment.__dict__[_PENDING] = True
        references = assignment._BaseAssignment__accesses
        for accesses, indexes, ordered in groups:
            if indexes is None:
                references |= accesses
            else:
                references.update(ordered[bisect_right(indexes, assignment._index):])


_PENDING = "_xla_migrate_pending_references"
_libcst_references = BaseAssignment.references


def _references(self):
    """libcst's ``BaseAssignment.references``, its pending groups added first (``_PendingReferences``)."""
    pending = self.scope.__dict__.get(_PENDING)
    if pending is not None:
        _PendingReferences.fill(self, pending)
    return self._BaseAssignment__accesses


_references.__doc__ = (_libcst_references.__doc__ or "") + "\n\n" + (_references.__doc__ or "")
BaseAssignment.references = property(_references)


class _SharedReferents:
    """``Access.record_assignments``, with the sets shared. libcst gives each access its own set of the
    assignments it may read: the name's assignments in the scope that binds it, less those of the access's
    own scope that come after it. Built per access, that is a copy of every binding of the name each time:
    a file with 1,000 ``import torch`` lines copied 1,000 assignments per access of ``torch``, and every
    question about its qualified names walked them again (issue 38). Accesses with the same answer (the
    same set of assignments, the same count of own-scope assignments before them) now hold one set object,
    equal to what libcst builds, so the sets are built once and what is computed from one can be cached by
    its identity. No one adds to an access's referents after this (libcst does not; nor does any rule)."""

    def __init__(self, parts: dict) -> None:
        # (scope, id of the name's assignment set) -> (the set, other-scope assignments, own-scope indexes
        # sorted, own-scope assignments in that order, {count before: shared set}, the set's size)
        self.groups: dict[tuple[Scope, int], tuple] = {}
        # id of a shared set -> (the set, its group, how many of the group's own-scope assignments it has)
        self.parts = parts
        # id of a name's assignment set -> (the set, its size, the shared set of all of them)
        self.whole: dict[int, tuple] = {}

    def record(self, access: Access, name: str) -> None:
        scope = access.scope
        assignments = scope._resolve_scope_for_access(name, scope)
        key = (scope, id(assignments))
        group = self.groups.get(key)
        if group is None or group[0] is not assignments or group[5] != len(assignments):
            if scope._assignments.get(name) is not assignments:
                # the set of an enclosing scope: every assignment in it is that scope's (no copy)
                group = (assignments, assignments, [], [], {}, len(assignments))
                self.groups[key] = group
        if group is None or group[0] is not assignments or group[5] != len(assignments):
            others = [a for a in assignments if a.scope != scope]
            own = sorted((a for a in assignments if a.scope == scope), key=lambda a: a._index)
            group = (assignments, others, [a._index for a in own], own, {}, len(assignments))
            self.groups[key] = group
        _, others, indexes, own, shared, _ = group
        before = bisect_left(indexes, access._index)
        if (not others and not before) or access.referents:
            # Nothing before it in the scope (libcst then looks in the parent scope), or a set already
            # started: libcst's own method, as it is.
            access.record_assignments(name)
            return
        chosen = shared.get(before)
        if chosen is None and not own:
            # every assignment, from whichever scope reads them: one set for all those scopes
            whole = self.whole.get(id(assignments))
            if whole is not None and whole[0] is assignments and whole[1] == len(assignments):
                chosen = shared[before] = whole[2]
        if chosen is None:
            # built as libcst builds it
            index = access._index
            chosen = shared[before] = set()
            chosen |= {a for a in assignments if a.scope != scope or a._index < index}
            self.parts[id(chosen)] = (chosen, group, before)
            if not own:
                self.whole[id(assignments)] = (assignments, len(assignments), chosen)
        access._Access__assignments = chosen


_builder_hooks = {
    cst.Import: _ScopeBuilder._visit_import_alike, cst.ImportFrom: _ScopeBuilder._visit_import_alike,
    cst.ListComp: _ScopeBuilder._visit_comp_alike, cst.SetComp: _ScopeBuilder._visit_comp_alike,
    cst.DictComp: _ScopeBuilder._visit_comp_alike, cst.GeneratorExp: _ScopeBuilder._visit_comp_alike,
}
# node type -> (visit hook, leave hook, assignment-like, child fields), filled per type on first sight
_HOOKS: dict[type, tuple] = {}


def _hooks(node_type: type) -> tuple:
    """libcst dispatches ``visit_<Type>``/``leave_<Type>`` by the type's name."""
    name = node_type.__name__
    visit = _builder_hooks.get(node_type) or getattr(_ScopeBuilder, f"visit_{name}", None)
    leave = getattr(_ScopeBuilder, f"leave_{name}", None)
    hooks = (visit, leave, issubclass(node_type, _ASSIGNMENT_LIKE_NODES),
             tuple(field for field, _ in child_fields(node_type)))
    _HOOKS[node_type] = hooks
    return hooks


# Sets of at most this many assignments are answered by libcst's own loop, without tables.
_FEW = 8


class QualifiedNames:
    """``{q.name for q in scope.get_qualified_names_for(node)}`` for any node, as libcst computes it, with
    what does not depend on the node computed once per module.

    libcst answers each question by walking every binding of the name: the referents of an access, or
    every assignment of the longest dotted prefix the scope knows, each asked for its names again. With a
    name bound many times (a file concatenated from scripts has hundreds of ``import torch``), each question
    cost as many steps as there are bindings, and the pipeline asks for every name and attribute (issue 38).
    Here: an access's answer is cached by its referent set (shared, see ``_SharedReferents``); a non-access
    node's by the set of assignments and its dotted name, over the distinct kinds of assignment in the set
    (1,000 ``import torch`` statements answer alike: one asked); which assignment is a node's own (libcst's
    ``_is_assignment``, which then answers alone) comes from an index of the set built once."""

    def __init__(self, scopes: Mapping[CSTNode, Scope | None], parts: dict | None = None,
                 growing: bool = False) -> None:
        # growing: asked while the scopes are being built (libcst's ScopeVisitor asks of calls and
        # subscripts), when a name's assignments may still grow: nothing is kept past a change of a set.
        self.scopes = scopes
        self.growing = growing
        self._by_referents: dict[int, tuple[object, frozenset[str]]] = {}
        self._kinds: dict[int, tuple[object, int, list, dict]] = {}
        self._kind_cache: dict[int, tuple[object, tuple]] = {}
        self._by_name: dict[tuple[int, str], tuple[int, frozenset[str]]] = {}
        self._parts = parts or {}
        # per referent group (see _SharedReferents): its other-scope assignments' names, and the names of
        # its first i own-scope assignments for each i asked so far
        self._others: dict[int, frozenset[str]] = {}
        self._own: dict[int, list[frozenset[str]]] = {}

    def __call__(self, node: CSTNode) -> frozenset[str]:
        return self.names_in(self.scopes.get(node), node)

    def names_in(self, scope: Scope | None, node: CSTNode) -> frozenset[str]:
        if not scope:
            return frozenset()
        accesses = scope._accesses_by_node.get(node)
        if accesses:
            names: set[str] = set()
            for access in accesses:
                names |= self._referent_names(access.referents)
            return frozenset(names)
        full_name = get_full_name_for_node(node)
        if full_name is None:
            return frozenset()
        assignments = self._assignments(scope, full_name)
        if not assignments:
            return frozenset()
        if len(assignments) <= _FEW:
            # libcst's own loop: tables for every small set cost more memory than the loop costs time
            for assignment in assignments:
                if isinstance(assignment, Assignment) and _is_assignment(node, assignment.node):
                    return frozenset(q.name for q in assignment.get_qualified_names_for(full_name))
            return frozenset(q.name for assignment in assignments
                             for q in assignment.get_qualified_names_for(full_name))
        _, _, kinds, own = self._kinds_of(assignments)
        mine = own.get(id(node))
        if mine is not None and mine[0] is node:
            return frozenset(q.name for q in mine[1].get_qualified_names_for(full_name))
        key = (id(assignments), full_name)
        cached = self._by_name.get(key)
        # The answer depends on the set's kinds only, and a set only grows: while the scopes are built, a new
        # binding of a kind already there (the next ``import torch``) leaves it as it was.
        if cached is None or cached[0] != len(kinds):
            cached = self._by_name[key] = (len(kinds), frozenset(
                q.name for assignment in kinds for q in assignment.get_qualified_names_for(full_name)))
        return cached[1]

    def _referent_names(self, referents) -> frozenset[str]:
        cached = self._by_referents.get(id(referents))
        if cached is None or cached[0] is not referents:
            part = self._parts.get(id(referents))
            if part is not None and part[0] is referents:
                names = self._group_names(part[1], part[2])
            else:
                names = self._names_of(referents)
            cached = self._by_referents[id(referents)] = (referents, names)
        return cached[1]

    def _group_names(self, group: tuple, before: int) -> frozenset[str]:
        """The names of a shared referent set from its parts: the group's other-scope assignments, and its
        first ``before`` own-scope ones (built up once per group, however many sets it has)."""
        # a group without own-scope assignments has all of the set's: one answer per set, whatever the scope
        key = id(group[0]) if not group[3] else id(group)
        others = self._others.get(key)
        if others is None:
            others = self._others[key] = self._names_of(group[1])
        own = self._own.setdefault(id(group), [frozenset()])
        while len(own) <= before:
            assignment = group[3][len(own) - 1]
            added = self._names_of((assignment,))
            own.append(own[-1] if added <= own[-1] else own[-1] | added)
        return others | own[before]

    def _names_of(self, referents) -> frozenset[str]:
        if len(referents) <= _FEW:
            return frozenset(q.name for referent in referents for q in referent.get_qualified_names_for(referent.name))
        by_kind = {}
        for referent in referents:
            by_kind.setdefault((self._kind(referent), referent.name), referent)
        return frozenset(q.name for referent in by_kind.values()
                         for q in referent.get_qualified_names_for(referent.name))

    def _assignments(self, scope: Scope, full_name: str):
        """The assignments of the longest dotted prefix of ``full_name`` the scope knows (libcst's loop)."""
        # not kept: a few lookups, and a table per scope and name cost more memory than it saved time
        prefix = full_name
        while prefix:
            if prefix in scope:
                return scope[prefix]
            idx = prefix.rfind(".")
            prefix = None if idx == -1 else prefix[:idx]
        return set()

    def _kinds_of(self, assignments) -> tuple[object, int, list, dict]:
        """The set, its size, one assignment of each kind in it, and the set's own nodes: node id -> (node, the first
        assignment in the set's order whose node it is, as libcst's ``_is_assignment`` finds it)."""
        cached = self._kinds.get(id(assignments))
        if cached is None or cached[0] is not assignments:
            cached = self._kinds[id(assignments)] = (assignments, 0, [], {}, {}, set())
        if cached[1] != len(assignments):
            # new assignments (the scopes are still being built): only those are looked at; a set only grows
            _, _, _, own, kinds, seen = cached
            for assignment in assignments - seen:
                kinds.setdefault(self._kind(assignment), assignment)
                if isinstance(assignment, Assignment):
                    for target in _assignment_nodes(assignment.node):
                        # libcst takes the first in the set's order; two assignments of one name at the
                        # same node (import torch, torch) answer alike
                        own.setdefault(id(target), (target, assignment))
            seen |= assignments
            cached = self._kinds[id(assignments)] = (assignments, len(assignments), list(kinds.values()), own,
                                                     kinds, seen)
        return cached[:4]

    def _kind(self, assignment) -> tuple:
        cached = self._kind_cache.get(id(assignment))
        if cached is None or cached[0] is not assignment:
            cached = self._kind_cache[id(assignment)] = (assignment, _kind_of(assignment))
        return cached[1]


def _kind_of(assignment) -> tuple:
    """What an assignment's ``get_qualified_names_for`` depends on (besides the name asked): an import's
    module and names, a local binding's scope prefix, a builtin's name. Anything else is its own kind."""
    kind = type(assignment)
    if kind is ImportAssignment:
        node = assignment.node
        names = node.names
        aliases = "*" if isinstance(names, cst.ImportStar) else tuple(
            (get_full_name_for_node(alias.name), alias.evaluated_alias if alias.asname else None) for alias in names)
        return (kind, assignment.get_module_name_for_import(), aliases)
    if kind is Assignment:
        return (kind, assignment.scope._name_prefix)
    if kind is BuiltinAssignment:
        return (kind, assignment.name)
    return (kind, id(assignment))


def _assignment_nodes(node: CSTNode):
    """The nodes libcst's ``_is_assignment`` takes as part of the assignment at ``node``."""
    yield node
    if isinstance(node, (cst.Import, cst.ImportFrom)) and not isinstance(node.names, cst.ImportStar):
        for alias in node.names:
            yield alias.name
            if alias.asname is not None:
                yield alias.asname.name
