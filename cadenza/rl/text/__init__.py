"""Token trajectories and chat rendering: the format rollouts write and the learner reads."""
