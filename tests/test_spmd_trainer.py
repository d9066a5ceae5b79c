"""The spmd form of a Hugging Face Trainer with torch FSDP options (issue 31, XLA606): the Trainer's own XLA
FSDPv2 settings, ``average_tokens_across_devices=False`` (its per-step gather is an extra graph execution per
step under SPMD), GPT-2's output the Trainer's FSDPv2 cannot shard, no ``_mp_fn`` (XLA602) in one process per
host. The run on 4 devices is tests/xla/test_spmd_trainer_proof.py's."""

from __future__ import annotations

import textwrap
from pathlib import Path

from xla_migrate import migrate

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = textwrap.dedent("""\
    from transformers import Trainer, TrainingArguments


    def main():
        args = TrainingArguments(output_dir="out", fsdp="full_shard", {extra})
        Trainer(model=None, args=args).train()


    if __name__ == "__main__":
        main()
    """)


def _spmd(extra: str):
    return migrate(SCRIPT.replace("{extra}", extra), target="2.9", data_parallel="spmd")


def test_the_trainer_gets_fsdpv2_and_no_token_gather_and_no_mp_fn():
    result = _spmd('fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}')
    assert ('fsdp="full_shard", average_tokens_across_devices=False, fsdp_config={"transformer_layer_cls_to_wrap": '
            '["LlamaDecoderLayer"], "xla": True, "xla_fsdp_v2": True}') in result.code, result.code
    assert "_mp_fn" not in result.code
    assert [f.code for f in result.findings if f.code in ("XLA606", "XLA602")] == []
    assert migrate(result.code, target="2.9", data_parallel="spmd").code == result.code  # idempotent


def test_a_token_average_the_script_sets_is_kept():
    result = _spmd('average_tokens_across_devices=True, fsdp_config={"xla": True, "xla_fsdp_v2": True}')
    assert result.code.count("average_tokens_across_devices") == 1
    assert "average_tokens_across_devices=True" in result.code


def test_gpt2_blocks_are_reported():
    result = _spmd('fsdp_config={"transformer_layer_cls_to_wrap": ["GPT2Block"]}')
    messages = [f.message for f in result.findings if f.code == "XLA606"]
    assert len(messages) == 1 and "CausalLMOutputWithCrossAttentions" in messages[0], messages


def test_the_runnable_trainer_fixture_migrates_with_only_the_loader_advice():
    path = ROOT / "fixtures" / "runnable" / "trainer_fsdp_spmd.py"
    result = migrate(path.read_text(), target="2.9", data_parallel="spmd", path=str(path))
    assert {f.code for f in result.findings} <= {"XLA604"}, [f.message for f in result.findings]
    assert "average_tokens_across_devices=False" in result.code and "xr.use_spmd()" in result.code


def test_the_other_forms_keep_their_mp_fn():
    result = migrate(SCRIPT.replace("{extra}", ""), target="2.9")
    assert "def _mp_fn(index):" in result.code
