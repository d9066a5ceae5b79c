"""XLA904 xla-api-outside-target: torch_xla APIs the script already calls that the target's releases lack.

What it does:
    Code that already runs on torch_xla is not migrated a second time (only its CUDA remnants are), so an
    older ``--target`` never downgrades newer APIs and a newer one never rewrites older ones. This rule says
    where the two disagree, once per script, at the first such call: with ``--target sagemaker`` (the
    torch_xla 1.13 generation) a script calling ``xr.world_size()``, ``torch_xla.device()``,
    ``torch_xla.sync()`` or ``torch_xla.launch()`` keeps them and needs the newer torch_xla they came with;
    with ``--target 2.9`` a script calling ``xm.xrt_world_size()``, ``xm.get_ordinal()`` (removed in 2.7) or
    ``torch_xla.amp.GradScaler`` (removed in 2.9) fails there and needs the replacement named in the fix.
    Nothing is rewritten.

Why:
    Rewriting working XLA code is how a migration tool damages scripts (a second device loader, a
    torch_xla 2.x call turned back into one removed in 2.7). The target decides what the tool writes, not
    which torch_xla the user's own XLA code may call; the report should still say which releases it needs.

Example:
    sampler = DistributedSampler(ds, num_replicas=xr.world_size(), rank=xr.global_ordinal())

Use instead:
    # kept as written; with --target sagemaker: "already calls torch_xla 2.1+ APIs (xr.world_size(), ...)"
    sampler = DistributedSampler(ds, num_replicas=xr.world_size(), rank=xr.global_ordinal())
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.engine.rule import Rule
from xla_migrate.engine.targets import api_releases, format_version

API_RELEASES = api_releases()


class XlaApiOutsideTarget(Rule):
    code = "XLA904"
    name = "xla-api-outside-target"
    summary = "torch_xla APIs the script already calls that the target's torch_xla generation lacks are reported"
    on_xla_code = True  # it only reports
    reports_only = True

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._outside: list[tuple[cst.Call, str, str]] = []  # (call, qualified name, concept)

    def visit_Call(self, node: cst.Call) -> None:
        generation = self.ctx.target.generation
        for name in self.ctx.qualnames(node.func) & API_RELEASES.keys():
            concept, spelling = API_RELEASES[name]
            if not (spelling.since <= generation and (spelling.removed_in is None or generation < spelling.removed_in)):
                self._outside.append((node, name, concept))

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
