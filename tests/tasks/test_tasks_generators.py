"""populora.tasks: generators, checkers, teacher proposals, Mixture, the reasoning-gym adapter."""

import random
import sys
import zlib
from collections import Counter
from dataclasses import asdict

import pytest
import torch

from populora.errors import InvalidTypeError, InvalidValueError
from populora.tasks import (
    Arithmetic,
    Comparison,
    Countdown,
    LinearEquation,
    Mixture,
    Problem,
    ReasoningGymTask,
    Sorting,
    Successor,
    Task,
    check_replies,
    parse_expression,
)
from populora.tasks.parsing import MAX_PROPOSAL_CHARS

ALL_LEVELS = (
    [Arithmetic(d) for d in range(1, 9)]
    + [LinearEquation(d) for d in range(1, 7)]
    + [Sorting(d) for d in (1, 2, 8)]
    + [Successor(d) for d in (1, 3, 12)]
    + [Comparison(d) for d in (1, 3, 12)]
    + [Countdown(d) for d in range(1, 6)]
)
IDS = [repr(t) for t in ALL_LEVELS]


def gen(seed):
    return torch.Generator().manual_seed(seed)


def right_reply(problem):
    if problem.task == "countdown":
        return f"Let me think.\n{problem.data['expression']} = {problem.answer}"
    if problem.task == "sorting":
        return f"The sorted list is {list(problem.answer)}."
    return f"The answer is {problem.answer}."


def wrong_replies(problem):
    if problem.task == "countdown":
        return [f"{problem.data['expression']} + 1", "no idea", f"{problem.answer}"]
    if problem.task == "sorting":
        values = list(problem.answer)
        out = ["no idea", str(values[:-1])]
        if values != sorted(values, reverse=True):
            out.append(str(sorted(values, reverse=True)))
        return out
    return [f"The answer is {problem.answer + 1}.", "no idea", f"{problem.answer}.5"]


@pytest.mark.parametrize("task", ALL_LEVELS, ids=IDS)
def test_generated_answers_check_and_wrong_ones_do_not(task):
    problems = task.sample(60, gen(1))
    assert len(problems) == 60
    for problem in problems:
        assert problem.task == task.name
        assert problem.check(right_reply(problem)), problem
        assert task.check(problem, right_reply(problem))
        for reply in wrong_replies(problem):
            assert not problem.check(reply), (problem, reply)
        assert problem.question in task.prompt(problem) and task.instruction in task.prompt(problem)


@pytest.mark.parametrize("task", ALL_LEVELS, ids=IDS)
def test_generation_is_reproducible_and_differs_across_seeds(task):
    first = task.sample(20, gen(7))
    assert first == task.sample(20, gen(7))
    assert first != task.sample(20, gen(8))
    # the draw continues the generator: two draws of 10 are the first 20
    g = gen(7)
    assert task.sample(10, g) + task.sample(10, g) == first
    assert task.sample(0, gen(7)) == []


@pytest.mark.parametrize("task", ALL_LEVELS, ids=IDS)
def test_parse_proposal_round_trips_generated_questions(task):
    for problem in task.sample(30, gen(3)):
        text = problem.data.get("expression") or problem.question
        proposed = task.parse_proposal(f"Here is one.\nProblem: {text}")
        assert proposed is not None, text
        assert proposed.answer == problem.answer and proposed.question == problem.question
        assert proposed.check(right_reply(problem))


def test_arithmetic_levels_follow_the_documented_table():
    for difficulty, (operands, digits, ops, parens) in {
        1: (2, 1, "+", False),
        3: (3, 2, "+-*", False),
        4: (3, 2, "+-*", True),
        8: (6, 3, "+-*", True),
    }.items():
        seen_ops, seen_parens = set(), False
        for problem in Arithmetic(difficulty).sample(100, gen(difficulty)):
            parsed = parse_expression(problem.data["expression"])
            assert len(parsed.constants) == operands and max(parsed.constants) < 10**digits
            assert parsed.operators <= set(ops) and not parsed.unary
            assert parsed.value == problem.answer
            seen_ops |= parsed.operators
            seen_parens |= "(" in problem.data["expression"]
        assert seen_ops == set(ops) and seen_parens == parens
    assert Arithmetic(1).sample(1, gen(0))[0].question.startswith("What is ")


