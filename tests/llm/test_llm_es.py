"""EggrollES on a Hugging Face causal LM (a tiny random Llama): base weights, or a PEFT LoRA adapter.

Out of the box: every nn.Linear / nn.Embedding weight is perturbed on the routed path, RMSNorm gains are
frozen with one warning (or perturbed with perturb_unroutable=True), a tied embedding / head is one
parameter with one perturbation, and noise is drawn in float32 for bf16 weights. PEFT-style: wrapping the
model with peft.get_peft_model freezes the base, so ES evolves only the lora_A / lora_B weights.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.nn import functional as F

transformers = pytest.importorskip("transformers")

from populora import EggrollES  # noqa: E402

SEQ = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))


def _llama(tied: bool = False, dtype: torch.dtype = torch.float32):
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tied,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return transformers.LlamaForCausalLM(config).to(dtype).eval()


def next_token_loss(out, tokens):
    """Mean next-token cross-entropy of one member's ``(b, T, V)`` logits on ``tokens (b, T)``."""
    logits = out["logits"]
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))


def _loss(model) -> float:
    with torch.no_grad():
        return float(next_token_loss(model(SEQ), SEQ))


def _es(model, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return EggrollES(model, kw.pop("pop_size", 32), 0.02, 0.3, 4, seed=kw.pop("seed", 0), **kw)


def test_es_on_a_causal_lm_lowers_next_token_loss_and_is_deterministic():
    runs = []
    for _ in range(2):
        model = _llama()
        before = _loss(model)
        es = _es(model)
        for _ in range(8):
            es.step(SEQ, next_token_loss, SEQ)
        runs.append({k: v.clone() for k, v in model.state_dict().items()})
        assert _loss(model) < before - 0.2, (before, _loss(model))
    assert runs[0].keys() == runs[1].keys() and all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])
    other = _llama()
    es = _es(other, seed=1)
    for _ in range(8):
        es.step(SEQ, next_token_loss, SEQ)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(other.state_dict()[q], runs[0][q])


def test_norm_gains_are_frozen_with_one_warning_or_perturbed_by_choice():
    model = _llama()
    norms = [n for n, _ in model.named_parameters() if "norm" in n]
    assert len(norms) == 5
    with pytest.warns(
        UserWarning,
        match=r"EggrollES freezes 5 selected parameter\(s\) that the routed forward "
        r"cannot perturb.*'model.norm.weight'.*perturb_unroutable=True",
    ) as caught:
        es = EggrollES(model, 8, 0.02, 0.3, 4)
    assert sum("EggrollES freezes" in str(w.message) for w in caught) == 1
    assert not set(norms) & set(es.param_names)
    gains = {n: p.detach().clone() for n, p in model.named_parameters() if n in norms}
    es.step(SEQ, next_token_loss, SEQ)
    assert all(torch.equal(p, gains[n]) for n, p in model.named_parameters() if n in norms)

    model = _llama()
    es = _es(model, pop_size=8, perturb_unroutable=True)
    assert set(norms) <= set(es.param_names)
    es.step(SEQ, next_token_loss, SEQ)
    assert all(not torch.equal(p, gains[n]) for n, p in model.named_parameters() if n in norms)


def test_tied_embedding_and_head_are_one_parameter_with_one_perturbation():
    model = _llama(tied=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    es = _es(model, pop_size=8)
    assert "model.embed_tokens.weight" in es.param_names and "lm_head.weight" not in es.param_names
    assert len(es.param_names) == 15  # 14 block linears + the shared table
    before = model.model.embed_tokens.weight.detach().clone()
    es.step(SEQ, next_token_loss, SEQ)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied
    assert not torch.equal(model.model.embed_tokens.weight, before)
    # a member's routed logits equal the model holding that member's one perturbation of the table (both uses)
    members, i = es.ask(), 3
    with torch.no_grad():
        routed = members(SEQ, individual=i)["logits"]
        merged = _llama(tied=True)
        merged.load_state_dict(model.state_dict())
        params = es.individual_params(i)
        for name, p in merged.named_parameters():
            if name in params:
                p.copy_(params[name])
        assert merged.lm_head.weight is merged.model.embed_tokens.weight
        assert (merged(SEQ).logits - routed).abs().max() < 1e-4


def test_bf16_weights_get_float32_noise_and_keep_their_dtype():
    model = _llama(dtype=torch.bfloat16)
    before = _loss(model)
    es = _es(model)
    noises = es._noises()
    assert noises and all((n.at if n.at is not None else n.full).dtype == torch.float32 for n in noises.values())
    grads = es.estimate_gradient(torch.arange(32.0))
    assert all(g.dtype == torch.bfloat16 for g in grads.values())
    for _ in range(8):
        es.step(SEQ, next_token_loss, SEQ)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert _loss(model) < before - 0.2


def test_es_trains_a_peft_lora_adapter_on_a_frozen_base():
    peft = pytest.importorskip("peft")
    model = _llama()
    base = {k: v.clone() for k, v in model.state_dict().items()}
    lora = peft.get_peft_model(
        model,
        peft.LoraConfig(
            r=4, lora_alpha=4, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"]
        ),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PEFT froze the base (norms included): nothing unroutable is selected
        es = EggrollES(lora, 32, 0.02, 0.3, 4, seed=0)
    assert len(es.param_names) == 16 and all(".lora_A." in n or ".lora_B." in n for n in es.param_names)
    before = _loss(lora)
    for _ in range(8):
        es.step(SEQ, next_token_loss, SEQ)
    assert _loss(lora) < before - 0.05
    for name, value in lora.get_base_model().state_dict().items():
        key = name.replace(".base_layer", "")
        if key in base:
            assert torch.equal(value, base[key]), name  # the base is untouched
    assert any(p.abs().max() > 0 for n, p in lora.named_parameters() if ".lora_B." in n)
