"""XLA107 optimizer-before-device-move: an optimizer built before its model moves to the device gets the move.

What it does:
    Finds a model move (``model.cuda()``, ``model.to(device)``, ``model = model.to("cuda")``) that comes,
    in the same function, after an optimizer was built from that model's parameters
    (``torch.optim.SGD(model.parameters())``, parameter groups, ``named_parameters()`` comprehensions), and
    moves the model to the XLA device just before the optimizer is built (``model.to(device)``:
    ``Module.to`` moves in place and returns the module, so the later move is a no-op). Where no statement
    can go before the optimizer (a one-line suite), it reports the move instead, with the optimizer's line.
    An optimizer over a submodule's parameters (``{'params': model.backbone.parameters()}`` groups) counts as
    built from the model, and the move may sit in a later branch: a move in every branch of an ``if``/``else``
    (DeepLabV3Plus's checkpoint test), in a ``try`` body or under ``if torch.cuda.is_available():`` moves on
    every path; one that only some paths take (``if use_gpu: model.to(device)``) is moved above the
    optimizer too and reported, as the model now moves on every path. A move of a submodule after the
    model's optimizer (``model.head.cuda()``) is reported: the submodule may not exist above it.
    A model read out of a checkpoint together with its pickled optimizer (``model = checkpoint["model"]``,
    ``optimizer = checkpoint["optimizer"]``) and then moved is reported: no statement can go before the
    unpickling. A move inside a function that receives the model with its optimizer (``def
    train(model, optimizer): model.to(device)``) means the caller built that optimizer first: where every
    caller is in the same module (no other module of the project imports it) and builds the optimizer it
    passes from the model it passes (``optimizer = torch.optim.X(model.parameters())`` in its own scope),
    each caller's model moves just before its optimizer; otherwise the move is reported, unless every caller
    in the project (this module and the modules importing it) moved the model it passes to the device before
    building the optimizer it passes (``model = Net().to(device)``, then ``torch.optim.Adam(model.parameters())``:
    going_modular's engine.train): the move in the function is then a no-op (optimizer_callers.py). A method
    receiving both that moves the model inside an expression (``Trainer.__init__``: ``self.model =
    DDP(model.to(gpu_id), ...)``, the optimizer built by ``load_train_objs()``) is reported the same way. In code that
    already runs on torch_xla it only reports (the move and the re-tie below), as every rule does there.

Why:
    On CUDA, ``Module.to`` keeps the parameter objects (it swaps their storage), so an optimizer built
    before the move still holds the model's parameters. A CPU tensor cannot take an XLA tensor's storage,
    so on XLA the move makes new parameter objects: the optimizer keeps updating the old CPU copies and
    the model never trains, with no error (measured on torch_xla 2.9: the weights stay equal after three
    steps). PyTorch/XLA's documentation asks for the optimizer to be built after the model is moved.

    Tied weights (issue 36): a move of a model whose class ties two modules' weights
    (``self.transformer.wte.weight = self.lm_head.weight``; a class of this module or of the project) is
    followed by the same assignment on the moved object, ``model.transformer.wte.weight =
    model.lm_head.weight``; a Hugging Face ``from_pretrained`` model gets ``model.tie_weights()``. On XLA the
    move gives each module its own copy of a shared parameter: the model would train two tensors where the
    original trained one (analysis/ties.py). A tie the class makes only under ``if <flag>:`` of its
    ``__init__`` is re-made under the same flag in the call's terms (``if args.share_proj:``; a literal flag
    decides it); one under a condition the call cannot tell (``if self.config.tie:``, an ``else``, a class of
    another module) is reported, not re-made: re-tying it always would share weights the user chose not to.

Example:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.cuda()

Use instead:
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.analysis import ties
from xla_migrate.analysis.steps import is_optimizer_name
from xla_migrate.analysis.facts import NOT_OPTIMIZERS, OPTIMIZER_MODULES, is_cuda_device_expr
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.common import short
from xla_migrate.transforms.device import optimizer_callers

PARAMETER_METHODS = ("parameters", "named_parameters")
# A `.to(...)` argument that names a device, not a dtype (`.to(torch.float16)` keeps the parameters).
_DEVICE_WORD = re.compile(r"device|dev\b|cuda|gpu|rank|xla", re.IGNORECASE)


@dataclass(frozen=True)
class _Site:
    model: str
    line: int
    node: cst.CSTNode
    # Where the optimizer's parameters of ``model`` are read: the optimizer, or the earlier statement that
    # listed them (``decay = [p for n, p in model.named_parameters() ...]``).
    read_at: cst.CSTNode | None = None


def _related(optimized: str, moved: str) -> bool:
    """An optimizer over ``optimized``'s parameters loses them to a move of ``moved``: the same module or a
    module that holds it (``model.to(device)`` moves ``model.backbone``'s parameters: DeepLabV3Plus's parameter
    groups). A move of a submodule (``model.head.cuda()``) is reported, not put above the optimizer: the
    submodule may not exist there yet."""
    return optimized == moved or optimized.startswith(moved + ".")


def _parameter_names(function: cst.FunctionDef) -> list[str]:
    params = function.params
    return [p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)]


def _keyed_by_string(value: cst.BaseExpression) -> bool:
    """``checkpoint["optimizer"]`` (or a tuple of such reads): an object read out of a mapping by name."""
    values = [e.value for e in value.elements] if isinstance(value, cst.Tuple) else [value]
    return all(isinstance(v, cst.Subscript) and len(v.slice) == 1 and isinstance(v.slice[0].slice, cst.Index)
               and isinstance(v.slice[0].slice.value, cst.SimpleString) for v in values)


class OptimizerBeforeDeviceMove(Rule):
    code = "XLA107"
    name = "optimizer-before-device-move"
    summary = "an optimizer built from model.parameters() before the model moves: the model moves first"
    on_xla_code = True  # the same silent failure in code that already runs on XLA
    # It also re-ties tied weights after a move (an edit): on a CUDA path of code already on XLA the engine
    # drops that edit, and the report stands.
    reports_only = True

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        # Per function scope (None: the module), in source order.
        self._optimizers: dict[object, list[_Site]] = {}
        self._moves: dict[object, list[_Site]] = {}
        # (scope, name) -> the model whose parameters the name holds (`decay = [p for n, p in
        # model.named_parameters() if ...]`), for optimizers built from such lists.
        self._parameter_lists: dict[tuple[object, str], list[str]] = {}
        self._assigned_by: dict[tuple[object, str], cst.Assign] = {}  # the assignment each list is from
        # (scope, name) -> the constructor call of the object the name holds (``model = GPT(config)``).
        self._made: dict[tuple[object, str], cst.Call] = {}
        self._local_ties = ties.class_ties(ctx.module)
        self._moved_before: set[tuple[object, str]] = set()  # (scope, model) moved above its optimizer
        self._moved_before_callers: set[tuple[object, str, int]] = set()  # (scope, model, optimizer's line)
        # Per scope: names bound to an object read out of a loaded checkpoint (``optimizer =
        # checkpoint["optimizer"]``, ``model = ckpt["model"]``): name -> its line.
        self._unpickled: dict[object, dict[str, int]] = {}
        # Calls by a plain name (``train_and_test(model, ..., optimizer)``), for the callers of a function that
        # moves the model it receives with its optimizer.
        self._calls: dict[str, list[cst.Call]] = {}
        # Per scope: moves of a parameter inside an expression (``self.model = DDP(model.to(rank))``), which only
        # the report of a model received with its optimizer reads (nothing can go before the caller's optimizer).
        self._parameter_moves: dict[object, list[_Site]] = {}

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) != 1 or not _keyed_by_string(node.value):
            return  # `optimizers[0]` is a list of built ones; a checkpoint is read by key
        target = node.targets[0].target
        names = [target] if isinstance(target, cst.Name) else [
            e.value for e in getattr(target, "elements", ()) if isinstance(e.value, cst.Name)]
        for name in names:
            self._unpickled.setdefault(self.ctx.function_scope(node), {})[name.value] = self.ctx.position(node)[0]

    def visit_Call(self, node: cst.Call) -> None:
        self._note_parameter_list(node)
        if isinstance(node.func, cst.Name):
            self._calls.setdefault(node.func.value, []).append(node)
        if self._is_optimizer(node):
            for model in self._models_in(node):
                self._optimizers.setdefault(self.ctx.function_scope(node), []).append(
                    _Site(model, self.ctx.position(node)[0], node, self._parameters_read_at(node, model)))
            return
        model = self._moved_module(node)
        if model is not None:
            self._moves.setdefault(self.ctx.function_scope(node), []).append(
                _Site(model, self.ctx.position(node)[0], node))
        else:
            self._note_parameter_move(node)
        self._note_made(node)

    def _note_parameter_move(self, node: cst.Call) -> None:
        """``model.to(device)`` / ``model.cuda()`` inside an expression, of a name the function receives."""
        method = patterns.method_call(node, "cuda", "to")
        if method is None or not isinstance(method.value, cst.Name):
            return
        if method.attr.value == "to" and not self._names_a_device(node):
            return
        scope = self.ctx.function_scope(node)
        function = getattr(scope, "node", None)
        if isinstance(function, cst.FunctionDef) and method.value.value in _parameter_names(function):
            self._parameter_moves.setdefault(scope, []).append(
                _Site(method.value.value, self.ctx.position(node)[0], node))

    def _note_made(self, node: cst.Call) -> None:
        """``model = GPT(config)`` / ``model = GPT(config).to(device)``: what ``model`` holds, for its ties."""
        parent = self.ctx.parent(node)
        if not (isinstance(parent, cst.Assign) and parent.value is node and len(parent.targets) == 1
                and isinstance(parent.targets[0].target, cst.Name)):
            return
        made = node
        while isinstance(made.func, cst.Attribute) and isinstance(made.func.value, cst.Call) and \
                made.func.attr.value in ("to", "cuda", "train", "eval", "float"):
            made = made.func.value
        if not ties.ties_of_class(self.ctx, made, self._local_ties):
            return
        key = (self.ctx.function_scope(node), parent.targets[0].target.value)
        self._made[key] = made
        if made is not node and self._moved_module(node) is None and patterns.method_call(node, "cuda", "to") \
                and (patterns.method_call(node, "cuda") or self._names_a_device(node)):
            self._retie(parent.targets[0].target.value, made, node)  # made and moved in one statement

    def _retie_lines(self, model: str, made: cst.Call | None, move: cst.CSTNode | None = None) -> list[str]:
        """The statements that tie ``model``'s shared weights again after a move (none: nothing is tied), each
        under the condition the class tied it; a tie whose condition the call cannot tell is reported at
        ``move`` (issue 36: re-tying it always would share weights the user chose not to share)."""
        found = ties.ties_of_class(self.ctx, made, self._local_ties) if made is not None else None
        if not found:
            return []
        if found == "hf":
            return [f"{model}.tie_weights()"]
        lines, unknown = ties.retie_code(model, found, made)  # type: ignore[arg-type]
        if move is not None and unknown:
            shown = ", ".join(f"{model}.{t.left} = {model}.{t.right}" for t in unknown)
            self.finding(move, f"the model ties `{shown}` only under a condition of its class: on XLA the move "
                               "unties them, and whether to re-tie cannot be told here",
                         "re-tie them after the move under the same condition as the class")
        return lines

    def _retie(self, model: str, made: cst.Call, move: cst.Call) -> None:
        lines = self._retie_lines(model, made, move)
        statement = self.ctx.enclosing_statement(move) if lines else None
        if statement is None:
            return
        following = self._next_statement(statement)
        if following is not None and " ".join(patterns.code_of(following).split()) == " ".join(lines[0].split()):
            return  # already re-tied (the output of an earlier run)
        what = ", ".join(lines)
        why = "on XLA the move gives each module its own copy of a shared weight, and the model would train both"
        if self.ctx.facts.runs_on_xla:  # code already on XLA is reported, never rewritten
            self.finding(move, f"`{short(move)}` unties the model's shared weights: {why}",
                         f"re-tie them after the move: `{'; '.join(lines)}`")
            return
        self.insert_after(statement, [patterns.parsed_statement(line) for line in lines],
                          f"{what}: re-tied after the move ({why})")

    def _next_statement(self, statement: cst.CSTNode) -> cst.CSTNode | None:
        block = self.ctx.parent(statement)
        body = list(getattr(block, "body", ()))
        if statement in body and body.index(statement) + 1 < len(body):
            return body[body.index(statement) + 1]
        return None

    def leave_Module(self, original_node: cst.Module) -> None:
        for scope, moves in self._parameter_moves.items():
            for move in moves[:1]:
                self._report_optimizer_argument(scope, move)
        for scope, moves in self._moves.items():
            for move in moves:
                made = self._made.get((scope, move.model))
                if made is not None:
                    self._retie(move.model, made, move.node)  # type: ignore[arg-type]
                self._report_unpickled_optimizer(scope, move)
                self._report_optimizer_argument(scope, move)
                built = [o for o in self._optimizers.get(scope, [])
                         if _related(o.model, move.model) and o.line < move.line]
                if not built:
                    self._report_submodule_move(scope, move)
                    continue
                first = built[0]
                read_at = first.read_at or first.node
                if any(_related(move.model, m.model) and m.line < self.ctx.position(read_at)[0] for m in moves):
                    continue  # moved before the optimizer too (the output of an earlier run): it holds those
                if (scope, move.model) in self._moved_before:
                    continue  # a second move after the same optimizer: the first one's edit covers it
                statement = self.ctx.enclosing_statement(read_at)
                # Code already on XLA is reported, never rewritten (the finding below).
                if statement is not None and not self.ctx.facts.runs_on_xla:
                    self._moved_before.add((scope, move.model))
                    device = self.ctx.device_reference(first.node, self.code)
                    lines = [f"{move.model}.to({device})", *self._retie_lines(move.model, made)]
                    self.insert_before(statement, [patterns.parsed_statement(line) for line in lines],
                                       f"{move.model}.to({device}) before the optimizer of line {first.line}: on "
                                       f"XLA the move of line {move.line} makes new parameter objects, so an "
                                       "optimizer built before it would keep the old CPU ones and the model would "
                                       "not train (the later move is then a no-op)")
                    self._report_partial_moves(moves, first)
                    continue
                self.finding(
                    move.node,
                    f"`{short(move.node)}` moves the model after an optimizer was built from its parameters "
                    f"(line {first.line}): on XLA the move makes new parameter objects, so the optimizer "
                    f"keeps the old CPU ones and the model does not train",
                    f"move `{short(move.node)}` above line {first.line}, so that the optimizer is built from "
                    f"the parameters on the device")

    def _report_partial_moves(self, moves: list[_Site], optimizer: _Site) -> None:
        """Moves that only some paths take (``if opts.gpu: model.cuda()`` with no move in the ``else``, a move
        in an ``except`` only): the move put above the optimizer runs on every path, so it is reported with the
        condition. A move in every branch of an ``if``/``elif``/``else`` (DeepLabV3Plus's checkpoint test), in
        a ``try`` body or in a ``finally`` is a move on every path, and so is one under ``if
        torch.cuda.is_available():`` (the migration takes that branch)."""
        later = [m for m in moves if _related(optimizer.model, m.model) and m.line > optimizer.line]
        conditions = [self._partial_condition(m, moves, optimizer) for m in later]
        if not later or None in conditions:
            return  # some path moves the model on every path: the earlier move changes no path
        (line, condition), move = conditions[0], later[0]
        self.finding(
            move.node,
            f"`{short(move.node)}` moves the model only {condition} (line {line}), after the optimizer of line "
            f"{optimizer.line} was built from its parameters: the move put above the optimizer runs on every path",
            "if the other path must keep the model on the CPU, build the optimizer after the move on each path "
            "instead")

    def _partial_condition(self, move: _Site, moves: list[_Site], optimizer: _Site) -> tuple[int, str] | None:
        """The branch (line, words) that holds ``move`` while a sibling path does not move the model, between
        the move and the block of the optimizer; None when the move runs on every path through there."""
        statement = self.ctx.enclosing_statement(optimizer.read_at or optimizer.node)
        around_optimizer = set(self._ancestors(statement)) if statement is not None else set()
        moved_calls = {id(m.node) for m in moves if _related(move.model, m.model)}
        child, parent = move.node, self.ctx.parent(move.node)
        while parent is not None and parent not in around_optimizer:
            other: cst.CSTNode | None = child
            if isinstance(parent, cst.If) and child in (parent.body, parent.orelse):
                other = parent.orelse if child is parent.body else parent.body
                words = f"when `{short(parent.test)}`" if child is parent.body else f"unless `{short(parent.test)}`"
            elif isinstance(parent, cst.ExceptHandler):
                other = self.ctx.parent(parent).body  # the try body: a move there is a move on this path
                words = f"when `except {short(parent.type)}` catches" if parent.type else "when an exception is caught"
            if other is not child and not self._always_moves(other, moved_calls) and not self._checks_cuda(parent):
                return self.ctx.position(parent)[0], words
            child, parent = parent, self.ctx.parent(parent)
        return None

    def _always_moves(self, node: cst.CSTNode | None, moved_calls: set[int]) -> bool:
        """Every path through ``node`` (a block, a branch, a statement) runs one of ``moved_calls``."""
        if isinstance(node, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            return any(id(call) in moved_calls for call in patterns.find_all(node, lambda n: isinstance(n, cst.Call)))
        if isinstance(node, cst.IndentedBlock):
            return any(self._always_moves(statement, moved_calls) for statement in node.body)
        if isinstance(node, cst.If):  # a CUDA check is the branch the migration takes
            return self._always_moves(node.body, moved_calls) and (
                self._checks_cuda(node) or self._always_moves(node.orelse, moved_calls))
        if isinstance(node, (cst.Else, cst.With, cst.Finally)):
            return self._always_moves(node.body, moved_calls)
        if isinstance(node, cst.Try):
            return self._always_moves(node.body, moved_calls) or self._always_moves(node.finalbody, moved_calls)
        return False  # nothing, a loop (it may run no time) or a definition (it runs elsewhere)

    def _report_submodule_move(self, scope: object, move: _Site) -> None:
        """``optimizer = SGD(model.parameters()); model.head.cuda()``: the optimizer loses the head's
        parameters on XLA. ``model.head`` may not exist (or be another module) where the optimizer is built,
        so it is reported."""
        holders = [o for o in self._optimizers.get(scope, [])
                   if move.model.startswith(o.model + ".") and o.line < move.line]
        if holders:
            self.finding(
                move.node,
                f"`{short(move.node)}` moves a part of `{holders[0].model}` after an optimizer was built from its "
                f"parameters (line {holders[0].line}): on XLA the move makes new parameter objects, so the "
                "optimizer keeps the old CPU ones of that part and it does not train",
                f"move `{holders[0].model}` (or this part) to the device above line {holders[0].line}")

    def _ancestors(self, node: cst.CSTNode) -> list[cst.CSTNode]:
        found = []
        while node is not None:
            found.append(node)
            node = self.ctx.parent(node)
        return found

    def _checks_cuda(self, node: cst.CSTNode) -> bool:
        """``if torch.cuda.is_available():``: the migration takes that branch on XLA, so it is every path."""
        test = getattr(node, "test", None)
        return test is not None and any(
            any(n.startswith("torch.cuda.") for n in self.ctx.qualnames(call.func))
            for call in patterns.find_all(test, lambda n: isinstance(n, cst.Call)))

    def _report_unpickled_optimizer(self, scope: object, move: _Site) -> None:
        """``model = checkpoint["model"]; optimizer = checkpoint["optimizer"]``, then the model moves: the
        unpickled optimizer holds the unpickled model's CPU parameters, which the move replaces on XLA. No
        statement can go before an unpickling, so it is reported (sr_resnet's resumed branch)."""
        loaded = self._unpickled.get(scope, {})
        if loaded.get(move.model, move.line) >= move.line:
            return  # the model was not read out of a checkpoint before this move
        optimizers = sorted((line, name) for name, line in loaded.items()
                            if is_optimizer_name(name) and line < move.line)
        if not optimizers:
            return
        line, name = optimizers[0]
        self.finding(
            move.node,
            f"`{short(move.node)}` moves a model read out of a checkpoint whose optimizer `{name}` (line {line}) "
            "was unpickled with it: the optimizer holds the CPU parameters, on XLA the move makes new ones, and "
            "the resumed run would not train",
            f"save and load state_dicts instead of whole objects, or build the optimizer again after the move "
            f"and load its state: `{name}.load_state_dict(...)`")

    def _report_optimizer_argument(self, scope: object, move: _Site) -> None:
        """``def train_and_test(model, ..., optimizer, ...): model.to(device)``: the model and its optimizer
        come in as arguments, so the caller built the optimizer before this move (atcold_seq's notebook: on
        XLA it stepped CPU parameters that never got a gradient). Where every caller is in this module and
        builds that optimizer from that model in its own scope, the model moves before each of them (the move
        in the function is then a no-op); otherwise it is reported."""
        function = getattr(scope, "node", None)
        if not isinstance(function, cst.FunctionDef) or self._optimizers.get(scope):
            return
        names = _parameter_names(function)
        if move.model not in names:
            return
        optimizers = [name for name in names if is_optimizer_name(name)]
        if not optimizers or self._move_before_callers_optimizers(function, names, move.model, optimizers[0]):
            return
        project = self.ctx.project
        if project is not None and isinstance(self.ctx.parent(function), cst.Module) and \
                optimizer_callers.every_caller_moved_first(project.index, project.rel, self.ctx.module.code,
                                                           function.name.value, names, move.model, optimizers[0]):
            return  # each caller's model was on the device before its optimizer: this move is a no-op
        owner = self.ctx.parent(self.ctx.parent(function))
        where = f"{owner.name.value}.{function.name.value}" if isinstance(owner, cst.ClassDef) else function.name.value
        self.finding(
            move.node,
            f"`{short(move.node)}` moves a model that `{where}` receives with its optimizer "
            f"`{optimizers[0]}`: the caller built the optimizer before this move, so on XLA it keeps the old "
            "CPU parameters and the model does not train",
            f"move the model to the device where it is made, before its optimizer is built (and keep this "
            f"move as a no-op)")

    def _move_before_callers_optimizers(self, function: cst.FunctionDef, names: list[str], model: str,
                                        optimizer: str) -> bool:
        """Each caller's ``optimizer = torch.optim.X(m.parameters())`` gets ``m.to(device)`` above it. Only
        for a module-level function called here and nowhere else in the project (an importer's callers are
        not in this file), each call passing plain names, each optimizer built by an assignment to that name
        in the caller's scope before the call; else nothing is edited."""
        project = self.ctx.project
        calls = self._calls.get(function.name.value, [])
        if (not calls or not isinstance(self.ctx.parent(function), cst.Module)
                or (project is not None and project.index.importers(project.rel))):
            return False
        sites = []
        for call in calls:
            passed = [patterns.argument(call, names.index(name), name) for name in (model, optimizer)]
            passed = [None if arg is None else arg.value for arg in passed]
            if not all(isinstance(value, cst.Name) for value in passed):
                return False
            site = self._optimizer_assigned(call, passed[0].value, passed[1].value)  # type: ignore[union-attr]
            if site is None:
                return False
            sites.append(site)
        moving = [(site, statement) for site, statement in sites if not self._moved_above(site)]
        if moving and self.ctx.facts.runs_on_xla:
            return False  # code already on XLA is reported, never rewritten
        for site, statement in moving:
            self._moved_before_callers.add((self.ctx.function_scope(site.node), site.model, site.line))
            device = self.ctx.device_reference(site.node, self.code)
            self.insert_before(statement, [self.ctx.statement(f"{site.model}.to({device})")],
                               f"{site.model}.to({device}) before the optimizer of line {site.line}: "
                               f"`{function.name.value}` moves the model it receives with this optimizer, and on "
                               "XLA that move makes new parameter objects, so the optimizer would keep the old "
                               "CPU ones and the model would not train (the move in the function is then a no-op)")
        return True

    def _moved_above(self, site: _Site) -> bool:
        """The model moves between its binding and this optimizer already (the output of an earlier run), or
        another call's edit moves it there."""
        scope = self.ctx.function_scope(site.node)
        made = self._made_line(scope, site)
        return (scope, site.model, site.line) in self._moved_before_callers or any(
            _related(site.model, m.model) and made <= m.line < site.line for m in self._moves.get(scope, []))

    def _optimizer_assigned(self, call: cst.Call, model: str, optimizer: str) -> tuple[_Site, cst.CSTNode] | None:
        """The last optimizer built from ``model`` in the call's scope before it, bound by ``optimizer = ...``."""
        scope, line = self.ctx.function_scope(call), self.ctx.position(call)[0]
        built = [o for o in self._optimizers.get(scope, []) if o.model == model and o.line < line]
        if not built:
            return None
        site = built[-1]
        statement = self.ctx.enclosing_statement(site.read_at or site.node)
        assign = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and \
            len(statement.body) == 1 else None
        if not (isinstance(assign, cst.Assign) and assign.value is site.node and len(assign.targets) == 1
                and patterns.dotted_name(assign.targets[0].target) == optimizer):
            return None
        return site, statement

    def _made_line(self, scope: object, site: _Site) -> int:
        """The line the model was last bound on before its optimizer (0 when unknown): a move above that
        binding moved an earlier object of the same name."""
        assignments = getattr(scope, "assignments", None)
        if assignments is None or "." in site.model:
            return 0
        lines = [self.ctx.position(a.node)[0] for a in assignments[site.model]]
        return max((line for line in lines if line <= site.line), default=0)

    def _note_parameter_list(self, node: cst.Call) -> None:
        """``model.parameters()`` in the value of ``name = ...``: ``name`` holds ``model``'s parameters.
        Noted from the call (each is visited anyway; walking every assigned value for such calls was this
        rule's main cost), so an assignment's list grows by its calls in source order."""
        method = patterns.method_call(node, *PARAMETER_METHODS)
        model = patterns.dotted_name(method.value) if method is not None else None
        assignment = self._assignment_valued_with(node) if model is not None else None
        if assignment is None:
            return
        scope = self.ctx.function_scope(assignment)
        for target in assignment.targets:
            if isinstance(target.target, cst.Name):
                key = (scope, target.target.value)
                models = self._parameter_lists.get(key)
                if models is None or self._assigned_by.get(key) is not assignment:
                    models = self._parameter_lists[key] = []  # a later assignment of the name replaces it
                    self._assigned_by[key] = assignment
                if model not in models:
                    models.append(model)

    def _assignment_valued_with(self, node: cst.CSTNode) -> cst.Assign | None:
        """The assignment whose value holds ``node`` (through lambdas and comprehensions), if any."""
        child, parent = node, self.ctx.parent(node)
        while parent is not None and not isinstance(parent, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
            child, parent = parent, self.ctx.parent(parent)
        return parent if isinstance(parent, cst.Assign) and parent.value is child else None

    def _is_optimizer(self, node: cst.Call) -> bool:
        return any(n.startswith(OPTIMIZER_MODULES) and not any(x in n for x in NOT_OPTIMIZERS)
                   for n in self.ctx.qualnames(node.func))

    def _models_in(self, node: cst.Call) -> list[str]:
        """The spellings whose parameters the optimizer's arguments read: ``model.parameters()`` directly,
        in parameter groups, or through a list of them bound earlier in the function."""
        scope = self.ctx.function_scope(node)
        models: list[str] = []
        for arg in node.args:
            models += self._parameters_read_in(arg.value)
            for name in patterns.find_all(arg.value, lambda n: isinstance(n, cst.Name)):
                models += self._parameter_lists.get((scope, name.value), [])
        return list(dict.fromkeys(models))

    def _parameters_read_at(self, node: cst.Call, model: str) -> cst.CSTNode:
        """The first place the optimizer's arguments read ``model``'s parameters: a list bound earlier, or the
        optimizer call itself."""
        scope = self.ctx.function_scope(node)
        earliest: cst.CSTNode = node
        for arg in node.args:
            for name in patterns.find_all(arg.value, lambda n: isinstance(n, cst.Name)):
                listed = self._assigned_by.get((scope, name.value))
                if listed is not None and model in self._parameter_lists.get((scope, name.value), []) and \
                        self.ctx.position(listed) < self.ctx.position(earliest):
                    earliest = listed
        return earliest

    @staticmethod
    def _parameters_read_in(expression: cst.BaseExpression) -> list[str]:
        models: list[str] = []
        for call in patterns.find_all(expression, lambda n: isinstance(n, cst.Call)):
            method = patterns.method_call(call, *PARAMETER_METHODS)
            model = patterns.dotted_name(method.value) if method is not None else None
            if model is not None and model not in models:
                models.append(model)
        return models

    def _moved_module(self, node: cst.Call) -> str | None:
        """``X.cuda(...)`` or ``X.to(<a device>)`` as a statement or as ``X = X.<move>``: the spelling X."""
        method = patterns.method_call(node, "cuda", "to")
        receiver = patterns.dotted_name(method.value) if method is not None else None
        if receiver is None or not self._is_statement_move(node, receiver):
            return None
        if method.attr.value == "to" and not self._names_a_device(node):
            return None
        return receiver

    def _is_statement_move(self, node: cst.Call, receiver: str) -> bool:
        parent = self.ctx.parent(node)
        if isinstance(parent, cst.Expr):
            return True
        return (isinstance(parent, cst.Assign) and parent.value is node
                and any(patterns.dotted_name(t.target) == receiver for t in parent.targets))

    def _names_a_device(self, node: cst.Call) -> bool:
        device = patterns.keyword(node, "device")
        args = patterns.positional(node)
        value = device.value if device is not None else (args[0].value if args else None)
        if value is None:
            return False
        if is_cuda_device_expr(value, self.ctx.qualnames):
            return True
        if isinstance(value, cst.Call) and "torch.device" in self.ctx.qualnames(value.func):
            return True
        spelling = patterns.dotted_name(value) or ""
        return bool(_DEVICE_WORD.search(spelling.rsplit(".", 1)[-1]))
