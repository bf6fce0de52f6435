"""populora.adapters: the one home of Factors, Adapter and the conversions between their layouts."""

from __future__ import annotations

import torch
from torch import nn

import populora
from populora import adapters, operators
from populora.adapters import Adapter, Factors, to_adapter, to_factors, weight_adapter
from populora.routing import delta as routing_delta


def test_one_class_each_everywhere():
    assert operators.Factors is Factors is populora.Factors
    assert routing_delta.Adapter is Adapter
    from populora.es import factors as es_factors

    assert es_factors.Adapter is Adapter


def test_conversions_are_views_and_inverse():
    down, up = torch.randn(4, 3, 2), torch.randn(4, 5, 2)
    for embedding in (False, True):
        a = to_adapter(Factors(down, up), embedding)
        assert a.up.shape == (4, 2, 5) and a.down.shape == ((4, 3, 2) if embedding else (4, 2, 3))
        assert a.down.data_ptr() == down.data_ptr() and a.up.data_ptr() == up.data_ptr()
        back = to_factors(a, embedding)
        assert torch.equal(back.down, down) and torch.equal(back.up, up)


def test_population_routes_what_its_factors_say():
    """The layouts agree with the layer: a routed Linear adds up @ down.T of the individual's factors."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5))
    pop = populora.Population(model, 4, 2, seed=1)
    x = torch.randn(2, 3)
    down, up = pop.factors()[0]
    want = model[0](x) + x @ (up[2] @ down[2].T).T
    torch.testing.assert_close(pop(x, individual=2), want)
    torch.testing.assert_close(pop.forward_factors(pop.factors(), x, individual=2), want)


def test_weight_adapter_adds_rows_t_cols():
    rows, cols = torch.randn(2, 3, 5), torch.randn(2, 3, 4)  # Linear W (5, 4): rows (p, r, e), cols (p, r, d)
    a = weight_adapter(rows, cols, embedding=False)
    f = to_factors(a, embedding=False)
    torch.testing.assert_close(f.up[1] @ f.down[1].T, rows[1].T @ cols[1])
    e = weight_adapter(rows, cols, embedding=True)  # Embedding W (5, 4): rows (p, r, V), cols (p, r, e)
    fe = to_factors(e, embedding=True)
    torch.testing.assert_close(fe.down[1] @ fe.up[1].T, rows[1].T @ cols[1])
    assert adapters.__all__ == ["Adapter", "Factors", "to_adapter", "to_factors", "weight_adapter"]
