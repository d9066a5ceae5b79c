"""Corpus benchmark: the xla-migrate command line over a folder of real training scripts, as a user runs it.

    .venv/bin/python benchmarks/corpus.py DIR [--targets sagemaker,2.9] [-j 2] [--json PATH]
                                              [--only-failures] [--match GLOB] [--examples N] [--keep DIR]

DIR is a folder of ``.py`` and ``.ipynb`` files (any depth; hidden folders and ``__pycache__`` are skipped),
for example a corpus of public repositories built as docs/corpus.md describes. It is never part of this
repository. For every file and every target, one process migrates the file the way a user would::

    xla-migrate --in FILE --out TMP/NAME --target T --report TMP/report.json

and, when the output differs from the input, a second process migrates the output again
(``xla-migrate --in TMP/NAME --check --diff --target T``). ``-j N`` (default 2) runs N files at a time, each
still one process. Then, in this process, with the checks of the test suite (benchmarks/output_checks.py):

- crash: an exit code other than 0 or 2, a traceback on stderr, an "internal error", or no answer within
  ``--timeout`` seconds (the traceback is then collected again with ``XLA_MIGRATE_DEBUG=1``);
- input error: exit 2 with a one-line reason (grouped by reason in the table);
- withdrawn: findings in the JSON report whose message starts with "rewrite withdrawn" (edits the output gate
  took back);
- does not compile: ``compile()`` of the output (of each code cell of a notebook, IPython lines masked) fails
  where the input compiled;
- not idempotent: the second migration changes something (or fails);
- already-XLA changed: the input imports torch_xla and the output differs from it in any way, except by XLA904
  alone, whose renames of what the target's torch_xla removed (``xm.xrt_world_size()`` -> ``xr.world_size()`` on
  2.9) are the point of migrating such code: those files are counted apart ("upgraded") and pass the bar;
- CUDA left without a finding: CUDA constructs of the output (the scanner of tests/test_cuda_invariant.py)
  with no finding on the input line they came from; the table gives them against the CUDA constructs of the
  inputs;
- new undefined names: names that no binding reaches in the output but do in the input (libcst scopes, as in
  tests/test_realistic_scripts.py), whether or not a finding names their line;
- seconds: the first migration's wall time per file (total and the slowest files), and the whole run.

Stdout gets one table (a column per target), then per target the failing files by kind (``--examples`` per
kind, default 8; ``--only-failures`` lists every failing file with its problems instead). Progress goes to
stderr. ``--json PATH`` saves every file's result; ``--keep DIR`` every output (DIR/TARGET/PATH). Exit
status: 0 when the issue's bars hold for every target (0 crashes, 0 outputs that do not compile, 0
non-idempotent outputs, 0 already-XLA files changed, at most 5% of the inputs' CUDA constructs left without a
finding), 1 when one does not, 2 for bad arguments.

Notebooks are checked as xla-migrate migrates them: their code cells (IPython lines masked, cells in another
language left out) joined into one program; each cell must compile on its own.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import fnmatch
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tokenize
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from output_checks import cuda_constructs, input_lines_for, unbound_names, uncovered_in  # noqa: E402

DEFAULT_TARGETS = ("sagemaker", "2.9")
WITHDRAWN_PREFIX = "rewrite withdrawn"
UNCOVERED_BAR = 0.05  # at most this share of the inputs' CUDA constructs may be left without a finding
IMPORTS_TORCH_XLA = re.compile(r"^[ \t]*(?:import[ \t]+torch_xla\b|from[ \t]+torch_xla\b)", re.MULTILINE)
REMOVED_API_RENAMES = {"XLA904"}  # its only changes: names the target's torch_xla removed, renamed
# Notebook cells: IPython lines (%magic, !shell, x = !cmd, obj?) become `pass` so that a cell compiles.
IPYTHON_LINE = re.compile(r"^(?P<indent>[ \t]*)(?:[%!]|[\w.]+(?:\s*,\s*[\w.]+)*\s*=\s*[%!]|\?+[\w.]|[\w.]+\?+\s*$)")
CELL_FINDING = re.compile(r":cell (?P<cell>\d+):line (?P<line>\d+): (?P<code>[A-Z]+\d+) ")


@dataclass
class FileResult:
    rel: str
    target: str
    kind: str  # python | notebook
    status: str = "ok"  # ok | crash | input-error
    rc: int | None = None
    seconds: float = 0.0
    changed: bool = False
    error: str = ""  # the crash or input-error reason (one line)
    traceback: str = ""  # a crash's traceback tail (rerun with XLA_MIGRATE_DEBUG=1)
    changes: int = 0
    change_codes: dict[str, int] = field(default_factory=dict)  # rule code -> changes (what touched the file)
    findings: int = 0
    withdrawn: list[str] = field(default_factory=list)
    compile_error: str = ""
    not_idempotent: str = ""  # the second migration's diff head, or why it failed
    already_xla: bool = False
    xla_changed: bool = False
    xla_upgraded: bool = False  # already on torch_xla, changed only by the removed-API renames of XLA904
    cuda_in: int = 0
    cuda_out: int = 0
    uncovered: list[str] = field(default_factory=list)
    new_undefined: list[str] = field(default_factory=list)
    check_error: str = ""  # this benchmark's own checks failed on the file (reported, never hidden)

    def problems(self) -> list[str]:
        """One short label per kind of failure of this file."""
        labels = []
        if self.status != "ok":
            labels.append(self.status)
        if self.withdrawn:
            labels.append(f"withdrawn x{len(self.withdrawn)}")
        if self.compile_error:
            labels.append("does not compile")
        if self.not_idempotent:
            labels.append("not idempotent")
        if self.xla_changed:
            labels.append("already-XLA changed")
        if self.uncovered:
            labels.append(f"CUDA left x{len(self.uncovered)}")
        if self.new_undefined:
            labels.append(f"undefined x{len(self.new_undefined)}")
        if self.check_error:
            labels.append("check error")
        return labels


# Running the command line --------------------------------------------------------------------------------
def _environment() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_MIGRATE_DEBUG"}
    env.update(NO_COLOR="1", TERM="dumb", PYTHONDONTWRITEBYTECODE="1")
    return env


def _run(command: list[str], timeout: float, env: dict | None = None) -> tuple[int | None, str, str, float]:
    """(exit code or None on timeout, stdout, stderr, seconds)."""
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, timeout=timeout, env=env or _environment())
    except subprocess.TimeoutExpired:
        return None, "", "", time.perf_counter() - start
    return (done.returncode, done.stdout.decode("utf-8", "replace"), done.stderr.decode("utf-8", "replace"),
            time.perf_counter() - start)


def _first_error_line(stderr: str) -> str:
    for line in stderr.splitlines():
        if line.startswith("error:"):
            return line[len("error:"):].strip()
    lines = [line for line in stderr.splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no message)"


def migrate_file(cli: str, root: str, rel: str, target: str, timeout: float, keep: str | None = None) -> FileResult:
    path = os.path.join(root, rel)
    kind = "notebook" if rel.endswith(".ipynb") else "python"
    result = FileResult(rel=rel, target=target, kind=kind)
    with tempfile.TemporaryDirectory(prefix="xla-corpus-") as tmp:
        out = os.path.join(tmp, os.path.basename(rel))
        report = os.path.join(tmp, "report.json")
        command = [cli, "--in", path, "--out", out, "--target", target, "--report", report]
        rc, _, stderr, seconds = _run(command, timeout)
        result.rc, result.seconds = rc, round(seconds, 3)
        if rc is None:
            result.status, result.error = "crash", f"no answer within {timeout:g} s"
            return result
        if rc not in (0, 2) or "Traceback (most recent call last)" in stderr or "internal error" in stderr:
            result.status, result.error = "crash", _first_error_line(stderr)
            debug = dict(_environment(), XLA_MIGRATE_DEBUG="1")
            _, _, debug_err, _ = _run(command, timeout, env=debug)
            result.traceback = "\n".join((debug_err or stderr).strip().splitlines()[-20:])
            return result
        if rc == 2:
            result.status, result.error = "input-error", _first_error_line(stderr)
            return result
        source, output = Path(path).read_bytes(), Path(out).read_bytes()
        if keep:
            kept = Path(keep, target, rel)
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_bytes(output)
        result.changed = output != source
        findings = _report_findings(report)
        result.findings = len(findings)
        changes = _report_entry(report).get("changes", [])
        result.changes = len(changes)
        for change in changes:
            result.change_codes[change.get("code", "?")] = result.change_codes.get(change.get("code", "?"), 0) + 1
        result.withdrawn = [f"line {f.get('line')}: {f.get('message', '')}" for f in findings
                            if str(f.get("message", "")).startswith(WITHDRAWN_PREFIX)]
        result.already_xla = IMPORTS_TORCH_XLA.search(source.decode("utf-8", "replace")) is not None
        upgrade_only = bool(result.change_codes) and set(result.change_codes) <= REMOVED_API_RENAMES
        result.xla_upgraded = result.already_xla and result.changed and upgrade_only
        result.xla_changed = result.already_xla and result.changed and not upgrade_only
        try:
            _check(result, kind, source, output, findings, stderr)
        except Exception as error:  # a limit of these checks, not of the tool: shown as its own column
            result.check_error = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        # An output that does not compile is counted once, there; it cannot be migrated again.
        if result.changed and not result.compile_error:
            again = [cli, "--in", out, "--check", "--diff", "--target", target]
            rc2, diff, stderr2, _ = _run(again, timeout)
            if rc2 == 1:
                result.not_idempotent = "\n".join(diff.splitlines()[:40]) or "--check says it would change"
            elif rc2 != 0:
                reason = "no answer" if rc2 is None else f"exit {rc2}: {_first_error_line(stderr2)}"
                result.not_idempotent = f"the second migration failed ({reason})"
    return result


def _report_entry(report: str) -> dict:
    try:
        files = json.loads(Path(report).read_text(encoding="utf-8")).get("files", [])
    except (OSError, ValueError):
        return {}
    return files[0] if files else {}


def _report_findings(report: str) -> list[dict]:
    return list(_report_entry(report).get("findings", []))


# Checks on the output -----------------------------------------------------------------------------------
@dataclass
class _Unit:
    """What migrates as one program: a .py file, or a notebook's code cells joined in order (as xla-migrate
    migrates them). ``cells`` are the output's (first line, cell number) pairs, to name a line of a notebook."""

    source: str
    output: str
    finding_lines: set[int]
    cells: list[tuple[int, int]] = field(default_factory=list)
    compile_errors: list[str] = field(default_factory=list)  # per notebook cell; a script compiles as a whole

    def where(self, line: int) -> str:
        for first, number in reversed(self.cells):
            if line >= first:
                return f"cell {number} line {line - first + 1}"
        return f"output line {line}"


