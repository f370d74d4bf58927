"""The trainer composing rollout, engines and learn: builders, the learner's update, rollout workers
(local, processes, Ray), data parallelism, checkpoints and the demo."""
