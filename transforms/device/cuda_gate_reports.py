"""What XLA104 (cuda_gates.py) reports about the tests it decides: the CUDA paths left out on XLA (what they
needed, a device they chose), the launches that go with them, and XLA103's reports of code that is gone.
Kept apart from the decision loop so each module reads on its own; the rule mixes this class in."""

from __future__ import annotations

import libcst as cst
from libcst.metadata.scope_provider import FunctionScope, GlobalScope

from xla_migrate.analysis import gates
from xla_migrate.analysis.facts import MP_SPAWN
from xla_migrate.syntax import patterns


def short(node: cst.CSTNode, limit: int = 60) -> str:
    text = " ".join(patterns.code_of(node).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


class GateReports:
    """The reporting half of ``CudaGates`` (it needs ``self.ctx`` and ``self.finding`` of a ``Rule``)."""

    def _forget_findings_in(self, left_out: set[cst.CSTNode]) -> None:
        """XLA103's reports of code that a decided test leaves out of the output: it is gone (a dropped CUDA
        path is reported here, with what it needed)."""
        ranges = [r for r in (self.ctx.code_range(node) for node in left_out) if r is not None]
        if not ranges:
            return

        def inside(finding) -> bool:
            return any((r.start.line, r.start.column) <= (finding.line, finding.column - 1) <= (r.end.line, r.end.column)
                       for r in ranges)

        self.ctx.findings = [f for f in self.ctx.findings if f.code != "XLA103" or not inside(f)]

    def _report_launch_left_out(self, node: cst.BaseExpression, left_out: list[cst.CSTNode]) -> None:
        """``if torch.cuda.device_count() > 1: mp.spawn(...)`` decided False: the launch goes with its branch."""
        launches = [call for part in left_out
                    for call in patterns.find_all(part, lambda n: self.ctx.is_call_to(n, *MP_SPAWN))]
        if launches:
            self.finding(node, f"{short(node)}: the launch (line {self.ctx.position(launches[0])[0]}) is on the "
                         "path left out on XLA: the program trains in one process on one XLA device",
                         "launch unconditionally (the XLA launcher starts one process per device) and read the "
                         "process count in the worker (xr.world_size())")

    def _report_dead_launch(self, node: cst.BaseExpression, left_out: list[cst.CSTNode]) -> None:
        """A count the left-out path set (``num_gpus = torch.cuda.device_count()``) that a later test reads to
        choose the launch (``if num_gpus > 1: mp.spawn(...)``): on XLA that test keeps the count's earlier
        value, and the launch may never run (one process on one device, silently)."""
        names = {small.targets[0].target.value: small for part in left_out if isinstance(part, cst.IndentedBlock)
                 for statement in part.body if isinstance(statement, cst.SimpleStatementLine)
                 for small in statement.body if isinstance(small, cst.Assign) and len(small.targets) == 1
                 and isinstance(small.targets[0].target, cst.Name)}
        if not names:
            return
        scope = self.ctx.parent(gates.test_top(node, self.ctx.parent))
        while scope is not None and not isinstance(scope, (cst.FunctionDef, cst.Module)):
            scope = self.ctx.parent(scope)
        after = self.ctx.position(node)
        for test in patterns.find_all(scope, lambda n: isinstance(n, cst.If)):
            read = {n.value for n in patterns.find_all(test.test, lambda n: isinstance(n, cst.Name))} & set(names)
            if not read or self.ctx.position(test) <= after:
                continue
            launches = patterns.find_all(test.body, lambda n: self.ctx.is_call_to(n, *MP_SPAWN))
            if not launches:
                continue
            name = sorted(read)[0]
            self.finding(test.test, f"if {short(test.test)}: {name} is set only on the CUDA path left out on XLA "
                         f"(line {self.ctx.position(names[name])[0]}: `{short(names[name])}`), so this test "
                         f"keeps {name}'s earlier value and the launch (line {self.ctx.position(launches[0])[0]}) "
                         "may never run: the program trains in one process on one XLA device",
                         "launch unconditionally (the XLA launcher starts one process per device) and read the "
                         "process count in the worker (xr.world_size())")

    def _report_unbound_reads(self, node: cst.BaseExpression, left_out: list[cst.CSTNode]) -> None:
        """A name of a function bound on the left-out path and nowhere before the test (``if
        torch.cuda.is_available(): n_gpus = torch.cuda.device_count()``) but read after it (``range(n_gpus)``):
        on XLA the read finds it bound only where another branch happens to bind it, else UnboundLocalError (a
        module's name: NameError; the gate then keeps the branch, which XLA never takes either)."""
        owner = self.ctx.parent(gates.test_top(node, self.ctx.parent))
        if not isinstance(owner, cst.If) or self.ctx.code_range(owner) is None:
            return
        span = self.ctx.code_range(owner)
        end = (span.end.line, span.end.column)
        dropped = [small for part in left_out if isinstance(part, cst.IndentedBlock) for statement in part.body
                   if isinstance(statement, cst.SimpleStatementLine) for small in statement.body
                   if isinstance(small, cst.Assign)]
        for assign in dropped:
            for target in (t.target for t in assign.targets if isinstance(t.target, cst.Name)):
                scope = self.ctx.scopes.get(target)
                if not isinstance(scope, (FunctionScope, GlobalScope)):
                    continue
                error = "UnboundLocalError" if isinstance(scope, FunctionScope) else "NameError"
                bindings = scope.assignments[target.value]
                if any(not any(gates.inside(self.ctx.parent, b.node, part) for part in left_out)
                       and self.ctx.position(b.node) < end for b in bindings if hasattr(b, "node")):
                    continue  # bound before the test (a parameter included) or on the path kept
                reads = sorted((self.ctx.position(a.node), a.node) for b in bindings for a in b.references
                               if self.ctx.position(a.node) > end and not self.ctx.is_write_target(a.node))
                if not reads:
                    continue
                line = reads[0][0][0]
                self.finding(reads[0][1], f"{target.value} is bound before this read only on the CUDA path "
                             f"of {short(node)} left out on XLA (line {self.ctx.position(assign)[0]}: "
                             f"`{short(assign)}`) or on a path that may not run: on XLA line {line} may raise "
                             f"{error}", f"bind {target.value} before the test with its XLA meaning "
                             "(1 device per process; xr.world_size() for the number of processes)")

    def _report_dropped(self, node: cst.BaseExpression, dropped: list[tuple[cst.CSTNode, str]],
                        branch: list[cst.CSTNode]) -> None:
        kinds = []
        for _, what in dropped:
            if what not in kinds:
                kinds.append(what)
        # A fused implementation, a message about the GPU, a legacy type name (XLA105 rewrites its uses):
        # nothing is lost on XLA, and the change record says what happened.
        if all(what.startswith(("fused=", "a message", "CUDA tensor type")) for what in kinds):
            return
        lines = [self.ctx.code_range(part) for part in branch]
        lines = [r for r in lines if r is not None]
        where = (f"lines {min(r.start.line for r in lines)}-{max(r.end.line for r in lines)}" if lines
                 else f"line {self.ctx.position(dropped[0][0])[0]}")
        chosen = [s for part in branch if isinstance(part, cst.IndentedBlock) for s in part.body
                  if gates.chooses_cuda_device(s, self.ctx.qualnames)]
        lost = (f"; the device it chose (line {self.ctx.position(chosen[0])[0]}: "
                f"`{short(chosen[0])}`) goes with it: this code now runs on the CPU" if chosen else "")
        self.finding(node, f"{short(node)}: the CUDA path ({where}) is left out on XLA: it needs CUDA "
                     f"({'; '.join(kinds)}){lost}", "port what that code does to XLA by hand if the run needs it, "
                     "everything else it did included (XLA schedules device work itself, MpDeviceLoader "
                     "prefetches batches, xm.get_memory_info(device) gives memory figures on a TPU)")
