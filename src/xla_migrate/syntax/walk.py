"""A read-only traversal for libcst visitors that does not rebuild the tree.

libcst's ``CSTNode.visit`` runs a ``CSTVisitor`` through ``_visit_and_replace_children``, which constructs
(and validates) a new copy of every node it passes and then throws the copy away, since a visitor cannot
change the tree ("TODO: provide traversal where children are not replaced", libcst/_nodes/base.py). That
copy was most of the engine's time: every metadata provider, the facts pass, the step collector and the
rules' traversal each rebuilt the whole module.

``fast_visits()`` makes ``CSTNode.visit`` walk the same children in the same order with the same hooks
(``on_visit``, ``on_visit_attribute``, ``on_leave_attribute``, ``on_leave``; children skipped when
``on_visit`` says so) and return the node itself, as libcst does for a visitor. Transformers keep libcst's
own path. A visitor that keeps libcst's ``on_visit``/``on_leave`` and no attribute hook (most) gets its
``visit_<Node>``/``leave_<Node>`` looked up once per node type; the attribute hooks are called only for a
visitor that defines them (so defining no-op ones, an old speed trick for libcst's path, now costs). The
child fields of each node type, in visiting order, are read once from its ``_visit_and_replace_children``
(every child is visited there as ``visit_<kind>(self, "<field>", ...)``). Such a visitor, and the batched
walk, skip the layout nodes (whitespace, comments, operators, brackets: ``LAYOUT_NODE_TYPES``) unless it has
a method for one of their types: nothing else can be below them.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import functools
import threading
from collections.abc import Iterable, Iterator

import libcst as cst
from libcst._flatten_sentinel import FlattenSentinel
from libcst._nodes.base import CSTNode
from libcst.metadata.scope_provider import Access, BaseAssignment, Scope

_libcst_visit = CSTNode.visit
_lock = threading.Lock()
_depth = 0


# The libcst classes whose instances the pipeline hashes and type-checks by the million: nodes, flattened
# replacements, and the scope analysis' scopes, assignments and accesses.
_HOT_LIBCST_CLASSES = (CSTNode, FlattenSentinel, cst.CSTVisitor, Scope, BaseAssignment, Access)


def _subclasses(roots: tuple[type, ...]) -> list[type]:
    classes, found = list(roots), {}
    while classes:
        cls = classes.pop()
        if cls not in found:
            found[cls] = None
            classes.extend(cls.__subclasses__())
    return list(found)


def _hash_by_identity_in_c() -> None:
    """libcst hashes these objects by identity, in Python (``return id(self)``, inherited or copied onto
    every node class): the pipeline's dicts keyed by nodes (positions, parents, scopes, caches) called it
    millions of times, a few percent of a migration. ``object.__hash__`` is the same identity hash, in C.
    Set once, when xla_migrate is imported, on libcst's classes and so on any defined later (node classes
    copy CSTNode's): a dict of nodes built before that import would no longer find its keys."""
    for root in _HOT_LIBCST_CLASSES:
        libcst_hash = root.__dict__.get("__hash__")
        if libcst_hash is None or libcst_hash is object.__hash__:
            continue
        for cls in _subclasses((root,)):
            if cls.__dict__.get("__hash__") is libcst_hash:
                cls.__hash__ = object.__hash__


_hash_by_identity_in_c()


class _LibcstClassType(abc.ABCMeta):
    """These libcst classes are ABCs: each ``isinstance(x, cst.Name)`` that is not an exact type match runs
    ABCMeta's ``__instancecheck__``, a Python frame, which checks the classes' virtual subclasses. libcst
    registers none (tests/test_walk.py checks), so ``type``'s own checks, in C, give the same answers."""

    __instancecheck__ = type.__instancecheck__
    __subclasscheck__ = type.__subclasscheck__


def _check_libcst_classes_in_c() -> None:
    """Every such class takes ``_LibcstClassType`` as its class (set once, like the hash above; a subclass
    defined later, a rule's visitor class say, inherits it)."""
    for cls in _subclasses(_HOT_LIBCST_CLASSES):
        if type(cls) is abc.ABCMeta:
            cls.__class__ = _LibcstClassType


_check_libcst_classes_in_c()


@functools.lru_cache(maxsize=None)
def child_fields(node_type: type) -> tuple[tuple[str, bool], ...]:
    """(field, hooks when None) of a node type's children, in the order libcst visits them: the field names
    among the string constants of its ``_visit_and_replace_children``, in their order (each child is
    visited there as ``visit_<kind>(self, "<field>", ...)``; reading the constants, not the source, keeps
    start-up fast). libcst calls the attribute hooks for an absent optional child, but not for the absent
    ``format_spec`` of a formatted-string expression."""
    names = {f.name for f in dataclasses.fields(node_type)}
    constants = node_type._visit_and_replace_children.__code__.co_consts
    ordered = dict.fromkeys(c for c in constants if isinstance(c, str) and c in names)
    return tuple((name, name != "format_spec") for name in ordered)


