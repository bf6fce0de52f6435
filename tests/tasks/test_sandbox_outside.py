"""populora.tasks.sandbox seen from outside the child (issue 32): a hostile corpus run with the allowlist
on and off against canaries (a secret file, a secret in the parent's environment and in another
process's, a listener, SysV IPC objects, the run directory), and the non-root mode run as an
unprivileged user. Slow: behind the ``slow`` marker."""

import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import uuid

import pytest

from populora.tasks.sandbox import Job, Limits, Sandbox

pytestmark = pytest.mark.slow

LIMITS = Limits(cpu_s=0.5, wall_s=2.0, memory_bytes=128 * 2**20, output_chars=4096, file_bytes=4096)
SECRET = f"canary-{uuid.uuid4().hex}"

# each program tries one way out; with the allowlist on most are refused, with it off the OS layer holds
HOSTILE = {
    "read canary": "def f(p):\n    return open(p).read()",
    "environ": "import os\ndef f(p):\n    return dict(os.environ)",
    "proc environ": "import os\ndef f(p):\n    return [open(f'/proc/{d}/environ').read() for d in os.listdir('/proc')]",
    "victim environ": "def f(p):\n    return open('/proc/%d/environ' % VICTIM).read()",
    "kill all": "import os\ndef f(p):\n    os.kill(-1, 9)\n    return 1",
    "kill victim": "import os\ndef f(p):\n    os.kill(VICTIM, 9)\n    return 1",
    "ptrace victim": "import ctypes\ndef f(p):\n    return ctypes.CDLL(None).ptrace(16, VICTIM, 0, 0)",
    "tcp": "import socket\ndef f(p):\n    s = socket.create_connection(('127.0.0.1', PORT), 1)\n    return 1",
    "shm": "import ctypes\ndef f(p):\n    libc = ctypes.CDLL(None)\n    return [libc.shmget(4242, 1 << 20, 0o1666), libc.msgget(4243, 0o1666)]",
    "keyring": "import ctypes\ndef f(p):\n    return ctypes.CDLL(None).syscall(248, b'user', b'k', b'v', 1, -2)",
    "write out": "def f(p):\n    open(ESCAPE, 'w').write('x')\n    return 1",
    "deep dirs": "import os\ndef f(p):\n    for i in range(3000):\n        os.mkdir('d')\n        os.chdir('d')\n    return 1",
    "fork": "import os\ndef f(p):\n    return os.fork()",
    "forge": "KEEP = []\ndef f(p):\n    def g():\n        try:\n            yield\n        finally:\n"
    '            print(\'{"status": "ok", "outputs": ["0"], "matches": [true]}\')\n'
    "    it = g(); next(it); KEEP.append(it)\n    return 0",
}


def _ipc_ids() -> set[str]:
    ids = set()
    for name in ("shm", "msg", "sem"):
        with open(f"/proc/sysvipc/{name}") as fh:
            ids |= {f"{name}:{line.split()[1]}" for line in list(fh)[1:]}
    return ids


@pytest.mark.skipif(os.geteuid() != 0, reason="the canaries need a second uid: run as root")
@pytest.mark.parametrize("ast_check", [True, False])
def test_hostile_corpus_holds_from_outside(tmp_path, monkeypatch, ast_check):
    canary = tmp_path / "canary"
    canary.write_text(SECRET)
    canary.chmod(0o600)
    escape = tmp_path / "open"
    escape.mkdir()
    escape.chmod(0o777)
    monkeypatch.setenv("POPULORA_CANARY", SECRET)
    victim = subprocess.Popen(
        ["sleep", "60"], env={"SECRET": SECRET}, user=65534, group=65534, extra_groups=[], start_new_session=True
    )
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    runs = tmp_path / "runs"
    runs.mkdir()
    ipc_before = _ipc_ids()
    try:
        box = Sandbox(LIMITS, ast_check=ast_check, workers=2, tmp_dir=runs)
        jobs = []
        for source in HOSTILE.values():
            source = (
                source.replace("VICTIM", str(victim.pid))
                .replace("PORT", str(listener.getsockname()[1]))
                .replace("ESCAPE", repr(str(escape / "x")))
            )
            jobs.append(Job(source, (repr(str(canary)),), expect=(repr(SECRET),)))
        results = box.run_many(jobs)
        for name, result in zip(HOSTILE, results):
            text = " ".join((*result.outputs, result.stdout, result.message))
            assert SECRET not in text, (name, result)
            assert result.matches in ((), (False,)), (name, result)
        assert victim.poll() is None, "the victim of the sandbox's old uid was killed"
        with pytest.raises(BlockingIOError):
            listener.accept()
        assert not (escape / "x").exists()
        assert list(runs.iterdir()) == []
        assert _ipc_ids() - ipc_before == set()
        assert os.environ["POPULORA_CANARY"] == SECRET and os.getcwd() == os.getcwd()
    finally:
        victim.kill()
        victim.wait()
        listener.close()


