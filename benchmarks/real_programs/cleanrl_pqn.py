"""vwxyzjn/cleanrl cleanrl/pqn.py: RL (parallel Q-learning on CartPole, 4 vector envs): epsilon-greedy actions
chosen with torch.where on the device from CPU-drawn random numbers, Q(lambda) returns over a rollout buffer,
minibatch epochs with gradient clipping, a learning-rate schedule."""

from _recipe import Recipe

RECIPE = Recipe(
    name="cleanrl_pqn",
    repo="vwxyzjn/cleanrl",
    entry="cleanrl/pqn.py",
    style="RL single-file script",
    keep=("cleanrl/pqn.py", "cleanrl_utils"),
    pythonpath=("",),
    # 4 iterations of 4 envs x 32 steps, 2 update epochs of 4 minibatches: 32 optimizer steps
    args=("--total-timesteps", "512", "--num-envs", "4", "--num-steps", "32", "--update-epochs", "2",
          "--num-minibatches", "4"),
    env={"REAL_PROGRAMS_SHOW_SCALARS": "1"},
    loss_regex=r"tensorboard losses/td_loss=([-+\d.e]+|nan|inf)",
    timeout=300,
)
