"""facebookresearch/barlowtwins main.py: self-supervised learning, data-parallel by torch.multiprocessing.spawn
over torch.cuda.device_count() processes (DistributedDataParallel, a nccl group, SyncBatchNorm, an all_reduce of
the cross-correlation matrix inside the loss), a LARS optimizer of its own, GradScaler/autocast, two augmented
views per image (PIL blur and solarization drawn from Python's random), a per-step LR schedule, JSON stats, and a
checkpoint.pth per epoch that the next start resumes from by itself."""

from pathlib import Path

from _fakedata import image_folder
from _recipe import Recipe, Resume, Substitution


def data(root: Path) -> None:
    image_folder(root / "data" / "train", classes=2, per_class=16, size=40)


COMMON = ("data", "--workers", "0", "--batch-size", "8", "--projector", "64-64-64", "--print-freq", "1",
          "--checkpoint-dir", "ckpt")

RECIPE = Recipe(
    name="barlowtwins",
    repo="facebookresearch/barlowtwins",
    entry="main.py",
    style="self-supervised, DDP by mp.spawn (SyncBatchNorm, all_reduce in the loss, resume)",
    # 32 images in batches of 8: 4 steps an epoch, 2 epochs, a checkpoint after each
    args=(*COMMON, "--epochs", "2"),
    substitutions=(Substitution("main.py", "RandomResizedCrop(224", "RandomResizedCrop(32", 2),
                   # seeded, so both runs start from the same weights and draw the same crops (unseeded, the
                   # first losses differed by a third before any update: two programs, not one migrated)
                   Substitution("main.py", "args.rank += gpu", "args.rank += gpu; torch.manual_seed(0); random.seed(0)"),
                   # ResNet-18 for ResNet-50 (its 512 features feed the projector)
                   Substitution("main.py", "torchvision.models.resnet50(", "torchvision.models.resnet18("),
                   Substitution("main.py", "sizes = [2048]", "sizes = [512]")),
    # The original on CPU torch: one spawned process on the gloo group, on the CPU; SyncBatchNorm refuses CPU
    # tensors once a group exists, so it stays BatchNorm (the same numbers at world size 1).
    original_substitutions=(
        Substitution("main.py", "= torch.cuda.device_count()", "= 1"),  # the processes spawned
        Substitution("main.py", "backend='nccl'", "backend='gloo'"),
        Substitution("main.py", "torch.cuda.set_device(gpu)", "pass"),
        Substitution("main.py", ".cuda(gpu)", ".to('cpu')"),
        Substitution("main.py", ".cuda(gpu, non_blocking=True)", ".to('cpu', non_blocking=True)", 2),
        Substitution("main.py", "device_ids=[gpu]", "device_ids=None"),
        Substitution("main.py", "nn.SyncBatchNorm.convert_sync_batchnorm", "(lambda module: module)")),
    data=data,
    loss_regex=r'"loss": ([-+\d.e]+|NaN|Infinity)',
    random="seeded by the recipe (torch and Python's random in main_worker): the same weights and augmentations",
    amp=True,  # autocast/GradScaler unconditionally (disabled, with a warning, on the CPU original)
    # resumes from the epoch-2 checkpoint.pth and trains epoch 3
    resume=Resume(args=(*COMMON, "--epochs", "3")),
    timeout=400,
)
