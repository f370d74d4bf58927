"""The trainer composing rollout, engines and learn: builders, the learner's update, rollout workers
(local, processes, Ray), data parallelism, the policy sharded on the dual mesh (:mod:`.sharding`),
checkpoints and the demo."""
