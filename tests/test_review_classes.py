"""The defect classes of the session's expert review (its second round: 15 real programs migrated as trees),
one test each, on the review's own fixtures in ``fixtures/review/<issue>-<class>/`` (each folder: the
self-written input, under 60 lines a file, and a README saying what is wrong today and what right looks like).

Each test migrates its fixture the way the review did (a single file with ``migrate``, a multi-file fixture as a
tree run of the CLI) and asserts the RIGHT behaviour of the README, with line numbers and code fragments. A class
the tool still gets wrong is marked ``known_defect(issue, what)``: a strict xfail that only an AssertionError
satisfies (a crash of the tool still fails the test). The suite stays green today; the day a change fixes the
class, the test XPASSes and strict mode fails it.

Retiring an xfail: when a test XPASSes, read its README, check that the output is right (not merely different),
delete the ``@known_defect(...)`` line, and say in the commit which class of the review it closes. Do not loosen
an assertion to make it pass; if the fix takes another right shape than the README's, extend the assertion to
accept that shape and say why.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from xla_migrate import cli, migrate

ROOT = Path(__file__).resolve().parents[1]
REVIEW = ROOT / "fixtures" / "review"
BOTH = pytest.mark.parametrize("target", ["2.9", "sagemaker"])

# The spellings each target's output uses.
DEVICE = {"2.9": "torch_xla.device()", "sagemaker": "xm.xla_device()"}
LAUNCH = {"2.9": "torch_xla.launch", "sagemaker": "xmp.spawn"}
BARRIER = {"2.9": "torch_xla.sync()", "sagemaker": "xm.mark_step()"}


def known_defect(issue: int, what: str):
    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=f"issue {issue}: {what}")


@dataclass(frozen=True)
class Note:
    line: int
    code: str
    message: str


@dataclass
class Migrated:
    code: dict[str, str]  # file (relative to the fixture) -> output text
    findings: dict[str, list[Note]]
    changes: dict[str, list[Note]]

    def notes_at(self, rel: str, lines, code: str | None = None) -> list[Note]:
        return [f for f in self.findings[rel] if f.line in lines and (code is None or f.code == code)]


_CACHE: dict[tuple[str, str], Migrated] = {}


@pytest.fixture(scope="module")
def migrated(tmp_path_factory):
    """``migrated(fixture, target)``: the fixture's migration, once per module."""

    def run(name: str, target: str) -> Migrated:
        key = (name, target)
        if key not in _CACHE:
            _CACHE[key] = _migrate(REVIEW / name, target, tmp_path_factory)
        return _CACHE[key]

    return run


def _migrate(folder: Path, target: str, tmp_path_factory) -> Migrated:
    files = sorted(folder.rglob("*.py"))
    if len(files) == 1:
        result = migrate(files[0].read_bytes(), target=target, path=str(files[0]))
        if result.error is not None:
            raise RuntimeError(f"{folder.name}: {result.error}")
        rel = files[0].name
        return Migrated({rel: result.code}, {rel: [Note(f.line, f.code, f.message) for f in result.findings]},
                        {rel: [Note(c.line, c.code, c.message) for c in result.changes]})
    return _tree_run(folder, target, tmp_path_factory.mktemp(f"{folder.name}-{target}"))


def _tree_run(folder: Path, target: str, work: Path) -> Migrated:
    """The CLI's tree run (one project index, one decision for the project), in this process for speed."""
    out, report = work / "out", work / "report.json"
    ran = CliRunner().invoke(cli.app, [str(folder), "--out", str(out), "--target", target, "-j", "1",
                                       "--report", str(report), "-q"])
    if ran.exit_code != 0:
        raise RuntimeError(f"{folder.name} [{target}]: exit {ran.exit_code}: {ran.output[-500:]}")
    files = json.loads(report.read_text())["files"]
    code, findings, changes = {}, {}, {}
    for entry in files:
        rel = str(Path(entry["path"]).resolve().relative_to(folder))
        code[rel] = (out / rel).read_text()
        findings[rel] = [Note(f["line"], f["code"], f["message"]) for f in entry["findings"]]
        changes[rel] = [Note(c["line"], c["code"], c["message"]) for c in entry["changes"]]
    return Migrated(code, findings, changes)


