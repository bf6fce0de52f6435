"""What every loop shares: the callback rule.

A loop that takes ``callback`` calls it after every step (or generation) with that step's record and reads
its return value by one rule, :func:`callback_says_stop`: ``None`` or ``False`` continues, ``True`` (a real
bool) stops, anything else raises :class:`~populora.errors.InvalidTypeError`. A truthy list or number is not
read as "stop": a logging lambda that returns what it logged would otherwise end the run silently.
"""

from __future__ import annotations

from typing import Any

from populora.errors import InvalidTypeError

__all__ = ["callback_says_stop"]


def callback_says_stop(callback: Any, value: Any) -> bool:
    """Whether ``callback``'s return ``value`` stops the loop.

    ``None`` or ``False`` (Python or NumPy bool): continue; ``True``: stop.

    Raises:
        InvalidTypeError: any other value (a list, ``1``, a string, ...), naming the callback and the value.

    Example:
        >>> callback_says_stop(print, None), callback_says_stop(print, True)
        (False, True)
    """
    if value is None:
        return False
    kind = type(value)
    if isinstance(value, bool) or (kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_")):
        return bool(value)
    name = getattr(callback, "__qualname__", None) or repr(callback)
    raise InvalidTypeError(
        f"callback {name} returned {value!r:.80} ({kind.__name__}); expected None, False (continue) or True (stop)"
    )
