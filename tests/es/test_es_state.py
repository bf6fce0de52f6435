"""ES state and precision: all-or-nothing loads, verified checkpoint files, snapshots, float64 throughout."""

from __future__ import annotations

import math

import pytest
import torch
from models import mlp
from torch import nn

from populora import EggrollES, TorchEggrollES, compute_es_gradient, generate_noise_for_shapes
from populora.errors import CheckpointError
from populora.es.noise import draw_noise


def loss(out, target):
    return ((out - target) ** 2).mean()


def data():
    gen = torch.Generator().manual_seed(11)
    return torch.randn(5, 6, generator=gen), torch.randn(5, 3, generator=gen)


def adam_es(seed: int = 0) -> tuple[EggrollES, nn.Module]:
    torch.manual_seed(seed)
    model = mlp()
    return EggrollES(model, 6, 0.1, None, 2, seed=5, optimizer=lambda p: torch.optim.Adam(p, lr=0.01)), model


def run(es, steps: int) -> None:
    x, y = data()
    for _ in range(steps):
        es.step(x, loss, y)


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


# --------------------------------------------------------------------------------------- all or nothing


@pytest.mark.parametrize(
    "key", ["sigma", "seed", "best_fitness", "best_member", "generation", "params", "optimizer", "config"]
)
def test_load_state_dict_with_a_missing_key_changes_nothing(key):
    source, _ = adam_es(seed=1)
    run(source, 2)
    state = source.state_dict()
    del state[key]
    es, model = adam_es(seed=0)
    run(es, 1)
    before, opt_before = snapshot(model), es.optimizer.state_dict()
    with pytest.raises(CheckpointError, match=f"missing \\['{key}'\\]"):
        es.load_state_dict(state)
    assert_same(snapshot(model), before)
    assert es.generation == 1 and es.seed == 5 and es.sigma == 0.1
    assert torch.equal(es.optimizer.state_dict()["state"][0]["exp_avg"], opt_before["state"][0]["exp_avg"])


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("sigma", -1.0, "bad 'sigma'"),
        ("sigma", "x", "bad 'sigma'"),
        ("seed", 1.5, "bad 'seed'"),
        ("generation", -3, "bad 'generation'"),
        ("best_fitness", float("nan"), "bad 'best_fitness'"),
        ("best_member", [0, 99], "bad 'best_member'"),
        ("best_member", "x", "bad 'best_member'"),
        ("params", {"0.weight": torch.zeros(16, 6)}, "missing parameter '0.bias'"),
        ("optimizer", {"state": {}, "param_groups": []}, "parameter groups of sizes"),
        ("optimizer", [1, 2], "bad 'optimizer'"),
        ("config", None, "bad 'config'"),
        ("format", "other/1", "not an EggrollES state dict"),
    ],
)
def test_load_state_dict_with_a_bad_value_changes_nothing(key, value, message):
    source, _ = adam_es(seed=1)
    run(source, 2)
    state = source.state_dict()
    state[key] = value
    es, model = adam_es(seed=0)
    run(es, 1)
    before = snapshot(model)
    with pytest.raises(CheckpointError, match=message):
        es.load_state_dict(state)
    assert_same(snapshot(model), before)
    assert es.generation == 1


def test_load_state_dict_with_a_bad_parameter_shape_or_config_names_it():
    es, model = adam_es()
    state = es.state_dict()
    state["params"]["2.weight"] = torch.zeros(3, 5)
    with pytest.raises(CheckpointError, match=r"'2.weight' has shape \(3, 5\), expected \(3, 16\)"):
        es.load_state_dict(state)
    state = es.state_dict()
    del state["config"]["noise_reuse"]
    with pytest.raises(CheckpointError, match="config is missing 'noise_reuse'"):
        es.load_state_dict(state)
    state = es.state_dict()
    state["config"]["pop_size"] = 8
    with pytest.raises(CheckpointError, match="checkpoint has pop_size=8, this ES has 6"):
        es.load_state_dict(state)


def test_torch_eggroll_load_state_dict_is_all_or_nothing_too():
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    es = TorchEggrollES(model, pop_size=4)
    es.step(torch.randn(2, 4), loss, torch.zeros(2, 3))
    state = es.state_dict()
    del state["sigma"]
    es.step(torch.randn(2, 4), loss, torch.zeros(2, 3))
    before = snapshot(model)
    with pytest.raises(CheckpointError, match=r"missing \['sigma'\]"):
        es.load_state_dict(state)
    assert_same(snapshot(model), before)
    assert es.epoch == 2


