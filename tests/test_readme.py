"""Every ```python block of README.md runs, in order, in one namespace.

Only the substitutions the API contract allows are applied: names the blocks
leave undefined are defined beforehand, and generation / step / horizon counts
are made smaller so the suite stays fast.
"""

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"

SMALLER = [  # (pattern, replacement): smaller counts only
    (r"num_generations = \d+", "num_generations = 2"),
    (r"horizon = \d+", "horizon = 20"),
    (r"range\(100\)", "range(3)"),
    (r"range\(10\)", "range(2)"),
    (r"sleep\(0\.1\)", "sleep(0.001)"),
]


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_the_contract_blocks():
    text = "\n".join(blocks())
    for needle in ("pop.select_and_merge_best_(fitnesses)", "pop.evaluate_distributed(eval_env)",
                   "policy, history = evolve_with_env(", "interactor.evaluate(", "coevolve.step(distributed = True)",
                   "es.step(x_train, mse_loss, y_train)", "es.apply_fitness_scores(fitnesses)",
                   "compute_es_gradient(noise, rewards)", 'torch.save(state, "checkpoint.pt")'):
        assert needle in text, needle


def test_readme_blocks_run(tmp_path, monkeypatch):
    pytest.importorskip("dm_control")
    from torch import nn

    monkeypatch.chdir(tmp_path)  # the checkpointing block writes checkpoint.pt
    namespace = {
        "torch": torch,
        "nn": nn,
        "backbone": nn.Sequential(nn.Linear(5, 32), nn.ReLU(), nn.Linear(32, 2)),
        "num_generations": 2,
        "inputs": torch.randn(8, 10),
        "targets": torch.randn(8, 5),
        "your_custom_fitness_fn": lambda output: -output.pow(2).mean().item(),
        "compute_fitness": lambda outputs, targets: -(outputs - targets).pow(2).mean(dim=(1, 2)),
    }
    for i, code in enumerate(blocks()):
        for pattern, replacement in SMALLER:
            code = re.sub(pattern, replacement, code)
        exec(compile(code, f"README.md python block {i}", "exec"), namespace)
