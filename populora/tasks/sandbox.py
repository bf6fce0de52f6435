"""A sandboxed executor for small model-written Python programs: the verifier of the code tasks.

It runs model-written code, so it is a security boundary. The library's process never compiles,
parses or executes program text: it writes a job file, starts one fresh interpreter per program and
reads back at most a bounded number of bytes of JSON.

How one program runs (:meth:`Sandbox.run`)
    1. The parent checks only sizes (text lengths, no parsing), makes a fresh directory (mode 0700),
       writes the job (``marshal`` of plain strings and numbers, never the expected outputs) into it
       and, as root, reserves a uid of its own for the run (a file per uid, locked with ``flock``, under
       ``/run/populora-sandbox/uids``, from :data:`UID_RANGE`, 2^30 upward: two sandboxes of one
       host never share one).
    2. It starts ``sys.executable -s -S -B -P populora/tasks/_runner.py`` (:data:`RUNNER_PATH`, a
       module file importing only the standard library) in that directory, in a new session, with
       an empty environment but ``PYTHONHASHSEED``, stdin from ``/dev/null``, stdout + stderr on one
       pipe (read only for diagnostics) and a second pipe, the record descriptor.
    3. The runner (R) reads and deletes the job, imports what programs may use (and ``unicodedata``,
       which NFKC normalisation of non-ASCII identifiers needs), joins the empty network namespace
       that the parent made once per process, makes new PID, IPC and mount namespaces, mounts a tmpfs
       of ``disk_bytes`` / ``disk_files`` on the run directory (which hides it) and chroots into it.
       With a PID namespace it forks a reaper (PID 1 of the namespace) that forks the program's
       process (P, PID 2: the CPU timer's ``SIGPROF`` kills it as any process); else it forks P.
    4. P takes the run's uid and gid with no groups, drops every capability, sets ``no_new_privs``,
       ``PR_SET_DUMPABLE`` 0, the parent-death signal, the resource limits (``RLIMIT_AS``,
       ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``, ``RLIMIT_NPROC`` 0, ``RLIMIT_MSGQUEUE`` 0, ``RLIMIT_CORE``
       0, ``ITIMER_PROF`` + ``RLIMIT_CPU``) and a seccomp filter (classic BPF installed with
       ``prctl`` through ``ctypes``) that denies ``ptrace``, ``process_vm_readv`` / ``writev``,
       ``keyctl`` / ``add_key`` / ``request_key``, ``unshare``, ``setns``, ``mount`` and the other
       mount calls, ``chroot``, ``perf_event_open``, ``bpf``, ``userfaultfd``, ``kcmp``,
       ``io_uring_setup`` and ``clone`` with a namespace flag (``clone3`` answers ENOSYS). It writes
       the ``guards`` frame, and only then reads program text: the allowlist below (refusal is status
       ``refused``), ``compile``, ``exec`` with a restricted builtins table, one call of ``f`` per
       input. Every return value must be a plain literal (exact ``int float bool str bytes None list
       tuple dict set``, at most 100 deep) that reads back with ``ast.literal_eval``; P writes each as
       canonical type-tagged JSON in one ``result`` frame and ends with ``os._exit`` at once, so no
       finaliser, generator ``finally:``, ``atexit`` or buffered flush runs after its record.
    5. The process that forked P writes the ``exit`` frame (P's wait status). The parent reads at
       most a bound of bytes from each pipe before ``wall_s``, kills the process group (the PID
       namespace dies with its reaper), reaps the child (``wait4``: its CPU time is reported),
       removes the directory without recursion and releases the uid.
    6. The verdict is the parent's: it reads the record with :func:`read_json` (no recursion,
       bounded depth), accepts exactly ``guards, result, exit`` (or ``guards, exit`` for a program
       that died), writes the outputs from the tagged values (:func:`tagged_repr`: sets and dicts
       in canonical order) and compares them with the expected outputs, which a separate child
       that runs no program encodes: type-exact, ``1``, ``1.0`` and ``True`` differ, also as dict
       keys and in sets. Printed text is bounded in characters (``output_chars``).

The modes (what :attr:`RunResult.guards` holds; :attr:`RunResult.missing` says why a guard is absent)
    ========================  ======================================================================
    mode                      guards
    ========================  ======================================================================
    root                      ``netns pidns ipcns mountns tmpfs chroot uid caps nnp nodump rlimits
                              nproc seccomp``: a uid per run, no uid separation lost anywhere
    not root, user namespaces ``userns netns pidns ipcns mountns tmpfs chroot caps nnp nodump
                              rlimits nproc seccomp``; ``uid`` missing: the program runs as the
                              parent's own uid (the PID namespace, chroot and seccomp isolate it)
    neither                   ``caps nnp nodump rlimits nproc seccomp`` (seccomp where the kernel
                              has it); no chroot, no namespaces: the allowlist is the file-system
                              barrier
    ========================  ======================================================================

    A guard the kernel refuses (a restricted container's seccomp profile refusing ``unshare``, an
    architecture with no filter here) is left out with its reason; ``Sandbox(require=(...))`` (and
    the code tasks' ``require=``) raises :class:`SandboxGuardError` instead of running with fewer.

The AST allowlist (:data:`ALLOWED_MODULES` and the deny lists below)
    Statements and expressions of plain functions only: no ``class``, ``with``, ``async``,
    ``await``, ``match``, ``global`` is allowed. Imports only of :data:`ALLOWED_MODULES` (``import
    math``, ``from collections import Counter``; no relative or ``*`` imports), each seen by the
    program as a copy that holds only an allowlisted set of its public attributes (no submodules, no
    ``operator.attrgetter``, no ``string.Formatter``, ...). No name starting with ``__`` and none of
    :data:`DENIED_NAMES` (``open exec eval compile getattr setattr globals locals vars dir type
    object super id input breakpoint ...``); no attribute starting with ``_`` and none of
    :data:`DENIED_ATTRIBUTES` (``format`` / ``format_map``, which reach attributes by string, and the
    frame and code attributes of generators, coroutines and tracebacks). The builtins table holds
    only :data:`SAFE_BUILTINS`. So ``().__class__.__bases__``, ``__import__('os')``,
    ``"{0.__class__}".format(x)``, ``(x for x in ()).gi_frame.f_back`` are refused before anything
    runs.

Statuses (:data:`STATUSES`)
    ``ok``; ``refused`` (the allowlist, a syntax error, an input that is not a literal argument list,
    no function ``f``, or a text over the size bounds: nothing of the program ran); ``timeout`` (CPU
    or wall clock); ``memory`` (``MemoryError``); ``output_limit`` (printed text or an output longer
    than ``output_chars``, or more bytes on the pipe than the parent reads); ``error`` (the program
    raised, returned something that is not a plain literal, or the runner could not set up);
    ``nondeterministic`` (:meth:`Sandbox.validate`: two runs with ``PYTHONHASHSEED`` 0 and 1 differ).
    A program killed by ``SIGPROF`` / ``SIGXCPU`` / ``SIGKILL`` is ``timeout`` only when it used its CPU
    time (a program that kills itself is ``error``); ``memory`` comes only from a ``MemoryError`` the
    runner caught, never from printed text.

What is guaranteed
    - No output of any program makes a public function of the sandbox or the code tasks raise: a
      record that is not the one valid sequence of frames is status ``error`` for its run only.
    - A program cannot forge its verdict: the expected outputs are never in its process, and all it
      can put in its record, even outside the allowlist, is values it could have returned.
    - As root, every program runs as a uid no other process uses, in PID, IPC and mount namespaces
      of its own (it sees no other process, and its SysV IPC objects and files die with it), in a
      chroot of a tmpfs bounded in bytes and files, without capabilities, unable to trace anything
      or use a keyring, held to ``cpu_s``, ``memory_bytes``, ``wall_s`` and ``output_chars``.
    - Under the allowlist a program reaches no module that touches files, processes, signals or
      sockets; the OS layer holds whether or not it is on (``ast_check=False``, a switch for tests).
    - Not guaranteed: protection against kernel or interpreter bugs; a constant CPU cost.

Cost
    One child costs about 25-30 ms of CPU on the machine of the 0.6.0 measurement, where the new
    sandbox ran 0.84 (1 worker) and 0.85 (2 workers) of 0.5.0's programs per second
    (``benchmarks/sandbox.py``, both in one process).

Example:
    >>> sandbox = Sandbox(Limits(cpu_s=1.0, wall_s=10.0))
    >>> sandbox.run(Job("def f(xs):\\n    return sorted(xs)[::-1]", ("[3, 1, 2]",))).outputs
    ('[3, 2, 1]',)
    >>> sandbox.run(Job("def f():\\n    return ().__class__", ("",))).status
    'refused'
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import marshal
import os
import re
import secrets
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from populora.checks import check_bool, check_float, check_int
from populora.errors import InvalidTypeError, InvalidValueError, PopuloraError

__all__ = [
    "ALLOWED_MODULES",
    "DENIED_ATTRIBUTES",
    "DENIED_NAMES",
    "GUARDS",
    "RUNNER_PATH",
    "SAFE_BUILTINS",
    "STATUSES",
    "UID_RANGE",
    "Job",
    "Limits",
    "RunResult",
    "Sandbox",
    "SandboxGuardError",
    "read_json",
    "tagged_repr",
]

STATUSES = ("ok", "refused", "timeout", "memory", "output_limit", "error", "nondeterministic")

#: The modules a program may import, each with the public names it sees (``None``: every public
#: attribute that is not a module).
ALLOWED_MODULES: dict[str, tuple[str, ...] | None] = {
    "math": None,
    "itertools": None,
    "heapq": None,
    "bisect": None,
    "functools": ("cache", "cmp_to_key", "lru_cache", "partial", "reduce"),
    "collections": ("Counter", "OrderedDict", "defaultdict", "deque", "namedtuple"),
    "string": (
        "ascii_letters",
        "ascii_lowercase",
        "ascii_uppercase",
        "capwords",
        "digits",
        "hexdigits",
        "octdigits",
        "punctuation",
        "whitespace",
    ),
    "re": (
        "A",
        "ASCII",
        "I",
        "IGNORECASE",
        "M",
        "MULTILINE",
        "S",
        "DOTALL",
        "X",
        "VERBOSE",
        "compile",
        "escape",
        "findall",
        "finditer",
        "fullmatch",
        "match",
        "search",
        "split",
        "sub",
        "subn",
    ),
    "operator": (
        "abs",
        "add",
        "and_",
        "concat",
        "contains",
        "countOf",
        "eq",
        "floordiv",
        "ge",
        "gt",
        "indexOf",
        "inv",
        "invert",
        "itemgetter",
        "le",
        "lshift",
        "lt",
        "mod",
        "mul",
        "ne",
        "neg",
        "not_",
        "or_",
        "pos",
        "pow",
        "rshift",
        "sub",
        "truediv",
        "truth",
        "xor",
    ),
    "typing": (
        "Any",
        "Callable",
        "DefaultDict",
        "Deque",
        "Dict",
        "FrozenSet",
        "Iterable",
        "Iterator",
        "List",
        "Mapping",
        "Optional",
        "Sequence",
        "Set",
        "Tuple",
        "Union",
    ),
}

#: The builtins a program sees (with ``__import__`` limited to :data:`ALLOWED_MODULES`).
SAFE_BUILTINS = (
    "abs",
    "all",
    "any",
    "ascii",
    "bin",
    "bool",
    "bytes",
    "callable",
    "chr",
    "dict",
    "divmod",
    "enumerate",
    "filter",
    "float",
    "frozenset",
    "hash",
    "hex",
    "int",
    "isinstance",
    "issubclass",
    "iter",
    "len",
    "list",
    "map",
    "max",
    "min",
    "next",
    "oct",
    "ord",
    "pow",
    "print",
    "range",
    "repr",
    "reversed",
    "round",
    "set",
    "slice",
    "sorted",
    "str",
    "sum",
    "tuple",
    "zip",
    "ArithmeticError",
    "AssertionError",
    "Exception",
    "IndexError",
    "KeyError",
    "LookupError",
    "NotImplementedError",
    "OverflowError",
    "RecursionError",
    "RuntimeError",
    "StopIteration",
    "TypeError",
    "ValueError",
    "ZeroDivisionError",
)

#: Names a program may not use (besides every name that starts with ``__``).
DENIED_NAMES = frozenset(
    {
        "open",
        "exec",
        "eval",
        "compile",
        "getattr",
        "setattr",
        "delattr",
        "hasattr",
        "globals",
        "locals",
        "vars",
        "dir",
        "input",
        "breakpoint",
        "help",
        "type",
        "object",
        "super",
        "id",
        "memoryview",
        "exit",
        "quit",
        "classmethod",
        "staticmethod",
        "property",
        "copyright",
        "credits",
        "license",
    }
)

#: Attributes a program may not read or write (besides every attribute that starts with ``_``).
DENIED_ATTRIBUTES = frozenset(
    {
        "format",
        "format_map",
        "mro",
        "register",
        "registry",
        "dispatch",
        "attrgetter",
        "methodcaller",
        "gi_frame",
        "gi_code",
        "gi_yieldfrom",
        "gi_running",
        "gi_suspended",
        "cr_frame",
        "cr_code",
        "cr_await",
        "cr_running",
        "cr_origin",
        "cr_suspended",
        "ag_frame",
        "ag_code",
        "ag_await",
        "ag_running",
        "f_back",
        "f_builtins",
        "f_code",
        "f_globals",
        "f_locals",
        "f_trace",
        "f_lasti",
        "f_lineno",
        "tb_frame",
        "tb_next",
        "tb_lasti",
        "tb_lineno",
        "co_code",
        "co_consts",
        "co_names",
        "co_varnames",
        "co_filename",
    }
)

# Extra modules a program may import when the allowlist is off (tests of the OS limits): a fixed list,
# imported before the privileges drop, so that no program text names a module imported as root.
_UNCHECKED_PRELOAD = ("os", "sys", "socket", "signal", "time", "resource", "gc", "threading", "subprocess")

MAX_SOURCE_CHARS = 100_000
MAX_TEXT_CHARS = 100_000  # all the inputs and expected outputs of one job together
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# The empty network namespace of this process's sandboxes: a descriptor, made once (module docstring).
_NETNS_LOCK = threading.Lock()
_NETNS_FD: int | None = None  # -1: it cannot be made here
_NETNS_HELPER = r"""
import ctypes, sys
ok = ctypes.CDLL(None, use_errno=True).unshare(0x40000000) == 0
sys.stdout.write("ok\n" if ok else "no\n")
sys.stdout.flush()
sys.stdin.read()
"""

#: The runner, a module file of its own that the child interpreter runs by path (module docstring).
RUNNER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_runner.py")

#: Every guard :attr:`RunResult.guards` can name (the modes table of the module docstring).
GUARDS = (
    "rlimits",
    "nproc",
    "netns",
    "pidns",
    "ipcns",
    "mountns",
    "tmpfs",
    "chroot",
    "userns",
    "uid",
    "caps",
    "nnp",
    "nodump",
    "seccomp",
)

#: The default range of per-run user and group ids (as root): far above any uid a distribution hands out.
UID_RANGE = (2**30, 2**30 + 2**16)

# Where the per-uid lock files live: one directory per machine, so that every Sandbox of the host
# (several processes, several jobs) reserves from the same set.
_LOCK_DIR = "/run/populora-sandbox/uids"

# of the JSON the parent reads: a tagged value is two JSON levels per level of the value (at most 101),
# plus the frame around it
_MAX_DEPTH = 2 * 101 + 4


class SandboxGuardError(PopuloraError, RuntimeError):
    """A guard that ``Sandbox(require=...)`` asked for cannot be had on this machine (raised before any
    program text is read)."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one program run.

    Args:
        cpu_s: CPU seconds (user + system) of the child, interpreter start-up included (> 0, <= 600).
        wall_s: wall-clock seconds from start to exit, enforced by the parent (>= cpu_s).
        memory_bytes: address space of the child (``RLIMIT_AS``; the interpreter takes about 20 MB).
        output_chars: characters of printed text, and of each output's ``repr``.
        file_bytes: bytes of any one file the child writes (``RLIMIT_FSIZE``).
        open_files: file descriptors (``RLIMIT_NOFILE``).
        disk_bytes: bytes of all the files of a run together (the size of its tmpfs, where one is had).
        disk_files: files and directories of a run together (the tmpfs's inodes).
    """

    cpu_s: float = 1.0
    wall_s: float = 5.0
    memory_bytes: int = 256 * 2**20
    output_chars: int = 2**16
    file_bytes: int = 2**16
    open_files: int = 16
    disk_bytes: int = 2**22
    disk_files: int = 256

    def __post_init__(self) -> None:
        check_float("cpu_s", self.cpu_s, low=0.0, high=600.0, low_open=True)
        check_float("wall_s", self.wall_s, low=0.0, high=3600.0, low_open=True)
        if self.wall_s < self.cpu_s:
            raise InvalidValueError(f"`wall_s` must be >= `cpu_s` ({self.cpu_s}), got {self.wall_s}")
        check_int("memory_bytes", self.memory_bytes, low=32 * 2**20, high=2**40)
        check_int("output_chars", self.output_chars, low=16, high=2**26)
        check_int("file_bytes", self.file_bytes, low=0, high=2**40)
        check_int("open_files", self.open_files, low=4, high=2**16)
        check_int("disk_bytes", self.disk_bytes, low=2**16, high=2**40)
        check_int("disk_files", self.disk_files, low=4, high=2**20)


@dataclass(frozen=True)
class Job:
    """One program and the calls to make.

    Args:
        source: the program text (model-written: never parsed in this process).
        inputs: one argument list per call of ``entry``, as Python literals: ``"[1, 2], 3"`` calls
            ``f([1, 2], 3)``; ``""`` calls ``f()``.
        expect: None, or one expected output per input (a literal); the result's ``matches`` says
            whether each output equals it (same types and values all the way down).
        entry: the name of the function to call.
    """

    source: str
    inputs: tuple[str, ...] = ()
    expect: tuple[str, ...] | None = None
    entry: str = "f"

    def __post_init__(self) -> None:
        if not isinstance(self.source, str):
            raise InvalidTypeError(f"`source` must be a str, got {type(self.source).__name__}")
        for name in ("inputs", "expect"):
            value = getattr(self, name)
            if value is None and name == "expect":
                continue
            if isinstance(value, str) or not isinstance(value, Sequence):
                raise InvalidTypeError(f"`{name}` must be a sequence of str, got {type(value).__name__}")
            if not all(isinstance(v, str) for v in value):
                raise InvalidTypeError(
                    f"every entry of `{name}` must be a str, got {[type(v).__name__ for v in value]}"
                )
            object.__setattr__(self, name, tuple(value))
        if self.expect is not None and len(self.expect) != len(self.inputs):
            raise InvalidValueError(
                f"`expect` must have one entry per input ({len(self.inputs)}), got {len(self.expect)}"
            )
        if not isinstance(self.entry, str) or not self.entry.isidentifier() or self.entry.startswith("_"):
            raise InvalidValueError(f"`entry` must be a plain identifier, got {self.entry!r}")


@dataclass(frozen=True)
class RunResult:
    """What one run gave.

    Attributes:
        status: one of :data:`STATUSES`.
        outputs: each call's return value as a literal (``status == "ok"`` only), written by the parent
            from the canonical value: sets and dicts in canonical order (:func:`tagged_repr`).
        matches: with ``Job.expect``: whether each output is the expected value, type-exact all the way
            down (``1``, ``1.0`` and ``True`` differ, in dict keys and sets too).
        stdout: what the program printed (at most ``output_chars`` characters).
        message: why it was refused or failed ("" when ok).
        guards: the guards that held (:data:`GUARDS`; the modes table of the module docstring).
        missing: ``"guard: why"`` for each guard that this machine refused.
        cpu_s: CPU seconds the child used (0.0 when it never started).
        values: each output as canonical type-tagged JSON (what ``matches`` compares).
    """

    status: str
    outputs: tuple[str, ...] = ()
    matches: tuple[bool, ...] = ()
    stdout: str = ""
    message: str = ""
    guards: tuple[str, ...] = ()
    cpu_s: float = 0.0
    missing: tuple[str, ...] = ()
    values: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class Sandbox:
    """Runs model-written programs, one fresh child interpreter per program (module docstring).

    Args:
        limits: the :class:`Limits` of every run.
        workers: how many children :meth:`run_many` and :meth:`validate_many` run at once.
        uid: DEPRECATED: the first user id of the per-run range (use ``uid_range``).
        gid: DEPRECATED: the first group id of the per-run range (use ``uid_range``).
        cut_network: try to give the child an empty network namespace.
        ast_check: TEST ONLY. False skips the allowlist and gives the program the full builtins, so
            that only the OS layer holds it.
        tmp_dir: where the per-run directories go (default: the system's temp dir).
        uid_range: ``(first, end)``: as root, each run takes a user and group id of its own from this
            range, reserved machine-wide by a lock file per id under ``/run/populora-sandbox/uids``.
        require: guards (:data:`GUARDS`) without which nothing may run: when the machine refuses one,
            every run raises :class:`SandboxGuardError` before any program text is read.
    """

    def __init__(
        self,
        limits: Limits | None = None,
        *,
        workers: int = 1,
        uid: int | None = None,
        gid: int | None = None,
        cut_network: bool = True,
        ast_check: bool = True,
        tmp_dir: str | os.PathLike[str] | None = None,
        uid_range: tuple[int, int] = UID_RANGE,
        require: Sequence[str] = (),
    ) -> None:
        if limits is None:
            limits = Limits()
        if not isinstance(limits, Limits):
            raise InvalidTypeError(f"`limits` must be a Limits, got {type(limits).__name__}")
        workers = check_int("workers", workers, low=1, high=256)
        if not isinstance(uid_range, tuple) or len(uid_range) != 2:
            raise InvalidTypeError(f"`uid_range` must be a tuple (first, end), got {uid_range!r}")
        first = check_int("uid_range[0]", uid_range[0], low=1000, high=2**32 - 3)
        end = check_int("uid_range[1]", uid_range[1], low=first + 1, high=2**32 - 2)
        gid_first = first
        for name, value in (("uid", uid), ("gid", gid)):
            if value is not None:
                warnings.warn(
                    f"Sandbox(`{name}`=...) is deprecated: every run takes an id of its own from `uid_range`; "
                    f"{name}={value} is used as the start of that range",
                    DeprecationWarning,
                    stacklevel=2,
                )
        if uid is not None:
            first = check_int("uid", uid, low=1, high=2**32 - 3)
            end = min(2**32 - 2, first + (end - uid_range[0]))
        if gid is not None:
            gid_first = check_int("gid", gid, low=1, high=2**32 - 3)
        elif uid is not None:
            gid_first = first
        if isinstance(require, str) or not isinstance(require, Sequence):
            raise InvalidTypeError(f"`require` must be a sequence of guard names, got {require!r}")
        unknown = [name for name in require if name not in GUARDS]
        if unknown:
            raise InvalidValueError(f"`require` names unknown guards {unknown}; the guards are {list(GUARDS)}")
        if tmp_dir is not None and not os.path.isdir(tmp_dir):
            raise InvalidValueError(f"`tmp_dir` must be an existing directory, got {tmp_dir!r}")
        self.limits = limits
        self.workers = workers
        self.uid_range = (first, end)
        self._gid_first = gid_first
        self.cut_network = check_bool("cut_network", cut_network)
        self.ast_check = check_bool("ast_check", ast_check)
        self.require = tuple(require)
        self.tmp_dir = None if tmp_dir is None else os.fspath(tmp_dir)
        self._argv = [sys.executable, "-s", "-S", "-B"] + (["-P"] if sys.version_info >= (3, 11) else [])
        self._encoded: dict[str, str | None] = {}  # literal text -> tagged value (None: not a literal)
        self._encoded_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Sandbox({self.limits}, workers={self.workers}, ast_check={self.ast_check})"

    # ------------------------------------------------------------------ public calls

    def run(self, job: Job, *, hash_seed: int = 0) -> RunResult:
        """Run ``job`` once in a fresh child with ``PYTHONHASHSEED=hash_seed``."""
        job = self._check_job(job)
        seed = check_int("hash_seed", hash_seed, low=0, high=2**32 - 1)
        self._encode_expected([job])
        return self._run_job(job, seed)

    def run_many(self, jobs: Sequence[Job], *, hash_seed: int = 0) -> list[RunResult]:
        """Run every job once (``workers`` at a time); results in the order of ``jobs``."""
        jobs = [self._check_job(job) for job in jobs]
        seed = check_int("hash_seed", hash_seed, low=0, high=2**32 - 1)
        self._encode_expected(jobs)
        return self._map(lambda job: self._run_job(job, seed), jobs)

    def validate(self, job: Job) -> RunResult:
        """Run ``job`` with hash seeds 0 and 1: the seed-0 result when both are ``ok`` and agree (outputs,
        matches, printed text); the first failure when one failed; else status ``nondeterministic``."""
        return self.validate_many([job])[0]

    def validate_many(self, jobs: Sequence[Job]) -> list[RunResult]:
        """:meth:`validate` for every job (``workers`` children at a time)."""
        jobs = [self._check_job(job) for job in jobs]
        self._encode_expected(jobs)
        pairs = [(job, seed) for job in jobs for seed in (0, 1)]
        runs = self._map(lambda pair: self._run_job(*pair), pairs)
        return [_agree(runs[2 * i], runs[2 * i + 1]) for i in range(len(jobs))]

    def same_value(self, a: str, b: str) -> bool:
        """Whether the literals ``a`` and ``b`` are equal values of the same types (read in a child that
        runs no program: the text may be model-written). False when either is not a literal."""
        if not isinstance(a, str) or not isinstance(b, str):
            raise InvalidTypeError(f"`a` and `b` must be str, got {type(a).__name__} and {type(b).__name__}")
        if len(a) + len(b) > MAX_TEXT_CHARS:
            return False
        encoded = self._encode_texts([a, b])
        return encoded[a] is not None and encoded[a] == encoded[b]

    # ------------------------------------------------------------------ internals

    def _check_job(self, job: Job) -> Job:
        if not isinstance(job, Job):
            raise InvalidTypeError(f"a job must be a Job, got {type(job).__name__}")
        return job

    def _map(self, fn: Callable[[Any], RunResult], items: list) -> list[RunResult]:
        if self.workers == 1 or len(items) <= 1:
            return [fn(item) for item in items]
        with ThreadPoolExecutor(max_workers=min(self.workers, len(items))) as pool:
            return list(pool.map(fn, items))

    def _encode_expected(self, jobs: list[Job]) -> None:
        """The tagged values of every expected output of ``jobs``, read in one child that runs no program
        (the expected outputs never enter the child of a program)."""
        texts = [t for job in jobs if job.expect is not None and _job_size(job) <= MAX_TEXT_CHARS for t in job.expect]
        self._encode_texts(texts)

    def _encode_texts(self, texts: list[str]) -> dict[str, str | None]:
        with self._encoded_lock:
            todo = list(dict.fromkeys(t for t in texts if t not in self._encoded))
        batch: list[str] = []
        size = 0
        for text in [*todo, None]:
            if text is None or (batch and size + len(text) > MAX_TEXT_CHARS):
                if batch:
                    values = self._spawn_encode(batch)
                    with self._encoded_lock:
                        if len(self._encoded) > 4096:
                            self._encoded.clear()
                        self._encoded.update(zip(batch, values))
                batch, size = [], 0
            if text is not None:
                batch.append(text)
                size += len(text)
        with self._encoded_lock:
            return {t: self._encoded.get(t) for t in texts}

    def _run_job(self, job: Job, seed: int) -> RunResult:
        if len(job.source) > MAX_SOURCE_CHARS:
            return RunResult("refused", message=f"the program has over {MAX_SOURCE_CHARS} characters")
        if _job_size(job) > MAX_TEXT_CHARS:
            return RunResult("refused", message=f"the inputs and outputs have over {MAX_TEXT_CHARS} characters")
        expected: list[str | None] = []
        if job.expect is not None:
            encoded = self._encode_texts(list(job.expect))
            expected = [encoded[t] for t in job.expect]
            if any(e is None for e in expected):
                return RunResult("refused", message="an expected output is not a plain literal")
        payload = {
            "mode": "run",
            "source": job.source,
            "inputs": list(job.inputs),
            "entry": job.entry,
            "ast": self.ast_check,
            "preload": _preload(job.source, self.ast_check),
            "allowed": {k: (None if v is None else list(v)) for k, v in ALLOWED_MODULES.items()},
            "builtins": list(SAFE_BUILTINS),
            "denied_names": sorted(DENIED_NAMES),
            "denied_attrs": sorted(DENIED_ATTRIBUTES),
        }
        result = self._spawn(payload, seed, len(job.inputs))
        if result.ok and job.expect is not None:
            result = dataclasses.replace(result, matches=tuple(v == e for v, e in zip(result.values, expected)))
        return result

    def _spawn_encode(self, texts: list[str]) -> list[str | None]:
        result = self._spawn({"mode": "encode", "texts": texts}, 0, len(texts))
        if not result.ok or len(result.values) != len(texts):
            return [None] * len(texts)
        return [None if v == "null" else v for v in result.values]

    def _spawn(self, payload: dict, seed: int, count: int) -> RunResult:
        limits = self.limits
        root = os.geteuid() == 0
        lease = _UidLease(self.uid_range) if root and payload["mode"] == "run" else None
        uid = lease.uid if lease is not None else os.getuid()
        gid = (self._gid_first + uid - self.uid_range[0]) if lease is not None else os.getgid()
        netns = _shared_netns() if self.cut_network and root and payload["mode"] == "run" else None
        payload = dict(
            payload,
            cpu_s=float(limits.cpu_s),
            memory_bytes=limits.memory_bytes,
            out_chars=limits.output_chars,
            file_bytes=limits.file_bytes,
            open_files=limits.open_files,
            disk_bytes=limits.disk_bytes,
            disk_files=limits.disk_files,
            uid=uid,
            gid=gid,
            net=self.cut_network,
            netns_fd=netns,
            require=list(self.require),
        )
        read_end, write_end = os.pipe()
        payload["record_fd"] = write_end
        workdir = tempfile.mkdtemp(prefix="populora-sandbox-", dir=self.tmp_dir)
        proc: subprocess.Popen | None = None
        try:
            with open(os.path.join(workdir, "job.bin"), "wb") as fh:
                fh.write(marshal.dumps(payload))
            if lease is not None:
                os.chown(workdir, uid, gid)  # without a tmpfs the program writes here
            try:
                proc = subprocess.Popen(
                    [*self._argv, RUNNER_PATH],
                    cwd=workdir,
                    env={"PYTHONHASHSEED": str(seed)},
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    close_fds=True,
                    pass_fds=(write_end,) if netns is None else (write_end, netns),
                    start_new_session=True,
                )
            finally:
                os.close(write_end)
            out_cap = 8 * limits.output_chars + 2**16
            record_cap = 6 * limits.output_chars + count * (4 * (12 * limits.output_chars + 64) + 8) + 2**16
            cpu = 0.0
            try:
                record, tail, stop = _collect(proc, read_end, limits.wall_s, record_cap, out_cap)
            finally:
                # the group is killed while its leader is not yet reaped, so its id cannot be reused; the
                # reaper of a PID namespace is in the group, and the namespace dies with it
                for kill in (os.killpg, os.kill):
                    try:
                        kill(proc.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                assert proc.stdout is not None  # stdout=PIPE
                proc.stdout.close()
                _, status, usage = os.wait4(proc.pid, 0)
                proc.returncode = os.waitstatus_to_exitcode(status)
                cpu = usage.ru_utime + usage.ru_stime
        finally:
            os.close(read_end)
            _remove(workdir)
            if lease is not None:
                lease.release()
        result = _classify(record, tail, stop, proc.returncode, cpu, limits, payload["mode"])
        if self.require and payload["mode"] == "run" and result.status != "timeout":
            absent = [name for name in self.require if name not in result.guards]
            if absent:
                why = [m for m in result.missing if m.split(":")[0] in absent]
                raise SandboxGuardError(f"required guards {absent} are unavailable here: {why or result.message}")
        return dataclasses.replace(result, cpu_s=cpu)


def _job_size(job: Job) -> int:
    return sum(map(len, job.inputs)) + (sum(map(len, job.expect)) if job.expect is not None else 0)


class _UidLease:
    """A user id of the range held for one run: an ``flock`` on its file in :data:`_LOCK_DIR`, shared by
    every process of the machine, so two sandboxes never run programs as the same uid at once."""

    def __init__(self, uid_range: tuple[int, int]) -> None:
        first, end = uid_range
        os.makedirs(_LOCK_DIR, mode=0o700, exist_ok=True)
        span = end - first
        start = secrets.randbelow(span)
        for i in range(min(span, 4096)):
            uid = first + (start + i) % span
            fd = os.open(os.path.join(_LOCK_DIR, str(uid)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.uid, self._fd = uid, fd
            return
        raise RuntimeError(f"no free uid in {uid_range}: 4096 tried, all held by other runs")

    def release(self) -> None:
        os.close(self._fd)  # closing the last descriptor drops the lock


def _shared_netns() -> int | None:
    """A descriptor of this process's empty network namespace (made on first use), or None."""
    global _NETNS_FD
    with _NETNS_LOCK:
        if _NETNS_FD is None:
            _NETNS_FD = _make_netns()
        return None if _NETNS_FD < 0 else _NETNS_FD


def _make_netns() -> int:
    """A helper child unshares its network namespace; we open it while the helper waits on stdin."""
    try:
        helper = subprocess.Popen(
            [sys.executable, "-s", "-S", "-B", "-c", _NETNS_HELPER],
            env={},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            start_new_session=True,
        )
    except OSError:
        return -1
    fd = -1
    assert helper.stdout is not None  # stdout=PIPE
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(helper.stdout, selectors.EVENT_READ)
            if selector.select(30.0) and helper.stdout.readline() == b"ok\n":
                fd = os.open(f"/proc/{helper.pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        fd = -1
    finally:
        helper.kill()
        helper.communicate()
    return fd


def _preload(source: str, ast_check: bool) -> list[str]:
    """The modules the runner imports before it drops privileges (after, none can be found): the
    allowed ones whose names occur as words in the text (a regex, nothing is parsed here). A name
    that occurs but is never imported costs only start-up time."""
    names = set(_WORD.findall(source))
    allowed = set(ALLOWED_MODULES) if ast_check else set(ALLOWED_MODULES) | set(_UNCHECKED_PRELOAD)
    return sorted(names & allowed)


def _collect(
    proc: subprocess.Popen, record_fd: int, wall_s: float, record_cap: int, out_cap: int
) -> tuple[bytes, bytes, str]:
    """Read the record descriptor and the child's stdout + stderr until both are closed and the child
    has exited (``"done"``), the deadline (``"wall"``) or more than a cap (``"output"``). Returns the
    record, the last bytes of stdout + stderr (for a message) and why it stopped."""
    deadline = time.monotonic() + wall_s
    assert proc.stdout is not None  # started with stdout=PIPE
    out_fd = proc.stdout.fileno()
    record: list[bytes] = []
    tail = b""
    sizes = {record_fd: 0, out_fd: 0}
    caps = {record_fd: record_cap, out_fd: out_cap}
    with selectors.DefaultSelector() as selector:
        for fd in (record_fd, out_fd):
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        open_fds = 2
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                return b"".join(record), tail, "wall"
            for key, _ in selector.select(left):
                fd = key.fd
                try:
                    chunk = os.read(fd, 2**16)
                except BlockingIOError:
                    continue
                if not chunk:
                    selector.unregister(fd)
                    open_fds -= 1
                    continue
                sizes[fd] += len(chunk)
                if fd == record_fd:
                    record.append(chunk)
                else:
                    tail = (tail + chunk)[-2000:]
                if sizes[fd] > caps[fd]:
                    return b"".join(record), tail, "output"
    # EOF came first; the exit follows at once. WNOWAIT leaves the child unreaped (its process
    # group id stays reserved until the caller has killed the group).
    while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
        if time.monotonic() >= deadline:
            return b"".join(record), tail, "wall"
        time.sleep(0.001)
    return b"".join(record), tail, "done"


# ---------------------------------------------------------------------------------------- reading records

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]{0,30})(?:\.[0-9]{1,30})?(?:[eE][-+]?[0-9]{1,4})?")
_SPACE = re.compile(r"[ \t\r\n]*")
_SCANSTRING: Callable[[str, int, bool], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]


class _BadRecord(ValueError):
    pass


def read_json(text: str, max_depth: int = _MAX_DEPTH) -> Any:
    """One JSON document, read without recursion, at most ``max_depth`` containers deep: lists, dicts
    (str keys), str, int, float, bool, None. Linear in the text; raises ValueError for anything else."""
    stack: list[tuple[Any, str | None]] = []  # open containers and, for a dict, the key of the value being read
    pos, end = 0, len(text)
    value: Any = None
    while True:
        pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]  # matches the empty string too
        if pos >= end:
            raise _BadRecord("the text ends inside a value")
        char = text[pos]
        top = stack[-1][0] if stack else None
        if type(top) is dict and stack[-1][1] is None:
            # a key (or the end of the dict)
            if char == "}" and not top:
                pos += 1
                value = stack.pop()[0]
            elif char == '"':
                name, pos = _SCANSTRING(text, pos + 1, True)
                pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]
                if pos >= end or text[pos] != ":":
                    raise _BadRecord(f"expected ':' at {pos}")
                stack[-1] = (top, name)
                pos += 1
                continue
            else:
                raise _BadRecord(f"expected a key at {pos}")
        elif char == "[" or char == "{":
            if len(stack) >= max_depth:
                raise _BadRecord(f"nested over {max_depth} deep")
            stack.append(([] if char == "[" else {}, None))
            pos += 1
            if char == "[":
                pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]
                if pos < end and text[pos] == "]":
                    pos += 1
                    value = stack.pop()[0]
                else:
                    continue
            else:
                continue
        elif char == '"':
            value, pos = _SCANSTRING(text, pos + 1, True)
        elif text.startswith("true", pos):
            value, pos = True, pos + 4
        elif text.startswith("false", pos):
            value, pos = False, pos + 5
        elif text.startswith("null", pos):
            value, pos = None, pos + 4
        else:
            match = _NUMBER.match(text, pos)
            if match is None:
                raise _BadRecord(f"unexpected {char!r} at {pos}")
            token = match.group()
            value = float(token) if any(c in token for c in ".eE") else int(token)
            pos = match.end()
        # a value is complete: attach it, then close every container that ends here
        while True:
            if not stack:
                pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]
                if pos != end:
                    raise _BadRecord(f"text after the document at {pos}")
                return value
            container, key = stack[-1]
            if type(container) is list:
                container.append(value)
            else:
                assert key is not None  # a key is read before every value of a dict
                if key in container:
                    raise _BadRecord(f"the key {key[:50]!r} appears twice")
                container[key] = value
                stack[-1] = (container, None)
            pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]
            if pos >= end:
                raise _BadRecord("the text ends inside a container")
            closer = "]" if type(container) is list else "}"
            if text[pos] == ",":
                pos += 1
                break
            if text[pos] != closer:
                raise _BadRecord(f"expected ',' or {closer!r} at {pos}")
            pos += 1
            value = stack.pop()[0]


