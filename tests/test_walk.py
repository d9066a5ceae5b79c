"""The read-only walk (src/xla_migrate/syntax/walk.py) visits exactly what libcst's own traversal visits.

The walk reads each node type's child order from libcst's internals, so a libcst release that changes them
must fail here, not change the migration silently."""

from __future__ import annotations

import abc
import dataclasses
import inspect
import re
import typing
from pathlib import Path

import libcst as cst
import pytest
from libcst._nodes.base import CSTNode
from libcst.metadata import GlobalScope, MetadataWrapper
from libcst.metadata.scope_provider import Access, BaseAssignment, Scope

from xla_migrate.syntax import walk
from xla_migrate.syntax.positions import Positions

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "fixtures" / "realistic").glob("*.py")) + sorted((ROOT / "fixtures" / "scripts").glob("*.in.py"))
# Syntax the fixtures may not hold: every kind of node libcst has a field order for.
EXTRA = '''\
from __future__ import annotations
import a.b as c
from . import d
@decorator(arg)
class K(Base, metaclass=M):
    x: int = 1
    async def f(self, /, a, *args, b=2, **kw) -> "K":
        global g
        nonlocal_free = lambda q, *r: q
        async with ctx() as (u, v), other():
            async for i in aiter():
                yield i
        await thing
        try:
            pass
        except* ValueError as e:
            raise RuntimeError from e
        else:
            del a[1:2, ::3], b.c
        finally:
            return f"{a!r:>{width}} {b=}"
def g[T](x: T) -> T:
    match x:
        case [1, *rest] | {"k": _, **others} if rest:
            pass
        case Point(x=0, y=y) as p:
            pass
    while (n := next(it)) is not None:
        continue
    else:
        assert x, "msg"
    type Alias = list[int]
    return {k: v for k, v in x.items() if k} or [y async for y in z] or {*s} or (a if b else c) or ...
'''


class Recorder(cst.CSTVisitor):
    def __init__(self) -> None:
        self.events: list[tuple[str, int, str]] = []

    def on_visit(self, node: CSTNode) -> bool:
        self.events.append(("visit", id(node), type(node).__name__))
        return True

    def on_leave(self, node: CSTNode) -> None:
        self.events.append(("leave", id(node), type(node).__name__))

    def on_visit_attribute(self, node: CSTNode, attribute: str) -> None:
        self.events.append(("enter", id(node), attribute))

    def on_leave_attribute(self, node: CSTNode, attribute: str) -> None:
        self.events.append(("exit", id(node), attribute))


def _modules():
    yield "extra", cst.parse_module(EXTRA)
    for path in SOURCES:
        yield path.name, cst.parse_module(path.read_bytes())


@pytest.mark.parametrize("name,module", list(_modules()), ids=lambda v: v if isinstance(v, str) else "")
def test_the_walk_gives_libcsts_events_in_libcsts_order(name, module):
    own, fast = Recorder(), Recorder()
    module.visit(own)
    with walk.fast_visits():
        assert module.visit(fast) is module  # a visitor leaves the tree as it is, as with libcst
    assert fast.events == own.events
    assert len(own.events) > 100


class PlainRecorder(cst.CSTVisitor):
    """Keeps libcst's own dispatch (``visit_<Node>``/``leave_<Node>``), the walk's fast path: records some
    node types, and skips the children of calls and of the last lambda's body via a False return."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, str]] = []

    def visit_Name(self, node: cst.Name) -> None:
        self.events.append(("visit", id(node), node.value))

    def leave_Name(self, node: cst.Name) -> None:
        self.events.append(("leave", id(node), node.value))

    def visit_Call(self, node: cst.Call) -> bool:
        self.events.append(("visit", id(node), "Call"))
        return len(node.args) != 1  # one-argument calls: children skipped

    def leave_Call(self, node: cst.Call) -> None:
        self.events.append(("leave", id(node), "Call"))

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        self.events.append(("visit", id(node), node.attr.value))
        return True

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.events.append(("leave", id(node), node.name.value))


@pytest.mark.parametrize("name,module", list(_modules()), ids=lambda v: v if isinstance(v, str) else "")
def test_visitors_of_libcsts_own_dispatch_see_the_same_calls(name, module):
    own, fast = _libcsts_and_fast_events(PlainRecorder, module)
    assert fast == own
    assert any(kind == "leave" and label == "Call" for kind, _, label in own)


def _libcsts_and_fast_events(recorder_class, module: cst.Module) -> tuple[list, list]:
    """The events a fresh recorder records on libcst's own traversal, and on the walk."""
    own, fast = recorder_class(), recorder_class()
    module.visit(own)
    with walk.fast_visits():
        module.visit(fast)
    return own.events, fast.events


