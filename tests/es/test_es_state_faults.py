"""EggrollES state across optimizer classes: a state saved with another optimizer class is refused, naming both,
before anything is written; states saved before the class was recorded are accepted only when their optimizer
state fits."""

from __future__ import annotations

import copy

import pytest
import torch
from models import mlp
from torch import nn

from populora import EggrollES
from populora.errors import CheckpointError
from populora.optim import ClipUp


def loss(out, target):
    return ((out - target) ** 2).mean()


def data():
    gen = torch.Generator().manual_seed(11)
    return torch.randn(5, 6, generator=gen), torch.randn(5, 3, generator=gen)


OPTIMIZERS = {
    "adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "clipup": lambda p: ClipUp(p, lr=0.01),
    "sgd": lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9),
}
NAMES = {"adam": "torch.optim.adam.Adam", "clipup": "populora.optim.ClipUp", "sgd": "torch.optim.sgd.SGD"}


def make(kind: str, seed: int = 0, steps: int = 0) -> tuple[EggrollES, nn.Module]:
    torch.manual_seed(seed)
    model = mlp()
    es = EggrollES(model, 6, 0.1, None, 2, seed=5, optimizer=OPTIMIZERS[kind])
    x, y = data()
    for _ in range(steps):
        es.step(x, loss, y)
    return es, model


def everything(es: EggrollES, model: nn.Module) -> dict:
    return {
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
        "optimizer": copy.deepcopy(es.optimizer.state_dict()),
        "counters": (es.generation, es.seed, es.sigma, es.best_fitness, len(es.history)),
    }


def assert_same(a, b, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def test_state_dict_records_the_optimizer_class():
    for kind, name in NAMES.items():
        es, _ = make(kind)
        assert es.state_dict()["optimizer_class"] == name


@pytest.mark.parametrize("saved, loading", [("adam", "clipup"), ("clipup", "adam"), ("sgd", "clipup"), ("adam", "sgd")])
@pytest.mark.parametrize("legacy", [False, True], ids=["recorded", "legacy"])
def test_a_state_of_another_optimizer_class_is_refused_before_anything_is_written(saved, loading, legacy):
    source, _ = make(saved, seed=1, steps=2)
    state = source.state_dict()
    if legacy:  # a state written before the class was recorded: its optimizer state's keys tell
        del state["optimizer_class"]
    es, model = make(loading, seed=0, steps=1)
    before = everything(es, model)
    with pytest.raises(CheckpointError) as info:
        es.load_state_dict(state)
    text = str(info.value)
    if legacy:
        assert type(es.optimizer).__name__ in text and "option" in text
    else:
        assert NAMES[saved] in text and NAMES[loading] in text
    assert_same(everything(es, model), before)
    x, y = data()
    es.step(x, loss, y)  # the run goes on with its own optimizer (no KeyError mid-generation)


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_a_legacy_state_of_the_same_optimizer_class_loads_and_resumes_exactly(kind):
    straight, _ = make(kind, seed=1, steps=3)
    first, _ = make(kind, seed=1, steps=2)
    state = first.state_dict()
    del state["optimizer_class"]
    resumed, model = make(kind, seed=0)
    resumed.load_state_dict(state)
    x, y = data()
    resumed.step(x, loss, y)
    assert_same(resumed.state_dict()["params"], straight.state_dict()["params"])


def test_a_state_of_the_same_class_from_another_module_path_loads():
    """The class is compared by its name: a class moved to another module (a refactor) still loads."""
    source, _ = make("clipup", seed=1, steps=2)
    state = source.state_dict()
    state["optimizer_class"] = "populora.old_place.ClipUp"
    es, _ = make("clipup")
    es.load_state_dict(state)
    assert es.generation == 2


@pytest.mark.parametrize("value", [None, 3, "", ["ClipUp"]])
def test_a_bad_optimizer_class_entry_is_refused(value):
    source, _ = make("clipup", seed=1, steps=1)
    state = source.state_dict()
    state["optimizer_class"] = value
    es, model = make("clipup")
    before = everything(es, model)
    with pytest.raises(CheckpointError, match="optimizer_class"):
        es.load_state_dict(state)
    assert_same(everything(es, model), before)


def test_a_clipup_state_with_an_option_out_of_range_is_refused_and_changes_nothing():
    source, _ = make("clipup", seed=1, steps=2)
    state = source.state_dict()
    state["optimizer"]["param_groups"][0]["eps"] = -1.0
    es, model = make("clipup", steps=1)
    before = everything(es, model)
    with pytest.raises(CheckpointError, match=r"param_groups\[0\]\['eps'\]"):
        es.load_state_dict(state)
    assert_same(everything(es, model), before)


def test_a_legacy_clipup_state_from_before_per_individual_loads():
    """ClipUp groups saved before the `per_individual` option existed get its default on load (as torch's own
    optimizers fill options added since), so such a state fits a ClipUp ES."""
    straight, _ = make("clipup", seed=1, steps=3)
    first, _ = make("clipup", seed=1, steps=2)
    state = first.state_dict()
    del state["optimizer_class"]
    for group in state["optimizer"]["param_groups"]:
        group.pop("per_individual", None)
    resumed, _ = make("clipup", seed=0)
    resumed.load_state_dict(state)
    assert all(group["per_individual"] is False for group in resumed.optimizer.param_groups)
    x, y = data()
    resumed.step(x, loss, y)
    assert_same(resumed.state_dict()["params"], straight.state_dict()["params"])
