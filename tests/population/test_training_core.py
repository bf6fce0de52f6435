"""Training a population by gradient: the population's side (parameters, populations of one, the base model
beside the individuals, gradient checkpointing, per-individual clipping, optimizer state through evolution).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from models import TinyTransformer, mlp
from torch import nn

from populora import BASE, Population
from populora.errors import InvalidIndexError, InvalidTypeError, InvalidValueError, RouteError


def population(P=4, seed=0, **kw):
    torch.manual_seed(seed)
    kw.setdefault("init_scale", 0.5)
    return Population(mlp(6, 16, 3), pop_size=P, low_rank=2, seed=seed, **kw)


# ---------------------------------------------------------------------------- parameters and gradients


def test_adapter_parameters_are_the_stacks_first_dimension_individuals():
    pop = population(requires_grad=True)
    params = pop.adapter_parameters()
    assert len(params) == 2 * len(pop.target_names)
    assert all(isinstance(p, nn.Parameter) and p.requires_grad and p.shape[0] == 4 for p in params)
    trainable = [p for p in pop.parameters() if p.requires_grad]
    assert {id(p) for p in params} == {id(p) for p in trainable}  # the base model is frozen
    down, up = pop.factors()[0]
    assert down.data_ptr() == params[0].data_ptr() and up.data_ptr() == params[len(pop.target_names)].data_ptr()


@pytest.mark.parametrize(
    "routing",
    [
        dict(all_individuals=True),
        dict(individuals=[3, 0, 3, 3, 1, 0, 3, 0]),
        dict(individuals=[2, 2, 2, 2, 2, 2, 2, 2]),
    ],
)
def test_each_individual_gets_the_gradient_of_its_own_rows_only(routing):
    """float64: the routed backward equals each individual's own reference on its rows alone; an individual with
    no rows gets exactly zero gradient."""
    pop = population(requires_grad=True).double()
    x = torch.randn(8, 6, dtype=torch.float64)
    pop(x, **routing).square().sum().backward()
    ids = list(range(4)) * 0 + (
        [i for i in range(4) for _ in range(2)] if "all_individuals" in routing else routing["individuals"]
    )
    for i in range(4):
        ref = population(requires_grad=True).double()
        rows = [j for j, k in enumerate(ids) if k == i]
        if rows:
            ref(x[rows], individual=i).square().sum().backward()
        for got, want in zip(pop.adapter_parameters(), ref.adapter_parameters()):
            want_grad = torch.zeros_like(got) if want.grad is None else want.grad
            torch.testing.assert_close(got.grad[i], want_grad[i], rtol=1e-10, atol=1e-12)
            if not rows:
                assert torch.equal(got.grad[i], torch.zeros_like(got.grad[i]))


# ---------------------------------------------------------------------------- populations of one


def test_a_population_of_one_routes_trains_saves_and_exports(tmp_path):
    pop = population(P=1, requires_grad=True)
    x = torch.randn(5, 6)
    out = pop(x, all_individuals=True)
    torch.testing.assert_close(out, pop(x, individual=0))
    assert pop(x[:1], all_individuals=True).shape == (1, 3)
    opt = torch.optim.SGD(pop.adapter_parameters(), lr=0.1)
    out.square().sum().backward()
    opt.step()
    assert not torch.equal(pop(x, individual=0), out.detach())
    pop.mutate_(individual=0)
    pop.save(tmp_path / "one.pt")
    twin = population(P=1)
    twin.load(tmp_path / "one.pt")
    assert torch.equal(twin(x, individual=0), pop(x, individual=0))
    assert pop.merge_(0) is pop.model


@pytest.mark.parametrize(
    "call",
    [
        lambda pop: pop.select(fitnesses=[1.0]),
        lambda pop: pop.select_parents(fitnesses=[1.0], num_children=1),
        lambda pop: pop.crossover_("average", [[0, 0]], [0]),
        lambda pop: pop.evolve_([1.0]),
    ],
)
def test_selection_and_crossover_of_a_population_of_one_name_the_need_for_two(call):
    pop = population(P=1)
    before = copy.deepcopy(pop.state_dict(include_model=False))
    with pytest.raises(InvalidValueError, match="needs a population of 2 or more individuals"):
        call(pop)
    after = pop.state_dict(include_model=False)
    assert all(torch.equal(before[k], after[k]) for k in before if isinstance(before[k], torch.Tensor))


def test_a_population_of_one_exports_to_peft(tmp_path):
    pytest.importorskip("safetensors")
    from populora.llm import tiny_chat_model

    model, _ = tiny_chat_model()
    pop = Population(model, 1, 2, lora_targets="model.layers.*.self_attn.q_proj", init_scale=0.5, seed=3)
    path = pop.to_peft(0, tmp_path / "adapter")
    twin_model, _ = tiny_chat_model()
    twin = Population(twin_model, 1, 2, lora_targets="model.layers.*.self_attn.q_proj")
    twin.load_peft_(0, path)
    ids = torch.randint(0, 100, (2, 5), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(twin(ids, individual=0).logits, pop(ids, individual=0).logits, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------- the base model beside the individuals


@pytest.mark.parametrize(
    "ids",
    [
        [0, BASE, 2, BASE, 1, 1],  # a few rows per id: one row per group
        [BASE] * 6,
        [2, 0, BASE, 1, 0, 2, 2, 0, 1, BASE, 3, 3],  # unequal, permuted
        torch.tensor([BASE, 0, 0, 1, 2, BASE, 3, 3]),
    ],
)
def test_base_rows_equal_the_unwrapped_model_and_the_others_their_individuals(ids):
    torch.manual_seed(0)
    model = mlp(6, 16, 3)
    plain = copy.deepcopy(model)
    pop = Population(model, 4, 2, init_scale=0.5, seed=1)
    x = torch.randn(len(ids), 6)
    out = pop(x, individuals=ids)
    ref = plain(x)  # the same batch through the plain model: identical shapes, bitwise comparable
    for j, i in enumerate(ids.tolist() if isinstance(ids, torch.Tensor) else ids):
        if i == BASE:
            assert torch.equal(out[j], ref[j])
        else:
            torch.testing.assert_close(out[j], pop(x[j : j + 1], individual=i)[0], rtol=1e-5, atol=1e-6)


def test_base_rows_get_no_gradient_and_base_alone_is_the_plain_model():
    torch.manual_seed(0)
    model = mlp(6, 16, 3)
    plain = copy.deepcopy(model)
    pop = Population(model, 3, 2, init_scale=0.5, requires_grad=True)
    x = torch.randn(4, 6)
    pop(x, individuals=[BASE, BASE, BASE, BASE]).sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in pop.adapter_parameters())
    assert torch.equal(pop(x, individual=BASE), plain(x))


def test_base_in_a_route_block_and_in_generate():
    from populora.llm import tiny_chat_model

    model, _ = tiny_chat_model()
    plain = copy.deepcopy(model)
    pop = Population(model, 3, 2, init_scale=2.0, seed=1)
    ids = torch.randint(3, 100, (4, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), pop.route(individuals=[0, BASE, 2, BASE]):
        logits = model(ids).logits
    ref = plain(ids).logits
    assert torch.equal(logits[1], ref[1]) and torch.equal(logits[3], ref[3])
    assert not torch.allclose(logits[0], ref[0])
    greedy = dict(max_new_tokens=4, do_sample=False)
    out = pop.generate(ids, individuals=[BASE, 1, BASE, 0], **greedy)
    want = plain.generate(ids, **greedy)
    assert torch.equal(out[0], want[0]) and torch.equal(out[2], want[2])
    assert torch.equal(pop.generate(ids, individual=BASE, **greedy), want)


def test_negative_ids_other_than_base_stay_errors():
    pop = population()
    with pytest.raises(InvalidIndexError, match="id -1, out of range"):
        pop(torch.randn(2, 6), individuals=[0, -1])
    with pytest.raises(InvalidIndexError):
        pop(torch.randn(2, 6), individual=-1)


# ---------------------------------------------------------------------------- gradient checkpointing (HF)


@pytest.mark.parametrize("reentrant", [False, True])
def test_gradient_checkpointing_gives_the_gradients_of_the_plain_backward(reentrant, monkeypatch):
    pytest.importorskip("transformers")
    from populora.llm import tiny_chat_model

    def grads(checkpointing: bool) -> list[torch.Tensor]:
        model, _ = tiny_chat_model()
        model = model.double()
        pop = Population(model, 3, 2, requires_grad=True, seed=1, init_scale=0.5)
        model.train()
        if checkpointing:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        ids = torch.randint(0, 100, (6, 7), generator=torch.Generator().manual_seed(3))
        out = pop(ids, individuals=[2, 0, 1, 1, 0, 2], use_cache=False)
        out.logits.square().sum().backward()
        return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in pop.adapter_parameters()]

    plain = grads(False)
    for got, want in zip(grads(True), plain):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # without re-entering the route, recomputed layers run unrouted: the gradients are another model's
    import populora.routing.front as front

    monkeypatch.setattr(front, "follow_checkpointing", lambda model, router: None)
    try:  # (non-reentrant checkpointing notices the different recomputation; reentrant does not)
        unrouted = grads(True)
    except torch.utils.checkpoint.CheckpointError:
        return
    assert any(not torch.allclose(g, w) for g, w in zip(unrouted, plain))


# ---------------------------------------------------------------------------- per-individual clipping


def test_clip_grad_norm_clips_each_individual_separately():
    pop = population(P=3, requires_grad=True).double()
    x = torch.randn(6, 6, dtype=torch.float64)
    scale = torch.tensor([[1.0], [1.0], [10.0], [10.0], [100.0], [100.0]], dtype=torch.float64)
    (pop(x, all_individuals=True) * scale).square().sum().backward()
    raw = [p.grad.clone() for p in pop.adapter_parameters()]
    want = torch.stack([torch.cat([g[i].flatten() for g in raw]).norm() for i in range(3)])
    norms = pop.clip_grad_norm_(5.0)
    torch.testing.assert_close(norms, want.float())
    for i in range(3):
        now = torch.cat([p.grad[i].flatten() for p in pop.adapter_parameters()]).norm()
        expected = min(float(want[i]), 5.0)
        assert abs(float(now) - expected) < 1e-4 * max(1.0, expected)
        if want[i] <= 5.0:
            assert all(torch.equal(p.grad[i], g[i]) for p, g in zip(pop.adapter_parameters(), raw))
    with pytest.raises(InvalidValueError, match="max_norm"):
        pop.clip_grad_norm_(0.0)


# ---------------------------------------------------------------------------- optimizer state through evolution


def trained(P=6, optimizer=torch.optim.Adam, **kw):
    pop = population(P=P, requires_grad=True)
    opt = optimizer(pop.adapter_parameters(), lr=1e-2, **kw)
    x = torch.randn(2 * P, 6, generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        opt.zero_grad()
        pop(x, all_individuals=True).square().sum().backward()
        opt.step()
    return pop, opt


def state_rows(opt, pop):
    return [
        {k: v.clone() for k, v in opt.state[p].items() if isinstance(v, torch.Tensor)} for p in pop.adapter_parameters()
    ]


@pytest.mark.parametrize(
    "optimizer, kw",
    [
        (torch.optim.Adam, {}),
        (torch.optim.AdamW, {}),
        (torch.optim.SGD, {"momentum": 0.9}),
        (torch.optim.RMSprop, {}),
        (torch.optim.Adagrad, {}),
    ],
)
def test_evolve_moves_each_childs_rows_from_its_first_parent(optimizer, kw, monkeypatch):
    pop, opt = trained(optimizer=optimizer, **kw)
    before = state_rows(opt, pop)
    parents_seen = []
    inner = pop._crossover

    def spy(fn, parents, children, *a):
        parents_seen.append((parents.clone(), children.clone()))
        return inner(fn, parents, children, *a)

    monkeypatch.setattr(pop, "_crossover", spy)
    result = pop.evolve_(torch.arange(6.0), optimizer=opt)
    parents, children = parents_seen[0]
    after = state_rows(opt, pop)
    for old, new in zip(before, after):
        for key, value in new.items():
            if value.dim() == 0:
                assert torch.equal(value, old[key])  # Adam's shared step is kept
                continue
            survivors = result.selected_in_indices
            assert torch.equal(value[survivors], old[key][survivors])
            assert torch.equal(value[children], old[key][parents[:, 0]])


def test_reset_zeros_the_childrens_rows_and_keeps_the_survivors():
    pop, opt = trained()
    before = state_rows(opt, pop)
    result = pop.evolve_(torch.arange(6.0), optimizer=opt, optimizer_state="reset")
    for old, new in zip(before, state_rows(opt, pop)):
        for key in ("exp_avg", "exp_avg_sq"):
            assert not new[key][result.selected_out_indices].any()
            assert torch.equal(new[key][result.selected_in_indices], old[key][result.selected_in_indices])


def test_crossover_and_set_factors_carry_rows_too():
    pop, opt = trained()
    before = state_rows(opt, pop)
    pop.crossover_("average", [[4, 1], [5, 2]], [0, 3], optimizer=opt)
    after = state_rows(opt, pop)
    for old, new in zip(before, after):
        assert torch.equal(new["exp_avg"][[0, 3]], old["exp_avg"][[4, 5]])
    factors = [(d[2].clone(), u[2].clone()) for d, u in pop.factors()]
    pop.set_factors_(1, factors, optimizer=opt)  # inherit: the slot keeps its rows
    assert all(torch.equal(n["exp_avg"][1], a["exp_avg"][1]) for n, a in zip(state_rows(opt, pop), after))
    pop.set_factors_(1, factors, optimizer=opt, optimizer_state="reset")
    assert all(not n["exp_avg"][1].any() for n in state_rows(opt, pop))


def test_mutate_keeps_rows():
    pop, opt = trained()
    before = state_rows(opt, pop)
    pop.mutate_(all_individuals=True)
    assert all(torch.equal(b["exp_avg"], a["exp_avg"]) for b, a in zip(before, state_rows(opt, pop)))


class Shampooish(torch.optim.Optimizer):
    """An optimizer with a per-parameter matrix state: it cannot be split by individual."""

    def __init__(self, params):
        super().__init__(params, {"lr": 0.1})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["precond"] = torch.eye(p.shape[-1])
                p.add_(p.grad, alpha=-group["lr"])


def test_a_state_that_cannot_be_split_raises_before_anything_changes():
    pop, _ = trained()
    opt = Shampooish(pop.adapter_parameters())
    pop(torch.randn(6, 6), all_individuals=True).sum().backward()
    opt.step()
    before = {k: v.clone() for k, v in pop.state_dict(include_model=False).items() if isinstance(v, torch.Tensor)}
    with pytest.raises(InvalidValueError, match="cannot be split by individual"):
        pop.evolve_(torch.arange(6.0), optimizer=opt)
    after = pop.state_dict(include_model=False)
    assert all(torch.equal(before[k], after[k]) for k in before) and pop.generation == 0
    with pytest.raises(InvalidTypeError, match="torch.optim.Optimizer"):
        pop.evolve_(torch.arange(6.0), optimizer="adam")
    with pytest.raises(InvalidValueError, match="optimizer_state"):
        pop.evolve_(torch.arange(6.0), optimizer_state="fresh")


def test_a_failing_evolve_leaves_adapters_and_optimizer_rows_as_before():
    from populora import register_mutation

    def broken(factors, *, epsilon, weight_scales, generator):
        raise RuntimeError("boom")

    register_mutation("broken_for_rows", broken)
    pop, opt = trained()
    before = state_rows(opt, pop)
    with pytest.raises(RuntimeError, match="boom"):
        pop.evolve_(torch.arange(6.0), optimizer=opt, mutation_type="broken_for_rows")
    for old, new in zip(before, state_rows(opt, pop)):
        assert all(torch.equal(old[k], new[k]) for k in old)


def test_route_error_when_the_population_is_called_inside_its_own_block():
    torch.manual_seed(0)
    model = TinyTransformer(vocab=11, dim=16, heads=2, depth=1, seq=8)
    pop = Population(model, 2, 2)
    x = torch.randint(0, 11, (2, 8))
    with pop.route(individuals=[0, 1]), pytest.raises(RouteError, match="already running"):
        pop(x, individual=0)
