"""xla-migrate verify on real torch_xla (PJRT CPU), both environments: the known-good and known-bad scripts of
fixtures/verify/ each get the right verdict, exit code and figures. Each runs once per environment through
the real command line (`xla-migrate verify ... --python ENV --format json`); about 10 s each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import jsonschema
import pytest
import xla_proof as xp

pytestmark = pytest.mark.xla

FIXTURES = xp.ROOT / "fixtures" / "verify"
SCHEMA = json.loads((xp.ROOT / "docs" / "verify.schema.json").read_text())
CLI = Path(sys.executable).with_name("xla-migrate")
ENVS = list(xp.TARGETS)
STEPS = 12  # every fixture runs 12 steps: 5 warm-up step markers, 7 after


def python_for(env: str) -> Path:
    return xp.require_env(env)


@lru_cache(maxsize=None)
def verify(env: str, name: str, *options: str) -> tuple[int, dict | str, str]:
    """(exit code, the JSON report or the text report, stderr) of one run; cached for the session."""
    python = python_for(env)
    argv = [str(CLI), "verify", str(FIXTURES / f"{name}.py"), "--python", str(python), "--timeout", "300", *options]
    if "--format" not in options:
        argv += ["--format", "json"]
    env_vars = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PJRT_", "PT_XLA_"))}
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=xp.ROOT, env=env_vars, timeout=700)
    if "text" in options:
        return proc.returncode, proc.stdout, proc.stderr
    assert proc.stdout.strip(), f"no report on stdout:\n{proc.stderr}"
    report = json.loads(proc.stdout)
    jsonschema.validate(report, SCHEMA)
    return proc.returncode, report, proc.stderr


def line_of(name: str, text: str) -> str:
    """fixtures/verify/NAME.py:LINE of the first line containing text (as verify names source lines)."""
    lines = (FIXTURES / f"{name}.py").read_text().splitlines()
    return f"fixtures/verify/{name}.py:{next(i for i, line in enumerate(lines, 1) if text in line)}"


def kinds(report: dict) -> set[str]:
    return {problem["kind"] for problem in report["verdict"]["problems"]}


@pytest.mark.parametrize("env", ENVS)
def test_clean_loop_is_clean_and_learns_like_the_original(env):
    code, report, _ = verify(env, "clean_loop", "--against", str(FIXTURES / "original.py"))
    assert (code, report["verdict"]["status"]) == (0, "clean"), report["verdict"]["line"]
    assert report["device"] == "CPU" and report["torch_xla"] == xp.env_pins()[env].split("==")[-1]
    assert report["steps"] == {"markers": STEPS, "warmup": 5, "after_warmup": 7}
    assert report["compilations"]["after_warmup"] == 0
    assert report["executions"]["per_step"] == 1.0
    assert report["host_reads"]["outside_per_step"] == 0.0 and report["host_reads"]["scalar_reads"] == 0
    assert report["fallback_ops"] == [] and report["deprecations"] == []
    losses = report["losses"]
    assert losses["mode"] == "fp32" and losses["compared"] == STEPS and losses["max_delta"] <= 1e-3
    assert len(losses["values"]) == len(losses["original"]) == STEPS


@pytest.mark.parametrize("env", ENVS)
def test_step_closures_are_clean_and_steps_stops_both_runs(env):
    code, report, _ = verify(env, "step_closures", "--against", str(FIXTURES / "original.py"), "--steps", "6")
    assert (code, report["verdict"]["status"]) == (0, "clean"), report["verdict"]["line"]
    assert report["run"]["stopped_after_steps"] == 6 and report["run"]["exit_status"] == 0
    assert report["steps"]["markers"] == 6
    reads = report["host_reads"]
    assert reads["in_step_closures"] == 6 and reads["outside_per_step"] == 0.0
    assert reads["sites"] == [{"where": line_of("step_closures", "loss.item()"), "count": 6,
                               "in_step_closure": True}]
    assert report["losses"]["compared"] == 6 and report["losses"]["max_delta"] <= 1e-3


@pytest.mark.parametrize("env", ENVS)
def test_a_host_read_every_step_is_a_slowdown_at_its_line(env):
    code, report, _ = verify(env, "host_read")
    assert (code, report["verdict"]["status"]) == (1, "slowdown")
    assert kinds(report) == {"executions", "host-reads"}
    where = line_of("host_read", "loss.item()")
    assert report["executions"]["per_step"] == 2.0
    assert report["host_reads"]["outside_per_step"] == 1.0 and report["host_reads"]["scalar_reads"] == STEPS
    assert {"where": where, "count": STEPS, "in_step_closure": False} in report["host_reads"]["sites"]
    assert report["host_reads"]["forced_executions"][0] == {"where": where, "count": STEPS}
    assert f"forced at {where}" in report["verdict"]["line"]


@pytest.mark.parametrize("env", ENVS)
def test_a_batch_size_that_changes_every_step_recompiles_every_step(env):
    code, report, _ = verify(env, "changing_batch")
    assert (code, report["verdict"]["status"]) == (1, "slowdown")
    assert kinds(report) == {"recompilation"}
    compilations = report["compilations"]
    assert compilations["total"] == STEPS and compilations["after_warmup"] == 7
    assert compilations["graphs_after_warmup"] == 7
    top = compilations["causes"][0]
    assert top["after_warmup"] == 7 and top["where"] == line_of("changing_batch", "xm.mark_step()")
    assert report["executions"]["per_step"] == 1.0  # one graph per step: each one new
    # 2.9 deprecates the 1.13-era names the script uses, and says so at the script's lines; 2.6.1 does not.
    deprecated = {(d["where"], d["message"]) for d in report["deprecations"]}
    if env == "current":
        assert deprecated == {(line_of("changing_batch", "xm.xla_device()"), "Use torch_xla.device instead"),
                              (line_of("changing_batch", "xm.mark_step()"), "Use torch_xla.sync instead")}
    else:
        assert deprecated == set()


@pytest.mark.parametrize("env", ENVS)
def test_an_op_without_an_xla_lowering_is_a_fallback(env):
    code, report, _ = verify(env, "fallback_op")
    assert (code, report["verdict"]["status"]) == (1, "slowdown")
    assert "fallback" in kinds(report)
    assert report["fallback_ops"] == [{"op": "aten::nonzero", "count": STEPS}]
    # the CPU op needs its input on the host: torch_xla runs the mask's graph first, at that line
    assert report["host_reads"]["forced_executions"][0]["where"] == line_of("fallback_op", "torch.nonzero(")


@pytest.mark.parametrize("env", ENVS)
def test_a_crash_is_the_verdict_with_its_last_error_line(env):
    code, text, stderr = verify(env, "crashes", "--format", "text")
    assert code == 1, stderr
    lines = text.splitlines()
    assert lines[-1].startswith("verdict: crash: exit status 1: RuntimeError: "), lines[-1]
    assert "  step markers: 3 (1 warm-up, 2 after)" in lines  # it crashed in its third step


@pytest.mark.parametrize("env", ENVS)
def test_losses_that_part_from_the_original_are_a_divergence(env):
    code, report, _ = verify(env, "diverges", "--against", str(FIXTURES / "original.py"))
    assert (code, report["verdict"]["status"]) == (1, "divergence")
    assert kinds(report) == {"losses"}
    losses = report["losses"]
    assert losses["ok"] is False and losses["max_delta"] > 1e-3
    # momentum changes nothing in the first two updates' losses, then the curves part
    assert abs(losses["values"][0] - losses["original"][0]) <= 1e-3
    assert "first at value 2" in report["verdict"]["line"]


@pytest.mark.parametrize("env", ENVS)
def test_migrate_verify_checks_what_it_wrote_against_the_input(env, tmp_path):
    python = python_for(env)
    out = tmp_path / "sgd_xla.py"
    source = xp.SCRIPT_BY_NAME["sgd_item_save"].path
    proc = subprocess.run([str(CLI), str(source), "--out", str(out), "--target", xp.TARGETS[env], "--verify",
                           "--format", "json"], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "XLA_MIGRATE_PYTHON": str(python)}, timeout=700)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["files"][0]["changed"]  # stdout: the migration's JSON report, alone
    lines = proc.stderr.splitlines()
    assert lines[-1].startswith("verdict: clean: "), lines[-1]
    assert f"{out}: torch_xla {xp.env_pins()[env].split('==')[-1]} on PJRT CPU ({python})" in lines
    assert any("max |delta| 0 over 30 values (fp32 tolerance 0.001)" in line for line in lines)
    assert "    30x at sgd_xla.py:" in "\n".join(lines) and "(in a step closure)" in "\n".join(lines)


@pytest.mark.parametrize("env", ENVS)
def test_verify_uses_the_current_interpreter_and_keeps_xla_metrics_file_working(env, tmp_path):
    """From inside an interpreter that has torch_xla (the library, no --python), with the user's own
    XLA_METRICS_FILE set: on 2.6.1 its writer (run by xm.mark_step) needs the loader's workaround, else every
    step marker raises TypeError."""
    python = python_for(env)
    metrics = tmp_path / "metrics.txt"
    code = ("import json, sys\nfrom xla_migrate import verify\n"
            f"report = verify.verify({str(FIXTURES / 'changing_batch.py')!r}, steps=3)\n"
            "print(json.dumps(report.to_json()))\n")
    env_vars = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PJRT_", "PT_XLA_"))}
    env_vars.update(PYTHONPATH=str(xp.ROOT / "src"), XLA_METRICS_FILE=str(metrics))
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env_vars,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["python"] == str(python)
    assert report["run"]["exit_status"] == 0 and report["verdict"]["status"] != "crash", report["verdict"]["line"]
    assert report["run"]["stopped_after_steps"] == 3 and report["steps"]["markers"] == 3
    assert metrics.read_text().count("[MetricsData; step=") == 3
