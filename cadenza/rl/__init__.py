"""Token trajectories, rollouts, policy backends, GRPO and self-distillation losses, trainer, curriculum."""
