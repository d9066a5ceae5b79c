"""verify --devices: the step graph's all-gathers read from the compiled HLO dump (xla_migrate.verify.spmd_graphs);
the run on 4 devices is tests/xla/test_verify_devices.py's."""

from __future__ import annotations

from xla_migrate.verify import spmd_graphs

STEP = """HloModule SyncTensorsGraph.134
ENTRY %main {
  %bitcast.2 = f32[3,24]{1,0} bitcast(%p0)
  %all-gather = f32[12,24]{0,1} all-gather(%bitcast.2), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={1}
  %all-gather-start.1 = (f32[6], f32[24]) all-gather-start(%p1), dimensions={0}
  %all-reduce = f32[24]{0} all-reduce(%p2), to_apply=%add
  %x = f32[1] add(%p3, %p3)
}
"""
SAVE = "HloModule SyncTensorsGraph.33\n  %all-gather = f32[2]{0} all-gather(%p0), dimensions={0}\n"


def test_the_largest_graph_is_the_step_and_its_all_gathers_are_counted(tmp_path):
    (tmp_path / "module_0002.SyncTensorsGraph.134.cpu_after_optimizations.txt").write_text(STEP)
    (tmp_path / "module_0004.SyncTensorsGraph.33.cpu_after_optimizations.txt").write_text(SAVE)
    (tmp_path / "module_0002.SyncTensorsGraph.134.cpu_after_optimizations-buffer-assignment.txt").write_text(STEP * 3)
    assert spmd_graphs.all_gathers(tmp_path) == {"per_step": 2, "shapes": ["f32[12,24]", "(f32[6], f32[24])"]}


def test_nothing_dumped_is_none_and_the_flags_keep_the_users(tmp_path):
    assert spmd_graphs.all_gathers(tmp_path) is None
    flags = spmd_graphs.dump_flags(tmp_path, "--xla_cpu_use_thunk_runtime=false")
    assert flags.startswith("--xla_cpu_use_thunk_runtime=false --xla_dump_to=") and "--xla_dump_hlo_as_text" in flags
