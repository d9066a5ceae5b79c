"""The defect classes of the expert review's ninth round (the team's real-programs suite, session 16: cleanrl's
dqn, c51, ppo and pqn, mrdbourke's computer-vision notebook, SupContrast, the DDPM tutorial, llama2.c under
torchrun, Atcold's sequence notebook and others), one test per new class on the self-written fixtures in
``fixtures/review/<issue>-<class>/`` (their READMEs say what is wrong today, what was measured, and what right
looks like).

Same contract as tests/test_review_classes.py (whose helpers this module reuses): each test asserts the RIGHT
behaviour; a class the tool still gets wrong is marked ``known_defect(issue, what)``, a strict xfail that only an
AssertionError satisfies. When one XPASSes, check the output against its README and delete the mark.
"""

from __future__ import annotations

import ast
import json

import pytest

from test_review_classes import BOTH, REVIEW, _show, _tree_run, known_defect, migrated  # noqa: F401
from xla_migrate import migrate


def _calls(code: str, *suffixes: str) -> list[ast.Call]:
    return [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call)
            and any(ast.unparse(n.func).endswith(s) for s in suffixes)]


def _mentions(notes, *words: str) -> list:
    return [n for n in notes if any(w in n.message for w in words)]


# Severity C (a crash the original did not have) ---------------------------------------------------------------


@pytest.mark.parametrize("target", ["sagemaker"])
def test_sagemaker_autocast_is_not_entered_on_a_cpu_xla_device(migrated, target):
    run = migrated("29-xla-amp-autocast-on-xla-cpu-device", target)
    code = run.code["train.py"]
    guarded = "xla_device_hw" in code
    reported = _mentions(run.findings["train.py"], "autocast")
    assert not _calls(code, "xla_amp.autocast") or guarded or reported, \
        f"{code}\nfindings: {_show(run.findings['train.py'])}"


@pytest.mark.parametrize("target", ["sagemaker"])
def test_sagemaker_autocast_dtype_is_kept_and_its_tpu_behaviour_said(migrated, target):
    # The sagemaker target is SageMaker Training Compiler's hardware, XLA:GPU (the seeds set GPU_NUM_DEVICES),
    # where torch_xla's autocast runs float16 as CUDA did: the script's dtype stays. On a TPU torch_xla (up to
    # 2.6) turns a float16 autocast off with a warning: the change's message says so and names --target 2.9.
    run = migrated("29-xla-amp-autocast-on-xla-cpu-device", target)
    code = run.code["train.py"]
    dtypes = [ast.unparse(k.value) for c in _calls(code, "xla_amp.autocast") for k in c.keywords if k.arg == "dtype"]
    assert dtypes == ["ptdtype"], code
    notes = [c.message for c in run.changes["train.py"] if c.code == "XLA201" and "xla_amp.autocast" in c.message]
    assert notes and all("on a TPU" in m and "--target 2.9" in m for m in notes), notes


@pytest.mark.parametrize("target", ["2.9"])
def test_2_9_autocast_runs_on_any_xla_device(migrated, target):
    # The control: torch.autocast("xla", ...) names no device and maps float16 to bfloat16.
    code = migrated("29-xla-amp-autocast-on-xla-cpu-device", target).code["train.py"]
    calls = _calls(code, "torch.autocast")
    assert calls and "bfloat16" in ast.unparse(calls[0]) and not _calls(code, "xla_amp.autocast"), code


# Severity G (extra graph executions / host reads per step) -----------------------------------------------------


def _module_level_cache_calls(code: str) -> list[str]:
    """initialize_cache calls that run whenever the module is imported (not under `if __name__ ...`)."""
    return [ast.unparse(s) for s in ast.parse(code).body if isinstance(s, ast.Expr)
            and isinstance(s.value, ast.Call) and ast.unparse(s.value.func).endswith("initialize_cache")]


def test_imported_entry_script_gets_the_compile_cache(tmp_path):
    run = _tree_run(REVIEW / "29-compile-cache-skipped-for-imported-entry", "2.9", tmp_path)
    code = run.code["train_ce.py"]
    assert _calls(code, "initialize_cache") and not _module_level_cache_calls(code), \
        f"train_ce.py:\n{code}\nchanges: {_show(run.changes['train_ce.py'])}"


