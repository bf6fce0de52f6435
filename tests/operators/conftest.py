"""Fixtures parametrised over every registered operator, so each gets the common contract free.

Shapes follow shared/DESIGN.md: ``down (p, d, r)``, ``up (p, e, r)``.
"""

from __future__ import annotations

import pytest
import torch

from populora.operators import CROSSOVERS, MUTATIONS, PARENT_SELECTIONS, SELECTIONS, Factors

# Operators that draw no random numbers (same output whatever the seed).
DETERMINISTIC = {"deterministic", "average", "average_delta"}
# Crossovers that need exactly two parents per child.
TWO_PARENTS = {"svd_subspace", "extrapolative"}

# (d, e, r) per target: rank 1; a typical layer; r == d == e; r > min(d, e)
# (effective rank 2, surplus columns zero).
SHAPES = [(6, 5, 1), (9, 7, 4), (5, 5, 5), (7, 2, 4)]
DTYPES = [torch.float32, torch.float64, torch.bfloat16]


@pytest.fixture(params=sorted(SELECTIONS))
def selection_name(request) -> str:
    return request.param


@pytest.fixture(params=sorted(PARENT_SELECTIONS))
def parent_selection_name(request) -> str:
    return request.param


@pytest.fixture(params=sorted(CROSSOVERS))
def crossover_name(request) -> str:
    return request.param


@pytest.fixture(params=sorted(MUTATIONS))
def mutation_name(request) -> str:
    return request.param


@pytest.fixture(params=DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def dtype(request) -> torch.dtype:
    return request.param


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_stacks(pop: int, shapes=SHAPES, dtype=torch.float32, seed: int = 0) -> list[Factors]:
    """Random factors with the surplus columns (beyond ``min(r, d, e)``) zero, like the population's."""
    g = gen(seed)
    out = []
    for d, e, r in shapes:
        keep = (torch.arange(r) < min(r, d, e)).to(torch.float64)
        down = torch.randn(pop, d, r, generator=g, dtype=torch.float64) * keep
        up = torch.randn(pop, e, r, generator=g, dtype=torch.float64) * keep
        out.append(Factors(down.to(dtype), up.to(dtype)))
    return out


def delta(f: Factors) -> torch.Tensor:
    """``dW = up @ down^T`` in float64, ``(p, e, d)``."""
    return f.up.double() @ f.down.double().mT


def clone(stacks) -> list[Factors]:
    return [Factors(s.down.clone(), s.up.clone()) for s in stacks]


def assert_same(a, b) -> None:
    """Bitwise equality of two lists of Factors."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x.down, y.down) and torch.equal(x.up, y.up)


@pytest.fixture
def helpers():
    """The module-level helpers, for test files (conftest is not importable as a module)."""
    import types

    return types.SimpleNamespace(
        gen=gen,
        random_stacks=random_stacks,
        delta=delta,
        clone=clone,
        assert_same=assert_same,
        SHAPES=SHAPES,
        DETERMINISTIC=DETERMINISTIC,
        TWO_PARENTS=TWO_PARENTS,
    )
