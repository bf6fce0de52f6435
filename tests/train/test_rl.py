"""populora.train.rl on a tiny random Llama (float64): per-token log-probs against unrouted single rows, the KL
to the base, one batched policy-gradient step against P separate single-individual steps, and bad input refused
before anything moves."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

pytest.importorskip("transformers")

from populora import BASE, Population
from populora.errors import FitnessError, InvalidIndexError, InvalidTypeError, InvalidValueError
from populora.llm import tiny_chat_model
from populora.optim import ClipUp
from populora.train import LRMultipliers, PolicyGradient, kl_to_base, policy_gradient_step_, token_logprobs

TARGETS = ["model.layers.*.self_attn.q_proj", "model.layers.*.self_attn.v_proj", "model.layers.*.mlp.down_proj"]


VOCAB = tiny_chat_model()[0].get_input_embeddings().num_embeddings


def population(P: int = 3, init_scale: float = 0.5, **kw) -> Population:
    model, _ = tiny_chat_model()
    return Population(model.double(), P, 2, TARGETS, seed=1, init_scale=init_scale, **kw)


def rows(n: int, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """``n`` prompts (2 to 6 tokens) and replies (0 to 5 tokens; reply 1 empty) of ids in [2, 128)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 7, (n,), generator=g).tolist(), torch.randint(1, 6, (n,), generator=g).tolist()
    prompts = [torch.randint(2, 128, (k,), generator=g).tolist() for k in lengths[0]]
    replies = [torch.randint(2, 128, (k,), generator=g).tolist() if j != 1 else [] for j, k in enumerate(lengths[1])]
    return prompts, replies


def reference_logprobs(pop: Population, individual: int, prompt: list[int], reply: list[int]) -> torch.Tensor:
    """Row alone, no padding, through one individual (BASE: the plain model)."""
    x = torch.tensor([prompt + reply])
    with torch.no_grad():
        logits = pop(x, individual=individual, use_cache=False).logits[0]
    logp = torch.log_softmax(logits[:-1], -1).gather(-1, x[0, 1:, None]).squeeze(-1)
    return logp[len(prompt) - 1 :]


# ---------------------------------------------------------------------------------------------- log-probs


def test_token_logprobs_equal_each_row_alone_through_its_individual_left_padding_and_base_rows_included():
    pop = population()
    prompts, replies = rows(7)
    ids = [2, 0, BASE, 1, 0, 2, BASE]
    with torch.no_grad():
        out = token_logprobs(pop, prompts, replies, torch.tensor(ids), micro_batch=3, pad_id=0)
    width = max(len(r) for r in replies)
    assert out.logprobs.shape == out.mask.shape == (7, width) and out.logprobs.dtype == torch.float64
    for j, (p, r, i) in enumerate(zip(prompts, replies, ids)):
        assert out.mask[j].tolist() == [t < len(r) for t in range(width)]
        assert not out.logprobs[j, len(r) :].any()
        if r:
            torch.testing.assert_close(out.logprobs[j, : len(r)], reference_logprobs(pop, i, p, r), rtol=0, atol=1e-10)
    # individuals differ from the base: the routing is not a no-op
    assert not torch.allclose(out.logprobs[0, : len(replies[0])], reference_logprobs(pop, BASE, prompts[0], replies[0]))


def test_token_logprobs_carry_the_graph_of_each_individual():
    pop = population(requires_grad=True)
    prompts, replies = rows(4, seed=1)
    out = token_logprobs(pop, prompts, replies, [1, 1, 1, 1], micro_batch=2)
    out.logprobs.sum().backward()
    grads = [p.grad for p in pop.adapter_parameters()]
    assert all(g[1].abs().sum() > 0 for g in grads) and all(not g[[0, 2]].any() for g in grads)


def test_kl_to_base_is_zero_for_zero_adapters_and_positive_otherwise():
    prompts, replies = rows(5, seed=2)
    ids = [0, 1, 2, 0, 1]
    zero = kl_to_base(population(init_scale=0.0), prompts, replies, ids, micro_batch=2)
    assert zero.mask.any() and torch.equal(zero.logprobs, torch.zeros_like(zero.logprobs))
    kl = kl_to_base(population(init_scale=2.0), prompts, replies, ids, micro_batch=2)
    assert bool((kl.logprobs[kl.mask] > 0).all()) and not kl.logprobs[~kl.mask].any()


