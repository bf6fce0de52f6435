"""ES reasoning (populora.llm.reasoning): verifier rewards from one routed generate, group normalisation,
the "ES at scale" step-size mapping, reproducible ES steps on a tiny random Llama (block weights and a LoRA),
and the example's tiny mode.

The tiny model gets a real Hugging Face tokenizer built offline (one token per character, a chat template),
and a verifier whose replies from a random model are solved about half the time (a check on the reply's
characters), so the reward matrix has informative prompts.
"""

from __future__ import annotations

import copy
import math
import string
from dataclasses import dataclass

import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from populora import EggrollES  # noqa: E402
from populora.errors import FitnessError, InvalidTypeError, InvalidValueError  # noqa: E402
from populora.llm.reasoning import (  # noqa: E402
    ES_AT_SCALE,
    block_weights,
    encode_prompts,
    es_at_scale_lr,
    generate_replies,
    group_normalize,
    verifier_accuracy,
    verifier_rewards,
    verifier_step,
)

CHARS = string.digits + string.ascii_letters + " +-*/=?.,:<>|'()[]!\n"
NEW = 6


def char_tokenizer():
    """A real PreTrainedTokenizerFast: one token per character, pad 0, eos 1, a chat template."""
    from tokenizers import Regex, decoders, models, pre_tokenizers

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for c in CHARS:
        vocab.setdefault(c, len(vocab))
    tk = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    tok.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    return tok


TOK = char_tokenizer()


def tiny_llama(dtype=torch.float32):
    config = transformers.LlamaConfig(
        vocab_size=len(TOK),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return transformers.LlamaForCausalLM(config).to(dtype).eval()


@dataclass(frozen=True)
class CharProblem:
    """A verifiable problem for a random model: solved when the reply holds more letters than other characters."""

    question: str

    def check(self, reply: str) -> bool:
        letters = sum(c.isalpha() for c in reply)
        return 2 * letters > len(reply)


PROBLEMS = [
    CharProblem(q) for q in ("What is 3 + 4?", "Next after 199?", "Sort [3, 1, 2]", "Is 7 > 5?", "2 * 6 = ?", "Say hi")
]


def _es(model, n=6, sigma=0.05, lr=0.5, **kw):
    return EggrollES(
        model,
        n,
        sigma,
        lr,
        2,
        seed=kw.pop("seed", 3),
        param_filter=kw.pop("param_filter", block_weights),
        fitness_shaping=kw.pop("fitness_shaping", "raw"),
        **kw,
    )


# ----------------------------------------------------------------------------- group normalisation


def test_group_normalize_on_a_hand_made_matrix_zero_std_prompts_contribute_zero():
    rewards = torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 1.0, 0.0]])
    z = group_normalize(rewards)
    # column 0: mean 2/3, std sqrt(2)/3 -> (1/sqrt2, -sqrt2, 1/sqrt2); columns 1 and 2: zero std -> 0;
    # column 3: mean 1/3 -> (sqrt2, -1/sqrt2, -1/sqrt2); mean over the 4 prompts
    s = math.sqrt(2.0)
    expected = torch.tensor([(1 / s + s) / 4, (-s - 1 / s) / 4, 0.0], dtype=torch.float64)
    assert z.dtype == torch.float64 and z.shape == (3,)
    torch.testing.assert_close(z, expected, rtol=0, atol=1e-12)
    assert abs(float(z.sum())) < 1e-12
    # a prompt everyone solves (or fails), also with non-binary rewards, contributes exactly 0
    flat = torch.tensor([[0.3, 1.0], [0.3, 0.0], [0.3, 1.0], [0.3, 1.0]])
    torch.testing.assert_close(group_normalize(flat), group_normalize(flat[:, 1:]) / 2, rtol=0, atol=1e-15)
    assert torch.equal(group_normalize(torch.ones(4, 3)), torch.zeros(4, dtype=torch.float64))
    # z-scores are scale and shift invariant per prompt
    torch.testing.assert_close(group_normalize(rewards * 5 - 2), z, rtol=0, atol=1e-12)


def test_group_normalize_within_groups():
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    groups = torch.tensor([[0, 2], [1, 3]])  # es.groups() of EggrollES(4, group_size=2): pairs with their mirrors
    z = group_normalize(rewards, groups)
    # group {0, 2}: column 0 (1, 0) -> (1, -1), column 1 (0, 1) -> (-1, 1): means (0, 0)
    # group {1, 3}: column 0 (0, 0) -> 0, column 1 (0, 1) -> (-1, 1): means (-1/2, 1/2)
    assert torch.equal(z, torch.tensor([0.0, -0.5, 0.0, 0.5], dtype=torch.float64))
    assert not torch.equal(z, group_normalize(rewards))  # one group of 4 differs


