"""Atcold/NYU-DLSP20 10-autoencoder.ipynb: a notebook: an under-complete, then a denoising autoencoder on MNIST
(noise masks drawn with torch on the device's tensors), `loss.item()` printed every epoch."""

from pathlib import Path

from _fakedata import image, mnist_raw
from _recipe import Recipe, Substitution

NOTEBOOK = "10-autoencoder.ipynb"


def data(root: Path) -> None:
    mnist_raw(root / "data", train=512, test=64)  # batches of 256: 2 steps an epoch
    image(root / "res" / "ziegler.png", 256, seed=3)


RECIPE = Recipe(
    name="atcold_autoencoder",
    repo="Atcold/NYU-DLSP20",
    entry=NOTEBOOK,
    style="notebook (course), autoencoder",
    keep=(NOTEBOOK, "res"),
    substitutions=(Substitution(NOTEBOOK, "num_epochs = 20", "num_epochs = 4"),),
    data=data,
    loss_regex=r"loss:([-+\d.e]+|nan|inf)",
    random="unseeded: weight init and shuffle order differ from run to run",
    timeout=300,
)