_SCALAR_TAGS = {"none": 0, "bool": bool, "int": str, "float": str, "str": str, "bytes": str}
_SEQUENCE_TAGS = {"list": ("[", "]"), "tuple": ("(", ")"), "set": ("{", "}")}
_INT_TEXT = re.compile(r"-?(?:0|[1-9][0-9]*)")
_FLOAT_TEXT = re.compile(r"-?(?:inf|nan|[0-9]+\.[0-9]+(?:e[-+][0-9]+)?|[0-9]+e[-+][0-9]+)")
_HEX = re.compile(r"(?:[0-9a-f]{2})*")


def tagged_repr(tree: Any) -> str:
    """The Python literal of a tagged value (:func:`populora.tasks._runner.encode`, read by
    :func:`read_json`), without recursion; raises ValueError when ``tree`` is not a well-formed one."""
    parts: list[str] = []
    # work items: a tagged value to write, or a plain text to append
    work: list[tuple[bool, Any]] = [(True, tree)]
    while work:
        is_value, item = work.pop()
        if not is_value:
            parts.append(item)
            continue
        if type(item) is not list or not item or type(item[0]) is not str:
            raise _BadRecord("not a tagged value")
        tag = item[0]
        if tag == "none" and len(item) == 1:
            parts.append("None")
            continue
        if len(item) != 2:
            raise _BadRecord(f"a {tag[:20]!r} value has {len(item)} fields")
        payload = item[1]
        if tag == "bool" and type(payload) is bool:
            parts.append("True" if payload else "False")
        elif tag == "int" and type(payload) is str and _INT_TEXT.fullmatch(payload) and len(payload) < 5000:
            parts.append(payload)
        elif tag == "float" and type(payload) is str and _FLOAT_TEXT.fullmatch(payload) and len(payload) < 40:
            parts.append(payload)
        elif tag == "str" and type(payload) is str:
            parts.append(repr(payload))
        elif tag == "bytes" and type(payload) is str and _HEX.fullmatch(payload):
            parts.append(repr(bytes.fromhex(payload)))
        elif tag in _SEQUENCE_TAGS and type(payload) is list:
            open_, close = _SEQUENCE_TAGS[tag]
            if tag == "set" and not payload:
                parts.append("set()")
                continue
            if tag == "tuple" and len(payload) == 1:
                close = ",)"
            items: list[tuple[bool, Any]] = [(False, open_)]
            for i, x in enumerate(payload):
                if i:
                    items.append((False, ", "))
                items.append((True, x))
            items.append((False, close))
            work.extend(reversed(items))
        elif tag == "dict" and type(payload) is list:
            items = [(False, "{")]
            for i, pair in enumerate(payload):
                if type(pair) is not list or len(pair) != 2:
                    raise _BadRecord("a dict entry is not a [key, value] pair")
                if i:
                    items.append((False, ", "))
                items += [(True, pair[0]), (False, ": "), (True, pair[1])]
            items.append((False, "}"))
            work.extend(reversed(items))
        else:
            raise _BadRecord(f"a malformed {tag[:20]!r} value")
    return "".join(parts)