def test_group_normalize_rejects_bad_input():
    with pytest.raises(InvalidTypeError, match=r"`rewards` must be a real \(N, k\) tensor.*shape \(3,\)"):
        group_normalize(torch.zeros(3))
    with pytest.raises(InvalidValueError, match=r"`rewards` holds NaN at \(member, prompt\) \[1, 0\]"):
        group_normalize(torch.tensor([[0.0, 1.0], [math.nan, 0.0]]))
    with pytest.raises(InvalidValueError, match=r"`groups` must hold every member id 0..3 exactly once"):
        group_normalize(torch.zeros(4, 2), torch.tensor([[0, 1], [1, 3]]))
    with pytest.raises(InvalidTypeError, match=r"`groups` must be a \(N/G, G\) integer tensor"):
        group_normalize(torch.zeros(4, 2), [[0, 1], [2, 3]])
    with pytest.raises(InvalidValueError, match=r"`rewards` has no prompt column"):
        group_normalize(torch.zeros(4, 0))


# ----------------------------------------------------------------------------- the step-size convention


def test_es_at_scale_lr_mapping_and_recipe():
    assert es_at_scale_lr(5e-4, 1e-3, 30) == pytest.approx(5e-4 / (1e-3 * math.sqrt(30)))
    assert round(ES_AT_SCALE.lr, 4) == 0.0913
    assert ES_AT_SCALE[:4] == (30, 1e-3, 5e-4, 200) and ES_AT_SCALE.greedy
    with pytest.raises(InvalidValueError, match="sigma"):
        es_at_scale_lr(5e-4, 0.0, 30)
    with pytest.raises(InvalidValueError, match="num_members"):
        es_at_scale_lr(5e-4, 1e-3, 0)


def _lora(model):
    peft = pytest.importorskip("peft")
    lora = peft.get_peft_model(
        model, peft.LoraConfig(r=2, lora_alpha=2, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"])
    )
    with torch.no_grad():  # lora_B starts at zero: give it values so the check sees both factors move
        for name, p in lora.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name)), dtype=p.dtype))
    return lora


@pytest.mark.parametrize("way", ["blocks", "lora"])
def test_our_update_with_the_mapped_lr_is_the_papers_step(way):
    """theta' - theta == alpha / N * sum_i z_i eps_i, eps_i = (theta_i - theta) / sigma, z the raw fitnesses."""
    n, sigma, alpha = 6, 0.01, 0.2
    model = tiny_llama(torch.float64)
    if way == "lora":
        model = _lora(model)
        es = EggrollES(model, n, sigma, es_at_scale_lr(alpha, sigma, n), 2, seed=5, fitness_shaping="raw")
        assert es.param_names and all(".lora_A." in p or ".lora_B." in p for p in es.param_names)
    else:
        es = _es(model, n, sigma, es_at_scale_lr(alpha, sigma, n), seed=5)
        assert len(es.param_names) == 14 and not any("norm" in p or "embed" in p for p in es.param_names)
    theta = {k: v.detach().clone() for k, v in model.named_parameters()}
    eps = [{k: (v - theta[k]) / sigma for k, v in es.individual_params(i).items()} for i in range(n)]
    z = torch.tensor([0.7, -0.2, 1.5, -1.1, 0.4, -1.3], dtype=torch.float64)
    es.tell(z)
    after = dict(model.named_parameters())
    for name in es.param_names:
        step = alpha / n * sum(float(z[i]) * eps[i][name] for i in range(n))
        assert float(step.abs().max()) > 1e-4, name
        torch.testing.assert_close(after[name].detach() - theta[name], step, rtol=1e-6, atol=1e-9)
    frozen = [k for k in theta if k not in es.param_names]
    assert frozen and all(torch.equal(after[k].detach(), theta[k]) for k in frozen)


# ----------------------------------------------------------------------------- verifier rewards


