"""Reinforcement learning for coding agents, laid out by the data flow (import modules directly; this
package imports nothing heavy):

* ``config``: the trainer's TOML sections (``TrainConfig``); ``models``: the offline SmolLM2 checkpoint.
* ``text``: ``TokenTrajectory`` (exact ids, loss mask, segments, behaviour log-probs), ``collate``; the
  chat template with tool calls, ``train_tokenizer``, ``parse_tool_calls``.
* ``engines``: the ``Policy`` protocol and ``HFPolicy``, the ``RolloutEngine`` seam and its ``hf``,
  ``vllm`` and ``openai`` engines, weight transfer.
* ``rollout``: tasks to scored episodes: environment sources, task sets, curriculum, the agent loop
  (``loop.rollout``), monitor verdicts, the engine router, the asynchronous rollout pipeline.
* ``learn``: GRPO and self-distillation losses, chunked log-probs, the teacher, ``step.rl_losses``, the
  hint-following probe, supervised fine-tuning.
* ``train``: the ``Trainer`` composing them: builders, the learner's update, rollout workers, data
  parallelism, checkpoints, the demo.
"""
