"""Coevolve's specs: the parameters a probe or fitness takes, and the order probes run in.

A probe may take ``coevolve`` and ``<name>`` / ``<name>_outputs`` (another
population's probe output, which makes that probe run first); a fitness may
take ``<name>`` / ``<name>_outputs`` of any population. Probes must form a
chain: :func:`find_cycle` spells out a cycle, :func:`topological` orders the
rest.
"""

from __future__ import annotations

import difflib
import inspect
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from populora.errors import InvalidTypeError, InvalidValueError
from populora.population.evolution import EVOLVE_KEYWORDS, Evolution
from populora.population.population import Population

__all__: list[str] = []

SUFFIX = "_outputs"
SPEC_KEYS = ("population", "probe", "fitness")


def fn_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def quoted(names: Sequence[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def injected(fn: Any, role: str, owner: str, allowed: Sequence[str]) -> tuple[str, ...]:
    """The parameter names of ``fn``, each checked to be one Coevolve can inject.

    Raises:
        TypeError: ``fn`` is not callable, its signature cannot be read, or it
            takes ``*args`` / ``**kwargs`` / positional-only parameters.
        ValueError: a parameter name is not among ``allowed`` (named, with the
            allowed names and the closest one).
    """
    where = f"the {role} of population {owner!r}"
    if not callable(fn):
        raise InvalidTypeError(f"{where} must be callable, got {type(fn).__name__}")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as error:
        raise InvalidTypeError(f"cannot read the signature of {where} ({fn_name(fn)}): {error}") from None
    names = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            kind = (
                "*args" if p.kind is p.VAR_POSITIONAL else "**kwargs" if p.kind is p.VAR_KEYWORD else "positional-only"
            )
            raise InvalidTypeError(
                f"{where} ({fn_name(fn)}) takes {kind} parameter `{p.name}`; Coevolve injects arguments by "
                f"name, so every parameter must be one of {quoted(allowed)}"
            )
        if p.name not in allowed:
            close = difflib.get_close_matches(p.name, allowed, n=1)
            hint = f" Did you mean `{close[0]}`?" if close else ""
            raise InvalidValueError(
                f"{where} ({fn_name(fn)}) has parameter `{p.name}`, which Coevolve cannot inject; "
                f"allowed parameter names: {quoted(allowed)}.{hint}"
            )
        names.append(p.name)
    return tuple(names)


class Member(NamedTuple):
    population: Population
    probe: Callable[..., Any]
    fitness: Callable[..., Any]
    probe_params: dict[str, str | None]  # parameter -> population whose outputs it receives (None: coevolve)
    fitness_params: dict[str, str]

    @property
    def probe_deps(self) -> tuple[str, ...]:
        return tuple(src for src in self.probe_params.values() if src is not None)


def sources(params: Sequence[str], names: Sequence[str]) -> dict[str, str | None]:
    """``{parameter: population}``: ``<name>`` and ``<name>_outputs`` both receive ``name``'s outputs."""
    return {p: None if p == "coevolve" else p if p in names else p.removesuffix(SUFFIX) for p in params}


def find_cycle(names: Sequence[str], deps: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A dependency cycle as data flows (``a -> b``: b's probe takes ``a_outputs``), or None.

    The cycle starts and ends at its earliest-declared member.
    """
    state = dict.fromkeys(names, 0)  # 0 new, 1 on the stack, 2 done
    stack: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        stack.append(name)
        for dep in deps[name]:
            if state[dep] == 1:
                loop = stack[stack.index(dep) :][::-1]  # dependency order reversed = data flow
                start = min(loop, key=names.index)
                i = loop.index(start)
                loop = loop[i:] + loop[:i]
                return [*loop, start]
            if state[dep] == 0 and (found := visit(dep)):
                return found
        stack.pop()
        state[name] = 2
        return None

    for name in names:
        if state[name] == 0 and (found := visit(name)):
            return found
    return None


def topological(names: Sequence[str], deps: Mapping[str, Sequence[str]]) -> list[str]:
    """Probe order: repeatedly the first-declared population whose inputs are ready (no cycles here)."""
    order: list[str] = []
    while len(order) < len(names):
        order.append(next(n for n in names if n not in order and all(d in order for d in deps[n])))
    return order


def check_evolution(
    evolution: Mapping[str, Any] | None, evolve_kwargs: Mapping[str, Any] | None, populations: Mapping[str, Population]
) -> dict[str, Evolution | dict[str, Any]]:
    """``{name: Evolution}`` checked against the population names; 0.5.0's ``{name: {option: value}}`` (as
    ``evolve_kwargs=`` or in ``evolution``'s place) is checked key by key and kept, with a ``DeprecationWarning``."""
    if evolution is not None and evolve_kwargs is not None:
        raise InvalidValueError("pass `evolution={name: Evolution(...)}` or the deprecated `evolve_kwargs=`, not both")
    if evolve_kwargs is None and evolution is not None:
        if not isinstance(evolution, Mapping):
            raise InvalidTypeError(
                f"`evolution` must be a dict {{population name: Evolution(...)}}, got {type(evolution).__name__}"
            )
        if all(isinstance(v, Evolution) for v in evolution.values()):
            unknown = [n for n in evolution if n not in populations]
            if unknown:
                raise InvalidValueError(
                    f"`evolution` has options for {unknown[0]!r}, which is not a population; "
                    f"populations: {list(populations)}"
                )
            return dict(evolution)
        if not all(isinstance(v, Mapping) for v in evolution.values()):
            bad = next(n for n, v in evolution.items() if not isinstance(v, (Evolution, Mapping)))
            raise InvalidTypeError(
                f"`evolution[{bad!r}]` must be a populora.Evolution, got {type(evolution[bad]).__name__}"
            )
        evolve_kwargs = evolution  # 0.5.0's second positional argument
    if evolve_kwargs is None:
        return {}
    warnings.warn(
        "Coevolve(evolve_kwargs={name: {option: value}}) is deprecated since 0.6.0 and goes in 0.7.0: pass "
        "evolution={name: populora.Evolution(...)}",
        DeprecationWarning,
        stacklevel=4,
    )
    return dict(check_evolve_kwargs(evolve_kwargs, populations))


def check_evolve_kwargs(
    evolve_kwargs: Mapping[str, Mapping[str, Any]] | None, populations: Mapping[str, Population]
) -> dict[str, dict[str, Any]]:
    if evolve_kwargs is None:
        return {}
    if not isinstance(evolve_kwargs, Mapping):
        raise InvalidTypeError(
            f"`evolve_kwargs` must be a dict keyed by population name, got {type(evolve_kwargs).__name__}"
        )
    out = {}
    for name, options in evolve_kwargs.items():
        if name not in populations:
            raise InvalidValueError(
                f"`evolve_kwargs` has options for {name!r}, which is not a population; populations: {list(populations)}"
            )
        if not isinstance(options, Mapping):
            raise InvalidTypeError(
                f"`evolve_kwargs[{name!r}]` must be a dict of evolve_ options, got {type(options).__name__}"
            )
        params = inspect.signature(populations[name].evolve_).parameters
        accepted = [
            p for p, v in params.items() if p != "fitnesses" and v.kind in (v.KEYWORD_ONLY, v.POSITIONAL_OR_KEYWORD)
        ]
        if "legacy" in params:  # Population.evolve_: 0.5.0's flat keywords, deprecated, are its config's fields
            accepted += [k for k in EVOLVE_KEYWORDS if k not in accepted]
        open_ended = any(v.kind is v.VAR_KEYWORD and p != "legacy" for p, v in params.items())
        for key in options:
            if key not in accepted and not open_ended:
                close = difflib.get_close_matches(str(key), accepted, n=1)
                hint = f" Did you mean `{close[0]}`?" if close else ""
                raise InvalidValueError(
                    f"`evolve_kwargs[{name!r}]` has option `{key}`, which "
                    f"{type(populations[name]).__name__}.evolve_ does not take; options: "
                    f"{quoted(accepted)}.{hint}"
                )
        out[name] = dict(options)
    return out
