"""xla-migrate verify --devices N (issue 31): the migrated script runs as one SPMD program on N PJRT CPU devices
(CPU_NUM_DEVICES=N) and is compared with the original run as a world of one process (torchrun's variables for
rank 0 of 1): losses, compilations after warm-up, graph executions per step, and the devices the program
spans and how its trained parameters are laid out (split over the devices, or whole on each). Through the
real command line (`xla-migrate verify ... --devices 4 --format json`), like test_verify_xla.py; the SPMD
scripts are fixtures/runnable/ddp_spmd.py (data parallel: parameters whole on every device) and fsdp2_spmd.py
(FSDP2, which becomes FSDPv2: every parameter split) migrated with --data-parallel spmd.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import jsonschema
import pytest
import xla_proof as xp

pytestmark = pytest.mark.xla

SCHEMA = json.loads((xp.ROOT / "docs" / "verify.schema.json").read_text())
CLI = Path(sys.executable).with_name("xla-migrate")
DEVICES = 4
STEPS = 15  # 480 rows / 32 a batch (drop_last)
PARAMETERS = 12 * 24 + 24 + 24 * 3 + 3  # both fixtures' model: Linear(12, 24), Tanh, Linear(24, 3)


@lru_cache(maxsize=None)
def migrated_script(name: str = "ddp_spmd") -> Path:
    from xla_migrate import migrate

    original = xp.runnable_path(name)
    result = migrate(original.read_text(), target="2.9", data_parallel="spmd", path=str(original))
    assert result.error is None and result.findings == [], (result.error, result.findings)
    folder = Path(tempfile.mkdtemp(prefix="xla-verify-devices-"))
    xp.WORKDIRS.append(folder)
    script = folder / f"{name}.py"
    script.write_text(result.code)
    return script


@lru_cache(maxsize=None)
def verify(script: str, *options: str) -> tuple[int, dict, str]:
    python = xp.require_env("current")
    argv = [str(CLI), "verify", script, "--python", str(python), "--timeout", "400", "--format", "json", *options]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PJRT_", "PT_XLA_", "CPU_NUM_DEVICES"))}
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=xp.ROOT, env=env, timeout=900)
    assert proc.stdout.strip(), f"no report on stdout:\n{proc.stderr}"
    report = json.loads(proc.stdout)
    jsonschema.validate(report, SCHEMA)
    return proc.returncode, report, proc.stderr


@pytest.mark.parametrize("name", ["ddp_spmd", "fsdp2_spmd"])
def test_the_spmd_script_on_four_devices_is_clean_and_trains_like_the_original_on_one(name):
    original = xp.runnable_path(name)
    code, report, stderr = verify(str(migrated_script(name)), "--against", str(original), "--devices", str(DEVICES))
    assert (code, report["verdict"]["status"]) == (0, "clean"), (report["verdict"]["line"], stderr)
    # Data parallel: every device holds the whole model; FSDPv2: every parameter split over the devices.
    layout = {"sharded": PARAMETERS, "replicated": 0, "whole": []} if name == "fsdp2_spmd" else {
        "sharded": 0, "replicated": PARAMETERS, "whole": []}
    spmd = dict(report["spmd"])
    gathers = spmd.pop("all_gathers")
    assert spmd == {"requested_devices": DEVICES, "devices": DEVICES, "parameters": layout}
    # The step graph's all-gathers (compiled HLO): none in data parallel; FSDPv2 gathers its 4 parameters
    # (and one more small tensor; measured: 5, f32[12,24] among them).
    if name == "fsdp2_spmd":
        assert gathers["per_step"] >= 4 and "f32[12,24]" in gathers["shapes"], gathers
    else:
        assert gathers == {"per_step": 0, "shapes": []}, gathers
    assert report["device"] == "CPU" and report["run"]["processes"] == 1  # one program, no launcher
    assert report["compilations"]["after_warmup"] == 0
    assert report["executions"]["per_step"] == 1.0
    assert report["host_reads"]["outside_per_step"] == 0.0
    losses = report["losses"]
    assert losses["mode"] == "fp32" and losses["compared"] == STEPS, losses
    assert len(losses["values"]) == len(losses["original"]) == STEPS
    assert losses["max_delta"] <= 1e-4, losses["max_delta"]
    assert losses["original"][-1] < losses["original"][0]  # it trains: not two flat curves


def test_a_script_that_never_turns_spmd_on_is_a_problem():
    # A clean single-device XLA loop: it runs well on one of the 4 devices, and the spmd check is what fails.
    script = xp.ROOT / "fixtures" / "verify" / "clean_loop.py"
    code, report, _ = verify(str(script), "--devices", str(DEVICES))
    assert code == 1 and report["verdict"]["status"] == "slowdown", report["verdict"]["line"]
    assert {p["kind"] for p in report["verdict"]["problems"]} == {"spmd"}
    assert {k: v for k, v in report["spmd"].items() if k != "all_gathers"} == {
        "requested_devices": DEVICES, "devices": 0, "parameters": None}
    assert "never turned SPMD on" in report["verdict"]["line"]


def test_a_stray_annotation_is_named_whole_parameters_and_an_all_gather_per_step():
    # fixtures/verify/spmd_sharded_weight.py: data parallel, but the first Linear's weight sharded on "data".
    script = xp.ROOT / "fixtures" / "verify" / "spmd_sharded_weight.py"
    code, report, stderr = verify(str(script), "--devices", str(DEVICES))
    assert code == 0, (report["verdict"]["line"], stderr)  # results stay right: the layout is reported, not failed
    assert report["spmd"]["parameters"] == {"sharded": 12 * 24, "replicated": PARAMETERS - 12 * 24,
                                            "whole": ["0.bias [24]", "2.weight [3, 24]", "2.bias [3]"]}
    assert report["spmd"]["all_gathers"] == {"per_step": 1, "shapes": ["f32[12,24]"]}
    assert report["executions"]["per_step"] == 1.0 and report["compilations"]["after_warmup"] == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PJRT_", "PT_XLA_", "CPU_NUM_DEVICES"))}
    text = subprocess.run([str(CLI), "verify", str(script), "--python", str(xp.require_env("current")), "--devices",
                           str(DEVICES)], capture_output=True, text=True, cwd=xp.ROOT, env=env, timeout=900).stdout
    assert "whole beside split ones (a wrap missed them, or an annotation replicated them): 0.bias [24]" in text
    assert "all-gathers per step in the step graph: 1: f32[12,24] (in a data-parallel program" in text


@pytest.mark.parametrize("options", [("--devices", "0"), ("--devices", "4", "--device", "auto")])
def test_devices_needs_a_positive_count_on_the_cpu(options):
    code, report, _ = verify(str(migrated_script()), *options)
    assert code == 2 and report["verdict"]["status"] == "cannot-run"
    assert report["verdict"]["line"].startswith("verdict: cannot run: --devices"), report["verdict"]["line"]


def test_migrate_with_spmd_and_verify_checks_the_output_over_four_devices(tmp_path):
    # --verify after --data-parallel spmd: the written script runs as one program over 4 CPU devices.
    python = xp.require_env("current")
    out = tmp_path / "ddp_spmd_xla.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PJRT_", "PT_XLA_", "CPU_NUM_DEVICES"))}
    proc = subprocess.run([str(CLI), str(xp.runnable_path("ddp_spmd")), "--out", str(out), "--target", "2.9",
                           "--data-parallel", "spmd", "--verify", "--python", str(python)],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 0 and lines[-1].startswith("verdict: clean"), proc.stderr
    assert any(line.startswith(f"  spmd: given {DEVICES} devices, the program spans {DEVICES}") for line in lines), \
        proc.stderr
