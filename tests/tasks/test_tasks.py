"""populora.tasks: the safe evaluator and the lenient answer parsers."""

import ast
import builtins
import contextlib
import re
from fractions import Fraction

import pytest

from populora.errors import InvalidTypeError, InvalidValueError, PopuloraError
from populora.tasks import (
    find_ints,
    last_expression,
    parse_expression,
    parse_int,
    parse_int_list,
    proposal_segments,
    safe_eval,
)
from populora.tasks.parsing import MAX_PROPOSAL_CHARS


@contextlib.contextmanager
def no_code_execution(monkeypatch):
    """eval / exec / __import__ fail the test if called; compile may only build an AST."""
    calls = []

    def refuse(name):
        def fail(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} was called with {str(args[:1])[:80]}")

        return fail

    real_compile = builtins.compile

    def ast_only(source, filename, mode, flags=0, *args, **kwargs):
        calls.append("compile")
        if not flags & ast.PyCF_ONLY_AST:
            raise AssertionError(f"compile to code was called on {source!r}")
        return real_compile(source, filename, mode, flags, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(builtins, "compile", ast_only)
        patch.setattr(builtins, "eval", refuse("eval"))
        patch.setattr(builtins, "exec", refuse("exec"))
        patch.setattr(builtins, "__import__", refuse("__import__"))  # last: setattr itself may import
        yield calls


# --- safe_eval: what is accepted -------------------------------------------------------------


@pytest.mark.parametrize(
    "text, value",
    [
        ("3 + 4", Fraction(7)),
        ("(7 - 2) * 3 + 8", Fraction(23)),
        ("7 / 2", Fraction(7, 2)),
        ("1 / 3 + 1 / 6", Fraction(1, 2)),
        ("-3 * -(2 - 5)", Fraction(-9)),
        ("+5", Fraction(5)),
        ("2 - 3 - 4", Fraction(-5)),  # left-associative
        ("2 * 3 + 4 * 5", Fraction(26)),  # precedence
        ("((((((((((1))))))))))", Fraction(1)),  # parentheses leave no node: depth 0
        (" 12 ", Fraction(12)),
        ("0", Fraction(0)),
    ],
)
def test_safe_eval_values(text, value):
    result = safe_eval(text)
    assert result == value and isinstance(result, Fraction)


def test_parse_expression_structure():
    parsed = parse_expression("(7 - 2) * 3 + 7")
    assert parsed.constants == (7, 2, 3, 7)
    assert parsed.operators == frozenset({"-", "*", "+"})
    assert parsed.unary is False and parsed.depth == 3 and parsed.value == 22
    assert parsed.uses_within((2, 3, 7, 7)) and parsed.uses_within([7, 7, 3, 2, 9])
    assert not parsed.uses_within((2, 3, 7))  # 7 twice needs two 7s
    assert parse_expression("-3").unary and parse_expression("-3").depth == 1


# --- safe_eval: adversarial input, never executed ----------------------------------------------

ADVERSARIAL = [
    ("__import__('os').system('touch {sentinel}')", "function call"),
    ("__import__('os')", "function call"),
    ("2**99999", r"`\*\*` \(power\)"),
    ("9**9**9", r"`\*\*` \(power\)"),
    ("().__class__", "attribute access"),
    ("().__class__.__bases__[0].__subclasses__()", "not allowed"),
    ("(" * 10000 + "1" + ")" * 10000, "20001 characters, more than max_length=200"),
    ("1" * 10**6, "1000000 characters, more than max_length=200"),
    ("-" * 150 + "1", "deeper than max_depth=10"),
    ("9*" * 60 + "9", "deeper than max_depth=10"),
    ("999999 * 999999 * 999999", "intermediate result exceeds max_abs"),
    ("9" * 150, "exceeds max_abs"),
    ("1/0", "division by zero"),
    ("(3 - 3) and 1", "`and` / `or`"),
    ("1 / (2 - 2)", "division by zero"),
    ("True+1", "the constant `True`"),
    ("False", "the constant `False`"),
    ("None", "the constant `None`"),
    ("1.5", "float constant"),
    ("1e3", "float constant"),
    ("2j", "complex constant"),
    ("'7'", "str constant"),
    ("b'7'", "bytes constant"),
    ("lambda: 1", "a lambda"),
    ("f'{1}'", "an f-string"),
    ("x + 1", "the name `x`"),
    ("open('/etc/passwd')", "function call"),
    ("1 // 2", "floor division"),
    ("7 % 2", "modulo"),
    ("1 < 2", "a comparison"),
    ("[1, 2][0]", "a subscript"),
    ("(1, 2)", "a tuple"),
    ("{1: 2}", "a dict"),
    ("[x for x in ()]", "a comprehension"),
    ("1 if 1 else 2", "conditional expression"),
    ("~1", "bitwise not"),
    ("not 1", "`not`"),
    ("1 << 40", "shift"),
    ("1 ^ 2", "bitwise xor"),
    ("0x10", "plain decimal digits"),
    ("1_000", "plain decimal digits"),
    ("007", "not valid syntax"),
    ("import os", "not valid syntax"),
    ("1; 2", "not valid syntax"),
    ("(y := 1)", "assignment expression"),
    ("\x00", "not valid syntax"),
    ("", "empty"),
    ("   ", "empty"),
]


def test_adversarial_strings_raise_without_executing(monkeypatch, tmp_path):
    sentinel = tmp_path / "executed"
    messages = {}
    with no_code_execution(monkeypatch) as calls:
        for text, _ in ADVERSARIAL:
            text = text.replace("{sentinel}", str(sentinel))
            try:
                safe_eval(text)
            except InvalidValueError as err:  # PopuloraError and ValueError too
                messages[text] = str(err)
            except Exception as err:  # a RecursionError or MemoryError would land here
                messages[text] = f"WRONG TYPE {type(err).__name__}: {err}"
            else:
                messages[text] = "NO ERROR"
    assert set(calls) <= {"compile"}, calls
    assert not sentinel.exists()
    for text, expected in ADVERSARIAL:
        message = messages[text.replace("{sentinel}", str(sentinel))]
        assert re.search(expected, message), (text[:40], message)


def test_oversized_input_is_refused_before_parsing(monkeypatch):
    with no_code_execution(monkeypatch) as calls:
        for text in ("(" * 10000 + "1" + ")" * 10000, "1+" * 500_000 + "1", "1" * 10**6):
            with pytest.raises(InvalidValueError, match="more than max_length"):
                safe_eval(text)
    assert calls == []  # the parser never saw them


@pytest.mark.parametrize(
    "text",
    [
        "(" * 49_999 + "1" + ")" * 49_999,
        "-" * 99_999 + "1",
        "1+" * 49_999 + "1",
        "~" * 99_999 + "1",
        "not " * 20_000 + "1",
        "[" * 99_999,
        "9" * 99_999,
    ],
)
def test_deep_inputs_within_a_large_max_length_raise_our_error(text):
    # the parser's own limits (nesting, recursion, stack) come back as InvalidValueError
    with pytest.raises(InvalidValueError, match="not valid syntax|cannot be parsed|deeper than|more than max_nodes"):
        safe_eval(text, max_length=100_000)


def test_bounds_are_configurable_and_checked():
    assert safe_eval("1+" * 20 + "1", max_depth=20) == 21
    with pytest.raises(InvalidValueError, match="deeper than max_depth=19"):
        safe_eval("1+" * 20 + "1", max_depth=19)
    with pytest.raises(InvalidValueError, match="more than max_nodes=4"):
        safe_eval("1 + 2 + 3", max_nodes=4)
    assert safe_eval("1 + 2 + 3", max_nodes=5) == 6
    assert safe_eval("1000 * 1000", max_abs=10**6) == 10**6
    with pytest.raises(InvalidValueError, match="intermediate result exceeds max_abs=999999"):
        safe_eval("1000 * 1000", max_abs=999_999)
    with pytest.raises(InvalidValueError, match="intermediate result exceeds"):
        safe_eval("1 / 1000 / 1000", max_abs=999_999)  # denominators are bounded too
    with pytest.raises(InvalidValueError, match="more than max_length=4"):
        safe_eval("1 + 2", max_length=4)
    with pytest.raises(InvalidValueError, match="`max_depth` must be an int in"):
        safe_eval("1", max_depth=1000)
    with pytest.raises(InvalidTypeError, match="`expr` must be a str, got int"):
        safe_eval(7)


def test_errors_are_populora_and_value_errors():
    with pytest.raises(PopuloraError):
        safe_eval("2 ** 3")
    with pytest.raises(ValueError):
        safe_eval("2 ** 3")


# --- lenient integer parsing -------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("7", 7),
        ("The answer is 7.", 7),
        ("3 + 4 = 7", 7),
        ("x = 5", 5),
        ("x = -3", -3),
        ("-3", -3),
        ("(-3)", -3),
        ("the result is \u22123", -3),  # Unicode minus
        ("5-3", 3),  # a subtraction, not a sign
        ("5 - 3", 3),
        ("a-3", 3),
        ("1,234", 1234),
        ("It is 12,345,678 in total", 12345678),
        ("-1,234", -1234),
        ("1,2,3", 3),  # not a grouping: a list
        ("12,34", 34),
        ("1,234.0", 1234),
        ("3.", 3),
        ("3.0", 3),
        ("3.00 apples", 3),
        ("about 3.5", None),
        ("first 7 then 2.5", None),  # the last number is not an integer
        ("no numbers here", None),
        ("", None),
        ("\u0663", None),  # Arabic-Indic digit: not a number
        ("Step 1: 4 + 5. Step 2: so the answer is 9", 9),
    ],
)
def test_parse_int(reply, expected):
    assert parse_int(reply) == expected


