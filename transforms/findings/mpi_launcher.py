"""XLA907 mpi-launcher: ranks taken from MPI (``mpiexec``/``mpirun`` with mpi4py) are reported.

What it does:
    Reports ``from mpi4py import MPI`` / ``import mpi4py`` in a torch program once, and each place that reads
    a rank or the world size from an MPI communicator (``comm.rank``, ``comm.size``,
    ``MPI.COMM_WORLD.Get_rank()``, ``Get_size()``), with how to launch on XLA instead. Nothing is rewritten.

Why:
    On XLA, the launcher decides the ranks: torchrun (the ddp form: ``init_method="xla://"`` reads the
    PJRT runtime's rank and world size, not the environment MPI filled in) or plain ``python`` with
    ``torch_xla.launch`` / ``xmp.spawn`` (the xm form: one process per device). Under ``mpiexec -n N`` each
    MPI process is its own world of one that opens every local device (the second fails), or spawns N x
    devices processes.

Example:
    comm = MPI.COMM_WORLD
    os.environ["RANK"] = str(comm.rank)
    os.environ["WORLD_SIZE"] = str(comm.size)

Use instead:
    # launch with torchrun (ddp form) or plain python + torch_xla.launch (xm form), not mpiexec;
    # drop the MPI-derived RANK/WORLD_SIZE; MPI collectives (comm.bcast of a checkpoint) need one MPI
    # process per host
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.engine.rule import Rule
from xla_migrate.syntax import patterns

_FIX = ("launch with torchrun (ddp form) or plain python + torch_xla.launch / xmp.spawn (xm form), not mpiexec, "
        "and drop the RANK/WORLD_SIZE taken from MPI; MPI collectives (comm.bcast of checkpoints) still need one "
        "MPI process per host")
_RANK_READS = {"rank": "rank", "size": "world size", "Get_rank": "rank", "Get_size": "world size"}


class MpiLauncher(Rule):
    code = "XLA907"
    name = "mpi-launcher"
    summary = "ranks from MPI (mpiexec + mpi4py) reported: XLA's launcher decides the ranks"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._communicators: set[str] | None = None

    def _is_mpi_program(self) -> bool:
        return "mpi4py" in self.ctx.input_code

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        module = patterns.dotted_name(node.module) if node.module is not None else None
        if module is not None and module.split(".")[0] == "mpi4py":
            self.finding(node, "the program is launched with MPI (mpi4py): on XLA the launcher decides the ranks, "
                         "and mpiexec's processes would each open every local device", _FIX)

    def visit_Import(self, node: cst.Import) -> None:
        if any((patterns.dotted_name(a.name) or "").split(".")[0] == "mpi4py" for a in node.names):
            self.finding(node, "the program is launched with MPI (mpi4py): on XLA the launcher decides the ranks, "
                         "and mpiexec's processes would each open every local device", _FIX)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value not in _RANK_READS or not self._is_mpi_program():
            return
        receiver = patterns.dotted_name(node.value)
        if receiver is None or not (receiver.endswith("COMM_WORLD") or receiver in self._comms()):
            return
        self.finding(node, f"{receiver}.{node.attr.value}: the {_RANK_READS[node.attr.value]} comes from MPI, "
                     "not from the XLA launcher", _FIX)

    def _comms(self) -> set[str]:
        """Names bound to ``MPI.COMM_WORLD`` (``comm = MPI.COMM_WORLD``)."""
        if self._communicators is None:
            self._communicators = set()
            for assign in patterns.find_all(self.ctx.module, lambda n: isinstance(n, cst.Assign)):
                value = patterns.dotted_name(assign.value) or ""
                if value.endswith("COMM_WORLD"):
                    for target in assign.targets:
                        name = patterns.dotted_name(target.target)
                        if name is not None:
                            self._communicators.add(name)
        return self._communicators
