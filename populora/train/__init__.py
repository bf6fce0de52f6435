"""Gradient training of a population: RL on routed replies, per-individual learning rates, PBT.

A population's adapters are stacked parameters whose first dimension is the individual
(:meth:`Population.adapter_parameters <populora.Population.adapter_parameters>`); one routed forward and one
backward give each individual the gradient of its own rows only. So:

- Element-wise optimizers (SGD with or without momentum, Adam, AdamW, RMSprop, Adagrad) over those
  parameters update each individual from its own gradient: one optimizer trains all ``P`` at once, exactly as
  ``P`` separate optimizers would. Their state rows follow evolution (``evolve_(..., optimizer=opt)``,
  :mod:`populora.population.optimizer_rows`).
- Anything that takes a norm (or another statistic) over a WHOLE parameter couples the individuals: ClipUp's
  default (one gradient norm and one speed per parameter group; use ``ClipUp(..., per_individual=True)``),
  ``torch.nn.utils.clip_grad_norm_`` (use :meth:`Population.clip_grad_norm_
  <populora.Population.clip_grad_norm_>` or ``max_grad_norm=`` of :func:`policy_gradient_step_`), Adafactor's
  factored second moments, LBFGS's line search and curvature pairs, Shampoo-like preconditioners (the last
  three cannot follow evolution either: their state cannot be split by individual).

Modules: :mod:`~populora.train.rl` (:func:`token_logprobs`, :func:`advantages`, :func:`kl_to_base`,
:func:`policy_gradient_step_`), :mod:`~populora.train.lr` (:class:`LRMultipliers`), :class:`PBT` (which lives in
:mod:`populora.loops.pbt` and is re-exported here lazily). Nothing here imports ``transformers``.
"""

from populora.train.lr import LRMultipliers
from populora.train.rl import (
    ADVANTAGE_METHODS,
    KL_ESTIMATORS,
    REDUCTIONS,
    PolicyGradient,
    PolicyGradientStats,
    TokenLogprobs,
    advantages,
    kl_estimate,
    kl_to_base,
    policy_gradient_step_,
    token_logprobs,
)

__all__ = [
    "ADVANTAGE_METHODS",
    "KL_ESTIMATORS",
    "PBT",
    "PBTConfig",
    "PBTRecord",
    "REDUCTIONS",
    "LRMultipliers",
    "PolicyGradient",
    "PolicyGradientStats",
    "Replacement",
    "TokenLogprobs",
    "advantages",
    "kl_estimate",
    "kl_to_base",
    "policy_gradient_step_",
    "token_logprobs",
]


def __getattr__(name: str) -> object:
    # PBT is a loop (populora.loops, above this layer): imported on first use, so `import populora.train`
    # imports nothing above it
    if name in ("PBT", "PBTConfig", "PBTRecord", "Replacement"):
        import importlib

        return getattr(importlib.import_module("populora.loops.pbt"), name)
    raise AttributeError(f"module 'populora.train' has no attribute {name!r}")
