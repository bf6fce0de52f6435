"""populora.tasks.code: AZR code tasks (code_o, code_i, code_f) verified by the sandbox."""

import builtins
import dataclasses

import pytest
import torch

from populora.errors import InvalidTypeError, InvalidValueError
from populora.tasks import Arithmetic, Mixture, Problem, check_replies
from populora.tasks.code import (
    CODE_F_INPUTS,
    MAX_REPLY_CHARS,
    CodeFunction,
    CodeInput,
    CodeOutput,
    answer_text,
    check_code_replies,
    parse_code_proposal,
    reply_program,
)
from populora.tasks.sandbox import Job, Limits, RunResult, Sandbox

LIMITS = Limits(cpu_s=0.5, wall_s=5.0, memory_bytes=128 * 2**20)
FENCE = "```"


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def fenced(source: str) -> str:
    return f"{FENCE}python\n{source}\n{FENCE}"


@pytest.fixture(scope="module")
def samples():
    """A few problems of every kind and difficulty (sampled once: each costs sandbox runs)."""
    out = {}
    for cls in (CodeOutput, CodeInput, CodeFunction):
        for d in (1, 3, 5):
            out[cls.name, d] = cls(d, limits=LIMITS).sample(3, gen(d))
    return out


# ------------------------------------------------------------------------------------------------
# generation
# ------------------------------------------------------------------------------------------------


def test_sample_is_deterministic_in_the_generator():
    task = CodeOutput(2, limits=LIMITS)
    first = task.sample(4, gen(7))
    assert first == task.sample(4, gen(7))
    assert [p.data["program"] for p in first] != [p.data["program"] for p in task.sample(4, gen(8))]
    # the three kinds draw the same programs from the same generator state
    programs = [p.data["program"] for p in CodeInput(2, limits=LIMITS).sample(4, gen(7))]
    assert programs == [p.data["program"] for p in first]
    assert task.sample(0, gen(0)) == []


def test_generated_problems_have_the_declared_shape(samples):
    for (name, _), problems in samples.items():
        assert len(problems) == 3
        for p in problems:
            assert p.task == name
            program = p.data["program"]
            assert program.startswith("def f(") and "return" in program
            assert p.data["limits"] == dataclasses.asdict(LIMITS)
            if name == "code_f":
                assert len(p.data["inputs"]) == len(p.data["outputs"]) == CODE_F_INPUTS
                assert len(set(p.data["inputs"])) == CODE_F_INPUTS
                assert p.data["visible"] == 3 and p.answer == program
                for x, y in zip(p.data["inputs"][:3], p.data["outputs"][:3]):
                    assert f"f({x}) == {y}" in p.question
                for x in p.data["inputs"][3:]:
                    assert f"f({x})" not in p.question  # the hidden half is hidden
                assert p.data["message"].startswith("takes ")
            else:
                assert program in p.question
                assert p.answer == (p.data["output"] if name == "code_o" else p.data["input"])
                assert (p.data["input"] if name == "code_o" else p.data["output"]) in p.question
    # difficulty d chains d steps: longer programs at higher levels
    lengths = {d: sum(len(p.data["program"].splitlines()) for p in samples["code_o", d]) for d in (1, 3, 5)}
    assert lengths[1] < lengths[3] < lengths[5]


def test_generated_programs_are_deterministic_across_hash_seeds(samples):
    box = Sandbox(LIMITS, workers=2)
    problems = samples["code_f", 5] + samples["code_f", 3]
    results = box.validate_many([Job(p.data["program"], p.data["inputs"]) for p in problems])
    for p, result in zip(problems, results):
        assert result.status == "ok", (p.data["program"], result)
        assert result.outputs == p.data["outputs"]


def test_gold_answers_pass_and_wrong_answers_fail(samples):
    for (name, _), problems in samples.items():
        for p in problems:
            if name == "code_o":
                assert p.check(f"Output: {p.answer}")
                assert not p.check("Output: 'definitely not the output'")
            elif name == "code_i":
                assert p.check(f"Input: {p.answer}")
                assert not p.check("Input: 'not an input', 1, 2, 3")
            else:
                assert p.check(fenced(p.answer))
                assert not p.check(fenced("def f(*args):\n    return None"))


def test_checks_survive_a_rebuilt_problem(samples):
    p = samples["code_i", 3][0]
    rebuilt = Problem(**dataclasses.asdict(p))
    assert rebuilt == p and rebuilt.check(f"Input: {p.answer}")