# --------------------------------------------------------------------------------------- snapshots


def test_state_dict_is_a_snapshot_and_can_be_loaded_twice():
    """Stepping after state_dict() changes nothing in it; loading it twice restores the same point twice
    (the optimizer's loaded state is a copy, so the steps after a load do not write into the saved state)."""
    es, model = adam_es()
    run(es, 2)
    saved_params = snapshot(model)
    state = es.state_dict()
    run(es, 2)
    assert_same({n: state["params"][n] for n in saved_params}, saved_params)
    es.load_state_dict(state)
    assert_same(snapshot(model), saved_params)
    assert es.generation == 2
    run(es, 2)
    after_first = snapshot(model)
    es.load_state_dict(state)
    assert_same(snapshot(model), saved_params)
    run(es, 2)
    assert_same(snapshot(model), after_first)


# --------------------------------------------------------------------------------------- files


@pytest.mark.parametrize("cls", ["EggrollES", "TorchEggrollES"])
def test_save_load_resumes_bitwise(tmp_path, cls):
    def fresh():
        torch.manual_seed(0)
        model = mlp()
        if cls == "EggrollES":
            return EggrollES(model, 6, 0.1, None, 2, seed=5, optimizer=lambda p: torch.optim.Adam(p, lr=0.01)), model
        return TorchEggrollES(model, pop_size=6, sigma=0.1, lr=0.1, rank=2), model

    straight, model_a = fresh()
    run(straight, 5)
    first, _ = fresh()
    run(first, 2)
    path = first.save(tmp_path / "sub" / "es.ckpt")
    assert path == tmp_path / "sub" / "es.ckpt" and path.is_file()
    resumed, model_b = fresh()
    resumed.load(str(path))
    run(resumed, 3)
    assert_same(snapshot(model_b), snapshot(model_a))
    es = resumed.es if cls == "TorchEggrollES" else resumed
    other = straight.es if cls == "TorchEggrollES" else straight
    assert es.generation == other.generation == 5 and es.best_fitness == other.best_fitness