def own_names(cls: type, base: type) -> set[str]:
    """The names the classes of ``cls``'s hierarchy define, leaving out ``base`` and the classes above it:
    what a subclass of a libcst visitor may have overridden (``dir()`` lists libcst's hundreds of no-ops)."""
    inherited = set(base.__mro__)
    return {name for klass in cls.__mro__ if klass not in inherited for name in vars(klass)}


@functools.lru_cache(maxsize=None)
def _uses_attribute_hooks(visitor_type: type) -> bool:
    """The visitor does something in ``on_visit_attribute``/``on_leave_attribute``: it overrides them, or
    it has a ``visit_<Node>_<field>``/``leave_<Node>_<field>`` method of its own (only a class above
    libcst's can define one: their own names are read, not the hundreds of libcst's that ``dir()`` lists)."""
    if (visitor_type.on_visit_attribute is not cst.CSTVisitor.on_visit_attribute
            or visitor_type.on_leave_attribute is not cst.CSTVisitor.on_leave_attribute):
        return True
    for name in own_names(visitor_type, cst.CSTVisitor):
        prefix, _, rest = name.partition("_")
        if prefix in ("visit", "leave") and "_" in rest and getattr(visitor_type, name) is not getattr(
                cst.CSTVisitor, name, None):
            return True
    return False


# What a field's value is, by its type: a node (walked), a sequence of nodes (each walked), or neither
# (None, MaybeSentinel). Looked up by type: ``isinstance(value, CSTNode)`` goes through the ABC machinery,
# which was a fifth of the walk's time.
_NODE, _SEQUENCE, _OTHER = 1, 2, 3  # all true: `.get(...) or _kind(...)`
_value_kinds: dict[type, int] = {}


def _layout_node_types() -> frozenset[type]:
    """The node types that hold only layout: whitespace, comments, newlines, operators and brackets, whose
    children are layout too (tests/test_walk.py checks that from their fields' types). Most nodes of a
    tree (60% of a training script's) are layout, and no visitor of the pipeline looks at them."""
    from libcst._nodes import op, whitespace
    found = {cst.LeftParen, cst.RightParen, cst.LeftSquareBracket, cst.RightSquareBracket, cst.LeftCurlyBrace,
             cst.RightCurlyBrace}
    for module in (op, whitespace):
        found.update(value for value in vars(module).values()
                     if isinstance(value, type) and issubclass(value, CSTNode) and value.__module__ == module.__name__)
    return frozenset(found)


LAYOUT_NODE_TYPES = _layout_node_types()
# The same table for a walk that skips layout nodes: they are neither (not walked).
_value_kinds_without_layout: dict[type, int] = {}


def _kind(value_type: type, kinds: dict[type, int] = _value_kinds) -> int:
    """The kind of a value of this type in ``kinds`` (``_value_kinds`` or ``_value_kinds_without_layout``),
    recorded in both tables."""
    kind = _value_kinds.get(value_type)
    if kind is None:
        kind = _NODE if issubclass(value_type, CSTNode) else _SEQUENCE if issubclass(value_type, (tuple, list)) \
            else _OTHER
        _value_kinds[value_type] = kind
        _value_kinds_without_layout[value_type] = _OTHER if value_type in LAYOUT_NODE_TYPES else kind
    return kinds[value_type]


def _kinds_for(handled: Iterable[type]) -> dict[type, int]:
    """The kinds table of a walk whose visitor has methods for the ``handled`` node types: layout nodes are
    skipped unless it has one for a layout type."""
    return _value_kinds if LAYOUT_NODE_TYPES.intersection(handled) else _value_kinds_without_layout


def _walk(node: CSTNode, visitor: cst.CSTVisitor, hooks: bool) -> None:
    if visitor.on_visit(node):
        for field, hooks_when_none in child_fields(type(node)):
            value = getattr(node, field)
            if hooks and (value is not None or hooks_when_none):
                visitor.on_visit_attribute(node, field)
            kind = _value_kinds.get(type(value)) or _kind(type(value))
            if kind == _NODE:
                _walk(value, visitor, hooks)
            elif kind == _SEQUENCE:
                for child in value:
                    _walk(child, visitor, hooks)
            if hooks and (value is not None or hooks_when_none):
                visitor.on_leave_attribute(node, field)
    visitor.on_leave(node)