def test_code_o_compares_values_not_spelling():
    task = CodeOutput(limits=LIMITS)
    p = task.parse_proposal(fenced("def f(xs):\n    return (sorted(xs), {'n': len(xs)})") + "\nInput: [2, 1]")
    assert p.answer == "([1, 2], {'n': 2})"
    assert p.check("Output: ([1,2], {'n':2})")
    assert p.check('<answer>([1, 2], {"n": 2})</answer>')
    assert not p.check("Output: ([1, 2], {'n': 2.0})")
    assert not p.check("Output: [[1, 2], {'n': 2}]")
    flag = task.parse_proposal(fenced("def f(x):\n    return x > 0") + "\nInput: 5")
    assert flag.answer == "True" and flag.check("Output: True") and not flag.check("Output: 1")


def test_code_i_accepts_any_input_that_gives_the_output():
    task = CodeInput(limits=LIMITS)
    p = task.parse_proposal(fenced("def f(xs):\n    return len(xs)") + "\nInput: [5, 6, 7]")
    assert p.answer == "[5, 6, 7]" and p.data["output"] == "3"
    assert p.check("Input: [0, 0, 0]")
    assert p.check("the call f(['a', 'b', 'c']) works\nInput: f(['a', 'b', 'c'])")
    assert p.check("<answer>'abc'</answer>")
    assert not p.check("Input: [1, 2]")
    assert not p.check("Input: [1, 2], 3")  # wrong arity: f raises
    assert not p.check("Input: __import__('os').system('true')")


def test_code_f_checks_the_hidden_pairs_too():
    task = CodeFunction(limits=LIMITS)
    text = (
        fenced("def f(n):\n    return n * n") + "\nInput: 1\nInput: 0\nInput: 3\nInput: 5\n"
        "Message: squares its argument"
    )
    p = task.parse_proposal(text)
    assert p.data["inputs"] == ("1", "0", "3", "5") and p.data["outputs"] == ("1", "0", "9", "25")
    assert p.data["visible"] == 2 and "squares its argument" in p.question
    assert p.check(fenced("def f(n):\n    return n ** 2"))
    assert p.check("Here you go:\ndef f(n):\n    return pow(n, 2)")
    assert not p.check(fenced("def f(n):\n    return n"))  # right on the shown pairs (1, 0) only
    assert not p.check(fenced("import os\ndef f(n):\n    return n * n"))
    assert not p.check(fenced("def f(n):\n    while True:\n        pass"))
    assert not p.check("no code here")


# ------------------------------------------------------------------------------------------------
# parsing (model text: linear, never raises)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "marker", "expected"),
    [
        ("Output: [1, 2]", "output", "[1, 2]"),
        ("I think...\n**Output:** `42`.", "output", "42"),
        ("output: 1\nso the OUTPUT: 2", "output", "2"),
        ("<answer>Output: 'ab'</answer> and later Output: 3", "output", "'ab'"),
        ("<answer>\n[1,\n 2]\n</answer>", "output", "[1,\n 2]"),
        (f"thinking\n{FENCE}\n(1, 2)\n{FENCE}\nthat is all", "output", "(1, 2)"),
        ("blah\n\n  7  \n\n", "output", "7"),
        ("Input: f([1, 2], 3)", "input", "f([1, 2], 3)"),
        ("", "output", None),
        ("   \n\t", "output", None),
        ("x" * (MAX_REPLY_CHARS + 1), "output", None),
    ],
)
def test_answer_text(reply, marker, expected):
    assert answer_text(reply, marker) == expected


def test_reply_program():
    assert reply_program(fenced("def f(x):\n    return x")) == "def f(x):\n    return x"
    two = fenced("def f(x):\n    return 1") + "\nbetter:\n" + fenced("import math\ndef f(x):\n    return 2")
    assert reply_program(two) == "import math\ndef f(x):\n    return 2"
    assert reply_program("so\ndef f(x):\n    return x\n") == "def f(x):\n    return x"
    assert reply_program(fenced("print(1)")) is None
    assert reply_program("") is None and reply_program(None) is None


def test_parse_code_proposal_formats():
    proposal = parse_code_proposal(
        "Here is one.\n" + fenced("def f(a, b):\n    return a + b") + "\n- **Input 1:** `1, 2`\n2. Input 2: f(3, 4)\n"
        "Input: 1, 2\nMessage: adds two numbers."
    )
    assert proposal.program == "def f(a, b):\n    return a + b"
    assert proposal.inputs == ("1, 2", "3, 4")  # in order, duplicates dropped
    assert proposal.message == "adds two numbers"
    bare = parse_code_proposal("import math\ndef f(x):\n    return math.floor(x)\nInput: 2.5")
    assert bare.program == "import math\ndef f(x):\n    return math.floor(x)" and bare.inputs == ("2.5",)
    # an "Input:" line inside the code block is code, not an input
    inside = parse_code_proposal(fenced("def f(x):\n    # Input: 9\n    return x") + "\nInput: 1")
    assert inside.inputs == ("1",)
    assert parse_code_proposal(fenced("def f(x):\n    return x")) is None  # no input
    assert parse_code_proposal("Input: 3") is None  # no program
    assert parse_code_proposal(fenced("def g(x):\n    return x") + "\nInput: 1") is None


