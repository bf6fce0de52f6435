"""Well-formedness is the task's knowledge: each family's rule, a user task's default, no family in the reward table."""

from pathlib import Path

import pytest
import torch

import populora.loops.selfplay.rewards as rewards
from populora.errors import InvalidTypeError
from populora.tasks import Arithmetic, Countdown, LinearEquation, Mixture, Problem, Sorting, Task
from populora.tasks.simple import Comparison, Successor


class Echo(Task):
    name = "echo_wf"

    def _sample_one(self, generator):
        return Problem(self.name, "say hi", "hi")

    @staticmethod
    def check_reply(problem, reply):
        return reply.strip() == "hi"


class Strict(Echo):
    name = "strict_wf"

    @staticmethod
    def well_formed_reply(problem, reply):
        return reply.startswith("A:")


@pytest.mark.parametrize(
    "task, good, bad",
    [
        (Arithmetic(), "The answer is 12", "twelve"),
        (LinearEquation(), "x = -3", "no idea"),
        (Successor(), "8", "eight"),
        (Comparison(), "42", "the first"),
        (Sorting(), "[1, 2, 3]", "sorted!"),
        (Countdown(), "3 + 4 * 2", "cannot"),
    ],
)
def test_each_family_reads_its_own_form(task, good, bad):
    problem = task.sample(1, torch.Generator().manual_seed(0))[0]
    assert task.well_formed(problem, good) and not task.well_formed(problem, bad)
    assert rewards.well_formed(problem, good) and not rewards.well_formed(problem, bad)


def test_user_task_default_and_override_and_mixture():
    p, q = Echo().sample(1, torch.Generator())[0], Problem("strict_wf", "say hi", "hi")
    assert Echo().well_formed(p, "anything") and not Echo().well_formed(p, "  \n")
    assert Strict().well_formed(q, "A: hi") and not Strict().well_formed(q, "hi")
    mix = Mixture([Echo(), Strict()])
    assert mix.well_formed(q, "A: x") and not mix.well_formed(q, "x") and mix.well_formed(p, "x")
    with pytest.raises(InvalidTypeError, match="reply"):
        Echo().well_formed(p, 3)
    echo = Echo()
    assert echo.phrasings() == (echo.prompt,)  # the template alone, by default


def test_the_reward_table_names_no_family():
    source = Path(rewards.__file__).read_text()
    for family in ("arithmetic", "linear", "successor", "comparison", "sorting", "countdown", "code_o", "code_f"):
        assert f'"{family}"' not in source
