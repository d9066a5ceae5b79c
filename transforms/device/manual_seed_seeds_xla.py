"""XLA110 manual-seed-seeds-xla: ``torch.manual_seed(s)`` is followed by the seed of the XLA generator.

What it does:
    After each ``torch.manual_seed(s)`` statement of a migrated script, inserts the target's seed of the XLA
    device's generator with the same seed: ``torch_xla.manual_seed(s)`` on 2.9, ``xm.set_rng_state(s)`` on
    the sagemaker target; the seed is the argument as the migration left it (``torch.manual_seed(dist.get_rank())``
    after init_process_group was removed seeds both with the XLA ordinal, not with a call of the removed
    process group). Left alone: a seed in a function (or module) that also seeds CUDA
    (``torch.cuda.manual_seed``, which XLA102 turns into the XLA seed) or XLA itself, a seed in the process
    that launches the workers (``mp.spawn`` / ``xmp.spawn``: seeding there would start the runtime before
    the launch), a module-level seed in a program that launches workers, and a ``manual_seed`` whose value
    is used.

Why:
    ``torch.manual_seed`` seeds the CPU generator (and CUDA's), not torch_xla's: random draws on the XLA
    device (``torch.randn(..., device=device)``, ``randn_like``, dropout masks) ignore it. Seeds 7 and 8 give
    the same device draws on torch_xla 2.9 and 2.6.1, and with a per-rank seed (``seed = base * world +
    rank``) every replica draws the same noise, so the program's seed no longer decides the run.

Example:
    seed = args.global_seed * dist.get_world_size() + rank
    torch.manual_seed(seed)

Use instead:
    seed = args.global_seed * xr.world_size() + rank
    torch.manual_seed(seed)
    torch_xla.manual_seed(seed)
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.device.cuda_apis_to_xla import LAUNCHERS, SEEDS as CUDA_SEEDS

MANUAL_SEEDS = ("torch.manual_seed", "torch.random.manual_seed")
XLA_SEEDS = ("torch_xla.core.xla_model.set_rng_state", "torch_xla.manual_seed", "torch_xla.torch_xla.manual_seed")


class ManualSeedSeedsXla(Rule):
    code = "XLA110"
    name = "manual-seed-seeds-xla"
    summary = "torch.manual_seed(s) is followed by the XLA generator's seed (torch.manual_seed leaves it unseeded)"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._seeds: list[tuple[cst.Call, cst.SimpleStatementLine]] = []
        self._seeded_scopes: list[object] = []  # scopes that seed CUDA or XLA themselves
        self._launching_scopes: list[object] = []

    def visit_Call(self, node: cst.Call) -> None:
        names = self.ctx.qualnames(node.func)
        scope = self.ctx.function_scope(node)
        if names & set(CUDA_SEEDS) or names & set(XLA_SEEDS):
            self._seeded_scopes.append(scope)
        elif names & set(LAUNCHERS):
            self._launching_scopes.append(scope)
        elif names & set(MANUAL_SEEDS) and len(node.args) == 1 and node.args[0].star == "":
            expr = self.ctx.parent(node)
            line = self.ctx.parent(expr) if isinstance(expr, cst.Expr) else None
            if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
                self._seeds.append((node, line))

    def leave_Module(self, original_node: cst.Module) -> None:
        for call, line in self._seeds:
            scope = self.ctx.function_scope(call)
            if scope in self._seeded_scopes or scope in self._launching_scopes:
                continue
            if self.ctx.parent(line) is original_node and self.ctx.import_time_device_is_lazy:
                continue  # a module-level seed of the XLA device would start the runtime before the launch
            seed = patterns.code_of(call.args[0].value)
            code = self.ctx.spell("seed_device", seed)
            rewritten = any(node in self.ctx.edits.replace
                            for node in patterns.find_all(call.args[0].value, lambda node: True))
            self.replace(line, self._seeded_after(seed),
                         f"{code} after torch.manual_seed({seed}): it does not seed the XLA generator"
                         + (" (with the seed's argument as the migration rewrote it)" if rewritten else ""))

    def _seeded_after(self, seed: str):
        """The seed line followed by the XLA seed, built from the updated line: other rules rewrite the seed's
        argument (``dist.get_rank()`` -> the XLA ordinal once the process group is gone), and a copy of the
        original argument would call what the migration removed."""
        def seeded(updated: cst.SimpleStatementLine) -> cst.FlattenSentinel:
            expr = updated.body[0]
            value = expr.value if isinstance(expr, cst.Expr) else None
            argument = (patterns.code_of(value.args[0].value) if isinstance(value, cst.Call) and len(value.args) == 1
                        else seed)
            # (the applier puts the line's own leading lines back in front of the first statement)
            xla_seed = self.ctx.statement(self.ctx.spell("seed_device", argument))
            return cst.FlattenSentinel([updated.with_changes(leading_lines=[]), xla_seed])
        return seeded
