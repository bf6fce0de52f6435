"""Classify handwritten digits with evolution strategies only (no backprop).

scikit-learn's bundled digits (1797 real 8x8 scans, 10 classes; shipped inside
the package, nothing downloaded) are split 75 / 25. A small MLP is trained by
EggrollES: each generation, 256 low-rank perturbations of the network are
scored on one shared minibatch (fitness = -cross-entropy, higher is better)
in ONE routed forward, and Adam follows the ES gradient. Test accuracy is
measured on the held-out quarter with the unperturbed (mean) network.

    pip install scikit-learn
    python examples/es_digits.py                 # about 30 s on a laptop CPU, ~96% test accuracy
    python examples/es_digits.py --steps 100     # quicker, a little less accurate
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from populora import EggrollES


def load_digits(seed: int) -> tuple[torch.Tensor, ...]:
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    data = sklearn_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0  # pixels 0..16 -> 0..1
    y = torch.tensor(data.target, dtype=torch.long)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)
    mean, std = x_train.mean(0), x_train.std(0) + 1e-3
    return (x_train - mean) / std, y_train, (x_test - mean) / std, y_test


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of one member's ``(b, 10)`` logits; lower is better."""
    return nn.functional.cross_entropy(logits, labels)


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return (model(x).argmax(-1) == y).float().mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--pop-size", type=int, default=256)
    parser.add_argument("--sigma", type=float, default=0.05)
    parser.add_argument("--lr", type=float, default=0.02, help="Adam learning rate")
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256, help="rows shared by every member per generation")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    x_train, y_train, x_test, y_test = load_digits(args.seed)
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.Tanh(), nn.Linear(args.hidden, 10))
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
    print(
        f"{len(x_train)} train / {len(x_test)} test digits; {sum(p.numel() for p in model.parameters())} "
        f"parameters; {args.pop_size} members x {args.batch} rows per generation"
    )

    generator = torch.Generator().manual_seed(args.seed)
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        rows = torch.randint(0, len(x_train), (args.batch,), generator=generator)
        stats = es.step(x_train[rows], cross_entropy, y_train[rows])
        schedule.step()
        if step % 50 == 0 or step == args.steps:
            print(
                f"step {step:4d}  train loss {-stats.mean:.3f}  test accuracy {accuracy(model, x_test, y_test):.3f}  "
                f"({time.perf_counter() - start:.0f} s)"
            )
    acc = accuracy(model, x_test, y_test)
    print(
        f"final test accuracy {acc:.1%} (train {accuracy(model, x_train, y_train):.1%}) after {args.steps} "
        f"generations in {time.perf_counter() - start:.1f} s"
    )


if __name__ == "__main__":
    main()
