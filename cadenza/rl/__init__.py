"""Token trajectories, rollouts, policy backends, GRPO and self-distillation losses, trainer, curriculum.

Modules (import them directly; this package imports nothing heavy):

* ``chat``: Qwen/Hermes chat template with tool calls, ``train_tokenizer``, ``parse_tool_calls``.
* ``tokens``: ``TokenTrajectory`` (exact ids, loss mask, segments, turn spans, behaviour log-probs),
``collate``.
* ``policy``: ``Policy`` protocol, ``HFPolicy`` (any transformers causal LM), tiny Qwen3 / Qwen3-MoE configs.
* ``rollout``: ``rollout(policy, tokenizer, tasks, RolloutParams)`` over any ``cadenza.agent.env.Env``.
* ``losses``: ``self_distillation_loss``, ``sampled_token_sd_loss``, ``group_advantages``, ``grpo_loss``.
* ``logprobs``: chunked ``sequence_logprobs`` / ``hidden_divergence`` from hidden states.
* ``teacher``: ``build_hinted_turns``, ``Teacher`` (live / EMA / frozen, KV-cache prefix reuse).
* ``step``: ``rl_losses`` = GRPO + lambda_sd * SD from one student forward, with drift metrics.
"""
