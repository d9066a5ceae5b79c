"""XLA408 distributed-seed: a distributed script must build the same initial weights on every worker.

What it does:
    In a distributed script that builds a model (an optimizer over ``.parameters()``) and whose program wraps
    none in DDP, reports when no constant seed is set before the weights are created: no
    ``torch.manual_seed(...)`` (or ``transformers.set_seed``, ``lightning.seed_everything``,
    ``accelerate.utils.set_seed``) at all, one whose seed depends on the rank (``torch.manual_seed(seed +
    rank)``), or one only in the ``__main__`` block or in the function that calls ``mp.spawn``, which run
    in the launcher's process, not in the workers. Nothing is rewritten.

Why:
    DDP broadcast rank 0's weights to every replica when it wrapped the model, so the original script needed
    no common seed. The XLA form keeps no DDP wrapper (XLA405): every worker starts from the weights it
    creates itself, and with different random weights the all-reduced gradients average models that never
    agree. The seeds' best practice: use the same seed on every worker.

Example:
    model = Net()
    model = DDP(model, device_ids=[local_rank])

Use instead:
    torch.manual_seed(0)  # the same constant on every worker, before the model is built
    model = Net()
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.analysis.facts import DDP, MP_SPAWN
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.common import short

SEEDS = ("torch.manual_seed", "torch.random.manual_seed", "transformers.set_seed", "transformers.trainer_utils.set_seed",
         "lightning.seed_everything", "pytorch_lightning.seed_everything", "lightning.pytorch.seed_everything",
         "accelerate.utils.set_seed", "torch_xla.core.xla_model.set_rng_state")
LAUNCHES = (*MP_SPAWN, "torch_xla.distributed.xla_multiprocessing.spawn", "torch_xla.launch")
_RANKISH = ("rank", "ordinal", "gpu", "index")


class DistributedSeed(Rule):
    code = "XLA408"
    name = "distributed-seed"
    summary = "distributed scripts that create weights without a constant seed on every worker are reported"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._seeds: list[cst.Call] = []
        self._models: list[cst.Call] = []
        self._spawns: list[cst.Call] = []

    def visit_Call(self, node: cst.Call) -> None:
        names = self.ctx.qualnames(node.func)
        if names & set(LAUNCHES):
            self._spawns.append(node)
        if names & set(SEEDS):
            self._seeds.append(node)
        elif names & set(DDP) or (
                any(n.startswith("torch.optim.") or n.startswith("torch_xla.amp.syncfree.") for n in names)
                and patterns.find_all(node, lambda n: patterns.method_call(n, "parameters") is not None)):
            self._models.append(node)

    def leave_Module(self, original_node: cst.Module) -> None:
        if not self.ctx.distributed or not self._models or self.ctx.spmd_form:
            return  # the spmd form: one program builds the one copy of the weights
        if self._program_wraps_ddp():
            # The ddp form keeps DDP, which broadcasts rank 0's weights when it wraps the model; the xm form
            # broadcasts ordinal 0's weights there instead (XLA405).
            return
        where = self._models[0]
        guard = self.ctx.facts.main_guard
        launchers = [guard] if guard is not None else []
        launchers += [self._function_of(spawn) for spawn in self._spawns]
        seeds = [s for s in self._seeds if not any(a is not None and self._inside(s, a) for a in launchers)]
        if not seeds:
            only_main = " (a seed set before the spawn runs in the launcher only)" if self._seeds else ""
            self.finding(where, f"{short(where)}: the workers build their weights without a common seed{only_main}",
                         "call torch.manual_seed(<constant>) in each worker before the model is built: without "
                         "DDP's broadcast every replica must start from the same weights")
            return
        for seed in seeds:
            if any(part in patterns.code_of(seed).lower() for part in _RANKISH):
                self.finding(seed, f"{short(seed)}: the seed depends on the worker's rank",
                             "seed the model's weights with the same constant on every worker (a rank-dependent "
                             "seed is fine for data augmentation only, after the model is built)")

    def _program_wraps_ddp(self) -> bool:
        if any(self.ctx.qualnames(m.func) & set(DDP) for m in self._models):
            return True
        project = self.ctx.project
        if project is None:
            return False
        from xla_migrate.analysis.update_sites import program_of

        return bool(program_of(project.index, project.rel).sites("ddp_wraps"))

    def _function_of(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        current = self.ctx.parent(node)
        while current is not None and not isinstance(current, cst.FunctionDef):
            current = self.ctx.parent(current)
        return current

    def _inside(self, node: cst.CSTNode, ancestor: cst.CSTNode) -> bool:
        current = self.ctx.parent(node)
        while current is not None:
            if current is ancestor:
                return True
            current = self.ctx.parent(current)
        return False
