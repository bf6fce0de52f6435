"""EvoX's ``VirtualLoRAES`` as a black box: one ES step of ``benchmarks/es.py`` (its ``evox`` method).

Imported only by ``es.py``'s worker, in an interpreter that has EvoX (a scratch venv, never a dependency of
populora): ``python3 -m venv /tmp/evox && /tmp/evox/bin/pip install torch==2.13.0 'evox==1.4.*'``. It imports
only torch and evox, and uses EvoX through its documented API alone:
``VirtualLoRAES(param_shapes, lora_rank, pop_size, center_init, learning_rate, noise_stdev)`` proposes,
``VirtualLoRAProblem(model, data_loader, criterion, lora_rank)`` evaluates, ``StdWorkflow`` runs one
generation per ``step()``.

How the step is matched to populora's ``EggrollES.step(x, loss, y)`` (``ours`` in ``es.py``):

- same model, population size ``N``, rank 4, ``noise_stdev = sigma = 0.02``, ``learning_rate = lr = 0.05``;
- shared batch: the data loader holds the ``b`` rows once, every member is evaluated on them (one batch per
  evaluation), as ``ours`` evaluates every member on the shared ``x``;
- the same fitness: ``VirtualLoRAProblem`` feeds its criterion the ``(N*b, ...)`` outputs of all members with
  ``(N*b,)`` labels and averages the per-row values of each member (``reduction='mean'``), so the labels are
  row ids and the criterion returns each row's loss against ``y`` (MSE per row; the mean over a member's
  rows is its MSE: with ``noise_stdev`` -> 0 every fitness equals the base model's MSE);
- the same fitness shaping: ``StdWorkflow``'s ``fitness_transform`` z-scores the fitnesses,
  ``(f - mean) / (std + 1e-8)``, as ``EggrollES``'s default ``fitness_shaping='zscore'`` does; without it
  EvoX 1.4 updates with the raw fitness (its update scales with the fitness and moves with a constant shift).

What differs (seen from outside): EvoX draws ``N`` independent perturbations (no antithetic pairs: a
fitness linear in the weights gives pair sums far from 0 in either pairing), ``EggrollES`` draws ``N/2``
mirrored pairs; EvoX's perturbation is larger at the same ``sigma`` (its members' MSE is about 1.6x the base
model's at ``sigma = 0.02``, ``EggrollES``'s about 1.1x) and its update is scaled differently (at ``lr = 0.05`` its
MSE grows from step to step). The values do not change what a step costs (no NaN or denormals: the
z-scored update keeps the weights finite), so the step is timed with the same numbers as ``ours``.

EvoX 1.4.0's package-level names ``evox.algorithms.VirtualLoRAES`` and
``evox.problems.neuroevolution.VirtualLoRAProblem`` are bound to its full-noise ``VirtualES`` /
``VirtualProblem`` (their signatures have no ``lora_rank``), so the LoRA classes are imported from their
documented modules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def evox_step(
    model: Any,
    x: Any,
    y: Any,
    row_loss: Callable[[Any, Any], Any],
    pop: int,
    device: Any,
    sigma: float = 0.02,
    lr: float = 0.05,
    rank: int = 4,
) -> Callable[[], None]:
    """Build EvoX's ``VirtualLoRAES`` workflow on ``model`` and return one generation, ``workflow.step``.

    Args:
        model: the network (``es.py``'s ``Linear - ReLU - Linear``; a model that is not an ``nn.Sequential``
            is wrapped in one, as the API demands, so that EvoX's own error names the layer it cannot take).
        x: ``(b, ...)`` the shared batch every member is evaluated on.
        y: ``(b, ...)`` targets.
        row_loss: ``(out (M, b, ...), y (b, ...)) -> (M, b)`` each row's loss (``M`` members at once).
        pop: ``N`` members per generation.
        device: the torch device of ``model``, ``x`` and ``y``.
        sigma, lr, rank: EvoX's ``noise_stdev``, ``learning_rate`` and ``lora_rank``.

    Returns:
        A function running one generation (perturb, evaluate ``N`` members, update the center); the first
        generation (``init_step``) has already run.
    """
    import torch
    from evox.algorithms.so.es_variants.virtual_lora_es import VirtualLoRAES
    from evox.problems.neuroevolution.virtual_lora_problem import VirtualLoRAProblem
    from evox.workflows import StdWorkflow
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    net = model if isinstance(model, nn.Sequential) else nn.Sequential(model)
    rows = len(x)
    ids = torch.arange(rows, device=x.device)

    class RowLoss(nn.Module):
        """EvoX's criterion: ``(out (N*b, ...), row ids (N*b,)) -> (N*b,)`` each row's loss against ``y``."""

        def forward(self, out, labels):
            members = out.shape[0] // rows
            if labels.shape[0] == members * rows and torch.equal(labels.view(members, rows), ids.expand(members, -1)):
                # rows laid out member-major: compare with the shared y by broadcasting (no (N*b, ...) gather)
                return row_loss(out.view(members, rows, *out.shape[1:]), y).reshape(-1)
            return row_loss(out.unsqueeze(0), y[labels]).reshape(-1)

    class ZScore(nn.Module):
        """EggrollES's default fitness shaping, as a ``StdWorkflow`` fitness transform."""

        def forward(self, fitness):
            return (fitness - fitness.mean()) / (fitness.std() + 1e-8)

    params = list(net.parameters())
    center = torch.cat([p.detach().reshape(-1) for p in params])
    algorithm = VirtualLoRAES(
        param_shapes=[tuple(p.shape) for p in params],
        lora_rank=rank,
        pop_size=pop,
        center_init=center,
        learning_rate=lr,
        noise_stdev=sigma,
        device=device,
    )
    loader = DataLoader(TensorDataset(x, ids), batch_size=rows)
    problem = VirtualLoRAProblem(net, loader, RowLoss(), lora_rank=rank, device=device)
    workflow = StdWorkflow(algorithm, problem, fitness_transform=ZScore(), device=device)
    workflow.init_step()
    return workflow.step