def test_other_levels_follow_their_documentation():
    for problem in LinearEquation(1).sample(100, gen(0)):
        a, b, c = problem.data["a"], problem.data["b"], problem.data["c"]
        assert 2 <= a <= 9 and 0 <= b <= 9 and 0 <= problem.answer <= 9 and a * problem.answer + b == c
    assert any(p.answer < 0 for p in LinearEquation(2).sample(50, gen(0)))
    assert [len(p.answer) for p in Sorting(1).sample(5, gen(0))] == [3] * 5
    assert [len(p.answer) for p in Sorting(4).sample(5, gen(0))] == [6] * 5
    assert all(100 <= p.data["number"] <= 999 for p in Successor(3).sample(100, gen(0)))
    assert all(0 <= p.data["number"] <= 9 for p in Successor(1).sample(100, gen(0)))
    for problem in Comparison(2).sample(100, gen(0)):
        a, b = problem.data["numbers"]
        assert a != b and 10 <= min(a, b) and max(a, b) <= 99 and problem.answer == max(a, b)
    for difficulty in range(1, 6):
        for problem in Countdown(difficulty).sample(50, gen(difficulty)):
            numbers = problem.data["numbers"]
            assert len(numbers) == difficulty + 1 and all(1 <= v <= 9 * difficulty for v in numbers)
            assert list(numbers) == sorted(numbers) and 1 <= problem.answer <= 999
            witness = parse_expression(problem.data["expression"])
            assert witness.value == problem.answer and sorted(witness.constants) == list(numbers)


def test_difficulty_is_checked():
    with pytest.raises(InvalidValueError, match=r"`difficulty` must be an int in \[1, 8\], got 9"):
        Arithmetic(9)
    with pytest.raises(InvalidValueError, match=r"`difficulty` must be an int in \[1, 5\], got 0"):
        Countdown(0)
    with pytest.raises(InvalidTypeError, match="`difficulty` must be an int, got float"):
        Sorting(1.5)
    with pytest.raises(InvalidTypeError, match="`generator` must be a torch.Generator, got int"):
        Arithmetic().sample(3, 0)
    with pytest.raises(InvalidValueError, match="`n` must be an int >= 0, got -1"):
        Arithmetic().sample(-1, gen(0))


def test_countdown_checker_rules():
    problem = Countdown(2).parse_proposal("Problem: 2 * 3 + 7")
    assert problem.data["numbers"] == (2, 3, 7) and problem.answer == 13
    assert problem.check("2 * 3 + 7")
    assert problem.check("I computed (7 + 3 * 2) = 13.")  # parentheses, any order
    assert problem.check("7 + 2 * 3\n")
    assert problem.check("**7 + 2 \u00d7 3** = 13")
    assert not problem.check("7 + 3 + 3")  # 3 used twice
    assert not problem.check("7 + 6")  # 6 is not given
    assert not problem.check("-2 * -3 + 7")  # unary minus
    assert not problem.check("7 + 2 * 3 + 1")
    assert not problem.check("2 ** 3 + 5")
    assert not problem.check("7 + 2 * 3\nthen 13 - 7 = 6")  # the last expression counts
    assert not problem.check("13")
    assert not problem.check("__import__('os')")
    # a subset of the numbers is enough; division is exact
    subset = Problem("countdown", "q", 6, {"numbers": (2, 3, 7, 8), "target": 6})
    assert subset.check("2 * 3") and subset.check("(7 + 8 - 3) / 2") and not subset.check("7 / 2 + 3")
    half = Problem("countdown", "q", 5, {"numbers": (2, 3, 7), "target": 5})
    assert half.check("(7 + 3) / 2") and not half.check("7 / 0 + 2")