def _uses_plain_dispatch(visitor_type: type) -> bool:
    """The visitor keeps libcst's ``on_visit``/``on_leave`` (call ``visit_<Node>``/``leave_<Node>``) and
    uses no attribute hook: its methods can be looked up once per node type instead of per node."""
    return (visitor_type.on_visit is cst.CSTVisitor.on_visit and visitor_type.on_leave is cst.CSTVisitor.on_leave
            and not _uses_attribute_hooks(visitor_type))


# visitor type -> node type -> (visit_<Node> or None, leave_<Node> or None), None where the visitor keeps
# libcst's no-op.
_handler_tables: dict[type, dict[type, tuple]] = {}


def _handlers(visitor_type: type, node_type: type) -> tuple:
    name = node_type.__name__
    visit = getattr(visitor_type, "visit_" + name, None)
    leave = getattr(visitor_type, "leave_" + name, None)
    if visit is getattr(cst.CSTVisitor, "visit_" + name, None):
        visit = None
    if leave is getattr(cst.CSTVisitor, "leave_" + name, None):
        leave = None
    handlers = (visit, leave)
    _handler_tables[visitor_type][node_type] = handlers
    return handlers


def _walk_plain(node: CSTNode, visitor: cst.CSTVisitor, table: dict[type, tuple], kinds: dict[type, int]) -> None:
    """``_walk`` for a visitor of plain dispatch: the same calls, in the same order, with the same effect
    (children skipped when ``visit_<Node>`` returns False). ``kinds``: see ``_kinds_for``."""
    node_type = type(node)
    visit, leave = table.get(node_type) or _handlers(type(visitor), node_type)
    if visit is None or visit(visitor, node) is not False:
        for field, _ in child_fields(node_type):
            value = getattr(node, field)
            kind = kinds.get(type(value)) or _kind(type(value), kinds)
            if kind == _NODE:
                _walk_plain(value, visitor, table, kinds)
            elif kind == _SEQUENCE:
                for child in value:
                    if (kinds.get(type(child)) or _kind(type(child), kinds)) != _OTHER:
                        _walk_plain(child, visitor, table, kinds)
    if leave is not None:
        leave(visitor, node)


def walk_batched(node: CSTNode, visits: dict[type, list], leaves: dict[type, list],
                 kinds: dict[type, int] | None = None) -> None:
    """Every method in ``visits[type(n)]`` on the way down to each node ``n`` and in ``leaves[type(n)]`` on
    the way up, children always walked (layout nodes only when some method is for a layout type): libcst's
    batched visiting of several visitors, as a walk. ``kinds`` is for the walk's own recursion."""
    if kinds is None:
        kinds = _kinds_for([*visits, *leaves])
    node_type = type(node)
    for method in visits.get(node_type, ()):
        method(node)
    for field, _ in child_fields(node_type):
        value = getattr(node, field)
        kind = kinds.get(type(value)) or _kind(type(value), kinds)
        if kind == _NODE:
            walk_batched(value, visits, leaves, kinds)
        elif kind == _SEQUENCE:
            for child in value:
                if (kinds.get(type(child)) or _kind(type(child), kinds)) != _OTHER:
                    walk_batched(child, visits, leaves, kinds)
    for method in leaves.get(node_type, ()):
        method(node)


def _visit(self: CSTNode, visitor):
    if not isinstance(visitor, cst.CSTVisitor):
        return _libcst_visit(self, visitor)
    # The first level of the walk inline: visitors that call ``child.visit(self)`` from their own methods
    # (libcst's expression-context provider, once per link of an attribute chain) then recurse no deeper
    # than in libcst.
    visitor_type = type(visitor)
    plain = _plain_walk(visitor_type)
    if plain is None:
        hooks = _uses_attribute_hooks(visitor_type)
        if visitor.on_visit(self):
            for field, hooks_when_none in child_fields(type(self)):
                value = getattr(self, field)
                if hooks and (value is not None or hooks_when_none):
                    visitor.on_visit_attribute(self, field)
                kind = _value_kinds.get(type(value)) or _kind(type(value))
                if kind == _NODE:
                    _walk(value, visitor, hooks)
                elif kind == _SEQUENCE:
                    for child in value:
                        _walk(child, visitor, hooks)
                if hooks and (value is not None or hooks_when_none):
                    visitor.on_leave_attribute(self, field)
        visitor.on_leave(self)
        return self
    table, kinds = plain
    visit, leave = table.get(type(self)) or _handlers(visitor_type, type(self))
    if visit is None or visit(visitor, self) is not False:
        for field, _ in child_fields(type(self)):
            value = getattr(self, field)
            kind = kinds.get(type(value)) or _kind(type(value), kinds)
            if kind == _NODE:
                _walk_plain(value, visitor, table, kinds)
            elif kind == _SEQUENCE:
                for child in value:
                    if (kinds.get(type(child)) or _kind(type(child), kinds)) != _OTHER:
                        _walk_plain(child, visitor, table, kinds)
    if leave is not None:
        leave(visitor, self)
    return self


