"""Low-rank SVD of LoRA factors without forming dW, and the balanced rebuild."""

from __future__ import annotations

import pytest
import torch

from populora.operators import rebuild_balanced, rms, svd_factors


def rand(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("d,e,r", [(9, 7, 3), (6, 5, 1), (5, 5, 5), (7, 2, 4), (3, 8, 5)])
def test_svd_factors_is_the_svd_of_dw(d, e, r):
    down, up = rand(4, d, r, seed=1), rand(4, e, r, seed=2)
    u, s, v = svd_factors(down, up)
    assert u.shape == (4, d, r) and s.shape == (4, r) and v.shape == (4, e, r)
    dw = up @ down.mT
    assert torch.allclose(v @ torch.diag_embed(s) @ u.mT, dw, atol=1e-10)
    q = min(d, e, r)
    assert torch.allclose(s[:, :q], torch.linalg.svdvals(dw)[:, :q], atol=1e-10)
    assert (s[:, 1:] <= s[:, :-1]).all() and (s >= 0).all()
    eye = torch.eye(q, dtype=torch.float64)
    assert torch.allclose(u[..., :q].mT @ u[..., :q], eye, atol=1e-10)
    assert torch.allclose(v[..., :q].mT @ v[..., :q], eye, atol=1e-10)
    # beyond min(d, e): zero padding
    assert (s[:, q:] == 0).all() and (u[..., q:] == 0).all() and (v[..., q:] == 0).all()


def test_svd_factors_never_forms_dw_shapes_are_batched():
    down, up = rand(2, 3, 50, 4), rand(2, 3, 40, 4, seed=1)
    u, s, v = svd_factors(down, up)
    assert u.shape == (2, 3, 50, 4) and s.shape == (2, 3, 4) and v.shape == (2, 3, 40, 4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision_round_trips(dtype):
    down, up = rand(3, 16, 4, dtype=dtype), rand(3, 12, 4, seed=1, dtype=dtype)
    u, s, v = svd_factors(down, up)
    assert u.dtype == s.dtype == v.dtype == dtype
    new = rebuild_balanced(u, s, v)
    assert new.down.dtype == new.up.dtype == dtype
    ref = up.double() @ down.double().mT
    err = (new.up.double() @ new.down.double().mT - ref).norm() / ref.norm()
    assert err < (2e-2 if dtype != torch.float32 else 1e-5)


def test_zero_adapter():
    u, s, v = svd_factors(torch.zeros(2, 5, 3), torch.zeros(2, 4, 3))
    assert (s == 0).all() and torch.isfinite(u).all() and torch.isfinite(v).all()
    new = rebuild_balanced(u, s, v)
    assert (new.down == 0).all() and (new.up == 0).all()


def test_rebuild_balanced_keeps_dw_and_balances():
    down, up = rand(4, 10, 3) * 100, rand(4, 6, 3, seed=1) / 100  # badly unbalanced
    new = rebuild_balanced(*svd_factors(down, up))
    assert torch.allclose(new.up @ new.down.mT, up @ down.mT, atol=1e-10)
    assert torch.allclose(new.down.mT @ new.down, new.up.mT @ new.up, atol=1e-10)


def test_shape_mismatch():
    with pytest.raises(ValueError, match=r"share batch dims and r, got \(2, 5, 3\) and \(2, 4, 2\)"):
        svd_factors(torch.zeros(2, 5, 3), torch.zeros(2, 4, 2))


def test_rms():
    t = torch.tensor([[[3.0, 4.0]], [[0.0, 0.0]]])  # (2, 1, 2)
    assert torch.allclose(rms(t), torch.tensor([12.5**0.5, 0.0]).view(2, 1, 1))
    assert rms(t.bfloat16()).dtype == torch.float32 and rms(t.double()).dtype == torch.float64
