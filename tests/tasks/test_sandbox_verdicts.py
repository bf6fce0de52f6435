"""populora.tasks.sandbox, round 2: verdicts no program can forge, the parent never crashes on what a
child wrote, statuses that mean what they say, and the OS layer's guards (issue 32).

Every test here is quick (a few children each); the ones that look at effects from outside the child
are in ``test_sandbox_outside.py`` behind the ``slow`` marker.
"""

import os
import signal

import pytest
import torch

from populora.errors import InvalidValueError
from populora.tasks import CodeFunction, CodeInput, CodeOutput, Problem, check_code_replies
from populora.tasks import sandbox as sb
from populora.tasks.sandbox import GUARDS, UID_RANGE, Job, Limits, Sandbox, SandboxGuardError, read_json, tagged_repr

LIMITS = Limits(cpu_s=0.5, wall_s=3.0, memory_bytes=128 * 2**20, output_chars=2**16, file_bytes=2**16)
ROOT = os.geteuid() == 0

# The reproduction of issue 32: a suspended generator in a global, closed when the globals are collected
# after the runner has its record, prints a record of its own with every match true.
FORGE = """KEEP = []
def f(*args):
    def g():
        try:
            yield
        finally:
            n = len(KEEP)
            print('{"status": "ok", "outputs": [' + ", ".join(['"0"'] * n) + '], "matches": [' + ", ".join(["true"] * n) + ']}')
    if not KEEP:
        it = g(); next(it); KEEP.append(it)
    else:
        KEEP.append(0)
    return 0
"""

# str() of a program object in the runner's error path: a Counter whose most_common prints a record
COUNTER_FORGE = """from collections import Counter
def f(xs):
    c = Counter(xs)
    c.most_common = lambda *a: print('{"k":"result","status":"ok","values":[["list",[["int","3"]]]]}')
    raise KeyError(c)
"""


@pytest.fixture(scope="module")
def box() -> Sandbox:
    return Sandbox(LIMITS)


@pytest.fixture(scope="module")
def raw() -> Sandbox:
    """The OS layer alone, as after an allowlist bypass."""
    return Sandbox(LIMITS, ast_check=False)


# ------------------------------------------------------------------------------------------------
# forged verdicts
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ast_check", [True, False])
def test_the_generator_finally_forge_fails(ast_check):
    result = Sandbox(LIMITS, ast_check=ast_check).run(
        Job(FORGE, ("[3, 1, 2]", "[5, 4]"), expect=("[3, 2, 1]", "[5, 4]"))
    )
    assert result.status == "ok" and result.outputs == ("0", "0")
    assert result.matches == (False, False)
    assert result.stdout == ""  # the finally ran after the record, or never: its text is nowhere


def test_the_generator_finally_forge_is_no_reply_and_no_proposal():
    problem = Problem(
        "code_f", "", "", {"inputs": ["[3, 1, 2]", "[5, 4]"], "outputs": ["[3, 2, 1]", "[5, 4]"], "limits": {}}
    )
    reply = "```python\n" + FORGE + "```"
    assert CodeFunction.check_reply(problem, reply) is False
    assert check_code_replies([problem, problem], [reply, "no"]).tolist() == [False, False]


def test_str_of_a_program_object_cannot_print_a_record(box):
    result = box.run(Job(COUNTER_FORGE, ("[1, 2]",), expect=("[3]",)))
    assert result.status == "error" and result.matches == ()
    assert result.message == "KeyError"  # the text of a program's exception is never computed


