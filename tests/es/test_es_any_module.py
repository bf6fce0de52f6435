"""ES on any nn.Module: parameters the routed forward cannot reach (a bare nn.Parameter used in any
expression, a norm gain, a tied raw weight) are perturbed through the functional_call fallback with the
same seeding, antithetic pairs, shaping, update and checkpoints as the routed ones (torcheggroll's
"works with any nn.Module")."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from populora import EggrollES, TorchEggrollES
from populora.errors import InvalidValueError


def close(a, b, tol=1e-5):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


# --------------------------------------------------------------------------------------- models


class Bowl(nn.Module):
    """A lone parameter of any shape in a quadratic bowl: the output is ``(param - target) ** 2``."""

    def __init__(self, target: torch.Tensor):
        super().__init__()
        self.register_buffer("target", target)
        self.param = nn.Parameter(torch.zeros_like(target))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.param - self.target) ** 2


class RawLinear(nn.Module):
    """``x @ self.weight.T`` with a bare 2-D parameter (no nn.Linear)."""

    def __init__(self, d: int, e: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(e, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T


class Mixed(nn.Module):
    """nn.Linear layers (routed) around raw parameters (fallback): a gain, a 2-D mix and a 0-d offset."""

    def __init__(self, d: int = 4, h: int = 6, e: int = 2):
        super().__init__()
        self.lin = nn.Linear(d, h)
        self.scale = nn.Parameter(torch.rand(h) + 0.5)
        self.mix = nn.Parameter(torch.randn(h, h) * 0.3)
        self.offset = nn.Parameter(torch.tensor(0.1))
        self.head = nn.Linear(h, e)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.lin(x) * self.scale + self.offset)
        return self.head(h @ self.mix.T)


class NotVmappable(Mixed):
    """The same model, but its forward reads a value with .item(): torch.func.vmap cannot run it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.offset.item() > 1e9:  # never true; only there to break vmap
            return x
        return super().forward(x)


class Shared(nn.Module):
    """One raw parameter used by two submodules (tied), plus a Linear whose weight is that same tensor."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Module(), nn.Module()
        self.a.w = nn.Parameter(torch.randn(5, 5) * 0.3)
        self.b.w = self.a.w
        self.lin = nn.Linear(5, 5)
        self.lin.weight = self.a.w  # a Linear tied to a raw use: the whole parameter goes to the fallback

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(torch.tanh(x @ self.a.w.T) @ self.b.w)


def reference(model: nn.Module, es: EggrollES, x: torch.Tensor, member: int) -> torch.Tensor:
    """Member ``member``'s forward with W + sigma * E written into every evolved parameter (materialised)."""
    with torch.no_grad():
        return torch.func.functional_call(model, es.individual_params(member), (x,))


# --------------------------------------------------------------------------------------- convergence


@pytest.mark.parametrize("cls", ["TorchEggrollES", "EggrollES"])
@pytest.mark.parametrize("shape", [(5,), (), (3, 4), (2, 3, 2)])
def test_quadratic_bowl_on_a_raw_parameter_converges(cls, shape):
    """``(self.param - target) ** 2`` for a lone 1-D, 0-d, 2-D (low-rank noise) or 3-D parameter."""
    torch.manual_seed(0)
    target = torch.randn(shape)
    model = Bowl(target)
    if cls == "TorchEggrollES":
        es = TorchEggrollES(model, pop_size=32, sigma=0.1, lr=0.05, rank=2)
    else:
        es = EggrollES(model, 32, 0.1, 0.05, 2, perturb_unroutable=True)
    assert es.param_names == ["param"]
    start = float(((model.param.detach() - target) ** 2).sum())
    x = torch.zeros(1)
    for _ in range(150):
        es.step(x, lambda out, t: out.sum(), None)
    end = float(((model.param.detach() - target) ** 2).sum())
    assert end < start / 20, (start, end)


def test_raw_matmul_teacher_student_converges():
    """``x @ self.weight.T`` with a bare parameter learns a teacher's weights (low-rank fallback noise)."""
    torch.manual_seed(0)
    teacher = torch.randn(3, 6)
    model = RawLinear(6, 3)
    es = TorchEggrollES(model, pop_size=64, sigma=0.1, lr=0.1, rank=2)
    gen = torch.Generator().manual_seed(1)
    start = float((model.weight.detach() - teacher).square().mean())
    for _ in range(100):
        x = torch.randn(32, 6, generator=gen)
        es.step(x, lambda out, y: ((out - y) ** 2).mean(), x @ teacher.T)
    end = float((model.weight.detach() - teacher).square().mean())
    assert end < start / 100, (start, end)


