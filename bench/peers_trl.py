"""The TRL side of ``bench/peers.py``: ``trl.GRPOTrainer`` on the shared settings, one step per ``go``.

Runs in the TRL venv (``python bench/peers.py --install``), never in cadenza's: it imports only torch,
transformers, datasets, trl and ``peers_common``. Its configuration is TRL's GRPO with every setting
that changes the work pinned to cadenza's: float32 (TRL defaults to bf16), no gradient checkpointing
(TRL's default recomputes the forward in the backward), AdamW (``adamw_torch``) at a constant lr, one
iteration per generation batch (so TRL computes no extra old-log-prob forward), no reference model
(``beta = 0``), token-mean loss (``dapo``), prompts in order (no shuffling). A callback blocks at each
``on_step_begin`` until the parent's ``go`` and times the step to ``on_step_end`` (generation, reward,
forward, backward, clip, optimizer step; TRL's logging, which follows, is outside).

Usage (by bench/peers.py): ``<trl venv>/bin/python bench/peers_trl.py SETTINGS.json``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers_common import Settings, emit, make_prompts, vowel_reward, wait_go


def _reward(completions: list[Any], **_: Any) -> list[float]:
    """TRL's reward-function signature around the shared reward (conversational completions)."""
    texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
    return [vowel_reward(t) for t in texts]


def main(settings_path: str) -> None:
    s = Settings.load(settings_path)
    import torch

    torch.set_num_threads(s.threads)
    torch.manual_seed(s.seed)
    import datasets
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    out = Path(settings_path).parent / "trl_run"
    prompts = make_prompts(s.prompts_per_step * s.total_steps, s.seed, s.prompt_words)
    data = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in prompts])
    model = AutoModelForCausalLM.from_pretrained(s.model_dir, dtype=torch.float32, attn_implementation="sdpa")
    tok = AutoTokenizer.from_pretrained(s.model_dir)
    args = GRPOConfig(
        output_dir=str(out),
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=s.prompts_per_step * s.group_size,
        gradient_accumulation_steps=1,
        num_generations=s.group_size,
        max_completion_length=s.max_new_tokens,
        temperature=s.temperature,
        top_k=0,
        top_p=1.0,
        num_iterations=1,
        beta=0.0,
        epsilon=s.clip_eps,
        loss_type="dapo",
        scale_rewards="group",
        learning_rate=s.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch",
        adam_beta1=s.betas[0],
        adam_beta2=s.betas[1],
        adam_epsilon=1e-8,
        weight_decay=0.0,
        max_grad_norm=s.grad_clip,
        max_steps=s.total_steps,
        shuffle_dataset=False,
        seed=s.seed,
        logging_steps=1000,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )

    class Timed(GRPOTrainer):
        """Times generation + scoring and counts the tokens of each step's batch."""

        gen_s = 0.0
        counts: dict[str, float] = {}

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            t0 = time.perf_counter()
            batch = super()._generate_and_score_completions(inputs)
            self.gen_s += time.perf_counter() - t0
            self.counts = {
                "completion_tokens": int(batch["completion_mask"].sum()),
                "prompt_tokens": int(batch["prompt_mask"].sum()),
            }
            return batch

    class Gate(TrainerCallback):
        """Blocks before each step until the parent's ``go``; reports the step at the next gate."""

        pending: dict[str, Any] | None = None

        def flush(self) -> None:
            if self.pending is not None:
                emit(self.pending)
                self.pending = None

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.flush()
            if not wait_go():
                raise SystemExit(0)
            trainer.gen_s = 0.0
            self.rewards_before = len(trainer._metrics["train"].get("reward", []))
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            step_s, cpu_s = time.perf_counter() - self.t0, time.process_time() - self.c0
            rewards = trainer._metrics["train"].get("reward", [])[self.rewards_before :]
            self.pending = {
                "step": state.global_step,
                "step_s": step_s,
                "generate_s": trainer.gen_s,
                "update_s": step_s - trainer.gen_s,
                "cpu_s": cpu_s,
                "reward": sum(rewards) / len(rewards) if rewards else float("nan"),
                "threads": torch.get_num_threads(),
                "optimizer": type(getattr(trainer.optimizer, "optimizer", trainer.optimizer)).__name__,
                **trainer.counts,
            }

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.flush()

    gate = Gate()
    trainer = Timed(
        model=model,
        reward_funcs=_reward,
        args=args,
        train_dataset=data,
        processing_class=tok,
        callbacks=[gate],
    )
    versions = {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__}
    checkpointed = any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    emit({"ready": True, "versions": versions, "params": sum(p.numel() for p in model.parameters()),
          "gradient_checkpointing": checkpointed})  # fmt: skip
    trainer.train()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if len(sys.argv) != 2:
        raise SystemExit("usage: peers_trl.py SETTINGS.json (run by bench/peers.py)")
    main(sys.argv[1])