def damaged_files(tmp_path, good):
    data = good.read_bytes()
    (tmp_path / "empty.ckpt").write_bytes(b"")
    (tmp_path / "truncated.ckpt").write_bytes(data[: len(data) // 2])
    (tmp_path / "text.ckpt").write_text("this is not a checkpoint\n")
    flipped = bytearray(data)
    flipped[-200] ^= 0xFF  # inside the last tensor record
    (tmp_path / "flipped.ckpt").write_bytes(bytes(flipped))
    return {
        "empty.ckpt": "is empty",
        "truncated.ckpt": "truncated",
        "text.ckpt": "not a populora checkpoint",
        "flipped.ckpt": "corrupted",
    }


@pytest.mark.parametrize("cls", ["EggrollES", "TorchEggrollES"])
def test_damaged_or_foreign_files_raise_checkpoint_error_naming_the_file(tmp_path, cls):
    torch.manual_seed(0)
    model = mlp()
    es = EggrollES(model, 6, 0.1, 0.1, 2) if cls == "EggrollES" else TorchEggrollES(model, pop_size=6)
    good = es.save(tmp_path / "good.ckpt")
    run(es, 1)
    before = snapshot(model)
    for name, why in damaged_files(tmp_path, good).items():
        with pytest.raises(CheckpointError, match=why) as info:
            es.load(tmp_path / name)
        assert name in str(info.value)
    foreign_kind = "TorchEggrollES" if cls == "EggrollES" else "EggrollES"
    foreign = (
        EggrollES(mlp(), 6, 0.1, 0.1, 2) if foreign_kind == "EggrollES" else TorchEggrollES(mlp(), pop_size=6)
    ).save(tmp_path / "foreign.ckpt")
    with pytest.raises(CheckpointError, match=f"foreign.ckpt.*holds a {foreign_kind} checkpoint, expected a {cls}"):
        es.load(foreign)
    assert_same(snapshot(model), before)


def test_a_file_that_does_not_fit_names_the_file_and_the_key(tmp_path):
    torch.manual_seed(0)
    path = EggrollES(mlp(), 8, 0.1, 0.1, 2).save(tmp_path / "pop8.ckpt")
    es = EggrollES(mlp(), 6, 0.1, 0.1, 2)
    with pytest.raises(CheckpointError, match=r"pop8.ckpt.*pop_size=8, this ES has 6"):
        es.load(path)
    with pytest.raises(FileNotFoundError):
        es.load(tmp_path / "missing.ckpt")


# --------------------------------------------------------------------------------------- precision


def test_get_stacked_params_of_a_float64_model_is_float64():
    """W + sigma * s_i * A_k B_k^T / sqrt(r), from the float32 draws, computed in float64 (not rounded to float32)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(7, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    es = TorchEggrollES(model, pop_size=6, sigma=0.3, rank=2)
    es.prepare_population()
    stacked = es.get_stacked_params()
    for name, param in model.named_parameters():
        assert stacked[name].dtype == torch.float64
        shape = tuple(param.shape)
        noise = draw_noise(0, name, 0, 3, shape, 2 if len(shape) == 2 else None, torch.device("cpu"))
        if noise.full is not None:
            per_pair = noise.full.double()
        else:
            per_pair = noise.at.double().transpose(1, 2) @ noise.bt.double() / math.sqrt(2)
        sign = torch.tensor([1.0, 1, 1, -1, -1, -1], dtype=torch.float64).view(-1, *[1] * len(shape))
        expected = param.detach() + 0.3 * sign * per_pair[torch.tensor([0, 1, 2, 0, 1, 2])]
        torch.testing.assert_close(stacked[name], expected, rtol=0, atol=1e-12)
    x = torch.randn(4, 7, dtype=torch.float64)
    out = es.es.ask()(x)
    for i in range(6):
        torch.testing.assert_close(
            out[i], torch.func.functional_call(model, es.prepare_population()[i], (x,)), rtol=0, atol=1e-12
        )


def test_noise_for_shapes_in_float64_is_computed_in_float64():
    noise = generate_noise_for_shapes({"W": (6, 5)}, {"W": 2}, 4, 0.3, 0, "cpu", dtype=torch.float64)["W"]
    d = draw_noise(0, "W", 0, 2, (6, 5), 2, torch.device("cpu"))
    expected = 0.3 * (d.at.double().transpose(1, 2) @ d.bt.double()) / math.sqrt(2)
    torch.testing.assert_close(noise[:2], expected, rtol=0, atol=1e-12)


def test_fitness_shaping_keeps_float64_precision():
    """1e8 + i are distinct in float64 but collapse in float32: shaping, argmax and the best must see them."""
    for shaping in ("zscore", "centered_rank", "center"):
        es = EggrollES(mlp(), 8, 0.1, 0.1, 2, fitness_shaping=shaping, antithetic=False)
        f64 = 1e8 + torch.arange(8, dtype=torch.float64)
        for f in (f64, f64.tolist()):
            z = es.shape_fitness(f)
            assert z.dtype == torch.float64
            assert bool((z[1:] > z[:-1]).all()), (shaping, z)
    es = EggrollES(mlp(), 8, 0.1, 0.0, 2)
    stats = es.tell([1 + k * 1e-9 for k in (3, 1, 7, 0, 2, 5, 6, 4)])
    assert es.best_individual == (0, 2) and stats.best == 1 + 7e-9
    rewards = 1e8 + torch.arange(4, dtype=torch.float64)
    noise = {"w": torch.eye(4)}  # member i's noise is e_i, so g = z / sqrt(4)
    g = compute_es_gradient(noise, rewards)["w"]
    assert bool((g[1:] > g[:-1]).all()), g
    g_list = compute_es_gradient(noise, rewards.tolist())["w"]
    torch.testing.assert_close(g_list, g)


def test_losses_of_a_float64_model_stay_float64():
    torch.manual_seed(0)
    model = mlp().double()
    es = EggrollES(model, 4, 0.1, 0.1, 2)
    x = torch.randn(3, 6, dtype=torch.float64)
    losses = es.losses(x, lambda o, t: 1e8 + o.square().mean())
    assert losses.dtype == torch.float64
    members = es.ask()(x)
    torch.testing.assert_close(losses, 1e8 + members.square().mean(dim=(1, 2)), rtol=0, atol=1e-6)