def test_children_are_libcsts_children():
    for _, module in _modules():
        for node in Positions(module).parents.values():
            assert walk.children(node) == list(node.children)


def test_child_fields_follow_the_source_of_every_node_type():
    types = {t for t in _subclasses(CSTNode) if "_visit_and_replace_children" in vars(t)}
    assert len(types) > 150
    for node_type in types:
        source = inspect.getsource(node_type._visit_and_replace_children)
        fields = [f.name for f in dataclasses.fields(node_type)]
        in_source = [m.group(1) for m in re.finditer(r'"(\w+)"', source) if m.group(1) in fields]
        assert [f for f, _ in walk.child_fields(node_type)] == list(dict.fromkeys(in_source)), node_type


def test_transformers_keep_libcsts_path_inside_fast_visits():
    class Rename(cst.CSTTransformer):
        def leave_Name(self, original_node, updated_node):
            return updated_node.with_changes(value="y") if updated_node.value == "x" else updated_node

    module = cst.parse_module("x = x + 1\n")
    with walk.fast_visits():
        assert module.visit(Rename()).code == "y = y + 1\n"
    assert cst.CSTNode.visit is walk._libcst_visit  # restored on the way out


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_no_visitor_class_is_defined_inside_a_function():
    """The walk keeps its dispatch tables per visitor class: a class made anew on every call would be looked
    up from scratch each time (and kept in the tables), which cost 2.6 ms per call before."""
    import ast

    nested = []
    for path in sorted((ROOT / "src").rglob("*.py")) + sorted((ROOT / "transforms").rglob("*.py")):
        for function in ast.walk(ast.parse(path.read_text())):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                nested += [f"{path.name}:{node.lineno} {node.name}" for node in ast.walk(function)
                           if isinstance(node, ast.ClassDef) and node is not function]
    assert nested == []


class _BatchRecorder(cst.BatchableCSTVisitor):
    def __init__(self, tag: str, events: list) -> None:
        super().__init__()
        self.tag, self.events = tag, events

    def visit_Name(self, node: cst.Name) -> None:
        self.events.append((self.tag, "visit", id(node)))

    def leave_Name(self, node: cst.Name) -> None:
        self.events.append((self.tag, "leave", id(node)))

    def visit_Call(self, node: cst.Call) -> None:
        self.events.append((self.tag, "visit", id(node)))

    def leave_Attribute(self, node: cst.Attribute) -> None:
        self.events.append((self.tag, "leave", id(node)))


@pytest.mark.parametrize("name,module", list(_modules()), ids=lambda v: v if isinstance(v, str) else "")
def test_walk_batched_makes_libcsts_batched_calls(name, module):
    """walk_batched (the rules' walk) calls what libcst's visit_batched calls, in the same order."""
    own: list = []
    cst.visit_batched(module, [_BatchRecorder("a", own), _BatchRecorder("b", own)])
    fast: list = []
    first, second = _BatchRecorder("a", fast), _BatchRecorder("b", fast)
    visits = {cst.Name: [first.visit_Name, second.visit_Name], cst.Call: [first.visit_Call, second.visit_Call]}
    leaves = {cst.Name: [first.leave_Name, second.leave_Name],
              cst.Attribute: [first.leave_Attribute, second.leave_Attribute]}
    walk.walk_batched(module, visits, leaves)
    assert fast == own
    assert len(own) > 50


