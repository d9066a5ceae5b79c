"""mrdbourke/pytorch-deep-learning 03_pytorch_computer_vision.ipynb: a notebook: FashionMNIST (torchvision),
three models (linear, non-linear, TinyVGG) trained by train_step/test_step helpers that accumulate `.item()`
per batch, then predictions, torchmetrics' confusion matrix and a saved model."""

from pathlib import Path

from _fakedata import mnist_raw
from _recipe import Recipe, Substitution

NOTEBOOK = "03_pytorch_computer_vision.ipynb"


def data(root: Path) -> None:
    mnist_raw(root / "data", train=96, test=32)


RECIPE = Recipe(
    name="mrdbourke_cv",
    repo="mrdbourke/pytorch-deep-learning",
    entry=NOTEBOOK,
    style="notebook (course), image classification",
    keep=(NOTEBOOK, "helper_functions.py"),
    # the course's cell that shows an error on purpose ("This will error due to `eval_model()` not using device
    # agnostic code": on CUDA, and so on XLA, though not on the CPU the original runs on) is skipped in both
    # runs; the next cells mend eval_model and call it again
    substitutions=(Substitution(NOTEBOOK, 'eval_model(model=model_1, \\n",', 'None and eval_model(model=model_1, \\n",'),),
    data=data,  # 96 images in batches of 32: 3 steps an epoch, 3 epochs per model (its own settings)
    loss_regex=r"Train loss: ([-+\d.e]+|nan|inf)",
    timeout=400,
)