def test_a_problem_rebuilt_from_its_fields_still_checks():
    for task in (Arithmetic(3), Sorting(2), Countdown(3), LinearEquation(2), Comparison(2), Successor(2)):
        problem = task.sample(1, gen(5))[0]
        rebuilt = Problem(**asdict(problem))
        assert rebuilt == problem and rebuilt.check(right_reply(problem))
    assert len({problem, Problem(**asdict(problem))}) == 1  # hashable although data is a dict
    with pytest.raises(InvalidTypeError, match="`question` must be a str, got int"):
        Problem("arithmetic", 3, 1)
    with pytest.raises(InvalidValueError, match="no checker for the task family 'nope'"):
        Problem("nope", "q", 1).check("1")
    with pytest.raises(InvalidTypeError, match="`reply` must be a str, got int"):
        Arithmetic().sample(1, gen(0))[0].check(3)
    with pytest.raises(InvalidValueError, match="checks 'sorting' problems, got a 'arithmetic' problem"):
        Sorting().check(Arithmetic().sample(1, gen(0))[0], "1")


def test_check_replies():
    problems = Successor(3).sample(3, gen(0))
    replies = [str(problems[0].answer), "no", f"it is {problems[2].answer}"]
    assert torch.equal(check_replies(problems, replies), torch.tensor([True, False, True]))
    with pytest.raises(InvalidValueError, match="got 3 problems but 2 replies"):
        check_replies(problems, replies[:2])


# --- teacher proposals -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "task, text, answer",
    [
        (Arithmetic(1), "Problem: 3 + 4", 7),
        (Arithmetic(1), "**Problem:** `3+4`", 7),
        (Arithmetic(1), "Problem: What is 3 + 4?", 7),
        (Arithmetic(1), "Problem: 3 + 4 = 8", 7),  # the teacher's answer is ignored, ours computed
        (Arithmetic(1), "Here is a new problem:\n\n5 + 9\n\nGood luck!", 14),
        (Arithmetic(4), "Problem: (12 - 4) * 3", 24),
        (Arithmetic(2), "Problem: 12 \u2212 40", -28),
        (LinearEquation(1), "Problem: 2*x + 3 = 11", 4),
        (LinearEquation(1), "Problem: 3x = 12", 4),
        (LinearEquation(2), "Problem: Solve for x: 5*x - 7 = -22.", -3),
        (Sorting(1), "Problem: [5, 2, 8]", (2, 5, 8)),
        (Sorting(1), "Problem: sort 9, 3", (3, 9)),
        (Successor(3), "Problem: 457", 458),
        (Successor(3), "Problem: What number comes after 99?", 100),
        (Comparison(3), "Problem: 457 or 812", 812),
        (Countdown(2), "Problem: 3 * 7 + 2", 23),
        (Countdown(1), "Problem: 8 / 2", 4),
    ],
)
def test_parse_proposal_accepts(task, text, answer):
    problem = task.parse_proposal(text)
    assert problem is not None and problem.task == task.name and problem.answer == answer


