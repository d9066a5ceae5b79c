"""Name resolution (src/xla_migrate/analysis/scopes.py) gives what libcst's ScopeProvider and
ExpressionContextProvider give: the same expression context for every node, the same scope for every node
(in the same order), and scopes with the same assignments, accesses, referents and qualified names.

scopes.py re-implements libcst's visitors for speed, so a libcst release that changes what they compute
must fail here, not change the migration silently."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import ExpressionContextProvider, MetadataWrapper, ScopeProvider
from libcst.metadata.scope_provider import Assignment, BuiltinScope, ImportAssignment, LocalScope
from test_walk import EXTRA

from xla_migrate.analysis import scopes
from xla_migrate.syntax import walk
from xla_migrate.syntax.positions import Positions

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "fixtures").rglob("*.py"))
# What decides scopes and accesses, beyond test_walk's sampler of every node type.
SCOPE_SYNTAX = '''\
from __future__ import annotations
import typing
import typing as t
import os.path as osp, a.b.c, a.b
from typing import Literal, NewType, TypeVar, cast, List as L
from typing_extensions import Literal as XLiteral
from .. import sibling
from .pkg.mod import thing as other
from star import *
UserId = NewType("UserId", "int")
T = TypeVar("T", bound="Model")
value = cast("List[int]", raw) + t.cast("os.PathLike", p)
mode: Literal["train", "eval"] = "train"
other_mode: XLiteral["a"] = "a"
hinted: "typing.Optional[osp.Thing]" = None
broken: "not valid python (" = 1
concatenated: "Li" "st[int]" = []
nums: L["int"] = []
a.b.c.d = 1
print(a.b.c.d, a.b.x, os.path.join, osp.join(a.b), sibling.x().y, other)
counter = 0
def outer(x, /, y: "T" = counter, *args: int, z=lambda q=y: q, **kw) -> "UserId":
    global counter
    counter += 1
    v = 1
    class Inner(Base if v else Other, metaclass=Meta):
        v = 2
        w = [v for _ in range(3)]
        def method(self, arg=v) -> v:
            nonlocal v
            v = 3
            return __class__, super().method(arg)
    def inner():
        nonlocal v
        del v
        return [[v, u] for u in x for x in u if (n := u)] + [n]
    return inner, {k: v for k, v in kw.items()}, {s for s in args}, (g for g in x)
for i, (j, *k) in enumerate(items):
    total = i + j
else:
    total = None
with open(p) as (f, g), other_ctx() as h:
    f.read(), h
try:
    pass
except (ValueError, TypeError) as err:
    print(err)
match command:
    case [first, *rest] if first:
        print(rest)
    case {"key": found, **others}:
        print(found, others)
    case Point(x=px) as point:
        print(px, point)
async def runner():
    return [y async for y in aiter() if await y], await other
@decorator.attr(counter)
@dec
class Model[K: int, *Ts, **P](typing.Generic[K]):
    field: K
    items: list["Model"] = []
    def copy[V](self, other: V) -> "Model[K]":
        return other
type Alias[Q] = dict[Q, "Model"]
type Plain = int
print(__name__, __file__, len, UndefinedName, Alias.x)
'''


# Accesses before a local binding of their name (libcst hands them to the enclosing scope's bindings, a
# builtin's included), and a name bound many times: the assignments' references are filled when first read
# (issue 38), and must still be libcst's.
EARLIER_ACCESSES = """\
import torch
import torch
y = len
def f(n):
    torch.zeros(n), len(n), y
    import torch
    torch.ones(n)
    len = 3
    y = torch
    def g():
        return y, len, torch
    return len, [torch for torch in range(n)], y
class C:
    x = y, torch
    y = 1
    torch = None
    def m(self):
        return y, torch, x
import torch
y = torch
"""

# Parsed when a test runs, not at collection: every xdist worker collects the whole suite.
SYNTAX = {"scope_syntax": SCOPE_SYNTAX, "walk_syntax": EXTRA, "earlier_accesses": EARLIER_ACCESSES}
IDS = [*SYNTAX, *(str(path.relative_to(ROOT / "fixtures")) for path in SOURCES)]


def _module(name: str) -> cst.Module:
    if name in SYNTAX:
        return cst.parse_module(SYNTAX[name])
    return cst.parse_module((ROOT / "fixtures" / name).read_bytes())


def _libcsts(module: cst.Module):
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    return wrapper.resolve(ExpressionContextProvider), wrapper.resolve(ScopeProvider)


def _ours(module: cst.Module):
    with walk.fast_visits():  # as the pipeline runs it
        wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
        found = scopes.resolve_scopes(wrapper)
    return wrapper._metadata[ExpressionContextProvider], found


class _Correspondence:
    """Pairs libcst's objects with ours. Nodes of the module are the same objects on both sides; nodes
    parsed from string annotations are parsed once on each side, paired by their place in the mapping."""

    def __init__(self, module: cst.Module) -> None:
        self.module_nodes = {id(n) for n in Positions(module).parents} | {id(module)}
        self.node_pairs: dict[int, cst.CSTNode] = {}
        self.scope_pairs: dict[int, object] = {}

    def nodes(self, theirs: cst.CSTNode, ours: cst.CSTNode) -> None:
        if id(theirs) in self.module_nodes:
            assert ours is theirs
        else:
            assert id(ours) not in self.module_nodes and ours.deep_equals(theirs)
            self.node_pairs[id(theirs)] = ours

    def node(self, theirs):
        """Our counterpart of one of libcst's nodes (or of a value that is not a node)."""
        return self.node_pairs.get(id(theirs), theirs) if isinstance(theirs, cst.CSTNode) else theirs

    def scopes(self, theirs, ours) -> None:
        if theirs is None:
            assert ours is None
            return
        known = self.scope_pairs.get(id(theirs))
        if known is not None:
            assert known is ours
            return
        assert type(ours) is type(theirs)
        self.scope_pairs[id(theirs)] = ours
        if isinstance(theirs, LocalScope):
            assert ours.node is self.node(theirs.node) and ours.name == theirs.name
        assert ours._name_prefix == theirs._name_prefix
        self.scopes(theirs.parent, ours.parent)
        self.scopes(theirs.globals, ours.globals)