def test_entry_nobody_imports_gets_the_compile_cache(tmp_path):
    # The control: the sibling entry that no module imports gets the cache (XLA315), as every entry should.
    run = _tree_run(REVIEW / "29-compile-cache-skipped-for-imported-entry", "2.9", tmp_path)
    assert _calls(run.code["train_linear.py"], "initialize_cache"), run.code["train_linear.py"]


@BOTH
def test_distribution_validation_reads_are_removed_or_reported(migrated, target):
    run = migrated("30-distribution-validate-args-host-reads", target)
    code = run.code["train.py"]
    disabled = "set_default_validate_args(False)" in code or "validate_args=False" in code
    reported = _mentions(run.findings["train.py"], "validate_args", "Categorical")
    assert disabled or reported, f"findings: {_show(run.findings['train.py'])}"


@BOTH
def test_distribution_fixture_gets_the_step_recipe(migrated, target):
    # The control: the update itself is migrated (xm.optimizer_step), the policy is on the XLA device.
    code = migrated("30-distribution-validate-args-host-reads", target).code["train.py"]
    assert _calls(code, "xm.optimizer_step") and "cuda" not in code.split("def main")[1], code


@BOTH
def test_rollout_loop_read_is_reported(migrated, target):
    run = migrated("30-rollout-loop-reads-unreported", target)
    notes = [n for n in run.findings["train.py"] if n.code == "XLA311" and n.line == 29]
    assert notes, f"findings: {_show(run.findings['train.py'])}"


