"""The one routed-model front end (populora.routing): Population and the ES individuals share it."""

import pytest
import torch
from models import routed_call
from torch import nn

import populora.routing.front as routing
from populora import EggrollES, Population
from populora.errors import InvalidIndexError, InvalidTypeError, RouteError
from populora.routing.front import RoutedModel
from populora.routing.request import parse_route


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))


def test_population_split_gives_the_es_layout_of_the_same_rows():
    pop = Population(mlp(), pop_size=4, low_rank=2, seed=1)
    x = torch.randn(3, 5)
    flat = pop(x, all_individuals=True, broadcast=True)
    split = pop(x, all_individuals=True, broadcast=True, split=True)
    assert flat.shape == (12, 3) and split.shape == (4, 3, 3)
    assert torch.equal(split, flat.view(4, 3, 3))  # one computation, a reshape on top
    ids = [2, 0]
    rows = torch.randn(4, 5)  # split (p b): 2 rows per id
    assert torch.equal(pop(rows, individuals=ids, split=True), pop(rows, individuals=ids).view(2, 2, 3))
    one = pop(x, individual=1, split=True)  # a single individual keeps (b, ...)
    assert one.shape == (3, 3) and torch.equal(one, pop(x, individual=1))


def test_es_individuals_flat_layout_is_populations_default():
    es = EggrollES(mlp(), pop_size=4, sigma=0.1, lr=0.1, rank=2)
    x = torch.randn(3, 5)
    individuals = es.ask()
    split = individuals(x)
    flat = individuals(x, split=False)
    assert split.shape == (4, 3, 3) and flat.shape == (12, 3)
    assert torch.equal(flat, split.reshape(12, 3))


def test_population_and_es_individuals_parse_routing_arguments_in_one_place(monkeypatch):
    calls = []
    original = routing.parse_route

    def counting(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(routing, "parse_route", counting)
    pop = Population(mlp(), pop_size=4, low_rank=2)
    es = EggrollES(mlp(), pop_size=4, sigma=0.1, lr=0.1, rank=2)
    x = torch.randn(2, 5)
    pop(x, all_individuals=True, broadcast=True)
    es.ask()(x)
    assert len(calls) == 2
    assert isinstance(pop, RoutedModel) and isinstance(es.ask(), RoutedModel)
    assert type(pop)._route is RoutedModel._route and type(es.ask())._route is RoutedModel._route


def test_es_individuals_hold_no_reference_to_the_es():
    es = EggrollES(mlp(), pop_size=4, sigma=0.1, lr=0.1, rank=2)
    individuals = es.ask()
    assert not any(value is es for value in vars(individuals).values())
    assert individuals._routing_target().router is es.router


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(individual=1, per_individual=True), RouteError, r"`per_individual=True` needs"),
        (dict(all_individuals=True, per_individual=True, broadcast=True), RouteError, "cannot be combined"),
        (dict(individual=1, individuals=[0]), RouteError, "at most one of"),
        (dict(all_individuals=True, split="yes"), InvalidTypeError, "split"),
        (dict(individual=4), InvalidIndexError, r"\[0, 4\)"),
    ],
)
def test_parse_route_refuses_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        parse_route(4, **kwargs)


def test_bad_split_raises_before_the_model_runs():
    model = mlp()
    pop = Population(model, pop_size=4, low_rank=2)
    ran = []
    model[0].register_forward_pre_hook(lambda *_: ran.append(1))
    with pytest.raises(InvalidTypeError, match="split"):
        pop(torch.randn(1, 5), all_individuals=True, split=1.5)
    assert ran == []


def test_per_individual_inputs_route_one_block_per_individual():
    pop = Population(mlp(), pop_size=4, low_rank=2, seed=3)
    xs = torch.randn(4, 2, 5)
    out = routed_call(
        pop.model, pop._router, pop.adapters(), 4, (xs,), {}, all_individuals=True, per_individual=True, split=True
    )
    assert out.shape == (4, 2, 3)
    for i in range(4):
        torch.testing.assert_close(out[i], pop(xs[i], individual=i))
    with pytest.raises(RouteError, match=r"shape \(4, b, ...\).*got \(3, 2, 5\)"):
        routed_call(pop.model, pop._router, pop.adapters(), 4, (xs[:3],), {}, all_individuals=True, per_individual=True)


class Gain(nn.Module):
    """An unroutable parameter: the ES evaluates it through the functional_call fallback."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 3)
        self.gain = nn.Parameter(torch.ones(3))

    def forward(self, x):
        return self.lin(x) * self.gain


def test_fallback_individuals_take_the_same_arguments_and_layouts():
    torch.manual_seed(0)
    es = EggrollES(Gain(), pop_size=4, sigma=0.1, lr=0.1, rank=2, perturb_unroutable=True)
    x = torch.randn(3, 5)
    individuals = es.ask()
    split = individuals(x)
    flat = individuals(x, split=False)
    assert split.shape == (4, 3, 3) and flat.shape == (12, 3)
    assert torch.equal(flat, split.reshape(12, 3))
    with pytest.raises(InvalidIndexError, match=r"holds id 7, out of range \[0, 4\)"):
        individuals(x, individuals=[1, 7])
    with pytest.raises(InvalidIndexError, match=r"`individual` must be an id in \[0, 4\), got 4"):
        individuals(x, individual=4)
