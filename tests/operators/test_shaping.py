"""Fitness shaping shared by GA and ES (higher is better)."""

from __future__ import annotations

import pytest
import torch

from populora.errors import FitnessError
from populora.operators import centered_rank, fuss_weights, zscore


def test_zscore_standardises_and_centres_constants():
    f = torch.tensor([[1.0, 2.0, 3.0, 6.0], [5.0, 5.0, 5.0, 5.0]])
    z = zscore(f)
    assert torch.allclose(z[0].mean(), torch.tensor(0.0), atol=1e-6)
    assert torch.allclose(z[0].std(unbiased=False), torch.tensor(1.0), atol=1e-6)
    assert (z[1] == 0).all()
    assert torch.allclose(zscore(1e6 * f[0] + 3), z[0], atol=1e-5)  # affine invariant
    assert torch.allclose(zscore(f.T, dim=0), z.T)


def test_zscore_upcasts():
    assert zscore(torch.arange(4.0).bfloat16()).dtype == torch.float32
    assert zscore(torch.arange(4.0).double()).dtype == torch.float64


def test_centered_rank_ties_share_their_mean_rank():
    r = centered_rank(torch.tensor([3.0, -1.0, 3.0, 0.0, 10.0]))
    assert torch.allclose(r, torch.tensor([0.125, -0.5, 0.125, -0.25, 0.5]))
    assert (centered_rank(torch.ones(2, 4)) == 0).all() and (centered_rank(torch.ones(1)) == 0).all()
    assert torch.equal(centered_rank(torch.tensor([[2.0, 1.0]]).T, dim=0), torch.tensor([[0.5], [-0.5]]))


def test_fuss_weights_are_cell_widths_in_original_order():
    f = torch.tensor([10.0, 0.0, 1.0, 3.0])
    # sorted 0, 1, 3, 10: widths 0.5, 1.5, 4.5, 3.5; floor 0.01 * 10 / 3
    expected = torch.tensor([3.5, 0.5, 1.5, 4.5]) + 0.1 / 3
    assert torch.allclose(fuss_weights(f), expected / expected.sum())


def test_fuss_weights_ties_share_a_cell_and_nothing_is_zero():
    w = fuss_weights(torch.tensor([1.0, 1.0, 2.0, 1.0]))
    assert w[0] == w[1] == w[3] and (w > 0).all() and w[2] > w[0]
    assert torch.allclose(fuss_weights(torch.full((2, 5), 7.0)), torch.full((2, 5), 0.2))
    assert torch.allclose(fuss_weights(torch.tensor([[1.0, 2.0], [4.0, 0.0]]), dim=0).sum(0), torch.ones(2))


def test_infinities_count_as_the_extremes():
    f = torch.tensor([1.0, -float("inf"), 2.0, float("inf")])
    for fn in (zscore, centered_rank, fuss_weights):
        assert torch.isfinite(fn(f)).all()
    assert torch.equal(zscore(f), zscore(torch.tensor([1.0, 1.0, 2.0, 2.0])))


@pytest.mark.parametrize("fn", [zscore, centered_rank, fuss_weights])
def test_nan_raises(fn):
    with pytest.raises(FitnessError, match="contains NaN"):
        fn(torch.tensor([1.0, float("nan")]))


@pytest.mark.parametrize("fn", [zscore, centered_rank, fuss_weights])
@pytest.mark.parametrize(
    "bad, named",
    [
        ("abc", "str"),
        ({"a": 1.0}, "dict"),
        ([1.0, 2.0], "list"),
        (torch.zeros(2, dtype=torch.complex64), "dtype torch.complex64"),
    ],
)
def test_non_numeric_raises_naming_the_type(fn, bad, named):
    with pytest.raises(FitnessError, match=rf"`f` must be a (torch.Tensor of real numbers|real tensor), got {named}"):
        fn(bad)


@pytest.mark.parametrize("fn", [zscore, centered_rank, fuss_weights])
def test_float64_is_kept(fn):
    f = 1e8 + torch.tensor([0.0, 3.0, 1.0, 2.0], dtype=torch.float64)
    out = fn(f)
    assert out.dtype == torch.float64 and len(set(out.tolist())) > 1  # float32 would see four equal values
    if fn is not fuss_weights:
        assert out.argmax().item() == 1


def test_zscore_mask_counts_only_the_masked_entries():
    f = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 4.0, 7.0, 7.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    z = zscore(f, mask=mask)
    torch.testing.assert_close(z[0, :3], zscore(f[0, :3]))
    assert z[0, 3] == 0
    torch.testing.assert_close(z[1], zscore(f[1]))


def test_trusted_fitnesses_skips_the_scan_only_inside():
    from populora.operators import check_real_tensor, trusted_fitnesses

    nan = torch.tensor([1.0, float("nan")])
    with trusted_fitnesses():
        assert check_real_tensor(nan) is nan  # the caller validated: no scan, no copy
        assert check_real_tensor(torch.tensor([1, 2])).dtype == torch.float32  # still cast
    with pytest.raises(FitnessError, match="contains NaN"):
        check_real_tensor(nan)
