"""populora.tasks.sandbox: the executor of model-written programs (a security boundary).

Every hostile program must be refused by the allowlist or stopped by its limit, with the parent and
the programs that run beside it unaffected, no process left behind and nothing written outside the
run's own temporary directory. The OS limits are exercised with the allowlist off
(``ast_check=False``); the dangerous ones (fork bombs, file writes, signals to the parent) only
when the children drop to an unprivileged uid in a chroot (as root), never without.
"""

import builtins
import os
import socket
import uuid

import pytest

from populora.errors import InvalidTypeError, InvalidValueError
from populora.tasks.sandbox import RUNNER_PATH, STATUSES, UID_RANGE, Job, Limits, RunResult, Sandbox

LIMITS = Limits(cpu_s=0.3, wall_s=5.0, memory_bytes=128 * 2**20, output_chars=4096, file_bytes=4096)
# a child is stopped within its CPU limit: SIGPROF at cpu_s, else RLIMIT_CPU's SIGKILL at int(cpu_s) + 2 s, which
# the kernel checks once per scheduler tick (a program ignoring SIGPROF was measured at 2.003 s): 50 ms of slack
MAX_CPU_S = int(LIMITS.cpu_s) + 2 + 0.05
MARKER = RUNNER_PATH.encode()  # in every child's command line
ESCAPE = f"/tmp/populora-sandbox-escape-{uuid.uuid4().hex}"


def _processes() -> dict[int, tuple[int, bytes]]:
    """pid -> (real uid, command line) of every process we can see."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as fh:
                uid = next(int(line.split()[1]) for line in fh if line.startswith("Uid:"))
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                out[int(name)] = (uid, fh.read())
        except (OSError, StopIteration):
            pass
    return out


@pytest.fixture(scope="module")
def guards() -> tuple[str, ...]:
    """The confinement this machine gives (root: chroot + uid drop, usually netns too)."""
    result = Sandbox(LIMITS).run(Job("def f():\n    return 1", ("",)))
    assert result.ok, result
    return result.guards


@pytest.fixture
def clean(tmp_path):
    """A run directory that must be empty afterwards, and no sandbox process or new process of the
    sandbox uid may outlive the test."""
    before = _processes()
    runs = tmp_path / "runs"
    runs.mkdir()
    yield runs
    assert list(runs.iterdir()) == [], "a run left files behind"
    after = _processes()
    stray = [pid for pid, (_, cmd) in after.items() if MARKER in cmd]
    assert stray == [], f"sandbox processes survived: {stray}"
    new_uid = [pid for pid, (uid, _) in after.items() if UID_RANGE[0] <= uid < UID_RANGE[1] and pid not in before]
    assert new_uid == [], f"processes of the sandbox uid survived: {new_uid}"
    assert not os.path.exists(ESCAPE)


def job(source: str, *inputs: str, expect=None) -> Job:
    return Job(source, tuple(inputs) if inputs else ("",), expect=expect)


# ------------------------------------------------------------------------------------------------
# benign programs
# ------------------------------------------------------------------------------------------------


def test_outputs_matches_and_printed_text(clean):
    box = Sandbox(LIMITS, tmp_dir=clean)
    source = "def f(xs, k):\n    print('k is', k)\n    return [x * k for x in xs]"
    result = box.run(Job(source, ("[1, 2], 3", "[], 0"), expect=("[3, 6]", "[1]")))
    assert result.status == "ok"
    assert result.outputs == ("[3, 6]", "[]")
    assert result.matches == (True, False)
    assert result.stdout == "k is 3\nk is 0\n"
    assert "rlimits" in result.guards and "nproc" in result.guards
    assert 0.0 < result.cpu_s


def test_allowed_modules_work(clean):
    source = """
import math
import itertools
import heapq
import bisect
import string
import re
import operator
from functools import lru_cache, reduce
from collections import Counter, deque, defaultdict
from typing import List

@lru_cache(maxsize=None)
def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)

def f(xs: List[int]) -> tuple:
    h = list(xs)
    heapq.heapify(h)
    d = defaultdict(int)
    for x in xs:
        d[x % 2] += 1
    q = deque(sorted(xs))
    q.rotate(1)
    return (math.gcd(12, 18), list(itertools.accumulate(xs)), heapq.heappop(h), bisect.bisect(sorted(xs), 2),
            string.ascii_lowercase[:3], re.sub("[0-9]", "#", "a1b2"), operator.itemgetter(1)(xs),
            reduce(operator.add, xs), sorted(Counter("abca").items()), fib(30), dict(d), list(q))