def _decode(data: bytes) -> str:
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError:
        encoding = "utf-8"
    return data.decode(encoding, errors="replace")


PYTHON_CELL_MAGICS = ("%%time", "%%timeit", "%%capture", "%%prun")


def _mask(cell: str) -> str | None:
    """The cell as Python: IPython lines become ``pass``; None for a cell whose magic makes it another language."""
    lines = cell.split("\n")
    first = lines[0].strip() if lines else ""
    if first.startswith("%%") and first.split()[0] not in PYTHON_CELL_MAGICS:
        return None
    for index, line in enumerate(lines):
        match = IPYTHON_LINE.match(line)
        if match:
            lines[index] = match.group("indent") + "pass"
    return "\n".join(lines)


def _cell_text(cell: dict) -> str:
    text = cell.get("source", "")
    return "".join(text) if isinstance(text, list) else text


def _notebook_unit(source: bytes, output: bytes, findings: list[dict], stderr: str) -> _Unit:
    cells_in = json.loads(source.decode("utf-8")).get("cells", [])
    cells_out = json.loads(output.decode("utf-8")).get("cells", [])
    found = {(int(f["cell"]), int(f["line"])) for f in findings if f.get("cell") and f.get("line")}
    if not found:  # a report without cells: the text report names them
        found = {(int(m["cell"]), int(m["line"])) for m in CELL_FINDING.finditer(stderr)}
    joined_in: list[str] = []
    joined_out: list[str] = []
    unit = _Unit("", "", set())
    line_in = line_out = 1
    for number, (before, after) in enumerate(zip(cells_in, cells_out), 1):
        if before.get("cell_type") != "code":
            continue
        text_in, text_out = _mask(_cell_text(before)), _mask(_cell_text(after))
        if text_in is None or text_out is None or _compiles(text_in):
            continue  # another language, or IPython syntax this mask does not know: not compared
        error = _compiles(text_out)
        if error:
            unit.compile_errors.append(f"cell {number}: {error}")
            continue
        unit.finding_lines |= {line_in + line - 1 for cell, line in found if cell == number}
        unit.cells.append((line_out, number))
        joined_in.append(text_in.rstrip("\n") + "\n")
        joined_out.append(text_out.rstrip("\n") + "\n")
        line_in += joined_in[-1].count("\n")
        line_out += joined_out[-1].count("\n")
    unit.source, unit.output = "".join(joined_in), "".join(joined_out)
    return unit