GARBAGE = [
    "",
    "\n" * 1000,
    FENCE * 5000,
    "<answer>" * 3000,
    "Input:" * 3000,
    "def f(" * 3000,
    "Output: " + "[" * 5000,
    "Input: " + " " * 10000 + "x",
    "\x00\x01\x02",
    "\u202e\u0000Input: 1",
    "💥" * 4000,
    "Input: 1\r\nOutput: 2\r",
    "İnput: 1\n" * 100,
    "ﬃ" * 1000 + "\ninput: 1",
]


def test_parsers_never_raise_on_garbage():
    for text in GARBAGE:
        for marker in ("input", "output"):
            result = answer_text(text, marker)
            assert result is None or isinstance(result, str)
        assert reply_program(text) is None or isinstance(reply_program(text), str)
        assert parse_code_proposal(text) is None or parse_code_proposal(text).inputs
    assert answer_text(123, "output") is None and parse_code_proposal(b"x") is None


def test_checks_are_false_on_garbage_replies(samples):
    problems = [samples[name, 1][0] for name in ("code_o", "code_i", "code_f")]
    for text in GARBAGE[:8]:
        assert check_code_replies(problems, [text] * 3).tolist() == [False, False, False]
    with pytest.raises(InvalidTypeError):
        problems[0].check(None)


# ------------------------------------------------------------------------------------------------
# proposals (the teacher) and validation by the executor
# ------------------------------------------------------------------------------------------------

VALID = fenced("def f(xs):\n    return sorted(xs)[::-1]") + "\nInput: [3, 1, 2]"


def test_parse_proposal_computes_the_answer_in_the_sandbox():
    o = CodeOutput(limits=LIMITS).parse_proposal(VALID)
    i = CodeInput(limits=LIMITS).parse_proposal(VALID)
    assert o.task == "code_o" and o.answer == "[3, 2, 1]" and "What does f([3, 1, 2]) return?" in o.question
    assert i.task == "code_i" and i.answer == "[3, 1, 2]" and "returns [3, 2, 1]" in i.question


@pytest.mark.parametrize(
    "text",
    [
        fenced("import os\ndef f(x):\n    return os.getcwd()") + "\nInput: 1",  # the allowlist
        fenced("def f(x):\n    return hash(str(x))") + "\nInput: 1",  # nondeterministic (hash seeds 0 and 1)
        fenced("def f(x):\n    return list({'a', 'b', 'c', 'd', 'e', 'f'})") + "\nInput: 1",
        fenced("def f(x):\n    while True:\n        pass") + "\nInput: 1",  # CPU limit
        fenced("def f(x):\n    return [0] * 10 ** 10") + "\nInput: 1",  # memory limit
        fenced("def f(x):\n    return 1 / x") + "\nInput: 0",  # raises
        fenced("def f(x):\n    return f") + "\nInput: 0",  # not a plain literal
        fenced("def f(x):\n    return 'x' * 1000") + "\nInput: 0",  # output over MAX_LITERAL_CHARS
        fenced("def f(x):\n    return x") + "\nInput: " + "9" * 600,  # input over MAX_LITERAL_CHARS
        fenced("def f(x):\n" + "    x += 1\n" * 400 + "    return x") + "\nInput: 0",  # program over MAX_PROGRAM_CHARS
        fenced("def f(x:\n    return x") + "\nInput: 1",  # syntax error
        fenced("def f(x):\n    return x") + "\nInput: x",  # not a literal
        fenced("def f(x):\n    return x") + "\nInput: 1, 2",  # wrong arity
        "Let me think about it.",
    ],
)
def test_invalid_proposals_are_none(text):
    assert CodeOutput(limits=LIMITS).parse_proposal(text) is None


def test_code_f_proposals_need_enough_inputs_and_varied_outputs():
    task = CodeFunction(limits=LIMITS)
    program = fenced("def f(x):\n    return x % 2")
    assert task.parse_proposal(program + "\nInput: 1\nInput: 2") is None  # too few inputs
    assert task.parse_proposal(program + "\nInput: 1\nInput: 3\nInput: 5") is None  # one output for all
    p = task.parse_proposal(program + "\nInput: 1\nInput: 2\nInput: 3")
    assert p.data["outputs"] == ("1", "0", "1") and p.data["message"] == ""
    many = "".join(f"\nInput: {k}" for k in range(11))
    assert task.parse_proposal(program + many) is None  # too many


