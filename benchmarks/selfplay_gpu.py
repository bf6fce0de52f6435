"""The self-play loop's stages of benchmarks/gpu.sh (issue 33): its cost on one GPU, and 2 ranks by member.

``cost``: the paper's figure, ``time(8 adapters, b rows each) / time(1 adapter, b rows)`` at equal rows per
adapter (the paper: 1.31 on a GPU), one step's work (sampled generation of a fixed number of new tokens, then a
REINFORCE step with Adam, benchmarks/selfplay_cost.py's ``step``), for both samplers of the loop: ``batch`` (ONE
routed generate of every row) and ``member`` (one generate per member: what makes a run world-size invariant).
The model is a randomly initialised Llama of SmolLM2-135M's shape built by transformers from a config (no
download), bfloat16 on CUDA; ``--smoke``: a tiny one on the CPU.

``ranks``: the RL loop by member on 2 processes (NCCL, one GPU each; gloo on the CPU with ``--smoke``) against
the 1-process run of the same seed: whether every sampled token id is the same, and the step's wall clock
ratio. With fewer than 2 GPUs (and no ``--smoke``) it says so and exits 0, writing ``{"skipped": why}``.

    python benchmarks/selfplay_gpu.py cost --json selfplay.json
    python benchmarks/selfplay_gpu.py ranks --json ranks.json
    python benchmarks/selfplay_gpu.py cost --smoke && python benchmarks/selfplay_gpu.py ranks --smoke
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent


def random_model(smoke: bool, device: str) -> Any:
    """SmolLM2-135M's shape with random weights (transformers, no download), or a tiny Llama for the smoke run."""
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = (
        dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2)
        if smoke
        else dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                  num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
    )  # fmt: skip
    config = LlamaConfig(**shape, pad_token_id=0, eos_token_id=1, bos_token_id=1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return model.to(device=device, dtype=dtype).eval()


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def cost(args: argparse.Namespace) -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location("selfplay_cost", HERE / "selfplay_cost.py")
    bench = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(bench)  # type: ignore[union-attr]
    from populora.llm import char_tokenizer
    from populora.llm import text as text_module

    device = "cpu" if args.smoke else "cuda"
    model, tok = random_model(args.smoke, device), char_tokenizer()
    prompt = "<|user|>What is 3 + 4?<|assistant|>"
    rows, new_tokens = (2, 4) if args.smoke else (args.rows, args.new_tokens)
    roles = {8: bench.Role(model, 8, args.rank, 1, prompt), 1: bench.Role(model, 1, args.rank, 2, prompt)}
    real = text_module.generate_replies
    times: dict[str, dict[int, list[float]]] = {"batch": {8: [], 1: []}, "member": {8: [], 1: []}}

    def by_member(pop, tok_, ids, texts, seed, options, distributed):  # the loop's sampler="member" path
        gens = [torch.Generator().manual_seed(seed + i) for i in range(pop.pop_size)]
        return text_module.generate_by_member(pop, tok_, ids, texts, gens, options, distributed)

    for sampler in ("batch", "member"):
        bench.generate_replies = real if sampler == "batch" else by_member
        for r in range(args.rounds + 1):  # round 0 warms up
            for size in (8, 1) if r % 2 else (1, 8):
                _sync(device)
                start = time.perf_counter()
                bench.step([roles[size]], rows, tok, new_tokens, r)
                _sync(device)
                if r:
                    times[sampler][size].append(time.perf_counter() - start)
    bench.generate_replies = real
    ratios = {s: statistics.median(a / b for a, b in zip(t[8], t[1])) for s, t in times.items()}
    return {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "model": "random tiny Llama" if args.smoke else "random Llama of SmolLM2-135M's shape, bf16",
        "rows_per_adapter": rows,
        "new_tokens": new_tokens,
        "rounds": args.rounds,
        "median_seconds": {s: {str(k): statistics.median(v) for k, v in t.items()} for s, t in times.items()},
        "ratio_8_over_1": ratios,
        "paper": 1.31,
    }


def _loop(device: str) -> Any:
    from populora import Population
    from populora.llm import LLAMA_ALL, char_tokenizer
    from populora.loops.selfplay import CPU_PRESET, PopuLoRA
    from populora.tasks import Arithmetic

    model = random_model(True, "cpu").to(device)
    lengths = dict(teacher_generate=dict(max_new_tokens=8), student_generate=dict(max_new_tokens=6))
    config = CPU_PRESET.replace(teachers=4, students=4, rank=2, anchors=1, interval=2, seed=0, **lengths)
    teachers = Population(model, 4, 2, list(LLAMA_ALL), seed=0, init_scale=0.5)
    students = Population(model, 4, 2, list(LLAMA_ALL), seed=1, init_scale=0.5)
    return PopuLoRA(teachers, students, char_tokenizer(), Arithmetic(), config=config)


def _steps(device: str, distributed: bool, steps: int) -> dict[str, Any]:
    loop = _loop(device)
    tokens, wall = [], []
    for _ in range(steps):
        _sync(device.split(":")[0])
        start = time.perf_counter()
        out = loop.step(distributed=distributed)
        _sync(device.split(":")[0])
        wall.append(time.perf_counter() - start)
        tokens.append((out.proposal_ids, out.answer_ids))
    return {"tokens": tokens, "wall": wall}


def _rank(rank: int, world: int, store: str, out: str, backend: str, steps: int) -> None:
    import torch.distributed as dist

    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))  # fmt: skip
    torch.save(_steps(device, True, steps), Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


def ranks(args: argparse.Namespace) -> dict[str, Any]:
    import torch.multiprocessing as mp

    backend = "gloo" if args.smoke else "nccl"
    if backend == "nccl" and torch.cuda.device_count() < 2:
        return {"skipped": f"2 ranks on NCCL need 2 GPUs, this machine has {torch.cuda.device_count()}"}
    torch.set_num_threads(1)
    one = _steps("cpu" if args.smoke else "cuda:0", False, args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(2, f"{tmp}/store", tmp, backend, args.steps), nprocs=2, join=True)
        got = [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False) for r in range(2)]
    counted = slice(1, None)
    return {
        "backend": backend,
        "steps": args.steps,
        "same_tokens": all(g["tokens"] == one["tokens"] for g in got),
        "wall_ratio_2_over_1": statistics.median(
            max(a, b) / c for a, b, c in zip(got[0]["wall"][counted], got[1]["wall"][counted], one["wall"][counted])
        ),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=["cost", "ranks"])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (gloo for `ranks`)")
    parser.add_argument("--rows", type=int, default=8, help="rows per adapter (cost)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="loop steps (ranks; the first is a warm-up)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result = cost(args) if args.stage == "cost" else ranks(args)
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
