"""Mutations: the common contract, then each one's semantics (M1-M4, the paper's; `neftune_style`, ours)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from populora.errors import InvalidTypeError, InvalidValueError
from populora.operators import MUTATIONS, Factors

M = 6
ADDITIVE = ["full_gaussian", "layer_selective_gaussian", "neftune_style"]


def call(name, factors, seed=0, epsilon=0.1, weight_scales=None, **kw):
    weight_scales = [1.0] * len(factors) if weight_scales is None else weight_scales
    gen = torch.Generator().manual_seed(seed)
    return MUTATIONS[name](factors, epsilon=epsilon, weight_scales=weight_scales, generator=gen, **kw)


def rms_change(new: Factors, old: Factors) -> float:
    """Root of the mean (over individuals and entries) squared change of dW, in float64."""
    d = new.up.double() @ new.down.double().mT - old.up.double() @ old.down.double().mT
    return d.square().mean().sqrt().item()


def changed(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """(m,) whether each individual's factor changed."""
    return (new != old).flatten(1).any(1)


class TestContract:
    def test_shapes_dtype_finite(self, mutation_name, dtype, helpers):
        factors = helpers.random_stacks(M, dtype=dtype)
        out = call(mutation_name, factors)
        assert len(out) == len(factors)
        for new, old in zip(out, factors):
            assert isinstance(new, Factors)
            assert new.down.shape == old.down.shape and new.up.shape == old.up.shape
            assert new.down.dtype == new.up.dtype == dtype and new.down.device == old.down.device
            assert torch.isfinite(new.down).all() and torch.isfinite(new.up).all()

    def test_global_rng_untouched(self, mutation_name, helpers):
        factors = helpers.random_stacks(M)
        state = torch.get_rng_state()
        call(mutation_name, factors)
        assert torch.equal(torch.get_rng_state(), state)

    def test_pure(self, mutation_name, helpers):
        factors = helpers.random_stacks(M)
        before = helpers.clone(factors)
        out = call(mutation_name, factors)
        helpers.assert_same(factors, before)
        for new, old in zip(out, factors):  # new tensors, not views of the inputs
            assert new.down.data_ptr() != old.down.data_ptr() and new.up.data_ptr() != old.up.data_ptr()

    def test_seeded(self, mutation_name, helpers):
        factors = helpers.random_stacks(M)
        a = call(mutation_name, factors, seed=3)
        helpers.assert_same(a, call(mutation_name, factors, seed=3))
        with pytest.raises(AssertionError):
            helpers.assert_same(a, call(mutation_name, factors, seed=4))

    def test_surplus_columns_stay_zero(self, mutation_name, helpers):
        """Target (7, 2, 4) has effective rank 2: columns 2 and 3 stay zero."""
        new = call(mutation_name, helpers.random_stacks(M))[3]
        assert (new.down[..., 2:] == 0).all() and (new.up[..., 2:] == 0).all()

    def test_zero_adapters_stay_finite(self, mutation_name, helpers):
        zeros = [Factors(torch.zeros_like(f.down), torch.zeros_like(f.up)) for f in helpers.random_stacks(M)]
        for new in call(mutation_name, zeros):
            assert torch.isfinite(new.down).all() and torch.isfinite(new.up).all()

    def test_bad_weight_scales(self, mutation_name, helpers):
        with pytest.raises(
            InvalidValueError, match=r"`weight_scales` must hold one finite value >= 0 per target \(4\)"
        ):
            call(mutation_name, helpers.random_stacks(M), weight_scales=[1.0])
        with pytest.raises(InvalidTypeError, match=r"`weight_scales` must hold one real number per target"):
            call(mutation_name, helpers.random_stacks(M), weight_scales=["a"] * 4)

    def test_epsilon_types(self, mutation_name, helpers):
        """NumPy scalars pass; a wrong type is an InvalidTypeError, a bad value an InvalidValueError."""
        factors = helpers.random_stacks(M)
        helpers.assert_same(
            call(mutation_name, factors, epsilon=np.float32(0.25)), call(mutation_name, factors, epsilon=0.25)
        )
        with pytest.raises(InvalidTypeError, match=r"`epsilon` must be a real number >= 0, got str 'a'"):
            call(mutation_name, factors, epsilon="a")
        with pytest.raises(InvalidValueError, match=r"`epsilon` must be >= 0, got -1"):
            call(mutation_name, factors, epsilon=-1)
        with pytest.raises(InvalidValueError, match=r"`epsilon` must be >= 0, got nan"):
            call(mutation_name, factors, epsilon=float("nan"))


