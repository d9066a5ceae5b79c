"""locuslab/TCN copy_memory/copymem_test.py: the copy-memory task (synthetic, made in the script), RMSprop,
gradient clipping, accuracy from a per-batch argmax; data on the device, sliced with Python offsets.

Slow on XLA, kept so (issue 30): as tcn_adding, weight_norm falls back to the CPU and every graph of the step
is compiled anew at each batch offset. The tiny run is one epoch of 6 steps, one level.
"""

from _recipe import Recipe, Substitution

RECIPE = Recipe(
    name="tcn_copymem",
    repo="locuslab/TCN",
    entry="TCN/copy_memory/copymem_test.py",
    style="sequence model (TCN), data on the device",
    keep=("TCN",),
    cwd="TCN/copy_memory",
    # its data generator draws from NumPy's unseeded global generator: seeded (both sides), so the runs
    # compare value by value
    substitutions=(Substitution("TCN/copy_memory/copymem_test.py", "n_train = 10000", "n_train = 192"),
                   Substitution("TCN/copy_memory/utils.py", "import numpy as np",
                                "import numpy as np; np.random.seed(0)"),
                   Substitution("TCN/copy_memory/copymem_test.py", "n_test = 1000", "n_test = 32")),
    args=("--epochs", "1", "--blank_len", "20", "--levels", "1", "--nhid", "8", "--ksize", "3", "--log-interval", "2"),
    original_args=("--cuda",),
    timeout=300,
)
