"""generate_by_member and GumbelNoise (populora.llm.text): a member's tokens depend on its rows, adapter and
generator only; the noise samples the warped softmax; greedy stays greedy."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from populora import Population
from populora.llm import tiny_chat_model
from populora.llm.text import GumbelNoise, chat_text, generate_by_member

BLOCK = ["model.layers.*.self_attn.*_proj", "model.layers.*.mlp.*_proj"]
SAMPLE = dict(max_new_tokens=6, do_sample=True, temperature=1.0, pad_token_id=0)


def setup(p: int = 3):
    model, tok = tiny_chat_model(seed=0)
    pop = Population(model, p, 2, BLOCK, seed=1, init_scale=0.5)
    texts = [chat_text(tok, m, True) for m in ("Hi", "What is 1 + 2?", "A longer question, with words", "Ok")]
    return pop, tok, texts


def generators(p: int, seed: int = 0) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(seed + i) for i in range(p)]


def test_a_members_tokens_do_not_depend_on_the_other_members_rows():
    pop, tok, texts = setup()
    ids = [0, 1, 0, 2, 1]
    rows = [texts[0], texts[1], texts[2], texts[3], texts[2]]
    both = generate_by_member(pop, tok, ids, rows, generators(3), SAMPLE)
    # member 0 alone, with the same two rows in the same order and a fresh generator of the same seed
    alone = generate_by_member(pop, tok, [0, 0], [rows[0], rows[2]], generators(3), SAMPLE)
    assert [both.reply_ids[0], both.reply_ids[2]] == alone.reply_ids
    # the other members' rows change, member 0's do not
    other = generate_by_member(pop, tok, [0, 1, 0], [rows[0], texts[3], rows[2]], generators(3), SAMPLE)
    assert [other.reply_ids[0], other.reply_ids[2]] == alone.reply_ids
    assert both.tokens == sum(len(r) for r in both.reply_ids) > 0
    assert both.texts == [tok.decode(r, skip_special_tokens=True) for r in both.reply_ids]


def test_a_members_generator_alone_advances_and_seeds_its_draws():
    pop, tok, texts = setup()
    gens = generators(3)
    before = [g.get_state() for g in gens]
    first = generate_by_member(pop, tok, [1, 1], texts[:2], gens, SAMPLE)
    assert torch.equal(gens[0].get_state(), before[0]) and torch.equal(gens[2].get_state(), before[2])
    assert not torch.equal(gens[1].get_state(), before[1])
    second = generate_by_member(pop, tok, [1, 1], texts[:2], gens, SAMPLE)  # the generator moved on
    again = generate_by_member(pop, tok, [1, 1], texts[:2], generators(3), SAMPLE)
    assert again.reply_ids == first.reply_ids and second.reply_ids != first.reply_ids


def test_greedy_rows_are_the_routed_greedy_generate():
    pop, tok, texts = setup()
    greedy = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
    out = generate_by_member(pop, tok, [2], texts[1:2], generators(3), greedy)
    from populora.llm.text import encode

    ids, mask = encode(tok, texts[1:2])
    with torch.no_grad():
        ref = pop.generate(ids, mask, individual=2, **greedy)[0, ids.shape[1] :].tolist()
    assert out.reply_ids[0] == ref[: len(out.reply_ids[0])] and len(out.reply_ids[0]) > 0


def test_gumbel_noise_samples_the_warped_softmax():
    scores = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(20000, 1)
    g = torch.Generator().manual_seed(0)
    draws = GumbelNoise(g)(None, scores).argmax(-1)
    freq = torch.bincount(draws, minlength=4).double() / len(draws)
    assert torch.allclose(freq, scores[0].double().softmax(0), atol=0.015)
    # top_k=2 keeps the two best; top_p=0.5 keeps the smallest head of mass >= 0.5 (here the best alone)
    assert set(GumbelNoise(g, top_k=2)(None, scores).argmax(-1).tolist()) == {0, 1}
    assert set(GumbelNoise(g, top_p=0.5)(None, scores).argmax(-1).tolist()) == {0}
    cold = torch.bincount(GumbelNoise(g, temperature=0.25)(None, scores).argmax(-1), minlength=4)
    assert cold[0] > 0.95 * len(draws)
    with pytest.raises(ValueError, match="temperature"):
        GumbelNoise(g, temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        GumbelNoise(g, top_p=1.5)


def test_rows_and_ids_of_different_lengths_are_refused():
    pop, tok, texts = setup()
    with pytest.raises(ValueError, match="one entry per row, got 1 and 2"):
        generate_by_member(pop, tok, [0], texts[:2], generators(3), SAMPLE)