def _frames(data: bytes) -> list[dict]:
    """The frames of a record: lines of JSON objects, each with a str ``k``."""
    if not data:
        return []
    if not data.endswith(b"\n"):
        raise _BadRecord("the record does not end with a whole line")
    frames = []
    for line in data[:-1].split(b"\n"):
        frame = read_json(line.decode("utf-8", "surrogatepass"))
        if type(frame) is not dict or type(frame.get("k")) is not str:
            raise _BadRecord("a frame is not an object with a kind")
        frames.append(frame)
    return frames


def _strings(frame: dict, name: str) -> tuple[str, ...]:
    value = frame.get(name, [])
    if type(value) is not list or not all(type(x) is str for x in value):
        raise _BadRecord(f"`{name}` is not a list of str")
    return tuple(value)


def _text(frame: dict, name: str) -> str:
    value = frame.get(name, "")
    if type(value) is not str:
        raise _BadRecord(f"`{name}` is not a str")
    return value


def _classify(
    record: bytes, tail: bytes, stop: str, returncode: int | None, cpu: float, limits: Limits, mode: str
) -> RunResult:
    """The verdict of one run, from the frames of the record (never from printed text)."""
    if stop == "wall":
        return RunResult("timeout", message=f"wall-clock limit ({limits.wall_s} s)")
    if stop == "output":
        return RunResult("output_limit", message="the child wrote more than the parent reads")
    try:
        frames = _frames(record)
        kinds = [frame["k"] for frame in frames]
        if kinds and kinds[0] == "setup" and kinds[1:] in ([], ["exit"]):
            message = _text(frames[0], "message")[:500]
            return RunResult(
                "error",
                message="the runner refused to run the program: " + message,
                guards=_strings(frames[0], "guards"),
                missing=_strings(frames[0], "missing"),
            )
        if mode == "encode":
            if kinds != ["guards", "result"] or returncode != 0:
                raise _BadRecord(f"frames {kinds[:5]}, exit code {returncode}")
            return _result(frames[1], (), ())
        if kinds not in (["guards", "result", "exit"], ["guards", "exit"]):
            raise _BadRecord(f"frames {kinds[:5]}")
        guards, missing = _strings(frames[0], "guards"), _strings(frames[0], "missing")
        exit_frame = frames[-1]
        code, sig, child_cpu = exit_frame.get("code"), exit_frame.get("signal"), exit_frame.get("cpu")
        if type(code) is not int or type(sig) is not int or type(child_cpu) not in (int, float):
            raise _BadRecord("a malformed exit frame")
        if returncode != 0:
            raise _BadRecord(f"the runner exited with {returncode}")
    except (_BadRecord, ValueError, UnicodeDecodeError) as exc:
        text = tail[-300:].decode("utf-8", "replace")
        return RunResult("error", message=f"no valid record ({str(exc)[:200]}; exit code {returncode}): {text!r}")
    if sig:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        # the CPU timer's SIGPROF, RLIMIT_CPU's SIGXCPU and SIGKILL: a timeout only when the CPU was spent
        if sig in (signal.SIGPROF, signal.SIGXCPU, signal.SIGKILL) and cpu >= limits.cpu_s - 0.02:
            return RunResult(
                "timeout", message=f"CPU limit ({limits.cpu_s} s): killed by {name}", guards=guards, missing=missing
            )
        return RunResult("error", message=f"the program was killed by {name}", guards=guards, missing=missing)
    if kinds[1] != "result":
        if code == 3:
            return RunResult("memory", message="MemoryError while writing the result", guards=guards, missing=missing)
        return RunResult(
            "error", message=f"the program exited with code {code} and no result", guards=guards, missing=missing
        )
    if code != 0:
        return RunResult("error", message=f"the program exited with code {code}", guards=guards, missing=missing)
    try:
        return _result(frames[1], guards, missing)
    except (_BadRecord, ValueError) as exc:
        return RunResult("error", message=f"a malformed result ({str(exc)[:200]})", guards=guards, missing=missing)