# Visitor type -> (its handler table, its kinds table), for the visitors of plain dispatch.
_plain_walks: dict[type, tuple[dict[type, tuple], dict[type, int]]] = {}


def _plain_walk(visitor_type: type) -> tuple[dict[type, tuple], dict[type, int]] | None:
    """The handler table and kinds table (``_kinds_for`` its own ``visit_X``/``leave_X`` methods) of a
    visitor of plain dispatch, None for any other visitor."""
    found = _plain_walks.get(visitor_type)
    if found is None and _uses_plain_dispatch(visitor_type):
        handled = [getattr(cst, name.partition("_")[2], None) for name in own_names(visitor_type, cst.CSTVisitor)
                   if name.startswith(("visit_", "leave_"))]
        table = _handler_tables[visitor_type] = {}
        found = _plain_walks[visitor_type] = (table, _kinds_for(handled))
    return found


def walk(node: CSTNode, visitor: cst.CSTVisitor) -> None:
    """Run a read-only visitor over ``node`` without rebuilding it."""
    plain = _plain_walk(type(visitor))
    if plain is not None:
        _walk_plain(node, visitor, *plain)
    else:
        _walk(node, visitor, _uses_attribute_hooks(type(visitor)))


@contextlib.contextmanager
def fast_visits() -> Iterator[None]:
    """While inside (re-entrant, any thread), visitors walk the tree instead of rebuilding it."""
    global _depth
    with _lock:
        if _depth == 0:
            CSTNode.visit = _visit
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                CSTNode.visit = _libcst_visit


def children(node: CSTNode) -> list[CSTNode]:
    """The node's children in source order: what libcst's ``CSTNode.children`` gives, without the copy of
    the node that property builds."""
    found: list[CSTNode] = []
    for field, _ in child_fields(type(node)):
        value = getattr(node, field)
        kind = _value_kinds.get(type(value)) or _kind(type(value))
        if kind == _NODE:
            found.append(value)
        elif kind == _SEQUENCE:
            found.extend(value)
    return found


# The rules and analyses ask for every node under the same trees again and again (a module, a function's body:
# dozens of times a migration), and walking them was a third of a migration's time. Trees never change, so a
# tree's nodes in source order are kept for the last few trees asked for, with where each node's own subtree
# ends: a later question about any tree inside them is a slice. A tree of over _INDEXED_MAX nodes is walked
# each time (its index would cost more memory than the walks cost time).
_INDEXED_MAX = 200_000
_INDEXED_KEPT = 8


@dataclasses.dataclass(frozen=True)
class _Preorder:
    nodes: list[CSTNode]
    ends: list[int]  # ends[i]: one past the last node of nodes[i]'s subtree
    index: dict[CSTNode, int]  # a node -> one of its positions (the same node object may be used twice)


_preorders: list[_Preorder] = []


def _preorder(tree: CSTNode) -> _Preorder:
    nodes: list[CSTNode] = []
    ends: list[int] = []
    stack: list[CSTNode | int] = [tree]
    while stack:
        item = stack.pop()
        if item.__class__ is int:  # the end marker of the subtree that starts at nodes[item]
            ends[item] = len(nodes)
            continue
        stack.append(len(nodes))
        nodes.append(item)
        ends.append(0)
        stack.extend(reversed(children(item)))
    index = dict(zip(nodes, range(len(nodes)))) if len(nodes) <= _INDEXED_MAX else {}  # see subtree
    return _Preorder(nodes, ends, index)


# The last tree over _INDEXED_MAX nodes asked for, with its nodes (no index: 8 bytes a node). A large file's
# module is asked for a dozen times a migration (every node of it, by rules and analyses), each walk about
# a second a megabyte (issue 38). Dropped by ``forget_large`` when a migration ends.
_large: list[tuple[CSTNode, list[CSTNode]]] = []


def subtree(tree: CSTNode) -> list[CSTNode]:
    """Every node of ``tree`` (itself first) in source order: what walking ``children`` depth-first gives."""
    for kept in tuple(_preorders):
        at = kept.index.get(tree)
        if at is not None:
            return kept.nodes[at:kept.ends[at]]
    large = tuple(_large)
    if large and large[0][0] is tree:
        return list(large[0][1])
    found = _preorder(tree)
    if len(found.nodes) <= _INDEXED_MAX:
        with _lock:
            _preorders.insert(0, found)
            del _preorders[_INDEXED_KEPT:]
    else:
        with _lock:
            _large[:] = [(tree, list(found.nodes))]
    return found.nodes


def forget_large() -> None:
    """Drop the large tree kept by ``subtree`` (the end of a migration: the tree is not kept alive past it)."""
    with _lock:
        _large.clear()
