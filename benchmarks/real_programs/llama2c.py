"""karpathy/llama2.c train.py: LLM pre-training, configurator flags, pretokenized uint16 shards, DDP-ready."""

from pathlib import Path

from _fakedata import token_shards
from _recipe import Recipe, Resume

VOCAB = 64
TINY = ("--compile=False", "--batch_size=4", "--max_seq_len=32", "--vocab_source=custom", f"--vocab_size={VOCAB}",
        "--dim=32", "--n_layers=2", "--n_heads=2", "--n_kv_heads=2", "--multiple_of=8",
        "--gradient_accumulation_steps=2", "--eval_iters=2", "--warmup_iters=2")


def data(root: Path) -> None:
    # shard 0 is the validation split, the others train
    token_shards(root / "data" / f"tok{VOCAB}", shards=3, tokens=4096, vocab=VOCAB, seed=1)


RECIPE = Recipe(
    name="llama2c",
    repo="karpathy/llama2.c",
    entry="train.py",
    style="LLM pre-training script",
    args=(*TINY, "--max_iters=12", "--eval_interval=6", "--always_save_checkpoint=True"),
    original_args=("--device=cpu",),  # its default device is "cuda", with no CPU fallback
    data=data,
    loss_regex=r"(?m)^\d+ \| loss (\S+) \|",
    resume=Resume(args=(*TINY, "--max_iters=16", "--eval_interval=6", "--init_from=resume")),
    amp=True,  # bf16 autocast on the accelerator (its default dtype); the CPU original runs fp32
    notes="the tiny run keeps the default dtype, so the XLA run trains under bf16 autocast",
)