@pytest.mark.parametrize("name", ["full_gaussian", "layer_selective_gaussian", "svd_structured"])
def test_zero_epsilon_keeps_dw(name, helpers):
    factors = helpers.random_stacks(M, dtype=torch.float64)
    for new, old in zip(call(name, factors, epsilon=0.0), factors):
        assert torch.allclose(helpers.delta(new), helpers.delta(old), atol=1e-10)


@pytest.mark.parametrize("name", ADDITIVE)
@pytest.mark.parametrize("state", ["zero", "down_only", "balanced", "large", "unbalanced"])
def test_additive_change_is_epsilon_times_weight_scale(name, state):
    """E[rms(dW' - dW)] = epsilon * w, whatever the adapter's size (zero included)."""
    g = torch.Generator().manual_seed(1)
    m, d, e, r, w, eps = 400, 48, 24, 4, 0.3, 0.2
    a = math.sqrt(w / math.sqrt(r))  # balanced factor scale for rms(dW) = w
    down_scale, up_scale = {
        "zero": (0, 0),
        "down_only": (a, 0),
        "balanced": (a, 0.1 * a),
        "large": (10 * a, 10 * a),
        "unbalanced": (5 * a, 0.01 * a),
    }[state]
    old = Factors(
        torch.randn(m, d, r, generator=g, dtype=torch.float64) * down_scale,
        torch.randn(m, e, r, generator=g, dtype=torch.float64) * up_scale,
    )
    kw = {"fraction": 1.0} if name == "layer_selective_gaussian" else {}
    new = call(name, [old], epsilon=eps, weight_scales=[w], **kw)[0]
    assert rms_change(new, old) == pytest.approx(eps * w, rel=0.1)
    # and it is linear in epsilon and in the weight scale
    new = call(name, [old], epsilon=eps / 2, weight_scales=[3 * w], **kw)[0]
    assert rms_change(new, old) == pytest.approx(1.5 * eps * w, rel=0.1)


@pytest.mark.parametrize("name", ADDITIVE)
def test_additive_zero_weight_scale_or_epsilon_changes_nothing(name, helpers):
    factors = helpers.random_stacks(M, dtype=torch.float64)
    for kw in ({"epsilon": 0.0}, {"weight_scales": [0.0] * 4}):
        for new, old in zip(call(name, factors, **kw), factors):
            assert torch.allclose(helpers.delta(new), helpers.delta(old), atol=1e-12)


def test_neftune_noise_is_uniform_on_down_when_up_is_nonzero(helpers):
    factors = helpers.random_stacks(M, shapes=[(64, 9, 4)], dtype=torch.float64)
    new = call("neftune_style", factors, epsilon=0.3, weight_scales=[0.5])[0]
    assert torch.equal(new.up, factors[0].up)
    noise = new.down - factors[0].down  # U(-b, b) per individual: max close to b, mean |.| = b / 2
    b = noise.abs().amax((1, 2))
    assert torch.allclose(noise.abs().mean((1, 2)), b / 2, rtol=0.1)


def test_neftune_moves_a_zero_up_through_up():
    g = torch.Generator().manual_seed(0)
    old = Factors(torch.randn(50, 32, 4, generator=g), torch.zeros(50, 16, 4))
    new = call("neftune_style", [old], epsilon=0.2, weight_scales=[0.1])[0]
    assert torch.equal(new.down, old.down)
    assert (new.up != 0).flatten(1).any(1).all()
    assert rms_change(new, old) == pytest.approx(0.02, rel=0.15)


@pytest.mark.parametrize("fraction,count", [(1 / 3, 2), (0.01, 1), (0.5, 3), (0.75, 5), (1.0, 6)])  # 4.5 rounds up
def test_layer_selective_touches_the_right_number_of_targets(fraction, count, helpers):
    factors = helpers.random_stacks(200, shapes=[(4, 3, 2)] * 6)
    out = call("layer_selective_gaussian", factors, fraction=fraction)
    hit = torch.stack([changed(n.down, o.down) for n, o in zip(out, factors)], 1)  # (m, T)
    hit_up = torch.stack([changed(n.up, o.up) for n, o in zip(out, factors)], 1)
    assert torch.equal(hit, hit_up)  # down and up of a chosen target move together
    assert (hit.sum(1) == count).all()
    if count < 6:
        assert (hit.double().mean(0) - count / 6).abs().max() < 0.12  # targets chosen uniformly


