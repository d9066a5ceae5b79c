"""milesial/Pytorch-UNet train.py: segmentation, image/mask folders, RMSprop, ReduceLROnPlateau on a Dice
evaluation every few steps, GradScaler(enabled=--amp), losses reported through wandb (the suite's stand-in prints
them)."""

from pathlib import Path

from _fakedata import image, mask_png
from _recipe import Recipe, Substitution


def data(root: Path) -> None:
    for i in range(10):
        image(root / "data" / "imgs" / f"{i:03d}.png", 64, seed=i)
        mask_png(root / "data" / "masks" / f"{i:03d}_mask.png", 64, 64, seed=i)


RECIPE = Recipe(
    name="unet",
    repo="milesial/Pytorch-UNet",
    entry="train.py",
    style="segmentation script",
    # 8 training images in batches of 2, 3 epochs: 12 steps. The evaluation round (every n_train // (5 * batch)
    # steps) is not reached: its per-parameter isinf/isnan tests and .cpu() copies (wandb histograms) compile about
    # 100 small graphs on XLA, minutes on two shared cores.
    args=("--epochs", "3", "--batch-size", "2", "--scale", "0.5", "--validation", "20", "--learning-rate", "1e-4"),
    # the network's widths 64..1024 become 6..96 (compiling the full UNet on the XLA CPU backend takes minutes)
    substitutions=tuple(Substitution("unet/unet_model.py", old, new, count) for old, new, count in
                        (("64", "6", 4), ("128", "12", 4), ("256", "24", 4), ("512", "48", 4), ("1024", "96", 2))),
    data=data,
    loss_regex=r"'train loss': ([-+\d.e]+|nan|inf)",
    random="seeded by the suite (the same weights and shuffle order); the float order of XLA's kernels differs",
    seed=0,
)
