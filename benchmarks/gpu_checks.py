"""The GPU checks of issue 24 item 4 that ``benchmarks/forward.py`` and ``benchmarks/es.py`` do not make.

Every figure is a ratio of two things measured in this one process, on the same device:

- ``overhead``: the routed model when no row has an adapter, against the plain model on the same rows:
  routing off (``pop(x)``) and every row :data:`populora.BASE` (``pop(x, individuals=[BASE] * n)``), an
  MLP ``d -> 4d -> d`` (bf16, d = 4096 on CUDA); target <= 1.02 (vLLM's standard for its LoRA path);
- ``decode``: one decode step of a Llama (a KV cache, rows kept in input order inside ``pop.route()``), two
  rows per individual in random order, counted with the torch profiler: the GEMM operators the routed
  step runs beyond the plain step's, per target, at each P. Target: at most 2 per target (the two
  low-rank products, one batched or grouped launch each) and the same count at every P: never one
  product per individual (SGLang's lesson: per-individual products of a few rows starve the GPU);
- ``generate``: tokens/s of ``pop.generate`` (P individuals, 2 prompts each) against ``model.generate`` of
  the same rows, a random Llama built by transformers (0.5B shape on CUDA), greedy, a fixed number of new
  tokens; target >= 0.90;
- ``train``: one training step (causal-LM loss of P individuals' own rows, backward, Adam over the
  adapters) against the same step of ONE LoRA (``pop_size=1``) over the same rows: reported.

    python benchmarks/gpu_checks.py --device cuda --json out.json
    python benchmarks/gpu_checks.py --smoke --json out.json   # CPU, tiny sizes (the script path only)

Each check that cannot run (transformers missing, out of memory) is recorded in ``failures`` with its
reason and the others still run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from populora import BASE, Population  # noqa: E402

GEMMS = ("aten::mm", "aten::bmm", "aten::baddbmm", "aten::addmm", "aten::_grouped_mm", "aten::addbmm")
"""The matrix-product operators counted (each launches one kernel on CUDA; ``aten::linear`` and
``aten::matmul`` dispatch to them)."""


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def paired(fns: dict, device: torch.device, min_time: float, rounds: int = 7) -> dict[str, list[float]]:
    """Seconds per call of each of ``fns`` in blocks taken in turn (``rounds`` rounds, each block about
    ``min_time``): a slow spell hits one round's blocks alike, and a ratio is the median of per-round ratios."""
    clock = time.perf_counter if device.type == "cuda" else time.thread_time
    calls = {}
    for name, fn in fns.items():
        fn()
        sync(device)
        n = 1
        while True:
            start = clock()
            for _ in range(n):
                fn()
            sync(device)
            if clock() - start >= min_time or n >= 1 << 12:
                break
            n *= 2
        calls[name] = n
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = clock()
            for _ in range(calls[name]):
                fn()
            sync(device)
            times[name].append((clock() - start) / calls[name])
    return times


def ratio(times: dict[str, list[float]], a: str, b: str) -> float:
    return statistics.median(x / y for x, y in zip(times[a], times[b]))


def mlp(d: int) -> nn.Module:
    return nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))


def check_overhead(device, dtype, smoke: bool, min_time: float) -> list[dict]:
    """Routing off and every row BASE, against the plain model."""
    d = 256 if smoke else 4096
    torch.manual_seed(0)
    model = mlp(d).to(device, dtype).eval()
    pop = Population(model, pop_size=64, low_rank=16, device=device)
    rows = []
    for n in (1, 64) if smoke else (1, 64, 1024):
        x = torch.randn(n, d, device=device, dtype=dtype)
        base = np.full(n, BASE)
        with torch.inference_mode():
            want = model(x)
            assert torch.equal(pop(x), want) and torch.equal(pop(x, individuals=base), want)
            times = paired(
                {"plain": lambda: model(x), "off": lambda: pop(x), "base": lambda: pop(x, individuals=base)},
                device,
                min_time,
            )
        for name, what in (("off", "routing off"), ("base", "every row BASE")):
            rows.append(
                dict(
                    check="overhead",
                    what=what,
                    point=f"d={d} n={n}",
                    value=ratio(times, name, "plain"),
                    target="<= 1.02",
                )
            )
    pop.close()
    return rows