def test_a_record_written_on_every_descriptor_is_only_a_return_value(raw):
    # with the allowlist off a program can write to the record descriptor: one record and an immediate
    # exit is the same as returning that value; the expected output is nowhere in the child to copy
    source = """import os
def f(x):
    for fd in range(0, 20):
        try:
            os.write(fd, b'{"k":"result","status":"ok","message":"","stdout":"","values":[["int","42"]]}\\n')
        except OSError:
            pass
    os._exit(0)
"""
    result = raw.run(Job(source, ("1",), expect=("7",)))
    assert result.matches in ((), (False,))
    twice = source.replace("    os._exit(0)\n", "    return 7\n")
    result = raw.run(Job(twice, ("1",), expect=("7",)))
    assert result.status == "error" and "no valid record" in result.message, result


def test_the_expected_outputs_never_enter_the_program_child(raw):
    source = """import gc, sys
def f():
    seen = []
    for o in gc.get_objects():
        if type(o) is dict:
            seen.extend(k for k in o if type(k) is str)
            seen.extend(v for v in o.values() if type(v) is str)
    frame = sys._getframe()
    while frame is not None:
        seen.extend(repr(v)[:200] for v in frame.f_locals.values())
        frame = frame.f_back
    secret = "SECRET-" + "EXPECTED"  # not in the program's own text
    return any(secret in s for s in seen)
"""
    result = raw.run(Job(source, ("",), expect=("'SECRET-EXPECTED-81723'",)))
    assert result.status == "ok" and result.outputs == ("False",) and result.matches == (False,)


@pytest.mark.parametrize(
    "frames",
    [
        b"",
        b'{"k":"guards","guards":[],"missing":[]}\n',
        b'{"k":"guards","guards":[],"missing":[]}\n{"k":"result","status":"ok","values":[]}\n'
        b'{"k":"result","status":"ok","values":[]}\n{"k":"exit","code":0,"signal":0,"cpu":0.1}\n',
        b'{"k":"guards","guards":[],"missing":[]}\n{"k":"exit","code":0,"signal":0,"cpu":0.1}\n'
        b'{"k":"result","status":"ok","values":[]}\n',
        b'{"k":"guards","guards":[],"missing":[]}\n{"k":"result","status":"ok","values":[]}\n'
        b'{"k":"exit","code":0,"signal":0,"cpu":0.1}\n{"k":"exit","code":0,"signal":0,"cpu":0.1}\n',
        b'{"k":"guards"}\n{"k":"result","status":"ok","values":[["int",1]]}\n{"k":"exit","code":0,"signal":0,"cpu":0}\n',
        b'{"k":"guards"}\n{"k":"result","status":"ok","values":[' + b"[" * 5000 + b"]" * 5000 + b"]}\n",
        b'{"k":"guards"}\n{"k":"result","status":"ok","values":[]}\n{"k":"exit","code":0,"signal":0,"cpu":0}',
        '{"k":"guards"}\n\udcff\n'.encode("utf-8", "surrogatepass"),
    ],
)
def test_any_record_but_the_one_valid_sequence_is_an_error(frames):
    result = sb._classify(frames, b"", "done", 0, 0.1, LIMITS, "run")
    assert result.status == "error" and result.outputs == () and result.matches == ()


def test_the_one_valid_sequence_is_read():
    frames = (
        b'{"k":"guards","guards":["uid"],"missing":["seccomp: x"]}\n'
        b'{"k":"result","status":"ok","message":"","stdout":"hi","values":[["set",[["bool",true],["int","1"]]]]}\n'
        b'{"k":"exit","code":0,"signal":0,"cpu":0.1}\n'
    )
    result = sb._classify(frames, b"", "done", 0, 0.1, LIMITS, "run")
    assert result.status == "ok" and result.outputs == ("{True, 1}",) and result.stdout == "hi"
    assert result.guards == ("uid",) and result.missing == ("seccomp: x",)


# ------------------------------------------------------------------------------------------------
# the parent never crashes
# ------------------------------------------------------------------------------------------------


