"""The argument checks :class:`~populora.selfplay.SelfPlay` and :class:`~populora.selfplay.PopuLoRA` share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from populora.checks import check_bool
from populora.errors import InvalidTypeError, InvalidValueError
from populora.llm.text import pad_id
from populora.loops.ratings import Ratings
from populora.population.population import Population
from populora.tasks import Task

__all__: list[str] = []


def check_players(
    teachers: Any,
    students: Any,
    tokenizer: Any,
    task: Any,
    ratings: Any,
    chat: Any,
    default_ratings: Callable[[dict[str, int]], Ratings],
) -> tuple[Ratings, int, bool]:
    """``(ratings, pad id, chat)`` once the two populations, tokenizer, task and ratings fit one game.

    ``ratings=None`` becomes ``default_ratings({"teachers": P_t, "students": P_s})``.

    Raises:
        InvalidTypeError, InvalidValueError: the offending argument, named.
    """
    for name, pop in (("teachers", teachers), ("students", students)):
        if not isinstance(pop, Population):
            raise InvalidTypeError(f"`{name}` must be a Population, got {type(pop).__name__}")
        if pop.spent:
            raise InvalidValueError(f"`{name}` was merged or closed: it cannot play any more")
    if teachers is students:
        raise InvalidValueError("`teachers` and `students` are the same Population: pass two populations on one model")
    if teachers.model is not students.model:
        raise InvalidValueError(
            "`teachers` and `students` must be populations on the SAME base model "
            f"(teachers.model is students.model), got two models: "
            f"{type(teachers.model).__name__} at {id(teachers.model):#x} and "
            f"{type(students.model).__name__} at {id(students.model):#x}"
        )
    if not isinstance(task, Task):
        raise InvalidTypeError(f"`task` must be a populora.tasks.Task, got {type(task).__name__}")
    chat = check_bool("chat", chat)
    for attr in ("decode", "__call__", *(("apply_chat_template",) if chat else ())):
        if not callable(getattr(tokenizer, attr, None)):
            raise InvalidTypeError(
                f"`tokenizer` must have a `{attr}` method (a Hugging Face tokenizer), got {type(tokenizer).__name__}"
            )
    try:
        pad = pad_id(tokenizer)
    except ValueError as error:
        raise InvalidValueError(f"`tokenizer`: {error}") from None
    sizes = {"teachers": teachers.pop_size, "students": students.pop_size}
    if ratings is None:
        ratings = default_ratings(sizes)
    elif not isinstance(ratings, Ratings):
        raise InvalidTypeError(f"`ratings` must be a populora.Ratings, got {type(ratings).__name__}")
    for name, size in sizes.items():
        held = ratings.sizes.get(name)
        if held != size:
            raise InvalidValueError(
                f"`ratings` must rate {name!r} with {size} players (the population's pop_size), got "
                + ("no such name" if held is None else f"{held} players")
            )
    return ratings, pad, chat