def llama(device, dtype, smoke: bool):
    """A randomly initialised Llama built by transformers: 0.5B shape, or a tiny one for the smoke run."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if smoke:
        config = LlamaConfig(
            vocab_size=96,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
        )
    else:  # ~0.5B: 16 layers of width 1536 (GQA 12 / 4 heads), vocab 32000, untied head
        config = LlamaConfig(
            vocab_size=32000,
            hidden_size=1536,
            intermediate_size=4096,
            num_hidden_layers=16,
            num_attention_heads=12,
            num_key_value_heads=4,
            max_position_embeddings=2048,
            tie_word_embeddings=False,
        )
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs (a 0.5B init on the host takes tens of seconds)
        model = LlamaForCausalLM(config)
    model = model.to(dtype=dtype).eval()
    model.generation_config.pad_token_id = 0
    return model, config


def gemm_count(fn) -> int:
    """GEMM operators (:data:`GEMMS`) ``fn()`` runs, from the torch profiler's operator events."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(event.count for event in prof.key_averages() if event.key in GEMMS)


def check_decode(model, config, device, smoke: bool) -> list[dict]:
    """GEMMs of one routed decode step beyond the plain step's, per target, at several P."""
    from populora.llm import LLAMA_ALL

    rows = []
    prompt = 8 if smoke else 32
    per_target = {}
    for P in (4, 16, 64):
        pop = Population(model, P, 8, list(LLAMA_ALL), seed=P, device=device, dtype=next(model.parameters()).dtype)
        targets = len(pop.target_names)
        gen = np.random.default_rng(P)
        ids = gen.permutation(np.repeat(np.arange(P), 2))  # two rows per individual, in random order
        n = ids.size
        tokens = torch.randint(1, config.vocab_size, (n, prompt), device=device)
        with torch.inference_mode():
            out = model(tokens, use_cache=True)
            cache = out.past_key_values
            step = out.logits[:, -1].argmax(-1, keepdim=True)
            plain = gemm_count(lambda: model(step, past_key_values=cache, use_cache=True))
            with pop.route(individuals=ids):
                out = model(tokens, use_cache=True)
                cache = out.past_key_values
                routed = gemm_count(lambda: model(step, past_key_values=cache, use_cache=True))
        extra = (routed - plain) / targets
        per_target[P] = extra
        rows.append(
            dict(
                check="decode",
                what="GEMM operators per target beyond the plain step",
                point=f"P={P}, {n} rows",
                value=extra,
                target="<= 2, the same at every P",
            )
        )
        pop.close()
    same = len(set(per_target.values())) == 1
    rows.append(
        dict(
            check="decode",
            what="per-target GEMMs at P=64 / at P=4 (1: no product per individual)",
            point="P=64 vs P=4",
            value=per_target[64] / per_target[4] if per_target[4] else float("nan"),
            target="1.0" if same else "1.0 (differs)",
        )
    )
    return rows


def check_generate(model, config, device, smoke: bool, repeats: int) -> list[dict]:
    """Tokens/s of pop.generate against model.generate of the same rows."""
    from populora.llm import LLAMA_ALL

    rows = []
    new = 4 if smoke else 32
    prompt = 8 if smoke else 32
    for P in (4, 16, 64):
        pop = Population(model, P, 8, list(LLAMA_ALL), seed=P, device=device, dtype=next(model.parameters()).dtype)
        ids = np.repeat(np.arange(P), 2)
        g = torch.Generator().manual_seed(P)
        tokens = torch.randint(1, config.vocab_size, (ids.size, prompt), generator=g).to(device)
        mask = torch.ones_like(tokens)
        kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False)
        with torch.inference_mode():
            model.generate(input_ids=tokens, attention_mask=mask, **{**kw, "max_new_tokens": 2, "min_new_tokens": 2})
            pop.generate(tokens, mask, individuals=ids, **{**kw, "max_new_tokens": 2, "min_new_tokens": 2})
            best = {"plain": float("inf"), "routed": float("inf")}
            for _ in range(repeats):  # interleaved, best kept
                for name, fn in (
                    ("plain", lambda: model.generate(input_ids=tokens, attention_mask=mask, **kw)),
                    ("routed", lambda: pop.generate(tokens, mask, individuals=ids, **kw)),
                ):
                    sync(device)
                    start = time.perf_counter()
                    out = fn()
                    sync(device)
                    best[name] = min(best[name], time.perf_counter() - start)
                    assert out.shape == (ids.size, prompt + new)
        rows.append(
            dict(
                check="generate",
                what="routed / plain batched generation, tokens/s",
                point=f"P={P}, {ids.size} rows, {new} new tokens",
                value=best["plain"] / best["routed"],
                target=">= 0.90",
            )
        )
        pop.close()
    return rows