# --------------------------------------------------------------------------------------- equivalence


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_mixed_model_members_equal_materialised_weights(dtype, tol):
    """Linear (routed) + raw parameters (fallback): every member equals its materialised weights, in every layout."""
    torch.manual_seed(0)
    model = Mixed().to(dtype)
    es = EggrollES(model, 6, 0.2, 0.1, 2, perturb_unroutable=True, seed=3)
    assert es.param_names == ["scale", "mix", "offset", "lin.weight", "lin.bias", "head.weight", "head.bias"]
    assert [p.routed for p in es._params] == [False, False, False, True, True, True, True]
    x = torch.randn(3, 4, dtype=dtype)
    members = es.ask()
    out = members(x)
    assert out.shape == (6, 3, 2) and out.dtype == dtype
    for i in range(6):
        close(out[i], reference(model, es, x, i), tol)
    close(members(x, individual=4), reference(model, es, x, 4), tol)
    sub = members(x, individuals=[5, 1])
    close(sub, torch.stack([reference(model, es, x, 5), reference(model, es, x, 1)]), tol)
    xs = torch.randn(6, 2, 4, dtype=dtype)
    per = members(xs, per_individual=True)
    for i in range(6):
        close(per[i], reference(model, es, xs[i], i), tol)
    assert es._fallback_modes == {False: "vmap", True: "vmap"}
    torch.testing.assert_close(model(x), Mixed.forward(model, x), rtol=0, atol=0)  # the base model is untouched


def test_model_that_is_not_vmap_safe_runs_in_a_loop_with_one_warning():
    torch.manual_seed(0)
    model = NotVmappable()
    es = EggrollES(model, 4, 0.2, 0.1, 2, perturb_unroutable=True)
    x = torch.randn(3, 4)
    with pytest.warns(UserWarning, match="one member at a time"):
        out = es.ask()(x)
    for i in range(4):
        close(out[i], reference(model, es, x, i))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the loop is remembered: no second vmap attempt, no second warning
        losses = es.losses(x, lambda o, t: o.square().mean())
    close(losses, out.square().mean(dim=(1, 2)))


def test_tied_parameter_gets_one_perturbation():
    """A parameter used by two raw expressions and a Linear is one parameter, perturbed once, everywhere."""
    torch.manual_seed(0)
    model = Shared()
    es = TorchEggrollES(model, pop_size=4, sigma=0.2, lr=0.1, rank=2)
    assert es.param_names == ["a.w", "lin.bias"]  # the tied tensor once, under its first name
    x = torch.randn(3, 5)
    out = es.es.ask()(x)
    for i in range(4):
        w = es.es.individual_params(i)["a.w"]
        expected = torch.nn.functional.linear(torch.tanh(x @ w.T) @ w, w, es.es.individual_params(i)["lin.bias"])
        close(out[i], expected)
    before = model.a.w.detach().clone()
    es.step(x, lambda o, t: o.square().mean(), None)
    assert model.b.w is model.a.w is model.lin.weight and not torch.equal(model.a.w, before)


def test_antithetic_pairs_and_gradient_of_fallback_parameters():
    """Mirrored members are exact negatives; g == sqrt(N) * mean_i(z_i * sigma * E_i) for fallback parameters too."""
    torch.manual_seed(0)
    model = Mixed()
    es = EggrollES(model, 8, 0.3, 0.1, 2, perturb_unroutable=True, fitness_shaping="centered_rank")
    for name, delta in es.perturbations().items():
        assert torch.equal(delta[:4], -delta[4:]), name
    assert torch.linalg.matrix_rank(es.perturbations()["mix"][0]).item() == 2  # 2-D: low-rank noise
    f = torch.randn(8, generator=torch.Generator().manual_seed(2))
    z, g = es.shape_fitness(f), es.estimate_gradient(f)
    for name, e in es.perturbations().items():
        close(g[name], math.sqrt(8) * (z.view(-1, *[1] * (e.dim() - 1)) * e).mean(0))


def test_normalize_fitness_false_centres_for_raw_parameters():
    torch.manual_seed(0)
    model = Bowl(torch.randn(3))
    es = TorchEggrollES(model, pop_size=4, sigma=0.1, lr=1.0, normalize_fitness=False)
    es.prepare_population()
    noise = es.get_stacked_params()["param"] - model.param.detach()
    base = model.param.detach().clone()
    f = torch.tensor([1.0, 2.0, 3.0, 10.0])
    es.apply_fitness_scores(f)
    close(model.param.detach() - base, math.sqrt(4) * ((f - f.mean())[:, None] * noise).mean(0))


def test_same_seed_same_fallback_noise():
    torch.manual_seed(0)
    a, b = Mixed(), Mixed()
    b.load_state_dict(a.state_dict())
    x = torch.randn(3, 4)
    es_a = EggrollES(a, 6, 0.2, 0.1, 2, perturb_unroutable=True, seed=7)
    es_b = EggrollES(b, 6, 0.2, 0.1, 2, perturb_unroutable=True, seed=7)
    assert torch.equal(es_a.ask()(x), es_b.ask()(x))
    for _ in range(3):
        es_a.step(x, lambda o, t: o.square().mean())
        es_b.step(x, lambda o, t: o.square().mean())
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), n


