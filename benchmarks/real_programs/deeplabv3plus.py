"""VainF/DeepLabV3Plus-Pytorch main.py: semantic segmentation (DeepLabV3+ on a MobileNetV2 backbone, ASPP),
Pascal VOC's folder layout, paired image/mask augmentations with seeded Python/NumPy/torch randomness, DataLoader
workers, nn.DataParallel, SGD with two parameter groups and a poly schedule, a validation pass with a streaming
confusion matrix (NumPy) that saves latest/best checkpoints, and --ckpt --continue_training to resume."""

from pathlib import Path

from _fakedata import image, mask_png
from _recipe import Recipe, Resume, Substitution

VOC = Path("data") / "VOCdevkit" / "VOC2012"


def data(root: Path) -> None:
    names = [f"2007_{i:06d}" for i in range(10)]
    for i, name in enumerate(names):
        # PNG bytes under the .jpg name the dataset reads (PIL goes by the content); masks of classes 0 and 7
        image(root / VOC / "JPEGImages" / f"{name}.jpg", (56, 48), seed=i)
        mask_png(root / VOC / "SegmentationClass" / f"{name}.png", 56, 48, seed=i, values=(0, 7))
    splits = root / VOC / "ImageSets" / "Segmentation"
    splits.mkdir(parents=True, exist_ok=True)
    (splits / "train.txt").write_text("\n".join(names[:8]) + "\n")
    (splits / "val.txt").write_text(names[8] + "\n")


COMMON = ("--data_root", "data", "--dataset", "voc", "--model", "deeplabv3plus_mobilenet", "--crop_size", "48",
          "--batch_size", "2", "--lr", "0.01", "--val_interval", "3", "--gpu_id", "0", "--random_seed", "1")

RECIPE = Recipe(
    name="deeplabv3plus",
    repo="VainF/DeepLabV3Plus-Pytorch",
    entry="main.py",
    style="segmentation research script (checkpoint resume)",
    # 8 images in batches of 2: 4 steps an epoch; 6 steps, a validation round and a checkpoint every 3
    args=(*COMMON, "--total_itrs", "6"),
    substitutions=(
        # no ImageNet weights for the backbone (a download)
        Substitution("network/modeling.py", "pretrained_backbone=True", "pretrained_backbone=False", 10),
        # the loss is printed as a 10-step mean: print every step (the value printed stays loss / 10)
        Substitution("main.py", "if (cur_itrs) % 10 == 0:", "if (cur_itrs) % 1 == 0:"),
        # the checkpoint holds NumPy scalars (best_score), which torch >= 2.6's weights-only load refuses
        Substitution("main.py", "map_location=torch.device('cpu'))",
                     "map_location=torch.device('cpu'), weights_only=False)")),
    data=data,
    loss_regex=r"Loss=([-+\d.e]+|nan|inf)",
    random="dropout: the ASPP head's masks come from another generator on XLA (the seeded init and data match)",
    # resumes from the step-6 checkpoint (latest_*.pth) and trains steps 7 to 9
    resume=Resume(args=(*COMMON, "--total_itrs", "9", "--continue_training",
                        "--ckpt", "checkpoints/latest_deeplabv3plus_mobilenet_voc_os16.pth")),
    timeout=600,  # each graph took about a minute to compile under load 20: 3 training and 1 validation graph
)
