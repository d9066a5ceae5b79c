"""dome272/Diffusion-Models-pytorch ddpm.py: an unconditional DDPM (UNet with self-attention and sinusoidal time
embedding, random timesteps and noise per step, MSE on the noise), settings assigned to an argparse namespace in
launch(), an ImageFolder of images, the full reverse-diffusion sampling loop after every epoch, a device string
"cuda" and a UNet whose device="cuda" default the time embedding uses."""

from pathlib import Path

from _fakedata import image_folder
from _recipe import Recipe, Substitution


def data(root: Path) -> None:
    image_folder(root / "data", classes=1, per_class=12, size=24)


def launch(name: str, old: str, new: str) -> Substitution:
    return Substitution("ddpm.py", f"args.{name} = {old}", f"args.{name} = {new}")


# the attention blocks' spatial sizes follow the image: 64 -> 16 divides each by 4
ATTENTION = (("128, 32", "128, 8"), ("256, 16", "256, 4"), ("256, 8", "256, 2"), ("128, 16", "128, 4"),
             ("64, 32", "64, 8"), ("64, 64", "64, 16"))

RECIPE = Recipe(
    name="ddpm",
    repo="dome272/Diffusion-Models-pytorch",
    entry="ddpm.py",
    style="diffusion (DDPM, UNet, sampling loop)",
    # 12 images of 16 pixels in batches of 4, 2 epochs: 6 steps, and 2 sampling loops of 9 denoising steps
    substitutions=(launch("epochs", "500", "2"), launch("batch_size", "12", "4"), launch("image_size", "64", "16"),
                   # the Windows dataset path becomes "data" (the rest of the line a comment)
                   Substitution("ddpm.py", 'args.dataset_path = r"', 'args.dataset_path = "data"  # '),
                   Substitution("ddpm.py", "Diffusion(img_size=args", "Diffusion(noise_steps=10, img_size=args"),
                   Substitution("utils.py", "Resize(80)", "Resize(20)"),
                   # seeded, so both runs start from the same weights and crops (unseeded, two runs of the
                   # original alone differed by a tenth: the suite's and verify's comparisons then disagreed)
                   Substitution("ddpm.py", "setup_logging(args.run_name)",
                                "setup_logging(args.run_name); torch.manual_seed(0)"),
                   *(Substitution("modules.py", f"SelfAttention({old})", f"SelfAttention({new})", 2)
                     for old, new in ATTENTION),
                   # the widths 64..512 of both U-Nets become 16..128, smallest first (so no number is changed
                   # twice); at full width the XLA run had not finished compiling its first step in 400 s
                   *(Substitution("modules.py", pattern.format(old), pattern.format(new), count)
                     for old, new, counts in (("64", "16", (8, 7)), ("128", "32", (8, 4)), ("256", "64", (10, 6)),
                                              ("512", "128", (6, 4)))
                     for pattern, count in zip(("({},", ", {})"), counts))),
    # the loss goes to tqdm's postfix (stderr) and TensorBoard: the suite's writer prints its scalars
    env={"REAL_PROGRAMS_SHOW_SCALARS": "1"},
    # the original on CPU torch: its device strings (the migration sees "cuda")
    original_substitutions=(Substitution("ddpm.py", 'args.device = "cuda"', 'args.device = "cpu"'),
                            Substitution("modules.py", 'device="cuda"', 'device="cpu"', 2)),
    data=data,
    loss_regex=r"tensorboard MSE=([-+\d.e]+|nan|inf) step",
    random="seeded by the recipe (the same weights and crops); timesteps and noise drawn on the device differ",
    timeout=400,
)