# --------------------------------------------------------------------------------------- selection


def test_param_filter_selects_raw_parameters_by_name():
    torch.manual_seed(0)
    model = Mixed()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    es = TorchEggrollES(model, pop_size=4, sigma=0.1, lr=0.5, param_filter=lambda name: name in ("scale", "mix"))
    assert es.param_names == ["scale", "mix"]
    es.step(torch.randn(3, 4), lambda o, t: o.square().mean(), None)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == {"scale", "mix"}
    es = EggrollES(model, 4, 0.1, 0.1, 2, param_filter=lambda name, p: p.dim() == 0, perturb_unroutable=True)
    assert es.param_names == ["offset"]


def test_eggroll_es_freezes_raw_parameters_by_default_with_one_warning():
    torch.manual_seed(0)
    model = Mixed()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.warns(UserWarning) as caught:
        es = EggrollES(model, 4, 0.1, 0.5, 2)
    assert len(caught) == 1
    message = str(caught[0].message)
    for name in ("'scale'", "'mix'", "'offset'", "perturb_unroutable=True"):
        assert name in message
    assert es.param_names == ["lin.weight", "lin.bias", "head.weight", "head.bias"]
    x = torch.randn(3, 4)
    out = es.ask()(x)  # the routed path: one batched forward, no functional_call
    assert es._fallback_modes == {} and out.shape == (4, 3, 2)
    for i in range(4):
        close(out[i], reference(model, es, x, i))
    es.step(x, lambda o, t: o.square().mean())
    for n in ("scale", "mix", "offset"):
        assert torch.equal(getattr(model, n), before[n])
    assert not torch.equal(model.lin.weight, before["lin.weight"])


def test_only_raw_parameters_without_perturb_unroutable_is_an_error():
    with pytest.raises(InvalidValueError, match=r"'param' \(it is `param` of Bowl '<root>'\).*perturb_unroutable=True"):
        EggrollES(Bowl(torch.zeros(3)), 4, 0.1, 0.1, 2)


# --------------------------------------------------------------------------------------- checkpoints


def test_resume_with_fallback_parameters_is_bitwise_exact(tmp_path):
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(5))

    def fresh():
        torch.manual_seed(0)
        model = Mixed()
        return TorchEggrollES(model, pop_size=6, sigma=0.1, lr=0.1, rank=2), model

    def run(es, steps):
        for _ in range(steps):
            es.step(x, lambda o, t: o.square().mean(), None)

    straight, model_a = fresh()
    run(straight, 4)
    first, _ = fresh()
    run(first, 2)
    path = first.save(tmp_path / "tegg.ckpt")
    resumed, model_b = fresh()
    resumed.load(path)
    assert resumed.epoch == 2
    run(resumed, 2)
    for (n, a), b in zip(model_a.named_parameters(), model_b.parameters()):
        assert torch.equal(a, b), n


@pytest.mark.filterwarnings("ignore:There is a performance drop")  # torch: no vmap rule for CPU flash attention
def test_transformer_with_every_parameter_perturbed_equals_materialised_weights():
    """Embedding, Linears (routed, low rank inside each member's call), LayerNorms and a bare `pos` (fallback)."""
    from models import TinyTransformer

    torch.manual_seed(0)
    model = TinyTransformer()
    es = EggrollES(model, 4, 0.2, 0.1, 2, perturb_unroutable=True)
    assert {"pos", "ln.weight", "blocks.0.ln1.bias", "embed.weight", "head.weight"} <= set(es.param_names)
    assert len(es.param_names) == len(list(model.parameters()))
    x = torch.randint(0, 11, (3, 8))
    out = es.ask()(x)
    assert out.shape == (4, 3, 8, 11)
    for i in range(4):
        close(out[i], reference(model, es, x, i))
    loss = lambda o, t: o.square().mean()
    close(es.losses(x, loss, max_rows=3), es.losses(x, loss))  # one member per forward: same losses


def test_fallback_fitness_functions_in_every_form():
    torch.manual_seed(0)
    model = Mixed()
    es = EggrollES(model, 4, 0.2, 0.1, 2, perturb_unroutable=True)
    x = torch.randn(3, 4)

    def batch(members, individuals):
        return members(x, individuals=individuals).mean(dim=(1, 2))

    def single(members, idx):
        return members(x, individual=idx).mean()

    close(es.evaluate(batch), es.evaluate(single))
    stats = es.step(fitness=batch)
    assert stats.generation == 0 and es.generation == 1