_NON_ROOT = """
import os, sys
from populora.tasks.sandbox import Job, Limits, Sandbox, SandboxGuardError
assert os.geteuid() != 0
limits = Limits(cpu_s=0.5, wall_s=3.0)
result = Sandbox(limits, tmp_dir=sys.argv[1]).run(Job("def f(x):\\n    return x * 2", ("21",), expect=("42",)))
print("OK", result.status, result.matches, sorted(result.guards), [m.split(":")[0] for m in result.missing])
raw = Sandbox(limits, ast_check=False, tmp_dir=sys.argv[1]).run(
    Job("import os\\ndef f():\\n    return [os.listdir('/'), os.getpid()]", ("",)))
print("RAW", raw.status, raw.outputs)
try:
    Sandbox(limits, require=("uid",), tmp_dir=sys.argv[1]).run(Job("def f():\\n    return 1", ("",)))
    print("REQUIRE ran")
except SandboxGuardError as exc:
    print("REQUIRE refused", "uid" in str(exc))
"""


def _harness(tmp_path) -> tuple[str, str] | str:
    """An interpreter an unprivileged user can run and a PYTHONPATH holding the sandbox, or why not."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    candidates = [sys.executable, "/usr/bin/python3", os.path.realpath(shutil.which("python3") or "/nonexistent")]
    # the sandbox starts sys.executable again: the user must be able to, from inside it too
    probe = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'pass'], check=True); import "
    for python in candidates:
        for module, path in (("torch", here), ("os", "")):
            ran = subprocess.run(
                ["setpriv", "--reuid=54321", "--regid=54321", "--clear-groups", python, "-c", probe + module],
                capture_output=True,
            )
            if ran.returncode != 0:
                continue
            if path:
                return python, path
            # an interpreter without the library's dependencies: the sandbox's two modules and stand-ins
            # of what they import (populora.checks imports torch, for the tensor checks unused here)
            pkg = tmp_path / "pkg"
            (pkg / "populora" / "tasks").mkdir(parents=True)
            (pkg / "populora" / "__init__.py").write_text("")
            (pkg / "populora" / "tasks" / "__init__.py").write_text("")
            (pkg / "torch.py").write_text("class Tensor:\n    pass\n")
            for rel in ("errors.py", "checks.py", "tasks/sandbox.py", "tasks/_runner.py"):
                shutil.copy(os.path.join(here, "populora", rel), pkg / "populora" / rel)
            subprocess.run(["chmod", "-R", "a+rX", str(tmp_path)], check=True)
            return python, str(pkg)
    return f"no interpreter that uid 54321 can run among {candidates}"


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_non_root_mode_as_an_unprivileged_user():
    # a directory of its own that the unprivileged user can reach (pytest's tmp_path is under a 0700 one)
    tmp_path = pathlib.Path(tempfile.mkdtemp(prefix="populora-nonroot-"))
    tmp_path.chmod(0o755)
    try:
        _non_root(tmp_path)
    finally:
        shutil.rmtree(tmp_path)


def _non_root(tmp_path: pathlib.Path) -> None:
    found = _harness(tmp_path)
    if isinstance(found, str):
        pytest.skip(found)
    python, path = found
    runs = tmp_path / "runs"
    runs.mkdir()
    runs.chmod(0o777)
    out = subprocess.run(
        ["setpriv", "--reuid=54321", "--regid=54321", "--clear-groups", python, "-c", textwrap.dedent(_NON_ROOT)]
        + [str(runs)],
        env={"PYTHONPATH": path, "HOME": str(tmp_path), "PATH": os.environ.get("PATH", "")},
        cwd=tmp_path,  # `-c` puts the working directory first on sys.path
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    assert lines["OK"].startswith("ok (True,)"), out.stdout
    assert "'uid'" in lines["OK"].split("] [")[1], out.stdout  # named as missing, with its reason
    if "userns" in lines["OK"]:
        assert {"'pidns'", "'chroot'", "'seccomp'"} <= set(lines["OK"].split("] [")[0].strip("[").split(", "))
        assert lines["RAW"] == "ok ('[[], 2]',)", out.stdout  # an empty root of its own, PID 2 of its namespace
    assert lines["REQUIRE"] == "refused True", out.stdout
    assert list(runs.iterdir()) == []
