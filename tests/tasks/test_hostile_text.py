"""Model text is read in linear time and never raises: every parser and verifier of populora.tasks, given any
reply (a megabyte of text, a megabyte of brackets after an expression, 5,000-digit numbers, NUL bytes, other
scripts' digits), returns a bool / an answer / None.

The inputs are sized so that quadratic work on them would take from many minutes to hours (a 1 MB run of
brackets: ~10^12 character steps); linear work takes milliseconds. Each call runs under a generous alarm
(`_linear`) so that a regression fails instead of hanging; no elapsed time is compared with anything else.

Also here: the reading rules these inputs pin down (numbers longer than MAX_DIGITS digits are no answer,
only ASCII digits are digits), Mixture weights (0-d tensors, a float64 sum that overflows), and verifier
rewards that are not numbers.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from fractions import Fraction

import pytest
import torch

from populora.errors import FitnessError, InvalidValueError
from populora.tasks import (
    Arithmetic,
    Comparison,
    Countdown,
    LinearEquation,
    Mixture,
    Problem,
    Sorting,
    Successor,
    find_ints,
    last_expression,
    parse_expression,
    parse_int,
    parse_int_list,
    proposal_segments,
    safe_eval,
)
from populora.tasks.parsing import MAX_DIGITS, MAX_PROPOSAL_CHARS
from populora.tasks.reasoning_gym import extract_reply_answer

BOUND_S = 120  # linear work here takes milliseconds; the quadratic work these inputs provoke takes far longer
MB = 1_000_000


@contextlib.contextmanager
def _linear():
    """Fail (instead of hanging) if the block runs past BOUND_S: the bound of work that should be linear."""
    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise TimeoutError(f"still running after {BOUND_S} s: super-linear work on hostile text")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, BOUND_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


HOSTILE = {
    "1mb_prose": ("The answer is 42, so 3 + 4 = 7 and [1, 2, 3] holds 1, 2 and 3. " * 20_000)[:MB],
    "1mb_one_line_of_digits": "7" * MB,
    "1mb_of_closing_brackets": "(1 + 2) * 3" + ")" * MB,
    "1mb_of_opening_brackets": "(" * MB + "1 + 2",
    "60k_closing_brackets": "So (7 - 2) * 3 + 8" + ")" * 60_000,
    "60k_opening_brackets": "(" * 60_000 + "7 - 2",
    "1mb_of_sums": "1 + " * (MB // 4) + "1",
    "1mb_of_minus_signs": "-" * MB + "7",
    "1mb_of_spaces_in_a_list": "[1," + " " * MB + "2",
    "1mb_of_commas": "1," * (MB // 2),
    "1mb_of_answer_tags": "<answer>" * (MB // 8),
    "1mb_of_markers": "Problem 1:" * (MB // 10),
    "1mb_of_newlines": "\n" * MB + "7",
    "5000_digits": "The answer is " + "7" * 5_000,
    "5000_digits_negative": "x = -" + "7" * 5_000,
    "5000_digits_grouped": "1" + ",000" * 1_700,
    "5000_digits_in_a_list": "[1, 2, " + "7" * 5_000 + "]",
    "5000_digits_in_a_comma_list": "1, 2, " + "7" * 5_000,
    "5000_digit_fraction": "3." + "0" * 5_000 + "1",
    "5000_digit_expression": "7" * 5_000 + " + 1",
    "nul_bytes": "\x00" * 1_000 + "7\x00 + 1\x00 = 8\x00[1,\x002]",
    "unicode_digits": "\u0663 + \u0664 = \u0667, [\u0661, \u0662], \uff17, \u0969",
    "lone_surrogates": "7 + \ud800 = \udfff 8",
}
SAMPLES = {
    cls.name: cls(1).sample(1, torch.Generator().manual_seed(0))[0]
    for cls in (Arithmetic, LinearEquation, Sorting, Successor, Comparison, Countdown)
}
FAMILIES = {
    "arithmetic": Arithmetic(3),
    "linear": LinearEquation(2),
    "sorting": Sorting(2),
    "successor": Successor(4),
    "comparison": Comparison(4),
    "countdown": Countdown(2),
}


@pytest.mark.parametrize("text", list(HOSTILE))
@pytest.mark.parametrize("family", list(SAMPLES))
def test_every_checker_returns_a_bool_in_linear_time(family, text):
    with _linear():
        assert SAMPLES[family].check(HOSTILE[text]) in (True, False)


PARSERS = {
    "parse_int": (parse_int, lambda v: v is None or type(v) is int),
    "find_ints": (find_ints, lambda v: isinstance(v, list) and all(type(x) is int for x in v)),
    "parse_int_list": (parse_int_list, lambda v: v is None or all(type(x) is int for x in v)),
    "last_expression": (last_expression, lambda v: v is None or isinstance(v, str)),
    "extract_reply_answer": (extract_reply_answer, lambda v: isinstance(v, str)),
    "proposal_segments": (proposal_segments, lambda v: isinstance(v, list) and len(v) <= 64),
}


@pytest.mark.parametrize("text", list(HOSTILE))
@pytest.mark.parametrize("parser", list(PARSERS))
def test_every_parser_returns_an_answer_or_none_in_linear_time(parser, text):
    parse, valid = PARSERS[parser]
    with _linear():
        assert valid(parse(HOSTILE[text]))


@pytest.mark.parametrize("text", list(HOSTILE))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_proposal_parser_returns_a_problem_or_none_in_linear_time(family, text):
    with _linear():
        problem = FAMILIES[family].parse_proposal(HOSTILE[text])
    assert problem is None or isinstance(problem, Problem)


@pytest.mark.parametrize("text", list(HOSTILE))
@pytest.mark.parametrize("max_length", [200, 100_000])
def test_safe_eval_refuses_hostile_text_with_its_own_error_in_linear_time(text, max_length):
    with _linear():
        try:
            value = safe_eval(HOSTILE[text], max_length=max_length, max_nodes=100_000)
        except InvalidValueError:
            return
    assert isinstance(value, Fraction)


def _balanced(depth: int) -> str:
    text = "1"
    for _ in range(depth):
        text = f"({text}+{text})"
    return text


def test_safe_eval_reads_the_spelling_of_many_constants_in_linear_time():
    """2^14 constants in 65k characters: reading each constant's spelling by re-splitting the whole text
    (ast.get_source_segment, a Python loop per character) is ~10^9 steps."""
    text = _balanced(14)
    with _linear():
        parsed = parse_expression(text, max_length=100_000, max_depth=20, max_nodes=100_000)
    assert parsed.value == 2**14 and len(parsed.constants) == 2**14


def test_teacher_text_at_the_length_cap_is_read_in_linear_time():
    """A marker followed by spaces, at MAX_PROPOSAL_CHARS: an ambiguous `[ \\t]*[0-9]*[ \\t]*` backtracks
    quadratically (about a second per text); 500 teacher replies must still be read at once."""
    text = "Problem" + " " * (MAX_PROPOSAL_CHARS - 10)
    with _linear():
        results = [task.parse_proposal(text) for task in FAMILIES.values() for _ in range(100)]
    assert results == [None] * len(results)
    with _linear():
        spaced = [proposal_segments(f"Problem 1 {' ' * (MAX_PROPOSAL_CHARS - 30)}: 3 + 4") for _ in range(100)]
    assert spaced[0][0] == "3 + 4"


# ----------------------------------------------------------------------------------------- the reading rules


def test_a_number_longer_than_max_digits_is_no_answer():
    big = "7" * (MAX_DIGITS + 1)
    assert parse_int(big) is None and parse_int(f"x = -{big}") is None
    assert parse_int("7" * MAX_DIGITS) == int("7" * MAX_DIGITS)  # the bound itself is read
    assert parse_int("0" * 5_000 + "7") == 7  # leading zeros are not digits of the value
    assert find_ints(f"1 and {big} and 2") == [1, 2]
    assert parse_int("1" + ",000" * 1_700) is None  # grouped: 5,101 digits
    assert parse_int_list(f"[1, 2] then [3, {big}]") == [1, 2]  # a list holding one is not a list
    assert parse_int_list(f"[4, 5] then 1, {big}") == [4, 5]
    assert parse_int(f"{big} then 7") == 7 and parse_int(f"3.{'0' * 5_000}") == 3
    assert SAMPLES["successor"].check(big) is False


def test_only_ascii_digits_are_digits():
    for text in ("\u0667", "\uff17", "\u0969", "x = \u0663"):
        assert parse_int(text) is None and find_ints(text) == []
    assert parse_int_list("[\u0661, \u0662]") is None
    assert last_expression("\u0663 + \u0664") is None
    problem = Arithmetic(1).parse_proposal("Problem: 3 + 4")
    assert problem.check("\u0667") is False and problem.check("7") is True


def test_nul_bytes_are_ordinary_characters():
    assert parse_int("7\x00") == 7 and find_ints("1\x002") == [1, 2] and parse_int_list("[1,\x002]") is None
    assert last_expression("3 * 7\x00") == "3 * 7"
    with pytest.raises(InvalidValueError):
        safe_eval("1 +\x00 2")


def test_hostile_replies_still_read_their_answer():
    countdown = Countdown(1).parse_proposal("Problem: 3 * 7")
    assert countdown.check("3 * 7" + ")" * 60_000) and countdown.check("(" * 60_000 + "3 * 7")
    assert last_expression("So (7 - 2) * 3 + 8" + ")" * 60_000) == "(7 - 2) * 3 + 8"
    assert extract_reply_answer("<answer>" * 1_000 + "42</answer>") == "<answer>" * 999 + "42"
    assert extract_reply_answer("<answer>1</answer>" + "<answer>" * 1_000) == "1"
    assert proposal_segments("Problem 1 " + " " * 5_000 + ": 3 + 4") == ["3 + 4", "Problem 1" + " " * 5_001 + ": 3 + 4"]


# ------------------------------------------------------------------------------------------- Mixture weights


def test_mixture_weights_accept_zero_d_tensors_like_numpy_scalars():
    np = pytest.importorskip("numpy")
    tasks = [Arithmetic(1), Successor(1)]
    for weights in ([torch.tensor(3.0), torch.tensor(1)], torch.tensor([3.0, 1.0]), [np.float32(3.0), np.int64(1)]):
        mixture = Mixture(tasks, weights=weights)
        assert mixture.weights.tolist() == [3.0, 1.0]
    for bad in (
        [torch.tensor(True), 1.0],
        [torch.tensor([1.0, 2.0]), 1.0],
        [torch.tensor(-1.0), 1.0],
        [torch.tensor(float("nan")), 1.0],
        ["0.5", 1.0],
        [10**400, 1.0],
    ):
        with pytest.raises(InvalidValueError, match=r"`weights\[0\]` must be a finite number >= 0"):
            Mixture(tasks, weights=bad)


def test_mixture_weights_whose_sum_overflows_are_refused():
    with pytest.raises(InvalidValueError, match=r"`weights` sum to inf"):
        Mixture([Arithmetic(1), Successor(1)], weights=[1e308, 1e308])
    big = Mixture([Arithmetic(1), Successor(1)], weights=[8e307, 8e307])  # a finite sum: both tasks drawn
    assert {p.task for p in big.sample(40, torch.Generator().manual_seed(0))} == {"arithmetic", "successor"}


# ----------------------------------------------------------------------------------------- verifier rewards


class _Tokenizer:
    """Just enough of a tokenizer for generate_replies: one token per prompt, replies looked up by id."""

    pad_token_id, eos_token_id, chat_template = 0, 0, None

    def __call__(self, texts, **kwargs):
        ids = torch.arange(1, len(texts) + 1).view(-1, 1)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    def batch_decode(self, rows, skip_special_tokens=True):
        return [f"reply {int(row[0])}" for row in rows]


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def generate(self, input_ids, attention_mask, **kwargs):
        return torch.cat([input_ids, input_ids], dim=1)


@pytest.mark.parametrize(
    "value", ["0.5", "inf", b"1", 1e300, float("inf"), -float("inf"), 10**400, torch.tensor([0.5, 0.5]), None]
)
def test_a_verifier_reward_that_is_not_a_finite_number_is_refused(value):
    from populora.llm.reasoning import verifier_accuracy

    problems = [Arithmetic(1).parse_proposal("Problem: 3 + 4")]
    with pytest.raises(FitnessError, match=r"must return a bool or a number|beyond float32"):
        verifier_accuracy(_Model(), _Tokenizer(), problems, max_new_tokens=1, reward_fn=lambda p, r: value)


@pytest.mark.parametrize("value, expected", [(True, 1.0), (0.25, 0.25), (torch.tensor(0.5), 0.5), (3, 3.0)])
def test_a_verifier_reward_that_is_a_number_is_read(value, expected):
    from populora.llm.reasoning import verifier_accuracy

    problems = [Arithmetic(1).parse_proposal("Problem: 3 + 4")]
    assert (
        verifier_accuracy(_Model(), _Tokenizer(), problems, max_new_tokens=1, reward_fn=lambda p, r: value) == expected
    )
