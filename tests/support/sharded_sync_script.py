"""One rank of the sharded-policy -> vLLM sync test (``tests/distributed/rl/test_sharded_engine_sync.py``).

Launched like torchrun (RANK, WORLD_SIZE, CADENZA_INIT_METHOD) with ``MODEL OUT``: a 2-rank trainer with
``[parallel] ep = 2`` and the real vLLM engine runs step 1 (rollouts, update, a sync streamed from the
shards, the trainer's parity probe and ``check_received``); then every rank gathers the trained weights
into rank 0's unsharded HF copy, and rank 0 compares the engine's greedy samples and log-probs with it.
Step 2 runs the same with the sync skipped (the ranks still gather, rank 0 feeds nothing): the same
comparison must now fail. Rank 0 prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch


def _config(model: Path, out: Path):  # type: ignore[no-untyped-def]
    from cadenza.rl.config import ParallelDims
    from tests.support.rl_fixtures import config

    cfg = config(model, out, steps=2, lambda_sd=1.0)
    cfg.env.options = {"min_steps": 1, "max_steps": 1, "extra_turns": 1}
    cfg.optim.name, cfg.optim.muon_ns_dtype = "muon", "float32"
    cfg.optim.muon_lr = 0.05  # a step that moves greedy decoding
    cfg.probe.every = 0  # no hint-following probe: nothing needs an unsharded copy on rank 0
    cfg.parallel = ParallelDims(ep=2)
    cfg.rollout = dataclasses.replace(
        cfg.rollout, engine="vllm", engine_timeout_s=300, sync_probe_tol=1e-3,
        engine_options={"max_model_len": 1024, "kv_cache_gib": 1, "port": 0, "bucket_bytes": 1 << 16},
    )  # fmt: skip
    return cfg


def _gathered(trainer, model_dir: Path):  # type: ignore[no-untyped-def]
    """Every rank: the trained weights, gathered tensor by tensor into rank 0's fresh HF copy."""
    from cadenza.rl.engines.policy import HFPolicy
    from cadenza.rl.engines.weights import named_full_tensors

    copy = HFPolicy.from_pretrained(str(model_dir)) if trainer.dp.main else None
    params = dict(copy.model.named_parameters()) if copy is not None else {}
    with torch.no_grad():
        for name, full in named_full_tensors(trainer.model):
            if name in params:
                params[name].copy_(full)
    return copy


def _compare(trainer, policy) -> dict:  # type: ignore[no-untyped-def]
    """Rank 0: the engine's greedy continuations and log-probs against the gathered HF model's."""
    from cadenza.rl.engines.policy import SampleRequest, SamplingParams

    engine = trainer._engine.engine
    tok = trainer.tokenizer
    texts = ["Make the counter reach 3, then submit.", "def add(a, b):", "counter = 1 2 3 error:"]
    params = SamplingParams(max_new_tokens=24, temperature=0.0)
    exact, gap = [], 0.0
    for text in texts:
        prompt = tok.encode(text, add_special_tokens=False)
        req = SampleRequest([prompt], params, torch.Generator().manual_seed(0))
        got = engine.sample(req)[0].token_ids
        want = policy.sample(SampleRequest([prompt], params, torch.Generator().manual_seed(0)))[0].token_ids
        exact.append(list(got) == list(want))
        seq = prompt + list(want)
        with torch.no_grad():
            logits = policy.model(torch.tensor([seq])).logits[0, :-1].double()
        ref = logits.log_softmax(-1).gather(-1, torch.tensor(seq[1:])[:, None])[:, 0]
        gap = max(gap, float((torch.tensor(engine.score([seq])[0], dtype=torch.float64) - ref).abs().max()))
    return {"exact": exact, "gap": gap, "version": engine.version}


def main() -> None:
    from cadenza.rl.train.ranks import stream_sync
    from cadenza.rl.train.trainer import Trainer

    model, out = Path(sys.argv[1]), Path(sys.argv[2])
    torch.set_num_threads(1)
    trainer = Trainer(_config(model, out), resume=False)
    result: dict = {"rollout_copy": trainer.rollout_policy is not None, "streams": trainer._streams}
    try:
        for step, skip in ((1, False), (2, True)):
            if skip:  # the ranks still gather every tensor (lockstep), rank 0 feeds nothing
                stream_sync._feed = lambda _t, stream, _v, _w: (stream.drain(), 0.0)[1]
            trainer.step = step
            row = trainer.train_step(step)
            policy = _gathered(trainer, model)
            if trainer.dp.main:
                result[f"step{step}"] = {**_compare(trainer, policy), "skipped_update": row["skipped_update"]}
    finally:
        trainer.close()
        trainer.dp.leave()
    if trainer.dp.main:
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
