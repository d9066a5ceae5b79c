"""Atcold/NYU-DLSP20 08-seq_classification.ipynb: a notebook: RNN and LSTM sequence classifiers on generated
sequences (batches padded to their longest sequence), train/test helpers that read `.item()` per batch.

Slow on XLA, kept so (issue 30): its evaluate_model reads the predictions one element at a time
(`y.item()` for each y of a device tensor): every index is a new graph, 32 compilations after warm-up. The
last model trains on the EASY sequences (9 steps, not MODERATE's 81): its unrolled LSTM's compilation alone
ran past the timeout on the loaded machine.
"""

from pathlib import Path

from _fakedata import image
from _recipe import Recipe, Substitution

NOTEBOOK = "08-seq_classification.ipynb"

def data(root: Path) -> None:
    image(root / "res" / "ziegler.png", 256, seed=3)  # a colour map its plotting module reads (binary: not cached)


RECIPE = Recipe(
    name="atcold_seq",
    repo="Atcold/NYU-DLSP20",
    entry=NOTEBOOK,
    style="notebook (course), RNN/LSTM",
    keep=(NOTEBOOK, "res"),
    # 128 sequences an epoch (not 1000), 2 epochs for the first two models and 1 for the others (not 10 / 100)
    substitutions=(Substitution(NOTEBOOK, "max_epochs  = 100", "max_epochs  = 1", 3),
                   Substitution(NOTEBOOK, "max_epochs  = 10", "max_epochs  = 2", 2),
                   Substitution("res/sequential_tasks.py", "1000. / self.batch_size", "128. / self.batch_size"),
                   Substitution(NOTEBOOK, "DifficultyLevel.MODERATE", "DifficultyLevel.EASY")),
    data=data,
    loss_regex=r"\] loss: ([-+\d.e]+|nan|inf)",
    random="unseeded sequence generator (NumPy) in the notebook's first models",
    timeout=400,
)
