"""xla-migrate verify on real torch_xla (PJRT CPU): the known-good and known-bad scripts of fixtures/verify/ each
get the right verdict, exit code and figures, through the real command line (`xla-migrate verify ... --python
ENV --format json`); about 10 s each on a quiet machine. The first tests run on both environments; those after
"Programs whose losses differ by design" (stochastic and mixed-precision pairs, work that never reaches the
device, evaluation loops, tree runs, interrupts) on the current one (torch_xla 2.9)."""

from __future__ import annotations

import json
import os
import re
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
    """(exit code, the JSON report or the text report, stderr) of one run; cached for the session. Options
    after "--" are the script's arguments."""
    python = python_for(env)
    if "--" in options:
        split = options.index("--")
        options, script_args = options[:split], options[split:]
    else:
        script_args = ()
    argv = [str(CLI), "verify", str(FIXTURES / f"{name}.py"), "--python", str(python), "--timeout", "300", *options]
    if "--format" not in options:
        argv += ["--format", "json"]
    argv += list(script_args)
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
                           "--output-format", "json-report"], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "XLA_MIGRATE_PYTHON": str(python)}, timeout=700)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["files"][0]["changed"]  # stdout: the migration's JSON report, alone
    lines = proc.stderr.splitlines()
    assert lines[-1].startswith("verdict: clean: "), lines[-1]
    assert f"{out}: torch_xla {xp.env_pins()[env].split('==')[-1]} on PJRT CPU ({python})" in lines
    # XLA's fused float32 arithmetic may differ from eager CPU torch's in the last bits (0 or about 1e-6 seen)
    compared = [re.search(r"vs the original on plain CPU torch \(fp32\): max \|delta\| (\S+) over 30 values "
                          r"\(tolerance 0\.001\)", line) for line in lines]
    deltas = [float(m.group(1)) for m in compared if m]
    assert len(deltas) == 1 and deltas[0] <= 1e-5, lines
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


# Programs whose losses differ by design, and work that never reaches the device (torch_xla 2.9) ---------------

CURRENT = "current"


def against(name: str) -> tuple[str, str]:
    return "--against", str(FIXTURES / f"{name}.py")


def curve(report: dict) -> dict:
    (only,) = report["losses"]["curves"]
    return only


def test_a_dropout_model_is_clean_by_its_curve_and_a_wrong_learning_rate_diverges():
    code, report, _ = verify(CURRENT, "dropout_xla", *against("dropout_original"))
    assert (code, report["verdict"]["status"]) == (0, "clean"), report["verdict"]["line"]
    losses = report["losses"]
    assert losses["mode"] == "stochastic" and losses["ok"] is True
    assert losses["max_delta"] > 1e-3  # step by step (the old check) it "diverged"
    assert curve(report)["r2"] >= 0.9 and curve(report)["rel_l1"] <= 0.06, curve(report)
    assert losses["random"][0].startswith("random ops on the XLA device (bernoulli x30): dropout in train mode "
                                          f"(Dropout) at {line_of('dropout_xla', 'model(inputs)')}")
    code, report, _ = verify(CURRENT, "dropout_wrong_lr", *against("dropout_original"))
    assert (code, report["verdict"]["status"]) == (1, "divergence"), report["verdict"]["line"]
    assert kinds(report) == {"losses"} and report["losses"]["mode"] == "stochastic"
    assert curve(report)["r2"] < 0.8 and curve(report)["rel_l1"] > 0.1, curve(report)
    assert "the loss curve differs from the original's (stochastic comparison over 30 values" in \
        report["verdict"]["line"]


def test_deterministic_switches_dropout_off_in_both_runs_for_the_strict_check():
    code, report, _ = verify(CURRENT, "dropout_xla", *against("dropout_original"), "--deterministic")
    assert (code, report["verdict"]["status"]) == (0, "clean"), report["verdict"]["line"]
    assert report["deterministic"] is True
    losses = report["losses"]
    assert losses["mode"] == "fp32" and losses["random"] == [] and losses["max_delta"] <= 1e-3
    assert losses["compared"] == 30