def test_find_ints():
    assert find_ints("457 or 812?") == [457, 812]
    assert find_ints("a 2.5 b -3 c 1,000") == [-3, 1000]
    assert find_ints("none") == []
    with pytest.raises(InvalidTypeError, match="`text` must be a str, got NoneType"):
        find_ints(None)


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("[1, 2, 3]", [1, 2, 3]),
        ("Sorted: [1, 2, 3]", [1, 2, 3]),
        ("[3 1 2]", [3, 1, 2]),
        ("[-5, 0, 7]", [-5, 0, 7]),
        ("[]", []),
        ("[5]", [5]),
        ("1, 2, 3", [1, 2, 3]),
        ("The answer is 1, 2, 3.", [1, 2, 3]),
        ("1, 2, and 3", [1, 2, 3]),
        ("1,234", [1, 234]),  # commas in lists are separators
        ("Sort [3, 1, 2]. Answer: 1, 2, 3", [1, 2, 3]),  # whichever ends last
        ("1, 2, 3 gives [3, 2, 1]", [3, 2, 1]),
        ("[a, b] then [4, 5]", [4, 5]),
        ("[4, 5] then [a, b]", [4, 5]),
        ("just 7", None),
        ("nothing", None),
    ],
)
def test_parse_int_list(reply, expected):
    assert parse_int_list(reply) == expected


