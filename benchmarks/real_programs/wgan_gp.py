"""Zeleni9/pytorch-wgan main.py --model WGAN-GP: a GAN trained as its own loop object (critic updated 5 times per
generator update, gradient penalty through autograd.grad with create_graph, backward(mone) on the critic's real
score), a --cuda flag that moves the models with .cuda(index), a tensorflow summary logger (the suite's no-op
tensorflow stub), MNIST read from torch-saved processed/*.pt files."""

from _recipe import Recipe, Substitution

MODEL = "models/wgan_gradient_penalty.py"

# torchvision's old MNIST layout the program's own dataset class reads: (uint8 images, labels) saved by torch
DATA = """
import os, torch
g = torch.Generator().manual_seed(0)
os.makedirs('data/processed', exist_ok=True)
for name, n in (('training.pt', 64), ('test.pt', 16)):
    torch.save((torch.randint(0, 256, (n, 28, 28), dtype=torch.uint8, generator=g),
                torch.randint(0, 10, (n,), generator=g)), os.path.join('data/processed', name))
"""

RECIPE = Recipe(
    name="wgan_gp",
    repo="Zeleni9/pytorch-wgan",
    entry="main.py",
    style="GAN (WGAN-GP, critic loop, gradient penalty)",
    # 3 generator iterations of 2 critic steps each on batches of 8 (both constants of the model)
    args=("--model", "WGAN-GP", "--dataroot", "data", "--dataset", "mnist", "--batch_size", "8",
          "--generator_iters", "3", "--cuda", "True"),
    original_args=("--cuda", "False"),  # the last flag wins: the original stays on the CPU
    # the filters 1024/512/256 of both networks become 64/32/16 (comments included: the counts are exact)
    substitutions=(Substitution(MODEL, "1024", "64", 11), Substitution(MODEL, "512", "32", 10),
                   Substitution(MODEL, "256", "16", 10),
                   Substitution(MODEL, "self.batch_size = 64", "self.batch_size = 8"),
                   Substitution(MODEL, "self.critic_iter = 5", "self.critic_iter = 2"),
                   # check_args turns --is_train into a bool, which main compares with the string 'True': as
                   # published, main.py always evaluates (and loads a generator from the file "False")
                   Substitution("main.py", "if args.is_train == 'True':", "if args.is_train:")),
    data_script=DATA,
    loss_regex=r"(?:loss_real|g_loss): ([-+\d.e]+|nan|inf)",  # 0-dim tensors in f-strings: their value
    random="seeded by the suite (the same weights and shuffle order); noise drawn on the device differs",
    seed=0,
    timeout=400,
)
