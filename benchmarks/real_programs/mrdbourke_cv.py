"""mrdbourke/pytorch-deep-learning 03_pytorch_computer_vision.ipynb: a notebook: FashionMNIST (torchvision),
three models (linear, non-linear, TinyVGG) trained by train_step/test_step helpers that accumulate `.item()`
per batch, then predictions, torchmetrics' confusion matrix and a saved model."""

from pathlib import Path

from _fakedata import mnist_raw
from _recipe import Recipe

NOTEBOOK = "03_pytorch_computer_vision.ipynb"


def data(root: Path) -> None:
    mnist_raw(root / "data", train=96, test=32)


RECIPE = Recipe(
    name="mrdbourke_cv",
    repo="mrdbourke/pytorch-deep-learning",
    entry=NOTEBOOK,
    style="notebook (course), image classification",
    keep=(NOTEBOOK, "helper_functions.py"),
    data=data,  # 96 images in batches of 32: 3 steps an epoch, 3 epochs per model (its own settings)
    loss_regex=r"Train loss: ([-+\d.e]+|nan|inf)",
    timeout=400,
)
