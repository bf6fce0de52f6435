"""Task.proposal_prompt(examples=): past problems replace the fixed example; each family writes its problems as
proposal lines its verifier reads back; a user's task without the keyword keeps its prompt."""

import pytest
import torch

from populora.tasks import Arithmetic, Countdown, LinearEquation, Mixture, Problem, Sorting, Task
from populora.tasks.base import proposal_prompt
from populora.tasks.simple import Comparison, Successor


@pytest.mark.parametrize(
    "task", [Arithmetic(2), Countdown(), LinearEquation(), Sorting(), Successor(3), Comparison(2)], ids=repr
)
def test_each_family_shows_past_problems_its_verifier_reads_back(task):
    problems = task.sample(3, torch.Generator().manual_seed(1))
    for p in problems:
        back = task.parse_proposal(f"Problem: {task.proposal_line(p)}")
        assert back is not None and back.question == p.question and back.answer == p.answer
    plain, shown = task.proposal_prompt(), task.proposal_prompt(problems)
    assert plain.startswith(shown.split(" Problems asked before:")[0])
    assert all(f"Problem: {task.proposal_line(p)}" in shown for p in problems) and "different from these" in shown
    assert "Problems asked before" not in plain and task.proposal_prompt(()) == plain


def test_a_mixture_gives_each_member_its_own_examples_and_old_tasks_keep_their_prompt():
    a, s = Arithmetic(1), Successor(3)
    past = a.sample(1, torch.Generator().manual_seed(0))
    text = Mixture([a, s]).proposal_prompt(past)
    first, second = text.split("\n- ")[1:]
    assert "Problems asked before" in first and "Problems asked before" not in second

    class Old(Task):
        name = "old_prompt"

        def proposal_prompt(self) -> str:
            return "propose"

    assert proposal_prompt(Old(), [Problem("old_prompt", "q", 1)]) == "propose"
