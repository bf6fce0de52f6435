"""From routed model outputs to env actions: the user's ``action`` map, then checks.

No silent change of a user's action: the only reshape is ``(n,)`` to
``(n, 1)`` for a 1-dim Box (it keeps every element), the only rescale is
``to_range=(lo, hi)`` from ``(-1, 1)``, and only when asked.

Without an ``action`` map, the model's outputs must have the width the action
space takes (see :class:`ActionFormat`); a model of another width raises at
the first step, naming both, rather than when a policy happens to pick an
action outside the space.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from populora.errors import InvalidTypeError, InvalidValueError

__all__ = ["ActionFormat", "ActionFn", "check_to_range"]

ActionFn = Callable[[Any], Any]


def _space_name(space: Any) -> str:
    text = repr(space)
    if text.startswith("<") or len(text) > 60:
        shape = getattr(space, "shape", None)
        return f"{type(space).__name__}(shape={tuple(shape) if shape is not None else None})"
    return text


class ActionFormat:
    """What one slot's action looks like, read from the env's action space.

    * ``Discrete(n, start)``: integer ``(k,)`` actions in ``[start, start + n)``;
      the default ``action`` takes ``n`` logits: ``start + argmax(-1)``.
    * anything with a ``shape`` (Box, MultiDiscrete, MultiBinary, dm_control
      action specs): ``(k, *shape)``, integer when the space's dtype is;
      floating actions are sent as float32. The default ``action``:

      * ``MultiDiscrete(nvec, start)``: ``sum(nvec)`` logits, the
        concatenated logits of each entry (gymnasium's one-hot order): one
        ``start + argmax`` per entry;
      * ``MultiBinary(shape)``: ``prod(shape)`` logits, a bit is 1 where its
        logit is above 0;
      * a Box (or an action spec): ``prod(shape)`` outputs, reshaped in C
        order (``(k, *shape)`` outputs as they are);
      * integer outputs of the action's shape (a model that outputs
        MultiDiscrete / MultiBinary actions itself) pass through.
    * no space known (``None``, dict or tuple spaces): actions pass through
      with only the batch dim checked.

    Outputs of another width raise (:meth:`check_width`) when the default
    action meets them: at the first step.

    Args:
        space: the single-slot action space (gymnasium space or look-alike).

    Attributes:
        width: outputs per slot the default action takes (``None``: no space known).
    """

    def __init__(self, space: Any):
        self.space = space
        self.name = _space_name(space)
        n = getattr(space, "n", None)
        shape = getattr(space, "shape", None)
        self.discrete = n is not None and (shape is None or tuple(shape) == ())
        self.known = self.discrete or (shape is not None and not hasattr(space, "spaces"))
        if self.discrete and n is not None:  # (discrete implies n)
            self.shape: tuple[int, ...] = ()
            self.integer = True
            self.start = int(np.asarray(getattr(space, "start", 0)))
            self.n = int(n)
            self._np_start = np.int64(self.start)
            self._np_n = np.uint64(self.n)
        else:
            self.shape = tuple(int(s) for s in shape) if self.known and shape is not None else ()
            dtype = getattr(space, "dtype", None)
            self.integer = dtype is not None and np.issubdtype(np.dtype(dtype), np.integer)
        self.kind, self.width = self._kind()

    def _kind(self) -> tuple[str, int | None]:
        """``('discrete' | 'multidiscrete' | 'multibinary' | 'box' | 'unknown', outputs per slot)``."""
        if self.discrete:
            return "discrete", self.n
        if not self.known:
            return "unknown", None
        nvec = getattr(self.space, "nvec", None)
        if nvec is not None:
            nvec = np.asarray(nvec, dtype=np.int64).reshape(-1)
            start = np.asarray(getattr(self.space, "start", 0), dtype=np.int64).reshape(-1)
            self.nvec = nvec.tolist()
            self._md_start = torch.from_numpy(np.broadcast_to(start, nvec.shape).copy()) if start.any() else None
            self._md_count, self._md_max = int(nvec.size), int(nvec.max()) if nvec.size else 0
            # where each entry's logits sit in a (count, max n) grid padded with -inf; equal sizes need no padding
            self._md_pos = (
                None
                if (nvec == self._md_max).all()
                else torch.from_numpy(
                    np.concatenate([j * self._md_max + np.arange(n) for j, n in enumerate(nvec.tolist())]).astype(
                        np.int64
                    )
                )
            )
            return "multidiscrete", int(nvec.sum())
        width = int(np.prod(self.shape, dtype=np.int64))
        if type(self.space).__name__ == "MultiBinary":
            return "multibinary", width
        return "box", width

    def check_width(self, outputs: Any) -> None:
        """Raise unless ``outputs`` (the model's, ``(k, ..)``) have the width the default action takes.

        Raises:
            InvalidTypeError: outputs that are not a tensor.
            InvalidValueError: another width, naming the outputs' shape and the space.
        """
        if self.kind == "unknown":
            return
        if not isinstance(outputs, Tensor):
            raise InvalidTypeError(
                f"the model returned {type(outputs).__name__}; without `action=` the action space {self.name} takes "
                f"a (k, {self.width}) tensor of outputs; pass `action=` to map the model's outputs to actions"
            )
        if self.kind == "discrete":
            ok = outputs.dim() >= 1 and outputs.shape[-1] == self.n
        elif self.kind == "box":
            ok = (
                tuple(outputs.shape[1:]) == self.shape
                or (outputs.dim() == 2 and outputs.shape[1] == self.width)
                or (self.shape == (1,) and outputs.dim() == 1)
            )
        else:  # multidiscrete / multibinary: logits, or integer actions of the action's shape
            ok = (outputs.dim() == 2 and outputs.shape[1] == self.width) or (
                tuple(outputs.shape[1:]) == self.shape and not outputs.is_floating_point()
            )
        if ok:
            return
        per = outputs.shape[-1] if outputs.dim() else 0
        if self.kind == "discrete":
            what = f"{self.width} logits per slot (the action is their argmax)"
        elif self.kind == "multidiscrete":
            what = f"{self.width} logits per slot (nvec {self.nvec} concatenated, one argmax per entry)"
        elif self.kind == "multibinary":
            what = f"{self.width} logits per slot (a bit is 1 where its logit is above 0)"
        else:
            plural = "s" if self.width != 1 else ""
            what = f"{self.width} output{plural} per slot (the action's values, shape {self.shape})"
        raise InvalidValueError(
            f"the model's outputs have shape {tuple(outputs.shape)} ({per} per slot); the action space {self.name} "
            f"takes {what}; give the model {self.width} output{'s' if self.width != 1 else ''}, or pass `action=` to "
            "map its outputs to actions"
        )

    def default_action(self, outputs: Any) -> Any:
        """The action of each slot from the model's ``(k, width)`` outputs (see the class docstring).

        Raises:
            InvalidValueError: outputs of another width (:meth:`check_width`).
        """
        kind = self.kind
        if kind == "unknown":
            return outputs
        self.check_width(outputs)
        if kind == "discrete":
            actions = outputs.argmax(-1)
            return actions + self.start if self.start else actions
        k = outputs.shape[0]
        if kind == "box":
            return outputs if outputs.dim() != 2 or self.shape == (self.width,) else outputs.reshape(k, *self.shape)
        if not outputs.is_floating_point() and tuple(outputs.shape[1:]) == self.shape:
            return outputs  # the model outputs the actions themselves
        if kind == "multibinary":
            return (outputs > 0).long().reshape(k, *self.shape)
        if self._md_pos is None:
            actions = outputs.reshape(k, self._md_count, self._md_max).argmax(-1)
        else:
            grid = outputs.new_full((k, self._md_count * self._md_max), float("-inf"))
            grid[:, self._md_pos.to(outputs.device)] = outputs
            actions = grid.view(k, self._md_count, self._md_max).argmax(-1)
        if self._md_start is not None:
            actions = actions + self._md_start.to(outputs.device)
        return actions.reshape(k, *self.shape)

    def default_actions(self, outputs: Any, k: int) -> Any:
        """:meth:`default_action` then :meth:`convert` for ``k`` slots, with what they return.

        For a ``Discrete(n)`` space starting at 0 and ``(k, n)`` CPU outputs
        the argmax is an int64 ``(k,)`` tensor in ``[0, n)`` by construction,
        so it goes to the env without the checks; anything else takes them.
        """
        if (
            self.discrete
            and not self.start
            and type(outputs) is Tensor
            and outputs.shape == (k, self.n)
            and outputs.device.type == "cpu"
            and k
        ):
            return outputs.argmax(-1)
        return self.convert(self.default_action(outputs), k, None)

    def convert(self, actions: Any, k: int, to_range: tuple[Tensor, Tensor] | None) -> Any:
        """Check ``actions`` for ``k`` slots and return them on the CPU, ready for the env.

        Raises:
            InvalidValueError: wrong shape (both shapes named) or Discrete values out of range.
            InvalidTypeError: floating actions for an integer space, or not a tensor / array.
        """
        if not self.known:
            return actions
        if (
            self.discrete
            and to_range is None
            and type(actions) is Tensor
            and actions.dtype == torch.int64
            and actions.device.type == "cpu"
            and actions.shape == (k,)
        ):
            # the common case (argmax of logits on the CPU): one range check in numpy, on the same memory
            if actions.requires_grad:
                actions = actions.detach()
            if k and self._out_of_range(actions):
                self._raise_out_of_range(actions)
            return actions
        if not isinstance(actions, Tensor):
            try:
                actions = torch.as_tensor(np.asarray(actions))
            except (TypeError, ValueError, RuntimeError):
                raise InvalidTypeError(
                    f"`action(logits)` must return a tensor or array of actions, got {type(actions).__name__}"
                ) from None
        actions = actions.detach()
        expected = (k, *self.shape)
        if tuple(actions.shape) != expected:
            if self.shape == (1,) and tuple(actions.shape) == (k,):
                actions = actions.reshape(k, 1)
            else:
                raise InvalidValueError(
                    f"`action(logits)` returned actions of shape {tuple(actions.shape)} for {k} slot(s); the "
                    f"action space {self.name} needs shape {expected}"
                    + (" (did you forget `.argmax(-1)`?)" if self.discrete and actions.dim() == 2 else "")
                )
        if to_range is not None:
            lo, hi = to_range
            actions = lo.to(actions.device) + (actions.to(lo.dtype) + 1) * ((hi - lo).to(actions.device) / 2)
        if actions.device.type != "cpu":
            actions = actions.cpu()
        if self.integer:
            if actions.is_floating_point() or actions.is_complex():
                raise InvalidTypeError(
                    f"the action space {self.name} takes integer actions, but `action(logits)` returned "
                    f"{actions.dtype}" + (" (did you forget `.argmax(-1)`?)" if self.discrete else "")
                )
            actions = actions.long()
            if self.discrete and actions.numel() and self._out_of_range(actions):
                self._raise_out_of_range(actions)
        elif actions.dtype != torch.float32:
            actions = actions.to(torch.float32)
        return actions

    def _out_of_range(self, actions: Tensor) -> bool:
        """Whether a ``(k,)`` int64 CPU tensor holds a value outside ``[start, start + n)``.

        One reduction: ``a - start`` seen as unsigned is ``>= n`` exactly for
        the values outside (negative differences wrap to huge numbers).
        """
        values = actions.contiguous().numpy()
        if self.start:
            values = values - self._np_start
        return bool(values.view(np.uint64).max() >= self._np_n)

    def _raise_out_of_range(self, actions: Tensor) -> None:
        lo_v, hi_v = (int(v) for v in torch.aminmax(actions))
        raise InvalidValueError(
            f"`action(logits)` returned actions from {lo_v} to {hi_v}, outside the action space "
            f"{self.name} (valid: {self.start} to {self.start + self.n - 1})"
        )


def check_to_range(to_range: Any, fmt: ActionFormat) -> tuple[Tensor, Tensor] | None:
    """Validate ``to_range=(lo, hi)`` (scalars or per-dimension) for ``fmt``'s Box.

    Raises:
        InvalidValueError: not a pair, ``lo >= hi`` somewhere, a shape that does not
            broadcast to the action, or a space that is not continuous.
    """
    if to_range is None:
        return None
    if fmt.integer or not fmt.known:
        raise InvalidValueError(f"`to_range` rescales continuous (Box) actions; the action space is {fmt.name}")
    if not isinstance(to_range, (tuple, list)) or len(to_range) != 2:
        raise InvalidValueError(f"`to_range` must be a pair (lo, hi), got {to_range!r}")
    try:
        lo, hi = (torch.as_tensor(np.asarray(v, dtype=np.float64)).to(torch.float32) for v in to_range)
    except (TypeError, ValueError):
        raise InvalidTypeError(f"`to_range` must be a pair of numbers or arrays (lo, hi), got {to_range!r}") from None
    try:
        torch.broadcast_shapes(lo.shape, hi.shape, fmt.shape)
    except RuntimeError:
        raise InvalidValueError(
            f"`to_range` bounds of shapes {tuple(lo.shape)} and {tuple(hi.shape)} do not broadcast to the "
            f"action shape {fmt.shape}"
        ) from None
    if not bool(torch.all(lo < hi)):
        raise InvalidValueError(f"`to_range=(lo, hi)` needs lo < hi everywhere, got {to_range!r}")
    return lo, hi
