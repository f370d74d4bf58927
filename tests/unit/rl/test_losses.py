"""Losses against independent float64 references written with numpy loops (not cadenza's functions)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cadenza.errors import CadenzaError
from cadenza.rl.learn.losses import (
    DivergenceSpec,
    clip_fraction,
    group_advantages,
    grpo_loss,
    sampled_token_sd_loss,
    sampled_token_surrogate,
    self_distillation_loss,
    truncated_is_weights,
)

# ---------------------------------------------------------------- float64 reference


def _softmax(x: np.ndarray, temperature: float) -> np.ndarray:
    z = x / temperature
    e = np.exp(z - z.max())
    return e / e.sum()


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    return float(sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True) if pi > 0))


def _reduce_topk(ps: np.ndarray, pt: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    order = sorted(range(len(pt)), key=lambda i: -pt[i])[:k]
    rest = [i for i in range(len(pt)) if i not in order]
    return (
        np.array([ps[i] for i in order] + [sum(ps[i] for i in rest)]),
        np.array([pt[i] for i in order] + [sum(pt[i] for i in rest)]),
    )


def _ref_divergence(s_logits, t_logits, divergence, beta, top_k, temperature) -> float:
    ps, pt = _softmax(s_logits, temperature), _softmax(t_logits, temperature)
    if top_k is not None and top_k < len(pt):
        ps, pt = _reduce_topk(ps, pt, top_k)
    if divergence == "reverse_kl":
        return _kl(ps, pt)
    if divergence == "forward_kl":
        return _kl(pt, ps)
    if beta == 0:
        return _kl(pt, ps)
    if beta == 1:
        return _kl(ps, pt)
    m = beta * pt + (1 - beta) * ps
    return beta * _kl(pt, m) + (1 - beta) * _kl(ps, m)


def _ref_loss(s, t, mask, **kw) -> float:
    total, count = 0.0, 0.0
    for b in range(s.shape[0]):
        for i in range(s.shape[1]):
            if mask[b, i]:
                total += _ref_divergence(s[b, i], t[b, i], **kw)
                count += 1
    return total / max(count, 1.0)


# ---------------------------------------------------------------- self-distillation

CASES = [
    dict(divergence="reverse_kl", beta=0.5, top_k=None, temperature=1.0),
    dict(divergence="forward_kl", beta=0.5, top_k=None, temperature=0.7),
    dict(divergence="jsd", beta=0.5, top_k=None, temperature=1.0),
    dict(divergence="jsd", beta=0.2, top_k=None, temperature=1.3),
    dict(divergence="jsd", beta=0.0, top_k=None, temperature=1.0),
    dict(divergence="jsd", beta=1.0, top_k=None, temperature=1.0),
    dict(divergence="reverse_kl", beta=0.5, top_k=3, temperature=1.0),
    dict(divergence="forward_kl", beta=0.5, top_k=4, temperature=0.8),
    dict(divergence="jsd", beta=0.7, top_k=2, temperature=1.0),
    dict(divergence="reverse_kl", beta=0.5, top_k=50, temperature=1.0),  # k >= V: full vocabulary
]


def _inputs(seed: int, B: int = 2, T: int = 5, V: int = 11):
    rng = np.random.default_rng(seed)
    s = rng.normal(size=(B, T, V)) * 2.0
    t = rng.normal(size=(B, T, V)) * 2.0
    mask = rng.random((B, T)) < 0.6
    mask[0, 0] = True
    return s, t, mask


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"{c['divergence']}-b{c['beta']}-k{c['top_k']}-T{c['temperature']}"
)
def test_sd_loss_matches_float64_reference(case):
    s, t, mask = _inputs(0)
    ref = _ref_loss(s, t, mask, **case)
    got64 = self_distillation_loss(
        torch.tensor(s), torch.tensor(t), torch.tensor(mask), DivergenceSpec(**case)
    )
    assert got64.dtype == torch.float64
    assert got64.item() == pytest.approx(ref, rel=1e-10, abs=1e-12)
    got32 = self_distillation_loss(
        torch.tensor(s, dtype=torch.float32),
        torch.tensor(t, dtype=torch.float32),
        torch.tensor(mask).float(),
        DivergenceSpec(**case),
    )
    assert got32.item() == pytest.approx(ref, rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("case", CASES[:3] + CASES[6:9], ids=lambda c: f"{c['divergence']}-k{c['top_k']}")
def test_sd_gradient_masked_and_matches_finite_differences(case):
    s, t, mask = _inputs(1, B=2, T=4, V=7)
    student = torch.tensor(s, requires_grad=True)
    teacher = torch.tensor(t, requires_grad=True)
    loss = self_distillation_loss(student, teacher, torch.tensor(mask), DivergenceSpec(**case))
    loss.backward()
    grad = student.grad.numpy()
    assert teacher.grad is None  # the teacher never receives gradient
    assert np.all(grad[~mask] == 0.0)  # nothing outside the target tokens
    h = 1e-6
    for b, i in zip(*np.nonzero(mask), strict=True):
        for v in range(s.shape[2]):
            plus, minus = s.copy(), s.copy()
            plus[b, i, v] += h
            minus[b, i, v] -= h
            fd = (_ref_loss(plus, t, mask, **case) - _ref_loss(minus, t, mask, **case)) / (2 * h)
            assert grad[b, i, v] == pytest.approx(fd, rel=1e-5, abs=1e-8)


def test_sd_loss_zero_when_identical_and_empty_mask():
    s, _, mask = _inputs(2)
    x = torch.tensor(s)
    for div in ("reverse_kl", "forward_kl", "jsd"):
        assert self_distillation_loss(
            x, x.clone(), torch.tensor(mask), DivergenceSpec(divergence=div)
        ).item() == pytest.approx(0, abs=1e-12)
    assert self_distillation_loss(x, x + 1.0, torch.zeros(mask.shape)).item() == 0.0


@pytest.mark.parametrize("bad", [dict(divergence="kl"), dict(beta=1.5), dict(top_k=0), dict(temperature=0.0)])
def test_sd_loss_rejects_bad_options(bad):
    s, t, mask = _inputs(3)
    with pytest.raises(CadenzaError):
        self_distillation_loss(torch.tensor(s), torch.tensor(t), torch.tensor(mask), DivergenceSpec(**bad))


def test_sd_loss_rejects_misaligned_shapes():
    s, t, mask = _inputs(3)
    with pytest.raises(CadenzaError, match="same shape"):
        self_distillation_loss(torch.tensor(s), torch.tensor(t[:, :-1]), torch.tensor(mask))


def test_sampled_token_estimator_value_and_gradient():
    rng = np.random.default_rng(4)
    ls, lt = -rng.random((2, 6)) * 3, -rng.random((2, 6)) * 3
    mask = rng.random((2, 6)) < 0.5
    mask[0, 0] = True
    student = torch.tensor(ls, requires_grad=True)
    teacher = torch.tensor(lt, requires_grad=True)
    loss = sampled_token_sd_loss(student, teacher, torch.tensor(mask))
    n = mask.sum()
    assert loss.item() == pytest.approx(sum((ls - lt)[mask]) / n, rel=1e-12)
    loss.backward()
    expected = np.where(mask, (ls - lt) / n, 0.0)
    np.testing.assert_allclose(student.grad.numpy(), expected, rtol=1e-12, atol=1e-15)
    assert teacher.grad is None


@pytest.mark.parametrize("cap", [0.0, 50.0])
def test_sampled_estimator_off_policy_is_unbiased_against_float64(cap):
    """Tokens drawn by ``mu`` (not the student): the expectation over ``y ~ mu`` of the weighted
    estimator equals KL(student || teacher) and its gradient, computed exactly over the vocabulary in
    float64 (the expectation is a sum over every token, so no sampling noise enters the test)."""
    rng = np.random.default_rng(9)
    V = 7
    s_logits, t_logits, mu_logits = rng.normal(size=V), rng.normal(size=V), rng.normal(size=V) * 1.5
    ls = s_logits - np.log(np.exp(s_logits).sum())
    lt = t_logits - np.log(np.exp(t_logits).sum())
    lmu = mu_logits - np.log(np.exp(mu_logits).sum())

    def kl(logits: np.ndarray) -> float:
        lp = logits - np.log(np.exp(logits).sum())
        return float((np.exp(lp) * (lp - lt)).sum())

    x = torch.tensor(s_logits, requires_grad=True)
    student = torch.log_softmax(x, -1)
    mu = torch.tensor(lmu)
    per_token = sampled_token_surrogate(student, torch.tensor(lt), mu, is_cap=cap)
    expectation = (mu.exp() * per_token).sum()  # E_{y ~ mu}, exactly
    assert expectation.item() == pytest.approx(kl(s_logits), rel=1e-10)
    expectation.backward()
    h = 1e-6
    for v in range(V):
        e = np.eye(V)[v] * h
        fd = (kl(s_logits + e) - kl(s_logits - e)) / (2 * h)
        assert x.grad[v].item() == pytest.approx(fd, rel=1e-6, abs=1e-9)
    # without the correction the same tokens give a biased value: the defect this fixes
    plain = (mu.exp() * sampled_token_surrogate(student.detach(), torch.tensor(lt))).sum().item()
    assert abs(plain - kl(s_logits)) > 0.05
    # the masked-mean loss applies the same weights; a small cap truncates them
    m = torch.ones(V, dtype=torch.bool)
    w = np.exp(ls - lmu)
    capped = sampled_token_sd_loss(student.detach(), torch.tensor(lt), m, mu, is_cap=1.5).item()
    assert capped == pytest.approx(float((np.minimum(w, 1.5) * (ls - lt)).mean()), rel=1e-10)


def test_clip_fraction_counts_the_tokens_the_clip_stops():
    """A token is clipped exactly when the surrogate passes it no gradient though its advantage is
    nonzero: checked against autograd on the real loss, ratios on both sides of the range."""
    rng = np.random.default_rng(2)
    B, T = 4, 9
    old = -rng.random((B, T)) * 2
    lp = old + rng.normal(size=(B, T)) * 0.4  # many ratios outside [0.8, 1.28], on both sides
    adv = np.array([1.0, -1.0, 0.5, -2.0])
    mask = rng.random((B, T)) < 0.8
    x = torch.tensor(lp, requires_grad=True)
    grpo_loss(x, torch.tensor(old), torch.tensor(adv), torch.tensor(mask), 0.2, 0.28).backward()
    stopped = (x.grad.numpy() == 0) & mask
    want = stopped.sum() / mask.sum()
    got = clip_fraction(x.detach(), torch.tensor(old), torch.tensor(adv), torch.tensor(mask), 0.2, 0.28)
    assert 0 < want < 1 and got.item() == pytest.approx(want, rel=1e-6)
    outside = ((np.exp(lp - old) < 0.8) | (np.exp(lp - old) > 1.28)) & mask
    assert outside.sum() > stopped.sum()  # ratio outside the range is not the same as clipped


# ---------------------------------------------------------------- GRPO


def test_group_advantages_reference():
    rewards = [1.0, 0.0, 0.5, 2.0, 2.0, 3.0, 7.0]
    groups = ["a", "a", "a", "b", "b", "c", "a"]
    got = group_advantages(rewards, groups, normalize_std=True, eps=1e-6).numpy()
    got_raw = group_advantages(rewards, groups, normalize_std=False).numpy()
    for i, g in enumerate(groups):
        members = [r for r, gg in zip(rewards, groups, strict=True) if gg == g]
        mean = sum(members) / len(members)
        std = (
            math.sqrt(sum((r - mean) ** 2 for r in members) / (len(members) - 1)) if len(members) > 1 else 0.0
        )
        assert got_raw[i] == pytest.approx(rewards[i] - mean, abs=1e-6)
        assert got[i] == pytest.approx((rewards[i] - mean) / (std + 1e-6), rel=1e-5, abs=1e-6)
    assert got[3] == 0.0 and got[5] == 0.0  # equal rewards / singleton group


def _ref_grpo(lp, old, adv, mask, lo, hi, ref, kl_coef, aggregation) -> float:
    B, T = lp.shape
    per_seq, total, count = [], 0.0, 0
    for b in range(B):
        s, c = 0.0, 0
        for t in range(T):
            if not mask[b, t]:
                continue
            r = math.exp(lp[b, t] - old[b, t])
            a = adv[b] if adv.ndim == 1 else adv[b, t]
            term = -min(r * a, min(max(r, 1 - lo), 1 + hi) * a)
            if ref is not None:
                d = ref[b, t] - lp[b, t]
                term += kl_coef * (math.exp(d) - d - 1)
            s, c = s + term, c + 1
        total, count = total + s, count + c
        if c:
            per_seq.append(s / c)
    return total / count if aggregation == "token_mean" else sum(per_seq) / len(per_seq)


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean"])
@pytest.mark.parametrize("with_ref", [False, True])
@pytest.mark.parametrize("token_adv", [False, True])
def test_grpo_loss_reference_and_gradient(aggregation, with_ref, token_adv):
    rng = np.random.default_rng(5)
    B, T = 3, 7
    old = -rng.random((B, T)) * 2
    lp = old + rng.normal(size=(B, T)) * 0.4  # many ratios outside [0.8, 1.28]
    adv = rng.normal(size=(B, T)) if token_adv else rng.normal(size=B)
    mask = rng.random((B, T)) < 0.7
    mask[2] = False  # a sequence without model tokens must not count
    mask[0, 1] = True
    ref = old + rng.normal(size=(B, T)) * 0.1 if with_ref else None
    kw = dict(
        clip_eps_low=0.2, clip_eps_high=0.28, kl_coef=0.05 if with_ref else 0.0, aggregation=aggregation
    )
    x = torch.tensor(lp, requires_grad=True)
    loss = grpo_loss(
        x,
        torch.tensor(old),
        torch.tensor(adv),
        torch.tensor(mask),
        ref_logprobs=None if ref is None else torch.tensor(ref),
        **kw,
    )
    expected = _ref_grpo(lp, old, adv, mask, 0.2, 0.28, ref, kw["kl_coef"], aggregation)
    assert loss.item() == pytest.approx(expected, rel=1e-10)
    loss.backward()
    assert np.all(x.grad.numpy()[~mask] == 0.0)
    h = 1e-6
    for b, t in zip(*np.nonzero(mask), strict=True):
        plus, minus = lp.copy(), lp.copy()
        plus[b, t] += h
        minus[b, t] -= h
        fd = (
            _ref_grpo(plus, old, adv, mask, 0.2, 0.28, ref, kw["kl_coef"], aggregation)
            - _ref_grpo(minus, old, adv, mask, 0.2, 0.28, ref, kw["kl_coef"], aggregation)
        ) / (2 * h)
        assert x.grad[b, t].item() == pytest.approx(fd, rel=1e-5, abs=1e-8)


def test_grpo_rejects_bad_aggregation():
    z = torch.zeros(2, 3)
    with pytest.raises(CadenzaError, match="aggregation"):
        grpo_loss(z, z, torch.zeros(2), z, aggregation="mean")


@pytest.mark.parametrize("cap", [1.0, 2.0, 5.0])
def test_truncated_is_grpo_matches_float64_reference(cap):
    """Decoupled off-policy GRPO: ratio against the proximal (trainer) policy, each token weighted by
    ``min(pi_prox / mu, cap)`` against the engine's behaviour log-probs ``mu``; reference in float64 loops."""
    rng = np.random.default_rng(11)
    B, T = 3, 6
    mu = -rng.random((B, T)) * 2
    prox = mu + rng.normal(size=(B, T)) * 0.8  # stale engine: many weights above the cap
    lp = prox + rng.normal(size=(B, T)) * 0.3
    adv = rng.normal(size=B)
    mask = rng.random((B, T)) < 0.8
    mask[0, 0] = True

    def reference(lp_: np.ndarray) -> float:
        total, count = 0.0, 0
        for b in range(B):
            for t in range(T):
                if mask[b, t]:
                    r = math.exp(lp_[b, t] - prox[b, t])
                    w = min(math.exp(prox[b, t] - mu[b, t]), cap)
                    total += -w * min(r * adv[b], min(max(r, 0.8), 1.28) * adv[b])
                    count += 1
        return total / count

    w, truncated = truncated_is_weights(
        torch.tensor(prox, dtype=torch.float32), torch.tensor(mu, dtype=torch.float32), cap
    )
    want_trunc = np.exp(prox - mu) > cap
    assert np.array_equal(truncated.numpy(), want_trunc)
    assert cap == 5.0 or 0 < want_trunc.sum() < want_trunc.size  # the small caps really truncate some tokens
    assert np.allclose(w.numpy(), np.minimum(np.exp(prox - mu), cap), rtol=1e-6)
    x = torch.tensor(lp, dtype=torch.float32, requires_grad=True)
    loss = grpo_loss(x, torch.tensor(prox, dtype=torch.float32), torch.tensor(adv), torch.tensor(mask),
                     0.2, 0.28, is_weights=w)  # fmt: skip
    assert loss.item() == pytest.approx(reference(lp), rel=1e-5)
    loss.backward()
    h = 1e-6
    for b, t in zip(*np.nonzero(mask), strict=True):
        plus, minus = lp.copy(), lp.copy()
        plus[b, t] += h
        minus[b, t] -= h
        fd = (reference(plus) - reference(minus)) / (2 * h)
        assert x.grad[b, t].item() == pytest.approx(fd, rel=1e-4, abs=1e-6)
    with pytest.raises(CadenzaError, match="cap must be >= 1"):
        truncated_is_weights(x, x, 0.5)


def test_truncated_is_in_the_step_loss_is_the_capped_policy_gradient():
    """With the trainer's weights as the proximal policy (one update per batch) the ratio is 1, so the
    gradient per token is ``-min(exp(lp - mu), cap) * A / N``: checked against float64 by hand."""
    rng = np.random.default_rng(3)
    lp = -rng.random((2, 5))
    mu = lp + rng.normal(size=(2, 5))
    adv = np.array([1.5, -0.5])
    mask = np.ones((2, 5), dtype=bool)
    x = torch.tensor(lp, requires_grad=True)
    w, _ = truncated_is_weights(x, torch.tensor(mu), 2.0)
    loss = grpo_loss(x, x.detach(), torch.tensor(adv), torch.tensor(mask), 0.2, 0.28, is_weights=w)
    loss.backward()
    want = -np.minimum(np.exp(lp - mu), 2.0) * adv[:, None] / mask.sum()
    assert np.allclose(x.grad.numpy(), want, rtol=1e-12, atol=1e-15)
    assert loss.item() == pytest.approx(
        float((-np.minimum(np.exp(lp - mu), 2.0) * adv[:, None]).mean()), rel=1e-12
    )
