"""dome272/Diffusion-Models-pytorch ddpm.py: an unconditional DDPM (a U-Net with self-attention at 64x64),
ImageFolder data at the Windows path the script hard-codes, noise and timesteps drawn every step, tqdm
progress with the MSE as its postfix, tensorboard scalars, then a sampling loop (one U-Net call per noise step)
and a checkpoint at each epoch's end."""

from pathlib import Path

from _fakedata import image_folder
from _recipe import Recipe, Substitution

FOLDER = r"C:\Users\dome\datasets\landscape_img_folder"  # on Linux one relative folder name, as the script reads it


def data(root: Path) -> None:
    image_folder(root / FOLDER, classes=2, per_class=6, size=80, ext="jpg", seed=5)


RECIPE = Recipe(
    name="ddpm",
    repo="dome272/Diffusion-Models-pytorch",
    entry="ddpm.py",
    style="diffusion (DDPM, U-Net), image folder",
    keep=("ddpm.py", "modules.py", "utils.py"),
    # 1 epoch of 12 images in batches of 2 (6 steps), 20 noise steps (not 1000: the sampling loop runs each)
    substitutions=(Substitution("ddpm.py", "args.epochs = 500", "args.epochs = 1"),
                   Substitution("ddpm.py", "args.batch_size = 12", "args.batch_size = 2"),
                   Substitution("ddpm.py", "noise_steps=1000", "noise_steps=20"),
                   # the MSE postfix on stdout, where the losses are read
                   Substitution("ddpm.py", "tqdm(dataloader)", "tqdm(dataloader, file=os.sys.stdout)")),
    # the original's device is hard-coded "cuda" (the script's and the U-Net's default), with no CPU fallback
    original_substitutions=(Substitution("ddpm.py", 'args.device = "cuda"', 'args.device = "cpu"'),
                            Substitution("modules.py", 'time_dim=256, device="cuda"', 'time_dim=256, device="cpu"')),
    env={"TQDM_MININTERVAL": "0", "TQDM_MINITERS": "1"},  # every step's postfix printed, however fast
    data=data,
    loss_regex=r"MSE=([-+\d.e]+|nan|inf)",
    random="noise, timesteps, crops and shuffling drawn on each side's own generator",
    timeout=400,
)
