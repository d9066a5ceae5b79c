"""vwxyzjn/cleanrl cleanrl/dqn.py: RL (DQN on CartPole), tyro flags, a replay buffer, a target network, epsilon
-greedy exploration from Python's seeded RNG; the TD loss goes to TensorBoard (the suite's dashboard prints it)."""

from _recipe import Recipe

RECIPE = Recipe(
    name="cleanrl_dqn",
    repo="vwxyzjn/cleanrl",
    entry="cleanrl/dqn.py",
    style="RL single-file script",
    keep=("cleanrl/dqn.py", "cleanrl_utils"),
    pythonpath=("",),  # installed as a package: cleanrl_utils imports from the repository root
    # 900 learning steps would be slow: train every 10 env steps from step 100, TD loss logged every 100 steps
    args=("--total-timesteps", "1000", "--learning-starts", "100", "--train-frequency", "10", "--batch-size", "32",
          "--target-network-frequency", "100"),
    env={"REAL_PROGRAMS_SHOW_SCALARS": "1"},
    loss_regex=r"tensorboard losses/td_loss=([-+\d.e]+|nan|inf)",
    timeout=300,
)
