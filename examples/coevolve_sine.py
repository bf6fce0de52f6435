"""Three coevolving populations: a proposer, a solver of sin(pi x) and a judge.

* the **proposer** picks test inputs: each individual warps a few shared
  uniform draws ``z`` into ``x = clamp(z + shift(z), -1, 1)`` and is rewarded
  for the error that the best quarter of the solvers make on its inputs (so
  proposals cover [-1, 1] but crowd where good solvers are still wrong);
* the **solver** fits ``sin(pi x)`` on every proposed input (and on the inputs
  of a few archived proposer champions, so that it does not forget old
  mistakes) and gets a small bonus for wrong answers that fool the judge;
* the **judge** sees every ``(x, answer)`` pair and predicts whether the
  answer is correct (squared error below 0.05); it is scored by the log
  loss of its verdicts (negated: higher is better).

Nothing is trained by gradients: each population is a set of LoRA adapters on
a frozen random MLP, evolved by a genetic algorithm, all of them in one
``Coevolve.step()`` per generation. The solver never sees the held-out grid
that the script reports on.

    pip install matplotlib
    python examples/coevolve_sine.py                        # ~20 s on a laptop CPU; held-out mse ~0.01
    python examples/coevolve_sine.py --generations 200 --plot /tmp/sine.png

The plot goes to ``outputs/coevolve_sine.png`` in the repository (a folder
git ignores) unless ``--plot`` names another file.
    torchrun --standalone --nproc-per-node=3 examples/coevolve_sine.py --distributed  # one probe per rank
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import nn

from populora import Coevolve, Evolution, HallOfFame, Population, is_main_rank

TOLERANCE = 0.05  # squared error below which an answer counts as correct
DEFAULT_PLOT = Path(__file__).resolve().parents[1] / "outputs" / "coevolve_sine.png"  # git-ignored folder


def mlp(d_in: int, hidden: int, *tail: nn.Module) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, 1), *tail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--generations", type=int, default=1000)
    parser.add_argument("--solvers", type=int, default=32, help="solver population size")
    parser.add_argument("--proposers", type=int, default=8, help="proposer population size")
    parser.add_argument("--judges", type=int, default=16, help="judge population size")
    parser.add_argument("--draws", type=int, default=4, help="inputs proposed by each proposer per generation")
    parser.add_argument("--opponents", type=int, default=2, help="archived proposer champions replayed per generation")
    parser.add_argument("--fool-bonus", type=float, default=0.1, help="solver bonus per wrong answer the judge accepts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--print-every", type=int, default=1)
    parser.add_argument(
        "--plot",
        default=str(DEFAULT_PLOT),
        help="where to save the final plot ('' for none; default: outputs/ in the repository)",
    )
    parser.add_argument("--distributed", action="store_true", help="share the probes among torchrun ranks")
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny models: threads cost more than they save
    torch.manual_seed(args.seed)  # the base models (identical on every rank)
    S, P, J, B = args.solvers, args.proposers, args.judges, args.draws

    shifter = mlp(1, 16, nn.Tanh())
    nn.init.zeros_(shifter[2].bias)  # the base proposer leaves its draws where they are
    proposer = Population(shifter, pop_size=P, low_rank=2, seed=args.seed)
    solver = Population(mlp(1, 16), pop_size=S, low_rank=2, seed=args.seed + 1)
    judge = Population(mlp(2, 16), pop_size=J, low_rank=2, seed=args.seed + 2, init_scale=1.0)  # diverse verdicts
    hall = HallOfFame(dict(proposer=proposer, solver=solver, judge=judge), capacity=64, seed=args.seed)
    opponents = []  # proposer champions replayed this generation, drawn after each step on every rank

    def probe_proposer(coevolve):
        # randomness from a generator seeded by the step: pure, reproducible, resumable
        z = torch.rand(B, 1, generator=torch.Generator().manual_seed(coevolve.generation)) * 2 - 1
        x = (z.repeat(P, 1) + coevolve.proposer(z, all_individuals=True, broadcast=True)).clamp(-1, 1)  # (P*B, 1)
        if opponents:  # + (k*B, 1) inputs of past champions
            x = torch.cat([x, (z.repeat(len(opponents), 1) + hall.run(opponents, z, broadcast=True)).clamp(-1, 1)])
        return x

    def probe_solver(coevolve, proposer_outputs):
        n = proposer_outputs.shape[0]
        return coevolve.solver(proposer_outputs.repeat(S, 1), all_individuals=True).view(S, n)

    def probe_judge(coevolve, proposer_outputs, solver_outputs):
        pairs = torch.stack([proposer_outputs.flatten().repeat(S), solver_outputs.flatten()], dim=-1)  # (S*n, 2)
        n = pairs.shape[0]
        # every judge sees every pair: (J*S*n, 2) in, (J, S, n) correctness logits out
        return coevolve.judge(pairs, all_individuals=True, broadcast=True).view(J, S, n // S)

    def squared_errors(proposer_outputs, solver_outputs):
        return (solver_outputs - torch.sin(torch.pi * proposer_outputs.flatten())) ** 2  # (S, n)

    def fitness_proposer(proposer_outputs, solver_outputs):
        errors = squared_errors(proposer_outputs, solver_outputs)  # (S, n)
        strongest = errors.mean(1).argsort()[: max(1, S // 4)]  # the best quarter of the solvers, not their mutants
        own = errors[strongest, : P * B]  # on its own inputs, not the archive's
        return own.mean(0).view(P, B).mean(1)  # (P,) error its inputs cause

    def fitness_solver(proposer_outputs, solver_outputs, judge_outputs):
        errors = squared_errors(proposer_outputs, solver_outputs)
        fooled = ((judge_outputs > 0).float().mean(0) * (errors >= TOLERANCE).float()).mean(1)  # (S,)
        return -errors.mean(1) + args.fool_bonus * fooled  # accurate, and hard to catch when wrong

    def fitness_judge(proposer_outputs, solver_outputs, judge_outputs):
        correct = (squared_errors(proposer_outputs, solver_outputs) < TOLERANCE).float()  # (S, n)
        bce = nn.functional.binary_cross_entropy_with_logits(
            judge_outputs, correct.expand_as(judge_outputs), reduction="none"
        )
        return -bce.flatten(1).mean(1)  # (J,) minus the log loss of its verdicts: smoother than accuracy

    coevolve = Coevolve(
        populations=dict(
            proposer=dict(population=proposer, probe=probe_proposer, fitness=fitness_proposer),
            solver=dict(population=solver, probe=probe_solver, fitness=fitness_solver),
            judge=dict(population=judge, probe=probe_judge, fitness=fitness_judge),
        ),
        evolution=dict(solver=Evolution(epsilon=0.3)),
        hall_of_fame=hall,
    )

    grid = torch.linspace(-1, 1, 201).view(-1, 1)
    truth = torch.sin(torch.pi * grid).flatten()

    def held_out() -> tuple[float, float]:
        """Squared error on the grid: the latest solver champion's, and the population median."""
        with torch.no_grad():
            champion = hall.run(hall.champions("solver")[-1], grid).flatten()
            everyone = solver(grid, all_individuals=True, broadcast=True).view(S, -1)
        return float(((champion - truth) ** 2).mean()), float(((everyone - truth) ** 2).mean(1).median())

    start = time.time()
    for generation in range(args.generations):
        coevolve.step(distributed=args.distributed)
        opponents[:] = hall.sample(min(args.opponents, len(hall.champions("proposer"))), "proposer")
        if is_main_rank() and (generation % args.print_every == 0 or generation == args.generations - 1):
            stats = " | ".join(
                f"{name} best {s.best:+.3f} mean {s.mean:+.3f}" for name, s in coevolve.history[-1].populations.items()
            )
            champion_mse, median_mse = held_out()
            print(
                f"gen {generation:04d} | {stats} | held-out mse {champion_mse:.3f} (median {median_mse:.3f})",
                flush=True,
            )
    if not is_main_rank():
        return

    champion_mse, median_mse = held_out()
    with torch.no_grad():
        champion = hall.champions("solver")[-1]
        answers = hall.run(champion, grid)  # (201, 1)
        logits = hall.run(hall.champions("judge")[-1], torch.cat([grid, answers], -1))
    correct = (answers.flatten() - truth) ** 2 < TOLERANCE
    judge_accuracy = float(((logits.flatten() > 0) == correct).float().mean())
    base_rate = max(float(correct.float().mean()), 1 - float(correct.float().mean()))
    print(
        f"\nafter {args.generations} generations ({time.time() - start:.1f} s): solver champion held-out mse "
        f"{champion_mse:.4f} (population median {median_mse:.4f}; predicting 0 scores 0.5), "
        f"{int(correct.sum())}/{len(correct)} grid answers within tolerance, judge accuracy on them "
        f"{judge_accuracy:.2f} (a constant verdict would score {base_rate:.2f})"
    )

    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        with torch.no_grad():
            everyone = solver(grid, all_individuals=True, broadcast=True).view(S, -1)
        fig, (ax, curve) = plt.subplots(1, 2, figsize=(11, 4))
        for row in everyone:
            ax.plot(grid.flatten(), row, color="tab:blue", alpha=0.08, lw=1)
        ax.plot(grid.flatten(), truth, color="black", lw=2, label="sin(pi x)")
        ax.plot(grid.flatten(), answers.flatten(), color="tab:orange", lw=2, label="solver champion")
        ax.set(xlabel="x", ylabel="y", title=f"solver after {args.generations} generations (faint: population)")
        ax.legend()
        generations = [s.generation for s in coevolve.history.of("solver")]
        for name, h in coevolve.history.by_population().items():
            curve.plot(generations, [s.best for s in h], label=f"{name} best")
        curve.set(xlabel="generation", ylabel="fitness (higher is better)", title="best fitness per population")
        curve.legend()
        fig.tight_layout()
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.plot, dpi=120)
        print(f"plot saved to {args.plot}")


if __name__ == "__main__":
    main()
