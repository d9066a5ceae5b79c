"""locuslab/TCN adding_problem/add_test.py: a temporal convolutional network on synthetic sequences made in the
script; the whole dataset lives on the device and batches are sliced with Python offsets."""

from _recipe import Recipe, Substitution

RECIPE = Recipe(
    name="tcn_adding",
    repo="locuslab/TCN",
    entry="TCN/adding_problem/add_test.py",
    style="sequence model (TCN), data on the device",
    keep=("TCN",),
    cwd="TCN/adding_problem",  # it imports its package through sys.path.append("../../")
    # 640 training sequences (not 50000) of length 50, batches of 32: 20 steps an epoch, 2 epochs
    substitutions=(Substitution("TCN/adding_problem/add_test.py", "50000", "640"),
                   Substitution("TCN/adding_problem/add_test.py", "(1000,", "(64,")),
    args=("--epochs", "2", "--seq_len", "50", "--levels", "3", "--nhid", "8", "--ksize", "3", "--log-interval", "2"),
    original_args=("--cuda",),  # a store_false flag: the original's default is CUDA, with no CPU fallback
    timeout=300,
)
