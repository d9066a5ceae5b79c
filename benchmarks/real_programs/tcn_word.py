"""locuslab/TCN word_cnn/word_cnn_test.py: a word-level language model (TCN) on a Penn-Treebank-style corpus
kept on the device and sliced with Python offsets (get_batch), dropout, tied embeddings, SGD with clipping,
validation each epoch.

Slow on XLA, kept so (issue 30): weight_norm falls back to the CPU, and each batch offset (and the shorter
last batch) compiles the step's graphs anew. The tiny run is one epoch of about 5 steps, one level.
"""

from pathlib import Path

from _fakedata import text_file
from _recipe import Recipe


def data(root: Path) -> None:
    base = root / "TCN" / "word_cnn" / "data" / "penn"
    text_file(base / "train.txt", 60, seed=1)
    text_file(base / "valid.txt", 20, seed=2)
    text_file(base / "test.txt", 20, seed=3)


RECIPE = Recipe(
    name="tcn_word",
    repo="locuslab/TCN",
    entry="TCN/word_cnn/word_cnn_test.py",
    style="word language model (TCN), corpus on the device",
    keep=("TCN",),
    cwd="TCN/word_cnn",
    data=data,
    args=("--epochs", "1", "--batch_size", "8", "--emsize", "16", "--nhid", "16", "--levels", "1", "--seq_len", "20",
          "--validseqlen", "10", "--log-interval", "2"),
    original_args=("--cuda",),
    env={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"},  # it reloads its pickled best model (torch >= 2.6 refuses)
    loss_regex=r"\| loss\s+([-+\d.e]+)|valid loss\s+([-+\d.e]+)",
    random="dropout on the device",
    timeout=300,
)