def _function(code: str, name: str) -> tuple[ast.FunctionDef, str]:
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node, ast.get_source_segment(code, node)
    raise LookupError(name)


def _if_false(code: str) -> list[str]:
    """The `if False:` blocks of the code (comments that mention one do not count)."""
    return [ast.unparse(n)[:200] for n in ast.walk(ast.parse(code))
            if isinstance(n, ast.If) and isinstance(n.test, ast.Constant) and n.test.value is False]


def _show(notes: list[Note]) -> str:
    return "; ".join(f"{n.line}:{n.code} {n.message[:80]}" for n in notes) or "none"


# Severity S (silent wrong training) ----------------------------------------------------------------------------


@BOTH
def test_star_import_device_line_becomes_the_xla_device(migrated, target):
    run = migrated("29-star-import-device-kept", target)
    code = run.code["train.py"]
    rewritten = re.search(rf"^device = {re.escape(DEVICE[target])}$", code, re.MULTILINE)
    reported = [f for f in run.notes_at("train.py", (8, 19)) if f.code != "XLA900" and "CPU" in f.message]
    assert rewritten or reported, (
        f"line 8 kept as {re.search(r'^device = .*$', code, re.MULTILINE).group(0)!r}; findings at 8/19: "
        f"{_show(run.notes_at('train.py', (8, 19)))}")


@BOTH
def test_device_selector_keeps_choosing_the_xla_device(migrated, target):
    run = migrated("29-device-selector-folded-to-cpu", target)
    code = run.code["train.py"]
    assert not _if_false(code)
    _, selector = _function(code, "pick_device")
    chooses_xla = re.search(r'name = "xla(:0)?"', selector) or DEVICE[target] in selector
    says_cpu = [f for f in run.notes_at("train.py", (14, 26)) if "CPU" in f.message]
    assert chooses_xla or says_cpu, f"pick_device today:\n{selector}\nfindings: {_show(run.findings['train.py'])}"


@BOTH
def test_launch_after_a_folded_device_count_stays_reachable(migrated, target):
    run = migrated("28-launch-unreachable-after-folded-count", target)
    main, text = _function(run.code["train.py"], "main")
    launches = [n for n in ast.walk(main) if isinstance(n, ast.Call)
                and ast.unparse(n.func) == LAUNCH[target]]
    assert len(launches) == 1, text
    guarded = any(isinstance(n, ast.If) and launches[0] in ast.walk(n) for n in ast.walk(main))
    # A guard is fine only where main() now counts the XLA processes (a call, not the constant 0).
    counted = any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "num_gpus" for t in n.targets)
                  and not isinstance(n.value, ast.Constant) for n in ast.walk(main))
    reported = run.notes_at("train.py", (42, 43))
    assert not guarded or counted or reported, f"main() today:\n{text}"


@BOTH
def test_fixed_padding_under_an_unmasked_mean_is_reported(migrated, target):
    run = migrated("36-fixed-padding-changes-unmasked-mean", target)
    # The rewrite itself stays (it removes the per-length recompilations) ...
    assert "batch_ids[0].new_zeros((max_length, *batch_ids[0].shape[1:]))" in run.code["train.py"]
    # ... and a finding names the collate line (25) or the unmasked mean (19).
    reported = run.notes_at("train.py", (25,), "XLA316") + run.notes_at("train.py", (19,))
    assert reported, f"findings: {_show(run.findings['train.py'])}"


# Severity C (a crash or hang the original did not have) -----------------------------------------------------


@BOTH
def test_entry_without_trigger_word_is_launched(migrated, target):
    """Fixed since the review (right today): the entry that never spells torch gets the launcher its twin
    train_f.py (one unused torch import more) gets."""
    run = migrated("29-entry-without-trigger-word-not-launched", target)
    launcher = "def _mp_fn(index):\n    # Called once per XLA worker (index: the worker's ordinal).\n    main()\n"
    for entry in ("image_train.py", "train_f.py"):
        assert launcher in run.code[entry], entry
        assert run.code[entry].endswith(f'if __name__ == "__main__":\n    {LAUNCH[target]}(_mp_fn, args=())\n'), entry
    assert [c.code for c in run.changes["image_train.py"]] == ["XLA407", "XLA407"]


