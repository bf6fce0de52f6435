"""EggrollES: routed members equal explicitly materialised weights, the factor gradient equals the
explicit sum, the noise is a pure function of its seed, training works, bad input fails early."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from models import TinyTransformer, mlp
from torch import nn

from populora import EggrollES
from populora.errors import FitnessError, InvalidIndexError, InvalidTypeError, InvalidValueError, PopuloraError
from populora.es import FITNESS_SHAPINGS, ESStateError, stable_seed
from populora.es.noise import draw_noise


def close(a, b, tol=1e-5):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def transformer_filter(name: str) -> bool:
    """TinyTransformer: leave out what the routed path cannot perturb (LayerNorms, the bare `pos`)."""
    return "ln" not in name and name != "pos"


def make(kind: str = "mlp", pop: int = 6, seed: int = 0, **kwargs):
    torch.manual_seed(seed)
    if kind == "mlp":
        model, x = mlp(), torch.randn(5, 6)
    elif kind == "transformer":
        model, x = TinyTransformer(), torch.randint(0, 11, (3, 8))
        kwargs.setdefault("param_filter", transformer_filter)
    else:  # embedding + linear head, tied
        model = nn.Sequential(nn.Embedding(13, 8), nn.Tanh(), nn.Linear(8, 13))
        if kind == "tied":
            model[2].weight = model[0].weight
        x = torch.randint(0, 13, (4, 5))
    es = EggrollES(
        model, pop, kwargs.pop("sigma", 0.3), kwargs.pop("lr", 0.1), kwargs.pop("rank", 3), seed=seed, **kwargs
    )
    return es, model, x


def explicit(model, es, x, member):
    """Forward of an independent model whose weights are W + sigma * E_member, written out."""
    with torch.no_grad():
        return torch.func.functional_call(model, es.individual_params(member), (x,))


# --------------------------------------------------------------------------------------- routed forward


@pytest.mark.parametrize("kind", ["mlp", "transformer", "embedding", "tied"])
def test_routed_forward_equals_materialised_weights(kind):
    """Every member of one routed forward equals a plain forward with W + sigma*E_i written into the weights."""
    es, model, x = make(kind)
    out = es.ask()(x)
    assert out.shape[:2] == (6, x.shape[0])
    for i in range(6):
        close(out[i], explicit(model, es, x, i))


def test_materialised_weights_are_low_rank_and_scaled():
    """W_i - W is sigma * s_i * A B^T / sqrt(r): rank r, antithetic, unit-variance noise."""
    es, model, _ = make("mlp", pop=400, sigma=0.5, rank=3)
    w = model[0].weight.detach()
    delta = es.perturbations()["0.weight"]  # (N, 16, 6)
    close(es.population_params()["0.weight"], w + delta)
    assert torch.linalg.matrix_rank(delta[0]).item() == 3
    assert abs(delta.std().item() / 0.5 - 1) < 0.05
    assert torch.equal(delta[:200], -delta[200:])


def test_member_subsets_single_member_and_per_individual_inputs():
    es, model, x = make("transformer", pop=4)
    members = es.ask()
    ids = [3, 1]
    close(members(x, individuals=ids), torch.stack([explicit(model, es, x, i) for i in ids]))
    close(members(x, individual=2), explicit(model, es, x, 2))
    xs = torch.randint(0, 11, (4, 2, 8))  # member i gets its own 2 rows
    out = members(xs, per_individual=True)
    for i in range(4):
        close(out[i], explicit(model, es, xs[i], i))


def test_shared_batch_is_broadcast_whatever_its_size():
    """A batch of N rows (divisible by N) is still seen whole by every member: shape never decides."""
    es, model, _ = make("mlp", pop=4)
    x = torch.randn(4, 6)
    out = es.ask()(x)
    assert out.shape == (4, 4, 3)
    for i in range(4):
        close(out[i], explicit(model, es, x, i))


def test_base_model_untouched_outside_members():
    es, model, x = make("mlp")
    before = model(x)
    es.ask()(x)
    close(model(x), before, tol=0)


def test_antithetic_members_are_exact_negatives():
    es, model, x = make("mlp", pop=8)
    members = es.ask()
    for down, up, bias in members._target.adapters:
        assert torch.equal(down[:4], -down[4:]) and torch.equal(up[:4], up[4:])
        assert bias is None or torch.equal(bias[:4], -bias[4:])
    for d in es.perturbations().values():
        assert torch.equal(d[:4], -d[4:])
    assert not torch.allclose(members(x)[0], model(x))


def test_non_antithetic_members_all_differ():
    es, _, _ = make("mlp", pop=5, antithetic=False)
    d = es.perturbations()["0.weight"]
    assert len({tuple(t.flatten()[:3].tolist()) for t in d}) == 5


# --------------------------------------------------------------------------------------- noise


def test_same_seed_same_noise_and_generations_differ():
    a, _, x = make("mlp", seed=0)
    b, _, _ = make("mlp", seed=0)
    c = EggrollES(copy.deepcopy(a.model), 6, 0.3, 0.1, 3, seed=1)
    pa, pb, pc = a.population_params(), b.population_params(), c.population_params()
    assert all(torch.equal(pa[n], pb[n]) for n in pa)
    assert not torch.equal(pa["0.weight"], pc["0.weight"])
    before = a.perturbations()["0.weight"]
    a.tell(torch.arange(6.0))
    assert not torch.allclose(before, a.perturbations()["0.weight"])


def test_noise_reuse_keeps_noise_for_several_generations():
    es, model, _ = make("mlp", noise_reuse=2, lr=0.0)
    first = es.perturbations()["0.weight"]
    es.tell(torch.arange(6.0))
    assert torch.equal(es.perturbations()["0.weight"], first)
    es.tell(torch.arange(6.0))
    assert not torch.equal(es.perturbations()["0.weight"], first)


def test_noise_is_a_pure_function_of_seed_name_epoch():
    n1 = draw_noise(3, "layer.weight", 7, 4, (5, 6), 2, torch.device("cpu"))
    n2 = draw_noise(3, "layer.weight", 7, 4, (5, 6), 2, torch.device("cpu"))
    assert torch.equal(n1.at, n2.at) and torch.equal(n1.bt, n2.bt)
    assert n1.at.shape == (4, 2, 5) and n1.bt.shape == (4, 2, 6)
    n3 = draw_noise(3, "other.weight", 7, 4, (5, 6), 2, torch.device("cpu"))
    assert not torch.equal(n1.at, n3.at)
    assert stable_seed(0, "a", 1) == stable_seed(0, "a", 1) != stable_seed(0, "a", 2)
    assert (
        stable_seed(0, "a", 1) == 6061146345047571689
    )  # pinned: same in every process and version (BLAKE2b, not hash())


# --------------------------------------------------------------------------------------- gradient


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"fitness_shaping": "centered_rank"},
        {"fitness_shaping": "raw", "antithetic": False},
        {"group_size": 4, "pop": 8},
        {"group_size": 3, "antithetic": False},
        {"fitness_shaping": "center"},
    ],
)
def test_factor_gradient_equals_explicit_sum(options):
    """g from the factors (one matmul) == sqrt(N) * mean_i(z_i * (W_i - W)) over materialised members."""
    options = dict(options)
    pop = options.pop("pop", 6)
    es, model, _ = make("transformer", pop=pop, **options)
    f = torch.randn(pop, generator=torch.Generator().manual_seed(1))
    z = es.shape_fitness(f)
    g = es.estimate_gradient(f)
    for name, e in es.perturbations().items():
        ref = math.sqrt(pop) * (z.view(-1, *[1] * (e.dim() - 1)) * e).mean(0)
        close(g[name], ref)


def test_tell_writes_negative_gradient_and_sgd_step():
    es, model, _ = make("mlp", lr=0.5)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    f = torch.randn(6)
    g = es.estimate_gradient(f)
    stats = es.tell(f)
    for n, p in model.named_parameters():
        close(p.grad, -g[n])
        close(p.detach(), before[n] + 0.5 * g[n])
    assert stats.generation == 0 and es.generation == 1
    assert stats.best == pytest.approx(f.max().item()) and stats.mean == pytest.approx(f.mean().item())
    assert es.best_fitness == pytest.approx(f.max().item()) and es.best_individual == (0, int(f.argmax()))


def test_group_shaping_compares_within_groups():
    es, _, _ = make("mlp", pop=8, group_size=4)
    assert es.groups().tolist() == [[0, 1, 4, 5], [2, 3, 6, 7]]
    f = torch.tensor([1.0, 2.0, 100.0, 200.0, 3.0, 4.0, 300.0, 400.0])
    z = es.shape_fitness(f)
    close(z[[0, 1, 4, 5]], FITNESS_SHAPINGS["zscore"](f[[0, 1, 4, 5]][None])[0])
    close(z[[2, 3, 6, 7]], z[[0, 1, 4, 5]])  # same ranks within each group -> same z


def test_callable_fitness_shaping():
    es, _, _ = make("mlp", fitness_shaping=lambda f: torch.sign(f - f.median(-1, keepdim=True).values))
    assert es.shape_fitness(torch.arange(6.0)).tolist() == [-1, -1, 0, 1, 1, 1]


# --------------------------------------------------------------------------------------- training


def teacher_student(optimizer=None, lr=None, steps=60, per_individual=False):
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    student = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    pop = 128
    es = EggrollES(student, pop, 0.05, lr, 4, seed=0, optimizer=optimizer)
    gen = torch.Generator().manual_seed(1)
    x_test = torch.randn(256, 8, generator=gen)

    def mse(out, target):
        return ((out - target) ** 2).mean()

    with torch.no_grad():
        start = mse(student(x_test), teacher(x_test)).item()
        for _ in range(steps):
            if per_individual:
                x = torch.randn(pop, 16, 8, generator=gen)
                es.step(x, mse, teacher(x), per_individual=True)
            else:
                x = torch.randn(64, 8, generator=gen)
                es.step(x, mse, teacher(x))
        end = mse(student(x_test), teacher(x_test)).item()
    return start, end, es


def test_teacher_student_sgd():
    start, end, es = teacher_student(lr=0.3, steps=60)
    assert end < start / 10, (start, end)
    assert es.best_fitness > -end * 2


def test_teacher_student_adam_and_per_individual_inputs():
    start, end, _ = teacher_student(
        optimizer=lambda params: torch.optim.Adam(params, lr=0.01), steps=60, per_individual=True
    )
    assert end < start / 10, (start, end)


def test_lr_scheduler_and_custom_optimizer_instance():
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    es = EggrollES(model, 6, 0.1, None, 2, optimizer=opt)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    x, y = torch.randn(4, 6), torch.randn(4, 3)
    for _ in range(3):
        es.step(x, lambda o, t: ((o - t) ** 2).mean(), y)
        sched.step()
    assert es.lr == pytest.approx(0.125)


def test_perturb_vectors_false_freezes_vectors_and_accepts_layernorm():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    es = EggrollES(model, 4, 0.1, 0.5, 2, perturb_vectors=False)
    assert es.param_names == ["0.weight", "2.weight"]
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if p.dim() == 1}
    es.step(torch.randn(3, 4), lambda o, t: (o**2).mean())
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if p.dim() == 1)


def test_param_filter_arities_and_requires_grad():
    torch.manual_seed(0)
    model = mlp()
    assert EggrollES(model, 4, 0.1, 0.1, 2, param_filter=lambda name: "bias" not in name).param_names == [
        "0.weight",
        "2.weight",
    ]
    assert EggrollES(model, 4, 0.1, 0.1, 2, param_filter=lambda name, p: p.dim() == 1).param_names == [
        "0.bias",
        "2.bias",
    ]
    model[0].requires_grad_(False)
    assert EggrollES(model, 4, 0.1, 0.1, 2).param_names == ["2.weight", "2.bias"]


def test_loss_fn_not_vmap_safe_falls_back_to_loop():
    es, _, x = make("mlp", pop=4)
    y = torch.randn(5, 3)
    safe = es.losses(x, lambda o, t: ((o - t) ** 2).mean(), y)
    unsafe = es.losses(x, lambda o, t: float(((o - t) ** 2).mean().item()), y)
    torch.testing.assert_close(safe, unsafe, rtol=1e-5, atol=1e-5, check_dtype=False)
    assert safe.shape == (4,) and safe.dtype == torch.float32
    assert unsafe.dtype == torch.float64  # Python floats are doubles: kept as such


def test_evaluate_accepts_the_three_fitness_signatures():
    es, _, x = make("mlp", pop=4)

    def batch(members, individuals):
        return members(x, individuals=individuals).mean(dim=(1, 2))

    def single(members, idx):
        return members(x, individual=idx).mean()

    def whole(members):
        return members(x).mean(dim=(1, 2))

    close(es.evaluate(batch), es.evaluate(single))
    close(es.evaluate(whole), es.evaluate(single))
    stats = es.step(fitness=whole)
    assert stats.generation == 0 and es.generation == 1


# --------------------------------------------------------------------------------------- checkpoint


def run(es, steps, x, y):
    for _ in range(steps):
        es.step(x, lambda o, t: ((o - t) ** 2).mean(), y)


def test_checkpoint_resume_is_bitwise_exact(tmp_path):
    """Save at generation 3, load into a fresh ES, continue: identical to never stopping (Adam state too)."""
    x, y = torch.randn(5, 6), torch.randn(5, 3)

    def fresh():
        torch.manual_seed(0)
        model = mlp()
        return EggrollES(model, 6, 0.1, None, 2, seed=5, optimizer=lambda p: torch.optim.Adam(p, lr=0.01)), model

    straight, model_a = fresh()
    run(straight, 6, x, y)

    first, _ = fresh()
    run(first, 3, x, y)
    torch.save(first.state_dict(), tmp_path / "es.pt")
    resumed, model_b = fresh()
    resumed.load_state_dict(torch.load(tmp_path / "es.pt"))  # weights_only=True by default
    assert resumed.generation == 3 and resumed.best_individual == first.best_individual
    run(resumed, 3, x, y)
    for a, b in zip(model_a.parameters(), model_b.parameters()):
        assert torch.equal(a, b)
    assert resumed.best_fitness == straight.best_fitness


def test_load_state_dict_rejects_other_configuration():
    es, _, _ = make("mlp")
    state = es.state_dict()
    other, _, _ = make("mlp", pop=8)
    with pytest.raises(ValueError, match="pop_size=6, this ES has 8"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="not an EggrollES state dict"):
        es.load_state_dict({"epoch": 0})


# --------------------------------------------------------------------------------------- bad input


def test_bad_constructor_arguments():
    """Every bad value is an InvalidValueError (a PopuloraError and a ValueError), every bad type an InvalidTypeError."""
    model = mlp()
    cases = [
        (
            InvalidValueError,
            "pop_size must be even when using antithetic sampling, got pop_size=5",
            (5, 0.1, 0.1, 2),
            {},
        ),
        (
            InvalidValueError,
            "pop_size must be even when using antithetic sampling, got pop_size=7",
            (7, 0.1, 0.1, 2),
            {},
        ),
        (InvalidValueError, "`pop_size` must be an int >= 2, got 1", (1, 0.1, 0.1, 2), {}),
        (InvalidTypeError, "`pop_size` must be an int, got str '8'", ("8", 0.1, 0.1, 2), {}),
        (InvalidValueError, r"`sigma` must be a finite number > 0(\.0)?, got -1", (4, -1, 0.1, 2), {}),
        (InvalidValueError, r"`sigma` must be a finite number > 0(\.0)?, got nan", (4, float("nan"), 0.1, 2), {}),
        (InvalidValueError, "`rank` must be an int >= 1, got 0", (4, 0.1, 0.1, 0), {}),
        (InvalidTypeError, "`rank` must be an int, got float 2.5", (4, 0.1, 0.1, 2.5), {}),
        (InvalidValueError, "`fitness_shaping` must be one of", (4, 0.1, 0.1, 2), {"fitness_shaping": "softmax"}),
        (InvalidValueError, "`group_size` must divide pop_size=8 and be even", (8, 0.1, 0.1, 2), {"group_size": 3}),
        (InvalidValueError, "no parameters selected", (4, 0.1, 0.1, 2), {"param_filter": lambda name: False}),
        (InvalidValueError, "`lr` must be a number when no `optimizer` is given", (4, 0.1, None, 2), {}),
        (InvalidTypeError, "`seed` must be an int, got str 'x'", (4, 0.1, 0.1, 2), {"seed": "x"}),
        (InvalidTypeError, "`antithetic` must be a bool, got int 1", (4, 0.1, 0.1, 2), {"antithetic": 1}),
        (InvalidValueError, "`noise_reuse` must be an int >= 1, got 0", (4, 0.1, 0.1, 2), {"noise_reuse": 0}),
    ]
    for error, message, args, kwargs in cases:
        with pytest.raises(error, match=message) as info:
            EggrollES(model, *args, **kwargs)
        assert isinstance(info.value, PopuloraError)
    with pytest.raises(InvalidTypeError, match="`model` must be an nn.Module"):
        EggrollES(lambda x: x, 4, 0.1, 0.1, 2)
    assert all(p.grad is None for p in model.parameters())


def test_numpy_scalars_are_accepted_like_python_numbers():
    es = EggrollES(
        mlp(),
        np.int64(8),
        np.float32(0.25),
        np.float64(0.1),
        np.int32(2),
        seed=np.int64(3),
        antithetic=np.bool_(True),
        noise_reuse=np.int64(1),
    )
    assert (es.pop_size, es.sigma, es.rank, es.seed, es.lr) == (8, 0.25, 2, 3, pytest.approx(0.1))
    assert type(es.pop_size) is int and type(es.sigma) is float
    members = es.individual_params(np.int64(7))
    assert members["0.weight"].shape == (16, 6)
    with pytest.raises(InvalidIndexError, match=r"`individual` must be an id in \[0, 8\), got 8"):
        es.individual_params(8)
    with pytest.raises(InvalidIndexError):
        es.perturbations([0, 99])


@pytest.mark.parametrize(
    "model, names",
    [
        (TinyTransformer(), ["'pos'", "'blocks.0.ln1.weight'", "LayerNorm"]),
        (nn.Sequential(nn.Conv1d(2, 3, 3), nn.Flatten(), nn.Linear(3, 2)), ["'0.weight'", "Conv1d"]),
    ],
)
def test_unroutable_parameters_are_frozen_with_one_warning_naming_them(model, names):
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.warns(UserWarning, match="perturb_unroutable=True") as caught:
        es = EggrollES(model, 4, 0.1, 0.1, 2)
    assert len(caught) == 1
    for name in names:
        assert name in str(caught[0].message)
    frozen = [n for n in before if n not in es.param_names]
    assert frozen and all(("ln" in n or n == "pos" or n.startswith("0.")) for n in frozen)
    x = torch.randint(0, 11, (2, 8)) if isinstance(model, TinyTransformer) else torch.randn(2, 2, 3)
    es.step(x, lambda o, t: o.square().mean())
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) == (n in frozen), n


def test_multihead_attention_needs_perturb_unroutable():
    """MHA's packed projections (and out_proj, whose forward it never calls) can only go through the fallback."""
    model = nn.MultiheadAttention(4, 2)
    with pytest.raises(InvalidValueError, match="out_proj.*never calls out_proj's forward.*perturb_unroutable=True"):
        EggrollES(model, 4, 0.1, 0.1, 2, param_filter=lambda name: name.startswith("out_proj"))
    es = EggrollES(model, 4, 0.1, 0.1, 2, perturb_unroutable=True)
    assert es.param_names == ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]
    x = torch.randn(3, 2, 4)
    out = es.ask()(x, x, x)
    for i in range(4):
        close(out[0][i], torch.func.functional_call(model, es.individual_params(i), (x, x, x))[0])