def _assignment(pairs: _Correspondence, assignment) -> tuple:
    """What an assignment is, without its references, in terms of our nodes and scopes."""
    scope = pairs.scope_pairs.get(id(assignment.scope), assignment.scope)
    node = pairs.node(assignment.node) if isinstance(assignment, Assignment) else None
    as_name = pairs.node(assignment.as_name) if isinstance(assignment, ImportAssignment) else None
    return type(assignment).__name__, assignment.name, id(scope), id(node), id(as_name), assignment._index


def _access(pairs: _Correspondence, access) -> tuple:
    scope = pairs.scope_pairs.get(id(access.scope), access.scope)
    return (id(pairs.node(access.node)), id(scope), access.is_annotation, access.is_type_hint, access._index,
            frozenset(_assignment(pairs, a) for a in access.referents))


def _scope_contents(pairs: _Correspondence, scope) -> dict:
    """Everything a scope records, in terms of our nodes and scopes (the names in recording order)."""
    return {
        "assignment_count": scope._assignment_count,
        "assignments": [(name, {(_assignment(pairs, a), frozenset(_access(pairs, r) for r in a.references))
                                for a in assigned})
                        for name, assigned in scope._assignments.items()],
        "accesses": [(name, {_access(pairs, a) for a in accesses}) for name, accesses in
                     scope._accesses_by_name.items()],
        "accesses_by_node": [(id(pairs.node(node)), {_access(pairs, a) for a in accesses})
                             for node, accesses in scope._accesses_by_node.items()],
        "overwrites": [(name, id(pairs.scope_pairs.get(id(s), s)))
                       for name, s in getattr(scope, "_scope_overwrites", {}).items()],
    }


@pytest.mark.parametrize("name", IDS)
def test_expression_contexts_and_scopes_equal_libcsts(name):
    module = _module(name)
    their_contexts, their_scopes = _libcsts(module)
    our_contexts, our_scopes = _ours(module)
    assert dict(our_contexts) == dict(their_contexts)

    # Every node has the same scope, in the same order (context.py lists the scopes in mapping order).
    pairs = _Correspondence(module)
    assert len(our_scopes) == len(their_scopes)
    for (their_node, their_scope), (our_node, our_scope) in zip(their_scopes.items(), our_scopes.items()):
        pairs.nodes(their_node, our_node)
        pairs.scopes(their_scope, our_scope)
    builtins = [s for s in pairs.scope_pairs.values() if isinstance(s, BuiltinScope)]
    assert len(builtins) == 1

    # Every scope records the same assignments, accesses and referents.
    their_by_id = {id(s): s for s in their_scopes.values() if s is not None}
    their_by_id.update({id(s.parent): s.parent for s in their_by_id.values()})
    for their_id, ours in pairs.scope_pairs.items():
        theirs = their_by_id[their_id]
        assert _scope_contents(pairs, ours) == _scope_contents(pairs, theirs), type(theirs).__name__

    # The qualified names of every name and attribute, as the rules ask them.
    names = [n for n in their_scopes if isinstance(n, (cst.Name, cst.Attribute)) and id(n) in pairs.module_nodes]
    for node in names:
        theirs = their_scopes[node]
        if theirs is not None:
            assert our_scopes[node].get_qualified_names_for(node) == theirs.get_qualified_names_for(node), (
                name, cst.Module([]).code_for_node(node))


def test_the_sampler_exercises_what_scopes_distinguish():
    """The cases above would prove little if the sampler did not reach them."""
    contexts, found = _ours(cst.parse_module(SCOPE_SYNTAX))
    kinds = {type(s).__name__ for s in found.values()}
    assert kinds == {"GlobalScope", "FunctionScope", "ClassScope", "ComprehensionScope", "AnnotationScope"}
    accesses = [a for s in {id(s): s for s in found.values()}.values() for a in s.accesses]
    assert any(a.is_type_hint for a in accesses) and any(a.is_annotation for a in accesses)
    assert any(isinstance(a.node, cst.SimpleString) for a in accesses)  # a name inside a string annotation
    assert any(isinstance(a.node, cst.Attribute) for a in accesses)  # a dotted import's access
    assert {c.name for c in set(contexts.values())} == {"LOAD", "STORE", "DEL"}