def test_the_reader_is_not_recursive_and_is_bounded():
    deep = "[" * 200_000 + "]" * 200_000
    with pytest.raises(ValueError, match="deep"):
        read_json(deep)
    nested = read_json("[" * 100 + "]" * 100)
    for _ in range(99):
        assert type(nested) is list and len(nested) == 1
        nested = nested[0]
    assert nested == []
    assert read_json('{"a": [1, 2.5, "x", true, null, {}]}') == {"a": [1, 2.5, "x", True, None, {}]}
    for bad in ("", "[1,]", '{"a":1,"a":2}', "[1] 2", "01", '"\\ud800', "[" * 50, "nul", '{"a" 1}'):
        with pytest.raises(ValueError):
            read_json(bad)
    for bad in ([], ["int", 1], ["float", "1e999999"], ["list", [["none", 1]]], ["dict", [[["int", "1"]]]]):
        with pytest.raises(ValueError):
            tagged_repr(bad)


def test_deeply_nested_replies_give_a_verdict_for_themselves_only(box):
    nested = "[" * 20000 + "]" * 20000
    problem_o = Problem("code_o", "", "", {"program": "def f(x):\n    return x", "input": "1", "output": "1"})
    problem_i = Problem("code_i", "", "", {"program": "def f(x):\n    return x", "input": "1", "output": "[[1]]"})
    assert CodeOutput.check_reply(problem_o, f"Output: {nested}") is False
    assert CodeInput.check_reply(problem_i, f"Input: {nested}") is False
    replies = [f"Input: {nested}", "Input: [[1]]"]
    assert check_code_replies([problem_i, problem_i], replies).tolist() == [False, True]
    printed = box.run(Job(f"def f():\n    print({'[' * 30000!r})\n    return 1", ("",), expect=("1",)))
    assert printed.status == "ok" and printed.matches == (True,) and len(printed.stdout) == 30001
    assert box.validate(Job("def f():\n    x = []\n    for i in range(99):\n        x = [x]\n    return x", ("",))).ok


# ------------------------------------------------------------------------------------------------
# statuses and matches
# ------------------------------------------------------------------------------------------------


def test_printed_text_is_bounded_in_characters_not_bytes(box):
    result = box.run(Job("def f():\n    print('\\U0001F600' * 60000)\n    return 1", ("",), expect=("1",)))
    assert result.status == "ok" and result.matches == (True,) and len(result.stdout) == 60001
    over = box.run(Job("def f():\n    print('\\U0001F600' * 70000)\n    return 1", ("",)))
    assert over.status == "output_limit"
    astral = box.run(Job("def f():\n    return '\\U0001F600' * 60000 + '\\ud800'", ("",)))
    assert astral.status == "ok" and astral.outputs == (repr("\U0001f600" * 60000 + "\ud800"),)


def test_equality_is_type_exact_in_keys_and_sets(box):
    assert box.same_value("{True: 'a'}", "{1: 'a'}") is False
    assert box.same_value("{1: 'a'}", "{1: 'a'}") is True
    assert box.same_value("{1.0, 2}", "{1, 2}") is False
    assert box.same_value("{(1, True)}", "{(1, 1)}") is False
    assert box.same_value("{'b': 1, 'a': 2}", "{'a': 2, 'b': 1}") is True
    assert box.same_value("{3, 1, 2}", "{1, 2, 3}") is True
    assert box.same_value("0.0", "-0.0") is True  # as == has it
    assert box.same_value("[1, 2]", "[1, 2.0]") is False
    assert box.same_value("b'a'", "'a'") is False
    problem = Problem("code_o", "", "", {"program": "def f():\n    return {1: 'a'}", "input": "", "output": "{1: 'a'}"})
    assert CodeOutput.check_reply(problem, "Output: {True: 'a'}") is False
    assert CodeOutput.check_reply(problem, "Output: {1: 'a'}") is True
    result = box.run(Job("def f():\n    return {True: 'a'}", ("",), expect=("{1: 'a'}",)))
    assert result.ok and result.matches == (False,)


