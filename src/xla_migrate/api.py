"""The library entry points: ``migrate`` (source in, result out) and ``migrate_file``.

Neither raises on bad input: a syntax error or undecodable bytes come back as a result whose ``error`` says
what is wrong (line and column where there is one). A mistake in the call itself (an unknown target,
data-parallel form or rule code) raises ValueError, so code that ignores ``error`` cannot write an
unmigrated script believing it migrated.
"""

from __future__ import annotations

import codecs
import html
import io
import os
import tokenize
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from .engine import input_checks, pipeline as engine, registry
from .syntax import layout
from .report.diff import DiffStats, diff_stats, unified_diff
from .engine.records import Change, Finding, InputError
from .engine.triggers import mentions_a_trigger
from .engine.targets import (DEFAULT_TARGET, Version, data_parallel_problem, describe_releases, get_target, parse_version,
                      TORCH_TPU_RELEASE, release_fits, runs_on)


@dataclass
class MigrationResult:
    source: str
    code: str
    target: str
    path: str = "script.py"
    out_path: str | None = None
    changes: list[Change] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    error: InputError | None = None
    # The torch_xla releases the output runs on, [low, high), from the target spellings it uses.
    releases: tuple[Version, Version | None] = ((1, 13), None)
    encoding: str = "utf-8"
    output_bytes: bytes = b""
    # The data-parallel form the script was migrated to, "ddp" or "xm" (DESIGN.md section 7); "" for a
    # single-device script, where no form applies.
    data_parallel: str = ""
    # Why, when --data-parallel auto chose it ("auto: ..."); "" when the form was asked for by name.
    data_parallel_reason: str = ""

    @property
    def unreduced_updates(self) -> list:
        """The findings of updates the xm form leaves unreduced or reduces after a read (XLA413): a migration
        with any exits 1 (``--data-parallel xm`` asked for where the guarantee fails)."""
        return [f for f in self.findings if f.code == "XLA413"]

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def changed(self) -> bool:
        return self.ok and self.code != self.source

    @cached_property
    def diff(self) -> str:
        if not self.changed:
            return ""
        # The BOM is part of the file's first line: keep it in the diff so it applies byte for byte.
        bom = "\ufeff" if self.encoding == "utf-8-sig" else ""
        return unified_diff(bom + self.source, bom + self.code, self.path, self.out_path or self.path)

    @property
    def diff_stats(self) -> DiffStats:
        return diff_stats(self.diff)

    @property
    def runs_on(self) -> str:
        return describe_releases(*self.releases, runtime=self._runtime)

    @property
    def _runtime(self) -> str:
        try:
            return get_target(self.target).runtime
        except ValueError:
            return "torch_xla"

    def release_warning(self, installed: str | None) -> str | None:
        """A one-line warning when the torch_xla installed here cannot run this output, else None."""
        if installed is None or not self.changed or self._runtime != "torch_xla":
            return None
        version = parse_version(installed)
        if release_fits(version, *self.releases):
            return None
        from .engine.targets import target_for_release

        better = target_for_release(version)
        advice = f"; use --target {better.name}" if better is not None and better.name != self.target else ""
        return (f"warning: torch_xla {installed} is installed here, but the {self.target} target's output "
                f"needs {self.runs_on}{advice}")

    # Notebook display --------------------------------------------------------------------------------------
    def _summary_line(self) -> str:
        if self.error is not None:
            return f"error: {self.error.format(self.path)}"
        form = f", data parallel {self.data_parallel}" if self.data_parallel else ""
        return (f"target {self.target}{form} (output runs on {self.runs_on}): {len(self.changes)} changes, "
                f"{len(self.findings)} findings need a human")

    def _repr_html_(self) -> str:
        parts = [f"<p><b>xla-migrate</b> {html.escape(self._summary_line())}</p>"]
        if self.diff:
            colours = {"+": "#1a7f37", "-": "#cf222e", "@": "#8250df"}
            rows = []
            for line in self.diff.splitlines():
                colour = colours.get(line[:1], "inherit")
                if line.startswith(("+++", "---")):
                    colour = "inherit"
                rows.append(f'<span style="color:{colour}">{html.escape(line)}</span>')
            parts.append('<pre style="font-size:90%">' + "\n".join(rows) + "</pre>")
        for title, items in (("Changes", self.changes), ("Needs a human", self.findings)):
            if items:
                entries = "".join(
                    f"<li><code>{i.code}</code> line {i.line}: {html.escape(i.message)}"
                    + (f" &mdash; <i>{html.escape(i.fix)}</i>" if getattr(i, "fix", "") else "")
                    + "</li>"
                    for i in items
                )
                parts.append(f"<p><b>{title}</b></p><ul>{entries}</ul>")
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.code if self.ok else self._summary_line()

    def __repr__(self) -> str:
        # What a terminal or a notebook's text view shows: a summary, not the whole source twice.
        if self.error is not None:
            return f"<MigrationResult {self.error.format(self.path)}>"
        changes = len(self.changes)
        what = f"{changes} change{'' if changes == 1 else 's'}" if self.changed else "nothing to change"
        findings = len(self.findings)
        form = f", data parallel {self.data_parallel}" if self.data_parallel else ""
        return (f"<MigrationResult {self.path}: {what}, {findings} finding{'' if findings == 1 else 's'}; "
                f"target {self.target}{form}, output runs on {self.runs_on}>")


