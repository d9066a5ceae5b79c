"""mrdbourke/pytorch-deep-learning going_modular: train.py + engine.py (train_step/test_step/train) +
data_setup.py (ImageFolder loaders) + model_builder.py (TinyVGG) + utils.py (save_model): a modular course
project; epoch results printed by engine.train."""

from pathlib import Path

from _fakedata import image_folder
from _recipe import Recipe

HERE = "going_modular/going_modular"


def data(root: Path) -> None:
    base = root / HERE / "data" / "pizza_steak_sushi"
    image_folder(base / "train", classes=3, per_class=16, size=64, ext="jpg", seed=1)
    image_folder(base / "test", classes=3, per_class=4, size=64, ext="jpg", seed=2)


RECIPE = Recipe(
    name="going_modular",
    repo="mrdbourke/pytorch-deep-learning",
    entry=f"{HERE}/train.py",
    style="modular course project (train/engine/data_setup/model_builder/utils)",
    keep=(HERE,),
    cwd=HERE,
    data=data,  # 48 training images in batches of 32 (a last batch of 16), 5 epochs (its constants)
    loss_regex=r"train_loss: ([-+\d.e]+|nan|inf)",
    random="seeded by the suite (the same weights and shuffle order); the float order of XLA's kernels differs",
    seed=0,
    timeout=300,
)