"""
    result = Sandbox(LIMITS, tmp_dir=clean).run(job(source, "[3, 1, 2]"))
    assert result.status == "ok", result
    assert result.outputs == (
        "(6, [3, 4, 6], 1, 2, 'abc', 'a#b#', 1, 6, [('a', 2), ('b', 1), ('c', 1)], 832040, {0: 1, 1: 2}, [3, 1, 2])",
    )


def test_inputs_are_literal_argument_lists(clean):
    box = Sandbox(LIMITS, tmp_dir=clean)
    source = "def f(*args):\n    return list(args)"
    result = box.run(Job(source, ("", "1", "1, 'a', [2, (3,)], {'k': {4}}, None, True, -1.5, b'x'")))
    assert result.outputs == ("[]", "[1]", "[1, 'a', [2, (3,)], {'k': {4}}, None, True, -1.5, b'x']")
    # anything that is not a plain positional literal list is refused before the program runs
    for text in ("1) + f(2", "x", "__import__('os')", "k=1", "*[1]", "[1] * 10**9", "f(1)", "(", "1,, 2"):
        result = box.run(Job(source, (text,)))
        assert result.status == "refused", (text, result)
        assert result.outputs == ()


def test_outputs_must_be_plain_literals(clean):
    box = Sandbox(LIMITS, tmp_dir=clean)
    bad = {
        "a function": "def f():\n    return f",
        "a generator": "def f():\n    return (x for x in [1])",
        "a Counter": "from collections import Counter\ndef f():\n    return Counter('aab')",
        "nan": "def f():\n    return float('nan')",
        "inf": "def f():\n    return [float('inf')]",
        "deep": "def f():\n    x = []\n    for _ in range(200):\n        x = [x]\n    return x",
        "huge int": "def f():\n    return 10 ** 5000",
    }
    results = box.run_many([job(source) for source in bad.values()])
    for name, result in zip(bad, results):
        assert result.status == "error", (name, result)
        assert result.outputs == ()


def test_expected_outputs_compare_types_and_values(clean):
    box = Sandbox(LIMITS, tmp_dir=clean)
    source = "def f(x):\n    return x"
    pairs = [
        ("1", "1", True),
        ("1", "True", False),
        ("1", "1.0", False),
        ("[1, 2]", "[1,2]", True),
        ("[1, 2]", "(1, 2)", False),
        ("{'a': [1]}", "{'a':[1]}", True),
        ("{1, 2}", "{2, 1}", True),
        ("'a'", '"a"', True),
        ("None", "None", True),
        ("[1, 2]", "[2, 1]", False),
    ]
    result = box.run(Job(source, tuple(a for a, _, _ in pairs), expect=tuple(b for _, b, _ in pairs)))
    assert result.matches == tuple(ok for _, _, ok in pairs)
    assert box.same_value("[1, 2]", "[1,2]") is True
    assert box.same_value("1", "True") is False
    assert box.same_value("1", "__import__('os').system('true')") is False
    assert box.same_value("[" * 10000, "[]") is False


def test_validate_needs_two_hash_seeds_to_agree(clean):
    box = Sandbox(LIMITS, workers=2, tmp_dir=clean)
    assert (
        box.run(job("def f():\n    return hash('abc')"), hash_seed=0).outputs
        != box.run(job("def f():\n    return hash('abc')"), hash_seed=1).outputs
    )
    nondeterministic = [
        "def f():\n    return hash('abc')",
        "def f():\n    return list({'apple', 'banana', 'cherry', 'date', 'elder'})",
        "def f():\n    print(list({'apple', 'banana', 'cherry', 'date'}))\n    return 0",
    ]
    for source in nondeterministic:
        assert box.validate(job(source)).status == "nondeterministic", source
    ok = box.validate(job("def f(xs):\n    return sorted(set(xs))", "['b', 'a', 'b']"))
    assert ok.status == "ok" and ok.outputs == ("['a', 'b']",)
    assert box.validate(job("def f():\n    while True:\n        pass")).status == "timeout"
    assert [r.status for r in box.validate_many([job("def f():\n    return 1"), job("import os")])] == ["ok", "refused"]


def test_parent_never_compiles_or_executes(monkeypatch, clean):
    box = Sandbox(LIMITS, workers=2, tmp_dir=clean)
    calls = []

    def refuse(name):
        def fail(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} called in the parent")

        return fail

    with monkeypatch.context() as patch:
        for name in ("exec", "eval", "compile"):
            patch.setattr(builtins, name, refuse(name))
        result = box.validate(Job("def f(x):\n    return x * 2", ("21",), expect=("42",)))
        refused = box.run(job("import os"))
        same = box.same_value("[1, 2]", "[1,2]")
    assert calls == []
    assert result.outputs == ("42",) and result.matches == (True,)
    assert refused.status == "refused" and same


def test_bad_arguments_raise_before_running():
    with pytest.raises(InvalidValueError, match="wall_s"):
        Limits(cpu_s=2.0, wall_s=1.0)
    with pytest.raises(InvalidValueError, match="cpu_s"):
        Limits(cpu_s=0.0)
    with pytest.raises(InvalidValueError, match="memory_bytes"):
        Limits(memory_bytes=1024)
    with pytest.raises(InvalidTypeError, match="source"):
        Job(b"def f(): pass")
    with pytest.raises(InvalidTypeError, match="inputs"):
        Job("def f(x): pass", "1")
    with pytest.raises(InvalidValueError, match="expect"):
        Job("def f(x): pass", ("1", "2"), expect=("1",))
    with pytest.raises(InvalidValueError, match="entry"):
        Job("def f(x): pass", entry="__init__")
    with pytest.raises(InvalidTypeError, match="limits"):
        Sandbox({"cpu_s": 1.0})
    with pytest.raises(InvalidValueError, match="workers"):
        Sandbox(workers=0)
    with pytest.raises(InvalidTypeError, match="a job"):
        Sandbox().run("def f(): pass")
    with pytest.raises(InvalidValueError, match="hash_seed"):
        Sandbox().run(Job("def f(): pass"), hash_seed=-1)
    assert RunResult("ok").ok and not RunResult("timeout").ok
    assert set(STATUSES) == {"ok", "refused", "timeout", "memory", "output_limit", "error", "nondeterministic"}


def test_oversized_texts_are_refused_without_a_child(clean):
    box = Sandbox(LIMITS, tmp_dir=clean)
    result = box.run(Job("x = 1\n" * 30_000, ("",)))
    assert result.status == "refused" and result.cpu_s == 0.0
    result = box.run(Job("def f(x):\n    return x", ("1" * 200_000,)))
    assert result.status == "refused" and result.cpu_s == 0.0


# ------------------------------------------------------------------------------------------------
# hostile programs under the allowlist
# ------------------------------------------------------------------------------------------------

REFUSED = {"refused"}
STOPPED = {"refused", "error"}  # refused by the allowlist, or it raised (e.g. a name the proxy lacks)

HOSTILE = [
    # imports and import tricks
    ("import os", "import os\ndef f():\n    return os.getcwd()", REFUSED),
    ("import subprocess", "import subprocess\ndef f():\n    return subprocess.run(['id'])", REFUSED),
    ("from os import system", "from os import system\ndef f():\n    return system('id')", REFUSED),
    ("import socket", "import socket\ndef f():\n    return socket.socket()", REFUSED),
    ("import sys", "import sys\ndef f():\n    return sys.modules['os']", REFUSED),
    ("import ctypes", "import ctypes\ndef f():\n    return 1", REFUSED),
    ("import signal", "import signal\ndef f():\n    return signal.SIGKILL", REFUSED),
    ("import importlib", "import importlib\ndef f():\n    return importlib.import_module('os')", REFUSED),
    ("import builtins", "import builtins\ndef f():\n    return builtins.open", REFUSED),
    ("import os as math", "import os as math\ndef f():\n    return 1", REFUSED),
    ("submodule import", "import collections.abc\ndef f():\n    return 1", REFUSED),
    ("relative import", "from . import secret\ndef f():\n    return 1", REFUSED),
    ("star import", "from math import *\ndef f():\n    return pi", REFUSED),
    ("private name import", "from collections import _sys\ndef f():\n    return 1", REFUSED),
    ("unlisted name import", "from functools import singledispatch\ndef f():\n    return 1", REFUSED),
    ("attrgetter import", "from operator import attrgetter\ndef f():\n    return attrgetter('__class__')(1)", REFUSED),
    ("attrgetter attribute", "import operator\ndef f():\n    return operator.attrgetter('__class__')(1)", REFUSED),
    ("__import__", "def f():\n    return __import__('os').system('id')", REFUSED),
    ("import inside f", "def f():\n    import os\n    return os.getpid()", REFUSED),
    ("module submodule attribute", "import re\ndef f():\n    return re.enum", STOPPED),
    ("Formatter", "import string\ndef f():\n    return string.Formatter().get_field('0.__class__', [1], {})", STOPPED),
    # dunder and frame escapes
    ("class bases", "def f():\n    return ().__class__.__bases__[0].__subclasses__()", REFUSED),
    ("list class", "def f():\n    return [].__class__.__mro__", REFUSED),
    ("function globals", "def f():\n    return f.__globals__['__builtins__']", REFUSED),
    ("lambda code", "def f():\n    return (lambda: 0).__code__.co_consts", REFUSED),
    ("builtins name", "def f():\n    return __builtins__", REFUSED),
    ("module name", "def f():\n    return __name__", REFUSED),
    ("dunder function", "def __getattr__(name):\n    return 1\ndef f():\n    return 1", REFUSED),
    ("dunder argument", "def f(__x=1):\n    return __x", REFUSED),
    ("private attribute", "def f():\n    return f._private", REFUSED),
    ("generator frame", "def f():\n    g = (x for x in [1])\n    return g.gi_frame.f_back.f_globals", REFUSED),
    ("generator code", "def f():\n    g = (x for x in [1])\n    return g.gi_code", REFUSED),
    (
        "traceback frame",
        "def f():\n    try:\n        1 / 0\n    except Exception as e:\n        return e.__traceback__.tb_frame",
        REFUSED,
    ),
    ("str.format attribute walk", "def f():\n    return '{0.__class__.__base__}'.format(1)", REFUSED),
    ("format_map", "def f():\n    return '{x.__class__}'.format_map({'x': 1})", REFUSED),
    ("mro", "def f():\n    return int.mro()", REFUSED),
    # forbidden builtins
    ("open /etc/passwd", "def f():\n    return open('/etc/passwd').read()", REFUSED),
    ("open write", f"def f():\n    open('{ESCAPE}', 'w').write('x')\n    return 1", REFUSED),
    ("eval", "def f():\n    return eval('1 + 1')", REFUSED),
    ("exec", "def f():\n    exec('x = 1')\n    return 1", REFUSED),
    ("compile", "def f():\n    return compile('1', 'x', 'eval')", REFUSED),
    ("getattr", "def f():\n    return getattr(f, '__glo' + 'bals__')", REFUSED),
    ("setattr", "def f():\n    setattr(f, 'x', 1)\n    return 1", REFUSED),
    ("globals", "def f():\n    return globals()", REFUSED),
    ("locals", "def f():\n    return locals()", REFUSED),
    ("vars", "def f():\n    return vars()", REFUSED),
    ("dir", "def f():\n    return dir()", REFUSED),
    ("type", "def f():\n    return type(f)", REFUSED),
    ("object subclasses", "def f():\n    return object.__subclasses__()", REFUSED),
    ("super", "def f():\n    return super()", REFUSED),
    ("input", "def f():\n    return input()", REFUSED),
    ("breakpoint", "def f():\n    breakpoint()\n    return 1", REFUSED),
    ("memoryview", "def f():\n    return memoryview(b'x')", REFUSED),
    ("id", "def f():\n    return id(f)", REFUSED),
    ("string-built name", "def f():\n    return {'open': 1}['open']", {"ok"}),  # a string is not a name
    # forbidden statements
    ("class", "class A:\n    pass\ndef f():\n    return 1", REFUSED),
    ("with", "def f():\n    with x:\n        pass", REFUSED),
    ("async", "async def f():\n    return 1", REFUSED),
    ("global", "def f():\n    global x\n    return 1", REFUSED),
    ("match", "def f(x):\n    match x:\n        case _:\n            return 1", REFUSED),
    ("syntax error", "def f(:\n    return 1", REFUSED),
    ("deep nesting", "def f():\n    return " + "(" * 5000 + "1" + ")" * 5000, REFUSED),
    ("no f", "def g():\n    return 1", REFUSED),
    ("f not a function", "f = print", REFUSED),
    # resource bombs: stopped by the limits
    ("infinite loop", "def f():\n    while True:\n        pass", {"timeout"}),
    (
        "loop that catches everything",
        (
            "def f():\n    while True:\n        try:\n            while True:\n"
            "                pass\n        except BaseException:\n            pass"
        ),
        {"timeout"},
    ),
    (
        "exponential recursion",
        "def g(n):\n    return g(n - 1) + g(n - 1) if n else 1\ndef f():\n    return g(100)",
        {"timeout"},
    ),
    ("recursion bomb", "def f():\n    return f()", {"error"}),
    ("big power", "def f():\n    return 10 ** 10 ** 9", {"timeout", "memory"}),
    ("factorial", "import math\ndef f():\n    return math.factorial(10 ** 8)", {"timeout", "memory"}),
    ("regex backtracking", "import re\ndef f():\n    return bool(re.match('(a+)+$', 'a' * 64 + 'b'))", {"timeout"}),
    ("memory bomb", "def f():\n    return [0] * 10 ** 10", {"memory"}),
    ("memory growth", "def f():\n    s = 'ab'\n    while True:\n        s += s", {"memory"}),
    ("list of lists", "def f():\n    x = []\n    while True:\n        x.append([0] * 100000)", {"memory"}),
    ("huge print", "def f():\n    print('x' * 10 ** 6)\n    return 1", {"output_limit"}),
    ("print loop", "def f():\n    while True:\n        print('spam')", {"output_limit"}),
    (
        "print loop that catches",
        (
            "def f():\n    while True:\n        try:\n            print('spam')\n"
            "        except Exception:\n            pass"
        ),
        {"output_limit", "timeout"},
    ),
    ("huge output", "def f():\n    return 'x' * 10 ** 6", {"output_limit"}),
    ("many outputs", "def f():\n    return list(range(10 ** 5))", {"output_limit"}),
]


def test_at_least_fifty_hostile_programs():
    assert len(HOSTILE) >= 50
    assert len({name for name, _, _ in HOSTILE}) == len(HOSTILE)


def test_hostile_programs_are_refused_or_stopped_and_neighbours_are_unaffected(clean, guards):
    box = Sandbox(LIMITS, workers=2, tmp_dir=clean)
    jobs = []
    for i, (_, source, _) in enumerate(HOSTILE):
        jobs.append(job(source))
        jobs.append(Job("def f(x):\n    return [x, x * 2]", (str(i),)))  # a benign neighbour
    results = box.run_many(jobs)
    for i, (name, _, expected) in enumerate(HOSTILE):
        hostile, neighbour = results[2 * i], results[2 * i + 1]
        assert hostile.status in expected, (name, hostile)
        assert hostile.outputs == () or hostile.status == "ok", (name, hostile)
        assert hostile.cpu_s <= MAX_CPU_S, (name, hostile.cpu_s)
        assert len(hostile.stdout) <= LIMITS.output_chars
        assert "root:" not in hostile.stdout
        assert neighbour.status == "ok" and neighbour.outputs == (f"[{i}, {2 * i}]",), (name, neighbour)
    assert os.getcwd() and os.path.isdir("/proc/self")  # the parent still runs


# ------------------------------------------------------------------------------------------------
# the OS limits alone (the allowlist off)
# ------------------------------------------------------------------------------------------------

UNCHECKED_SAFE = [  # harmless to the machine whether or not the uid drops
    ("infinite loop", "def f():\n    while True:\n        pass", {"timeout"}),
    ("memory bomb", "def f():\n    return bytearray(10 ** 10)", {"memory"}),
    ("memory growth", "def f():\n    x = []\n    while True:\n        x.append(' ' * 10 ** 6)", {"memory"}),
    ("raw output flood", "import os\ndef f():\n    while True:\n        os.write(1, b'x' * 65536)", {"output_limit"}),
    (
        "signal handlers",
        (
            "import signal\ndef f():\n    signal.signal(signal.SIGPROF, signal.SIG_IGN)\n"
            "    signal.signal(signal.SIGXCPU, signal.SIG_IGN)\n    while True:\n        pass"
        ),
        {"timeout"},
    ),
    (
        "timer reset",
        "import signal\ndef f():\n    signal.setitimer(signal.ITIMER_PROF, 0)\n    while True:\n        pass",
        {"timeout"},
    ),
    (
        "big file in its directory",
        "def f():\n    with open('big', 'wb') as fh:\n        fh.write(b'x' * 10 ** 6)\n    return 1",
        {"error"},
    ),
]


def test_os_limits_hold_without_the_allowlist(clean):
    box = Sandbox(LIMITS, workers=2, ast_check=False, tmp_dir=clean)
    results = box.run_many([job(source) for _, source, _ in UNCHECKED_SAFE])
    for (name, _, expected), result in zip(UNCHECKED_SAFE, results):
        assert result.status in expected, (name, result)
        assert result.cpu_s <= MAX_CPU_S, (name, result.cpu_s)
    assert "File too large" in results[-1].message  # RLIMIT_FSIZE


def test_wall_clock_limit_without_the_allowlist(clean):
    box = Sandbox(Limits(cpu_s=0.3, wall_s=1.0), ast_check=False, tmp_dir=clean)
    result = box.run(job("import time\ndef f():\n    time.sleep(60)\n    return 1"))
    assert result.status == "timeout" and "wall" in result.message
    assert result.cpu_s < 1.0  # it slept: the CPU limit did not fire


def test_confinement_as_root(guards):
    if os.geteuid() != 0:
        pytest.skip("the uid drop and chroot need root; without them only the resource limits hold")
    assert {"chroot", "uid", "nproc", "rlimits"} <= set(guards)


def _dangerous(parent: int, escape_dir: str) -> list[tuple[str, str, set[str]]]:
    return [
        ("fork bomb", "import os\ndef f():\n    while True:\n        os.fork()", {"error"}),
        (
            "thread bomb",
            "import threading\ndef f():\n    while True:\n        threading.Thread(target=len, args=('',)).start()",
            {"error"},
        ),
        (
            "subprocess",
            f"import subprocess\ndef f():\n    subprocess.run(['/bin/sh', '-c', 'touch {ESCAPE}'])\n    return 1",
            {"error"},
        ),
        ("os.system", f"import os\ndef f():\n    return os.system('touch {ESCAPE}')", {"ok", "error"}),
        ("read /etc/passwd", "def f():\n    return open('/etc/passwd').read()", {"error"}),
        ("write /tmp", f"def f():\n    open('{ESCAPE}', 'w').write('x')\n    return 1", {"error"}),
        (
            "write the test's directory",
            f"def f():\n    open('{escape_dir}/escaped', 'w').write('x')\n    return 1",
            {"error"},
        ),
        ("climb out", "def f():\n    open('../../../escaped', 'w').write('x')\n    return 1", {"ok", "error"}),
        ("chroot escape", "import os\ndef f():\n    os.mkdir('d')\n    os.chroot('d')\n    return 1", {"error"}),
        ("become root", "import os\ndef f():\n    os.setuid(0)\n    return 1", {"error"}),
        ("kill the parent", f"import os\ndef f():\n    os.kill({parent}, 9)\n    return 1", {"error"}),
        (
            "signal the parent's group",
            f"import os\ndef f():\n    os.killpg(os.getpgid({parent}), 15)\n    return 1",
            {"error"},
        ),
        ("new session and fork", "import os\ndef f():\n    os.setsid()\n    os.fork()\n    return 1", {"error"}),
        ("proc", "import os\ndef f():\n    return os.listdir('/proc')", {"error"}),
    ]


def test_os_limits_hold_dangerous_programs_after_the_uid_drop(clean, guards, tmp_path):
    if not {"chroot", "uid"} <= set(guards):
        pytest.skip("never run a live fork bomb or file writes without the uid drop and chroot")
    escape_dir = tmp_path / "outside"
    escape_dir.mkdir()
    before = set(os.listdir(os.getcwd()))
    box = Sandbox(LIMITS, workers=2, ast_check=False, tmp_dir=clean)
    programs = _dangerous(os.getpid(), str(escape_dir))
    jobs = []
    for i, (_, source, _) in enumerate(programs):
        jobs += [job(source), Job("def f(x):\n    return x + 1", (str(i),))]
    results = box.run_many(jobs)
    for i, (name, _, expected) in enumerate(programs):
        result, neighbour = results[2 * i], results[2 * i + 1]
        assert result.status in expected, (name, result)
        assert "root:" not in result.stdout and "root:" not in result.message
        assert neighbour.outputs == (str(i + 1),), (name, neighbour)
    assert "Resource temporarily unavailable" in results[0].message or "BlockingIOError" in results[0].message
    assert "can't start new thread" in results[2].message
    assert list(escape_dir.iterdir()) == []
    assert set(os.listdir(os.getcwd())) == before
    assert not os.path.exists(ESCAPE)


def test_network_is_cut(clean, guards):
    if "netns" not in guards:
        pytest.skip("unshare(CLONE_NEWNET) is not permitted here: the network is not cut (documented)")
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    port = server.getsockname()[1]
    try:
        box = Sandbox(LIMITS, ast_check=False, tmp_dir=clean)
        source = (
            f"import socket\ndef f():\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n    return 1"
        )
        result = box.run(job(source))
        assert result.status == "error" and "rror" in result.message, result
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing reached the parent's loopback
    finally:
        server.close()
