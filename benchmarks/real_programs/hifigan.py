"""jik876/hifi-gan train.py: a GAN vocoder (generator of transposed convolutions and residual blocks against a
multi-period and a multi-scale discriminator, feature-matching and mel-spectrogram L1 losses, two AdamW and two
ExponentialLR), a JSON config, wavs listed in a training file, mel spectrograms through torch.stft on the device,
checkpoints every N steps that a second run resumes from (the newest g_/do_ pair in the checkpoint folder), and
mp.spawn/DDP for more than one GPU (not taken here). librosa is the suite's stand-in (its mel filters)."""

import json
from pathlib import Path

from _fakedata import wav
from _recipe import Recipe, Resume, Substitution

SEGMENT = 1024  # samples per training clip: 4 mel frames at hop 256


def data(root: Path) -> None:
    # clips exactly one segment long: the random crop start is then always 0 (the program's unseeded random)
    for i in range(8):
        wav(root / "wavs" / f"w{i}.wav", 0, rate=22050, seed=i, samples=SEGMENT)
    (root / "training.txt").write_text("".join(f"w{i}|text\n" for i in range(6)))
    (root / "validation.txt").write_text("w6|text\n")


CONFIG = {
    "resblock": "1", "num_gpus": 0, "batch_size": 2, "learning_rate": 0.0002, "adam_b1": 0.8, "adam_b2": 0.99,
    "lr_decay": 0.999, "seed": 1234, "upsample_rates": [8, 8, 2, 2], "upsample_kernel_sizes": [16, 16, 4, 4],
    "upsample_initial_channel": 32, "resblock_kernel_sizes": [3], "resblock_dilation_sizes": [[1, 3, 5]],
    "segment_size": SEGMENT, "num_mels": 80, "num_freq": 1025, "n_fft": 1024, "hop_size": 256, "win_size": 1024,
    "sampling_rate": 22050, "fmin": 0, "fmax": 8000, "fmax_for_loss": None, "num_workers": 0,
    "dist_config": {"dist_backend": "nccl", "dist_url": "tcp://localhost:54321", "world_size": 1}}

COMMON = ("--config", "tiny.json", "--input_wavs_dir", "wavs", "--input_training_file", "training.txt",
          "--input_validation_file", "validation.txt", "--checkpoint_path", "cp", "--stdout_interval", "1",
          "--checkpoint_interval", "3")

RECIPE = Recipe(
    name="hifigan",
    repo="jik876/hifi-gan",
    entry="train.py",
    style="speech (GAN vocoder, checkpoint resume)",
    # 6 clips in batches of 2: 3 steps an epoch, 2 epochs; a checkpoint at step 3
    args=(*COMMON, "--training_epochs", "2"),
    files={"tiny.json": json.dumps(CONFIG, indent=1)},
    substitutions=(
        # the discriminators' widths 1024/512/256/128 become 64/32/32/16 (all of them are the discriminators'):
        # at full width the first step's backward alone ran past 2 minutes on the shared CPU
        *(Substitution("models.py", old, new, count) for old, new, count in
          (("1024", "64", 10), ("512", "32", 4), ("256", "32", 2), ("128", "16", 6))),
        # torch 2 wants return_complex for a real input; False keeps the (..., 2) layout the program reads
        Substitution("meldataset.py", "normalized=False, onesided=True)",
                     "normalized=False, onesided=True, return_complex=False)"),
        # the validation pass at step 0 (its condition's "and steps != 0" is commented out upstream) plots
        # a torch tensor with matplotlib, whose unit lookup recurses without end on it in the suite's matplotlib
        Substitution("train.py", "== 0:  # and steps != 0:", "== 0 and steps != 0:")),
    original_substitutions=(Substitution("train.py", "torch.device('cuda:{:d}'.format(rank))",
                                         "torch.device('cpu')"),),
    data=data,
    loss_regex=r"Gen Loss Total : ([-+\d.e]+|nan|inf)",
    # resumes from the step-3 checkpoint (epoch 1) and trains epochs 2 and 3: steps 4 to 9
    resume=Resume(args=(*COMMON, "--training_epochs", "3")),
    timeout=400,
)