def _compiles(code: str) -> str:
    """'' when ``code`` compiles, else the error in one line."""
    try:
        compile(code, "<output>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as error:
        line = getattr(error, "lineno", None)
        return f"{type(error).__name__}: {getattr(error, 'msg', error)}" + (f" (line {line})" if line else "")
    return ""


def _check(result: FileResult, kind: str, source: bytes, output: bytes, findings: list[dict], stderr: str) -> None:
    if kind == "python":
        unit = _Unit(_decode(source), _decode(output), {int(f["line"]) for f in findings if f.get("line")})
        if _compiles(unit.source):
            return  # the input itself does not compile here: nothing to compare against
        error = _compiles(unit.output)
        unit.compile_errors = [error] if error else []
    else:
        unit = _notebook_unit(source, output, findings, stderr)
    constructs_in = cuda_constructs(unit.source)
    result.cuda_in += len(constructs_in)
    if unit.compile_errors:
        result.compile_error = "; ".join(unit.compile_errors)
        return
    unchanged = unit.output == unit.source
    constructs_out = constructs_in if unchanged else cuda_constructs(unit.output)
    result.cuda_out += len(constructs_out)
    shim = SimpleNamespace(source=unit.source, code=unit.output,
                           findings=[SimpleNamespace(line=line) for line in unit.finding_lines])
    name_line = re.compile(r"^output line (\d+)")
    result.uncovered += [name_line.sub(lambda m: unit.where(int(m[1])), problem.replace("\n    ", " | "))
                         for problem in uncovered_in(shim, constructs_out)]
    if unchanged:
        return  # no name can have become undefined
    before = {name for name, _ in unbound_names(unit.source)}
    mapping = input_lines_for(unit.source, unit.output)
    out_lines = unit.output.splitlines()
    for name, line in unbound_names(unit.output):
        if name in before:
            continue
        noted = " (a finding names the line)" if unit.finding_lines & set(mapping.get(line, [])) else ""
        text = out_lines[line - 1].strip() if 0 < line <= len(out_lines) else ""
        result.new_undefined.append(f"{unit.where(line)}: {name!r}{noted} | {text}")


# The corpus and the run ----------------------------------------------------------------------------------
def discover(root: Path, pattern: str | None) -> list[str]:
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        for name in files:
            if name.endswith((".py", ".ipynb")):
                rel = os.path.relpath(os.path.join(folder, name), root)
                if pattern is None or fnmatch.fnmatch(rel, pattern):
                    found.append(rel)
    return sorted(found)


def run(cli: str, root: Path, files: list[str], targets: list[str], jobs: int, timeout: float,
        keep: str | None = None) -> list[FileResult]:
    # The largest files first, so that the slowest do not start last.
    order = sorted(files, key=lambda rel: -(root / rel).stat().st_size)
    tasks = [(rel, target) for rel in order for target in targets]
    results: list[FileResult] = []
    start, last_note = time.monotonic(), 0.0
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(migrate_file, cli, str(root), rel, target, timeout, keep): (rel, target)
                   for rel, target in tasks}
        for future in concurrent.futures.as_completed(futures):
            rel, target = futures[future]
            try:
                result = future.result()
            except Exception as error:  # the benchmark's own failure on one file: recorded, the run goes on
                result = FileResult(rel=rel, target=target, kind="notebook" if rel.endswith(".ipynb") else "python",
                                    check_error=f"{type(error).__name__}: {error}")
            results.append(result)
            elapsed = time.monotonic() - start
            problems = result.problems()
            if problems:
                print(f"[{len(results)}/{len(tasks)}] {target} {rel}: {', '.join(problems)}", file=sys.stderr)
            elif elapsed - last_note > 30 or len(results) == len(tasks):
                last_note = elapsed
                print(f"[{len(results)}/{len(tasks)}] {elapsed:.0f} s", file=sys.stderr)
    return sorted(results, key=lambda r: (r.target, r.rel))


