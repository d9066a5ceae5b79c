"""XLA903 torch-compile-on-xla: torch.compile goes on a training script; inference keeps it with the openxla backend.

What it does:
    In a script that trains (it calls ``.backward()``, has a training loop, or calls a library trainer's
    ``train()``/``fit()``), every ``torch.compile`` whose backend is not ``"openxla"`` is dropped, with a finding: ``model = torch.compile(model)`` is
    removed, ``fast = torch.compile(model, mode=...)`` becomes ``fast = model``, a ``@torch.compile``
    decorator goes. In a script that only runs models forward (sampling, evaluation), the call keeps its
    arguments and gets ``backend="openxla"`` (in place of another backend and of inductor's ``mode=`` and
    ``options=``); the ``sagemaker`` target (torch_xla 1.13 API, whose dynamo backend was another one) drops
    it there too. Code that already runs on torch_xla is only reported. Unlike the other XLA9xx rules
    this one rewrites: an inductor ``torch.compile`` cannot run on XLA tensors at all.

Why:
    The default inductor backend generates Triton/CUDA or CPU code, not XLA programs: on XLA tensors it fails
    (InductorError). On torch_xla the lazy tensor graph of a step is already compiled by XLA. torch_xla's
    dynamo backend (``backend="openxla"``) suits inference; on a training model it ran forward, backward and
    the optimizer as separate graphs, 4x the graph executions per step of the same step without it
    (measured on torch_xla 2.9), so a training script is better off without ``torch.compile``.

Example:
    model = torch.compile(model)
    generator = torch.compile(generator, mode="reduce-overhead")   # in a sampling script

Use instead:
    generator = torch.compile(generator, backend="openxla")       # the training script's line is removed
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.analysis import steps
from xla_migrate.engine.rule import Rule
from xla_migrate.syntax import patterns
from xla_migrate.transforms.common import short

COMPILE = "torch.compile"
# Inductor's own options: the openxla backend takes none of them.
INDUCTOR_KEYWORDS = ("backend", "mode", "options")
DROPPED = ("torch.compile is dropped: XLA already compiles each step into one graph (on a training model "
           "torch_xla's openxla dynamo backend runs forward, backward and the optimizer as separate graphs, "
           "about 4x the graph executions per step)")
FIX = ("nothing to do for training; for an inference-only module on torch_xla 2.1 or later, "
       "torch.compile(module, backend=\"openxla\") is torch_xla's dynamo path")


class TorchCompileOnXla(Rule):
    code = "XLA903"
    name = "torch-compile-on-xla"
    summary = "torch.compile: dropped in a training script, backend='openxla' for inference only"
    fix_safety = "review"
    on_xla_code = True  # code already on XLA: reported only
    reports_only = True

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._trains: bool | None = None

    def _training(self) -> bool:
        if self._trains is None:
            self._trains = ("backward(" in self.ctx.input_code or bool(self.ctx.steps.training_loops)
                            or steps.trains_through_a_trainer(self.ctx))
        return self._trains

    def _has_openxla(self) -> bool:
        return "dynamo_backend" in self.ctx.target.spellings

    def visit_Call(self, node: cst.Call) -> None:
        if COMPILE not in self.ctx.qualnames(node.func) or self._openxla(node):
            return
        if self.ctx.facts.runs_on_xla:
            self._report(node, node)
        elif self._training() or not self._has_openxla():
            self._drop(node)
        else:
            self._to_openxla(node)

    def visit_Decorator(self, node: cst.Decorator) -> None:
        # `@torch.compile` without arguments (with arguments it is a Call, handled above and here).
        decorator = node.decorator
        func = decorator.func if isinstance(decorator, cst.Call) else decorator
        if COMPILE not in self.ctx.qualnames(func):
            return
        if isinstance(decorator, cst.Call) and (self._openxla(decorator) or self.ctx.facts.runs_on_xla
                                                or not (self._training() or not self._has_openxla())):
            return  # reported or rewritten as a call
        if self.ctx.facts.runs_on_xla:
            self._report(node, None)
        elif self._training() or not self._has_openxla():
            self._remove_decorator(node)
        else:
            backend = self.ctx.spell("dynamo_backend")
            self.replace(node, lambda u: u.with_changes(decorator=patterns.parsed_expression(
                f'{patterns.code_of(u.decorator)}(backend={backend})')),
                         f"@{short(decorator)} -> @{short(decorator)}(backend=\"openxla\") (inference only)")

    # Rewrites ------------------------------------------------------------------------------------------------
    def _drop(self, node: cst.Call) -> None:
        parent = self.ctx.parent(node)
        if isinstance(parent, cst.Decorator):
            return  # the decorator's own visit removes it
        args = patterns.positional(node)
        target = args[0].value if args else (patterns.keyword(node, "model") or patterns.keyword(node, "fn"))
        if isinstance(target, cst.Arg):
            target = target.value
        if target is None:
            self._report(node, node)
            return
        self.finding(node, f"{short(node)}: {DROPPED}", FIX)
        self.import_may_be_dead("torch", "compile")
        statement = self.ctx.parent(parent) if isinstance(parent, cst.Assign) else None
        if (isinstance(parent, cst.Assign) and len(parent.targets) == 1 and parent.value is node
                and patterns.dotted_name(parent.targets[0].target) == patterns.dotted_name(target)
                and patterns.dotted_name(target) is not None
                and isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
            self.remove(parent, f"removed {short(parent)}: torch.compile does not run on XLA tensors")
            return
        self.replace(node, lambda updated: _first(updated),
                     f"{short(node)} -> {short(target)}: torch.compile does not run on XLA tensors")

    def _remove_decorator(self, node: cst.Decorator) -> None:
        function = self.ctx.parent(node)
        if not isinstance(function, (cst.FunctionDef, cst.ClassDef)):
            return
        self.finding(node, f"@{short(node.decorator)}: {DROPPED}", FIX)
        self.import_may_be_dead("torch", "compile")
        self.replace(function, lambda updated: updated.with_changes(
            decorators=[d for d in updated.decorators if not _is_compile_decorator(d, node)]),
            f"removed @{short(node.decorator)}: torch.compile does not run on XLA tensors")

    def _to_openxla(self, node: cst.Call) -> None:
        if isinstance(self.ctx.parent(node), cst.Decorator) and not node.args:
            return

        backend_value = patterns.parsed_expression(self.ctx.spell("dynamo_backend"))

        def openxla(updated: cst.Call) -> cst.Call:
            kept = [a for a in updated.args if a.keyword is None or a.keyword.value not in INDUCTOR_KEYWORDS]
            backend = cst.Arg(backend_value, keyword=cst.Name("backend"),
                              equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
            comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            return updated.with_changes(args=[*[a.with_changes(comma=comma) for a in kept], backend])

        self.replace(node, openxla, f"{short(node)}: backend=\"openxla\" (torch_xla's dynamo backend; the "
                     "script only runs models forward)")

    def _report(self, node: cst.CSTNode, call: cst.Call | None) -> None:
        backend = patterns.keyword(call, "backend") if call is not None else None
        named = patterns.string_value(backend.value) if backend is not None else None
        what = f'backend "{named}"' if named else ("a custom backend" if backend is not None else "the default inductor backend")
        self.finding(node, f"torch.compile with {what} does not produce XLA programs",
                     'drop torch.compile on a training model (XLA already compiles each step\'s graph); pass '
                     'backend="openxla" (torch_xla\'s dynamo backend) for an inference-only module')

    @staticmethod
    def _openxla(call: cst.Call) -> bool:
        backend = patterns.keyword(call, "backend")
        return backend is not None and patterns.string_value(backend.value) == "openxla"


def _first(call: cst.Call) -> cst.BaseExpression:
    args = patterns.positional(call)
    if args:
        return args[0].value
    arg = patterns.keyword(call, "model") or patterns.keyword(call, "fn")
    return arg.value


def _is_compile_decorator(decorator: cst.Decorator, original: cst.Decorator) -> bool:
    """The updated decorator that stands for ``original`` (compared by code: decorators are few)."""
    return patterns.code_of(decorator.decorator) == patterns.code_of(original.decorator)
