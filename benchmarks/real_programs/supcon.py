"""HobbitLong/SupContrast main_supcon.py: supervised contrastive learning, two random crops per image
(TwoCropTransform), a ResNet-18 encoder with a projection head, SupConLoss, a custom ImageFolder dataset."""

from pathlib import Path

from _fakedata import image_folder
from _recipe import Recipe


def data(root: Path) -> None:
    image_folder(root / "data" / "train", classes=4, per_class=16, size=32)


RECIPE = Recipe(
    name="supcon",
    repo="HobbitLong/SupContrast",
    entry="main_supcon.py",
    style="contrastive learning research script",
    data=data,
    # 64 images in batches of 16: 4 steps an epoch, 2 epochs
    args=("--dataset", "path", "--data_folder", "./data/train", "--mean", "(0.5, 0.5, 0.5)", "--std",
          "(0.25, 0.25, 0.25)", "--size", "32", "--model", "resnet18", "--batch_size", "16", "--epochs", "2",
          "--num_workers", "0", "--print_freq", "1", "--learning_rate", "0.05"),
    loss_regex=r"loss ([-+\d.e]+) \(",
    random="seeded by the suite (the same weights and crops); the float order of XLA's kernels differs",
    seed=0,
    timeout=400,
)
