"""Proof tier (tests/xla): the summary line CI shows, with the number of scripts run per environment."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest  # noqa: E402
import xla_proof as xp  # noqa: E402


def pytest_terminal_summary(terminalreporter):
    lines = summary_lines()
    if lines:
        terminalreporter.write_sep("-", "xla tier")
        for line in lines:
            terminalreporter.write_line(line)


def summary_lines() -> list[str]:
    """The tier's summary: scripts run per environment, then one line per migrated run."""
    if not xp.RECORD and not xp.SKIPPED:
        return []
    lines, parts = [], []
    for env in xp.TARGETS:
        fixtures = [run for e, name, run in xp.RECORD if e == env and "/" not in name]
        extra = [run for e, name, run in xp.RECORD if e == env and "/" in name]
        failed = [run for run in fixtures + extra if run.returncode != 0]
        skipped = {name for e, name, _ in xp.SKIPPED if e == env}
        parts.append(f"{env} env ran {len(fixtures)} migrated scripts + {len(extra)} hand-written runs "
                     f"({len(failed)} exited non-zero; {len(skipped)} not run: {', '.join(sorted(skipped)) or 'none'})")
    lines.append("xla tier: " + "; ".join(parts))
    for env, name, reason in sorted(xp.SKIPPED):
        lines.append(f"  not run: {env}/{name}: {reason}")
    for env, name, run in xp.RECORD:
        last = run.final
        if last is None:
            lines.append(f"  {env}/{name}: exit {run.returncode}, {run.wall:.1f} s (no metrics: "
                         f"torch_xla never reached a step marker)")
            continue
        fallbacks = ", ".join(f"{op} {n}" for op, n in sorted(last.fallbacks.items()) if n) or "none"
        lines.append(
            f"  {env}/{name}: exit {run.returncode}, {len(run.losses)} steps, {len(run.blocks)} step markers, "
            f"compiles {last.compiles}, runs {last.runs}, "
            f"host reads {last.reads} ({run.closure_reads} in closures), CPU fallbacks {fallbacks}, {run.wall:.1f} s"
            + (f", max |loss delta| {xp.DELTAS[(env, name)]:.2g}" if (env, name) in xp.DELTAS else ""))
    return lines


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: only the cases of the tests that will run
def pytest_collection_modifyitems(items):
    """The proof tier's cases that the selected tests will ask for, in their order, for xp.run_ahead: those of
    an environment that exists and that the harness does not skip."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if item.module.__name__ != "test_xla_proof" or "env" not in params or "name" not in params:
            continue
        env, name = params["env"], params["name"]
        if xp.env_python(env)[0] is None or xp.skip_reason(xp.SCRIPT_BY_NAME[name], env):
            continue
        if (name, env) not in xp.SELECTED:
            xp.SELECTED.append((name, env))


def pytest_sessionfinish(session, exitstatus):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: tests/conftest.py prints its summary in the main process
        workeroutput["xla_tier"] = summary_lines()
    xp.cleanup()  # the scripts' working folders (XLA_PROOF_KEEP=1 keeps them)
