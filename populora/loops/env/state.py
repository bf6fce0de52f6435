"""What a checkpoint of :func:`~populora.evolve_with_env` (an :class:`~populora.loops.env.loop.EnvLoop`'s
state) holds, and the checks a state passes before anything is loaded.

Formats: ``populora.evolve_with_env/3`` (0.6.0: the population before its pending ``evolve_``, with the
fitnesses that step will use, so a file written after any generation resumes bit for bit, the last one
included); ``/2`` (0.2 to 0.5: the population after ``evolve_``) and ``/1`` (0.1) load and go on as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch

from populora.config import Config
from populora.errors import CheckpointError, InvalidTypeError
from populora.stats import GenerationStats

__all__ = ["FORMAT", "FORMATS", "check_state", "run_config"]

FORMAT = "populora.evolve_with_env/3"
FORMATS = ("populora.evolve_with_env/1", "populora.evolve_with_env/2", FORMAT)  # /1: 0.1's population state()


def check_state(
    state: Any, where: str, config: Config, base_sum: list[int], algorithm: str, normalize_obs: bool
) -> tuple[dict[str, Any], list[GenerationStats]]:
    """``state`` checked against this loop, nothing written: ``(state in the current layout, history)``.

    Raises:
        CheckpointError: another kind, a missing entry, another algorithm, base model, config (the first
            field that differs is named) or observation normalisation, or a damaged history.
    """
    if not isinstance(state, Mapping) or state.get("format") not in FORMATS:
        raise CheckpointError(f"{where} is not an evolve_with_env checkpoint (format {FORMAT!r})")
    state = dict(state)
    if state["format"] == FORMATS[0] and "normalizer" in state:  # 0.1: the interactor's state was its normaliser's
        state["interactor"] = {"obs_stats": state["normalizer"]}
    missing = [key for key in ("population", "interactor", "history", "base_checksum") if key not in state]
    if missing:
        raise CheckpointError(f"{where} lacks {missing}")
    if state.get("algorithm", "ga") != algorithm:
        raise CheckpointError(
            f"{where} was written by algorithm={state.get('algorithm', 'ga')!r}, this run uses algorithm={algorithm!r}"
        )
    if state["base_checksum"] != base_sum:
        raise CheckpointError(
            f"the model passed differs from the one {where} was written with (checksum of its parameters); "
            "resuming needs the same base model (seed its construction)"
        )
    if "config" in state:  # written since 0.6.0 (earlier files hold none and resume as before)
        config.check_matches(state["config"], where)
    saved = state["interactor"]
    normalized = isinstance(saved, Mapping) and saved.get("obs_stats") is not None
    if normalized != normalize_obs:
        raise CheckpointError(f"{where} was written with normalize_obs={normalized}")
    try:
        history = [history_entry(entry) for entry in state["history"]]
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{where} has a damaged history: {error}") from None
    pending = state.get("pending")
    if pending is not None and not (isinstance(pending, torch.Tensor) and pending.dim() == 1):
        raise CheckpointError(f"{where} has damaged pending fitnesses: {pending!r:.80}")
    return state, history


def run_config(**options: Any) -> Config:
    """What a checkpoint of :func:`evolve_with_env` stores of the run and a resume must match: ``pop_size``,
    ``low_rank``, ``seed``, ``horizon`` and the option objects that shape its generations (``algorithm``,
    ``episodes``, ``validation``, ``env_options`` less its ``device``: a run may resume on another machine),
    JSON-safe. Not stored: ``num_generations``, ``target_fitness``, ``budget`` (a resumed run may go on
    longer), ``checkpointing``, ``progress``, ``callback``."""
    values = {k: _json_safe(v) for k, v in options.items()}
    if isinstance(values.get("env_options"), dict):
        values["env_options"] = {k: v for k, v in values["env_options"].items() if k != "device"}
    if isinstance(values.get("algorithm"), dict):
        values["algorithm"] = {"kind": type(options["algorithm"]).__name__, **values["algorithm"]}
    return _RunConfig(values)


@dataclasses.dataclass(frozen=True)
class _RunConfig(Config):
    """The stored run (see :func:`run_config`): one field per option, compared field by field."""

    run: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.run)

    def check_matches(self, stored: Any, what: str, *, ignore: Collection[str] = ()) -> None:
        if not isinstance(stored, Mapping):
            raise CheckpointError(f"{what} holds no evolve_with_env config (got {type(stored).__name__})")
        for key in [k for k in list(self.run) + [k for k in stored if k not in self.run] if k not in ignore]:
            diff = _first_difference(
                f"evolve_with_env.{key}", stored.get(key, "<absent>"), self.run.get(key, "<absent>")
            )
            if diff is not None:
                path, old, new = diff
                raise CheckpointError(
                    f"{what} was written with {path}={old!r}; this run has {path}={new!r} "
                    "(resume with the same options, or start a new run)"
                )


def _first_difference(path: str, stored: Any, current: Any) -> tuple[str, Any, Any] | None:
    if isinstance(stored, Mapping) and isinstance(current, Mapping):
        for key in list(current) + [k for k in stored if k not in current]:
            found = _first_difference(f"{path}.{key}", stored.get(key, "<absent>"), current.get(key, "<absent>"))
            if found is not None:
                return found
        return None
    if isinstance(stored, (list, tuple)) and isinstance(current, (list, tuple)):
        stored, current = list(stored), list(current)
    return None if stored == current else (path, stored, current)


def _json_safe(value: Any) -> Any:
    """``value`` as plain Python values (a config by its ``to_dict``; an object with no JSON form by its
    class, a ``torch.dtype`` by its name)."""
    if isinstance(value, Config):
        try:
            return value.to_dict()
        except InvalidTypeError:  # a field with no JSON form (an optimizer object, a dtype)
            return {f.name: _json_safe(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, torch.dtype):
        return str(value)
    if callable(value) and not isinstance(value, torch.optim.Optimizer):
        return {"callable": f"{getattr(value, '__module__', '?')}:{getattr(value, '__qualname__', repr(value))}"}
    return {"object": f"{type(value).__module__}.{type(value).__qualname__}"}


def history_entry(entry: Sequence[Any]) -> GenerationStats:
    """``(generation, best, mean)`` up to ``(generation, best, mean, std, validated, env_steps)``.

    The optional entries may be ``None``.
    """
    if not 3 <= len(entry) <= 6:
        raise ValueError(f"an entry has {len(entry)} values, expected 3 to 6")
    more = [*entry[3:], None, None, None][:3]
    std, validated, steps = (None if v is None else float(v) for v in more)
    return GenerationStats(
        int(entry[0]), float(entry[1]), float(entry[2]), std, validated, None if steps is None else int(steps)
    )
