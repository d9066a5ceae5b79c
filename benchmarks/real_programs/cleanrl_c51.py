"""vwxyzjn/cleanrl cleanrl/c51.py: RL (categorical DQN on CartPole): a distributional Q-network whose projection
of the target distribution uses index arithmetic and index_add on the device; exploration from Python's RNG."""

from _recipe import Recipe

RECIPE = Recipe(
    name="cleanrl_c51",
    repo="vwxyzjn/cleanrl",
    entry="cleanrl/c51.py",
    style="RL single-file script",
    keep=("cleanrl/c51.py", "cleanrl_utils"),
    pythonpath=("",),
    args=("--total-timesteps", "1000", "--learning-starts", "100", "--train-frequency", "10", "--batch-size", "32",
          "--target-network-frequency", "100"),
    env={"REAL_PROGRAMS_SHOW_SCALARS": "1"},
    loss_regex=r"tensorboard losses/loss=([-+\d.e]+|nan|inf)",
    timeout=300,
)
