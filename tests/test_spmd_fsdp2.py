"""FSDP2 ``fully_shard`` in the spmd form (XLA415, issue 31): the per-block calls and the root call become one
FSDPv2 wrap of the root; options FSDPv2 cannot honour are reported with their line; shapes it cannot read are
reported, not rewritten. The run on 4 devices is tests/xla/test_spmd_proof.py (fixtures/runnable/fsdp2_spmd.py)."""

from __future__ import annotations

from pathlib import Path

from xla_migrate import migrate

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "fixtures" / "XLA415"
WRAP = ('model = fsdpv2.SpmdFullyShardedDataParallel(model, mesh=xs.Mesh(np.arange(xr.global_runtime_device_count())'
        ', (xr.global_runtime_device_count(), 1), ("fsdp", "model")))')


def spmd(name: str):
    result = migrate((CASES / f"{name}.in.py").read_text(), target="2.9", data_parallel="spmd")
    assert result.error is None, result.error
    return result


def test_blocks_and_root_become_one_wrap_and_mixed_precision_is_reported_at_its_lines():
    result = spmd("fsdp2_mixed_precision")
    code = result.code
    assert code.count("SpmdFullyShardedDataParallel(") == 1 and WRAP in code
    assert "fully_shard" not in code.replace("spmd_fully_sharded", "")
    # The loop that only wrapped each block goes; the model's own loop (in forward) stays.
    assert "for block in model.blocks" not in code and "for block in self.blocks" in code
    # The CUDA mesh and the policy were read only by the dropped options: they go with them.
    assert "init_device_mesh" not in code and "MixedPrecisionPolicy" not in code
    findings = [f for f in result.findings if f.code == "XLA415"]
    assert [f.line for f in findings] == [26, 28], findings
    assert all("mp_policy=policy dropped in the FSDPv2 wrap" in f.message and "autocast" in f.fix
               for f in findings)
    assert not [f for f in result.findings if f.code == "XLA900"]  # no "cuda" left behind


def test_a_second_model_or_a_call_inside_an_expression_is_reported_not_rewritten():
    result = spmd("fsdp2_two_roots")
    findings = [f for f in result.findings if f.code == "XLA415"]
    assert [f.line for f in findings] == [10, 11, 12]
    assert all(f.fix.startswith("not converted (the fully_shard calls are not per-block calls") for f in findings)
    assert result.code.count("fully_shard(") == 3 and "SpmdFullyShardedDataParallel" not in result.code


def test_the_other_forms_say_to_use_spmd():
    for form in ("xm", "ddp"):
        result = migrate((CASES / "fsdp2_mixed_precision.in.py").read_text(), target="2.9", data_parallel=form)
        findings = [f for f in result.findings if f.code == "XLA415"]
        assert [f.line for f in findings] == [26, 27, 28], form
        assert all(f.fix.startswith("migrate with --data-parallel spmd") for f in findings), form
        assert "SpmdFullyShardedDataParallel" not in result.code


def test_the_fsdpv2_output_is_stable():
    first = spmd("fsdp2_mixed_precision")
    again = migrate(first.code, target="2.9", data_parallel="spmd")
    assert again.error is None and again.code == first.code, again.diff
