"""The spmd form's FSDP state-dict and optimizer-state APIs (issue 31, XLA416): the plain APIs of the FSDPv2
model's module and of the optimizer; goldens in fixtures/XLA416, the save-then-load run on 4 devices in
tests/xla/test_spmd_checkpoint_proof.py."""

from __future__ import annotations

from pathlib import Path

from xla_migrate import migrate

ROOT = Path(__file__).resolve().parent.parent
FSDP1 = (ROOT / "fixtures" / "XLA416" / "fsdp1_full_state_dict.in.py").read_text()
FSDP2 = (ROOT / "fixtures" / "XLA416" / "fsdp2_dcp_state_dict.in.py").read_text()


def test_full_state_dicts_become_the_plain_apis_and_a_load_before_the_wrap_is_kept():
    result = migrate(FSDP1, target="2.9", data_parallel="spmd")
    assert "state_dict_type(model, StateDictType.FULL_STATE_DICT" not in result.code
    assert "    state = model.module.state_dict()\n" in result.code  # out of the with, one level up
    assert "optim_state = optimizer.state_dict()" in result.code
    assert 'model.load_state_dict(torch.load("pretrained.pt"' in result.code  # before the wrap: the module itself
    assert [f.code for f in result.findings if f.code == "XLA416"] == ["XLA416"]  # the sharded state-dict type
    assert migrate(result.code, target="2.9", data_parallel="spmd").code == result.code  # idempotent


def test_dcp_state_dict_apis_and_a_save_without_planner():
    result = migrate(FSDP2, target="2.9", data_parallel="spmd")
    for gone in ("get_model_state_dict(", "get_optimizer_state_dict(", "set_model_state_dict(",
                 "set_optimizer_state_dict("):
        assert gone not in result.code.split("\n\n\n", 1)[1], gone
    assert 'model.module.load_state_dict(checkpoint["model"])' in result.code
    assert 'optimizer.load_state_dict(checkpoint["optim"])' in result.code
    messages = [f.message + f.fix for f in result.findings if f.code == "XLA416"]
    assert len(messages) == 1 and "SPMDSavePlanner" in messages[0], messages


def test_the_other_forms_leave_the_state_apis_to_xla415s_finding():
    for form in ("ddp", "xm"):
        result = migrate(FSDP2, target="2.9", data_parallel=form)
        assert "get_model_state_dict(model, options=options)" in result.code
        assert not [f for f in result.findings if f.code == "XLA416"]