def test_every_node_and_scope_class_hashes_by_identity_in_c():
    """walk.py gives libcst's node, scope, assignment and access classes object's own identity hash
    (libcst's is the same, in Python)."""
    classes = walk._subclasses((CSTNode, Scope, BaseAssignment, Access))
    assert len(classes) > 200 and GlobalScope in classes
    assert [cls.__name__ for cls in classes if cls.__hash__ is not object.__hash__] == []
    first, second = cst.Name("x"), cst.Name("x")
    assert first == first and first != second and len({first: 1, second: 2}) == 2


class LayoutRecorder(PlainRecorder):
    """A plain visitor with methods for layout nodes too: the walk must then take them in."""

    def visit_Comma(self, node: cst.Comma) -> None:
        self.events.append(("visit", id(node), "Comma"))

    def leave_SimpleWhitespace(self, node: cst.SimpleWhitespace) -> None:
        self.events.append(("leave", id(node), repr(node.value)))


@pytest.mark.parametrize("name,module", list(_modules()), ids=lambda v: v if isinstance(v, str) else "")
def test_visitors_of_layout_nodes_see_them_all(name, module):
    own, fast = _libcsts_and_fast_events(LayoutRecorder, module)
    assert fast == own
    assert {label for _, _, label in own} >= {"Comma", "' '"}
    batched: list = []
    recorder = _BatchRecorder("a", batched)
    walk.walk_batched(module, {cst.Comma: [recorder.visit_Name]}, {})
    commas, todo = 0, [module]
    while todo:
        node = todo.pop()
        commas += type(node) is cst.Comma
        todo.extend(node.children)
    assert len(batched) == commas > 0


def _node_classes_named_in(annotation) -> set[type]:
    if isinstance(annotation, type):
        return {annotation} if issubclass(annotation, CSTNode) else set()
    return set().union(*(_node_classes_named_in(arg) for arg in typing.get_args(annotation)))


def test_layout_nodes_hold_only_layout_nodes():
    """The walk skips layout nodes whole: their fields' types may name layout node types only."""
    assert {cst.SimpleWhitespace, cst.Comma, cst.Add, cst.LeftParen, cst.Comment} <= walk.LAYOUT_NODE_TYPES
    assert not {cst.Name, cst.Arg, cst.Call, cst.Annotation} & walk.LAYOUT_NODE_TYPES
    for cls in walk.LAYOUT_NODE_TYPES:
        named = set().union(*(_node_classes_named_in(hint) for hint in typing.get_type_hints(cls).values()))
        assert named <= walk.LAYOUT_NODE_TYPES, (cls, named - walk.LAYOUT_NODE_TYPES)


def test_libcsts_hot_classes_check_instances_in_c_with_the_abcs_answers():
    """walk.py gives libcst's node, sentinel, visitor and scope classes type's own isinstance/issubclass,
    which answer as ABCMeta does while no class has a registered virtual subclass."""
    classes = walk._subclasses(walk._HOT_LIBCST_CLASSES)
    assert len(classes) > 300 and GlobalScope in classes and cst.FlattenSentinel in classes
    assert {type(cls) for cls in classes} - {type} == {walk._LibcstClassType}
    assert [cls for cls in classes if type(cls) is not type and abc._get_dump(cls)[0]] == []  # no registrations
    assert isinstance(cst.FlattenSentinel([cst.Pass()]), cst.FlattenSentinel) and not isinstance([], cst.FlattenSentinel)
    name = cst.Name("x")
    assert isinstance(name, cst.BaseExpression) and isinstance(name, cst.BaseAssignTargetExpression)
    assert not isinstance(name, (cst.BaseStatement, cst.Attribute)) and issubclass(cst.Name, CSTNode)
