"""Reward-hacking detectors over trajectories."""