def test_resolve_scopes_serves_later_resolves_from_the_wrapper():
    wrapper = MetadataWrapper(cst.parse_module("import torch\nx = torch.zeros(1)\n"), unsafe_skip_copy=True)
    found = scopes.resolve_scopes(wrapper)
    assert wrapper.resolve(ScopeProvider) is found
    assert scopes.resolve_scopes(wrapper) is found
    assert set(wrapper.resolve(ExpressionContextProvider).values()) == {
        cst.metadata.ExpressionContext.STORE, cst.metadata.ExpressionContext.LOAD}


def test_every_hook_of_libcsts_visitors_has_its_counterpart():
    """A hook libcst adds to its visitors (a new node type it resolves) fails here even where no fixture
    holds that syntax yet."""
    from libcst.metadata.expression_context_provider import ExpressionContextVisitor
    from libcst.metadata.scope_provider import ScopeVisitor

    hooks = ("visit_", "leave_")
    theirs = {name for name in vars(ScopeVisitor) if name.startswith(hooks)}
    ours = {name for name in vars(scopes._ScopeBuilder) if name.startswith(hooks)}
    ours |= {f"visit_{node_type.__name__}" for node_type in scopes._builder_hooks}
    # never called: visit_ClassDef visits a class's parts itself, so its fields' hooks do not run
    assert theirs - {"visit_ClassDef_bases", "leave_ClassDef_bases"} == ours
    assert {name for name in vars(ScopeVisitor) if name.startswith("on_")} == {"on_leave"}
    theirs = {name[len("visit_"):] for name in vars(ExpressionContextVisitor) if name.startswith(hooks)}
    assert theirs == {node_type.__name__ for node_type in scopes._CONTEXT_HANDLERS} | {"Name"}


# A name bound many times, read from the module, functions, classes and comprehensions, before and after
# some of its bindings (issue 38: the referent sets are shared, the qualified names cached).
REPEATED_BINDINGS = SCOPE_SYNTAX + "".join(f'''
import torch
import torch.nn as nn
from torch import cuda as c{i % 2}
x{i} = torch.zeros({i}).cuda() + c0.device_count() + nn.Linear
class M{i}(nn.Module):
    def f(self, torch=None):
        return torch, nn.functional.relu, [nn for _ in range(2)], c1
def g{i}():
    nn = {i}
    return torch.cuda.is_available(), nn, typing.cast(int, {i})
torch = torch if {i} else None
''' for i in range(6))


def test_qualified_names_equal_libcsts_for_every_node_with_repeated_bindings():
    module = cst.parse_module(REPEATED_BINDINGS)
    _, their_scopes = _libcsts(module)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    with walk.fast_visits():
        our_scopes = scopes.resolve_scopes(wrapper)
    names = scopes.QualifiedNames(our_scopes, scopes.referent_parts(wrapper))
    asked = 0
    for node, theirs in their_scopes.items():
        if theirs is None or node not in our_scopes:  # not a node of the module: a string annotation's parse
            continue
        expected = {q.name for q in theirs.get_qualified_names_for(node)}
        assert names(node) == expected, cst.Module([]).code_for_node(node)
        asked += bool(expected)
    assert asked > 400


def test_function_scopes_reading_a_module_name_share_one_referent_set():
    module = cst.parse_module("import torch\n" * 50 + "".join(f"def f{i}():\n    return torch.zeros({i})\n"
                                                               for i in range(20)))
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    found = scopes.resolve_scopes(wrapper)
    referents = [access.referents for scope in {id(s): s for s in found.values() if s}.values()
                 for access in scope.accesses if access.node.value == "torch"]
    assert len(referents) == 20 and all(len(r) == 50 for r in referents)
    assert len({id(r) for r in referents}) == 1


def test_references_are_filled_once_when_first_read():
    """The references of a name's 300 bindings are not built until asked (issue 38), then are libcst's."""
    source = "import torch\n" * 300 + "".join(f"def f{i}():\n    return torch.zeros({i})\n" for i in range(30))
    module = cst.parse_module(source)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    found = scopes.resolve_scopes(wrapper)
    module_scope = found[module.body[0]]
    bindings = sorted(module_scope.assignments["torch"], key=lambda a: a._index)
    assert all(not a._BaseAssignment__accesses for a in bindings)  # nothing built yet
    _, their_scopes = _libcsts(cst.parse_module(source))
    theirs = sorted(their_scopes[next(iter(their_scopes))].assignments["torch"], key=lambda a: a._index)
    assert [len(a.references) for a in bindings] == [len(a.references) for a in theirs] == [30] * 300
    assert bindings[0].references is bindings[0].references  # filled once