@BOTH
def test_tests_of_one_gate_fold_the_same_way(migrated, target):
    run = migrated("29-gate-folded-both-ways", target)
    _, text = _function(run.code["train.py"], "log_every")
    formats = re.findall(r"log_msg\.format\((.*?)\)\)\n", text, re.DOTALL)
    assert formats, text
    needs_memory = "{memory" in text
    consistent = not needs_memory or all("memory=" in call for call in formats)
    assert consistent or run.notes_at("train.py", (14,)), f"log_every today:\n{text}"


@BOTH
def test_device_name_is_bound_on_the_path_that_uses_it(migrated, target):
    main, text = _function(migrated("29-device-name-from-sibling-branch", target).code["train.py"], "main")
    branch = next(n for n in main.body if isinstance(n, ast.If) and ast.unparse(n.test) == "args.shard")
    before = main.body[:main.body.index(branch)]

    def stored(nodes):
        return {n.id for s in nodes for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}

    loaded = {n.id for s in branch.orelse for n in ast.walk(s) if isinstance(n, ast.Name)
              and isinstance(n.ctx, ast.Load)}
    unbound = (loaded & stored(main.body)) - stored(before) - stored(branch.orelse)
    orelse = "\n".join(ast.unparse(s) for s in branch.orelse)
    assert "model.to(" in orelse, text
    assert not unbound, f"the else branch reads {sorted(unbound)}, bound only in the other branch:\n{orelse}"


@BOTH
def test_torch_fsdp_is_migrated_or_reported(migrated, target):
    run = migrated("28-torch-fsdp-kept-unreported", target)
    code = run.code["train.py"]
    migrated_to_xla = "torch.distributed.fsdp import" not in code and "FullyShardedDataParallel" in code
    reported = [f for f in run.notes_at("train.py", (10, 21)) if "FSDP" in f.message]
    assert migrated_to_xla or reported, f"findings: {_show(run.findings['train.py'])}"


@BOTH
def test_packed_rnn_is_reported(migrated, target):
    run = migrated("29-packed-rnn-unreported", target)
    packed = [f for f in run.notes_at("train.py", (17, 19)) if "pack" in f.message.lower()]
    assert packed, f"findings: {_show(run.findings['train.py'])}"
    lengths_moved = "pl.MpDeviceLoader(loader" in run.code["train.py"]
    assert not lengths_moved or run.notes_at("train.py", (37, 39))


@BOTH
def test_hf_quantized_loading_and_device_map_are_reported(migrated, target):
    run = migrated("29-hf-from-pretrained-cuda-placement", target)
    near_load = run.notes_at("finetune.py", (15, 19, 20, 21, 23))
    assert [f for f in near_load if "load_in_8bit" in f.message], f"findings: {_show(run.findings['finetune.py'])}"
    assert [f for f in near_load if "device_map" in f.message], f"findings: {_show(run.findings['finetune.py'])}"
    mapped = [line for line in run.code["finetune.py"].splitlines() if line.strip().startswith("device_map = {")]
    assert mapped and not any("ordinal" in line for line in mapped), mapped


@BOTH
def test_mpi_rank_setup_is_reported(migrated, target):
    run = migrated("29-mpi-launcher-kept", target)
    reported = [f for f in run.notes_at("train.py", (12, 17, 21, 22)) if "MPI" in f.message or "mpiexec" in f.message]
    assert reported, f"findings: {_show(run.findings['train.py'])}"


@BOTH
def test_xm_save_in_a_helper_under_a_rank_test_is_reported(migrated, target):
    run = migrated("29-helper-xm-save-under-rank-test", target)
    reported = run.notes_at("train.py", (32, 34, 35), "XLA501") + run.notes_at("utils.py", (7,), "XLA501")
    assert reported, f"findings: {_show(run.findings['train.py'] + run.findings['utils.py'])}"