# ---------------------------------------------------------------------------------------------- one step


def adapters(pop: Population) -> list[torch.Tensor]:
    return [p.detach().clone() for p in pop.adapter_parameters()]


CASES = {
    "adamw_token_mean_kl_clip": (
        lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
        dict(reduction="token_mean", kl_coef=0.3, max_grad_norm=0.05),
    ),
    "sgd_momentum_sequence_mean": (
        lambda ps: torch.optim.SGD(ps, lr=0.5, momentum=0.9),
        dict(reduction="sequence_mean", kl_estimator="k2", kl_coef=0.1),
    ),
    "clipup_per_individual_sum": (lambda ps: ClipUp(ps, lr=1e-2, per_individual=True), dict(reduction="sum")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_batched_step_equals_p_separate_single_individual_steps(case):
    """Individual 0 has three rows, 1 two, 2 none; the optimizer already holds state from a first step; each
    individual's own step (on a twin with its own optimizer copy) takes the batch's advantages for its rows,
    and individual 2's is a zero-gradient step."""
    make_opt, options = CASES[case]
    config = PolicyGradient(**options)
    pop = population()
    opt = make_opt(pop.adapter_parameters())
    lr = LRMultipliers(3, values=[1.0, 0.5, 2.0])
    prompts, replies = rows(5, seed=3)
    policy_gradient_step_(pop, opt, prompts, replies, [2, 1, 0, 2, 1], [1.0, -0.5, 0.3, -1.0, 0.7], config)
    ids = [0, 1, 0, 1, 0]
    adv = [0.8, -0.2, -1.1, 0.6, 0.4]
    twins = [copy.deepcopy((pop, opt, lr)) for _ in range(3)]
    stats = policy_gradient_step_(
        pop, opt, prompts, replies, ids, adv, dataclasses.replace(config, micro_batch=2), lr_multipliers=lr
    )
    for i, (twin, twin_opt, twin_lr) in enumerate(twins):
        mine = [j for j, k in enumerate(ids) if k == i]
        alone = policy_gradient_step_(
            twin,
            twin_opt,
            [prompts[j] for j in mine],
            [replies[j] for j in mine],
            [i] * len(mine),
            [adv[j] for j in mine],
            config,
            lr_multipliers=twin_lr,
        )
        for got, want in zip(pop.adapter_parameters(), twin.adapter_parameters()):
            torch.testing.assert_close(got[i], want[i], rtol=0, atol=1e-6)
        assert float(alone.grad_norms[i]) == pytest.approx(float(stats.grad_norms[i]), rel=1e-6, abs=1e-12)
    assert stats.tokens.tolist() == [sum(len(replies[j]) for j, k in enumerate(ids) if k == i) for i in range(3)]
    assert float(stats.grad_norms[2]) == 0.0 and float(stats.grad_norms[0]) > 0
    if options.get("kl_coef"):
        assert stats.kl is not None and bool((stats.kl[:2] > 0).all()) and float(stats.kl[2]) == 0.0


def test_a_population_without_requires_grad_trains_and_keeps_its_flags():
    pop = population()  # requires_grad=False
    before = adapters(pop)
    opt = torch.optim.SGD(pop.adapter_parameters(), lr=1.0)
    prompts, replies = rows(4, seed=4)
    # individual 1's rows all have advantage 0: exactly no gradient, so plain SGD leaves it where it was
    stats = policy_gradient_step_(pop, opt, prompts, replies, [0, 1, 0, 1], [1.0, 0.0, -1.0, 0.0])
    after = adapters(pop)
    assert all(not p.requires_grad for p in pop.parameters())
    assert any(not torch.equal(a[0], b[0]) for a, b in zip(after, before))
    assert all(torch.equal(a[1], b[1]) and torch.equal(a[2], b[2]) for a, b in zip(after, before))
    assert float(stats.grad_norms[1]) == 0.0 and stats.kl is None


def test_the_step_raises_the_log_probability_of_rewarded_replies():
    pop = population()
    prompts, replies = [[5, 6, 7], [5, 6, 7]], [[20, 21, 22], [40, 41]]
    opt = torch.optim.Adam(pop.adapter_parameters(), lr=1e-2)
    with torch.no_grad():
        before = token_logprobs(pop, prompts, replies, [0, 0])
    for _ in range(3):
        policy_gradient_step_(pop, opt, prompts, replies, [0, 0], [1.0, -1.0])
    with torch.no_grad():
        after = token_logprobs(pop, prompts, replies, [0, 0])
    assert float(after.logprobs[0].sum()) > float(before.logprobs[0].sum())
    assert float(after.logprobs[1].sum()) < float(before.logprobs[1].sum())


# ---------------------------------------------------------------------------------------------- bad input


BAD = {
    "id out of range": (
        dict(individuals=[0, 3, 1]),
        InvalidIndexError,
        r"`individuals\[1\]` must be an id in \[0, 3\)",
    ),
    "float id": (dict(individuals=[0, 1.0, 1]), InvalidTypeError, r"`individuals\[1\]` must be an int id"),
    "float id tensor": (dict(individuals=torch.tensor([0.0, 1.0, 1.0])), InvalidTypeError, "integer ids"),
    "BASE": (dict(individuals=[0, BASE, 1]), InvalidIndexError, r"`individuals\[1\]` is BASE"),
    "NaN advantage": (dict(advantages=[0.5, float("nan"), 1.0]), FitnessError, "at row 1"),
    "inf advantage": (dict(advantages=[0.5, 1.0, float("inf")]), FitnessError, "at row 2"),
    "lengths": (dict(advantages=[0.5, 1.0]), FitnessError, r"shape \(3,\)"),
    "rows": (dict(individuals=[0, 1]), InvalidValueError, "one entry per row"),
    "empty prompt": (dict(prompts=[[3, 4], [], [5]]), InvalidValueError, r"`prompts\[1\]` is empty"),
    "float token": (dict(replies=[[3], [4.5], [5]]), InvalidTypeError, r"`replies\[1\]` must hold int token ids"),
    "negative token": (dict(replies=[[3], [-4], [5]]), InvalidValueError, "negative token id -4"),
    # (0.5.0's flat keywords, deprecated: the config refuses the value, naming its field, before anything moves)
    "reduction": (dict(reduction="mean"), InvalidValueError, "`PolicyGradient.reduction` must be one of"),
    "kl_coef": (dict(kl_coef=-1.0), InvalidValueError, "`PolicyGradient.kl_coef`"),
    "optimizer": (dict(optimizer="adam"), InvalidTypeError, "torch.optim.Optimizer"),
    "other parameters": (
        dict(optimizer=torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)),
        InvalidValueError,
        "holds none of the population's adapter parameters",
    ),
    "lr multipliers": (dict(lr_multipliers=LRMultipliers(4)), InvalidValueError, "holds 4 multipliers"),
    "token beyond the vocabulary": (
        dict(replies=[[3], [4, 10**6], [5]]),
        InvalidIndexError,
        r"`replies\[1\]` holds the token id 1000000 \(position 1\), out of the model's vocabulary \[0, \d+\)",
    ),
    "prompt token at the vocabulary size": (
        dict(prompts=[[3, 4], torch.tensor([5, VOCAB]), [5]]),
        InvalidIndexError,
        rf"`prompts\[1\]` holds the token id {VOCAB} \(position 1\), out of the model's vocabulary \[0, {VOCAB}\)",
    ),
    "pad_id beyond the vocabulary": (
        dict(config=PolicyGradient(pad_id=VOCAB + 3)),
        InvalidIndexError,
        rf"`pad_id` is {VOCAB + 3}",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_raises_before_anything_moves(case):
    pop = population(requires_grad=True)
    opt = torch.optim.Adam(pop.adapter_parameters(), lr=1e-2)
    prompts, replies = [[3, 4], [5, 6, 7], [5]], [[8, 9], [10], [11, 12]]
    policy_gradient_step_(pop, opt, prompts, replies, [0, 1, 2], [1.0, -1.0, 0.5])  # state exists, grads are set
    params, grads = adapters(pop), [p.grad.clone() for p in pop.adapter_parameters()]
    state = copy.deepcopy(opt.state_dict())
    bad, error, match = BAD[case]
    call = dict(optimizer=opt, prompts=prompts, replies=replies, individuals=[0, 1, 2], advantages=[1.0, 0.5, -1.0])
    call.update(bad)
    with pytest.raises(error, match=match):
        policy_gradient_step_(
            pop,
            call.pop("optimizer"),
            call.pop("prompts"),
            call.pop("replies"),
            call.pop("individuals"),
            call.pop("advantages"),
            **call,
        )
    assert all(torch.equal(a, b) for a, b in zip(adapters(pop), params))
    assert all(torch.equal(p.grad, g) for p, g in zip(pop.adapter_parameters(), grads))
    after = opt.state_dict()
    assert after["param_groups"] == state["param_groups"]
    for k, entry in state["state"].items():
        assert all(torch.equal(entry[key], after["state"][k][key]) for key in entry)
    assert all(p.requires_grad for p in pop.adapter_parameters())


@pytest.mark.parametrize("where", ["forward", "backward", "unknown vocabulary"])
def test_a_step_that_raises_inside_puts_the_callers_gradients_back(where, monkeypatch):
    """A forward or backward that raises after a micro batch already ran (and, with the vocabulary unknown to
    the checks, torch's own IndexError): the caller's ``.grad`` tensors come back, the same objects with the
    same values, on every parameter the optimizer holds; parameters, optimizer state and flags unchanged."""
    pop = population(requires_grad=True)
    extra = torch.nn.Parameter(torch.ones(3))
    extra.grad = torch.full((3,), 7.0)
    opt = torch.optim.Adam([*pop.adapter_parameters(), extra], lr=1e-2)
    prompts, replies = [[3, 4], [5, 6, 7], [5]], [[8, 9], [10], [11, 12]]
    policy_gradient_step_(pop, opt, prompts, replies, [0, 1, 2], [1.0, -1.0, 0.5])  # state exists, grads are set
    extra.grad = torch.full((3,), 7.0)
    held = [*pop.adapter_parameters(), extra]
    grads = [p.grad for p in held]
    values = [g.clone() for g in grads]
    params, state = adapters(pop), copy.deepcopy(opt.state_dict())
    calls = [0]
    if where == "unknown vocabulary":
        model = pop.model
        monkeypatch.setattr(model, "get_input_embeddings", lambda: None)
        monkeypatch.delattr(model.config, "vocab_size", raising=False)
        monkeypatch.setattr(type(model.config), "vocab_size", None, raising=False)
        replies = [[8, 9], [10, 10**6], [11, 12]]
        error: type[BaseException] = IndexError
    else:
        forward = pop.forward
        error = RuntimeError

        def failing(*args, **kwargs):
            calls[0] += 1
            out = forward(*args, **kwargs)
            if calls[0] == 2:  # the second micro batch: the first one's backward already ran
                if where == "forward":
                    raise RuntimeError("out of memory (simulated)")
                out.logits.register_hook(lambda grad: (_ for _ in ()).throw(RuntimeError("backward (simulated)")))
            return out

        monkeypatch.setattr(pop, "forward", failing)
    with pytest.raises(error):
        policy_gradient_step_(pop, opt, prompts, replies, [0, 1, 2], [1.0, 0.5, -1.0], PolicyGradient(micro_batch=1))
    assert where == "unknown vocabulary" or calls[0] == 2
    assert all(p.grad is g for p, g in zip(held, grads))
    assert all(torch.equal(p.grad, v) for p, v in zip(held, values))
    assert all(torch.equal(a, b) for a, b in zip(adapters(pop), params))
    after = opt.state_dict()
    for k, entry in state["state"].items():
        assert all(torch.equal(entry[key], after["state"][k][key]) for key in entry)
    assert all(p.requires_grad for p in pop.adapter_parameters())


def test_token_logprobs_refuses_a_token_beyond_the_vocabulary():
    pop = population()
    with pytest.raises(InvalidIndexError, match=rf"`prompts\[0\]` holds the token id {VOCAB} \(position 0\)"):
        token_logprobs(pop, [[VOCAB, 4]], [[5]], [0])
    with pytest.raises(InvalidIndexError, match=r"`pad_id`"):
        token_logprobs(pop, [[3, 4]], [[5]], [0], pad_id=VOCAB)


def test_token_logprobs_checks_its_rows_too():
    pop = population()
    with pytest.raises(InvalidIndexError, match=r"`individuals\[0\]` must be an id in \[0, 3\)"):
        token_logprobs(pop, [[3, 4]], [[5]], [-1])
    with pytest.raises(InvalidTypeError, match=r"`prompts\[0\]` must be a 1-D integer tensor"):
        token_logprobs(pop, [torch.tensor([3.0, 4.0])], [[5]], [0])
    with pytest.raises(InvalidValueError, match="`micro_batch` must be an int >= 1"):
        token_logprobs(pop, [[3, 4]], [[5]], [0], micro_batch=0)