ONE_LOOP = '''
import torch
from torch import nn


def main(env):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    actor = nn.Linear(4, 2).to(device)
    optimizer = torch.optim.Adam(actor.parameters(), lr=1e-3)
    obs = env.reset()
    for step in range(100):
        action = actor(torch.tensor(obs).to(device)).argmax(dim=1)
        obs, reward = env.step(action.cpu().numpy())
        loss = -actor(torch.tensor(obs).to(device)).log_softmax(-1)[:, 1].mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''


@BOTH
def test_read_in_the_training_loop_itself_is_reported(target):
    # The control: the same read in the loop that also updates (cleanrl's dqn/c51 shape) gets XLA311 today.
    result = migrate(ONE_LOOP, target=target, path="train.py")
    assert [f for f in result.findings if f.code == "XLA311" and f.line == 13], result.findings


def _notebook_findings(run) -> list:
    return [n for rel, notes in run.findings.items() for n in notes if n.code == "XLA311"]


@pytest.mark.parametrize("target", ["2.9", "sagemaker"])
def test_helper_read_called_from_a_notebook_is_reported(target, tmp_path):
    run = _tree_run(REVIEW / "30-notebook-imported-helper-reads-unreported", target, tmp_path)
    notes = [n for n in _notebook_findings(run) if "accuracy_fn" in n.message or ".item()" in n.message]
    assert notes, f"findings: { {rel: _show(notes) for rel, notes in run.findings.items()} }"


@pytest.mark.parametrize("target", ["2.9", "sagemaker"])
def test_helper_passed_as_an_argument_is_reported(target, tmp_path):
    # Found by the lead in the real-programs rerun: mrdbourke_cv still reads at helper_functions.py:109 with no
    # finding after the notebook fix, because its train_step receives accuracy_fn as a parameter.
    run = _tree_run(REVIEW / "30-helper-passed-as-argument-reads-unreported", target, tmp_path)
    assert [n for n in run.findings["train.py"] if n.code == "XLA311" and n.line == 14 and "metrics.py:5" in n.message], \
        _show(run.findings["train.py"])


_LOCAL_HELPER_PASSED = """\
import torch
from torch import nn


def accuracy(y_true, y_pred):
    return torch.eq(y_true, y_pred).sum().item() / len(y_pred)


def train_step(model, loader, optimizer, metric, device):
    seen = []
    for X, y in loader:
        X, y = X.to(device), y.to(device)
        y_pred = model(X)
        loss = nn.functional.cross_entropy(y_pred, y)
        seen.append(metric(y, y_pred.argmax(dim=1)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return seen


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Linear(8, 3).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = [(torch.randn(4, 8), torch.randint(0, 3, (4,)))]
    train_step(model, loader, optimizer, accuracy, device)
"""


@BOTH
def test_helper_of_the_module_passed_under_another_name_is_followed(target):
    # The same shape within one file, the parameter named apart from the function (metric=accuracy, by position):
    # the step model resolves the call to ``accuracy`` and its read is the step's: reported at the read, through
    # the call of the parameter (before: no finding, the step's graph cut at every batch unnoticed).
    result = migrate(_LOCAL_HELPER_PASSED, target=target)
    assert [n for n in result.findings if n.code == "XLA311" and n.line == 6 and "metric(...)" in n.message], \
        _show(result.findings)


@pytest.mark.parametrize("target", ["2.9", "sagemaker"])
def test_helper_read_called_from_a_script_is_reported(target, tmp_path):
    # The control: the notebook's cells as one script beside the same helper module: XLA311 names accuracy_fn.
    fixture = REVIEW / "30-notebook-imported-helper-reads-unreported"
    folder = tmp_path / "as-script"
    folder.mkdir()
    (folder / "metrics.py").write_text((fixture / "metrics.py").read_text())
    cells = json.loads((fixture / "train.ipynb").read_text())["cells"]
    (folder / "train.py").write_text("\n\n\n".join("".join(c["source"]) for c in cells) + "\n")
    run = _tree_run(folder, target, tmp_path / "work")
    assert [n for n in run.findings["train.py"] if n.code == "XLA311" and "accuracy_fn" in n.message], \
        _show(run.findings["train.py"])


@BOTH
def test_offset_slice_in_a_helper_is_reported(migrated, target):
    run = migrated("30-loop-offset-slice-in-helper-unreported", target)
    notes = [n for rel, notes in run.findings.items() for n in notes if n.code == "XLA312" and "offset" in n.message]
    assert notes, f"findings: { {rel: _show(notes) for rel, notes in run.findings.items()} }"


INLINE_WINDOWS = '''
import torch
from torch import nn


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_data = torch.randint(0, 100, (8, 250)).to(device)
    model = nn.Sequential(nn.Embedding(100, 16), nn.Linear(16, 100)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for i in range(0, train_data.size(1) - 1, 20):
        data, targets = train_data[:, i:i + 20], train_data[:, i + 1:i + 21]
        loss = nn.functional.cross_entropy(model(data).reshape(-1, 100), targets.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''


@BOTH
def test_offset_slice_inline_is_reported(target):
    # The control: the same windows sliced inline in the loop get XLA312 today.
    result = migrate(INLINE_WINDOWS, target=target, path="train.py")
    assert [f for f in result.findings if f.code == "XLA312" and f.line == 12], result.findings


# Severity R (a finding that is wrong) --------------------------------------------------------------------------


@BOTH
def test_no_stale_optimizer_finding_when_the_caller_moved_first(migrated, target):
    run = migrated("29-optimizer-move-finding-when-caller-moved-first", target)
    false = run.notes_at("engine.py", (20,), "XLA107")
    assert not false, f"findings: {_show(false)}"


@BOTH
def test_stale_optimizer_finding_when_the_caller_did_not_move(target, tmp_path):
    # The control: the caller builds the optimizer on an unmoved model: XLA107 at the move is right.
    fixture = REVIEW / "29-optimizer-move-finding-when-caller-moved-first"
    folder = tmp_path / "unmoved"
    folder.mkdir()
    (folder / "engine.py").write_text((fixture / "engine.py").read_text())
    source = (fixture / "train.py").read_text()
    assert "nn.Linear(16, 3)).to(device)" in source
    (folder / "train.py").write_text(source.replace("nn.Linear(16, 3)).to(device)", "nn.Linear(16, 3))"))
    run = _tree_run(folder, target, tmp_path / "work")
    assert run.notes_at("engine.py", (20,), "XLA107"), _show(run.findings["engine.py"])
