"""Atcold/NYU-DLSP20 04-spiral_classification.ipynb: a notebook (run as its code cells), spiral data built element
by element on the device, full-batch training of a linear and an MLP model, `loss.item()` printed every step."""

from pathlib import Path

from _fakedata import image
from _recipe import Recipe, Substitution

NOTEBOOK = "04-spiral_classification.ipynb"

def data(root: Path) -> None:
    image(root / "res" / "ziegler.png", 256, seed=3)  # a colour map its plotting module reads (binary: not cached)


RECIPE = Recipe(
    name="atcold_spiral",
    repo="Atcold/NYU-DLSP20",
    entry=NOTEBOOK,
    style="notebook (course)",
    keep=(NOTEBOOK, "res"),
    # 100 points per class (not 1000), 30 steps per model (not 1000)
    substitutions=(Substitution(NOTEBOOK, "N = 1000", "N = 100"), Substitution(NOTEBOOK, "range(1000)", "range(30)", 2)),
    data=data,
    loss_regex=r"\[LOSS\]: ([-+\d.e]+|nan|inf)",
    timeout=300,
)
