"""Proof tier, issue 28: collectives every replica must run in the same graph, in the xm form, two replicas.

- A collective in a logging branch after the optimizer step (``if step % 2 == 0: dist.all_reduce(total)``,
  then ``if rank == 0: print(total.item())``). Before: the step's barrier right after the update and nothing
  after the all-reduce, so rank 0's read ran it in a graph of its own on rank 0 alone, while rank 1 left it to
  its next step's graph (measured: replica 0 ran 2 graphs, replica 1 one, then ``rendezvous.cc: Termination
  timeout``). Now XLA302 adds a barrier right after it in the branch (step_end.collective_sites).
- ``dist.gather(t, losses, dst=0)`` with ``losses`` None off dst. Before: off dst the all-gather's result was
  dropped (``zip(losses or (), xm.all_gather(...))``), so that replica's graph lacked the collective dst's
  graph had (4 collectives against 3) and dst waited. Now XLA411 keeps it in a name on every replica and runs
  it at a barrier before dst copies (``pin_layout=False``: the pinned all-gather pads by the ordinal, and the
  replicas' graphs differ).

The migrated program runs with two replicas (PJRT CPU, ``CPU_NUM_DEVICES=2``, the step-marker shim of
docs/proof.md "Two replicas": torch_xla 2.9 only, the shim's turns do not hold on 2.6.1), with
``XLA_SAVE_TENSORS_FILE`` writing every graph each replica executes (one file per replica). Asserted: both
replicas run the same sequence of graphs that hold collectives, each with the same number of collectives, all
at barriers (none at a host read); dst's extra graphs (its copies) hold none; the values equal the original's
on plain torch with two gloo processes.
"""

from __future__ import annotations

import re
import tempfile
import textwrap
from pathlib import Path

import pytest
import xla_proof as xp

from xla_migrate import migrate

pytestmark = pytest.mark.xla

ORIGINAL = textwrap.dedent('''\
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    def main():
        dist.init_process_group("nccl")
        rank, world = dist.get_rank(), dist.get_world_size()
        generator = torch.Generator().manual_seed(0)
        model = torch.nn.Linear(4, 1)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator))
        model = DDP(model.cuda())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.Generator().manual_seed(1 + rank)
        for step in range(6):
            x = torch.randn(8, 4, generator=data).cuda()
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            print(f"replica {rank} step {step} loss {loss.item():.6f}\\n", end="", flush=True)
            if step % 2 == 0:
                total = loss.detach().clone()
                dist.all_reduce(total)
                if rank == 0:
                    print(f"step {step} reduced {total.item():.6f}\\n", end="", flush=True)
            if step % 3 == 0:
                # (tensors from the host: the same graph on both replicas, which the CPU shim needs)
                losses = [torch.full((1,), -1.0).cuda() for _ in range(world)] if rank == 0 else None
                dist.gather(loss.detach().reshape(1), losses, dst=0)
                if rank == 0:
                    for index, gathered in enumerate(losses):
                        print(f"step {step} gathered {index} {gathered.item():.6f}\\n", end="", flush=True)


    if __name__ == "__main__":
        main()
    ''')

_COLLECTIVE = re.compile(r"= [^=\n]*\b(?:all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)\(")


def _values(stdout: str) -> dict[str, float]:
    return {key: float(value) for key, value in re.findall(
        r"(replica \d+ step \d+ loss|step \d+ reduced|step \d+ gathered \d+) (-?\d+\.\d{6})", stdout)}


def _graphs(path: Path) -> list[tuple[str, int]]:
    """The graphs one replica executed, in order: (what ran it: ``sync`` at a barrier, else the script's line
    of the read), and how many collectives each holds."""
    found = []
    for chunk in path.read_text().split("[ScheduleSyncTensorsGraph]")[1:]:
        header, _, body = chunk.partition("## BEGIN_GRAPH")
        frames = re.findall(r"^\s+(\w+) \(([^)]*)\)", header, flags=re.MULTILINE)
        trigger = "sync" if any(name in ("sync", "mark_step") for name, _ in frames) else next(
            (where for _, where in frames if "script.py" in where), "?")
        found.append((trigger, len(_COLLECTIVE.findall(body.split("## END_GRAPH")[0]))))
    return found


def test_logging_and_gather_collectives_run_in_the_same_graphs_on_both_replicas():
    python = xp.require_env("current")
    result = migrate(ORIGINAL, target="2.9", data_parallel="xm")
    assert result.error is None
    lines = [line.strip() for line in result.code.splitlines()]
    reduce_at = lines.index('xm.all_reduce("sum", [total])')
    assert lines[reduce_at + 1] == "torch_xla.sync()", result.code  # the logging branch's barrier (XLA302)
    gather_at = next(i for i, line in enumerate(lines) if line.startswith("all_gathered = xm.all_gather("))
    assert lines[gather_at + 1] == "torch_xla.sync()", result.code  # XLA411's, before dst's copies
    dumps = Path(tempfile.mkdtemp(prefix="xla-proof-logging-graphs-"))
    xp.WORKDIRS.append(dumps)
    two = xp.run_script(python, result.code, "logging collectives x2", xla=True, timeout=240,
                        extra_env={"CPU_NUM_DEVICES": "2", "XLA_PROOF_SERIALIZE_STEPS": "1",
                                   "XLA_ENABLE_PARAM_ALIASING": "0", "XLA_SAVE_TENSORS_FILE": str(dumps / "graphs"),
                                   "XLA_SAVE_TENSORS_FMT": "hlo"})
    xp.RECORD.append(("current", "logging collectives (2 replicas)", two))
    assert two.returncode == 0, two.describe()
    replicas = [_graphs(dumps / f"graphs.{ordinal}") for ordinal in (0, 1)]
    with_collectives = [[graph for graph in graphs if graph[1]] for graphs in replicas]
    # 6 step graphs, 3 logging all-reduces, 2 gathers: the same on both replicas, every one at a barrier.
    assert with_collectives[0] == with_collectives[1], replicas
    assert len(with_collectives[0]) == 11 and all(trigger == "sync" for trigger, _ in with_collectives[0]), replicas
    assert len(replicas[1]) == 11, replicas  # off dst: nothing else ran
    assert len(replicas[0]) == 13, replicas  # dst: plus its copies, twice, in graphs with no collective
    migrated, original = _values(two.stdout), _values(xp.gloo_run(python, ORIGINAL, "logging"))
    assert len(original) == 12 + 3 + 4 and set(migrated) == set(original), (two.stdout, original)
    for key, value in original.items():
        assert abs(migrated[key] - value) <= 1e-4 * max(1.0, abs(value)), (key, migrated[key], value)
