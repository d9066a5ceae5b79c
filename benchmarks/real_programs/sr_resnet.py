"""sgrvinod/a-PyTorch-Tutorial-to-Super-Resolution train_srresnet.py: super-resolution (SRResNet), settings as
module constants, a JSON list of training images, random crops, the whole model and optimizer pickled each epoch."""

import json
from pathlib import Path

from _fakedata import flat_images
from _recipe import Recipe, Substitution

SCRIPT = "train_srresnet.py"


def data(root: Path) -> None:
    flat_images(root / "images", count=16, size=48, seed=4)
    (root / "train_images.json").write_text(json.dumps([f"images/img_{i:04d}.png" for i in range(16)]))


RECIPE = Recipe(
    name="sr_resnet",
    repo="sgrvinod/a-PyTorch-Tutorial-to-Super-Resolution",
    entry=SCRIPT,
    style="tutorial training script (module constants)",
    # 32-pixel crops, 2 residual blocks of 16 channels, batches of 4: 4 steps an epoch, 8 iterations -> 3 epochs
    substitutions=tuple(Substitution(SCRIPT, f"{name} = {old}", f"{name} = {new}") for name, old, new in (
        ("crop_size", "96", "32"), ("n_channels", "64", "16"), ("n_blocks", "16", "2"), ("batch_size", "16", "4"),
        ("iterations", "1e6", "8"), ("workers", "4", "0"), ("print_freq", "500", "1"))),
    data=data,
    loss_regex=r"Loss ([-+\d.e]+|nan|inf) \(",
    random="seeded by the suite (the same weights, shuffle order and crops); the float order of XLA's kernels differs",
    seed=0,
    timeout=300,
)