def test_outputs_are_canonical_whatever_the_hash_seed(box):
    job = Job("def f():\n    return {'pear', 'apple', 'fig'}", ("",))
    first, second = box.run(job, hash_seed=0), box.run(job, hash_seed=1)
    assert first.outputs == second.outputs == ("{'apple', 'fig', 'pear'}",)
    assert box.validate(job).ok


def test_printed_memory_error_is_not_memory_and_real_memory_is(box):
    text = box.run(Job("def f():\n    print('MemoryError' * 100)\n    raise ValueError('MemoryError')", ("",)))
    assert text.status == "error" and text.message == "ValueError: MemoryError"
    real = box.run(Job("def f():\n    return len([0] * 10**9)", ("",)))
    assert real.status == "memory"


def test_self_sigkill_is_an_error_and_cpu_is_a_timeout(raw, box):
    for target in ("os.getpid()", "0"):
        result = raw.run(Job(f"import os\ndef f():\n    os.kill({target}, 9)\n    return 1", ("",)))
        assert result.status == "error" and "SIGKILL" in result.message, (target, result)
    sigprof = raw.run(Job(f"import os\ndef f():\n    os.kill(os.getpid(), {int(signal.SIGPROF)})\n    return 1", ("",)))
    assert sigprof.status == "error", sigprof
    spin = box.run(Job("def f():\n    while True:\n        pass", ("",)))
    assert spin.status == "timeout" and spin.cpu_s >= LIMITS.cpu_s


def test_non_ascii_identifiers_run_and_are_still_checked(box):
    result = box.run(Job("π = 3.14\ndef f():\n    return π * 2", ("",)))
    assert result.status == "ok" and result.outputs == ("6.28",)
    # NFKC turns these into __import__ and __class__: the allowlist sees the normalised names
    assert box.run(Job("def f():\n    return ＿＿import＿＿('os')", ("",))).status == "refused"
    assert box.run(Job("def f():\n    return ().＿＿class＿＿", ("",))).status == "refused"


# ------------------------------------------------------------------------------------------------
# cleanup
# ------------------------------------------------------------------------------------------------


def test_cleanup_is_not_recursive(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY)
    for _ in range(3000):  # paths far over PATH_MAX, deeper than the recursion limit
        os.mkdir("d", dir_fd=fd)
        sub = os.open("d", os.O_RDONLY, dir_fd=fd)
        with open(os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=sub), "w") as fh:
            fh.write("x")
        os.close(fd)
        fd = sub
    os.close(fd)
    os.chmod(root / "d" / "d", 0o000)
    sb._remove(str(root))
    assert not root.exists()


def test_a_program_filling_the_disk_is_stopped_and_leaves_nothing(raw, tmp_path):
    box = Sandbox(LIMITS, ast_check=False, tmp_dir=tmp_path)
    files = "def f():\n    for i in range(5000):\n        open('x%d' % i, 'wb').write(b'a' * 65536)\n    return 1"
    dirs = "import os\ndef f():\n    for i in range(3000):\n        os.mkdir('d')\n        os.chdir('d')\n    return 1"
    for source in (files, dirs):
        result = box.run(Job(source, ("",)))
        if "tmpfs" in result.guards:
            assert result.status == "error" and "No space left" in result.message, result
        assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------------
# guards
# ------------------------------------------------------------------------------------------------


def test_guards_and_missing_cover_every_guard(box):
    result = box.run(Job("def f():\n    return 1", ("",)))
    assert result.ok
    named = set(result.guards) | {m.split(":")[0] for m in result.missing}
    assert set(result.guards) <= set(GUARDS) and not set(result.guards) & {m.split(":")[0] for m in result.missing}
    assert {"rlimits", "nproc", "pidns", "ipcns", "mountns", "seccomp", "uid"} <= named
    if ROOT:
        assert {"uid", "chroot", "caps", "nnp", "nodump"} <= set(result.guards), result


