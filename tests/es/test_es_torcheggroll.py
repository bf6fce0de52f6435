"""The torcheggroll 0.2.0 contract: its README's Python snippets run against populora, in order, in one
namespace, with only the allowed substitutions; and its API's defaults, return types and errors."""

from __future__ import annotations

import inspect
import math
import re

import pytest
import torch
from torch import nn

import populora
from populora import (
    TorchEggrollES,
    compute_es_gradient,
    generate_lora_noise,
    generate_noise_for_shapes,
    generate_standard_noise,
)

# The Python snippets of the torcheggroll 0.2.0 README, verbatim and in README order (Quick Start,
# the noise utilities, the async three-step API, the vmap-style snippet, Checkpointing).
README_BLOCKS = [
    """
import torch
import torch.nn as nn
from torcheggroll import TorchEggrollES

# Define your model
model = nn.Sequential(
    nn.Linear(10, 20),
    nn.ReLU(),
    nn.Linear(20, 5)
)

# Create the ES optimizer
es = TorchEggrollES(
    model=model,
    pop_size=32,      # Population size (must be even for antithetic sampling)
    sigma=0.1,        # Noise scale
    lr=0.1,           # Learning rate
    rank=4,           # Rank for low-rank noise on matrices
    antithetic=True,  # Use antithetic sampling for lower variance
)

# Training data
x_train = torch.randn(64, 10)
y_train = torch.randn(64, 5)

# Define your loss function
def mse_loss(outputs, targets):
    return ((outputs - targets) ** 2).mean()

# Optimize!
for step in range(100):
    mean_fitness = es.step(x_train, mse_loss, y_train)
    print(f"Step {step}: fitness = {mean_fitness:.4f}")
""",
    """
from torcheggroll import generate_noise_for_shapes, compute_es_gradient
import torch

# Define parameter shapes and ranks
shapes = {"W1": (20, 10), "b1": (20,), "W2": (5, 20)}
ranks = {"W1": 4, "b1": None, "W2": 4}  # None = standard noise

# Generate noise for population
noise = generate_noise_for_shapes(
    shapes, ranks,
    pop_size=32,
    sigma=0.1,
    epoch=0,
    device=torch.device("cpu"),
)
# noise["W1"] shape: (32, 20, 10)
# noise["b1"] shape: (32, 20)

# After evaluating fitness...
rewards = torch.randn(32)  # fitness per population member

# Compute gradients
grads = compute_es_gradient(noise, rewards)
# grads["W1"] shape: (20, 10) - same as original param
""",
    """
import torch
from torcheggroll import TorchEggrollES

model = nn.Linear(10, 5)
es = TorchEggrollES(model, pop_size=32, sigma=0.1, lr=0.1)

# Step 1: Generate perturbed parameters
population = es.prepare_population()
# population is List[Dict[str, Tensor]], one dict per population member

# Step 2: Evaluate externally (your custom logic)
fitnesses = []
for params in population:
    # Custom evaluation - could be async LLM calls, etc.
    output = torch.func.functional_call(model, params, (inputs,))
    fitness = your_custom_fitness_fn(output)
    fitnesses.append(fitness)
fitnesses = torch.tensor(fitnesses)

# Step 3: Apply fitness scores and update
mean_fitness = es.apply_fitness_scores(fitnesses)
""",
    """
# Get stacked params for vmap
population = es.prepare_population()
stacked = es.get_stacked_params()  # Dict[name -> (pop_size, *shape)]

# Use vmap for parallel evaluation
from torch.func import vmap, functional_call

batched_forward = vmap(
    lambda *p: functional_call(model, dict(zip(stacked.keys(), p)), (inputs,)),
    in_dims=tuple(0 for _ in stacked)
)
all_outputs = batched_forward(*stacked.values())  # (pop_size, batch, ...)

# Compute fitness and apply
fitnesses = compute_fitness(all_outputs, targets)
mean_fitness = es.apply_fitness_scores(fitnesses)
""",
    """
# Save
state = es.state_dict()
torch.save(state, "checkpoint.pt")

# Load
state = torch.load("checkpoint.pt")
es.load_state_dict(state)
""",
]


def substitute(code: str) -> str:
    """The one allowed change to the code: import from populora instead of torcheggroll."""
    code = re.sub(r"^(\s*)from torcheggroll import", r"\1from populora import", code, flags=re.M)
    return re.sub(r"^(\s*)import torcheggroll\b", r"\1import populora as torcheggroll", code, flags=re.M)


