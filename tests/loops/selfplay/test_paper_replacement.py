"""The paper's replacement (populora.loops.selfplay.replacement): who is replaced, ratings reset to the prior,
optimizer rows inherited from the first parent, operators and parents drawn from the population's generator,
distinct crossover parents, all or nothing; PaperRatings' draw margin."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("openskill")

from torch import nn

from populora import Population
from populora.errors import CheckpointError
from populora.loops.selfplay import PAPER_CROSSOVERS, PAPER_MUTATIONS, PaperRatings, draw_margin, replace_


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 5)
        self.b = nn.Linear(5, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def setup(pop_size: int = 4, mu: list[float] | None = None, seed: int = 0):
    torch.manual_seed(0)
    pop = Population(Net(), pop_size, 3, seed=seed, init_scale=0.5, requires_grad=True)
    opt = torch.optim.Adam(pop.adapter_parameters(), lr=1e-2)
    x = torch.randn(pop_size * 2, 6)
    loss = pop(x, all_individuals=True).square().sum()
    loss.backward()
    opt.step()  # every row of the state differs
    ratings = PaperRatings({"s": pop_size})
    if mu is not None:
        state = ratings.state_dict()
        state["mu"]["s"] = torch.tensor(mu, dtype=torch.float64)
        ratings.load_state_dict(state)
    return pop, opt, ratings


def rows(opt: torch.optim.Optimizer, i: int) -> list[torch.Tensor]:
    return [v[i].clone() for state in opt.state.values() for v in state.values() if v.dim() > 0]


def factors(pop: Population, i: int) -> list[torch.Tensor]:
    return [t[i].detach().clone() for f in pop.factors() for t in f]


def test_the_bottom_is_replaced_reset_and_inherits_its_parents_rows():
    pop, opt, ratings = setup(4, mu=[30.0, 20.0, 26.0, 28.0])
    before = {i: factors(pop, i) for i in range(4)}
    rows_before = {i: rows(opt, i) for i in range(4)}
    rec = replace_(pop, ratings, "s", optimizer=opt, fraction=0.25, step=9)
    assert rec.children == (1,) and rec.step == 9 and rec.name == "s"  # the lowest mu - 3 sigma
    assert rec.keys == pytest.approx([30 - 25, 20 - 25, 26 - 25, 28 - 25])
    a, b = rec.parents[0]
    assert a in (0, 3) and b in (0, 3)  # the top max(1, 2) = 2: ids 0 and 3
    assert ratings.mu("s")[1] == 25.0 and ratings.sigma("s")[1] == pytest.approx(25 / 3)
    assert ratings.mu("s")[[0, 2, 3]].tolist() == [30.0, 26.0, 28.0]
    for got, want in zip(rows(opt, 1), rows_before[a]):
        assert torch.equal(got, want)  # the first parent's Adam rows
    for i in (0, 2, 3):  # survivors untouched
        assert all(torch.equal(x, y) for x, y in zip(factors(pop, i), before[i]))
        assert all(torch.equal(x, y) for x, y in zip(rows(opt, i), rows_before[i]))
    assert not all(torch.equal(x, y) for x, y in zip(factors(pop, 1), before[1]))


def test_draws_come_from_the_population_generator():
    pop, opt, ratings = setup(8, mu=[float(v) for v in range(8)])
    state = pop.generator.get_state()
    rec = replace_(pop, ratings, "s", optimizer=opt, fraction=0.25)
    assert rec.children == (0, 1)
    pool = torch.tensor([7, 6])  # top 2 by ordinal, descending
    g = torch.Generator().manual_seed(0)
    g.set_state(state)
    for j in range(2):  # replay: u, operator, parents, in child order
        u = float(torch.rand((), generator=g))
        crossed = u < 0.5
        ops = PAPER_CROSSOVERS if crossed else PAPER_MUTATIONS
        op = ops[int(torch.randint(len(ops), (), generator=g))]
        if crossed:
            pick = torch.randperm(2, generator=g)[:2]
            parents = (int(pool[pick[0]]), int(pool[pick[1]]))
        else:
            parents = (int(pool[int(torch.randint(2, (), generator=g))]),) * 2
        assert (rec.crossed[j], rec.operators[j], rec.parents[j]) == (crossed, op, parents)


@pytest.mark.parametrize("rate", [0.0, 1.0])
def test_crossover_rate_and_distinct_parents(rate):
    for seed in range(4):
        pop, opt, ratings = setup(8, mu=[float(v) for v in range(8)], seed=seed)
        rec = replace_(pop, ratings, "s", optimizer=opt, fraction=0.5, crossover_rate=rate)
        assert rec.children == (0, 1, 2, 3)
        assert all(c == (rate == 1.0) for c in rec.crossed)
        for (a, b), op in zip(rec.parents, rec.operators):
            assert a in (4, 5, 6, 7) and b in (4, 5, 6, 7)
            if rate == 1.0:
                assert a != b and op in PAPER_CROSSOVERS
            else:
                assert a == b and op in PAPER_MUTATIONS


def test_one_individual_is_never_replaced():
    pop, opt, ratings = setup(1)
    assert replace_(pop, ratings, "s", optimizer=opt) is None


def test_a_failure_restores_everything(monkeypatch):
    pop, opt, ratings = setup(4, mu=[30.0, 20.0, 26.0, 28.0])
    snap, gen = pop.snapshot(), pop.generator.get_state()
    opt_rows = {i: rows(opt, i) for i in range(4)}
    r_state = ratings.state_dict()
    real = ratings.reset_

    def failing(name, ids):
        real(name, ids)
        raise RuntimeError("injected")

    monkeypatch.setattr(ratings, "reset_", failing)
    with pytest.raises(RuntimeError, match="injected"):
        replace_(pop, ratings, "s", optimizer=opt, crossover_rate=0.0)
    assert torch.equal(pop.generator.get_state(), gen)
    for name, value in pop.snapshot().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, snap[name]), name
    assert all(torch.equal(x, y) for i in range(4) for x, y in zip(rows(opt, i), opt_rows[i]))
    assert torch.equal(ratings.mu("s"), r_state["mu"]["s"])


def test_paper_ratings_use_the_draw_margin():
    r = PaperRatings({"t": 2, "s": 2})
    assert r.model_name == "ThurstoneMostellerFull"
    assert r.draw_margin == pytest.approx(draw_margin(0.1, 25 / 6))
    other = PaperRatings({"t": 2, "s": 2}, draw_probability=0.0)
    r.rate_(("t", 0), ("s", 0), 0.5)
    other.rate_(("t", 0), ("s", 0), 0.5)
    # a draw between equal players: a wider draw region makes a draw less informative (sigma shrinks less)
    assert r.sigma("t")[0] > other.sigma("t")[0]
    with pytest.raises(CheckpointError, match="draw_probability"):
        other.load_state_dict(r.state_dict())
