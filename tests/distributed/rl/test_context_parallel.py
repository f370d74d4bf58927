"""The RL losses under context parallelism on real gloo ranks against a float64 single process.

Two ranks, ``cp = 2, ep = 2``, a tiny Qwen3-MoE: one microbatch of right-padded rows whose length (13)
does not divide by ``2·cp``, two hinted turns, a frozen teacher and a KL reference sharded alike. Each
rank holds half of every sequence; the GRPO, KL and SD terms (full vocabulary with top-k, and the
sampled estimator with sequence means, token clipping and importance weights) and every gradient must
equal the unsplit float64 ones.
"""

from __future__ import annotations

import pytest
import torch

from cadenza.testing import spawn
from tests.support.tiny_moe import PRELOAD, tiny_model

LENGTHS = (13, 10, 7)
LOSSES = (
    dict(top_k=5, kl_ref=0.1),
    dict(sd_estimator="sampled", aggregation="sequence_mean", token_clip=0.5, sd_temperature=0.7),
)


def _batch(vocab: int):
    from cadenza.rl.text.tokens import TokenBatch

    g = torch.Generator().manual_seed(5)
    B, T = len(LENGTHS), max(LENGTHS)
    ids = torch.randint(1, vocab, (B, T), generator=g)
    attn = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T))
    for b, n in enumerate(LENGTHS):
        ids[b, n:] = 0
        attn[b, :n] = 1
        mask[b, 3:n] = (torch.rand(n - 3, generator=g) > 0.2).float()
    blp = -torch.rand((B, T), generator=g) * 3 * mask
    return TokenBatch(input_ids=ids, attention_mask=attn, loss_mask=mask, behaviour_logprobs=blp,
                      rewards=torch.zeros(B), group_ids=["g"] * B, lengths=list(LENGTHS))  # fmt: skip


def _items(batch):
    from cadenza.feedback.hints import Hint
    from cadenza.rl.learn.teacher import HintedTurn

    out = []
    for row, (s, e), hint in ((0, (6, 12), [7, 8, 9]), (2, (3, 7), [11])):
        ids = batch.input_ids[row].tolist()
        out.append(HintedTurn(row=row, turn=0, hint=Hint(turn=0, text="h", kind="t"), turn_start=s,
                              turn_end=e, teacher_ids=ids[:s] + hint + ids[s:e],
                              teacher_turn_start=s + len(hint), shared_prefix=0))  # fmt: skip
    return out


def _losses(policy, teacher, ref, batch, loss_kw: dict, context=None):
    from cadenza.rl.config import LossConfig
    from cadenza.rl.learn.logprobs import sequence_logprobs
    from cadenza.rl.learn.step import rl_losses

    lc = LossConfig(**loss_kw)
    teacher.loss_config, teacher.spec = (
        lc,
        type(teacher.spec)(
            divergence=lc.divergence, beta=lc.beta, top_k=lc.top_k or None, temperature=lc.sd_temperature
        ),
    )
    with torch.no_grad():
        hidden = ref.get_decoder()(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask
        ).last_hidden_state
        head = ref.get_output_embeddings()
        ref_lp, _ = sequence_logprobs(hidden, head, batch.input_ids, batch.loss_mask, context=context)
    adv = torch.tensor([1.0, -0.5, 0.7])
    res = rl_losses(policy, batch, adv, items=_items(batch), teacher=teacher, loss=lc, temperature=1.0,
                    chunk_size=4, ref_logprobs=ref_lp.to(policy.lm_head.weight.dtype))  # fmt: skip
    res.loss.backward()
    metrics = dict(loss=res.loss, grpo=res.grpo, sd=res.sd.loss)
    return {**{k: float(v.detach()) for k, v in metrics.items()}, "entropy": res.entropy_unhinted,
            "clip": res.clip_fraction, "sd_tokens": res.sd.num_tokens}  # fmt: skip


def _ranks(rank: int, world: int) -> dict:
    import copy

    from cadenza.parallel import ParallelDims, ParallelOptions, build_meshes, parallelize
    from cadenza.rl.config import TeacherConfig
    from cadenza.rl.engines.policy import HFPolicy
    from cadenza.rl.learn.teacher import Teacher
    from cadenza.rl.train.ranks.sharding import ShardedHFPolicy, ThroughRoot

    model = tiny_model("qwen3_moe")
    batch = _batch(model.config.vocab_size)
    ref_model = copy.deepcopy(model)
    report = {"rows": []}
    if rank == 0:  # the unsplit float64 reference
        ref = HFPolicy(copy.deepcopy(model).double())
        teacher = Teacher(ref.model, TeacherConfig(weights="frozen"))
        frozen = copy.deepcopy(ref.model)
        for kw in LOSSES:
            ref.model.zero_grad()
            got = _losses(ref, teacher, frozen, batch, kw)
            got["grads"] = {n: p.grad.numpy().copy() for n, p in ref.model.named_parameters()}
            report["rows"].append(got)
    meshes = build_meshes(ParallelDims(cp=2, ep=2))
    teacher = Teacher(model, TeacherConfig(weights="frozen"))
    wrapped = parallelize(model, meshes, ParallelOptions())
    for m in (teacher.model, ref_model):
        parallelize(m, meshes, ParallelOptions())
    ctx = wrapped.context
    policy = ShardedHFPolicy(model, device="cpu", context=ctx)
    teacher.model = ThroughRoot(teacher.model, ctx, gather=True)
    reference = ThroughRoot(ref_model, ctx, gather=False)
    report["got"] = []
    for kw in LOSSES:
        model.zero_grad()
        got = _losses(policy, teacher, reference, batch, kw, context=ctx)
        got["grads"] = _full_grads(model)
        report["got"].append(got)
    return report if rank == 0 else {}


def _full_grads(model) -> dict[str, torch.Tensor]:
    out = {}
    for n, p in model.named_parameters():
        g = p.grad
        out[n] = (g.full_tensor() if hasattr(g, "full_tensor") else g).double().numpy().copy()
    return out


def test_rl_losses_and_gradients_under_cp_equal_the_unsplit_ones():
    report = spawn(_ranks, 2, timeout=600, preload=PRELOAD)[0]
    for want, got in zip(report["rows"], report["got"], strict=True):
        assert got["sd_tokens"] == want["sd_tokens"] == 10
        for key in ("loss", "grpo", "sd", "entropy", "clip"):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
        assert want["sd"] > 0 and want["grpo"] != 0
        for name, g in want["grads"].items():
            scale = float(abs(g).max())
            assert scale > 0, name  # every parameter (both experts' halves, the LM head) got gradient
            err = float(abs(got["grads"][name] - g).max())
            assert err <= 1e-4 * scale + 1e-7, (name, err, scale)