# The table ------------------------------------------------------------------------------------------------
def summarise(results: list[FileResult]) -> dict:
    crashes = [r for r in results if r.status == "crash"]
    input_errors = [r for r in results if r.status == "input-error"]
    reasons: dict[str, int] = {}
    for r in input_errors:
        reason = re.sub(r"\b(line|column|col|cell) \d+", r"\1 N", r.error)
        reason = re.sub(r"^\S+?:(\d+:)*\s*", "", reason) if reason.startswith(("/", ".")) else reason
        reasons[reason[:120]] = reasons.get(reason[:120], 0) + 1
    xla = [r for r in results if r.already_xla]
    cuda_in = sum(r.cuda_in for r in results)
    uncovered = sum(len(r.uncovered) for r in results)
    seconds = [r.seconds for r in results]
    return {
        "files": len(results),
        "python": sum(1 for r in results if r.kind == "python"),
        "notebooks": sum(1 for r in results if r.kind == "notebook"),
        "changed": sum(1 for r in results if r.changed),
        "crashes": len(crashes),
        "input_errors": len(input_errors),
        "input_error_reasons": dict(sorted(reasons.items(), key=lambda item: -item[1])),
        "withdrawn_edits": sum(len(r.withdrawn) for r in results),
        "withdrawn_files": sum(1 for r in results if r.withdrawn),
        "not_compiling": sum(1 for r in results if r.compile_error),
        "not_idempotent": sum(1 for r in results if r.not_idempotent),
        "already_xla": len(xla),
        "already_xla_changed": sum(1 for r in xla if r.xla_changed),
        "already_xla_upgraded": sum(1 for r in xla if r.xla_upgraded),
        # Of those, the files that only device/torch.cuda rules (XLA1xx) changed: CUDA remnants in XLA code.
        "already_xla_changed_by_xla1xx_only": sum(1 for r in xla if r.xla_changed and r.change_codes
                                                  and all(code.startswith("XLA1") for code in r.change_codes)),
        "cuda_constructs_in_inputs": cuda_in,
        "cuda_constructs_in_outputs": sum(r.cuda_out for r in results),
        "cuda_left_without_finding": uncovered,
        "cuda_left_share": (uncovered / cuda_in) if cuda_in else 0.0,
        "cuda_left_files": sum(1 for r in results if r.uncovered),
        "new_undefined_names": sum(len(r.new_undefined) for r in results),
        "new_undefined_files": sum(1 for r in results if r.new_undefined),
        "check_errors": sum(1 for r in results if r.check_error),
        "seconds_total": round(sum(seconds), 1),
        "seconds_mean": round(sum(seconds) / len(seconds), 3) if seconds else 0.0,
        "slowest": [(r.rel, r.seconds) for r in sorted(results, key=lambda r: -r.seconds)[:5]],
    }


