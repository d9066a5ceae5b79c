"""karpathy/llama2.c train.py as torchrun starts it: a data-parallel run (DDP, process group, rank-offset seed,
gradient accumulation divided by the world size, no_sync on the micro-steps but the last), world size 1.

The variables are torchrun's (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT, TORCHELASTIC_RUN_ID), so the
original takes its DDP branch and verify's replica probe counts the output's run as data-parallel: every
optimizer update must step gradients reduced once. The tiny run is fp32 (no autocast), so both targets run
and the losses compare value by value.

What world size 1 cannot show (seen by hand at 8cf4ba6, torchrun --nproc_per_node=2 on the outputs): the xm
form (auto's choice on sagemaker, and on 2.9 before auto learned module-level torchrun scripts) keeps no
process group, so under torchrun each process has
xr.world_size() == 1: both are master, both print and save, and the all-reduce reduces nothing across them;
the ddp form's output trains as one (one printer, DDP's reduction on the xla group).
"""

from _recipe import Recipe, Substitution
from llama2c import TINY, data

TORCHRUN = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "{port}", "TORCHELASTIC_RUN_ID": "real-programs"}

RECIPE = Recipe(
    name="llama2c_ddp",
    repo="karpathy/llama2.c",
    entry="train.py",
    style="LLM pre-training, DDP under torchrun",
    args=(*TINY, "--dtype=float32", "--max_iters=10", "--eval_interval=5"),
    env=TORCHRUN,
    # The original on CPU torch: the gloo group for nccl, the CPU for its cuda:{local_rank} device, and DDP
    # without device ids (a CPU module takes none).
    original_substitutions=(Substitution("train.py", 'backend="nccl"', 'backend="gloo"'),
                            Substitution("train.py", 'f"cuda:{ddp_local_rank}"', '"cpu"'),
                            Substitution("train.py", "torch.cuda.set_device", "torch.set_default_device"),
                            Substitution("train.py", "device_ids=[ddp_local_rank]", "device_ids=None")),
    data=data,
    loss_regex=r"(?m)^\d+ \| loss (\S+) \|",
    forms=(("2.9", "xm"),),  # auto chooses ddp on 2.9 (module-level torchrun) and xm on sagemaker; 2.9's xm beside it
    notes="under torchrun with 2 processes the xm form's output runs as 2 unreduced world-size-1 processes",
)