def test_a_random_augmentation_loop_is_clean_by_its_curve_and_a_skipped_step_diverges():
    code, report, _ = verify(CURRENT, "augment_xla", *against("augment_original"))
    assert (code, report["verdict"]["status"]) == (0, "clean"), report["verdict"]["line"]
    assert report["losses"]["mode"] == "stochastic" and report["losses"]["ok"] is True
    assert report["losses"]["random"][0].startswith("random ops on the XLA device (normal_ x30, uniform_ x30)")
    code, report, _ = verify(CURRENT, "augment_skipped_step", *against("augment_original"))
    assert (code, report["verdict"]["status"]) == (1, "divergence"), report["verdict"]["line"]
    assert curve(report)["r2"] < 0.8, curve(report)


def test_a_bf16_run_is_compared_by_its_curve_with_a_bf16_tolerance():
    code, report, _ = verify(CURRENT, "amp_xla", *against("amp_original"))
    assert (code, report["verdict"]["status"]) == (0, "clean"), report["verdict"]["line"]
    assert report["losses"]["mode"] == "bf16" and report["losses"]["random"] == []
    assert curve(report)["rel_l1"] <= 0.01
    code, report, _ = verify(CURRENT, "amp_wrong_lr", *against("amp_original"))
    assert (code, report["verdict"]["status"]) == (1, "divergence"), report["verdict"]["line"]
    assert report["losses"]["mode"] == "bf16" and curve(report)["rel_l1"] > 0.03  # "decreasing" would pass


def test_a_script_whose_model_stays_on_the_cpu_is_not_on_xla_naming_the_cuda_gate():
    code, report, _ = verify(CURRENT, "cuda_gate_cpu")
    assert (code, report["verdict"]["status"]) == (1, "not-on-xla"), report["verdict"]["line"]
    assert report["executions"]["total"] == 0 and report["steps"]["markers"] == 12
    placement = report["placement"]
    assert placement["on_xla"] is False and placement["parameters"] == {"cpu": 161}
    assert placement["likely_cause"].startswith("a CUDA gate that is False here: torch.cuda.is_available() at "
                                                f"{line_of('cuda_gate_cpu', 'torch.cuda.is_available()')}")


def test_a_device_flag_not_given_is_not_on_xla_and_against_args_compares_the_flagged_run():
    code, report, _ = verify(CURRENT, "flag_device_xla", *against("flag_device_original"))
    assert (code, report["verdict"]["status"]) == (1, "not-on-xla"), report["verdict"]["line"]
    assert "likely cause: a device flag: --cuda is False here (parsed at " \
        f"{line_of('flag_device_xla', 'parser.parse_args()')})" in report["verdict"]["line"]
    code, report, _ = verify(CURRENT, "flag_device_xla", *against("flag_device_original"), "--against-args", "",
                             "--", "--cuda")
    assert (code, report["verdict"]["status"]) == (0, "clean"), report["verdict"]["line"]
    assert report["args"] == ["--cuda"] and report["against_args"] == []
    assert report["placement"]["parameters"] == {"xla": 161} and report["losses"]["max_delta"] <= 1e-3


def test_an_original_that_fails_keeps_the_xla_figures_and_says_how_to_give_it_its_arguments():
    code, text, stderr = verify(CURRENT, "flag_device_xla", *against("flag_device_original"), "--format", "text",
                                "--", "--cuda")
    assert code == 2, stderr
    lines = text.splitlines()
    assert "  graph executions: 1 per step after warm-up (12 in all)" in lines
    assert lines[-1].startswith("verdict: cannot run: the original does not run on plain CPU torch (")
    assert lines[-1].endswith("; it ran with the script's arguments (--cuda): give it its own with --against-args")
    assert stderr.splitlines()[-1] == "error: " + lines[-1][len("verdict: cannot run: "):]


def test_an_evaluation_loop_first_reached_after_warmup_is_warmup_not_recompilation():
    code, report, _ = verify(CURRENT, "eval_loop")
    assert (code, report["verdict"]["status"]) == (0, "clean"), report["verdict"]["line"]
    compilations = report["compilations"]
    assert compilations["after_warmup"] >= 4  # the validation and test graphs: more than the 3 allowed before
    assert compilations["first_compiles_after_warmup"] == compilations["after_warmup"]
    assert compilations["recompilations_after_warmup"] == 0
    assert set(report["losses"]["values"]) and report["executions"]["per_step"] == 1.0


