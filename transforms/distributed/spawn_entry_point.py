"""XLA407 spawn-entry-point: a distributed script starts its workers with the XLA launcher through _mp_fn.

What it does:
    In a distributed script (Hugging Face scripts are XLA602's):

    - ``mp.spawn(worker, args=(...), nprocs=n, join=True)`` -> ``xmp.spawn(worker, args=(...))``
      (``torch_xla.launch(worker, args=(...))`` on ``2.9``): both call ``worker(index, *args)``; the XLA
      launcher starts one worker per device, so ``nprocs`` and ``join`` go. A device count the launcher
      passes to the workers (``ngpus_per_node = torch.cuda.device_count()``, then ``batch_size /
      ngpus_per_node`` in the worker) is CUDA's, 0 on an XLA host: the worker rebinds that parameter to the
      XLA world size first thing (one process per device; on one host, the device count). So does an
      attribute of an object passed to the workers that holds the count (barlowtwins:
      ``args.ngpus_per_node = torch.cuda.device_count()``, ``args.world_size = args.ngpus_per_node``):
      ``args.world_size = xr.world_size()`` at the top of the worker. The process group's ``world_size=`` and
      ``rank=`` attributes the launcher computed from the count (barlowtwins on SLURM: ``args.rank = node_id *
      args.ngpus_per_node``) are rebound too: the rank to ``xr.global_ordinal()`` right after the worker's own
      update of it (``args.rank += gpu``; ImageNet's ``args.rank = args.rank * ngpus_per_node + gpu``), so
      ``batch_size // args.world_size`` and the rank-0 tests see the XLA runtime's numbers.
    - Otherwise (torchrun scripts), ``def _mp_fn(index): main()`` is added once, right after the entry
      function, and the ``__main__`` block launches it instead of calling the entry function:
      ``main(args)`` becomes ``xmp.spawn(_mp_fn, args=(args,))`` with ``def _mp_fn(index, args):
      main(args)``. The entry function is the module-level function the ``__main__`` block calls (or a
      ``main()`` called at the top level, which gets a ``__main__`` guard). Where the block calls several
      functions of the script, the one launched is ``main``, else the first when it runs the training; when
      neither (stylegan2's block calls ``accumulate(g_ema, generator, 0)`` before ``train(...)``), nothing is
      launched and the block is reported. In the ddp form under ``xmp.spawn`` (``sagemaker``), a process group
      the block initialised before the launch is initialised in ``_mp_fn`` instead (XLA404 removes it there).
    - A program whose entry imports a module that launches the workers itself (detectron2's
      ``engine.launch``: its ``mp.start_processes`` becomes the XLA launch) is not launched again: one launch
      per program, and the report says which one starts the workers.
    - A script with no such function is reported: wrap its top-level training code in ``def main():``.
      (``--data-parallel auto`` gives a torchrun script of that shape the ddp form on ``2.9``, which keeps
      torchrun as its launcher: analysis/torchrun_script.py.)
    - Where the XLA device is created at import time (a module-level ``device = xm.xla_device()``), a
      finding says to create it inside the worker.
    - In a project (a tree run, or ``--project``), only entry files get the entry point: a helper module
      that other modules import (``utils.py`` with the distributed setup) is launched by its entry file.
    - The spmd form (``--data-parallel spmd``) starts no workers: XLA414 gives it its entry.

Why:
    The seeds: the runtime calls ``_mp_fn(index)`` once per worker. torchrun starts the processes for a
    CUDA script; on XLA ``xmp.spawn`` / ``torch_xla.launch`` (torch_xla 2.5+) start them, one per device,
    each with its ordinal set. The device must be created in the worker: using it in the parent before the
    spawn initialises the runtime there, and the spawn then fails.

Example:
    def main():
        train()


    if __name__ == "__main__":
        main()

Use instead:
    def main():
        train()


    def _mp_fn(index):
        # Called once per XLA worker (index: the worker's ordinal).
        main()


    if __name__ == "__main__":
        xmp.spawn(_mp_fn, args=())
"""

from __future__ import annotations

import keyword