def test_svd_structured_stays_in_the_subspace(helpers):
    """Column and row spaces of dW are kept; the rebuilt U, V are orthonormal and balanced."""
    factors = helpers.random_stacks(M, shapes=[(12, 9, 4), (9, 7, 4)], dtype=torch.float64)
    for new, old in zip(call("svd_structured", factors, epsilon=0.1), factors):
        dw, dw0 = helpers.delta(new), helpers.delta(old)
        q_col = torch.linalg.qr(old.up).Q  # column space of dW0, (m, e, r)
        q_row = torch.linalg.qr(old.down).Q  # row space of dW0, (m, d, r)
        assert torch.allclose(q_col @ (q_col.mT @ dw), dw, atol=1e-10)
        assert torch.allclose(dw @ q_row @ q_row.mT, dw, atol=1e-10)
        gram = new.down.mT @ new.down  # = diag(s) iff the rebuilt U is orthonormal
        assert torch.allclose(gram, torch.diag_embed(gram.diagonal(dim1=-2, dim2=-1)), atol=1e-10)
        assert torch.allclose(gram, new.up.mT @ new.up, atol=1e-10)
        ratio = torch.linalg.svdvals(dw)[:, :4] / torch.linalg.svdvals(dw0)[:, :4]  # rank 4
        assert ((ratio > math.exp(-0.6)) & (ratio < math.exp(0.6))).all()
        assert (ratio - 1).abs().max() > 1e-3  # s does change
        assert not torch.allclose(dw, dw0, atol=1e-3)  # and the directions rotate


def test_svd_structured_keeps_a_zero_adapter_zero():
    zero = Factors(torch.zeros(3, 5, 2), torch.zeros(3, 4, 2))
    new = call("svd_structured", [zero], epsilon=0.5)[0]
    assert (new.down == 0).all() and (new.up == 0).all()


@pytest.mark.parametrize(
    "rho,r,zeroed", [(0.3, 10, 3), (0.28, 25, 7), (0.3, 4, 2), (1.0, 3, 3), (0.0, 4, 0), (0.3, 1, 1)]
)
def test_component_masking_zeroes_exactly_ceil_rho_r(rho, r, zeroed, helpers):
    factors = helpers.random_stacks(M, shapes=[(26, 25, r)], dtype=torch.float64)  # 0.28 * 25 = 7.000000000000001
    new = call("component_masking", factors, rho=rho, epsilon=123.0)[0]  # epsilon is ignored
    s_new, s_old = torch.linalg.svdvals(helpers.delta(new)), torch.linalg.svdvals(helpers.delta(factors[0]))
    s_new, s_old = s_new[:, :r], s_old[:, :r]
    assert ((s_new < 1e-9).sum(1) == zeroed).all()
    kept = s_new[:, : r - zeroed]  # the survivors are the parent's own singular values
    assert ((kept.unsqueeze(-1) - s_old.unsqueeze(1)).abs().amin(-1) < 1e-9).all()


def test_component_masking_picks_components_at_random(helpers):
    factors = helpers.random_stacks(300, shapes=[(8, 8, 4)], dtype=torch.float64)
    new = call("component_masking", factors, rho=0.25)[0]
    s_old = torch.linalg.svdvals(helpers.delta(factors[0]))[:, :4]
    s_new = torch.linalg.svdvals(helpers.delta(new))[:, :4]
    survived = (s_old.unsqueeze(-1) - s_new.unsqueeze(1)).abs().amin(-1) < 1e-9  # (m, 4)
    assert (survived.sum(1) == 3).all()
    assert ((1 - survived.double().mean(0)) - 0.25).abs().max() < 0.08  # each component ~1/4 of the time


def test_option_errors(helpers):
    factors = helpers.random_stacks(M)
    with pytest.raises(InvalidValueError, match=r"`rho` must be in \[0, 1\], got 1.5"):
        call("component_masking", factors, rho=1.5)
    with pytest.raises(InvalidValueError, match=r"`fraction` must be in \(0, 1\], got 0"):
        call("layer_selective_gaussian", factors, fraction=0)
    with pytest.raises(InvalidTypeError, match=r"`rho` must be a real number in \[0, 1\], got str '0.3'"):
        call("component_masking", factors, rho="0.3")
    helpers.assert_same(
        call("component_masking", factors, rho=np.float64(0.5)),  # NumPy options pass
        call("component_masking", factors, rho=0.5),
    )
    with pytest.raises(ValueError, match="`epsilon` must be >= 0, got -0.1"):
        call("full_gaussian", factors, epsilon=-0.1)