@pytest.mark.parametrize(
    "task, text",
    [
        (Arithmetic(1), "Problem: 12 + 3"),  # two digits at level 1
        (Arithmetic(1), "Problem: 3 * 4"),  # * not at level 1
        (Arithmetic(1), "Problem: (3 + 4)"),  # no parentheses at level 1
        (Arithmetic(1), "Problem: 7"),  # one operand
        (Arithmetic(1), "Problem: -3 + 4"),  # unary minus
        (Arithmetic(3), "Problem: 1 + 2 + 3 + 4"),  # too many operands
        (Arithmetic(3), "Problem: 8 / 2"),  # division is not an arithmetic operator here
        (Arithmetic(8), "Problem: 2 ** 10"),
        (Arithmetic(8), "Problem: __import__('os').system('ls')"),
        (LinearEquation(1), "Problem: 2*x + 1 = 4"),  # no integer solution
        (LinearEquation(1), "Problem: 2*x + 3 = 41"),  # x = 19 beyond level 1
        (LinearEquation(1), "Problem: x + 3 = 5"),  # a = 1 below the range
        (LinearEquation(1), "Problem: 2*x - 3 = 1"),  # negative b at level 1
        (LinearEquation(1), "Problem: 2*y + 3 = 11"),
        (LinearEquation(1), "Problem: 2*x + 3"),
        (Sorting(1), "Problem: [5, 2, 8, 1]"),  # too long
        (Sorting(1), "Problem: [5, 200]"),  # out of range
        (Sorting(1), "Problem: [5]"),
        (Sorting(1), "Problem: [-5, 2]"),
        (Successor(3), "Problem: 1000"),  # 4 digits at level 3
        (Successor(3), "Problem: 4 and 5"),
        (Successor(3), "Problem: -4"),
        (Comparison(3), "Problem: 457 or 457"),
        (Comparison(3), "Problem: 457"),
        (Comparison(3), "Problem: 4570 or 12"),
        (Countdown(2), "Problem: 7 / 2"),  # not an integer
        (Countdown(2), "Problem: 1 + 2 + 3 + 4"),  # 4 numbers at level 2
        (Countdown(2), "Problem: 30 + 2"),  # 30 > 18
        (Countdown(2), "Problem: 0 + 5"),  # 0 is not allowed
        (Countdown(2), "Problem: 3 - 7"),  # target below 1
        (Countdown(5), "Problem: 45 * 45 * 44"),  # target above 999
        (Countdown(2), "Problem: -3 + 7"),
    ],
)
def test_parse_proposal_rejects_out_of_bounds_and_unsolvable(task, text):
    assert task.parse_proposal(text) is None


GARBAGE = [
    "",
    "   ",
    "\n\n",
    "hello",
    "Problem:",
    "Problem: ???",
    "Problem: [",
    "Problem: ((((",
    "1" * 5000,
    "Problem: " + "(" * 5000 + "1" + ")" * 5000,
    "Problem: 9**9**9",
    "Problem: ().__class__",
    "\x00\x01\x02",
    "Problem: lambda: 0",
    "x" * (MAX_PROPOSAL_CHARS + 1),
    "Problem: 1/0",
    "Problem: [1, 2]" * 3000,
]


def fuzz(seed, count=150):
    rng = random.Random(seed)
    alphabet = "0123456789+-*/()[]=x ,.:?\nProblem:ab\\'\"_"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))) for _ in range(count)]


@pytest.mark.parametrize(
    "task", ALL_LEVELS[::3] + [Mixture([Arithmetic(2), Sorting(1), Countdown(2)])], ids=lambda t: repr(t)[:40]
)
def test_parse_proposal_never_raises_on_garbage(task):
    for text in GARBAGE + fuzz(zlib.crc32(repr(task).encode())):
        problem = task.parse_proposal(text)
        if problem is not None:  # whatever got through is a verified instance of the task
            assert problem.check(right_reply(problem))
    for text in GARBAGE[:13]:
        assert task.parse_proposal(text) is None, text
    with pytest.raises(InvalidTypeError, match="`text` must be a str, got NoneType"):
        task.parse_proposal(None)


def test_proposal_prompts_name_the_format_and_their_example_parses():
    for task in ALL_LEVELS:
        prompt = task.proposal_prompt()
        assert "Problem: " in prompt
        example = prompt.split("format: ", 1)[1]
        assert task.parse_proposal(example) is not None, (task, example)


# --- Mixture -----------------------------------------------------------------------------------


def test_mixture_samples_by_weight_and_delegates():
    mixture = Mixture([Arithmetic(1), Successor(3), Sorting(1)], weights=[2.0, 1.0, 1.0])
    problems = mixture.sample(400, gen(0))
    counts = Counter(p.task for p in problems)
    assert set(counts) == {"arithmetic", "successor", "sorting"}
    assert 150 < counts["arithmetic"] < 250 and 60 < counts["successor"] < 140
    assert problems == mixture.sample(400, gen(0)) and problems != mixture.sample(400, gen(1))
    for problem in problems[:50]:
        assert mixture.check(problem, right_reply(problem))
        assert not mixture.check(problem, "no idea")
        assert mixture.prompt(problem) == mixture.task(problem.task).prompt(problem)
    only_first = Mixture([Arithmetic(1), Successor(3)], weights=[1, 0]).sample(30, gen(0))
    assert {p.task for p in only_first} == {"arithmetic"}
    assert mixture.difficulty is None and mixture.sample(0, gen(0)) == []