def test_bad_fitnesses_raise_before_any_change():
    es, model, _ = make("mlp")
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(FitnessError, match="Expected 6 fitness scores, got 5"):
        es.tell(torch.zeros(5))
    with pytest.raises(ValueError, match="free of NaN"):
        es.tell(torch.tensor([0.0, 1, float("nan"), 2, 3, 4]))
    with pytest.raises(FitnessError, match="must be finite with fitness_shaping='raw'"):
        make("mlp", fitness_shaping="raw")[0].tell(torch.tensor([0.0, 1, float("inf"), 2, 3, 4]))
    assert es.generation == 0 and es.best_individual is None
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())


def test_bad_inputs_and_loss_functions():
    es, _, x = make("mlp", pop=4)
    with pytest.raises(ValueError, match=r"shape \(4, b, ...\).*got \(5, 6\)"):
        es.losses(x, lambda o, t: o.mean(), per_individual=True)
    with pytest.raises(ValueError, match="one number per member"):
        es.losses(x, lambda o, t: o.mean(0))
    with pytest.raises(ValueError, match="either `inputs` and `loss_fn`"):
        es.step(x)
    members = es.ask()
    es.tell(torch.arange(4.0))
    with pytest.raises(ESStateError, match="belong to generation 0, but the ES is at generation 1"):
        members(x)


