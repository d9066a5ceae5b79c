"""Atcold/NYU-DLSP20 05-regression.ipynb: a notebook: full-batch regression on data made on the CPU and moved,
then an ensemble of networks trained one after the other in a loop (a new model and optimizer each time)."""

from pathlib import Path

from _fakedata import image
from _recipe import Recipe, Substitution

NOTEBOOK = "05-regression.ipynb"


def data(root: Path) -> None:
    image(root / "res" / "ziegler.png", 256, seed=3)  # a colour map its plotting module reads (binary: not cached)


RECIPE = Recipe(
    name="atcold_regression",
    repo="Atcold/NYU-DLSP20",
    entry=NOTEBOOK,
    style="notebook (course), regression ensemble",
    keep=(NOTEBOOK, "res"),
    # 20 steps per model (not 1000), an ensemble of 2 (not 10)
    substitutions=(Substitution(NOTEBOOK, "range(1000)", "range(20)", 2),
                   Substitution(NOTEBOOK, "n_networks = 10", "n_networks = 2")),
    data=data,
    loss_regex=r"\[LOSS[^\]]*\]: ([-+\d.e]+|nan|inf)",
    timeout=300,
)