def bars_hold(summary: dict) -> bool:
    return (summary["crashes"] == 0 and summary["not_compiling"] == 0 and summary["not_idempotent"] == 0
            and summary["already_xla_changed"] == 0 and summary["cuda_left_share"] <= UNCOVERED_BAR)


def table(summaries: dict[str, dict]) -> str:
    targets = list(summaries)
    rows = [
        ("files (.py / .ipynb)", lambda s: f"{s['files']} ({s['python']} / {s['notebooks']})"),
        ("changed", lambda s: s["changed"]),
        ("crashes", lambda s: s["crashes"]),
        ("input errors (exit 2)", lambda s: s["input_errors"]),
        ("edits withdrawn by the gate (files)", lambda s: f"{s['withdrawn_edits']} ({s['withdrawn_files']})"),
        ("outputs that do not compile", lambda s: s["not_compiling"]),
        ("non-idempotent outputs", lambda s: s["not_idempotent"]),
        ("already-XLA files changed", lambda s: f"{s['already_xla_changed']} of {s['already_xla']}"),
        ("  of them by XLA1xx rules only", lambda s: s.get("already_xla_changed_by_xla1xx_only", 0)),
        ("  upgraded only (XLA904's removed-API renames)", lambda s: s.get("already_xla_upgraded", 0)),
        ("CUDA constructs in the inputs", lambda s: s["cuda_constructs_in_inputs"]),
        ("  left without a finding (files)", lambda s: f"{s['cuda_left_without_finding']} "
                                                       f"({100 * s['cuda_left_share']:.1f}%, {s['cuda_left_files']})"),
        ("new undefined names (files)", lambda s: f"{s['new_undefined_names']} ({s['new_undefined_files']})"),
        ("benchmark check errors", lambda s: s["check_errors"]),
        ("seconds: total (mean per file)", lambda s: f"{s['seconds_total']} ({s['seconds_mean']})"),
        ("issue's bars hold", lambda s: "yes" if bars_hold(s) else "NO"),
    ]
    cells = [[label] + [str(render(summaries[t])) for t in targets] for label, render in rows]
    widths = [max(len(row[i]) for row in cells + [["", *targets]]) for i in range(len(targets) + 1)]
    lines = ["  ".join(["".ljust(widths[0])] + [t.rjust(w) for t, w in zip(targets, widths[1:])])]
    for row in cells:
        lines.append("  ".join([row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]))
    return "\n".join(lines)


