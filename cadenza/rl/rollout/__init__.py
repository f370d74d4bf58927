"""From tasks to scored episodes: environments, task sets, curriculum, the agent loop over token
trajectories, monitor verdicts, the engine router and the asynchronous rollout pipeline."""
