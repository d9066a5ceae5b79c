"""xla-migrate verify without torch_xla: work that never reached the XLA device and its likely cause, the warm-up
of graphs first reached late, an original that fails, each run's own import path, the interpreter probe, and
what an interrupt or a timeout leaves behind (nothing: checked in /proc and the temporary folder)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import run_cli
from test_verify import ORIGINAL, clean_markers, losses_text, observation, snapshot

from xla_migrate.verify import core as v
from xla_migrate.verify import paths as verify_paths
from xla_migrate.verify import run as verify_run

SRC = Path(__file__).resolve().parents[1] / "src"


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


# Not on XLA ---------------------------------------------------------------------------------------------------


def idle_markers(count=12):
    return [snapshot(i, compiles=0, executions=0) for i in range(1, count + 1)]


def test_zero_graph_executions_is_not_on_xla_naming_a_device_flag(tmp_path):
    run = observation(idle_markers())
    run.events = [{"event": "device-flags", "flags": {"cuda": False, "lr": 0.1}, "where": f"{tmp_path}/t.py:8"},
                  {"event": "optimizer", "optimizer": "SGD", "step": 1, "devices": {"cpu": 161},
                   "where": f"{tmp_path}/t.py:20"}]
    report = v.assess(run, str(tmp_path / "t.py"), cwd=str(tmp_path))
    assert (report.status, report.exit_code) == ("not-on-xla", 1)
    assert [p.kind for p in report.problems] == ["not-on-xla"]
    assert report.verdict == ("verdict: not-on-xla: 0 graph executions on the XLA device and the optimizer's "
                              "parameters never on it (161 on CPU); likely cause: a device flag: --cuda is False "
                              "here (parsed at t.py:8); run with the flag that selects the accelerator, or make "
                              "the XLA device its default")
    assert report.placement["on_xla"] is False and report.placement["parameters"] == {"cpu": 161}
    assert "  trained parameters: 161 on CPU (SGD)" in v.render_text(report)


def test_graphs_on_the_device_but_parameters_on_the_cpu_is_not_on_xla():
    run = observation(clean_markers())  # one graph per step ran (the loss moved to the device, say)
    run.events = [{"event": "optimizer", "optimizer": "Adam", "step": 1, "devices": {"cpu": 40}, "where": "t.py:9"},
                  {"event": "cuda-gate", "call": "torch.cuda.is_available()", "result": False, "where": "t.py:4"}]
    report = v.assess(run, "t.py", cwd="/")
    assert report.status == "not-on-xla"
    assert report.problems[0].message.startswith("the optimizer's parameters never on it (40 on CPU); likely "
                                                  "cause: a CUDA gate that is False here: torch.cuda.is_available() "
                                                  "at t.py:4 chose the CPU")
    # no gate, no flag: graphs ran while the optimizer stepped CPU parameters, so it was built before the move
    run.events = run.events[:1]
    cause = v.assess(run, "/nonexistent.py", cwd="/").placement["likely_cause"]
    assert cause.startswith("the optimizer stepped at t.py:9 was built before the model moved to the XLA device")


@pytest.mark.parametrize("flags,cause", [
    ({"device": "cpu"}, "a device flag: --device is 'cpu'"),
    ({"no_cuda": True}, "a device flag: --no-cuda is True"),
    ({"use_cuda": False}, "a device flag: --use-cuda is False"),
])
def test_device_flags_that_chose_the_cpu(flags, cause):
    events = [{"event": "device-flags", "flags": flags, "where": "/w/t.py:3"}]
    assert v.likely_cause(events, "/nonexistent.py", "/w").startswith(cause)


def test_a_cpu_default_in_the_source_or_no_clue_at_all(tmp_path):
    script = write(tmp_path, "t.py", "import torch\n# 'cpu' in a comment\ndevice = torch.device('cpu')\n")
    assert v.likely_cause([], str(script), str(tmp_path)) == ("a CPU default: t.py:3 `device = torch.device('cpu')`; "
                                                              "use torch_xla's device there")
    plain = write(tmp_path, "u.py", "import torch\n")
    assert v.likely_cause([], str(plain), str(tmp_path)).startswith("the model and its batches were never moved")


def test_a_run_on_the_device_is_on_xla_and_a_crash_stays_a_crash():
    run = observation(clean_markers())
    run.events = [{"event": "optimizer", "optimizer": "SGD", "step": 1, "devices": {"xla": 161}, "where": "t.py:9"}]
    report = v.assess(run, "t.py")
    assert report.status == "clean" and report.placement["on_xla"] is True
    crashed = v.assess(observation(idle_markers(3), returncode=1, stderr="ValueError: x\n"), "t.py")
    assert crashed.status == "crash"


# Warm-up: graphs first reached after it ------------------------------------------------------------------------


def compile_block(frames, offset, graph):
    return v.Analysis("compilation", "user torch_xla.sync", ["/lib/x.py:1", *frames], graph, offset)


TRAIN, EVAL = ("addmm", "nll_loss_backward", "addcdiv"), ("addmm", "max", "eq")


def test_an_evaluation_loop_reached_after_warmup_compiles_its_first_graphs_without_a_problem():
    # evaluate(val), then evaluate(test) with another batch size, after warm-up: the same ops, so one graph by
    # what it traced; each set compiles in its first two steps (the running sum appears) and then runs cached
    compiled_at = {9: 1, 10: 1, 12: 1, 13: 1}
    markers, compiles = [], 2
    for i in range(1, 21):
        compiles += compiled_at.get(i, 0)
        markers.append(snapshot(i, compiles=compiles, offset=100 * i, traced=EVAL if 9 <= i <= 14 else TRAIN))
    train = ["/w/train.py:40", "/w/train.py:60"]
    analyses = [compile_block(train, 50, "t1"), compile_block(train, 150, "t2")]
    for n, caller in enumerate(("/w/train.py:45", "/w/train.py:46")):  # evaluate(val), evaluate(test)
        analyses += [compile_block(["/w/train.py:20", caller], 850 + n * 300, f"e{n}a"),
                     compile_block(["/w/train.py:20", caller], 950 + n * 300, f"e{n}b")]
    report = v.assess(observation(markers, analyses=analyses), "train.py", cwd="/w")
    assert report.status == "clean", report.verdict
    assert report.compilations["after_warmup"] == 4
    assert report.compilations["first_compiles_after_warmup"] == 4
    assert report.compilations["recompilations_after_warmup"] == 0


def test_a_graph_that_keeps_compiling_after_warmup_is_a_recompilation_even_with_new_graphs():
    # the training step compiles at every step (the same ops: a shape or a Python value changes); an evaluation
    # step at the end compiles its first graph
    markers = [snapshot(i, compiles=i, offset=100 * i, traced=EVAL if i == 12 else TRAIN) for i in range(1, 13)]
    analyses = [compile_block(["/w/train.py:40"], 100 * i - 50, f"h{i}") for i in range(1, 12)]
    analyses.append(compile_block(["/w/train.py:70"], 1150, "eval"))
    report = v.assess(observation(markers, analyses=analyses), "train.py", cwd="/w")
    assert [p.kind for p in report.problems] == ["recompilation"]
    assert report.compilations["recompilations_after_warmup"] == 6
    assert report.compilations["first_compiles_after_warmup"] == 1
    assert report.compilations["graphs_after_warmup"] == 6
    assert "at train.py:40" in report.problems[0].message
    assert report.compilations["causes"][0] == {"cause": "user torch_xla.sync", "where": "train.py:40", "count": 11,
                                                "after_warmup": 6, "recompilations": 6}


def test_a_training_graph_that_settles_after_warmup_and_a_save_step_are_warmup_not_recompilation():
    # llama2c under DDP: the initial evaluation takes the 5 warm-up markers; the training step then traces three
    # graphs in its first three steps (no optimizer state, DDP's rebuilt buckets, steady) and the step after each
    # checkpoint save a fourth, twice; the same line cuts them all. Per line, that read as 4 recompilations.
    steps = ([(EVAL, 1)] + [(EVAL[:2], 0)] * 3 + [(TRAIN, 1), (TRAIN + ("zero_",), 3), (TRAIN + ("cat",), 1)]
             + [(TRAIN + ("cat",), 0)] * 6 + [(TRAIN + ("save",), 2)] + [(TRAIN + ("cat",), 0)] * 6
             + [(TRAIN + ("save",), 1)])
    markers, compiles, analyses = [], 0, []
    for i, (traced, compiled) in enumerate(steps, 1):
        analyses += [compile_block(["/w/train.py:327"], 100 * i - 50 + k, f"g{i}{k}") for k in range(compiled)]
        compiles += compiled
        markers.append(snapshot(i, compiles=compiles, offset=100 * i, traced=traced))
    report = v.assess(observation(markers, analyses=analyses), "train.py", cwd="/w")
    assert report.status == "clean", report.verdict
    assert report.compilations["after_warmup"] == 7 and report.compilations["first_compiles_after_warmup"] == 7
    assert report.compilations["recompilations_after_warmup"] == 0
    # a third save step compiling again is the graph changing: a recompilation
    again = v.split_compiles([m["compiles"] for m in markers] + [compiles + 1], [m["traced"] for m in markers]
                             + [TRAIN + ("save",)], 5)
    assert again == (7, 1, [len(markers)])


# An original that fails ----------------------------------------------------------------------------------------


def test_the_xla_figures_are_kept_when_the_original_fails():
    broken = v.Process(1, "", "Traceback (most recent call last):\nRuntimeError: Found no NVIDIA driver\n", 0.5)
    clean = v.assess(observation(clean_markers(), stdout=losses_text(ORIGINAL)), "t.py", original=broken)
    assert (clean.status, clean.exit_code) == ("cannot-run", 2)
    text = v.render_text(clean)
    assert any(line.startswith("  graph executions: 1 per step") for line in text)
    assert text[-1] == ("verdict: cannot run: the original does not run on plain CPU torch (RuntimeError: Found no "
                        "NVIDIA driver)")
    assert clean.to_json()["executions"]["total"] == 12
    slow = [snapshot(i, executions=2 * i) for i in range(1, 13)]
    report = v.assess(observation(slow, stdout=losses_text(ORIGINAL)), "t.py", original=broken)
    assert (report.status, report.exit_code) == ("slowdown", 1)  # what the XLA run shows still counts
    assert report.verdict.endswith("(and the original does not run on plain CPU torch (RuntimeError: Found no "
                                   "NVIDIA driver))")


# Import paths -----------------------------------------------------------------------------------------------------


def test_the_trees_of_a_mirror_and_its_source(tmp_path):
    trees = verify_paths.Trees.of(tmp_path / "out/pkg/main.py", tmp_path / "src/pkg/main.py")
    assert (trees.migrated, trees.original) == (tmp_path / "out", tmp_path / "src")
    single = verify_paths.Trees.of(tmp_path / "o/main.py", tmp_path / "proj/main.py")
    assert (single.migrated, single.original) == (tmp_path / "o", tmp_path / "proj")
    assert verify_paths.Trees.of(tmp_path / "train_xla.py", tmp_path / "train.py") is None


def test_each_run_maps_the_others_tree_into_its_own(tmp_path):
    src, out = tmp_path / "proj", tmp_path / "proj" / "xla"  # a mirror inside its source folder
    for folder in (src / "lib", out / "lib", src / "data"):
        folder.mkdir(parents=True)
    entries = [str(out / "lib"), str(src / "lib"), ".", "/opt/site", str(src / "data")]
    assert verify_paths.own_import_path(entries, str(src), src, out) == [
        str(src / "lib"), str(src / "lib"), str(src), "/opt/site", str(src / "data")]
    # src/data has no twin in the mirror: the migrated run keeps it as it is
    assert verify_paths.own_import_path(entries, str(src), out, src) == [
        str(out / "lib"), str(out / "lib"), str(out), "/opt/site", str(src / "data")]


def test_the_original_never_imports_the_migrated_files(tmp_path):
    """PYTHONPATH pointing into the mirror (as a project run sets it) must not reach the original's run."""
    for tree, tag in (("src", "original"), ("mirror", "migrated")):
        write(tmp_path, f"{tree}/helper.py", f"TAG = {tag!r}\n")
        write(tmp_path, f"{tree}/main.py", "import helper, os, sys\nprint('helper', helper.TAG, helper.__file__)\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "mirror")}
    trees = verify_paths.Trees.of(tmp_path / "mirror/main.py", tmp_path / "src/main.py")
    mine, theirs = verify_paths.import_paths(env, str(tmp_path), tmp_path / "mirror/main.py",
                                           tmp_path / "src/main.py", trees)
    assert theirs == [str(tmp_path / "src")] and mine == [str(tmp_path / "mirror")]
    plain = verify_run.run_plain(sys.executable, tmp_path / "src/main.py", env=env, pythonpath=theirs, timeout=60)
    assert plain.returncode == 0, plain.stderr
    assert f"helper original {tmp_path / 'src' / 'helper.py'}" in plain.stdout


def test_a_script_migrated_out_of_its_project_imports_the_projects_helpers(tmp_path):
    write(tmp_path, "proj/helper.py", "TAG = 'project'\n")
    write(tmp_path, "proj/pkg/__init__.py", "")
    write(tmp_path, "proj/main.py", "import helper, pkg\nprint('helper', helper.TAG)\n")
    script = write(tmp_path, "out/main.py", "import helper, pkg\nprint('helper', helper.TAG)\n")
    mine, _ = verify_paths.import_paths({}, str(tmp_path), script, tmp_path / "proj/main.py", None,
                                      project_root=str(tmp_path / "proj"))
    seen = verify_run.observe(sys.executable, script, pythonpath=mine, env=dict(os.environ), debug=False)
    assert seen.process.returncode == 0, seen.process.stderr
    assert "helper project" in seen.process.stdout


# The interpreter probe ------------------------------------------------------------------------------------------


def test_the_interpreter_probe_never_imports_from_the_current_folder(tmp_path):
    marker = tmp_path / "imported.txt"
    for name in ("csv.py", "zipfile.py", "importlib_metadata.py"):
        write(tmp_path, name, f"open({str(marker)!r}, 'a').write({name!r})\n")
    write(tmp_path, "t.py", "print(1)\n")
    proc = run_cli("verify", "t.py", "--python", sys.executable, cwd=tmp_path, env={"XLA_MIGRATE_PYTHON": ""})
    assert proc.returncode == 2 and b"that interpreter has no torch_xla" in proc.stderr
    assert not marker.exists()
    old_cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        with pytest.raises(verify_run.CannotRun):
            verify_run.find_python(sys.executable)
    finally:
        os.chdir(old_cwd)
    assert not marker.exists()


# Interrupts, timeouts, temporary folders ------------------------------------------------------------------------

HANG = """\
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "{token}-grandchild"])
print("started", flush=True)
time.sleep(120)
"""

DRIVER = """\
import sys
from xla_migrate.verify import cli as verify_cli
from xla_migrate.verify import run as verify_run
try:
    with verify_run.stop_on_signals():
        verify_run.observe(sys.executable, sys.argv[1], ["{token}-script"], debug=False)
except verify_run.Interrupted as stop:
    sys.exit(verify_cli.interrupted(stop))
"""


def processes_with(token: str) -> list[str]:
    """Live processes (not zombies) whose command line holds ``token``: a /proc scan, no ps needed."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if token in command and stat[stat.rindex(")") + 2] != "Z":
            found.append(f"{entry}: {command}")
    return found


def wait_for(condition, seconds=30.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_verify_ends_the_scripts_whole_group_and_removes_its_folder(tmp_path, signum):
    token = f"xmv{os.getpid()}{signum}{time.time_ns()}"
    temp = tmp_path / "tmp"
    temp.mkdir()
    hang = write(tmp_path, "hang.py", HANG.format(token=token))
    driver = write(tmp_path, "driver.py", DRIVER.format(token=token))
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen([sys.executable, str(driver), str(hang)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: processes_with(f"{token}-grandchild")), "the script's child never started"
        assert list(temp.iterdir())  # verify's folder, while the script runs
        proc.send_signal(signum)
        stderr = proc.communicate(timeout=30)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signum, stderr
    name = signal.Signals(signum).name
    assert stderr.startswith(f"interrupted ({name}): ended the script's process group (pid "), stderr
    assert f"{token}-script" in stderr and f"{token}-grandchild" in stderr
    assert processes_with(token) == []
    assert list(temp.iterdir()) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_timeout_ends_the_whole_group_and_says_what_it_stopped(tmp_path, monkeypatch):
    token = f"xmvt{os.getpid()}{time.time_ns()}"
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    hang = write(tmp_path, "hang.py", HANG.format(token=token))
    seen = verify_run.observe(sys.executable, hang, [f"{token}-script"], debug=False, timeout=3)
    assert seen.process.timed_out and "started" in seen.process.stdout
    assert len(seen.process.stopped) == 2 and all(token in line for line in seen.process.stopped)
    report = v.assess(seen, str(hang))
    assert re.fullmatch(r"timed out after [34] s; ended 2 processes of its group", report.problems[0].message)
    assert report.run["stopped_processes"] == seen.process.stopped
    assert processes_with(token) == []
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_what_a_finished_script_leaves_running_is_ended(tmp_path):
    token = f"xmvo{os.getpid()}{time.time_ns()}"
    script = write(tmp_path, "orphan.py", f"""\
        import subprocess, sys
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "{token}"])
        """)
    seen = verify_run.observe(sys.executable, script, debug=False, timeout=60)
    assert seen.process.returncode == 0 and len(seen.process.stopped) == 1
    assert processes_with(token) == []


def test_the_folders_of_a_verify_killed_outright_are_removed_by_the_next(tmp_path, monkeypatch):
    monkeypatch.setattr(verify_run.tempfile, "gettempdir", lambda: str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        stale = tmp_path / f"{verify_run.WORKDIR_PREFIX}{dead.pid}-abc"
        live = tmp_path / f"{verify_run.WORKDIR_PREFIX}{alive.pid}-def"
        other = tmp_path / "xla-migrate-verify-notapid"
        for folder in (stale, live, other):
            (folder / "loader").mkdir(parents=True)
        assert verify_run.remove_stale_workdirs() == [str(stale)]
        assert not stale.exists() and live.exists() and other.exists()
    finally:
        alive.kill()
        alive.wait()


# The loader without torch ------------------------------------------------------------------------------------------


def test_the_loader_records_unseeded_python_draws_and_device_flags_in_the_originals_run(tmp_path):
    script = write(tmp_path, "orig.py", """\
        import argparse, random
        parser = argparse.ArgumentParser()
        parser.add_argument("--cuda", action="store_true")
        parser.add_argument("--lr", type=float, default=0.1)
        args = parser.parse_args()
        random.shuffle([1, 2, 3])
        random.seed(0)
        random.random()
        print("loss", args.lr)
        """)
    plain = verify_run.run_plain(sys.executable, script, ["--lr", "0.5"], timeout=60)
    assert plain.returncode == 0 and "loss 0.5" in plain.stdout, plain.stderr
    kinds = [(e["event"], e.get("kind"), e["where"]) for e in plain.events]
    assert kinds == [("device-flags", None, f"{script}:5"), ("random", "unseeded python", f"{script}:6")]
    assert plain.events[0]["flags"] == {"cuda": False}


# The original's working folder ----------------------------------------------------------------------------------


def test_the_originals_folder_mirrors_the_users_without_what_the_migrated_run_wrote(tmp_path):
    from xla_migrate.verify import workdirs

    user = tmp_path / "user"
    write(user, "data/train/a.txt", "a\n")
    write(user, "runs/old/log.txt", "old\n")
    write(user, "notes.txt", "mine\n")
    write(user, "gone.txt", "removed by the run\n")
    before = workdirs.list_folder(user)
    write(user, "ckpt/checkpoint.pth", "xla\n")  # what the migrated run writes
    write(user, "runs/new/log.txt", "xla\n")
    write(user, "data/train/b.txt", "b\n")
    (user / "gone.txt").unlink()
    added = workdirs.added_since(before)
    assert added == ["ckpt", "data/train/b.txt", "runs/new"]
    mirror = workdirs.mirror_without(before, added, tmp_path / "mirror")
    assert sorted(p.name for p in mirror.iterdir()) == ["data", "notes.txt", "runs"]
    assert (mirror / "notes.txt").is_symlink() and (mirror / "notes.txt").read_text() == "mine\n"
    assert not (mirror / "data").is_symlink() and (mirror / "runs" / "old").is_symlink()
    assert sorted(p.name for p in (mirror / "data" / "train").iterdir()) == ["a.txt"]
    assert sorted(p.name for p in (mirror / "runs").iterdir()) == ["old"]
    (mirror / "runs" / "original.txt").write_text("the original's\n")  # lands in the mirror's own folder
    import shutil
    shutil.rmtree(mirror)  # removes links, never what they point to
    assert (user / "runs" / "old" / "log.txt").read_text() == "old\n" and (user / "data/train/a.txt").exists()
    assert not (user / "runs" / "original.txt").exists() and (user / "ckpt" / "checkpoint.pth").exists()


def test_a_folder_past_the_listing_limit_is_linked_whole(tmp_path):
    from xla_migrate.verify import workdirs

    for index in range(5):
        write(tmp_path / "user", f"big/f{index}.txt", "x\n")
    before = workdirs.list_folder(tmp_path / "user", limit=1)  # lists the top folder only
    assert set(before.names) == {""}
    write(tmp_path / "user", "big/new.txt", "x\n")
    assert workdirs.added_since(before) == []
    mirror = workdirs.mirror_without(before, [], tmp_path / "mirror")
    assert (mirror / "big").is_symlink()
