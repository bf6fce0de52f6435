"""Adapters in and out of a :class:`~populora.Population`: one individual's factors, PEFT LoRA folders.

A mixin of :class:`~populora.Population` (it uses the population's
``factors()``, ``target_names``, ``_check_alive``, ``_check_id`` and
``_write``). The PEFT methods delegate to :mod:`populora.llm.peft`, imported
on first call, so ``import populora`` imports neither ``safetensors`` nor
``transformers``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from populora.adapters import Factors
from populora.errors import InvalidTypeError, InvalidValueError
from populora.population.host import HostBase
from populora.population.optimizer_rows import OptimizerRows, check_optimizer_state

__all__ = ["AdapterIO"]


class AdapterIO(HostBase):
    """``set_factors_``, ``to_peft`` and ``load_peft_`` of a population."""

    def set_factors_(
        self,
        individual: int,
        factors: Sequence[tuple[Tensor, Tensor]],
        *,
        optimizer: Any = None,
        optimizer_state: str = "inherit",
    ) -> None:
        """Overwrite individual ``i``'s adapters with ``factors``: one ``(down (d, r_t), up (e, r_t))`` per target.

        The layout of ``[(d[i], u[i]) for d, u in pop.factors()]`` (``r_t`` the
        target's effective rank); values are copied, cast to the adapters'
        dtype and device. Every pair is checked before anything is written, and
        the copy does not enter autograd (as the population's own operators).

        ``optimizer=`` (one or several optimizers over :meth:`adapter_parameters`):
        with ``optimizer_state="inherit"`` (the default) the slot keeps its
        optimizer rows (the new adapters inherit the state of the individual
        they replace); ``"reset"`` zeros them (:mod:`populora.population.optimizer_rows`).

        Raises:
            InvalidIndexError: ``individual`` outside ``[0, P)``.
            InvalidTypeError: an entry is not a pair of floating-point tensors.
            InvalidValueError: not one pair per target, a shape that is not
                ``(d, r_t)`` / ``(e, r_t)`` (the target and both shapes named),
                or a non-finite value.
        """
        self._check_alive()
        i = self._check_id(individual)
        if isinstance(factors, (str, bytes, Tensor)) or not isinstance(factors, Sequence):
            raise InvalidTypeError(
                f"`factors` must be a sequence of (down, up) pairs, one per target, got {type(factors).__name__}"
            )
        if len(factors) != len(self.target_names):
            raise InvalidValueError(
                f"`factors` must hold one (down, up) pair per target ({len(self.target_names)}), got {len(factors)}"
            )
        new = []
        for name, pair, (down, up) in zip(self.target_names, factors, self.factors()):
            if not (isinstance(pair, Sequence) and len(pair) == 2 and all(isinstance(t, Tensor) for t in pair)):
                raise InvalidTypeError(
                    f"`factors` entry for {name!r} must be a (down, up) pair of tensors, got {type(pair).__name__}"
                )
            for kind, t, own in (("down", pair[0], down), ("up", pair[1], up)):
                if not t.is_floating_point():
                    raise InvalidTypeError(f"`factors` {kind} of {name!r} must be floating point, got {t.dtype}")
                if tuple(t.shape) != tuple(own.shape[1:]):
                    raise InvalidValueError(
                        f"`factors` {kind} of {name!r} must have shape {tuple(own.shape[1:])}, got {tuple(t.shape)}"
                    )
                if not bool(torch.isfinite(t).all()):
                    raise InvalidValueError(f"`factors` {kind} of {name!r} holds non-finite values")
            new.append(
                Factors(
                    pair[0].to(down.device, down.dtype, copy=True)[None],
                    pair[1].to(up.device, up.dtype, copy=True)[None],
                )
            )
        optimizer_state = check_optimizer_state(optimizer_state)
        rows = OptimizerRows(optimizer, self.adapter_parameters())
        ids = torch.tensor([i], device=self.device)
        with torch.no_grad():
            self._write(ids, new)
        if optimizer_state == "reset":
            rows.replace(ids, None)

    def to_peft(self, individual: int, path: str | Path, **kwargs: Any) -> Path:
        """Write individual ``i`` as a PEFT LoRA adapter folder; returns its ``Path``.

        See :func:`populora.llm.to_peft` (``kwargs``: ``base_model_name_or_path``,
        ``task_type``); needs ``safetensors`` (the ``llm`` extra).
        """
        from populora.llm.peft import to_peft

        return to_peft(self, individual, path, **kwargs)

    def load_peft_(
        self,
        individual: int,
        path: str | Path,
        *,
        strict: bool = True,
        optimizer: Any = None,
        optimizer_state: str = "inherit",
    ) -> None:
        """Load a PEFT LoRA adapter folder into individual ``i``; see :func:`populora.llm.load_peft_`.

        ``optimizer`` / ``optimizer_state``: as :meth:`set_factors_`.
        """
        from populora.llm.peft import load_peft_

        check_optimizer_state(optimizer_state)
        OptimizerRows(optimizer, self.adapter_parameters())  # checked before the folder is read
        load_peft_(self, individual, path, strict=strict, optimizer=optimizer, optimizer_state=optimizer_state)
