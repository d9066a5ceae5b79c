"""XLA402 master-ordinal-guard: rank-0 guards become the target's master-ordinal check.

What it does:
    In a distributed script, rewrites comparisons that single out the first worker to
    ``xm.is_master_ordinal(local=False)`` (a global rank: ``rank``, ``global_rank``, ``RANK``,
    ``dist.get_rank()``) or ``xm.is_master_ordinal()`` (a local rank: ``local_rank``, ``LOCAL_RANK``):
    ``rank == 0``, ``0 == rank``, ``local_rank in (-1, 0)``, ``local_rank <= 0``, and, negated,
    ``rank != 0`` and ``rank > 0`` (``not xm.is_master_ordinal(local=False)``). Only the comparison is
    rewritten, wherever it is (``if``, ``and``, ``is_main = rank == 0``). Other comparisons of ranks are left
    alone. Single-device scripts are left alone.

Why:
    The seeds log and save on the master worker only, through ``xm.is_master_ordinal()``; it does not
    depend on a rank variable that torchrun set (and that no XLA launcher sets), and it says what the guard
    means. ``is_master_ordinal()`` checks the local ordinal (one writer per host, for files on local disk);
    ``local=False`` the global one (one writer in all, for logs and shared storage), as ``rank == 0`` did.

Example:
    if rank == 0:
        print(f"epoch {epoch}: loss {loss.item():.4f}")
    if local_rank in (-1, 0):
        torch.save(model.state_dict(), "model.pt")

Use instead:
    if xm.is_master_ordinal(local=False):
        print(f"epoch {epoch}: loss {loss.item():.4f}")
    if xm.is_master_ordinal():
        torch.save(model.state_dict(), "model.pt")
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.distributed import distributed_common as common
from xla_migrate.transforms.common import short


class MasterOrdinalGuard(Rule):
    code = "XLA402"
    name = "master-ordinal-guard"
    summary = "if rank == 0 / local_rank in (-1, 0) guards -> xm.is_master_ordinal(...)"
    # A name is taken for a rank by its spelling (rank, global_rank, local_rank): worth a look.
    fix_safety = "review"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        common.register(ctx, self.code)

    def visit_Comparison(self, node: cst.Comparison) -> None:
        if not self.ctx.xla_launched:
            return  # torchrun starts the ddp form's workers (xla://): the script's ranks stay
        guard = common.master_guard(self.ctx, node)
        if guard is None:
            return
        kind, negated = guard
        check = self.ctx.spell("is_global_master" if kind == "global" else "is_master")
        code = f"not {check}" if negated else check
        new = patterns.parsed_expression(code)
        parent = self.ctx.parent(node)
        if negated and isinstance(parent, (cst.BinaryOperation, cst.UnaryOperation, cst.Attribute)):
            new = new.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])

        def guard_call(updated: cst.Comparison) -> cst.BaseExpression:
            return new.with_changes(lpar=[*updated.lpar, *new.lpar], rpar=[*new.rpar, *updated.rpar])

        self.replace(node, guard_call, f"{short(node)} -> {code}")
