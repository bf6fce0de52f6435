"""The README's distributed evolution example, as a script.

Each rank evaluates its share of the 16 individuals (``sleep(0.1)`` stands in
for an environment), the fitnesses are gathered, and every rank runs the same
evolution step, so all ranks hold identical adapters throughout.

    python examples/evolve_distributed.py                                   # one process
    torchrun --standalone --nproc-per-node=2 examples/evolve_distributed.py # two processes, ~2x faster

Nothing here is seeded, so each process builds a different base model (recent
torch seeds every process differently): the first ``evaluate_distributed``
notices, warns once and copies rank 0's model to the others. Call
``torch.manual_seed(...)`` before building the model to skip that, or pass
``sync_base_model=True`` to broadcast it without checking.
"""

from time import sleep

import torch
from torch import nn

from populora import Population, is_main_rank

model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

pop = Population(model, pop_size=16, low_rank=2, lora_targets=["0", "2"])

x = torch.randn(1, 8)


def eval_env(population, idx):
    sleep(0.1)
    with torch.no_grad():
        # seed the environment with population.eval_seed (shared, auto-synced across ranks)

        return population(x, individual=idx).abs().mean().item() + torch.randn(1).item()


for gen in range(10):
    # distributed evaluation

    fitnesses = pop.evaluate_distributed(eval_env)

    if is_main_rank():
        print(f"gen {gen:02d} | best: {fitnesses.max():.3f} | mean: {fitnesses.mean():.3f}")

    # evolution step

    pop.evolve_(fitnesses)
