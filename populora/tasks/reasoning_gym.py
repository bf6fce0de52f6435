"""An optional adapter to `reasoning-gym <https://github.com/open-thought/reasoning-gym>`_'s generators.

``reasoning-gym`` is an extra, not a dependency: it is imported when a :class:`ReasoningGymTask` is
built, and a missing package raises an ``ImportError`` saying ``pip install reasoning-gym``.

``ReasoningGymTask("basic_arithmetic", size=500, seed=0, **config)`` builds that dataset
(``config`` goes to its config class: that is the difficulty knob, ``difficulty`` itself is fixed
at 1). :meth:`~ReasoningGymTask.sample` draws entries by index with the generator (the dataset is
itself deterministic in ``seed``); a problem's ``answer`` is the dataset's answer string and
``data`` holds ``{"entry": entry, "index": i, "dataset": name}``.

Checking: the reply's answer is the content of its last ``<answer>...</answer>`` tag when it has
one, else its last non-empty line; the dataset's ``score_answer`` must give at least ``threshold``
(default 1.0: exactly right). A scorer that raises on a malformed reply counts as wrong.

Reasoning-gym problems cannot be verified from a teacher's free text, so this task takes no teacher
proposals: :meth:`~ReasoningGymTask.proposal_prompt` and :meth:`~ReasoningGymTask.parse_proposal`
raise ``InvalidValueError``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch

from populora.checks import check_float, check_int, check_seed
from populora.errors import InvalidTypeError, InvalidValueError
from populora.tasks.base import Problem, Task, register_checker

__all__ = ["ReasoningGymTask"]

_OPEN_TAG = re.compile("<answer>", re.IGNORECASE)
_CLOSE_TAG = re.compile("</answer>", re.IGNORECASE)


def _import_reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError as err:
        raise ImportError(
            "ReasoningGymTask needs the optional package reasoning-gym: pip install reasoning-gym "
            '(or, in a clone of the populora repository, pip install -e ".[reasoning-gym]")'
        ) from err
    return reasoning_gym


def extract_reply_answer(reply: str) -> str:
    """The answer part of ``reply``: its last ``<answer>`` tag's content, else its last non-empty line."""
    if not isinstance(reply, str):
        raise InvalidTypeError(f"`reply` must be a str, got {type(reply).__name__}")
    # what `re.findall(r"<answer>(.*?)</answer>", DOTALL | IGNORECASE)[-1]` gives, in one pass: that regex
    # rescans the rest of the reply from every unclosed `<answer>` (quadratic in a run of them)
    last, pos = None, 0
    while (opening := _OPEN_TAG.search(reply, pos)) is not None:
        closing = _CLOSE_TAG.search(reply, opening.end())
        if closing is None:
            break
        last, pos = reply[opening.end() : closing.start()], closing.end()
    if last is not None:
        return last.strip()
    for line in reversed(reply.splitlines()):
        if line.strip():
            return line.strip()
    return ""


class ReasoningGymTask(Task):
    """One reasoning-gym dataset as a :class:`~populora.tasks.Task` (family ``reasoning_gym/<name>``)."""

    max_difficulty = 1
    instruction = "Give only the final answer on the last line."

    def __init__(self, name: str, *, size: int = 500, seed: int = 0, threshold: float = 1.0, **config: Any) -> None:
        if not isinstance(name, str):
            raise InvalidTypeError(f"`name` must be a str, got {type(name).__name__}")
        size = check_int("size", size, low=1)
        seed = check_seed("seed", seed)
        self.threshold = check_float("threshold", threshold, low=0.0, high=1.0, low_open=True)
        rg = _import_reasoning_gym()
        from reasoning_gym.factory import DATASETS

        if name not in DATASETS:
            raise InvalidValueError(f"reasoning-gym has no dataset {name!r}; it has {sorted(DATASETS)}")
        try:
            self.dataset = rg.create_dataset(name, size=size, seed=seed, **config)
        except TypeError as err:  # an unknown config field
            raise InvalidValueError(f"reasoning-gym dataset {name!r} rejects the config {config}: {err}") from None
        super().__init__(1)
        self.dataset_name = name
        self.size = size
        self.seed = seed
        self.name = f"reasoning_gym/{name}"  # type: ignore[misc]  # a per-instance family
        register_checker(self.name, self._score)

    def __repr__(self) -> str:
        return f"ReasoningGymTask({self.dataset_name!r}, size={self.size}, seed={self.seed})"

    def _score(self, problem: Problem, reply: str) -> bool:
        try:
            score = self.dataset.score_answer(answer=extract_reply_answer(reply), entry=problem.data["entry"])
        except Exception:  # a third-party scorer choking on a malformed reply: the reply is wrong
            return False
        return score is not None and float(score) >= self.threshold

    def sample(self, n: int, generator: torch.Generator) -> list[Problem]:
        n = check_int("n", n, low=0)
        if not isinstance(generator, torch.Generator):
            raise InvalidTypeError(f"`generator` must be a torch.Generator, got {type(generator).__name__}")
        ids = torch.randint(0, self.size, (n,), generator=generator).tolist()
        out = []
        for i in ids:
            entry = self.dataset[i]
            out.append(
                Problem(
                    self.name,
                    str(entry["question"]),
                    entry["answer"],
                    {"entry": entry, "index": i, "dataset": self.dataset_name},
                )
            )
        return out

    def proposal_prompt(self, examples: Sequence[Problem] = ()) -> str:  # no proposal_line: examples unused
        raise InvalidValueError(f"{self!r} takes no teacher proposals (reasoning-gym problems need their generator)")

    def parse_proposal(self, text: str) -> Problem | None:
        raise InvalidValueError(f"{self!r} takes no teacher proposals (reasoning-gym problems need their generator)")