def _manual(members, problems, width_rows):
    """Per member: all rows routed to that member, same (N n) batch shape; its own block decoded and checked."""
    batch = encode_prompts(TOK, [p.question for p in problems])
    reps = width_rows // len(problems)
    ids, mask = batch["input_ids"].repeat(reps, 1), batch["attention_mask"].repeat(reps, 1)
    kw = dict(max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    rewards, replies = [], []
    for i in range(members.pop_size):
        out = members.generate(ids, mask, individuals=[i] * ids.shape[0], **kw)
        block = out[i * len(problems) : (i + 1) * len(problems), ids.shape[1] :]
        texts = TOK.batch_decode(block, skip_special_tokens=True)
        replies.append(texts)
        rewards.append([float(p.check(t)) for p, t in zip(problems, texts)])
    return torch.tensor(rewards), replies, ids, mask


def test_verifier_rewards_equal_per_individual_generation_and_check():
    model = tiny_llama()
    es = _es(model)
    members = es.ask()
    rewards, replies = verifier_rewards(members, TOK, PROBLEMS, max_new_tokens=NEW, return_replies=True)
    assert rewards.shape == (6, len(PROBLEMS)) and rewards.dtype == torch.float32
    manual, manual_replies, ids, mask = _manual(members, PROBLEMS, 6 * len(PROBLEMS))
    assert replies == manual_replies
    assert torch.equal(rewards, manual)
    assert 0 < float(rewards.mean()) < 1 and len({tuple(r) for r in replies}) > 1  # members differ
    assert float(group_normalize(rewards).abs().sum()) > 0  # some prompts separate the members
    # member 2's replies are those of a plain model holding member 2's weights (same batch shape)
    es.close()  # the model's own forwards again, then a copy holding member 2's weights
    merged = copy.deepcopy(model)
    with torch.no_grad():
        for name, value in es.individual_params(2).items():
            merged.get_parameter(name).copy_(value)
        out = merged.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    k = len(PROBLEMS)
    assert TOK.batch_decode(out[2 * k : 3 * k, ids.shape[1] :], skip_special_tokens=True) == replies[2]
    # chunks of whole members (max_rows) give the same rewards here, and a reward_fn replaces check()
    es2 = _es(tiny_llama())
    chunked = verifier_rewards(es2.ask(), TOK, PROBLEMS, max_new_tokens=NEW, max_rows=2 * k)
    torch.testing.assert_close(chunked, rewards)
    lengths = verifier_rewards(es2.ask(), TOK, PROBLEMS, max_new_tokens=NEW, reward_fn=lambda p, r: len(r))
    assert torch.equal(lengths, torch.tensor([[float(len(t)) for t in row] for row in replies]))


def test_verifier_rewards_with_groups_answer_their_own_slice():
    es = _es(tiny_llama(), n=4, group_size=2)
    groups = es.groups()
    assert groups.tolist() == [[0, 2], [1, 3]]
    members = es.ask()
    problems = PROBLEMS[:4]
    rewards, replies = verifier_rewards(members, TOK, problems, max_new_tokens=NEW, groups=groups, return_replies=True)
    assert rewards.shape == (4, 2)
    # group 0 (members 0, 2) answers problems 0-1, group 1 (members 1, 3) problems 2-3: rows in member order
    cols = [0, 1, 2, 3, 0, 1, 2, 3]
    batch = encode_prompts(TOK, [problems[c].question for c in cols])
    out = members.generate(
        batch["input_ids"],
        batch["attention_mask"],
        individuals=[0, 0, 1, 1, 2, 2, 3, 3],
        max_new_tokens=NEW,
        do_sample=False,
        pad_token_id=0,
    )
    texts = TOK.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    assert replies == [texts[0:2], texts[2:4], texts[4:6], texts[6:8]]
    assert rewards.tolist() == [
        [float(problems[c].check(t)) for c, t in zip(cols[2 * i : 2 * i + 2], texts[2 * i :])] for i in range(4)
    ]
    with pytest.raises(
        InvalidValueError,
        match=r"with 2 groups the number of problems must be a multiple of 2 "
        r"\(each group answers its own slice\), got 3",
    ):
        verifier_rewards(members, TOK, PROBLEMS[:3], max_new_tokens=NEW, groups=groups)


def test_verifier_rewards_reject_bad_input():
    es = _es(tiny_llama())
    members = es.ask()
    with pytest.raises(InvalidTypeError, match=r"`members` must be a routed population handle.*LlamaForCausalLM"):
        verifier_rewards(es.model, TOK, PROBLEMS, max_new_tokens=NEW)
    with pytest.raises(InvalidValueError, match=r"`problems` must be a non-empty sequence"):
        verifier_rewards(members, TOK, [], max_new_tokens=NEW)
    with pytest.raises(InvalidValueError, match=r"max_new_tokens"):
        verifier_rewards(members, TOK, PROBLEMS, max_new_tokens=0)
    with pytest.raises(InvalidTypeError, match=r"problem 0 \(int\) has no `question`"):
        verifier_rewards(members, TOK, [3], max_new_tokens=NEW)
    with pytest.raises(FitnessError, match=r"the verifier must return a bool or a number, got str"):
        verifier_rewards(members, TOK, PROBLEMS, max_new_tokens=NEW, reward_fn=lambda p, r: "yes")
    with pytest.raises(InvalidValueError, match=r"chat_template=True but the tokenizer has no chat template"):
        tok = char_tokenizer()
        tok.chat_template = None
        encode_prompts(tok, ["x"], chat_template=True)
    assert es.generation == 0  # nothing moved


def test_verifier_accuracy_of_the_plain_model():
    model = tiny_llama()
    replies = generate_replies(model, TOK, [p.question for p in PROBLEMS], max_new_tokens=NEW, batch_size=4)
    expected = sum(p.check(r) for p, r in zip(PROBLEMS, replies)) / len(PROBLEMS)
    assert verifier_accuracy(model, TOK, PROBLEMS, max_new_tokens=NEW, batch_size=4) == expected


# ----------------------------------------------------------------------------- ES steps on the verifier


def _run(way: str, steps: int = 2):
    model = tiny_llama()
    if way == "lora":
        peft = pytest.importorskip("peft")
        with torch.random.fork_rng():  # PEFT draws lora_A from the global RNG
            torch.manual_seed(1)
            model = peft.get_peft_model(
                model,
                peft.LoraConfig(r=2, lora_alpha=2, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"]),
            )
        es = EggrollES(model, 6, 0.5, 1.0, 2, seed=11, fitness_shaping="raw")
    else:
        es = _es(model, seed=11)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    seen = []
    for step in range(steps):
        stats, rewards = verifier_step(es, TOK, PROBLEMS, max_new_tokens=NEW)
        seen.append(rewards)
        assert stats.generation == step
    return model, before, seen, es


@pytest.mark.parametrize("way", ["blocks", "lora"])
def test_es_steps_on_the_verifier_are_reproducible_from_the_seed(way):
    (m1, before, r1, es), (m2, _, r2, _) = _run(way), _run(way)
    assert all(torch.equal(a, b) for a, b in zip(r1, r2))
    p1, p2 = dict(m1.named_parameters()), dict(m2.named_parameters())
    assert all(torch.equal(p1[k], p2[k]) for k in p1)
    moved = [k for k in es.param_names if not torch.equal(p1[k].detach(), before[k])]
    assert moved == es.param_names  # the verifier's signal moved every evolved weight
    frozen = [k for k in p1 if k not in es.param_names]
    assert all(torch.equal(p1[k].detach(), before[k]) for k in frozen)
    if way == "lora":
        assert all(".lora_" in k for k in es.param_names)


def test_verifier_rewards_on_populora_tasks_problems_use_task_prompt_and_problem_check():
    tasks = pytest.importorskip("populora.tasks")
    task = tasks.Countdown(1)
    problems = task.sample(4, torch.Generator().manual_seed(0))
    es = _es(tiny_llama(), n=4)
    members = es.ask()
    rewards, replies = verifier_rewards(members, TOK, problems, max_new_tokens=NEW, task=task, return_replies=True)
    batch = encode_prompts(TOK, [task.prompt(p) for p in problems])
    out = members.generate(
        batch["input_ids"].repeat(4, 1),
        batch["attention_mask"].repeat(4, 1),
        individuals=torch.arange(4).repeat_interleave(4),
        max_new_tokens=NEW,
        do_sample=False,
        pad_token_id=0,
    )
    texts = TOK.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    assert replies == [texts[4 * i : 4 * i + 4] for i in range(4)]
    assert rewards.tolist() == [[float(p.check(r)) for p, r in zip(problems, row)] for row in replies]
    # a reply that solves problem 0 scores 1 through Problem.check
    solved = verifier_rewards(
        members, TOK, problems[:1], max_new_tokens=NEW, task=task, reward_fn=lambda p, r: p.check(p.data["expression"])
    )
    assert torch.equal(solved, torch.ones(4, 1))


def test_verifier_step_grouped_uses_the_es_groups():
    es = _es(tiny_llama(), n=4, group_size=2)
    before = {k: v.detach().clone() for k, v in es.model.named_parameters()}
    stats, rewards = verifier_step(es, TOK, PROBLEMS[:4], max_new_tokens=NEW, grouped=True)
    assert rewards.shape == (4, 2) and stats.generation == 0 and es.generation == 1
    moved = any(not torch.equal(p.detach(), before[k]) for k, p in es.model.named_parameters())
    assert moved == bool(group_normalize(rewards, es.groups()).abs().sum() > 0)


def test_verifier_step_refuses_return_replies_before_a_step():
    es = _es(tiny_llama(), n=4)
    with pytest.raises(InvalidValueError, match="return_replies"):
        verifier_step(es, TOK, PROBLEMS[:2], max_new_tokens=NEW, return_replies=True)
    assert es.generation == 0