def _result(frame: dict, guards: tuple[str, ...], missing: tuple[str, ...]) -> RunResult:
    status = frame.get("status")
    if status not in STATUSES or status == "nondeterministic":
        raise _BadRecord(f"the status {str(status)[:30]!r}")
    values = frame.get("values", [])
    if type(values) is not list:
        raise _BadRecord("`values` is not a list")
    texts, outputs = [], []
    for tree in values:
        if tree is None:
            texts.append("null")
            outputs.append("")
            continue
        outputs.append(tagged_repr(tree))
        texts.append(json.dumps(tree, ensure_ascii=False, separators=(",", ":")))
    if status != "ok":
        texts, outputs = [], []
    return RunResult(
        status=status,
        outputs=tuple(outputs),
        stdout=_text(frame, "stdout"),
        message=_text(frame, "message")[:500],
        guards=guards,
        missing=missing,
        values=tuple(texts),
    )


def _agree(first: RunResult, second: RunResult) -> RunResult:
    for result in (first, second):
        if not result.ok:
            return result
    if (first.values, first.matches, first.stdout) != (second.values, second.matches, second.stdout):
        return dataclasses.replace(
            first,
            status="nondeterministic",
            message=f"hash seeds 0 and 1 disagree: {first.outputs[:3]} vs {second.outputs[:3]}"[:300],
        )
    return first


def _remove(path: str) -> None:
    """Remove a run's directory without recursion and without long paths (one directory descriptor at
    a time, going down and back up with ``..``), even a tree the child made unreadable or thousands deep."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return
    names: list[str] = []  # the path below `path` of the directory `fd` is
    try:
        while True:
            sub = None
            with os.scandir(fd) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        sub = entry.name
                        break
                    try:
                        os.unlink(entry.name, dir_fd=fd)
                    except FileNotFoundError:
                        pass
            if sub is not None:
                try:
                    os.chmod(sub, 0o700, dir_fd=fd, follow_symlinks=True)  # a directory (checked above)
                    child = os.open(sub, flags, dir_fd=fd)
                except OSError:
                    os.rmdir(sub, dir_fd=fd)  # raises when it cannot be had: the caller learns of it
                    continue
                os.close(fd)
                fd = child
                names.append(sub)
                continue
            if not names:
                break
            parent = os.open("..", flags, dir_fd=fd)
            os.close(fd)
            fd = parent
            os.rmdir(names.pop(), dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(path)
