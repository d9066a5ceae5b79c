"""XLA403 distributed-sampler: samplers shard the data over the XLA replicas; training loaders get one.

What it does:
    In a distributed script:

    - ``DistributedSampler(dataset, ...)`` gets ``num_replicas=<world size>`` and ``rank=<ordinal>``
      (``xm.xrt_world_size()``, ``xm.get_ordinal()``; ``xr.world_size()``, ``xr.global_ordinal()`` on
      ``2.9``), replacing the values it had; its other arguments (``shuffle``, ``seed``, ``drop_last``)
      stay. ``sampler.set_epoch(epoch)`` and ``loader.sampler.set_epoch(epoch)`` keep working as they are.
    - A training DataLoader without a sampler (one a training loop iterates, or one built with
      ``shuffle=True``) gets ``<name>_sampler = torch.utils.data.DistributedSampler(dataset,
      num_replicas=..., rank=..., shuffle=<its shuffle>)`` on the line before it; the loader gets
      ``sampler=<name>_sampler, shuffle=False`` (its ``shuffle`` moves to the sampler), and the first
      ``for epoch in ...`` loop after it in the same function starts with ``<name>_sampler.set_epoch(epoch)``
      (reported when there is none). Loaders with a ``batch_sampler`` or ``**kwargs`` are reported.
    - In the spmd form (``--data-parallel spmd``: one process per host) the sampler shards over the hosts:
      ``num_replicas=xr.process_count(), rank=xr.process_index()``.

Why:
    Without a process group, ``DistributedSampler``'s defaults (``dist.get_world_size()``,
    ``dist.get_rank()``) fail; the XLA runtime knows the replicas. A training loader with no sampler gives
    every replica the whole dataset: each step then trains on the same batches everywhere, and an epoch
    costs N times more. ``shuffle=True`` next to a sampler is an error in DataLoader, and without
    ``set_epoch`` every epoch repeats the first epoch's order.

Example:
    train_loader = DataLoader(train_set, batch_size=64, shuffle=True)
    for epoch in range(epochs):
        train(model, train_loader)

Use instead:
    train_sampler = torch.utils.data.DistributedSampler(train_set, num_replicas=xm.xrt_world_size(), rank=xm.get_ordinal(), shuffle=True)
    train_loader = DataLoader(train_set, batch_size=64, sampler=train_sampler, shuffle=False)
    for epoch in range(epochs):
        train_sampler.set_epoch(epoch)
        train(model, train_loader)
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.analysis.facts import DATALOADERS, DISTRIBUTED_SAMPLERS
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.distributed import distributed_common as common
from xla_migrate.transforms.common import keyword_arg, short

_EVAL_WORDS = ("val", "valid", "test", "eval", "dev")


class DistributedSampler(Rule):
    code = "XLA403"
    name = "distributed-sampler"
    summary = "DistributedSampler gets the XLA world size and ordinal; training DataLoaders without one get one"
    fix_safety = "review"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._trained: set[str] | None = None

    def visit_Call(self, node: cst.Call) -> None:
        if not (self.ctx.xm_form or self.ctx.spmd_form):
            return  # the ddp form keeps the process group: samplers read it as written
        names = self.ctx.qualnames(node.func)
        if names & set(DISTRIBUTED_SAMPLERS):
            self._sampler(node)
        elif names & set(DATALOADERS):
            self._loader(node)

    # DistributedSampler(...) -------------------------------------------------------------------------------
    def _sampler(self, node: cst.Call) -> None:
        world, ordinal = self.ctx.spell("world_size"), self.ctx.spell("ordinal")
        wanted = {"num_replicas": world, "rank": ordinal}
        current = {name: patterns.keyword(node, name) for name in wanted}
        if all(arg is not None and patterns.code_of(arg.value) == wanted[name] for name, arg in current.items()):
            return
        positional = patterns.positional(node)
        if len(positional) > 1 or any(a.star for a in node.args):
            self.finding(node, f"{short(node)}: num_replicas/rank passed by position or unpacked",
                         f"pass num_replicas={world}, rank={ordinal} by keyword")
            return
        values = {name: patterns.parsed_expression(code) for name, code in wanted.items()}

        def sharded(updated: cst.Call) -> cst.Call:
            args = [a for a in updated.args if not (a.keyword and a.keyword.value in wanted)]
            dataset = [a for a in args if a.keyword is None or a.keyword.value == "dataset"]
            rest = [a for a in args if a not in dataset]
            new = [*dataset, keyword_arg("num_replicas", values["num_replicas"]), keyword_arg("rank", values["rank"]),
                   *rest]
            return updated.with_changes(args=_joined(new))

        self.replace(node, sharded, f"DistributedSampler: num_replicas={world}, rank={ordinal}")

    # DataLoader(...) without a sampler ---------------------------------------------------------------------
    def _trained_names(self) -> set[str]:
        if self._trained is None:
            self._trained = set()
            for loop in self.ctx.steps.training_loops:
                if isinstance(loop, cst.For):
                    name = patterns.dotted_name(self.ctx.steps.loop_iterable(loop))
                    if name is not None:
                        self._trained.add(name.rsplit(".", 1)[-1])
        return self._trained

    def _loader(self, node: cst.Call) -> None:
        ctx = self.ctx
        if any(patterns.keyword(node, k) is not None for k in ("sampler",)):
            return
        parent = ctx.parent(node)
        target = parent.targets[0].target if isinstance(parent, cst.Assign) and len(parent.targets) == 1 else None
        spelling = patterns.dotted_name(target) if target is not None else None
        shuffle = patterns.keyword(node, "shuffle")
        shuffled = shuffle is not None and patterns.dotted_name(shuffle.value) != "False"
        last = spelling.rsplit(".", 1)[-1] if spelling else ""
        trained = last in self._trained_names() or (shuffled and not any(w in last.lower() for w in _EVAL_WORDS))
        if not trained:
            return
        if patterns.keyword(node, "batch_sampler") is not None or any(a.star for a in node.args):
            self.finding(node, f"{short(node)}: a training loader of a distributed script with no DistributedSampler",
                         "give it sampler=torch.utils.data.DistributedSampler(dataset, num_replicas=<world size>, "
                         "rank=<ordinal>) and shuffle=False")
            return
        positional = patterns.positional(node)
        dataset = positional[0].value if positional else (
            patterns.keyword(node, "dataset").value if patterns.keyword(node, "dataset") else None)
        statement = ctx.parent(parent) if target is not None else None
        if dataset is None or not isinstance(statement, cst.SimpleStatementLine):
            self.finding(node, f"{short(node)}: a training loader of a distributed script with no DistributedSampler",
                         "build a DistributedSampler for its dataset and pass sampler=..., shuffle=False")
            return
        base = last[: -len("loader")] if last.endswith("loader") else (last + "_" if last else "")
        name = common.fresh_name(ctx, node, f"{base}sampler" if base.endswith("_") or not base else f"{base}_sampler")
        shuffle_code = patterns.code_of(shuffle.value) if shuffle is not None else "False"
        sampler = ctx.statement(
            f"{name} = {ctx.spell('distributed_sampler')}({patterns.code_of(dataset)}, "
            f"num_replicas={ctx.spell('world_size')}, rank={ctx.spell('ordinal')}, shuffle={shuffle_code})")
        self.insert_before(statement, [sampler], f"{name}: a DistributedSampler for the training loader "
                           f"{spelling} (shuffle={shuffle_code} moves to it)")

        def with_sampler(updated: cst.Call) -> cst.Call:
            args = [a for a in updated.args if not (a.keyword and a.keyword.value == "shuffle")]
            extra = [keyword_arg("sampler", cst.Name(name)), keyword_arg("shuffle", cst.Name("False"))]
            return updated.with_changes(args=_extended(updated.args, args, extra))

        self.replace(node, with_sampler, f"{spelling}: sampler={name}, shuffle=False")
        self._set_epoch(node, name)

    def _set_epoch(self, node: cst.Call, sampler: str) -> None:
        ctx = self.ctx
        scope = ctx.function_scope(node)
        owner = getattr(scope, "node", None)
        start = ctx.position(node)
        finder = _EpochLoop(ctx, owner, start)
        (owner if owner is not None else ctx.module).visit(finder)
        found = finder.found
        if not found:
            self.finding(node, f"{sampler} is never told the epoch: every epoch repeats the first one's order",
                         f"call {sampler}.set_epoch(epoch) at the start of each epoch")
            return
        loop = found[0]
        call = ctx.statement(f"{sampler}.set_epoch({loop.target.value})")
        self.insert_before(loop.body.body[0], [call], f"{sampler}.set_epoch({loop.target.value}) at each epoch")


def _extended(original: tuple[cst.Arg, ...], kept: list[cst.Arg], extra: list[cst.Arg]) -> list[cst.Arg]:
    """``kept + extra`` in the call's own layout: the separator of its first comma (a new line for a call
    written one argument per line), and its last argument's trailing comma."""
    commas = [a.comma for a in original[:-1] if isinstance(a.comma, cst.Comma)]
    separator = commas[0] if commas else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    trailing = original[-1].comma if original else cst.MaybeSentinel.DEFAULT
    args = [*kept[:-1], *([kept[-1].with_changes(comma=separator)] if kept else [])]
    args += [a.with_changes(comma=separator) for a in extra[:-1]]
    return [*args, extra[-1].with_changes(comma=trailing)]


def _joined(args: list[cst.Arg]) -> list[cst.Arg]:
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    out = [a.with_changes(comma=comma) for a in args]
    return patterns.without_trailing_comma(out)


class _EpochLoop(cst.CSTVisitor):
    """The first ``for <...epoch...> in ...:`` loop with a block body after ``start``, in ``owner`` (a function,
    None: the module) and not in functions nested in it."""

    def __init__(self, ctx, owner: cst.FunctionDef | None, start: tuple[int, int]) -> None:
        super().__init__()
        self.ctx, self.owner, self.start = ctx, owner, start
        self.found: list[cst.For] = []

    def visit_For(self, loop: cst.For) -> None:
        if (isinstance(loop.target, cst.Name) and "epoch" in loop.target.value and not self.found
                and self.ctx.position(loop) > self.start and isinstance(loop.body, cst.IndentedBlock)):
            self.found.append(loop)

    def visit_FunctionDef(self, function: cst.FunctionDef) -> bool:
        return function is self.owner
