"""locuslab/TCN mnist_pixel/pmnist_test.py: sequential (pixel-by-pixel) MNIST with a TCN, torchvision's MNIST
from ./data/mnist, dropout 0.05 (so the XLA run draws other masks)."""

from pathlib import Path

from _fakedata import mnist_raw
from _recipe import Recipe


def data(root: Path) -> None:
    mnist_raw(root / "TCN" / "mnist_pixel" / "data" / "mnist", train=128, test=32)


RECIPE = Recipe(
    name="tcn_pmnist",
    repo="locuslab/TCN",
    entry="TCN/mnist_pixel/pmnist_test.py",
    style="sequence model (TCN), torchvision MNIST",
    keep=("TCN",),
    cwd="TCN/mnist_pixel",
    data=data,
    # 128 images of 784 steps in batches of 32: 4 steps an epoch, 2 epochs; a small network
    args=("--epochs", "2", "--batch_size", "32", "--levels", "2", "--nhid", "8", "--ksize", "3", "--log-interval", "1"),
    original_args=("--cuda",),
    loss_regex=r"\tLoss: ([-+\d.e]+|nan|inf)",
    random="dropout 0.05 on the device",
    timeout=300,
)