PROJECT_MAIN = '''\
import torch
import torch.nn as nn
from helper import make_model


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x = torch.randn(192, 8)
    y = x @ torch.randn(8, 1) / 3 + 0.1 * torch.randn(192, 1)
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(12):
        inputs, targets = x[step * 16:(step + 1) * 16].to(device), y[step * 16:(step + 1) * 16].to(device)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    for step, loss in enumerate(torch.stack(losses).cpu().tolist()):
        print(f"step {step} loss {loss:.6f}")


if __name__ == "__main__":
    main()
'''

PROJECT_HELPER = '''\
import os

import torch.nn as nn

with open(os.environ["HELPER_LOG"], "a") as log:
    log.write(__file__ + "\\n")


def make_model():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
'''


def test_verify_after_a_tree_run_checks_the_entry_in_the_mirror_each_run_importing_its_own_tree(tmp_path):
    """The mirror's entry imports the mirror's sibling module; the original imports its own, even with
    PYTHONPATH pointing into the mirror (as a project run sets it)."""
    python = python_for(CURRENT)
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "main.py").write_text(PROJECT_MAIN)
    (tmp_path / "proj" / "helper.py").write_text(PROJECT_HELPER)
    log = tmp_path / "helpers.log"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PJRT_", "PT_XLA_"))},
           "XLA_MIGRATE_PYTHON": str(python), "HELPER_LOG": str(log), "PYTHONPATH": str(tmp_path / "mirror")}
    proc = subprocess.run([str(CLI), "proj", "--out", "mirror", "--target", "2.9", "--verify"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=700)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 0, proc.stderr
    assert lines[-1].startswith("verdict: clean: 12 step markers, 1 graph execution per step"), lines[-1]
    assert f"{tmp_path / 'mirror' / 'main.py'}: torch_xla 2.9.0 on PJRT CPU ({python})" in lines
    assert any("max |delta|" in line and "over 12 values" in line for line in lines)
    assert log.read_text().splitlines() == [str(tmp_path / "mirror" / "helper.py"),
                                            str(tmp_path / "proj" / "helper.py")]


def test_the_original_starts_from_the_working_folder_as_the_xla_run_found_it(tmp_path):
    """Both scripts resume from `ckpt/checkpoint.pth` when it exists: run second in the same folder, the original
    would load the XLA run's checkpoint and train nothing (barlowtwins' checkpoint folder did that in the
    real-programs suite). verify runs it in a mirror of the folder without what the XLA run wrote."""
    python = python_for(CURRENT)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "kept.txt").write_text("the user's own file\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PJRT_", "PT_XLA_"))}
    proc = subprocess.run([str(CLI), "verify", str(FIXTURES / "resumes_xla.py"), *against("resumes_original"),
                           "--python", str(python), "--format", "json", "ckpt"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=700)
    report = json.loads(proc.stdout)
    jsonschema.validate(report, SCHEMA)
    assert (proc.returncode, report["verdict"]["status"]) == (0, "clean"), report["verdict"]["line"]
    assert report["hidden_from_original"] == ["ckpt"]
    assert report["losses"]["compared"] == 12 and report["losses"]["max_delta"] <= 1e-3, report["losses"]
    # the XLA run's checkpoint and the user's files stay; nothing of the original's mirror is left in the folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "data"]
    assert (tmp_path / "data" / "kept.txt").read_text() == "the user's own file\n"
    # without the mirror, the original resumes from that checkpoint and prints no loss at all
    again = subprocess.run([str(python), str(FIXTURES / "resumes_original.py"), "ckpt"], cwd=tmp_path,
                           env={**env, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "loss" not in again.stdout, again.stdout + again.stderr


# Interrupts and timeouts through the command line ------------------------------------------------------------

HANG = """\
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "{token}-grandchild"])
print("started", flush=True)
time.sleep(120)
"""


def processes_with(token: str) -> list[str]:
    """Live processes (not zombies) whose command line holds ``token`` (a /proc scan)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        if entry.isdigit() and token in command and stat[stat.rindex(")") + 2] != "Z":
            found.append(f"{entry}: {command}")
    return found


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "timeout"])
def test_an_interrupted_or_timed_out_verify_leaves_no_process_and_no_temporary_folder(tmp_path, how):
    import signal
    import time

    token = f"xmv{how}{os.getpid()}{time.time_ns()}"
    temp = tmp_path / "tmp"
    temp.mkdir()
    hang = tmp_path / "hang.py"
    hang.write_text(HANG.format(token=token))
    env = {**os.environ, "TMPDIR": str(temp)}
    argv = [str(CLI), "verify", str(hang), "--python", str(python_for(CURRENT)), "--", f"{token}-script"]
    if how == "timeout":
        argv[3:3] = ["--timeout", "15"]  # the script starts its child well within it, even on a busy machine
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if how != "timeout":
            deadline = time.monotonic() + 120
            while not processes_with(f"{token}-grandchild") and time.monotonic() < deadline:
                time.sleep(0.1)
            assert processes_with(f"{token}-grandchild"), "the script's child never started"
            proc.send_signal(getattr(signal, how))
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    if how == "timeout":
        assert proc.returncode == 1, stderr
        assert re.fullmatch(r"verdict: crash: timed out after 1[56] s; ended 2 processes of its group",
                            stdout.splitlines()[-1]), stdout
        assert "    ended its process group: pid " in stdout and f"{token}-grandchild" in stdout
    else:
        signum = getattr(signal, how)
        assert proc.returncode == 128 + signum, stderr
        assert stderr.startswith(f"interrupted ({how}): ended the script's process group (pid ")
        assert f"{token}-script" in stderr and f"{token}-grandchild" in stderr
    assert processes_with(token) == []
    assert list(temp.iterdir()) == []


# The loader's hooks on plain torch (the original's run) ---------------------------------------------------------

HOOKS = """\
import argparse
import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--device", default="cpu")
args = parser.parse_args()
use_cuda = torch.cuda.is_available()
model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 1))
torch.manual_seed(0)
x = torch.randn(4, 8)
model.train()
train_out = model(x)
model.eval()
print("dropout off", torch.equal(train_out, model(x)))
print("functional off", torch.equal(nn.functional.dropout(x, 0.5, training=True), x))
model.train()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
with torch.autocast("cpu", dtype=torch.bfloat16):
    loss = model(x).sum()
loss.backward()
optimizer.step()
"""


def test_the_loaders_hooks_on_plain_torch_record_the_choices_and_deterministic_switches_dropout_off(tmp_path):
    from xla_migrate.verify import run as verify_run

    script = tmp_path / "hooks.py"
    script.write_text(HOOKS)
    plain = verify_run.run_plain(str(python_for(CURRENT)), script, timeout=300, deterministic=True)
    assert plain.returncode == 0, plain.stderr
    assert "dropout off True" in plain.stdout and "functional off True" in plain.stdout
    events = {e["event"] + (":" + e["kind"] if "kind" in e else ""): e for e in plain.events}
    assert events["device-flags"]["flags"] == {"device": "cpu"}
    assert events["cuda-gate"] == {"event": "cuda-gate", "call": "torch.cuda.is_available()", "result": False,
                                   "where": f"{script}:8"}
    assert events["random:unseeded torch"]["where"] == f"{script}:9"  # parameters drawn before the seed
    assert events["autocast"]["dtype"] == "bfloat16" and events["autocast"]["enabled"] is True
    assert events["optimizer"]["devices"] == {"cpu": 81} and events["optimizer"]["optimizer"] == "SGD"
    normal = verify_run.run_plain(str(python_for(CURRENT)), script, timeout=300)
    assert "dropout off False" in normal.stdout and "functional off False" in normal.stdout


# Replicas: the probe in the XLA run ----------------------------------------------------------------------------
@pytest.mark.parametrize("env", ENVS)
def test_a_data_parallel_run_whose_updates_are_reduced_is_clean_and_says_so(env):
    code, report, _ = verify(env, "data_parallel", "--against", str(FIXTURES / "original.py"))
    assert (code, report["verdict"]["status"]) == (0, "clean"), report["verdict"]["line"]
    assert report["replicas"] == {"updates": 12, "data_parallel": True, "unreduced": 0, "reduced_twice": 0,
                                  "unequal_start": 12, "steps_nothing": 0, "reduced_by": ["xm"]}
    text = verify(env, "data_parallel", "--against", str(FIXTURES / "original.py"), "--format", "text")[1]
    assert ("  replicas: 12 data-parallel optimizer updates, 0 unreduced, 0 reduced twice (by xm); 12 from weights "
            "neither broadcast nor DDP-wrapped") in text, text


def test_a_data_parallel_run_with_unreduced_updates_diverges_though_its_losses_match():
    """World size 1: the losses equal the original's, yet every update steps unreduced gradients."""
    code, report, _ = verify("current", "data_parallel", "--against", str(FIXTURES / "original.py"), "--",
                             "--unreduced")
    assert (code, report["verdict"]["status"]) == (1, "divergence"), report["verdict"]["line"]
    assert report["losses"]["max_delta"] <= 1e-3 and report["losses"]["ok"]
    assert [p["kind"] for p in report["verdict"]["problems"]] == ["replicas"]
    assert report["verdict"]["problems"][0]["message"].startswith(
        "12 of 12 optimizer updates of this data-parallel run stepped gradients no all-reduce reached")
    assert report["replicas"]["unreduced"] == 12 and report["replicas"]["reduced_by"] == ["none"]


def test_a_single_process_run_is_not_judged_for_replicas():
    code, report, _ = verify("current", "clean_loop", "--against", str(FIXTURES / "original.py"))
    assert report["replicas"]["data_parallel"] is False and report["replicas"]["updates"] == 12
    assert report["replicas"]["unreduced"] == 12 and code == 0  # optimizer.step() on one device reduces nothing


def test_idle_loader_markers_are_not_steps_and_the_real_programs_measure_agrees(tmp_path):
    """Two graphs a step through a device loader whose end-of-epoch markers run nothing: per marker that read
    under 1 (22 executions in 23 markers, no problem); per step that ran a graph it is 1.8. torch_xla's own
    metrics file, read by the real-programs suite's measure, gives the same figures and verdict kinds."""
    sys.path.insert(0, str(xp.ROOT / "benchmarks"))
    import real_programs_measure as measure

    metrics = tmp_path / "metrics.txt"
    env_vars = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PJRT_", "PT_XLA_"))}
    env_vars["XLA_METRICS_FILE"] = str(metrics)
    proc = subprocess.run([str(CLI), "verify", str(FIXTURES / "loader_epochs_read.py"), "--python",
                           str(python_for(CURRENT)), "--format", "json", "--timeout", "300"],
                          capture_output=True, text=True, cwd=xp.ROOT, env=env_vars, timeout=700)
    report = json.loads(proc.stdout)
    jsonschema.validate(report, SCHEMA)
    assert proc.returncode == 1 and kinds(report) == {"executions"}, report["verdict"]["line"]
    executions = report["executions"]
    assert executions["steps"] < report["steps"]["after_warmup"] and executions["per_step"] > 1.5
    assert executions["after_warmup"] <= report["steps"]["after_warmup"]  # per marker: under one
    assert f"forced at {line_of('loader_epochs_read', 'loss.item()')}" in report["verdict"]["line"]
    # the evaluation pass after warm-up: its graphs' first compiles, no recompilation
    assert report["compilations"]["first_compiles_after_warmup"] >= 1
    assert report["compilations"]["recompilations_after_warmup"] == 0
    own = measure.metrics_figures(measure.parse_metrics_file(metrics.read_text()))
    assert (own["busy_steps"], own["executions_after_warmup"]) == (executions["steps"], executions["after_warmup"])
    assert own["first_compiles_after_warmup"] >= 1 and own["recompiles_after_warmup"] == 0
    problems = measure.own_problems({"exit_status": 0}, own, {"ok": None})
    assert measure.agreement(problems, report) == (True, "")


def test_an_optimizer_built_before_the_model_moved_is_not_on_xla_and_the_real_programs_probe_agrees(tmp_path):
    """atcold_seq's shape: graphs run on the device (forward and backward) while the optimizer steps the CPU
    parameters it was built with. verify's loader and the real-programs suite's own probe (its sitecustomize,
    which verify's loader runs after itself) each find the parameters on the CPU; both verdicts: not-on-xla."""
    sys.path.insert(0, str(xp.ROOT / "benchmarks"))
    import real_programs_measure as measure

    metrics, placement = tmp_path / "metrics.txt", tmp_path / "placement"
    placement.mkdir()
    env_vars = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PJRT_", "PT_XLA_"))}
    env_vars.update(XLA_METRICS_FILE=str(metrics), REAL_PROGRAMS_PLACEMENT=str(placement),
                    PYTHONPATH=str(xp.ROOT / "benchmarks" / "real_programs" / "_stubs"))
    proc = subprocess.run([str(CLI), "verify", str(FIXTURES / "optimizer_before_move.py"), "--python",
                           str(python_for(CURRENT)), "--format", "json", "--timeout", "300"],
                          capture_output=True, text=True, cwd=xp.ROOT, env=env_vars, timeout=700)
    report = json.loads(proc.stdout)
    jsonschema.validate(report, SCHEMA)
    assert (proc.returncode, report["verdict"]["status"]) == (1, "not-on-xla"), report["verdict"]["line"]
    assert report["executions"]["total"] >= 12 and report["placement"]["parameters"] == {"cpu": 161}
    assert report["placement"]["likely_cause"].startswith(
        f"the optimizer stepped at {line_of('optimizer_before_move', 'optimizer.step()')} was built before the "
        "model moved to the XLA device")
    own = measure.metrics_figures(measure.parse_metrics_file(metrics.read_text()))
    own["placement"] = measure.placement_figures(measure.read_placement(placement))
    assert own["executions"] >= 12  # graphs did run: the metrics file alone cannot tell
    assert own["placement"] == {"optimizer_steps": 12, "parameters": {"cpu": 161}, "on_xla": False}
    problems = measure.own_problems({"exit_status": 0}, own, {"ok": None})
    assert problems == ["not-on-xla"] and measure.agreement(problems, report) == (True, "")


@pytest.mark.parametrize("name,first,again", [("eval_loop", "all", 0), ("changing_batch", 0, 7)])
def test_verify_and_the_real_programs_measure_split_compilations_by_one_definition(tmp_path, name, first, again):
    """A graph is what a step traced; its first two steps are its warm-up (verify.split_compiles). verify's
    loader records the ops per marker, the suite reads them from torch_xla's metrics file of the same run: the
    validation and test graphs first reached after warm-up are first compiles on both sides, a batch size that
    changes every step is 7 recompilations on both."""
    sys.path.insert(0, str(xp.ROOT / "benchmarks"))
    import real_programs_measure as measure

    metrics = tmp_path / "metrics.txt"
    env_vars = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PJRT_", "PT_XLA_"))}
    env_vars["XLA_METRICS_FILE"] = str(metrics)
    proc = subprocess.run([str(CLI), "verify", str(FIXTURES / f"{name}.py"), "--python", str(python_for(CURRENT)),
                           "--format", "json", "--timeout", "300"],
                          capture_output=True, text=True, cwd=xp.ROOT, env=env_vars, timeout=700)
    report = json.loads(proc.stdout)
    jsonschema.validate(report, SCHEMA)
    compilations = report["compilations"]
    late = compilations["after_warmup"]
    assert compilations["first_compiles_after_warmup"] == (late if first == "all" else first), compilations
    assert compilations["recompilations_after_warmup"] == again, compilations
    own = measure.metrics_figures(measure.parse_metrics_file(metrics.read_text()))
    assert (own["markers"], own["compiles_after_warmup"]) == (report["steps"]["markers"], late)
    assert (own["first_compiles_after_warmup"], own["recompiles_after_warmup"]) == \
        (compilations["first_compiles_after_warmup"], again)
    problems = measure.own_problems({"exit_status": 0}, own, {"ok": None})
    assert measure.agreement(problems, report) == (True, "")
