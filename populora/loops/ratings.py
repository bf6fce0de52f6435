"""Matchmaking: player ratings over populations and prioritised fictitious self-play (PFSP) pairing.

A player is ``(population name, individual id)``. :class:`Ratings` keeps one
Weng-Lin (TrueSkill-style) rating ``(mu, sigma)`` per player, updated with the
maintained `openskill <https://pypi.org/project/openskill/>`_ library
(``pip install openskill``; imported when a :class:`Ratings` is built, not by
``import populora``), and pairs players for the next matches:

- ``"pfsp"``: prioritised fictitious self-play favouring near-balanced
  opponents. For a player ``a`` of ``name_a`` the opponent ``b`` of ``name_b``
  is drawn with weight ``w = p * (1 - p)``, ``p = P(a beats b)`` (openskill's
  ``predict_win``): largest at ``p = 0.5``, vanishing for sure wins and sure
  losses.
- ``"pfsp_hard"``: weight ``w = (1 - p) ** 2``, favouring opponents that beat ``a``.
- ``"uniform"``: every allowed opponent equally likely.
- ``"round_robin"``: deterministic, ``(i + offset) % P_b``, no randomness.

When ``name_a == name_b`` a player is never paired with itself.

Ratings follow individuals through :meth:`Population.evolve_`: after
``result = pop.evolve_(...)``, ``ratings.follow_(name, result)`` gives the
culled slots (``result.selected_out_indices``, rewritten by children) a fresh
rating; survivors and elites keep theirs. ``inherit="reset"`` (default) sets a
child to the prior ``(prior_mu, prior_sigma)``; ``inherit="mean"`` sets its
``mu`` to the mean ``mu`` of the population's survivors (the parents' pool,
``result.selected_in_indices``, over all islands) and its ``sigma`` to the
prior ``sigma`` (a fresh, uncertain rating centred on the parents' level).
Either way the child's match count restarts at 0.

Fractional scores: ``score`` is ``a``'s result in ``[0, 1]`` (1 = ``a`` won,
0 = ``b`` won, 0.5 = draw). openskill rates ranked outcomes only (its
``scores=`` turn into ranks, margins aside), so a fractional score is rated as
a piecewise-linear interpolation between openskill's updates for the outcomes
around it: for ``s in (0.5, 1)`` each of the two players' ``mu`` and
``sigma`` is ``(1 - t) * draw_update + t * a_won_update`` with
``t = 2 * s - 1``; for ``s in (0, 0.5)`` it is ``(1 - t) * b_won_update + t *
draw_update`` with ``t = 2 * s``. It is exact at 0, 0.5 and 1, continuous
and monotone in ``s`` (a higher score never lowers ``a``'s ``mu``).

Everything is deterministic (plain float arithmetic, randomness only from the
caller's generator), so ranks that apply the same matches in the same order
hold identical ratings.

Example:
    >>> r = Ratings({"teacher": 2, "student": 3})
    >>> r.rate_(("teacher", 0), ("student", 1), 1.0)
    >>> r.mu("teacher")[0].item() > r.mu("teacher")[1].item()
    True
    >>> r.pair("teacher", "student", torch.Generator().manual_seed(0)).shape
    torch.Size([2])
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from populora.checks import check_float, check_index, check_int, check_one_of
from populora.errors import CheckpointError, InvalidTypeError, InvalidValueError
from populora.operators.selection import SelectionResult
from populora.snapshots import Snapshot
from populora.transaction import transaction

__all__ = ["MAX_MU_OVER_BETA", "MAX_SCALE", "MIN_SCALE", "MODELS", "PAIRING_MODES", "INHERIT_MODES", "Ratings"]

MODELS = ("PlackettLuce", "BradleyTerryFull", "BradleyTerryPart", "ThurstoneMostellerFull", "ThurstoneMostellerPart")
PAIRING_MODES = ("pfsp", "pfsp_hard", "uniform", "round_robin")
INHERIT_MODES = ("reset", "mean")
_FORMAT = "populora.Ratings"
_VERSION = 1

# What openskill's float arithmetic can take (found by experiment with openskill 6 on every model):
# every model squares sigma, beta and tau (past ~1e154 the squares overflow; below ~1e-160 sigma ** 2 + beta ** 2
# underflows to 0 and openskill divides by it), so they stay within [MIN_SCALE, MAX_SCALE] (tau may be 0).
MIN_SCALE = 1e-100
MAX_SCALE = 1e100
# PlackettLuce computes exp(mu / c) of each player's own mu, with c = sqrt(sigma_a^2 + sigma_b^2 + 2 beta^2) >=
# sqrt(2) beta: exp overflows past |mu| ~ 709 sqrt(2) beta ~ 1003 beta (and underflows to a division by zero
# below -1054 beta). Its prior stays within half of that, leaving room for the ratings to move.
MAX_MU_OVER_BETA = 500.0


def _openskill_models() -> Any:
    """``openskill.models``, with an error saying how to install it."""
    try:
        import openskill.models as models
    except ImportError as err:
        raise ImportError(
            "populora.loops.ratings.Ratings needs the `openskill` package: "
            'pip install openskill (or, in a clone of the populora repository, pip install -e ".[llm]")'
        ) from err
    return models


def _as_ids(name: str, ids: Any, size: int) -> list[int]:
    """A 1-D sequence or int tensor of ids in ``[0, size)`` as a list of ints."""
    if isinstance(ids, torch.Tensor):
        if ids.ndim != 1 or ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise InvalidTypeError(
                f"`{name}` must be a 1-D integer tensor, got {ids.dtype} of shape {tuple(ids.shape)}"
            )
        ids = ids.tolist()
    elif isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise InvalidTypeError(f"`{name}` must be a sequence or 1-D tensor of ids, got {type(ids).__name__}")
    return [check_index(f"{name}[{k}]", v, size) for k, v in enumerate(ids)]


def _as_scores(scores: Any) -> list[float]:
    """A 1-D sequence or real tensor of scores in ``[0, 1]`` as a list of floats."""
    if isinstance(scores, torch.Tensor):
        if scores.ndim != 1 or scores.dtype.is_complex or scores.dtype == torch.bool:
            raise InvalidTypeError(
                f"`scores` must be a 1-D real tensor, got {scores.dtype} of shape {tuple(scores.shape)}"
            )
        scores = scores.tolist()
    elif isinstance(scores, (str, bytes)) or not isinstance(scores, Sequence):
        raise InvalidTypeError(
            f"`scores` must be a sequence or 1-D tensor of numbers in [0, 1], got {type(scores).__name__}"
        )
    return [check_float(f"scores[{k}]", s, low=0.0, high=1.0) for k, s in enumerate(scores)]


class Ratings(Snapshot):
    """Weng-Lin ratings ``(mu, sigma)`` of every individual of named populations (openskill underneath).

    Args:
        sizes: ``{name: P}``, the populations and their sizes (``P >= 1``).
        model: the openskill model: ``"PlackettLuce"`` (default),
            ``"BradleyTerryFull"``, ``"BradleyTerryPart"``,
            ``"ThurstoneMostellerFull"`` or ``"ThurstoneMostellerPart"``.
        inherit: what a culled slot's new child gets in :meth:`follow_`:
            ``"reset"`` (the prior) or ``"mean"`` (survivors' mean ``mu``,
            prior ``sigma``); see the module docstring.
        prior_mu, prior_sigma: the prior rating (openskill's defaults 25, 25/3).
        beta: performance noise (openskill's default 25/6).
        tau: dynamics added to ``sigma`` before each match (openskill's default 25/300).

    What openskill can rate is checked here: ``prior_sigma`` and ``beta`` in
    ``[MIN_SCALE, MAX_SCALE]`` (``1e-100``, ``1e100``), ``tau`` in ``[0, MAX_SCALE]``,
    ``|prior_mu| <= MAX_SCALE``, and with ``"PlackettLuce"`` (which takes the
    exponential of each player's own ``mu / c``, ``c >= sqrt(2) * beta``)
    ``|prior_mu| <= MAX_MU_OVER_BETA * beta`` (500 ``beta``: half of where it
    overflows). Shift the prior (ratings only compare differences) or raise
    ``beta`` for a larger one. A match openskill still cannot compute (ratings
    far apart, loaded from a state) raises :class:`InvalidValueError` and rates
    nothing.

    Raises:
        ImportError: ``openskill`` is not installed.
        InvalidTypeError, InvalidValueError: a bad argument (named), or one beyond what openskill can take
            (the bound named).
    """

    _checkpoint_kind = "Ratings"

    def __init__(
        self,
        sizes: Mapping[str, int],
        *,
        model: str = "PlackettLuce",
        inherit: str = "reset",
        prior_mu: float = 25.0,
        prior_sigma: float = 25.0 / 3.0,
        beta: float = 25.0 / 6.0,
        tau: float = 25.0 / 300.0,
    ) -> None:
        if not isinstance(sizes, Mapping):
            raise InvalidTypeError(f"`sizes` must be a mapping {{name: population size}}, got {type(sizes).__name__}")
        if not sizes:
            raise InvalidValueError("`sizes` must name at least one population, got an empty mapping")
        checked: dict[str, int] = {}
        for name, size in sizes.items():
            if not isinstance(name, str) or not name:
                raise InvalidTypeError(f"population names in `sizes` must be non-empty strings, got {name!r}")
            checked[name] = check_int(f"sizes[{name!r}]", size, low=1)
        if not isinstance(model, str):
            raise InvalidTypeError(f"`model` must be a str, one of {list(MODELS)}, got {type(model).__name__}")
        check_one_of("model", model, MODELS)
        if not isinstance(inherit, str):
            raise InvalidTypeError(
                f"`inherit` must be a str, one of {list(INHERIT_MODES)}, got {type(inherit).__name__}"
            )
        check_one_of("inherit", inherit, INHERIT_MODES)
        self.prior_mu = check_float("prior_mu", prior_mu, low=-MAX_SCALE, high=MAX_SCALE)
        self.prior_sigma = check_float("prior_sigma", prior_sigma, low=MIN_SCALE, high=MAX_SCALE)
        self.beta = check_float("beta", beta, low=MIN_SCALE, high=MAX_SCALE)
        self.tau = check_float("tau", tau, low=0.0, high=MAX_SCALE)
        if model == "PlackettLuce" and abs(self.prior_mu) > MAX_MU_OVER_BETA * self.beta:
            raise InvalidValueError(
                f"`prior_mu` must be within +-{MAX_MU_OVER_BETA:g} * beta = +-{MAX_MU_OVER_BETA * self.beta:g} "
                f"with model='PlackettLuce' (it takes exp(mu / c), c >= sqrt(2) * beta = {2**0.5 * self.beta:g}, "
                f"which overflows past about 1000 * beta), got {self.prior_mu!r}: shift the prior (ratings only "
                "compare differences), raise `beta`, or take a model that compares differences only "
                "(e.g. 'ThurstoneMostellerFull')"
            )
        self.model_name = model
        self.inherit = inherit
        self._model = getattr(_openskill_models(), model)(
            mu=self.prior_mu, sigma=self.prior_sigma, beta=self.beta, tau=self.tau
        )
        self._sizes = checked
        self._mu = {n: torch.full((p,), self.prior_mu, dtype=torch.float64) for n, p in checked.items()}
        self._sigma = {n: torch.full((p,), self.prior_sigma, dtype=torch.float64) for n, p in checked.items()}
        self._matches = {n: torch.zeros(p, dtype=torch.int64) for n, p in checked.items()}
        self._played = 0

    # ------------------------------------------------------------------ reading
    @property
    def sizes(self) -> dict[str, int]:
        """``{name: P}`` (a copy)."""
        return dict(self._sizes)

    def _name(self, name: Any, arg: str = "name") -> str:
        if not isinstance(name, str):
            raise InvalidTypeError(f"`{arg}` must be a population name (str), got {type(name).__name__} {name!r}")
        if name not in self._sizes:
            raise InvalidValueError(f"`{arg}` must be one of the rated populations {list(self._sizes)}, got {name!r}")
        return name

    def _player(self, player: Any, arg: str) -> tuple[str, int]:
        if not isinstance(player, tuple) or len(player) != 2:
            raise InvalidTypeError(f"`{arg}` must be a (population name, id) tuple, got {player!r}")
        name = self._name(player[0], f"{arg}[0]")
        return name, check_index(f"{arg}[1]", player[1], self._sizes[name])

    def mu(self, name: str) -> Tensor:
        """``(P,)`` float64 mean skill of every individual of ``name`` (a copy)."""
        return self._mu[self._name(name)].clone()

    def sigma(self, name: str) -> Tensor:
        """``(P,)`` float64 skill uncertainty of every individual of ``name`` (a copy)."""
        return self._sigma[self._name(name)].clone()

    def ordinal(self, name: str) -> Tensor:
        """``(P,)`` float64 conservative skill ``mu - 3 * sigma`` (openskill's ``ordinal()``)."""
        name = self._name(name)
        return self._mu[name] - 3.0 * self._sigma[name]

    def matches(self, name: str) -> Tensor:
        """``(P,)`` int64 number of rated matches of each individual since it was born (or reset)."""
        return self._matches[self._name(name)].clone()

    @property
    def played(self) -> int:
        """Total number of matches rated so far."""
        return self._played

    def _rating(self, name: str, i: int) -> Any:
        return self._model.rating(mu=float(self._mu[name][i]), sigma=float(self._sigma[name][i]))

    def win_probability(self, a: tuple[str, int], b: tuple[str, int]) -> float:
        """``P(a beats b)`` from openskill's ``predict_win`` (draws aside; ``P(b beats a) = 1 - P(a beats b)``)."""
        a, b = self._player(a, "a"), self._player(b, "b")
        return float(self._model.predict_win([[self._rating(*a)], [self._rating(*b)]])[0])

    def win_matrix(self, name_a: str, name_b: str) -> Tensor:
        """``(P_a, P_b)`` float64: entry ``[i, j]`` is ``P((name_a, i) beats (name_b, j))``.

        As :meth:`win_probability`, for every pair.
        """
        name_a, name_b = self._name(name_a, "name_a"), self._name(name_b, "name_b")
        ra = [self._rating(name_a, i) for i in range(self._sizes[name_a])]
        rb = [self._rating(name_b, j) for j in range(self._sizes[name_b])]
        predict = self._model.predict_win
        return torch.tensor([[predict([[x], [y]])[0] for y in rb] for x in ra], dtype=torch.float64)

    def summary(self, name: str) -> dict[str, float | int]:
        """Plain numbers for a run's history: ``mu_mean``, ``mu_max``, ``sigma_mean``, ``ordinal_mean``,
        ``ordinal_best`` and ``best`` (the id with the highest ordinal, lowest id on ties)."""
        name = self._name(name)
        ordinal = self.ordinal(name)
        return {
            "mu_mean": float(self._mu[name].mean()),
            "mu_max": float(self._mu[name].max()),
            "sigma_mean": float(self._sigma[name].mean()),
            "ordinal_mean": float(ordinal.mean()),
            "ordinal_best": float(ordinal.max()),
            "best": int(torch.argmax(ordinal)),
        }

    # ----------------------------------------------------------------- updating
    def _outcome(self, ra: Any, rb: Any, ranks: list[int]) -> tuple[float, float, float, float]:
        [[na], [nb]] = self._model.rate([[ra], [rb]], ranks=ranks)
        return na.mu, na.sigma, nb.mu, nb.sigma

    def _update(self, a: tuple[str, int], b: tuple[str, int], score: float) -> None:
        """Rate one checked match; openskill's arithmetic errors and non-finite results raise before any write."""
        try:
            new = self._updated(a, b, score)
        except ArithmeticError as error:  # OverflowError, ZeroDivisionError in openskill's float arithmetic
            raise self._unratable(a, b, f"{type(error).__name__}: {error}") from error
        if not all(math.isfinite(v) for v in new) or not (new[1] > 0 and new[3] > 0):
            raise self._unratable(a, b, f"it gives mu, sigma = {new[:2]} and {new[2:]}")
        (na, ia), (nb, ib) = a, b
        self._mu[na][ia], self._sigma[na][ia] = new[0], new[1]
        self._mu[nb][ib], self._sigma[nb][ib] = new[2], new[3]
        self._matches[na][ia] += 1
        self._matches[nb][ib] += 1
        self._played += 1

    def _unratable(self, a: tuple[str, int], b: tuple[str, int], why: str) -> InvalidValueError:
        shown = ", ".join(
            f"{p!r} (mu={float(self._mu[p[0]][p[1]])!r}, sigma={float(self._sigma[p[0]][p[1]])!r})" for p in (a, b)
        )
        return InvalidValueError(
            f"openskill's {self.model_name} cannot rate the match of {shown} with beta={self.beta!r}, "
            f"tau={self.tau!r}: {why}; nothing was rated"
        )

    def _updated(self, a: tuple[str, int], b: tuple[str, int], score: float) -> tuple[float, ...]:
        """``(mu_a, sigma_a, mu_b, sigma_b)`` after the match (nothing written)."""
        ra, rb = self._rating(*a), self._rating(*b)
        new: tuple[float, ...]
        if score == 1.0:
            new = self._outcome(ra, rb, [0, 1])
        elif score == 0.0:
            new = self._outcome(ra, rb, [1, 0])
        elif score == 0.5:
            new = self._outcome(ra, rb, [0, 0])
        else:
            draw = self._outcome(ra, rb, [0, 0])
            if score > 0.5:
                lo, hi, t = draw, self._outcome(ra, rb, [0, 1]), 2.0 * score - 1.0
            else:
                lo, hi, t = self._outcome(ra, rb, [1, 0]), draw, 2.0 * score
            new = tuple((1.0 - t) * x + t * y for x, y in zip(lo, hi))
        return new

    def rate_(self, a: tuple[str, int], b: tuple[str, int], score: float) -> None:
        """Rate one 1v1 match: ``score`` 1 = ``a`` won, 0 = ``b`` won, 0.5 = draw (fractions: module docstring).

        Raises:
            InvalidTypeError, InvalidValueError, InvalidIndexError: a bad player
                or score, ``a == b``, or ratings openskill cannot compute with (named); nothing has changed.
        """
        a, b = self._player(a, "a"), self._player(b, "b")
        score = check_float("score", score, low=0.0, high=1.0)
        if a == b:
            raise InvalidValueError(f"a player cannot play itself, got a == b == {a!r}")
        self._update(a, b, score)

    def rate_many_(self, name_a: str, ids_a: Any, name_b: str, ids_b: Any, scores: Any) -> None:
        """Rate a batch of 1v1 matches, in order: match ``k`` is ``(name_a, ids_a[k])`` vs
        ``(name_b, ids_b[k])`` with ``a``'s score ``scores[k]`` (as :meth:`rate_`).

        Args:
            ids_a, ids_b: ``(n,)`` ids (sequences or integer tensors).
            scores: ``(n,)`` numbers in ``[0, 1]``.

        Raises:
            InvalidTypeError, InvalidValueError, InvalidIndexError: a bad name,
                id or score (named by position), lengths that differ, or a
                player paired with itself; every match is checked before any
                is rated, so nothing has changed. A match openskill cannot
                compute raises :class:`InvalidValueError` naming its players,
                and the matches before it are undone: all or nothing.
        """
        name_a, name_b = self._name(name_a, "name_a"), self._name(name_b, "name_b")
        ia = _as_ids("ids_a", ids_a, self._sizes[name_a])
        ib = _as_ids("ids_b", ids_b, self._sizes[name_b])
        ss = _as_scores(scores)
        if not len(ia) == len(ib) == len(ss):
            raise InvalidValueError(
                f"`ids_a`, `ids_b` and `scores` must have the same length, got {len(ia)}, {len(ib)} and {len(ss)}"
            )
        if name_a == name_b:
            for k, (x, y) in enumerate(zip(ia, ib)):
                if x == y:
                    raise InvalidValueError(f"match {k} pairs ({name_a!r}, {x}) with itself")
        with transaction(self):
            for x, y, s in zip(ia, ib, ss):
                self._update((name_a, x), (name_b, y), s)

    def transaction_state(self) -> tuple[Any, ...]:
        """Copies of the tables and the played counts (:mod:`populora.transaction`)."""
        return self._tables(), copy.copy(self._played)

    def restore_transaction_state(self, state: tuple[Any, ...]) -> None:
        """Put back a :meth:`transaction_state`."""
        (self._mu, self._sigma, self._matches), self._played = state

    def _tables(self) -> tuple[dict[str, Tensor], ...]:
        """Copies of the ``mu``, ``sigma`` and match-count tables."""
        return tuple({n: t.clone() for n, t in table.items()} for table in (self._mu, self._sigma, self._matches))

    def reset_(self, name: str, ids: Any) -> None:
        """Give the individuals ``ids`` of ``name`` the prior rating and a match count of 0."""
        name = self._name(name)
        ids = _as_ids("ids", ids, self._sizes[name])
        index = torch.tensor(ids, dtype=torch.int64)
        self._mu[name][index] = self.prior_mu
        self._sigma[name][index] = self.prior_sigma
        self._matches[name][index] = 0

    def follow_(self, name: str, result: SelectionResult) -> None:
        """Follow ``pop.evolve_``: the culled slots ``result.selected_out_indices`` (now children) get a fresh
        rating per ``inherit`` (module docstring); survivors and elites keep theirs.

        Raises:
            InvalidTypeError: ``result`` is not a :class:`SelectionResult`.
            InvalidValueError, InvalidIndexError: ``result`` does not describe a
                population of ``name``'s size (survivors and culled must
                partition its ids); nothing has changed.
        """
        name = self._name(name)
        if not isinstance(result, SelectionResult):
            raise InvalidTypeError(
                f"`result` must be the SelectionResult returned by evolve_, got {type(result).__name__}"
            )
        size = self._sizes[name]
        kept = _as_ids("result.selected_in_indices", result.selected_in_indices, size)
        culled = _as_ids("result.selected_out_indices", result.selected_out_indices, size)
        if sorted(kept + culled) != list(range(size)):
            raise InvalidValueError(
                f"`result` does not partition the {size} ids of {name!r} into survivors "
                f"{kept} and culled {culled}: is it from another population?"
            )
        if not culled:
            return
        index = torch.tensor(culled, dtype=torch.int64)
        if self.inherit == "mean":
            mu = float(self._mu[name][torch.tensor(kept, dtype=torch.int64)].mean())
        else:
            mu = self.prior_mu
        self._mu[name][index] = mu
        self._sigma[name][index] = self.prior_sigma
        self._matches[name][index] = 0

    # ------------------------------------------------------------------ pairing
    def pair(
        self, name_a: str, name_b: str, generator: torch.Generator, *, mode: str = "pfsp", offset: int = 0
    ) -> Tensor:
        """An opponent in ``name_b`` for every player of ``name_a``.

        Args:
            generator: the source of randomness (``"round_robin"`` does not use it).
            mode: ``"pfsp"`` (weight ``p * (1 - p)``), ``"pfsp_hard"``
                (weight ``(1 - p) ** 2``), ``"uniform"`` or ``"round_robin"``
                (``(i + offset) % P_b``); see the module docstring. A row whose
                weights all vanish (every opponent a sure win) falls back to uniform.
            offset: ``"round_robin"``'s rotation (e.g. the step number): any int ``>= 0``
                (it is reduced modulo the table size first, so no size overflows).
                With ``name_a == name_b`` player ``i`` meets
                ``(i + 1 + offset % (P - 1)) % P``, never itself.

        Returns:
            ``(P_a,)`` int64 opponent ids in ``[0, P_b)``, sampled independently
            per player (with replacement across players), deterministic given
            the generator's state.

        Raises:
            InvalidValueError: unknown names or mode, or ``name_a == name_b``
                with a single individual (no opponent).
        """
        name_a, name_b = self._name(name_a, "name_a"), self._name(name_b, "name_b")
        if not isinstance(mode, str):
            raise InvalidTypeError(f"`mode` must be a str, one of {list(PAIRING_MODES)}, got {type(mode).__name__}")
        check_one_of("mode", mode, PAIRING_MODES)
        offset = check_int("offset", offset, low=0)
        if not isinstance(generator, torch.Generator):
            raise InvalidTypeError(f"`generator` must be a torch.Generator, got {type(generator).__name__}")
        pa, pb = self._sizes[name_a], self._sizes[name_b]
        same = name_a == name_b
        if same and pa < 2:
            raise InvalidValueError(f"population {name_a!r} has a single individual: it has no opponent in itself")
        ids = torch.arange(pa, dtype=torch.int64)
        if mode == "round_robin":
            if same:
                return (ids + 1 + offset % (pa - 1)) % pa
            return (ids + offset % pb) % pb  # (Python's int % first: ids + offset may not fit int64)
        allowed = torch.ones(pa, pb, dtype=torch.bool)
        if same:
            allowed.fill_diagonal_(False)
        if mode == "uniform":
            weights = allowed.to(torch.float64)
        else:
            p = self.win_matrix(name_a, name_b)
            weights = p * (1.0 - p) if mode == "pfsp" else (1.0 - p) ** 2
            weights = torch.where(allowed, weights, torch.zeros_like(weights))
            empty = weights.sum(1) <= 0
            if bool(empty.any()):
                weights[empty] = allowed[empty].to(torch.float64)
        return torch.multinomial(weights, 1, generator=generator).squeeze(1)

    # --------------------------------------------------------------- checkpoint
    def _config(self) -> dict[str, Any]:
        return {
            "model": self.model_name,
            "inherit": self.inherit,
            "prior_mu": self.prior_mu,
            "prior_sigma": self.prior_sigma,
            "beta": self.beta,
            "tau": self.tau,
            "sizes": dict(self._sizes),
        }

    def state_dict(self) -> dict[str, Any]:
        """A snapshot of plain values and tensors (no shared storage): the config and every ``mu``,
        ``sigma`` and match count, for :func:`populora.checkpoint.atomic_save` or a run's checkpoint."""
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "config": self._config(),
            "played": self._played,
            "mu": {n: t.clone() for n, t in self._mu.items()},
            "sigma": {n: t.clone() for n, t in self._sigma.items()},
            "matches": {n: t.clone() for n, t in self._matches.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` exactly; everything is checked before anything is written.

        Raises:
            CheckpointError: not a Ratings state, a missing or malformed entry,
                or a config (model, inherit, prior, beta, tau, population
                names and sizes) that differs from this object's (named);
                nothing has changed.
        """
        if not isinstance(state, Mapping) or state.get("format") != _FORMAT:
            got = state.get("format") if isinstance(state, Mapping) else type(state).__name__
            raise CheckpointError(f"not a Ratings state dict (expected format {_FORMAT!r}, got {got!r})")
        if state.get("version") != _VERSION:
            raise CheckpointError(f"Ratings state has version {state.get('version')!r}, this populora reads {_VERSION}")
        missing = [k for k in ("config", "played", "mu", "sigma", "matches") if k not in state]
        if missing:
            raise CheckpointError(f"Ratings state is missing {missing}; nothing was loaded")
        theirs = state["config"]
        if not isinstance(theirs, Mapping):
            raise CheckpointError(f"Ratings state has a bad 'config': expected a dict, got {type(theirs).__name__}")
        for key, value in self._config().items():
            if key not in theirs:
                raise CheckpointError(f"Ratings state config is missing {key!r}")
            if theirs[key] != value:
                raise CheckpointError(f"checkpoint has {key}={theirs[key]!r}, these Ratings have {value!r}")
        played = state["played"]
        if not isinstance(played, int) or isinstance(played, bool) or played < 0:
            raise CheckpointError(f"Ratings state has a bad 'played': expected an int >= 0, got {played!r}")
        new: dict[str, dict[str, Tensor]] = {}
        for key, dtype in (("mu", torch.float64), ("sigma", torch.float64), ("matches", torch.int64)):
            table = state[key]
            if not isinstance(table, Mapping) or set(table) != set(self._sizes):
                raise CheckpointError(
                    f"Ratings state {key!r} must map {sorted(self._sizes)} to tensors, got "
                    f"{sorted(table) if isinstance(table, Mapping) else type(table).__name__}"
                )
            new[key] = {}
            for name, size in self._sizes.items():
                t = table[name]
                if not isinstance(t, torch.Tensor) or t.dtype != dtype or tuple(t.shape) != (size,):
                    got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
                    raise CheckpointError(
                        f"Ratings state {key}[{name!r}] must be a {dtype} tensor of shape ({size},), got {got}"
                    )
                if key == "matches":
                    bad, expect = (t < 0).any(), ">= 0"
                elif key == "mu":
                    bad, expect = ~(t.abs() <= MAX_SCALE).all(), f"finite, within +-{MAX_SCALE:g}"
                else:
                    bad, expect = ~((t >= MIN_SCALE) & (t <= MAX_SCALE)).all(), f"in [{MIN_SCALE:g}, {MAX_SCALE:g}]"
                if bool(bad):
                    raise CheckpointError(
                        f"Ratings state {key}[{name!r}] has invalid values {t.tolist()}: expected {expect} "
                        "(what openskill can rate)"
                    )
                new[key][name] = t.detach().to("cpu").clone()
        self._mu, self._sigma, self._matches = new["mu"], new["sigma"], new["matches"]
        self._played = played

    def __repr__(self) -> str:
        return (
            f"Ratings(sizes={self._sizes}, model={self.model_name!r}, inherit={self.inherit!r}, played={self._played})"
        )