@engine.cyclic_gc_paused
def migrate(
    source: str | bytes,
    target: str = DEFAULT_TARGET,
    select: str | list[str] | None = None,
    ignore: str | list[str] | None = None,
    path: str = "script.py",
    out_path: str | None = None,
    distributed: bool | None = None,
    data_parallel: str | None = None,
    project=None,
    fix_safety: str = "all",
) -> MigrationResult:
    """Migrate one script's source. Bytes keep the file's encoding, BOM and line endings exactly.

    ``distributed``: True migrates the script as a multi-replica one (``--distributed``), False as a
    single-device one (``--single``); None (the default) detects it from the script (DDP,
    ``init_process_group``, ``DistributedSampler``, torchrun's environment variables, ``mp.spawn``).

    ``select``/``ignore``: rule codes or prefixes (``"XLA1"``, ``"XLA101,XLA2"`` or a list); a code no rule
    has raises ValueError, since it is a mistake in the call rather than in the script.

    ``data_parallel``: the form a distributed script takes (DESIGN.md section 7): ``"ddp"`` keeps
    torch.distributed and DDP on torch_xla's ``xla`` process group, ``"xm"`` is the seeds' recipe (no DDP;
    ``xm.optimizer_step``, ``xmp.spawn``), ``"auto"`` (None: the default) takes xm where every update is shown
    reduced once and the replicas start equal, else ddp (``result.data_parallel_reason`` says why);
    ``"spmd"`` (target 2.9) makes it one SPMD program over a device mesh (docs/guide.md, Scale out). A form
    the target cannot use raises ValueError, as an unknown ``target`` does.

    ``project``: a ``project.ProjectIndex`` the script belongs to (``path`` names the file in it): the
    script is then migrated as part of that program (helpers in other modules, entry files, one distributed
    decision per program: an entry file and what it imports; docs/guide.md, Projects). None: migrated alone.

    ``fix_safety``: ``"all"`` (every selected rule edits) or ``"safe"`` (``--safe-only``: the rules whose fix
    is labelled ``review`` report what they would change instead of changing it)."""
    return _migrate(source, target, select, ignore, path, out_path, distributed, data_parallel, project,
                    fix_safety=fix_safety)


