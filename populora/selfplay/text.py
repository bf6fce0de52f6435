"""Moved to :mod:`populora.llm.text` in 0.6.0; importing this path warns, and it goes in 0.7.0."""

import importlib
import sys
import warnings

warnings.warn(
    "populora.selfplay.text moved to populora.llm.text in 0.6.0; this path goes in 0.7.0",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = importlib.import_module("populora.llm.text")
