"""locuslab/TCN adding_problem/add_test.py: a temporal convolutional network on synthetic sequences made in the
script; the whole dataset lives on the device and batches are sliced with Python offsets.

Slow on XLA, kept so (issue 30): its weight_norm convolutions fall back to the CPU
(aten::_weight_norm_interface and its backward), which cuts each step into several graphs, and each graph is
compiled anew at every step, one batch offset after another. The tiny run is one epoch of 6 steps, one level.
"""

from _recipe import Recipe, Substitution

RECIPE = Recipe(
    name="tcn_adding",
    repo="locuslab/TCN",
    entry="TCN/adding_problem/add_test.py",
    style="sequence model (TCN), data on the device",
    keep=("TCN",),
    cwd="TCN/adding_problem",  # it imports its package through sys.path.append("../../")
    # 192 training sequences (not 50000) of length 50, batches of 32: 6 steps, 1 epoch
    # its data generator draws from NumPy's unseeded global generator: seeded (both sides), so the runs
    # compare value by value
    substitutions=(Substitution("TCN/adding_problem/add_test.py", "50000", "192"),
                   Substitution("TCN/adding_problem/utils.py", "import numpy as np",
                                "import numpy as np; np.random.seed(0)"),
                   Substitution("TCN/adding_problem/add_test.py", "(1000,", "(64,")),
    args=("--epochs", "1", "--seq_len", "50", "--levels", "1", "--nhid", "8", "--ksize", "3", "--log-interval", "2"),
    original_args=("--cuda",),  # a store_false flag: the original's default is CUDA, with no CPU fallback
    timeout=300,
)