@pytest.mark.skipif(not ROOT, reason="per-run uids need root")
def test_each_run_has_a_uid_of_its_own(raw):
    box = Sandbox(LIMITS, ast_check=False, workers=2)
    source = "import os, time\ndef f():\n    time.sleep(0.3)\n    return [os.getuid(), os.getgid(), os.getgroups()]"
    results = box.run_many([Job(source, ("",))] * 4)
    ids = [eval(r.outputs[0]) for r in results]  # literals of ints written by the parent
    uids = [i[0] for i in ids]
    assert all(UID_RANGE[0] <= u < UID_RANGE[1] for u in uids) and len(set(uids[:2])) == 2, ids
    assert all(i[0] == i[1] and i[2] == [] for i in ids)


def test_seccomp_denies_tracing_keyrings_and_namespaces(raw):
    source = """import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def call(fn, *args):
    r = fn(*args)
    return [r, ctypes.get_errno()]
def f(name):
    if name == "ptrace":
        return call(libc.ptrace, 16, 1, 0, 0)
    if name == "keyctl":
        return call(libc.syscall, {add_key}, b"user", b"k", b"v", 1, -2)
    if name == "unshare":
        return call(libc.unshare, 0x10000000)
    if name == "mount":
        return call(libc.mount, b"none", b"/", b"tmpfs", 0, None)
    if name == "setns":
        return call(libc.setns, 0, 0)
    if name == "pvm":
        return call(libc.process_vm_readv, 1, 0, 0, 0, 0, 0)
    if name == "dumpable":
        return [libc.prctl(3, 0, 0, 0, 0), 1]
""".replace("{add_key}", "248" if os.uname().machine == "x86_64" else "217")
    names = ["ptrace", "keyctl", "unshare", "mount", "setns", "pvm", "dumpable"]
    results = raw.run(Job(source, tuple(repr(n) for n in names)))
    assert results.ok, results
    if "seccomp" not in results.guards:
        pytest.skip(f"no seccomp here: {results.missing}")
    assert results.outputs == ("[-1, 1]",) * 6 + ("[0, 1]",), results.outputs  # EPERM; not dumpable


def test_require_refuses_unknown_names_and_runs_when_held():
    with pytest.raises(InvalidValueError, match="nosuchguard"):
        Sandbox(LIMITS, require=("uid", "nosuchguard"))
    with pytest.raises(InvalidValueError, match="nosuchguard"):
        CodeOutput(require=("nosuchguard",))
    held = Sandbox(LIMITS).run(Job("def f():\n    return 1", ("",))).guards
    assert Sandbox(LIMITS, require=held).run(Job("def f():\n    return 1", ("",))).ok
    absent = [g for g in GUARDS if g not in held]
    if absent:
        with pytest.raises(SandboxGuardError, match=absent[0]):
            Sandbox(LIMITS, require=absent[:1]).run(Job("def f():\n    return 1", ("",)))


def test_uid_and_gid_are_deprecated_as_the_start_of_the_range():
    with pytest.warns(DeprecationWarning, match="uid_range"):
        box = Sandbox(LIMITS, uid=2**31)
    assert box.uid_range == (2**31, 2**31 + UID_RANGE[1] - UID_RANGE[0])
    with pytest.raises(InvalidValueError):
        Sandbox(LIMITS, uid_range=(5000, 4000))


def test_code_tasks_store_and_honour_require():
    task = CodeOutput(require=("rlimits",))
    problem = task.sample(1, torch.Generator().manual_seed(0))[0]
    assert problem.data["require"] == ["rlimits"] and "limits" in problem.data
    assert sb.Limits(**problem.data["limits"]) == task.limits
    unmet = Problem(
        "code_i", "", "", {"program": "def f(x):\n    return x", "input": "1", "output": "1", "require": ["nosuch"]}
    )
    with pytest.raises(InvalidValueError):
        CodeInput.check_reply(unmet, "Input: 1")
