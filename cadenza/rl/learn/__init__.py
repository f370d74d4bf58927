"""From token trajectories to gradients: GRPO and self-distillation losses, chunked log-probs, the
teacher, one RL step, the hint-following probe and supervised fine-tuning."""
