"""Atcold/NYU-DLSP20 06-convnet.ipynb: a notebook: a fully connected and a convolutional network on MNIST, each
one epoch, then both again on pixel-permuted images (an index gather on the device), printed train/test losses."""

from pathlib import Path

from _fakedata import image, mnist_raw
from _recipe import Recipe

NOTEBOOK = "06-convnet.ipynb"


def data(root: Path) -> None:
    mnist_raw(root / "data", train=320, test=64)  # batches of 64: 5 steps per model and epoch
    image(root / "res" / "ziegler.png", 256, seed=3)  # a colour map its plotting module reads (binary: not cached)


RECIPE = Recipe(
    name="atcold_convnet",
    repo="Atcold/NYU-DLSP20",
    entry=NOTEBOOK,
    style="notebook (course), CNN",
    keep=(NOTEBOOK, "res"),
    data=data,
    loss_regex=r"\tLoss: ([-+\d.e]+|nan|inf)|Average loss: ([-+\d.e]+)",
    random="seeded by the suite (the same weights and shuffle order); the float order of XLA's kernels differs",
    seed=0,
    timeout=400,
)