def test_parsers_refuse_non_strings():
    with pytest.raises(InvalidTypeError, match="`reply` must be a str, got int"):
        parse_int(7)
    with pytest.raises(InvalidTypeError, match="`reply` must be a str, got list"):
        parse_int_list([1, 2])


# --- segments ---------------------------------------------------------------------------------


def test_proposal_segments_order_and_cleaning():
    text = "Sure!\n**Problem:** `3 + 4`\nThe answer is 7.\n- 5 * 6\n"
    segments = proposal_segments(text)
    # the marker's segment first, then the lines from the last; markdown stripped, bullets dropped
    assert segments == ["3 + 4", "5 * 6", "The answer is 7.", "Problem:   3 + 4", "Sure!"]
    assert proposal_segments("Problem 2: 8 - 1\nproblem: 1 + 1")[:2] == ["1 + 1", "8 - 1"]
    assert proposal_segments("-3 + 4") == ["-3 + 4"]  # a minus sign is not a bullet
    assert proposal_segments("x" * (MAX_PROPOSAL_CHARS + 1)) == []
    assert proposal_segments("\n\n  \n") == []


def test_last_expression():
    assert last_expression("(7 - 2) * 3 + 8 = 23") == "(7 - 2) * 3 + 8"
    assert last_expression("23 = 3 * 7 + 2") == "3 * 7 + 2"
    assert last_expression("First 1 + 1 = 2.\nso 23 - 8 = 15") == "23 - 8"
    assert last_expression("**3 * 7 + 2**") == "3 * 7 + 2"
    assert last_expression("answer (using 3 * 7 + 2)") == "3 * 7 + 2"
    assert last_expression("3 \u00d7 7 \u2212 2") == "3 * 7 - 2"
    assert last_expression("The answer is 23.") is None
    assert last_expression("") is None


def test_proposal_segments_handle_huge_texts_quickly():
    # linear-time regexes: a long text of near-matches finishes (no catastrophic backtracking)
    text = ("1, " * 5000 + "x\n") * 1
    assert proposal_segments(text)[0].startswith("1, 1")
    assert parse_int_list("1 ," * 20000 + "x") == [1] * 20000
    assert parse_int("9," * 50000 + "x") == 9
