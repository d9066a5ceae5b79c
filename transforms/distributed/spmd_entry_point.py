"""XLA414 spmd-entry-point: the spmd form runs one program per host, set up first thing in its entry.

What it does:
    In a distributed script migrated with ``--data-parallel spmd`` (``2.9`` target only):

    - The ``__main__`` block starts with ``xr.use_spmd()`` and a mesh over every device of the host, set as
      the global mesh (``xs.set_global_mesh(xs.Mesh(np.arange(num_devices), (num_devices,), ("data",)))``
      with ``num_devices = xr.global_runtime_device_count()``); the device loaders (XLA301) shard each batch
      on its ``"data"`` axis (``input_sharding=xs.ShardingSpec(xs.get_global_mesh(), ("data", None),
      minibatch=True)``: each host's loader holds its part of the global batch).
      torchrun's processes become one process per host: no launcher, the entry is called as written.
    - ``mp.spawn(worker, args=(a, b), nprocs=n)`` becomes ``worker(0, a, b)`` (one process, index 0), with
      the same setup before it.
    - A script with no ``__main__`` block (or a one-line one) is reported: call the setup first thing.

    DDP and the process group go (XLA405, XLA404); the sampler shards over hosts (``xr.process_count()``,
    ``xr.process_index()``, XLA403); rank-0 work runs on ``xr.process_index() == 0`` (XLA402); the
    optimizer step stays ``optimizer.step()`` (XLA204).

Why:
    torch_xla's SPMD (GSPMD) runs one program over a device mesh; the compiler splits the sharded batch and
    inserts the gradient all-reduce, so no replica processes, wrapper or process group are needed, and the
    same script runs on one host or a pod slice (one process per host). ``xr.use_spmd()`` must run before
    any XLA device is used. Each loader's batch is now the global batch of the host's devices (DDP's was
    per process): with the batch size unchanged, each device gets ``batch_size / num_devices`` rows. Tensors
    whose rank is not 2 are not matched by the ``("data", None)`` spec and load replicated (results stay
    right; that tensor's work is not split).

Example:
    if __name__ == "__main__":
        main()

Use instead:
    if __name__ == "__main__":
        xr.use_spmd()
        num_devices = xr.global_runtime_device_count()
        xs.set_global_mesh(xs.Mesh(np.arange(num_devices), (num_devices,), ("data",)))
        main()
"""

from __future__ import annotations

from typing import ClassVar

import libcst as cst

from xla_migrate.analysis.facts import MP_SPAWN
from xla_migrate.engine.rule import Rule
from xla_migrate.syntax import patterns
from xla_migrate.transforms.common import fresh_name, short

_COMMENT = "# One SPMD program over the host's devices: each loader's (global) batch is split on the \"data\" axis."


class SpmdEntryPoint(Rule):
    code = "XLA414"
    name = "spmd-entry-point"
    summary = "spmd form: xr.use_spmd() and a data mesh first in the entry; mp.spawn/torchrun become one process"
    fix_safety = "review"
    targets = ("2.9",)
    # tests/goldens.py: this rule's cases are also migrated in the spmd form.
    golden_forms: ClassVar[tuple[str, ...]] = ("spmd",)

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._spawns: list[cst.Call] = []
        self._has_setup = False

    def visit_Call(self, node: cst.Call) -> None:
        names = self.ctx.qualnames(node.func)
        if names & set(MP_SPAWN):
            self._spawns.append(node)
        elif "torch_xla.runtime.use_spmd" in names:
            self._has_setup = True

    def leave_Module(self, original_node: cst.Module) -> None:
        ctx = self.ctx
        if not ctx.spmd_form or self._has_setup or getattr(ctx.facts, "is_hf_script", False):
            return
        if ctx.project is not None and not ctx.project.is_entry and not self._spawns:
            return  # a helper module of a project: its entry file sets up SPMD
        if self._spawns:
            for call in self._spawns:
                self._unspawn(call)
            return
        guard = ctx.facts.main_guard
        body = guard.body if guard is not None else None
        if not isinstance(body, cst.IndentedBlock):
            where = guard if guard is not None else (ctx.module.body[0] if ctx.module.body else ctx.module)
            self.finding(where, "no __main__ block to start the SPMD program in",
                         f"call {_spelled(ctx, 'use_spmd')} first thing when the script runs, then set the mesh: "
                         f"{_spelled(ctx, 'spmd_data_mesh', _spelled(ctx, 'device_count'))}")
            return
        first = body.body[0]
        self.insert_before(first, self._setup(first), f"{ctx.spell('use_spmd')} and a \"data\" mesh over "
                           f"{ctx.spell('device_count')} devices first in the entry: one SPMD program per host; each "
                           "loader's batch size is now the global batch of the host's devices (DDP's was per process)")

    def _setup(self, at: cst.CSTNode) -> list[cst.BaseStatement]:
        ctx = self.ctx
        count = fresh_name(ctx, at, "num_devices")
        statements = [ctx.statement(ctx.spell("use_spmd")),
                      ctx.statement(f"{count} = {ctx.spell('device_count')}"),
                      ctx.statement(ctx.spell("spmd_data_mesh", count))]
        statements[1] = statements[1].with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(_COMMENT))])
        return statements

    def _unspawn(self, node: cst.Call) -> None:
        """``mp.spawn(fn, args=(a,), nprocs=n)`` -> ``fn(0, a)``: the one process of this host, index 0."""
        positional = patterns.positional(node)
        fn = positional[0].value if positional else (patterns.keyword(node, "fn").value
                                                      if patterns.keyword(node, "fn") else None)
        args = patterns.keyword(node, "args") or (positional[1] if len(positional) > 1 else None)
        statement = self.ctx.enclosing_statement(node)
        if fn is None or any(a.star for a in node.args) or statement is None or (
                args is not None and not isinstance(args.value, cst.Tuple)):
            self.finding(node, f"{short(node)}: cannot read the spawned function and its arguments",
                         f"call the worker once with index 0, after {_spelled(self.ctx, 'use_spmd')} and the mesh")
            return
        elements = [patterns.code_of(e.value) for e in args.value.elements] if args is not None else []
        new = patterns.parsed_expression(f"{patterns.code_of(fn)}({', '.join(['0', *elements])})")
        self.replace(node, new, f"{short(node)} -> {short(new, 80)}: one SPMD process per host (index 0), no spawn")
        self.insert_before(statement, self._setup(statement), f"{self.ctx.spell('use_spmd')} and a \"data\" mesh "
                           "before the worker runs; each loader's batch size is now the global batch of the host's "
                           "devices (DDP's was per process)")
        self.import_may_be_dead("torch.multiprocessing", None)


def _spelled(ctx, concept: str, *args: str) -> str:
    """A concept's code for a finding's text, with the usual aliases: unlike ``ctx.spell`` it adds no import."""
    return ctx.target.spelling(concept).template.format(*args, xr="xr", xs="xs", np="np")
