"""XLA315 persistent-compile-cache: the program's entry file sets up torch_xla's persistent compilation cache.

What it does:
    In the file a program starts from (a ``__main__`` block, training code at module level, a module-level
    call of one of its own functions such as ``main()``, or a launcher; in a project also no other module
    imports it) that uses a device or runs a training or evaluation loop, inserts once, right after the
    leading imports::

        xr.initialize_cache(os.path.expanduser("~/.cache/xla_compile"), readonly=False)

    Module level, before anything runs on the device, so each process calls it once before its first
    computation: a script started by ``torchrun`` runs it in every process, and a launcher's workers
    (``torch_xla.launch``, ``xmp.spawn``; their processes start with the "spawn" method) run the module's
    code again when they import it, and inherit the settings besides. Not in a notebook (a cell run twice
    would call it after the first computation, which torch_xla refuses), nor in a file that already calls it
    or builds an ``accelerate.Accelerator``, nor in a project's ``hubconf.py`` or a module that another imports,
    even with ``from module import *`` (``torch.hub`` or the importer runs it after the first computation),
    nor in a helper module that only binds a device and defines functions (a notebook or a user's script
    imports it after training: "Computation cache has already been initialized" at the import). A script that
    is run on its own and also imported by another module of the project (no launcher) gets the call as the
    first statement of its ``if __name__ == "__main__":`` block instead, which runs only when it is the program.
    The ``2.9`` target only. The cache folder is in the change's
    message.

Why:
    XLA compiles every distinct step graph; on a TPU a large model's first steps spend minutes compiling,
    again at every start of the program. With the persistent cache, a later run (a restart, the next job
    of a sweep, the evaluation run) loads the compiled programs from the folder instead. torch_xla requires
    the call before any computation ("Computation cache has already been initialized" otherwise). On the CPU
    (PJRT_DEVICE=CPU) torch_xla cannot load a cached program back: it logs "Deserializing serialized
    executable not supported" and compiles as before.

Example:
    import torch

    def main():
        ...

Use instead:
    import os
    import torch
    import torch_xla.runtime as xr

    xr.initialize_cache(os.path.expanduser("~/.cache/xla_compile"), readonly=False)

    def main():
        ...
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.engine.rule import Rule
from xla_migrate.syntax import patterns
from xla_migrate.transforms.common import statement_after_imports

CACHE_FOLDER = "~/.cache/xla_compile"
INITIALIZE_CACHE = "torch_xla.runtime.initialize_cache"
_NOTEBOOK_CELL = "# xla-migrate:cell"
_COMMENT = "# Persistent compilation cache: later runs of the program reuse the compiled graphs."


class PersistentCompileCache(Rule):
    code = "XLA315"
    name = "persistent-compile-cache"
    summary = "the entry file sets up torch_xla's persistent compilation cache (xr.initialize_cache) once"
    targets = ("2.9",)

    def visit_Module(self, node: cst.Module) -> None:
        ctx = self.ctx
        in_main_block = self._imported_entry()
        if not (in_main_block or self._entry(node)) or ctx.facts.uses_accelerate or _NOTEBOOK_CELL in ctx.input_code:
            return
        if not (ctx.facts.device_bindings or ctx.steps.loops):
            return
        if any(INITIALIZE_CACHE in ctx.qualnames(call.func) for call in self._calls(node)):
            return
        os_name = ctx.local_name("os", "os")
        code = ctx.spell("compile_cache", f'{os_name}.path.expanduser("{CACHE_FOLDER}")')
        statement = ctx.statement(code).with_changes(
            leading_lines=[cst.EmptyLine(comment=cst.Comment(_COMMENT))])
        message = (f"persistent compilation cache in {CACHE_FOLDER}: {code} (once per process, before the first "
                   "device use; later runs load compiled graphs instead of compiling)")
        if in_main_block:
            guard = ctx.facts.main_guard
            first = guard.body.body[0]
            self.insert_before(first, [statement.with_changes(leading_lines=[])],
                               f"{message}; in the __main__ block: another module imports this file, and a "
                               "second initialize_cache there would raise")
            return
        first = statement_after_imports(node)
        if first is None:
            return
        self.insert_before(first, [statement], message)

    def _imported_entry(self) -> bool:
        """A script run on its own (a ``__main__`` block, no launcher: its workers would not run the block) that
        another project module also imports: the cache goes inside its ``__main__`` block, which only runs when
        this file is the program (issue 29: SupContrast's main_ce.py, cleanrl's dqn.py)."""
        ctx = self.ctx
        if ctx.project is None or ctx.facts.main_guard is None:
            return False
        guard = ctx.facts.main_guard
        info = ctx.project.index.modules[ctx.project.rel]
        return (bool(ctx.project.index.importers(ctx.project.rel)) and not info.launcher
                and isinstance(guard.body, cst.IndentedBlock) and bool(guard.body.body)
                and ctx.project.rel.rsplit("/", 1)[-1] != "hubconf.py")

    def _entry(self, node: cst.Module) -> bool:
        ctx = self.ctx
        if not self._starts_program(node):
            # A helper module (device bound at module level, functions only): a notebook or a user's script
            # imports it after its first computation, and initialize_cache then raises (issue 29).
            return False
        if ctx.project is not None:
            # An entry file no other module imports: a module imported late (inside a function, after the
            # first computation) would call it too late, and torch_xla refuses that.
            # torch.hub imports a repository's hubconf.py into the user's running program: never an entry.
            return ctx.project.is_entry and not ctx.project.index.importers(ctx.project.rel) and \
                ctx.project.rel.rsplit("/", 1)[-1] != "hubconf.py"
        return True

    def _starts_program(self, node: cst.Module) -> bool:
        """The file runs a program when executed: a ``__main__`` block, a training or evaluation loop at module
        level, or a module-level call of one of its own functions (``main()`` without the guard) or a launcher."""
        ctx = self.ctx
        if ctx.facts.main_guard is not None or any(s.function is None for s in ctx.steps.loops.values()):
            return True
        if ctx.project is not None and ctx.project.index.modules[ctx.project.rel].launcher:
            return True
        functions = {s.name.value for s in node.body if isinstance(s, cst.FunctionDef)}
        for statement in node.body:
            if not isinstance(statement, cst.SimpleStatementLine):
                continue
            for small in statement.body:
                value = getattr(small, "value", None)
                if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in functions:
                    return True
        return False

    def _calls(self, node: cst.Module) -> list[cst.Call]:
        return patterns.find_all(node, lambda n: isinstance(n, cst.Call) and patterns.method_call(
            n, "initialize_cache") is not None)  # type: ignore[return-value]