def _raised(traceback: str) -> list[str]:
    """The exception line of a traceback (``libcst._exceptions.ParserSyntaxError: ...``) and the innermost
    frame of xla-migrate's own code (the engine or a rule) that led to it."""
    lines = traceback.splitlines()
    for index in range(len(lines) - 1, -1, -1):
        if re.match(r"[\w.]+(Error|Exception|Interrupt|Exit)\b", lines[index]):
            frames = [line.strip() for line in lines[:index] if line.lstrip().startswith("File ")]
            own = [frame for frame in frames if re.search(r"xla_migrate|[/\\]transforms[/\\]", frame)]
            return (own or frames)[-1:] + [lines[index]]
    return lines[-1:]


KINDS = [
    ("crashes", lambda r: r.status == "crash", lambda r: [r.error] + _raised(r.traceback)),
    ("input errors", lambda r: r.status == "input-error", lambda r: [r.error]),
    ("edits withdrawn by the gate", lambda r: r.withdrawn, lambda r: r.withdrawn),
    ("outputs that do not compile", lambda r: r.compile_error, lambda r: [r.compile_error]),
    ("non-idempotent outputs", lambda r: r.not_idempotent, lambda r: r.not_idempotent.splitlines()[:12]),
    ("already-XLA files changed", lambda r: r.xla_changed,
     lambda r: ["changed by " + ", ".join(f"{code} x{n}" for code, n in sorted(r.change_codes.items()))]),
    ("CUDA left without a finding", lambda r: r.uncovered, lambda r: r.uncovered),
    ("new undefined names", lambda r: r.new_undefined, lambda r: r.new_undefined),
    ("benchmark check errors", lambda r: r.check_error, lambda r: [r.check_error]),
]