import libcst as cst
from libcst.metadata import GlobalScope

from xla_migrate.syntax import patterns
from xla_migrate.analysis.facts import INIT_PROCESS_GROUP, MP_SPAWN
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.common import short
from xla_migrate.transforms.distributed import distributed_common as common

LAUNCHERS = ("torch_xla.distributed.xla_multiprocessing.spawn", "torch_xla.launch")
_MP_FN = "_mp_fn"


class SpawnEntryPoint(Rule):
    code = "XLA407"
    name = "spawn-entry-point"
    summary = "mp.spawn -> xmp.spawn; torchrun scripts get def _mp_fn(index): main() launched from __main__"
    fix_safety = "review"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._spawns: list[cst.Call] = []
        self._launched = False
        self._functions: dict[str, cst.FunctionDef] = {}

    def visit_Call(self, node: cst.Call) -> None:
        names = self.ctx.qualnames(node.func)
        if names & set(MP_SPAWN):
            self._spawns.append(node)
        elif names & set(LAUNCHERS):
            self._launched = True

    def visit_Module(self, node: cst.Module) -> None:
        for statement in node.body:
            if isinstance(statement, cst.FunctionDef):
                self._functions[statement.name.value] = statement

    def leave_Module(self, original_node: cst.Module) -> None:
        ctx = self.ctx
        if not ctx.distributed or getattr(ctx.facts, "is_hf_script", False) or ctx.spmd_form:
            return  # the spmd form runs one process per host, no launcher (XLA414)
        if ctx.project is not None and not ctx.project.is_entry and not self._spawns:
            return  # a helper module of a project: the entry file launches the workers
        if self._spawns:
            for call in self._spawns:
                self._convert(call)
        elif _MP_FN in self._functions or self._launched:
            return
        elif ctx.ddp_form and not ctx.xla_launched:
            return  # the ddp form keeps the launcher: torchrun starts the workers, xla:// finds them
        elif self._launched_elsewhere():
            return
        elif not self._entry_point():
            return
        self._device_at_import()

    # mp.spawn(fn, args=..., nprocs=...) ----------------------------------------------------------------------
    def _convert(self, node: cst.Call) -> None:
        positional = patterns.positional(node)
        fn = positional[0].value if positional else (patterns.keyword(node, "fn").value
                                                      if patterns.keyword(node, "fn") else None)
        args = patterns.keyword(node, "args") or (positional[1] if len(positional) > 1 else None)
        if fn is None or any(a.star for a in node.args):
            self.finding(node, f"{short(node)}: cannot read the spawned function", "launch it with xmp.spawn(fn, args=(...))")
            return
        if args is None:
            inner = ""
        elif isinstance(args.value, cst.Tuple):
            elements = [patterns.code_of(e.value) for e in args.value.elements]
            inner = ", ".join(elements) + ("," if len(elements) == 1 else "")
        else:
            inner = f"*{patterns.code_of(args.value)},"
        new = self.ctx.spell_expression("launch", patterns.code_of(fn), inner)
        if args is not None and isinstance(args.value, cst.Tuple):
            self._device_counts_passed(node, fn, args.value)
        dropped = [a.keyword.value for a in node.args if a.keyword and a.keyword.value not in ("fn", "args")]
        note = f" ({', '.join(dropped)} dropped: one worker per XLA device)" if dropped else ""
        self.replace(node, new, f"{short(node)} -> {short(new, 80)}{note}")
        self.import_may_be_dead("torch.multiprocessing", None)
        self.import_may_be_dead("torch", "multiprocessing")

    def _device_counts_passed(self, node: cst.Call, fn: cst.BaseExpression, args: cst.Tuple) -> None:
        """``ngpus_per_node = torch.cuda.device_count()`` passed to the workers (``batch_size / ngpus_per_node``):
        0 on an XLA host. The worker rebinds its parameter to the XLA world size (one process per device: on
        one host, the device count), first thing in its body."""
        worker = self._functions.get(fn.value) if isinstance(fn, cst.Name) else None
        if worker is None or not isinstance(worker.body, cst.IndentedBlock):
            return
        counts = self._device_count_names(node)
        parameters = worker.params.params
        statements = []
        passed = [(parameters[position + 1].name.value, element.value.value)
                  for position, element in enumerate(args.elements)
                  if position + 1 < len(parameters) and isinstance(element.value, cst.Name)]
        count_parameters = {name for name, value in passed if value in counts}
        for name, value in passed:
            if value in counts:
                statements.append(self.ctx.statement(f"{name} = {self.ctx.spell('world_size')}"))
                continue
            # an object carrying the count (barlowtwins: args.world_size = args.ngpus_per_node = the CUDA count)
            holder = value
            sizes = self._device_count_attributes(node, holder, counts)
            for attribute in sizes:
                statements.append(self.ctx.statement(f"{name}.{attribute} = {self.ctx.spell('world_size')}"))
            self._process_group_from_count(node, worker, holder, name, counts, count_parameters, sizes, statements)
        if not statements:
            return
        statements[0] = statements[0].with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(
            "# The XLA launcher starts one process per XLA device: the launcher's count was CUDA's (0 here)."))])
        first = worker.body.body[0]
        anchor, where = (first, "after") if patterns.is_docstring(first) else (first, "before")
        message = (f"{', '.join(patterns.code_of(s.body[0].targets[0].target) for s in statements)} rebound from "
                   "the XLA runtime in the worker: the launcher computed them from torch.cuda.device_count()")
        (self.insert_after if where == "after" else self.insert_before)(anchor, statements, message)

    def _device_count_attributes(self, node: cst.Call, holder: str, counts: set[str]) -> list[str]:
        """Attributes of ``holder`` the function launching ``node`` binds to the CUDA device count, directly or
        through a count name or another such attribute (``args.world_size = args.ngpus_per_node``), in order."""
        found: list[str] = []
        for assign in patterns.find_all(self._launching_scope(node), lambda n: isinstance(n, cst.Assign)):
            target = assign.targets[0].target if len(assign.targets) == 1 else None
            if not (isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name)
                    and target.value.value == holder):
                continue
            value = assign.value
            if (self.ctx.is_call_to(value, "torch.cuda.device_count")
                    or (isinstance(value, cst.Name) and value.value in counts)
                    or (isinstance(value, cst.Attribute) and isinstance(value.value, cst.Name)
                        and value.value.value == holder and value.attr.value in found)):
                if target.attr.value not in found:
                    found.append(target.attr.value)
        return found

    def _process_group_from_count(self, node: cst.Call, worker: cst.FunctionDef, holder: str, name: str,
                                  counts: set[str], count_parameters: set[str], sizes: list[str],
                                  statements: list) -> None:
        """The worker's ``init_process_group(world_size=args.world_size, rank=args.rank)`` where the launcher
        computed them from the CUDA count (barlowtwins on SLURM: ``args.world_size = nnodes * args.ngpus_per_node``,
        ``args.rank = node_id * args.ngpus_per_node``, then ``args.rank += gpu`` in the worker): 0 or a CUDA
        host's numbers. The world size is rebound with the others; the rank to the runtime's ordinal after the
        worker's last own update of it (the launcher's index is the global ordinal already). So where that update
        uses the count (ImageNet's ``args.rank = args.rank * ngpus_per_node + gpu``)."""
        derived = self._count_derived_attributes(node, holder, counts, sizes)
        for call in patterns.find_all(worker, lambda n: isinstance(n, cst.Call)
                                      and self.ctx.is_call_to(n, *INIT_PROCESS_GROUP)):
            for keyword_name, concept in (("world_size", "world_size"), ("rank", "ordinal")):
                argument = patterns.keyword(call, keyword_name)
                value = argument.value if argument is not None else None
                if not (isinstance(value, cst.Attribute) and isinstance(value.value, cst.Name)
                        and value.value.value == name and value.attr.value not in sizes):
                    continue
                anchor = self._last_update_before(worker, name, value.attr.value, call)
                uses_count = anchor is not None and bool(patterns.find_all(anchor, lambda n: (
                    isinstance(n, cst.Name) and n.value in count_parameters)))
                if value.attr.value not in derived and not uses_count:
                    continue
                sizes.append(value.attr.value)  # rebound once
                rebind = self.ctx.statement(f"{name}.{value.attr.value} = {self.ctx.spell(concept)}")
                if anchor is None:
                    statements.append(rebind)
                    continue
                rebind = rebind.with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(
                    f"# The process group's {keyword_name} came from CUDA's device count: the XLA runtime's instead."))])
                self.insert_after(anchor, [rebind], f"{name}.{value.attr.value} = the XLA runtime's after "
                                  f"{short(anchor)}: the process group's {keyword_name} came from "
                                  "torch.cuda.device_count()")

    def _count_derived_attributes(self, node: cst.Call, holder: str, counts: set[str], sizes: list[str]) -> set[str]:
        """Attributes of ``holder`` that some assignment of the launching function computes from the CUDA count
        (``int(os.getenv("SLURM_NNODES")) * args.ngpus_per_node``)."""
        def from_count(value: cst.BaseExpression) -> bool:
            return bool(patterns.find_all(value, lambda n: (
                (isinstance(n, cst.Call) and self.ctx.is_call_to(n, "torch.cuda.device_count"))
                or (isinstance(n, cst.Name) and n.value in counts)
                or (isinstance(n, cst.Attribute) and isinstance(n.value, cst.Name) and n.value.value == holder
                    and n.attr.value in sizes))))
        derived = set(sizes)
        for assign in patterns.find_all(self._launching_scope(node), lambda n: isinstance(n, cst.Assign)):
            target = assign.targets[0].target if len(assign.targets) == 1 else None
            if (isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name)
                    and target.value.value == holder and from_count(assign.value)):
                derived.add(target.attr.value)
        return derived

    def _last_update_before(self, worker: cst.FunctionDef, name: str, attribute: str,
                            call: cst.Call) -> cst.BaseStatement | None:
        """The last top-level statement of ``worker`` before the one holding ``call`` that assigns
        ``name.attribute`` (``args.rank += gpu``), or None."""
        def assigns(statement: cst.BaseStatement) -> bool:
            def targets_it(target: cst.BaseExpression) -> bool:
                return (isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name)
                        and target.value.value == name and target.attr.value == attribute)
            return bool(patterns.find_all(statement, lambda n: (
                (isinstance(n, cst.Assign) and any(targets_it(t.target) for t in n.targets))
                or (isinstance(n, (cst.AugAssign, cst.AnnAssign)) and targets_it(n.target)))))
        last = None
        for statement in worker.body.body:
            if patterns.find_all(statement, lambda n: n is call):
                return last
            if assigns(statement):
                last = statement
        return None

    def _launching_scope(self, node: cst.Call) -> cst.CSTNode:
        function = self.ctx.parent(node)
        while function is not None and not isinstance(function, cst.FunctionDef):
            function = self.ctx.parent(function)
        return function if function is not None else self.ctx.module

    def _device_count_names(self, node: cst.Call) -> set[str]:
        """Names the function holding ``node`` binds to ``torch.cuda.device_count()``."""
        names = set()
        for assign in patterns.find_all(self._launching_scope(node), lambda n: isinstance(n, cst.Assign)):
            if (len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name)
                    and self.ctx.is_call_to(assign.value, "torch.cuda.device_count")):
                names.add(assign.targets[0].target.value)
        return names

    # torchrun scripts: _mp_fn ----------------------------------------------------------------------------------
    def _entry_point(self) -> bool:
        ctx = self.ctx
        guard = ctx.facts.main_guard
        call_statement, call = None, None
        if guard is not None and isinstance(guard.body, cst.IndentedBlock):
            candidates = [(s, c) for s in guard.body.body if (c := self._entry_call(s)) is not None]
            chosen = self._program_call(candidates)
            if chosen is None and candidates:
                names = ", ".join(dict.fromkeys(c.func.value for _, c in candidates))
                self.finding(guard, f"the __main__ block calls several functions of the script ({names}) and the "
                             "first does not run the training: no single entry function to launch on each XLA "
                             "worker (it runs as it is on one XLA device)",
                             f"move the block's code into def main():, add def {_MP_FN}(index): main() and launch "
                             f"it under if __name__ == \"__main__\": with {self._spelled_launch('()')}")
                return False
            if chosen is not None:
                call_statement, call = chosen
        else:
            for statement in ctx.module.body:
                call = self._entry_call(statement)
                if call is not None and call.func.value == "main":
                    call_statement = statement
                    break
            call = call if call_statement is not None else None
        if call is None:
            where = guard if guard is not None else ctx.module.body[0] if ctx.module.body else ctx.module
            self.finding(where, "distributed script without an entry function to launch on each XLA worker "
                         "(it runs as it is on one XLA device)",
                         f"wrap {self._training_lines()} in def main():, add def {_MP_FN}(index): main() and "
                         f"launch it under if __name__ == \"__main__\": with {self._spelled_launch('()')}")
            return False
        function = self._functions[call.func.value]
        parameters, spawn_args = [], []
        for index, arg in enumerate(call.args):
            if arg.star:
                self.finding(call, f"{short(call)}: unpacked arguments", f"pass them to {_MP_FN} through args=")
                return False
            # A name passed on keeps its name; None/True/False are values, not parameters.
            passes_a_name = isinstance(arg.value, cst.Name) and not keyword.iskeyword(arg.value.value)
            name = arg.value.value if passes_a_name else (
                arg.keyword.value if arg.keyword else
                function.params.params[index].name.value if index < len(function.params.params) else f"arg{index}")
            if name in parameters or name == "index" or keyword.iskeyword(name):  # main(True): not a parameter name
                name = f"arg{index}"
            parameters.append(name)
            spawn_args.append(patterns.code_of(arg.value))
        passed = ", ".join(f"{a.keyword.value}={p}" if a.keyword else p for a, p in zip(call.args, parameters))
        signature = ", ".join(["index", *parameters])
        mp_fn = patterns.parsed_statement(
            f"def {_MP_FN}({signature}):\n"
            f"    # Called once per XLA worker (index: the worker's ordinal).\n"
            f"{self._worker_process_group()}"
            f"    {call.func.value}({passed})\n")
        blank = max(0, 2 - self._blank_lines_left(function))
        mp_fn = mp_fn.with_changes(leading_lines=[cst.EmptyLine()] * blank)
        self.insert_after(function, [mp_fn], f"def {_MP_FN}({signature}): {call.func.value}({passed}) (once per "
                          "XLA worker)")
        inner = ", ".join(spawn_args) + ("," if len(spawn_args) == 1 else "")
        launch = self.ctx.spell_expression("launch", _MP_FN, inner)
        if guard is not None:
            self.replace(call, launch, f"{short(call)} -> {short(launch, 80)}")
        else:
            guarded = patterns.parsed_statement(f"if __name__ == \"__main__\":\n    {patterns.code_of(launch)}\n")
            self.replace(call_statement, lambda updated: guarded.with_changes(leading_lines=updated.leading_lines),
                         f"{short(call)} -> {short(launch, 80)} under if __name__ == \"__main__\":")
        return True

    def _worker_process_group(self) -> str:
        """The xla process group's setup, in ``_mp_fn``, where the script initialised its group before the launch
        (XLA404 removes it there: the launcher's process would start the runtime, and no worker would have it)."""
        if not common.launcher_side_inits(self.ctx):
            return ""
        from xla_migrate.transforms.distributed.process_group_to_xla import MASTER_PORT, XLA_BACKEND

        ctx = self.ctx
        ctx.imports.add((XLA_BACKEND, None))
        lines = []
        if not ctx.target.torchrun_rendezvous:
            environ = f"{ctx.local_name('os', 'os')}.environ"
            lines += [f'{environ}.setdefault("MASTER_ADDR", "localhost")', f'{environ}.setdefault("MASTER_PORT", '
                      f'"{MASTER_PORT}")']
        lines.append(f"{ctx.local_name('torch.distributed', 'dist')}.init_process_group({ctx.spell('xla_process_group')})")
        return "".join(f"    {line}\n" for line in lines)

    def _training_lines(self) -> str:
        """``lines N-M`` of the module-level code after the docstring and imports (what ``main()`` wraps)."""
        body = [st for st in self.ctx.module.body if not (patterns.is_docstring(st) or patterns.is_import_line(st))]
        if not body:
            return "the training code"
        first = self.ctx.position(body[0])[0]
        last = self.ctx.code_range(body[-1]).end.line
        return f"lines {first}-{last} (the code after the imports)"

    def _blank_lines_left(self, function: cst.FunctionDef) -> int:
        """Blank lines the engine moves to the end of ``function`` from trailing statements other rules
        remove (``dist.destroy_process_group()`` after a blank line): they already separate it from _mp_fn."""
        body = function.body.body if isinstance(function.body, cst.IndentedBlock) else ()
        removed = self.ctx.edits.remove
        count = 0
        for statement in reversed(body):
            gone = statement in removed or (isinstance(statement, cst.SimpleStatementLine)
                                            and all(s in removed for s in statement.body))
            if not gone:
                break
            count += sum(1 for line in statement.leading_lines if line.comment is None)
        return count

    def _launched_elsewhere(self) -> bool:
        """A module the entry imports launches the workers itself (detectron2's engine.launch, whose
        mp.start_processes becomes the XLA launch): one launch per program, so the entry is left as it is and
        the report says which launch starts the workers."""
        project = self.ctx.project
        launchers = project.index.imported_launchers(project.rel) if project is not None else []
        guard = self.ctx.facts.main_guard
        if not launchers or guard is None:
            return False
        self.finding(guard, f"not launched here: {', '.join(launchers)} (imported by this program) launches the "
                     "workers itself, and that launch becomes the XLA launch; launching this entry too would start "
                     "a launch inside each worker (\"Runtime is already initialized\")",
                     "keep one launch: the project's launcher starts a process per XLA device (its process count "
                     "argument, a GPU count, should be the XLA device count or ignored)")
        return True

    def _program_call(self, candidates: list[tuple[cst.BaseStatement, cst.Call]]) -> tuple | None:
        """Which call of the ``__main__`` block is the program to launch: one named main, the only call of a
        function of the script, or the first when it is the one that runs the training; else none (stylegan2's
        block calls accumulate(g_ema, generator, 0) before train(...): launching the first would train nowhere)."""
        named = [pair for pair in candidates if pair[1].func.value == "main"]
        if named or len(candidates) <= 1:
            return (named or candidates or [None])[0]
        from xla_migrate.analysis.steps.kinds import STEP

        def trains(call: cst.Call) -> bool:
            function = self._functions[call.func.value]
            return any(event.kind == STEP for event in self.ctx.steps.effects(function))

        return candidates[0] if trains(candidates[0][1]) else None

    def _entry_call(self, statement: cst.BaseStatement) -> cst.Call | None:
        if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
                and isinstance(statement.body[0], cst.Expr)):
            return None
        call = statement.body[0].value
        if isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value in self._functions:
            return call
        return None

    def _spelled_launch(self, args: str) -> str:
        return self.ctx.target.spelling("launch").template.format(_MP_FN, args.strip("()"), xmp="xmp",
                                                                    torch_xla="torch_xla")

    def _device_at_import(self) -> None:
        ctx = self.ctx
        for scope, names in ctx.facts.device_names.items():
            if isinstance(scope, GlobalScope):
                for name in sorted(names):
                    for assignment in scope.assignments[name]:
                        self.finding(assignment.node, f"{name}: the XLA device is created at import time, in the "
                                     "launcher's process too", "create it inside the worker (in main or "
                                     f"{_MP_FN}): using the device before the spawn fails")
        for scope, name in ctx._bound_devices.items():
            if isinstance(scope, GlobalScope):
                self.finding(ctx.module.body[0], f"{name} = {ctx.spell('device')} is bound at module level: the "
                             "device is created at import time, in the launcher's process too",
                             f"create it inside the worker (in main or {_MP_FN})")