def test_proposal_prompts_show_the_format_they_parse():
    for cls in (CodeOutput, CodeInput, CodeFunction):
        task = cls(limits=LIMITS)
        prompt = task.proposal_prompt()
        example = prompt[prompt.index(FENCE) :]
        problem = task.parse_proposal(example)
        assert problem is not None and problem.task == cls.name


def test_mixture_of_code_tasks():
    mixture = Mixture([CodeOutput(limits=LIMITS), CodeInput(limits=LIMITS), CodeFunction(limits=LIMITS), Arithmetic()])
    problems = mixture.sample(8, gen(3))
    assert problems == mixture.sample(8, gen(3))
    assert {p.task for p in problems} <= {"code_o", "code_i", "code_f", "arithmetic"}
    assert len({p.task for p in problems}) >= 2
    gold = []
    for p in problems:
        if p.task == "code_o":
            gold.append(f"Output: {p.answer}")
        elif p.task == "code_i":
            gold.append(f"Input: {p.answer}")
        elif p.task == "code_f":
            gold.append(fenced(p.answer))
        else:
            gold.append(f"The answer is {p.answer}.")
    assert check_replies(problems, gold).all()
    assert check_code_replies(problems, gold, workers=2).all()
    wrong = ["nothing"] * len(problems)
    assert not check_code_replies(problems, wrong).any()
    assert mixture.prompt(problems[0]).startswith(problems[0].question)
    assert mixture.parse_proposal(VALID).task == "code_o"  # the first member that accepts it
    assert "Input: [3, 1, 2]" in mixture.proposal_prompt()


def test_verification_never_compiles_or_executes_in_the_parent(monkeypatch):
    task_o, task_i, task_f = (cls(2, limits=LIMITS) for cls in (CodeOutput, CodeInput, CodeFunction))
    calls = []

    def refuse(name):
        def fail(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} was called in the parent")

        return fail

    with monkeypatch.context() as patch:
        for name in ("exec", "eval", "compile"):
            patch.setattr(builtins, name, refuse(name))
        o, i, f = (task.sample(1, gen(11))[0] for task in (task_o, task_i, task_f))
        checks = [
            o.check(f"Output: {o.answer}"),
            i.check(f"Input: {i.answer}"),
            f.check(fenced(f.answer)),
            o.check("Output: __import__('os').system('true')"),
            i.check("Input: ().__class__"),
            f.check(fenced("import os\ndef f(*a):\n    return os.system('true')")),
        ]
        proposed = task_o.parse_proposal(VALID)
        refused = task_o.parse_proposal(fenced("def f(x):\n    return eval('x')") + "\nInput: 1")
    assert calls == []
    assert checks == [True, True, True, False, False, False]
    assert proposed.answer == "[3, 2, 1]" and refused is None


def test_bad_arguments():
    with pytest.raises(InvalidValueError, match="difficulty"):
        CodeOutput(6)
    with pytest.raises(InvalidTypeError, match="limits"):
        CodeInput(limits={"cpu_s": 1})
    with pytest.raises(InvalidValueError, match="workers"):
        CodeFunction(workers=0)
    with pytest.raises(InvalidTypeError, match="generator"):
        CodeOutput().sample(1, 0)
    with pytest.raises(InvalidValueError, match="n"):
        CodeOutput().sample(-1, gen(0))
    with pytest.raises(InvalidTypeError, match="text"):
        CodeOutput().parse_proposal(None)
    with pytest.raises(InvalidValueError, match="replies"):
        check_code_replies([], ["x"])


class _FailingSandbox:
    """A sandbox double: every run fails as a broken machine would, or (``drop``) returns no result at all."""

    def __init__(self, drop: bool):
        self.drop, self.calls = drop, 0

    def run_many(self, jobs):
        self.calls += 1
        return [] if self.drop else [RunResult("error", message="machine fault") for _ in jobs]


@pytest.mark.parametrize("drop", [False, True])
def test_sample_names_programs_the_sandbox_failed_on(drop):
    """After its retries, sample() raises a RuntimeError naming a failed program, also when the sandbox
    returned no result for it (not an AttributeError on the missing result)."""
    task = CodeOutput(1, limits=LIMITS)
    task.sandbox = _FailingSandbox(drop)
    with pytest.raises(RuntimeError, match=r"the sandbox failed on 2 generated programs, e\.g\. \(0, '"):
        task.sample(2, gen(0))
    assert task.sandbox.calls >= 2  # retried