def details(results: list[FileResult], examples: int, only_failures: bool) -> list[str]:
    lines = []
    if only_failures:
        for r in results:
            if r.problems():
                lines.append(f"{r.rel}: {', '.join(r.problems())}")
                for _, selected, describe in KINDS:
                    if selected(r):
                        lines += [f"    {item}" for item in describe(r)[:10]]
        return lines
    for title, selected, describe in KINDS:
        chosen = [r for r in results if selected(r)]
        if not chosen:
            continue
        shown = chosen if title in ("crashes", "already-XLA files changed") else chosen[:examples]
        lines.append(f"{title}: {len(chosen)} files" + (f" (first {len(shown)})" if len(shown) < len(chosen) else ""))
        for r in shown:
            items = describe(r)
            lines.append(f"  {r.rel}" + (f": {items[0]}" if len(items) == 1 else ""))
            if len(items) > 1:
                lines += [f"      {item}" for item in items[:4]]
                if len(items) > 4:
                    lines.append(f"      ... {len(items) - 4} more")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", type=Path, help="the corpus folder (.py and .ipynb files, any depth)")
    parser.add_argument("--targets", default=",".join(DEFAULT_TARGETS), help="comma-separated (default %(default)s)")
    parser.add_argument("-j", "--jobs", type=int, default=2, help="files migrated at once (default %(default)s)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="save every file's result here")
    parser.add_argument("--only-failures", action="store_true", help="list every failing file with its problems")
    parser.add_argument("--match", metavar="GLOB", help="only files whose path under DIR matches (e.g. 'owner+repo/*')")
    parser.add_argument("--examples", type=int, default=8, help="failing files shown per kind (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=300,
                        help="seconds one migration may take (default %(default)s)")
    parser.add_argument("--keep", metavar="DIR", help="also write every output to DIR/TARGET/PATH (for triage)")
    parser.add_argument("--cli", default=None, help="the xla-migrate executable (default: next to this Python)")
    args = parser.parse_args(argv)
    cli = args.cli or shutil.which("xla-migrate", path=str(Path(sys.executable).parent)) or shutil.which("xla-migrate")
    if not cli:
        parser.error("no xla-migrate executable found: install the project (pip install -e .) or pass --cli")
    if not args.dir.is_dir():
        parser.error(f"{args.dir}: not a folder")
    if args.jobs < 1:
        parser.error("-j needs at least 1")
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    files = discover(args.dir, args.match)
    if not files:
        parser.error(f"{args.dir}: no .py or .ipynb files" + (f" matching {args.match}" if args.match else ""))
    repos = {rel.split(os.sep)[0] for rel in files if os.sep in rel}
    print(f"corpus {args.dir}: {len(files)} files in {len(repos)} folders; targets {', '.join(targets)}; "
          f"-j {args.jobs}; {cli}", file=sys.stderr)
    start = time.monotonic()
    results = run(cli, args.dir, files, targets, args.jobs, args.timeout, args.keep)
    wall = time.monotonic() - start
    summaries = {t: summarise([r for r in results if r.target == t]) for t in targets}
    xla_inputs = sum(1 for r in results if r.target == targets[0] and r.already_xla)
    print(f"corpus {args.dir}: {len(files)} files in {len(repos)} top-level folders, {xla_inputs} import torch_xla; "
          f"wall {wall:.0f} s with -j {args.jobs}")
    print()
    print(table(summaries))
    for target in targets:
        print()
        summary = summaries[target]
        print(f"== target {target}: slowest " + ", ".join(f"{rel} {s:.1f} s" for rel, s in summary["slowest"]))
        if summary["input_error_reasons"]:
            reasons = summary["input_error_reasons"].items()
            print("input errors by reason: " + "; ".join(f"{n} x {why}" for why, n in reasons))
        for line in details([r for r in results if r.target == target], args.examples, args.only_failures):
            print(line)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"corpus": str(args.dir), "targets": targets, "wall_seconds": round(wall, 1),
                                         "summary": summaries, "files": [asdict(r) for r in results]}, indent=1) + "\n")
        print(f"per-file results: {args.json}", file=sys.stderr)
    return 0 if all(bars_hold(s) for s in summaries.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
