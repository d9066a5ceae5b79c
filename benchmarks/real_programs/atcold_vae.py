"""Atcold/NYU-DLSP20 11-VAE.ipynb: a notebook (run as its code cells): a VAE on MNIST (reparameterisation noise
drawn on the device), `train_loss += loss.item()` per batch, test loss per epoch, t-SNE of the codes at the end."""

from pathlib import Path

from _fakedata import image, mnist_raw
from _recipe import Recipe, Substitution

NOTEBOOK = "11-VAE.ipynb"


def data(root: Path) -> None:
    mnist_raw(root / "data", train=1024, test=256)
    image(root / "res" / "ziegler.png", 256, seed=3)  # a colour map its plotting module reads (binary: not cached)


RECIPE = Recipe(
    name="atcold_vae",
    repo="Atcold/NYU-DLSP20",
    entry=NOTEBOOK,
    style="notebook (course), VAE",
    keep=(NOTEBOOK, "res"),
    # 3 epochs of 1024 images in batches of 256; its t-SNE section takes 200 test codes (not 1000)
    substitutions=(Substitution(NOTEBOOK, "epochs = 10", "epochs = 3"), Substitution(NOTEBOOK, "N = 1000", "N = 200"),
                   Substitution(NOTEBOOK, "epochs = (0, 5, 10)", "epochs = (0, 1, 3)")),
    data=data,
    loss_regex=r"loss: ([-+\d.e]+|nan|inf)",
    random="reparameterisation noise drawn on the device",
    timeout=300,
)