@engine.cyclic_gc_paused
def _migrate(source: str | bytes, target: str = DEFAULT_TARGET, select=None, ignore=None, path: str = "script.py",
             out_path: str | None = None, distributed: bool | None = None, data_parallel: str | None = None,
             project=None, cells_compiled: bool = False, fix_safety: str = "all") -> MigrationResult:
    """``migrate``; ``cells_compiled``: the source is a notebook's cells joined, each of which CPython
    compiled already as IPython compiles it (alone, top-level ``await`` allowed)."""
    if fix_safety not in ("all", "safe"):
        raise ValueError(f"fix_safety must be 'all' or 'safe' (got {fix_safety!r})")
    select = registry.as_selectors(select, "select")
    ignore = registry.as_selectors(ignore, "ignore")
    if isinstance(source, str):
        # A str is the text itself: a coding cookie does not re-decode it, and a leading BOM stays.
        bom = "\ufeff" if source.startswith("\ufeff") else ""
        text, to_parse = source, source[len(bom):]
        data = b""
    else:
        bom, text, to_parse, data = "", "", source, source
    target_spec = get_target(target)  # ValueError: a mistake in the call, as a bad selection
    form = target_spec.default_data_parallel if data_parallel is None else data_parallel
    problem = data_parallel_problem(target_spec, form)
    if problem is not None:
        raise ValueError(problem.replace("--data-parallel ", "data_parallel=", 1))
    result = MigrationResult(source=text, code=text, target=target_spec.name, path=path, out_path=out_path,
                             output_bytes=data)
    text, problem = _checked_text(source, to_parse, path, cells_compiled)
    if isinstance(source, bytes) and text is not None:
        result.source = result.code = text
    if problem is not None:
        result.error = problem
        return result
    view = project.view(path) if project is not None else None
    # Nothing to migrate: the same decision as a tree run's (triggers.py), except for a project's entry file,
    # which may never spell torch yet starts the distributed helpers of the modules it imports (the launcher).
    if not mentions_a_trigger(text) and not (view is not None and view.distributed
                                             and view.index.modules[view.rel].main_block):
        if isinstance(source, str):
            result.encoding = _encoding_for_text(source)
            result.output_bytes = source.encode(result.encoding)
        else:
            result.source = result.code = text
            result.encoding = engine.source_encoding(source)
        return result
    module = engine.parse(to_parse)
    if isinstance(module, InputError):
        result.error = module
        return result
    if isinstance(source, str):
        result.encoding = _encoding_for_text(source)
        result.output_bytes = source.encode(result.encoding)
    else:
        result.source = result.code = data.decode(module.encoding)
        result.encoding = module.encoding
    if view is not None and distributed is None and view.distributed:
        distributed = True  # one decision for the program (the entries reaching this module, what they import)
    try:
        rules = registry.select_rules(target_spec.name, select, ignore)
        report_only = frozenset(r.code for r in rules if r.fix_safety != "safe") if fix_safety == "safe" else frozenset()
        output = engine.run_pipeline(module, target_spec, rules, distributed=distributed, data_parallel=form,
                                     project=view, ignored_codes=registry.ignored_engine_codes(ignore),
                                     report_only=report_only)
    except RecursionError:  # the analysis of input the nesting guard let through; still the input's doing
        result.error = engine.too_deep_error()
        return result
    # Untouched input is returned as it came, even where libcst would not reprint it byte for byte.
    if output.code != output.input_code:
        # Put back what libcst does not reprint (form feeds in indentation, a final bare CR).
        code = layout.restore(to_parse if isinstance(source, str) else result.source, output.input_code,
                              output.code)
        if isinstance(source, str):
            result.code = bom + code
            result.encoding = _encoding_for_text(result.code)
            result.output_bytes = result.code.encode(result.encoding)
        else:
            result.code = code
            result.output_bytes = code.encode(module.encoding) if code != output.code else output.output_bytes
    result.changes = output.changes
    result.findings = output.findings
    result.data_parallel = output.data_parallel
    result.data_parallel_reason = output.data_parallel_reason
    if target_spec.runtime == "torch_tpu":
        result.releases = (TORCH_TPU_RELEASE, None)
    else:
        result.releases = runs_on(target_spec, output.concepts) if output.concepts else runs_on(
            target_spec, set(target_spec.spellings))
    return result


def _checked_text(source: str | bytes, to_parse: str | bytes, path: str,
                  cells_compiled: bool) -> tuple[str | None, InputError | None]:
    """(the source's text where it has one, why it is refused before any parse or None): too large, not
    text, or not Python by CPython's own compile() (input_checks.py)."""
    if isinstance(source, str):
        problem = input_checks.text_error(source) or input_checks.size_error(source)
        if problem is not None:
            return None, problem
        text = to_parse
    else:
        if len(source) > input_checks.MAX_INPUT_BYTES:
            return None, InputError(input_checks.size_message(len(source)))
        text = engine.check_input(source)
        if isinstance(text, InputError):
            return None, text
    if "\0" in text:
        return text, InputError("contains NUL characters, not Python source")
    return text, None if cells_compiled else input_checks.compile_error(text, path)


def _encoding_for_text(text: str) -> str:
    """The encoding ``output_bytes`` uses for a str: its coding cookie's where that can hold every character
    (a str declaring ``ascii`` may hold any), else UTF-8."""
    try:
        declared, _ = tokenize.detect_encoding(io.BytesIO(text.lstrip("\ufeff").encode("utf-8")).readline)
        declared = codecs.lookup(declared).name
        text.encode(declared)
    except (SyntaxError, LookupError, UnicodeError):
        return "utf-8"
    return "utf-8" if declared == "utf-8-sig" else declared


def migrate_file(path: str | os.PathLike, out: str | os.PathLike | None = None, **options) -> MigrationResult:
    """Migrate a file; write the output to ``out`` (atomically) when given. Read errors, and an ``out`` that
    is the input file itself (through links too), become ``error``."""
    source_path = Path(path)
    if out is not None:
        from .report.guards import Clash, Role, check

        try:  # never over the input (through a link or a hard link)
            check([Role("the input file", str(path), True), Role("out", str(out))])
        except Clash as clash:
            return MigrationResult(source="", code="", target=options.get("target", DEFAULT_TARGET),
                                   path=str(path), error=InputError(str(clash)))
    try:
        data = input_checks.read_bounded(source_path)
    except (OSError, input_checks.TooLarge) as error:
        message = str(error) if isinstance(error, input_checks.TooLarge) else f"cannot read: {error.strerror or error}"
        return MigrationResult(source="", code="", target=options.get("target", DEFAULT_TARGET), path=str(path),
                               error=InputError(message))
    result = migrate(data, path=str(path), out_path=str(out) if out is not None else None, **options)
    if out is not None and result.ok:
        from .report.files import write_atomically

        write_atomically(Path(out), result.output_bytes, mode_from=source_path)
    return result