def check_train(model, config, device, smoke: bool, min_time: float) -> list[dict]:
    """One training step of P individuals against one LoRA over the same rows."""
    from populora.llm import LLAMA_ALL

    rows = []
    seq = 16 if smoke else 64
    dtype = next(model.parameters()).dtype
    for P in (4, 16) if smoke else (16, 64):
        pops = {
            "population": Population(
                model, P, 8, list(LLAMA_ALL), seed=1, device=device, dtype=dtype, requires_grad=True
            ),
            "one LoRA": Population(
                model, 1, 8, list(LLAMA_ALL), seed=2, device=device, dtype=dtype, requires_grad=True
            ),
        }
        ids = torch.arange(P, device=device).repeat_interleave(2)
        g = torch.Generator().manual_seed(P)
        tokens = torch.randint(1, config.vocab_size, (ids.numel(), seq), generator=g).to(device)
        optims = {name: torch.optim.Adam(p.adapter_parameters(), lr=1e-4) for name, p in pops.items()}

        def step(name):
            pop, opt = pops[name], optims[name]
            opt.zero_grad(set_to_none=True)
            route = {"individuals": ids} if name == "population" else {"individual": 0}
            loss = pop(tokens, labels=tokens, **route).loss
            loss.backward()
            opt.step()

        model.train()
        times = paired({name: (lambda name=name: step(name)) for name in pops}, device, min_time, rounds=5)
        model.eval()
        rows.append(
            dict(
                check="train",
                what="training step, P individuals / one LoRA over the same rows",
                point=f"P={P}, {ids.numel()} rows of {seq} tokens",
                value=ratio(times, "population", "one LoRA"),
                target="reported",
            )
        )
        for pop in pops.values():
            pop.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny sizes: runs the script path only")
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds per timed block")
    parser.add_argument("--repeats", type=int, default=3, help="generation runs per side (best kept)")
    parser.add_argument("--checks", default="overhead,decode,generate,train")
    parser.add_argument("--json", default=None, help="write the rows and failures here")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*past_key_values.*")  # (transformers 5 renames it; both run)
    device = torch.device("cpu" if args.smoke else args.device)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    torch.set_num_threads(1 if device.type == "cpu" else torch.get_num_threads())
    checks = [c for c in args.checks.split(",") if c]
    unknown = sorted(set(checks) - {"overhead", "decode", "generate", "train"})
    if unknown:
        parser.error(f"unknown --checks {unknown}")
    rows: list[dict] = []
    failures: dict[str, str] = {}
    what = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"gpu_checks: torch {torch.__version__}, {what}, {dtype}", flush=True)

    def attempt(name, fn):
        begin = time.perf_counter()
        try:
            found = fn()
        except Exception as error:  # a check that cannot run is reported, the others still run
            failures[name] = f"{type(error).__name__}: {error}"
            traceback.print_exc()
            return
        rows.extend(found)
        for row in found:
            print(f"  {row['check']:8} {row['what']:<62} {row['point']:<34} {row['value']:.3f}  ({row['target']})")
        print(f"gpu_checks: {name} took {time.perf_counter() - begin:.0f} s", flush=True)

    if "overhead" in checks:
        attempt("overhead", lambda: check_overhead(device, dtype, args.smoke, args.min_time))
    if {"decode", "generate", "train"} & set(checks):
        try:
            model, config = llama(device, dtype, args.smoke)
        except Exception as error:
            for name in ("decode", "generate", "train"):
                if name in checks:
                    failures[name] = f"no Llama built by transformers: {type(error).__name__}: {error}"
        else:
            if "decode" in checks:
                attempt("decode", lambda: check_decode(model, config, device, args.smoke))
            if "generate" in checks:
                attempt("generate", lambda: check_generate(model, config, device, args.smoke, args.repeats))
            if "train" in checks:
                attempt("train", lambda: check_train(model, config, device, args.smoke, args.min_time))
    if args.json:
        Path(args.json).write_text(
            json.dumps(dict(device=str(device), what=what, dtype=str(dtype), rows=rows, failures=failures), indent=1)
        )
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
