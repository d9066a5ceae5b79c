"""XLA904 xla-api-outside-target: torch_xla APIs the script already calls that the target's releases lack.

What it does:
    Code that already runs on torch_xla is not migrated a second time (only its CUDA remnants are), so an
    older ``--target`` never downgrades newer APIs and a newer one never rewrites older ones. This rule says
    where the two disagree, once per script, at the first such call: with ``--target sagemaker`` (the
    torch_xla 1.13 generation) a script calling ``xr.world_size()``, ``torch_xla.device()``,
    ``torch_xla.sync()`` or ``torch_xla.launch()`` keeps them and needs the newer torch_xla they came with;
    with ``--target 2.9`` a script calling ``xm.xrt_world_size()`` or ``xm.get_ordinal()`` (removed in 2.7)
    gets their one-to-one replacements (``xr.world_size()``, ``xr.global_ordinal()``: the script could not
    start without them), and one calling ``torch_xla.amp.GradScaler`` (removed in 2.9), which has no
    one-to-one replacement, needs the one named in the fix. Nothing else is rewritten.

Why:
    Rewriting working XLA code is how a migration tool damages scripts (a second device loader, a
    torch_xla 2.x call turned back into one removed in 2.7). The target decides what the tool writes, not
    which torch_xla the user's own XLA code may call; the report should still say which releases it needs.
    The exception is a call the target's torch_xla no longer has at all and whose replacement means the same
    (a rename in torch_xla's runtime API): leaving it would leave a script that cannot start.

Example:
    sampler = DistributedSampler(ds, num_replicas=xr.world_size(), rank=xr.global_ordinal())

Use instead:
    # kept as written; with --target sagemaker: "already calls torch_xla 2.1+ APIs (xr.world_size(), ...)"
    sampler = DistributedSampler(ds, num_replicas=xr.world_size(), rank=xr.global_ordinal())
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.engine.rule import Rule
from xla_migrate.syntax import patterns
from xla_migrate.transforms.common import imported_from
from xla_migrate.engine.targets import api_releases, format_version

API_RELEASES = api_releases()


class XlaApiOutsideTarget(Rule):
    code = "XLA904"
    name = "xla-api-outside-target"
    summary = ("torch_xla APIs the script already calls that the target's torch_xla generation lacks are reported; "
               "on 2.9, xm.get_ordinal()/xm.xrt_world_size() become their xr names")
    on_xla_code = True  # it reports, and renames what the target's torch_xla removed

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._outside: list[tuple[cst.Call, str, str]] = []  # (call, qualified name, concept)

    def visit_Call(self, node: cst.Call) -> None:
        generation = self.ctx.target.generation
        for name in self.ctx.qualnames(node.func) & API_RELEASES.keys():
            concept, spelling = API_RELEASES[name]
            if spelling.since <= generation and (spelling.removed_in is None or generation < spelling.removed_in):
                continue
            if self._renamed(node, name, concept):
                continue
            self._outside.append((node, name, concept))

    def _renamed(self, node: cst.Call, name: str, concept: str) -> bool:
        """A call without arguments of an API the target removed (``xm.get_ordinal()``) becomes the target's own
        spelling of the same concept (``xr.global_ordinal()``), when the target spells it as a call without
        arguments too; a target that upgrades XLA code (torchtpu) has its own rules for it."""
        target = self.ctx.target
        removed_in = API_RELEASES[name][1].removed_in
        if (node.args or target.upgrades_xla_code or removed_in is None or target.generation < removed_in
                or concept not in target.spellings or not target.spelling(concept).template.endswith("()")):
            return False
        spelled = self.ctx.spell_expression(concept)
        self.replace(node, spelled, f"{_short(name)}() -> {patterns.code_of(spelled)} ({_short(name)} was removed in "
                                    f"torch_xla {format_version(removed_in)}: the same value under its runtime name)")
        for dead in imported_from(self.ctx, node.func, name):
            self.import_may_be_dead(*dead)
        return True

    def leave_Module(self, original_node: cst.Module) -> None:
        if not self._outside:
            return
        target = self.ctx.target
        names = sorted({name for _, name, _ in self._outside})
        newer = [API_RELEASES[name][1].since for name in names if API_RELEASES[name][1].since > target.generation]
        first = self._outside[0][0]
        if newer:
            needed = format_version(max(newer))
            self.finding(first, f"the script already calls torch_xla {needed}+ APIs ({', '.join(map(_short, names))}): "
                                f"kept, since the {target.name} target never rewrites code that runs on XLA, so it "
                                f"needs torch_xla >= {needed}", f"use --target 2.9, or install torch_xla >= {needed}")
            return
        removed = [f"{_short(name)}, removed in {format_version(API_RELEASES[name][1].removed_in)}" for name in names]
        fixes = [f"{_short(name)} -> {_replacement(target, API_RELEASES[name][0])}" for name in names]
        self.finding(first, f"the script calls torch_xla APIs the {target.name} target's releases lack "
                            f"({'; '.join(removed)}): code that already runs on XLA is not rewritten",
                     "replace them: " + "; ".join(fixes))


def _short(name: str) -> str:
    for module, alias in (("torch_xla.core.xla_model.", "xm."), ("torch_xla.runtime.", "xr."),
                          ("torch_xla.amp.", "torch_xla.amp.")):
        if name.startswith(module):
            return alias + name[len(module):]
    return name


def _replacement(target, concept: str) -> str:
    if concept in target.spellings:
        template = target.spelling(concept).template
        return template.format("...", "...", torch="torch", torch_xla="torch_xla", xm="xm", xr="xr", pl="pl",
                               xmp="xmp", xla_amp="xla_amp", syncfree="syncfree")
    if concept == "grad_scaler":
        return "no scaler with bfloat16 autocast, or torch.amp.GradScaler(\"xla\") for float16"
    return "see the torch_xla release notes"
