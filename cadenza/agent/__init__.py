"""Agent tools, episodes, trajectories and hardened grading."""
