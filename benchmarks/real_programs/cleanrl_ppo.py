"""vwxyzjn/cleanrl cleanrl/ppo.py: RL (PPO on CartPole, 4 vector envs), a rollout buffer on the device,
GAE, minibatch epochs with clipping; actions sampled on the device (Categorical), so the XLA run draws others."""

from _recipe import Recipe

RECIPE = Recipe(
    name="cleanrl_ppo",
    repo="vwxyzjn/cleanrl",
    entry="cleanrl/ppo.py",
    style="RL single-file script",
    keep=("cleanrl/ppo.py", "cleanrl_utils"),
    pythonpath=("",),
    # 4 iterations of 4 envs x 16 steps, 2 update epochs of 4 minibatches: 32 optimizer steps
    args=("--total-timesteps", "256", "--num-envs", "4", "--num-steps", "16", "--update-epochs", "2",
          "--num-minibatches", "4"),
    env={"REAL_PROGRAMS_SHOW_SCALARS": "1"},
    loss_regex=r"tensorboard losses/value_loss=([-+\d.e]+|nan|inf)",
    random="actions sampled on the device",
    timeout=300,
)