def test_mixture_proposals_go_to_the_first_member_that_accepts():
    mixture = Mixture([Sorting(1), Successor(3), Countdown(2)])
    assert mixture.parse_proposal("Problem: [3, 1, 2]").task == "sorting"
    assert mixture.parse_proposal("Problem: 457").task == "successor"
    assert mixture.parse_proposal("Problem: 3 * 7 + 2").task == "countdown"
    assert mixture.parse_proposal("Problem: hello") is None
    prompt = mixture.proposal_prompt()
    for task in mixture.tasks:
        assert task.proposal_prompt() in prompt


def test_mixture_arguments_are_checked():
    with pytest.raises(InvalidValueError, match="distinct names, got \\['arithmetic', 'arithmetic'\\]"):
        Mixture([Arithmetic(1), Arithmetic(2)])
    with pytest.raises(InvalidValueError, match="at least one Task"):
        Mixture([])
    with pytest.raises(InvalidTypeError, match=r"`tasks\[1\]` must be a Task \(not a Mixture\), got str"):
        Mixture([Arithmetic(1), "successor"])
    with pytest.raises(InvalidValueError, match="`weights` must have 2 entries"):
        Mixture([Arithmetic(1), Successor(1)], weights=[1.0])
    with pytest.raises(InvalidValueError, match=r"`weights\[1\]` must be a finite number >= 0, got -1"):
        Mixture([Arithmetic(1), Successor(1)], weights=[1.0, -1])
    with pytest.raises(InvalidValueError, match="must not all be zero"):
        Mixture([Arithmetic(1), Successor(1)], weights=[0, 0])
    with pytest.raises(InvalidValueError, match="has no task 'countdown'"):
        Mixture([Arithmetic(1)]).check(Countdown(1).sample(1, gen(0))[0], "1")


def test_task_base_is_abstract():
    class Half(Task):
        name = "half"

    with pytest.raises(NotImplementedError, match="Half must implement _sample_one"):
        Half().sample(1, gen(0))
    with pytest.raises(NotImplementedError, match="Half must implement proposal_prompt"):
        Half().proposal_prompt()


# --- reasoning-gym adapter ------------------------------------------------------------------------


def test_reasoning_gym_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # makes `import reasoning_gym` fail
    with pytest.raises(ImportError, match="pip install reasoning-gym"):
        ReasoningGymTask("basic_arithmetic")


@pytest.fixture(scope="module")
def rg_task():
    pytest.importorskip("reasoning_gym")
    return ReasoningGymTask("basic_arithmetic", size=50, seed=3)


def test_reasoning_gym_adapter(rg_task):
    problems = rg_task.sample(10, gen(0))
    assert problems == rg_task.sample(10, gen(0)) and problems != rg_task.sample(10, gen(1))
    for problem in problems:
        assert problem.task == "reasoning_gym/basic_arithmetic"
        assert problem.check(f"Let me see...\n<answer>{problem.answer}</answer>")
        assert problem.check(f"Working it out.\n{problem.answer}")
        assert rg_task.check(problem, str(problem.answer))
        assert not problem.check("<answer>banana</answer>")
        assert not problem.check("")
        assert problem.question in rg_task.prompt(problem)
    with pytest.raises(InvalidValueError, match="takes no teacher proposals"):
        rg_task.proposal_prompt()
    with pytest.raises(InvalidValueError, match="takes no teacher proposals"):
        rg_task.parse_proposal("Problem: 3 + 4")


def test_reasoning_gym_arguments_are_checked(rg_task):
    with pytest.raises(InvalidValueError, match="reasoning-gym has no dataset 'nope'"):
        ReasoningGymTask("nope")
    with pytest.raises(InvalidValueError, match="rejects the config"):
        ReasoningGymTask("basic_arithmetic", size=5, bogus=1)
    with pytest.raises(InvalidValueError, match="`size` must be an int >= 1, got 0"):
        ReasoningGymTask("basic_arithmetic", size=0)