def test_readme_blocks_run_in_order_in_one_namespace(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    namespace: dict = {
        # names the blocks use without defining them (allowed: defined beforehand)
        "inputs": torch.randn(8, 10),
        "targets": torch.randn(8, 5),
        "your_custom_fitness_fn": lambda output: -(output**2).mean().item(),
        "compute_fitness": lambda outputs, targets: -((outputs - targets) ** 2).mean(dim=(1, 2)),
    }
    for block in README_BLOCKS:
        code = substitute(block)
        assert "torcheggroll" not in code.replace("import populora as torcheggroll", "")
        exec(compile(code, "<torcheggroll README>", "exec"), namespace)  # the contract itself

    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 100 and printed[0].startswith("Step 0: fitness = ")
    first, last = (float(line.rsplit("= ", 1)[1]) for line in (printed[0], printed[-1]))
    assert last > first  # Quick Start: the fitness (negated MSE) improves
    assert namespace["noise"]["W1"].shape == (32, 20, 10) and namespace["noise"]["b1"].shape == (32, 20)
    assert namespace["grads"]["W1"].shape == (20, 10)
    assert namespace["all_outputs"].shape == (32, 8, 5)
    assert isinstance(namespace["mean_fitness"], float)
    es = namespace["es"]
    assert es.epoch == 2  # two apply_fitness_scores on the Linear(10, 5) ES, then reloaded at that point
    assert isinstance(namespace["state"], dict)


# --------------------------------------------------------------------------------------- API contract


def test_signatures_and_defaults_match_torcheggroll():
    sig = inspect.signature(TorchEggrollES)
    defaults = {k: v.default for k, v in sig.parameters.items()}
    assert list(defaults) == [
        "model",
        "pop_size",
        "sigma",
        "lr",
        "rank",
        "device",
        "param_filter",
        "normalize_fitness",
        "antithetic",
    ]
    assert defaults["pop_size"] == 32 and defaults["sigma"] == 0.02 and defaults["lr"] == 0.05
    assert defaults["rank"] == 4 and defaults["device"] is None and defaults["param_filter"] is None
    assert defaults["normalize_fitness"] is True and defaults["antithetic"] is True
    assert list(inspect.signature(generate_lora_noise).parameters) == ["param", "rank", "sigma", "seed", "device"]
    assert list(inspect.signature(generate_standard_noise).parameters) == ["param", "sigma", "seed", "device"]
    assert list(inspect.signature(generate_noise_for_shapes).parameters) == [
        "shapes",
        "ranks",
        "pop_size",
        "sigma",
        "epoch",
        "device",
        "dtype",
        "antithetic",
    ]
    assert list(inspect.signature(compute_es_gradient).parameters) == ["noise", "rewards", "normalize_fitness"]
    assert "TorchEggrollES" in populora.__all__


def test_step_returns_mean_fitness_as_float_and_uses_fixed_seed():
    torch.manual_seed(0)
    a, b = nn.Linear(4, 3), nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    x, y = torch.randn(6, 4), torch.randn(6, 3)
    es_a, es_b = TorchEggrollES(a, pop_size=8), TorchEggrollES(b, pop_size=8)
    mean = es_a.step(x, lambda o, t: ((o - t) ** 2).mean(), y)
    assert isinstance(mean, float)
    population = es_b.prepare_population()
    losses = torch.stack([((torch.func.functional_call(b, p, (x,)) - y) ** 2).mean() for p in population])
    assert es_b.apply_fitness_scores(-losses) == pytest.approx(mean, rel=1e-5)
    torch.testing.assert_close(a.weight, b.weight)  # same default seed: same noise, same update


def test_population_dicts_views_of_stacked_and_runtime_errors():
    es = TorchEggrollES(nn.Linear(4, 3), pop_size=4)
    with pytest.raises(RuntimeError, match=r"Call prepare_population\(\) first"):
        es.get_stacked_params()
    with pytest.raises(RuntimeError, match=r"Call prepare_population\(\) first"):
        es.apply_fitness_scores(torch.zeros(4))
    population = es.prepare_population()
    stacked = es.get_stacked_params()
    assert len(population) == 4 and set(population[0]) == {"weight", "bias"}
    assert (
        stacked["weight"].shape == (4, 3, 4) and population[2]["weight"].data_ptr() == stacked["weight"][2].data_ptr()
    )
    with pytest.raises(ValueError, match="Expected 4 fitness scores, got 3"):
        es.apply_fitness_scores(torch.zeros(3))
    assert es.apply_fitness_scores([1.0, 2.0, 3.0, 4.0]) == 2.5
    with pytest.raises(RuntimeError, match=r"Call prepare_population\(\) first"):
        es.get_stacked_params()  # the population was consumed by the update


def test_constructor_errors_match_torcheggroll():
    with pytest.raises(ValueError, match="pop_size must be even when using antithetic sampling"):
        TorchEggrollES(nn.Linear(3, 3), pop_size=31)
    with pytest.raises(ValueError, match="no parameters selected for ES"):
        TorchEggrollES(nn.Linear(3, 3), param_filter=lambda p, n: False)
    TorchEggrollES(nn.Linear(3, 3), pop_size=31, antithetic=False)


def test_param_filter_gets_param_then_name_or_name_only():
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    seen = []
    es = TorchEggrollES(model, param_filter=lambda p, n: seen.append((type(p), n)) or not n.startswith("1."))
    assert seen[0] == (nn.Parameter, "0.weight")
    assert es.param_names == ["0.weight", "0.bias", "2.weight", "2.bias"]
    es = TorchEggrollES(model, param_filter=lambda name: "bias" not in name and not name.startswith("1."))
    assert es.param_names == ["0.weight", "2.weight"]
    es = TorchEggrollES(model)  # "works with any nn.Module": the LayerNorm is perturbed too (fallback)
    assert es.param_names == ["0.weight", "0.bias", "1.weight", "1.bias", "2.weight", "2.bias"]


def test_normalize_fitness_false_is_mean_centring():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    es = TorchEggrollES(model, pop_size=4, sigma=0.1, lr=1.0, normalize_fitness=False)
    base = model.weight.detach().clone()
    noise = es.prepare_population() and {
        k: v - dict(model.named_parameters())[k].detach() for k, v in es.get_stacked_params().items()
    }
    f = torch.tensor([1.0, 2.0, 3.0, 10.0])
    es.apply_fitness_scores(f)
    expected = math.sqrt(4) * ((f - f.mean())[:, None, None] * noise["weight"]).mean(0)
    torch.testing.assert_close(model.weight.detach() - base, expected, rtol=1e-4, atol=1e-6)


def test_state_dict_loads_with_weights_only_and_resumes(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(5, 2)
    es = TorchEggrollES(model, pop_size=4)
    x, y = torch.randn(3, 5), torch.randn(3, 2)
    loss = lambda o, t: ((o - t) ** 2).mean()
    es.step(x, loss, y)
    torch.save(es.state_dict(), tmp_path / "c.pt")
    es.step(x, loss, y)
    other = TorchEggrollES(nn.Linear(5, 2), pop_size=4)
    other.load_state_dict(torch.load(tmp_path / "c.pt", weights_only=True))
    assert other.epoch == 1
    other.step(x, loss, y)
    assert torch.equal(other.model.weight, model.weight)


# --------------------------------------------------------------------------------------- noise utilities


def test_lora_and_standard_noise():
    p = torch.zeros(40, 30)
    n = generate_lora_noise(p, 4, 0.1, 7, torch.device("cpu"))
    assert n.shape == (40, 30) and torch.linalg.matrix_rank(n).item() == 4
    assert torch.equal(n, generate_lora_noise(p, 4, 0.1, 7, torch.device("cpu")))
    assert not torch.equal(n, generate_lora_noise(p, 4, 0.1, 8, torch.device("cpu")))
    big = generate_lora_noise(torch.zeros(300, 200), 4, 0.1, 0, torch.device("cpu"))
    assert abs(big.std().item() - 0.1) < 0.01  # divided by sqrt(r): entries have std sigma
    s = generate_standard_noise(torch.zeros(5000), 0.1, 0, torch.device("cpu"))
    assert s.shape == (5000,) and abs(s.std().item() - 0.1) < 0.01
    with pytest.raises(ValueError, match=r"`param` must be 2-D for low-rank noise, got shape \(5,\)"):
        generate_lora_noise(torch.zeros(5), 2, 0.1, 0, torch.device("cpu"))


def test_noise_for_shapes_antithetic_epochs_and_gradient():
    shapes, ranks = {"W": (6, 5), "b": (6,), "K": (2, 3, 4)}, {"W": 2, "b": None, "K": 2}
    noise = generate_noise_for_shapes(shapes, ranks, 8, 0.1, 0, torch.device("cpu"))
    assert noise["K"].shape == (8, 2, 3, 4)  # not 2-D: full noise
    assert torch.linalg.matrix_rank(noise["W"][0]).item() == 2
    for t in noise.values():
        assert torch.equal(t[:4], -t[4:])
    again = generate_noise_for_shapes(shapes, ranks, 8, 0.1, 0, torch.device("cpu"))
    later = generate_noise_for_shapes(shapes, ranks, 8, 0.1, 1, torch.device("cpu"))
    assert torch.equal(noise["W"], again["W"]) and not torch.equal(noise["W"], later["W"])
    plain = generate_noise_for_shapes(shapes, ranks, 7, 0.1, 0, torch.device("cpu"), antithetic=False)
    assert plain["W"].shape == (7, 6, 5) and not torch.equal(plain["W"][:3], -plain["W"][4:])
    assert generate_noise_for_shapes(shapes, ranks, 8, 0.1, 0, "cpu", dtype=torch.float64)["W"].dtype == torch.float64
    with pytest.raises(ValueError, match="pop_size must be even when using antithetic sampling"):
        generate_noise_for_shapes(shapes, ranks, 7, 0.1, 0, torch.device("cpu"))

    rewards = torch.randn(8)
    grads = compute_es_gradient(noise, rewards)
    z = (rewards - rewards.mean()) / (rewards.std(unbiased=False) + 1e-8)
    for name, t in noise.items():
        expected = math.sqrt(8) * (z.view(-1, *[1] * (t.dim() - 1)) * t).mean(0)
        torch.testing.assert_close(grads[name], expected)
    assert all((g == 0).all() for g in compute_es_gradient(noise, torch.ones(8)).values())
    with pytest.raises(ValueError, match=r"`rewards` has 7 values but noise\['W'\] has shape \(8, 6, 5\)"):
        compute_es_gradient(noise, torch.randn(7))


def test_noise_for_shapes_is_the_noise_eggroll_es_uses():
    """generate_noise_for_shapes(epoch=g)[name] == sigma * E_i of EggrollES(seed=0) at generation g."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 2))
    es = populora.EggrollES(model, 8, 0.1, 0.0, 2)
    es.tell(torch.arange(8.0))
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    noise = generate_noise_for_shapes(shapes, {n: 2 for n in shapes}, 8, 0.1, 1, torch.device("cpu"))
    for name, delta in es.perturbations().items():
        torch.testing.assert_close(noise[name], delta)


def test_a_torcheggroll_checkpoint_is_refused_saying_torcheggroll_files_are_not_supported(tmp_path):
    """A plain torch.save of a dict (what torcheggroll writes) is named as such and never unpickled."""
    from populora.errors import CheckpointError
    from populora.es import TorchEggrollES

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    foreign = {"epoch": 3, "sigma": 0.02, "lr": 0.05, "params": {k: v.clone() for k, v in model.state_dict().items()}}
    for legacy in (False, True):  # the zip format and torch's older pickle format
        path = tmp_path / f"tegg_{legacy}.pt"
        torch.save(foreign, path, _use_new_zipfile_serialization=not legacy)
        es = TorchEggrollES(model, pop_size=4, sigma=0.1, lr=0.1, rank=1)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        with pytest.raises(
            CheckpointError,
            match=r"is not a populora checkpoint but a plain torch.save file: populora reads only the checkpoints it "
            r"wrote \(TorchEggrollES.save\(\)\); this looks like a torcheggroll \(or other\) checkpoint: torcheggroll "
            r"files are not supported",
        ):
            es.load(path)
        assert es.epoch == 0 and all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
        with pytest.raises(CheckpointError, match=r"\(EggrollES.save\(\)\); this looks like a torcheggroll"):
            es.es.load(path)
    other = tmp_path / "other.bin"
    other.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match=r"is not a populora checkpoint \(it starts with b'not a chec"):
        TorchEggrollES(model, pop_size=4, sigma=0.1, lr=0.1, rank=1).load(other)