# Severity G (extra graphs or compilations per step) ----------------------------------------------------------


@BOTH
def test_random_crop_offsets_on_device_are_reported(migrated, target):
    run = migrated("30-host-random-crop-on-device", target)
    assert run.notes_at("train.py", (16, 17, 32), "XLA312"), f"findings: {_show(run.findings['train.py'])}"


@BOTH
def test_engine_process_function_gets_a_step_barrier(migrated, target):
    run = migrated("30-engine-process-function-no-barrier", target)
    code = run.code["train.py"]
    _, step = _function(code, "train_step")
    barrier = BARRIER[target] in step
    loader = re.search(r"trainer\.run\([^)\n]*MpDeviceLoader", code)
    reported = [f for f in run.notes_at("train.py", (10, 23, 32, 38)) if "ignite" in f.message]
    assert barrier or loader or reported, f"train_step today:\n{step}"


@BOTH
def test_reads_in_a_method_of_an_attribute_object_are_reported(migrated, target):
    run = migrated("30-reads-in-attribute-object-method-unreported", target)
    reported = run.notes_at("fp16_util.py", (25, 27), "XLA311") + run.notes_at("train.py", (25,), "XLA311")
    assert reported, f"findings: {_show(run.findings['train.py'] + run.findings['fp16_util.py'])}"


# Severity L (report, dead code) --------------------------------------------------------------------------------


@BOTH
def test_findings_stay_on_a_rerun_of_the_output(target):
    source = REVIEW / "33-findings-vanish-on-rerun" / "finetune.py"
    first = migrate(source.read_bytes(), target=target, path=str(source))
    again = migrate(first.output_bytes, target=target, path=str(source))
    assert first.ok and again.ok and not again.changed
    assert sorted(f.code for f in first.findings) == ["XLA312", "XLA601", "XLA602", "XLA603", "XLA604"]
    assert sorted(f.code for f in again.findings) == sorted(f.code for f in first.findings)


@BOTH
def test_test_assertions_are_kept_or_reported(migrated, target):
    run = migrated("33-test-assertion-removed", target)
    removed = [c for c in run.changes["test_train.py"] if c.message.startswith("removed assert")]
    assert not removed, f"assertions removed as changes: {_show(removed)}"
    assert "assert model.to.call_args.args[0] ==" in run.code["test_train.py"]


@BOTH
def test_torch_save_of_host_data_is_kept(migrated, target):
    code = migrated("29-xm-save-on-host-data", target).code["train.py"]
    assert "            torch.save(spec, path)\n" in code and "xm.save(spec" not in code


@BOTH
def test_no_dead_code_after_folds(migrated, target):
    code = migrated("33-dead-code-left", target).code["train.py"]
    assert not _if_false(code)
    assert "if args.compile:\n        pass" not in code
    assert 'if backend == "gloo":' not in code
    dev, text = _function(code, "dev")
    returns = [i for i, s in enumerate(dev.body) if isinstance(s, ast.Return)]
    assert returns and returns[0] == len(dev.body) - 1, f"statements after the first return:\n{text}"


@BOTH
def test_no_false_findings_on_cpu_map_location_or_annotations(migrated, target):
    run = migrated("33-false-findings-2", target)
    assert not run.notes_at("train.py", (49,), "XLA409"), _show(run.notes_at("train.py", (49,)))
    annotation = [f for f in run.notes_at("train.py", (25,)) if f.code in ("XLA202", "XLA900")]
    assert not annotation, _show(annotation)


@BOTH
def test_no_tensor_read_finding_on_an_int_in_a_numpy_array(migrated, target):
    """Shape (b) of the same class, not reproduced by the fixture (right today): `i in ret_samples_ids` (an
    enumerate int, a numpy array) is no tensor condition; the real `.cpu()` read on line 21 is reported."""
    run = migrated("33-false-findings-2", target)
    assert not run.notes_at("train.py", (20,), "XLA311")
    assert run.notes_at("train.py", (21,), "XLA311")
