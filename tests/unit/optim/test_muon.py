"""Single-process Muon: Newton–Schulz, torch.optim.Muon parity, per-head/per-expert updates against a
float64 reference written here, AdamW groups, HF param groups, bad input, state dict round trip."""

from __future__ import annotations

import io
import math

import pytest
import torch

from cadenza.errors import ConfigError
from cadenza.optim import DEFAULT_COEFFICIENTS, Muon, blocks, newton_schulz

# ---------------------------------------------------------------- float64 reference (independent)


def ref_ns(M: torch.Tensor, coeffs, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """Newton–Schulz on one matrix in float64, written from the formula."""
    X = M.double()
    tall = X.shape[0] > X.shape[1]
    if tall:
        X = X.T
    X = X / max(float(torch.sqrt((X * X).sum())), eps)
    sched = (
        [coeffs] * steps
        if isinstance(coeffs[0], float)
        else [coeffs[min(i, len(coeffs) - 1)] for i in range(steps)]
    )
    for a, b, c in sched:
        S = X @ X.T
        X = a * X + (b * S + c * S @ S) @ X
    return X.T if tall else X


def ref_muon_steps(W0, grads, matrices, *, lr, mu, wd, nesterov=True, adjust="original"):
    """Muon over explicit (index-tuple) matrices of one parameter, float64."""
    W, buf = W0.double().clone(), torch.zeros_like(W0, dtype=torch.float64)
    for g in grads:
        g = g.double()
        buf = mu * buf + (1 - mu) * g
        u = (1 - mu) * g + mu * buf if nesterov else buf
        upd = torch.zeros_like(W)
        for idx in matrices:
            M = u[idx]
            A, B = M.shape
            s = math.sqrt(max(1, A / B)) if adjust == "original" else 0.2 * math.sqrt(max(A, B))
            upd[idx] = s * ref_ns(M, DEFAULT_COEFFICIENTS)
        W = W * (1 - lr * wd) - lr * upd
    return W


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


# ---------------------------------------------------------------- newton_schulz


def test_newton_schulz_matches_torch_and_reference():
    from torch.optim._muon import _zeropower_via_newtonschulz

    g = torch.Generator().manual_seed(0)
    for shape in [(16, 40), (40, 16), (24, 24)]:
        M = torch.randn(shape, generator=g)
        ours = newton_schulz(M)  # bf16 like torch.optim.Muon
        theirs = _zeropower_via_newtonschulz(M, DEFAULT_COEFFICIENTS, 5, 1e-7)
        assert torch.equal(ours, theirs), shape
        assert rel(newton_schulz(M, dtype=torch.float64), ref_ns(M, DEFAULT_COEFFICIENTS)) < 1e-12
        # orthogonalised: singular values pulled into a band around 1
        sv = torch.linalg.svdvals(newton_schulz(M, steps=10, dtype=torch.float64))
        assert sv.min() > 0.6 and sv.max() < 1.25


def test_newton_schulz_batched_and_schedule():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(2, 3, 12, 20, generator=g)
    out = newton_schulz(X, dtype=torch.float32)
    assert out.shape == X.shape and out.dtype == torch.float32
    for i in range(2):
        for j in range(3):
            assert rel(out[i, j], ref_ns(X[i, j], DEFAULT_COEFFICIENTS)) < 1e-5
    polar = [(8.2, -22.4, 15.8), (4.1, -2.9, 0.5), (3.9, -2.8, 0.5)]  # a per-step schedule
    Y = newton_schulz(X[0], steps=4, coefficients=polar, dtype=torch.float64)
    for j in range(3):
        assert rel(Y[j], ref_ns(X[0, j], polar, steps=4)) < 1e-12
    with pytest.raises(ConfigError):
        newton_schulz(torch.ones(5))
    with pytest.raises(ConfigError):
        newton_schulz(X, coefficients=[(1.0, 2.0)])


# ---------------------------------------------------------------- Muon vs torch.optim.Muon


@pytest.mark.parametrize("nesterov,adjust", [(True, "original"), (False, "match_rms_adamw")])
def test_matrix_granularity_equals_torch_muon(nesterov, adjust):
    g = torch.Generator().manual_seed(2)
    shapes = [(32, 16), (16, 48), (20, 20)]
    ours = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    a = Muon(ours, lr=0.03, momentum=0.9, nesterov=nesterov, weight_decay=0.1, adjust_lr=adjust)
    b = torch.optim.Muon(
        theirs, lr=0.03, momentum=0.9, nesterov=nesterov, weight_decay=0.1, adjust_lr_fn=adjust
    )
    for _ in range(3):
        for p, q in zip(ours, theirs, strict=True):
            p.grad = torch.randn(p.shape, generator=g)
            q.grad = p.grad.clone()
        a.step()
        b.step()
    for p, q in zip(ours, theirs, strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)


# ---------------------------------------------------------------- per-head / per-expert vs float64


def _run(param_shape, group, matrices, steps=3, ns_dtype=torch.float32, **kw):
    g = torch.Generator().manual_seed(3)
    W0 = torch.randn(param_shape, generator=g, dtype=torch.float64).to(ns_dtype)  # float64 NS: float64 params
    p = torch.nn.Parameter(W0.clone())
    opt = Muon([{"params": [p], **group}], lr=0.02, momentum=0.95, weight_decay=0.05, ns_dtype=ns_dtype, **kw)
    grads = [torch.randn(param_shape, generator=g, dtype=torch.float64).to(ns_dtype) for _ in range(steps)]
    for gr in grads:
        p.grad = gr.clone()
        opt.step()
    ref = ref_muon_steps(
        W0, grads, matrices, lr=0.02, mu=0.95, wd=0.05, adjust=kw.get("adjust_lr", "original")
    )
    return rel(p.detach() - W0, ref - W0.double())


def test_per_head_rows_and_columns_and_fused():
    hd = 8
    rows = [(slice(h * hd, (h + 1) * hd), slice(None)) for h in range(4)]
    assert _run((32, 24), {"granularity": "head", "head_dim": hd}, rows) < 1e-5
    assert _run((32, 24), {"granularity": "head", "head_dim": hd}, rows, ns_dtype=torch.float64) < 1e-12
    cols = [(slice(None), slice(h * hd, (h + 1) * hd)) for h in range(3)]
    assert (
        _run(
            (40, 24),
            {"granularity": "head", "head_dim": hd, "head_axis": 1},
            cols,
            adjust_lr="match_rms_adamw",
        )
        < 1e-5
    )
    # fused GQA QKV: 4 q heads + 2 k heads + 2 v heads of 8 rows, given as split_sizes
    fused = [(slice(h * hd, (h + 1) * hd), slice(None)) for h in range(8)]
    assert _run((64, 24), {"granularity": "head", "head_dim": hd, "split_sizes": (32, 16, 16)}, fused) < 1e-5
    # MLA kv_a: two unequal blocks (latent, shared rope key)
    mla = [(slice(0, 12), slice(None)), (slice(12, 16), slice(None))]
    assert (
        _run((16, 24), {"granularity": "head", "split_sizes": (12, 4)}, mla, ns_dtype=torch.float64) < 1e-12
    )


def test_per_expert_with_fused_gate_up():
    E, inter, hidden = 4, 6, 10
    plain = [(e, slice(None), slice(None)) for e in range(E)]
    assert _run((E, hidden, inter), {"granularity": "expert"}, plain) < 1e-5
    fused = [(e, slice(s, s + inter), slice(None)) for e in range(E) for s in (0, inter)]
    assert (
        _run(
            (E, 2 * inter, hidden),
            {"granularity": "expert", "split_sizes": (inter, inter)},
            fused,
            ns_dtype=torch.float64,
        )
        < 1e-12
    )


def test_granularity_changes_the_update():
    """Per-head is not per-matrix (so a mixed-up assignment cannot pass the tests above silently)."""
    whole = [(slice(None), slice(None))]
    assert _run((32, 24), {"granularity": "head", "head_dim": 8}, whole) > 1e-2


# ---------------------------------------------------------------- AdamW groups, state dict


def test_adamw_group_equals_torch_adamw():
    g = torch.Generator().manual_seed(4)
    p = torch.nn.Parameter(torch.randn(7, 3, generator=g))
    q = torch.nn.Parameter(p.detach().clone())
    a = Muon([{"params": [p], "algorithm": "adamw", "lr": 1e-2, "weight_decay": 0.1, "betas": (0.8, 0.9)}])
    b = torch.optim.AdamW([q], lr=1e-2, weight_decay=0.1, betas=(0.8, 0.9), eps=1e-8)
    for _ in range(4):
        p.grad = torch.randn(p.shape, generator=g)
        q.grad = p.grad.clone()
        a.step()
        b.step()
    torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_state_dict_round_trip_resumes_identically():
    g = torch.Generator().manual_seed(5)
    params = [
        torch.nn.Parameter(torch.randn(3, 8, 6, generator=g)),
        torch.nn.Parameter(torch.randn(6, generator=g)),
    ]

    def make(ps):
        return Muon([{"params": [ps[0]], "granularity": "expert"}, {"params": [ps[1]], "algorithm": "adamw"}])

    opt = make(params)
    grads = [[torch.randn(p.shape, generator=g) for p in params] for _ in range(3)]
    for step in grads[:2]:
        for p, gr in zip(params, step, strict=True):
            p.grad = gr.clone()
        opt.step()
    buf = io.BytesIO()
    torch.save({"opt": opt.state_dict(), "params": [p.detach().clone() for p in params]}, buf)
    for p, gr in zip(params, grads[2], strict=True):
        p.grad = gr.clone()
    opt.step()
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=False)
    restored = [torch.nn.Parameter(t) for t in ckpt["params"]]
    opt2 = make(restored)
    opt2.load_state_dict(ckpt["opt"])
    for p, gr in zip(restored, grads[2], strict=True):
        p.grad = gr.clone()
    opt2.step()
    for p, q in zip(params, restored, strict=True):
        assert torch.equal(p, q)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "group,match",
    [
        (
            {"params": [torch.zeros(10, 4)], "granularity": "head", "head_dim": 3},
            "head_dim 3 does not divide 10",
        ),
        ({"params": [torch.zeros(10)]}, "needs a 2-D parameter"),
        ({"params": [torch.zeros(2, 3, 4)]}, "use granularity 'expert'"),
        ({"params": [torch.zeros(8, 4)], "adjust_lr": "spectral"}, "unknown adjust_lr 'spectral'"),
        ({"params": [torch.zeros(8, 4)], "granularity": "row"}, "unknown granularity 'row'"),
        ({"params": [torch.zeros(8, 4)], "algorithm": "sgd"}, "unknown algorithm 'sgd'"),
        ({"params": [torch.zeros(2, 8, 4)], "granularity": "expert", "split_sizes": (4, 3)}, "sum to 8"),
        ({"params": [torch.zeros(8, 4)], "granularity": "head"}, "needs head_dim"),
        ({"params": [torch.zeros(8, 4)], "ns_coefficients": [(1.0, 2.0)]}, "ns_coefficients"),
    ],
)
def test_bad_input_fails_at_construction(group, match):
    with pytest.raises(ConfigError, match=match):
        Muon([group])


def test_blocks_partition_the_parameter():
    for shape, kw in [
        ((12, 5), {"granularity": "head", "head_dim": 4}),
        ((5, 12), {"granularity": "head", "head_dim": 3, "head_axis": 1}),
        ((3, 10, 4), {"granularity": "expert", "split_sizes": (6, 4)}),
        ((7, 9), {"granularity": "matrix"}),
    ]:
        cover = torch.zeros(shape)
        for box in blocks(shape, **kw):
            cover[tuple(slice(a, b) for a, b in box)] += 1
        assert torch.equal(cover, torch.ones(shape)), shape
