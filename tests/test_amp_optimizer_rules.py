"""Edge cases of the AMP and optimizer rules (XLA201-XLA204) that the golden fixtures do not show."""

from __future__ import annotations

from xla_migrate import migrate

AMP_LOOP = """import torch

scaler = torch.cuda.amp.GradScaler()


def step(model, optimizer, x):
    with torch.cuda.amp.autocast():
        loss = model(x)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return scaler.get_scale()
"""


def test_get_scale_is_a_finding_with_its_line_on_2_9():
    result = migrate(AMP_LOOP, target="2.9", select=["XLA202"])
    assert [(f.code, f.line) for f in result.findings] == [("XLA202", 12)]
    assert "scaler.get_scale()" in result.findings[0].message
    # The scaler is still read after the step: removing it would be a NameError, so it stays, disabled.
    assert 'scaler = torch.amp.GradScaler("xla", enabled=False)' in result.code
    assert "loss.backward()" in result.code and "xm.optimizer_step(optimizer)" in result.code


def test_sagemaker_keeps_the_loop_and_reports_nothing():
    result = migrate(AMP_LOOP, target="sagemaker", select=["XLA202"])
    assert result.findings == []
    assert "scaler = xla_amp.GradScaler()" in result.code
    assert "scaler.scale(loss).backward()" in result.code


def test_seeds_output_is_xla_code_that_the_2_9_target_leaves_and_reports():
    seeds = migrate(AMP_LOOP, target="sagemaker", select=["XLA2"]).code
    current = migrate(seeds, target="2.9", select=["XLA2", "XLA9"])
    assert current.code == seeds  # code that runs on XLA is not migrated a second time
    (finding,) = current.findings
    assert finding.code == "XLA904" and "torch_xla.amp.GradScaler, removed in 2.9" in finding.message


def test_all_amp_rules_together_make_no_overlapping_edits_and_are_idempotent():
    for target in ("sagemaker", "2.9"):
        result = migrate(AMP_LOOP, target=target, select=["XLA1", "XLA2"])
        assert not [f for f in result.findings if "overlaps" in f.message]
        again = migrate(result.code, target=target, select=["XLA1", "XLA2"])
        assert again.code == result.code and again.changes == []


def test_float16_becoming_bfloat16_is_said_in_the_change():
    result = migrate(AMP_LOOP, target="2.9", select=["XLA201"])
    (change,) = result.changes
    assert "float16 -> bfloat16" in change.message
    assert 'torch.autocast("xla", dtype=torch.bfloat16)' in result.code


def test_select_and_ignore():
    only_autocast = migrate(AMP_LOOP, target="2.9", select=["XLA201"])
    assert {c.code for c in only_autocast.changes} == {"XLA201"}
    assert "torch.cuda.amp.GradScaler()" in only_autocast.code
    without_scaler_rule = migrate(AMP_LOOP, target="2.9", select=["XLA2"], ignore=["XLA202"])
    assert "XLA202" not in {c.code for c in without_scaler_rule.changes}
    assert "scaler.step(optimizer)" in without_scaler_rule.code


def test_scaled_loss_expression_gets_parentheses():
    source = AMP_LOOP.replace("scaler.scale(loss).backward()", "scaler.scale(loss / 4).backward()")
    result = migrate(source, target="2.9", select=["XLA202"])
    assert "    (loss / 4).backward()\n" in result.code


def test_scaler_used_elsewhere_stays_disabled_and_reported():
    source = "import torch\nscaler = torch.cuda.amp.GradScaler()\nif scaler.is_enabled(): print('amp')\n"
    result = migrate(source, target="2.9", select=["XLA202"])
    assert [(f.line, f.code) for f in result.findings] == [(3, "XLA202")]
    assert result.code.startswith('import torch\nscaler = torch.amp.GradScaler("xla", enabled=False)\n')


def test_scaler_read_nowhere_else_is_removed():
    source = "import torch\nscaler = torch.cuda.amp.GradScaler()\nscaler.scale(loss).backward()\nscaler.step(opt)\n"
    result = migrate(source, target="2.9", select=["XLA202"])
    assert "GradScaler" not in result.code and result.findings == []


def test_syncfree_needs_amp():
    source = "import torch\nopt = torch.optim.Adam(params)\n"
    assert migrate(source, select=["XLA203"]).code == source
    amp = source + "ctx = torch.autocast('cuda')\n"
    assert "syncfree.Adam(params)" in migrate(amp, select=["XLA203"]).code


def test_optimizer_step_leaves_schedulers_scalers_and_unknown_objects():
    source = ("import torch\n\ndef f(model, optimizer, scheduler, scaler, env):\n"
              "    optimizer.step()\n    scheduler.step()\n    scaler.step(optimizer)\n    env.step(1)\n")
    result = migrate(source, select=["XLA204"])
    assert [c.line for c in result.changes] == [4]
    assert "    xm.optimizer_step(optimizer)\n    scheduler.step()\n    scaler.step(optimizer)\n" in result.code


def test_optimizer_parameter_name_counts_only_in_its_function():
    # (The comment makes it a torch script: a file that never mentions torch is left as it is.)
    source = "def f(opt):\n    opt.step()\n\n\ndef g():\n    opt = parse()\n    opt.step()  # torch\n"
    result = migrate(source, select=["XLA204"])
    assert [c.line for c in result.changes] == [2]
