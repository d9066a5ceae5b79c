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
    # 12 images of 16 pixels in batches of 4, 2 epochs: 6 steps, and 2 sampling loops of 19 denoising steps
    substitutions=(launch("epochs", "500", "2"), launch("batch_size", "12", "4"), launch("image_size", "64", "16"),
                   # the Windows dataset path becomes "data" (the rest of the line a comment)
                   Substitution("ddpm.py", 'args.dataset_path = r"', 'args.dataset_path = "data"  # '),
                   Substitution("ddpm.py", "Diffusion(img_size=args", "Diffusion(noise_steps=20, img_size=args"),
                   Substitution("utils.py", "Resize(80)", "Resize(20)"),
                   # the loss goes to tqdm's postfix (stderr) and a SummaryWriter: print it for the loss curve
                   Substitution("ddpm.py", "pbar.set_postfix(MSE=loss.item())", 'print(f"MSE {loss.item()}")'),
                   *(Substitution("modules.py", f"SelfAttention({old})", f"SelfAttention({new})", 2)
                     for old, new in ATTENTION)),
    # the original on CPU torch: its device strings (the migration sees "cuda")
    original_substitutions=(Substitution("ddpm.py", 'args.device = "cuda"', 'args.device = "cpu"'),
                            Substitution("modules.py", 'device="cuda"', 'device="cpu"', 2)),
    data=data,
    loss_regex=r"(?m)^MSE ([-+\d.e]+|nan|inf)$",
    random="unseeded: weight init, timesteps, noise and crops differ from run to run",
    timeout=400,
)