def test_custom_optimizer_must_hold_the_parameters():
    model = mlp()
    with pytest.raises(ValueError, match=r"does not hold the selected parameters \['2.weight', '2.bias'\]"):
        EggrollES(model, 4, 0.1, None, 2, optimizer=torch.optim.SGD(model[0].parameters(), lr=0.1))
    with pytest.warns(UserWarning, match="`lr=0.1` is ignored"):
        EggrollES(model, 4, 0.1, 0.1, 2, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))


def test_max_rows_evaluates_in_chunks_with_the_same_losses():
    es, _, x = make("transformer", pop=6)
    loss = lambda o, t: o.square().mean()
    whole = es.losses(x, loss)
    close(es.losses(x, loss, max_rows=7), whole)  # 7 // 3 rows per member = 2 members per forward
    xs = torch.randint(0, 11, (6, 2, 8))
    close(es.losses(xs, loss, per_individual=True, max_rows=1), es.losses(xs, loss, per_individual=True))
    with pytest.raises(ValueError, match="`max_rows` must be an int >= 1, got 0"):
        es.losses(x, loss, max_rows=0)


def test_chunked_losses_equal_one_forward():
    """max_rows chunks may hold exactly as many members as batch rows: members still see the whole batch."""
    es = EggrollES(nn.Linear(3, 2), pop_size=8, sigma=0.1, lr=0.1, rank=1)
    x = torch.randn(4, 3)
    loss = lambda out, _: out.square().mean()
    whole = es.losses(x, loss)
    for rows in (4, 8, 16):
        torch.testing.assert_close(es.losses(x, loss, max_rows=rows), whole)


def test_loss_defined_in_the_loop_does_not_grow_the_cache():
    es = EggrollES(nn.Linear(3, 2), pop_size=4, sigma=0.1, lr=0.1, rank=1)
    x, y = torch.randn(4, 3), torch.randn(4, 2)
    for _ in range(5):
        es.step(x, lambda out, target: (out - target).square().mean(), y)  # a new closure each step
    assert len(es._loss_modes) == 1


def test_the_individuals_repr_says_generation_size_and_whether_stale():
    es = EggrollES(mlp(), 6, 0.1, 0.1, 2, seed=0)
    members = es.ask()
    assert repr(members) == "Individuals(generation=0, N=6, 2 routed layers, current)"
    es.tell(torch.arange(6.0))
    assert repr(members) == (
        "Individuals(generation=0, N=6, 2 routed layers, stale: the ES is at generation 1, call ask() again)"
    )
    assert repr(es.ask()) == "Individuals(generation=1, N=6, 2 routed layers, current)"
