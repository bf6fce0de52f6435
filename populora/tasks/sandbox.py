"""A sandboxed executor for small model-written Python programs: the verifier of the code tasks.

It runs model-written code, so it is a security boundary. The library's process never compiles,
parses or executes program text: it writes a job file, starts one fresh interpreter per program and
reads back at most a bounded number of bytes of JSON.

How one program runs (:meth:`Sandbox.run`)
    1. The parent checks only sizes (text lengths, no parsing), makes a fresh temporary directory
       (mode 0700, owned by the sandbox uid when running as root) and writes the job (``marshal`` of
       plain strings and numbers) into it.
    2. It starts ``sys.executable -s -S -B [-P] -c RUNNER`` in that directory, in a new session
       (its own process group), with the environment cleared except ``PYTHONHASHSEED`` (``-I`` would
       ignore that variable, so ``-s -S -B`` and an empty environment stand in for it), stdin from
       ``/dev/null`` and stdout + stderr on one pipe.
    3. The runner (trusted code, :data:`RUNNER`) reads and deletes the job, starts a CPU timer (``ITIMER_PROF``:
       ``SIGPROF`` kills the process at ``cpu_s``; ``RLIMIT_CPU`` backs it up a second later, ``RLIMIT_CORE`` = 0),
       imports the standard modules the program may use, and then, as root: cuts the network (``setns`` into an empty
       network namespace, one with only a down loopback, that the parent makes once per process: a helper child calls
       ``unshare(CLONE_NEWNET)`` and the parent keeps a descriptor of its namespace; joining one costs far less than
       making a fresh one per run, about 50 ms of kernel latency), sets ``no_new_privs``, ``chroot``\\ s into the
       temporary directory, drops every group and sets real, effective and saved uid and gid to ``uid`` / ``gid``
       (65534, ``nobody``, by default) and checks that ``setuid(0)`` now fails. If any of chroot or the uid drop fails
       it refuses to run the program (status ``error``). Then, for everyone, ``RLIMIT_AS`` (memory), ``RLIMIT_FSIZE``
       (bytes per written file), ``RLIMIT_NOFILE``, ``RLIMIT_NPROC`` = 0 (no fork, no thread: enforced because the
       process is no longer root) and ``RLIMIT_MSGQUEUE`` = 0.
    4. Only now does it read program text: ``ast.parse`` and the allowlist below (refusal is status
       ``refused``), ``compile``, ``exec`` with a restricted builtins table, then one call of the
       entry function (``f``) per input. Inputs are argument lists written as Python literals
       (``[1, 2], 3``), read with ``ast.literal_eval``. Every return value must be a plain literal
       (exact ``int float bool str bytes None list tuple dict set``, nested at most 100 deep) whose
       ``repr`` reads back equal with ``ast.literal_eval``; its ``repr`` is the output. ``print``
       goes to a bounded buffer, returned as ``stdout``.
    5. The parent reads at most ``8 * output_chars + 64 KiB`` bytes before ``wall_s`` runs out;
       past either it kills the process group (``SIGKILL``), otherwise it kills the group anyway
       after EOF (nothing outlives a run), reaps the child (``wait4``: its CPU time is reported)
       and removes the temporary directory.

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

What is guaranteed
    - As root (the usual case in containers and CI): every program runs as ``uid`` / ``gid`` with no
      supplementary groups and no capabilities, in a chroot of its own empty temporary directory
      (it can read and write nothing else of the filesystem; what it writes there is bounded by
      ``file_bytes`` per file and removed afterwards), cannot fork or start threads (``RLIMIT_NPROC``
      0 is enforced for non-root uids), is held to ``cpu_s`` CPU seconds (``SIGPROF``; a program
      that ignores it, possible only without the allowlist, is killed by ``RLIMIT_CPU`` at
      ``int(cpu_s) + 2`` seconds, which the kernel checks once per scheduler tick), ``memory_bytes`` of
      address space, ``wall_s`` of wall clock and ``output_chars`` of output, and leaves no process
      behind. The network is cut when ``unshare(CLONE_NEWNET)`` succeeds, which needs
      ``CAP_SYS_ADMIN`` (granted to root outside a restricted container; a default Docker seccomp
      profile refuses it); :attr:`RunResult.guards` lists ``"netns"`` exactly when it did. Children
      running at the same time share that namespace: no interface is up in it, so they reach
      nothing, but two that both got past the allowlist could talk through an abstract unix socket.
    - Not as root: the resource limits above still hold (``RLIMIT_NPROC`` = 0 stops forks because
      the limit is checked against all processes of the user, which include the child itself), but
      there is no chroot and no uid change: the program could read and write what the user can if
      it got past the allowlist, which is then the only file-system barrier. The network is cut only
      where unprivileged user namespaces are enabled (``unshare(CLONE_NEWUSER | CLONE_NEWNET)``).
    - Under the allowlist a program reaches no module that touches files, processes, signals or
      sockets; the OS limits hold whether or not it is on (``ast_check=False``, a switch for tests,
      runs the program with the full builtins so that only the OS limits hold it).
    - Not guaranteed: isolation between programs that run at the same time as the same uid if one
      got past the allowlist (it could signal the other, e.g. ``kill(-1, SIGKILL)``); protection
      against kernel or interpreter bugs; a constant CPU cost (the CPU limit is per program, the
      machine is shared).

Cost
    One child costs about 50-60 ms of CPU (interpreter start-up and the runner's imports), so a
    2-core machine runs about 12 small programs per second one at a time and 15-18 with
    ``workers=2`` (``benchmarks/sandbox.py``; measured on a shared, busy machine).

Example:
    >>> sandbox = Sandbox(Limits(cpu_s=1.0, wall_s=10.0))
    >>> sandbox.run(Job("def f(xs):\\n    return sorted(xs)[::-1]", ("[3, 1, 2]",))).outputs
    ('[3, 2, 1]',)
    >>> sandbox.run(Job("def f():\\n    return ().__class__", ("",))).status
    'refused'
"""

from __future__ import annotations

import dataclasses
import json
import marshal
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from populora.checks import check_bool, check_float, check_int
from populora.errors import InvalidTypeError, InvalidValueError

__all__ = [
    "ALLOWED_MODULES",
    "DENIED_ATTRIBUTES",
    "DENIED_NAMES",
    "RUNNER",
    "SAFE_BUILTINS",
    "STATUSES",
    "Job",
    "Limits",
    "RunResult",
    "Sandbox",
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

# The runner: trusted code that the child interpreter runs with `-c`. It reads the job, confines
# itself, and only then reads program text (module docstring, steps 3 and 4).
RUNNER = r'''# populora-sandbox-runner
import os, sys, marshal, signal, resource


def _emit(record):
    import _json
    enc = _json.encode_basestring_ascii

    def js(x):
        if x is None:
            return "null"
        if x is True:
            return "true"
        if x is False:
            return "false"
        if isinstance(x, (int, float)):
            return repr(x)
        if isinstance(x, str):
            return enc(x)
        if isinstance(x, (list, tuple)):
            return "[" + ",".join(js(v) for v in x) + "]"
        return "{" + ",".join(enc(k) + ":" + js(v) for k, v in x.items()) + "}"

    data = ("\n" + js(record) + "\n").encode("ascii")
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


def _check(tree, allowed, denied_names, denied_attrs, max_nodes):
    import ast
    nodes_ok = {
        "Module", "FunctionDef", "Return", "Delete", "Assign", "AugAssign", "AnnAssign", "For", "While", "If",
        "Raise", "Try", "Assert", "Import", "ImportFrom", "Nonlocal", "Expr", "Pass", "Break", "Continue",
        "BoolOp", "NamedExpr", "BinOp", "UnaryOp", "Lambda", "IfExp", "Dict", "Set", "ListComp", "SetComp",
        "DictComp", "GeneratorExp", "Yield", "YieldFrom", "Compare", "Call", "FormattedValue", "JoinedStr",
        "Constant", "Attribute", "Subscript", "Starred", "Name", "List", "Tuple", "Slice",
        "Load", "Store", "Del", "And", "Or", "Add", "Sub", "Mult", "Div", "Mod", "Pow", "LShift", "RShift",
        "BitOr", "BitXor", "BitAnd", "FloorDiv", "Invert", "Not", "UAdd", "USub", "Eq", "NotEq", "Lt", "LtE",
        "Gt", "GtE", "Is", "IsNot", "In", "NotIn", "comprehension", "ExceptHandler", "arguments", "arg",
        "keyword", "alias",
    }

    def bad_name(name):
        return name is not None and (name.startswith("__") or name in denied_names)

    count = 0
    for node in ast.walk(tree):
        count += 1
        if count > max_nodes:
            return "the program has more than %d syntax nodes" % max_nodes
        kind = type(node).__name__
        if kind not in nodes_ok:
            return "`%s` is not allowed" % kind
        if kind == "Name" and bad_name(node.id):
            return "the name `%s` is not allowed" % node.id
        if kind == "Attribute" and (node.attr.startswith("_") or node.attr in denied_attrs):
            return "the attribute `.%s` is not allowed" % node.attr
        if kind == "FunctionDef" and bad_name(node.name):
            return "the function name `%s` is not allowed" % node.name
        if kind == "arg" and bad_name(node.arg):
            return "the argument name `%s` is not allowed" % node.arg
        if kind == "keyword" and bad_name(node.arg):
            return "the keyword `%s` is not allowed" % node.arg
        if kind == "ExceptHandler" and bad_name(node.name):
            return "the name `%s` is not allowed" % node.name
        if kind == "Nonlocal" and any(bad_name(n) for n in node.names):
            return "a name in `nonlocal` is not allowed"
        if kind == "Import":
            for a in node.names:
                if a.name not in allowed:
                    return "importing `%s` is not allowed (allowed: %s)" % (a.name, ", ".join(sorted(allowed)))
                if bad_name(a.asname):
                    return "the name `%s` is not allowed" % a.asname
        if kind == "ImportFrom":
            if node.level or node.module not in allowed:
                return "importing from `%s` is not allowed (allowed: %s)" % (node.module, ", ".join(sorted(allowed)))
            names = allowed[node.module]
            for a in node.names:
                if (a.name == "*" or a.name.startswith("_") or bad_name(a.asname)
                        or (names is not None and a.name not in names)):
                    return "`from %s import %s` is not allowed" % (node.module, a.name)
    return None


def _plain(value, max_items):
    """None when `value` is a plain literal (exact builtin types, at most 100 deep), "large" when it
    has more than max_items items, else the name of the first type that is not plain."""
    scalars = (int, float, bool, str, bytes, type(None))
    stack = [(value, 0)]
    seen = 0
    while stack:
        item, depth = stack.pop()
        seen += 1
        if seen > max_items:
            return "large"
        if depth > 100:
            return "a structure over 100 levels deep"
        kind = type(item)
        if kind in scalars:
            continue
        if kind in (list, tuple, set):
            stack.extend((x, depth + 1) for x in item)
        elif kind is dict:
            for k, v in item.items():
                stack.append((k, depth + 1))
                stack.append((v, depth + 1))
        else:
            return kind.__name__
    return None


def _same(a, b):
    """Equal values of the same types, all the way down."""
    if type(a) is not type(b):
        return False
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if type(a) is float and a != a:
        return b != b
    return a == b


def _literal(text):
    import ast
    return ast.literal_eval(text.strip())


def _arguments(text, entry):
    import ast
    tree = ast.parse(entry + "(" + text + "\n)", mode="eval")
    call = tree.body
    if (type(call) is not ast.Call or type(call.func) is not ast.Name or call.func.id != entry or call.keywords
            or any(type(a) is ast.Starred for a in call.args)):
        raise ValueError("not an argument list")
    return tuple(ast.literal_eval(a) for a in call.args)


def _describe(exc):
    try:
        text = str(exc)
    except BaseException:
        text = ""
    return (type(exc).__name__ + (": " + text if text else ""))[:300]


class _Capture:
    def __init__(self, limit):
        self.parts = []
        self.size = 0
        self.limit = limit
        self.over = False

    def write(self, text):
        if type(text) is not str:
            raise TypeError("print writes str")
        self.size += len(text)
        if self.size > self.limit:
            self.over = True
            raise RuntimeError("output limit reached")
        self.parts.append(text)
        return len(text)

    def flush(self):
        pass


def _main():
    with open("job.bin", "rb") as fh:
        job = marshal.loads(fh.read())
    os.unlink("job.bin")
    signal.setitimer(signal.ITIMER_PROF, job["cpu_s"])
    hard = int(job["cpu_s"]) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (hard, hard + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    import ast, builtins, _json
    loaded = {}
    for name in job["preload"]:
        try:
            loaded[name] = __import__(name)
        except Exception:
            pass
    guards = ["rlimits"]
    root = os.geteuid() == 0
    if root or job["net"]:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
    if job["net"]:
        fd = job["netns_fd"]
        joined = fd is not None and libc.setns(fd, 0x40000000) == 0  # CLONE_NEWNET
        if fd is not None:
            os.close(fd)
        flags = 0x40000000 if root else 0x40000000 | 0x10000000  # CLONE_NEWNET (| CLONE_NEWUSER)
        if joined or libc.unshare(flags) == 0:
            guards.append("netns")
    if root:
        try:
            libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
            os.chroot(".")
            os.chdir("/")
            guards.append("chroot")
            uid, gid = job["uid"], job["gid"]
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            if os.getresuid() != (uid, uid, uid) or os.getgroups() not in ([], [gid]):
                raise OSError("the uid did not change")
            try:
                os.setuid(0)
            except PermissionError:
                pass
            else:
                raise OSError("setuid(0) still works")
            guards.append("uid")
        except OSError as exc:
            _emit({"status": "error", "message": "could not drop privileges: " + _describe(exc), "guards": guards})
            return
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (job["file_bytes"], job["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (job["open_files"], job["open_files"]))
    resource.setrlimit(resource.RLIMIT_AS, (job["memory_bytes"], job["memory_bytes"]))
    guards.append("nproc")

    limit = job["out_chars"]
    record = {"status": "ok", "outputs": [], "matches": [], "stdout": "", "message": "", "guards": guards}
    capture = _Capture(limit)
    try:
        _run(job, record, capture, loaded, builtins, ast)
    except MemoryError:
        record["status"], record["message"] = "memory", "MemoryError"
    except BaseException as exc:
        record["status"], record["message"] = "error", _describe(exc)
    if capture.over:
        record["status"], record["message"] = "output_limit", "printed text or an output over %d characters" % limit
    record["stdout"] = "".join(capture.parts)
    _emit(record)


def _run(job, record, capture, loaded, builtins, ast):
    limit = job["out_chars"]
    if job["mode"] == "same":
        try:
            record["matches"] = [_same(_literal(job["a"]), _literal(job["b"]))]
        except BaseException as exc:
            record["matches"], record["message"] = [False], _describe(exc)
        return
    entry = job["entry"]
    if job["ast"]:
        try:
            tree = ast.parse(job["source"], "<program>", "exec")
        except BaseException as exc:
            record["status"], record["message"] = "refused", _describe(exc)
            return
        problem = _check(tree, job["allowed"], set(job["denied_names"]), set(job["denied_attrs"]), 20000)
        if problem is None and not any(type(node) is ast.FunctionDef and node.name == entry for node in tree.body):
            problem = "the program defines no function `%s`" % entry
        if problem is not None:
            record["status"], record["message"] = "refused", problem
            return
        proxies = {}
        for name, names in job["allowed"].items():
            if name not in loaded:
                continue
            module, proxy = loaded[name], type(sys)(name)
            public = names if names is not None else [n for n in dir(module) if not n.startswith("_")]
            for attr in public:
                value = getattr(module, attr, None)
                if value is not None and type(value) is not type(sys):
                    setattr(proxy, attr, value)
            proxies[name] = proxy

        def importer(name, globals=None, locals=None, fromlist=(), level=0):
            if level or name not in proxies:
                raise ImportError("importing %s is not allowed" % name)
            return proxies[name]

        table = {n: getattr(builtins, n) for n in job["builtins"] if hasattr(builtins, n)}
        table["__import__"] = importer
        scope = {"__builtins__": table, "__name__": "__program__"}
        try:
            code = compile(tree, "<program>", "exec", dont_inherit=True)
        except BaseException as exc:
            record["status"], record["message"] = "refused", _describe(exc)
            return
    else:
        scope = {"__builtins__": builtins, "__name__": "__program__"}
        try:
            code = compile(job["source"], "<program>", "exec", dont_inherit=True)
        except BaseException as exc:
            record["status"], record["message"] = "refused", _describe(exc)
            return
    try:
        args = [_arguments(text, entry) for text in job["inputs"]]
        expect = None if job["expect"] is None else [_literal(text) for text in job["expect"]]
    except BaseException as exc:
        record["status"] = "refused"
        record["message"] = "an input or expected output is not a literal: " + _describe(exc)
        return
    sys.stdout = capture
    try:
        exec(code, scope)
        fn = scope.get(entry)
        if type(fn).__name__ != "function":
            raise NameError("the program defines no function `%s`" % entry)
        outputs, values = [], []
        for values_in in args:
            value = fn(*values_in)
            if capture.over:
                return
            problem = _plain(value, limit)
            if problem == "large":
                capture.over = True
                return
            if problem is not None:
                raise TypeError("the output is not a plain literal (it holds %s)" % problem)
            text = repr(value)
            if len(text) > limit:
                capture.over = True
                return
            if not _same(ast.literal_eval(text), value):
                raise ValueError("the output %s does not read back as a literal" % text[:100])
            outputs.append(text)
            values.append(value)
    finally:
        sys.stdout = sys.__stdout__
    record["outputs"] = outputs
    if expect is not None:
        record["matches"] = [_same(v, e) for v, e in zip(values, expect)]


try:
    _main()
except BaseException as exc:
    _emit({"status": "error", "message": "runner failed: " + _describe(exc), "guards": []})
'''


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
    """

    cpu_s: float = 1.0
    wall_s: float = 5.0
    memory_bytes: int = 256 * 2**20
    output_chars: int = 2**16
    file_bytes: int = 2**16
    open_files: int = 16

    def __post_init__(self) -> None:
        check_float("cpu_s", self.cpu_s, low=0.0, high=600.0, low_open=True)
        check_float("wall_s", self.wall_s, low=0.0, high=3600.0, low_open=True)
        if self.wall_s < self.cpu_s:
            raise InvalidValueError(f"`wall_s` must be >= `cpu_s` ({self.cpu_s}), got {self.wall_s}")
        check_int("memory_bytes", self.memory_bytes, low=32 * 2**20, high=2**40)
        check_int("output_chars", self.output_chars, low=16, high=2**26)
        check_int("file_bytes", self.file_bytes, low=0, high=2**40)
        check_int("open_files", self.open_files, low=4, high=2**16)


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
        outputs: the ``repr`` of each call's return value (``status == "ok"`` only).
        matches: with ``Job.expect``: whether each output equals its expected value
            (:meth:`Sandbox.same_value`: one entry).
        stdout: what the program printed (at most ``output_chars``).
        message: why it was refused or failed ("" when ok).
        guards: the confinement that was in effect: ``"rlimits"``, ``"nproc"``, ``"netns"``
            (network cut), ``"chroot"``, ``"uid"`` (privileges dropped).
        cpu_s: CPU seconds the child used (0.0 when it never started).
    """

    status: str
    outputs: tuple[str, ...] = ()
    matches: tuple[bool, ...] = ()
    stdout: str = ""
    message: str = ""
    guards: tuple[str, ...] = ()
    cpu_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class Sandbox:
    """Runs model-written programs, one fresh child interpreter per program (module docstring).

    Args:
        limits: the :class:`Limits` of every run.
        workers: how many children :meth:`run_many` and :meth:`validate_many` run at once.
        uid: the user id the child drops to when this process is root.
        gid: the group id the child drops to when this process is root.
        cut_network: try to give the child an empty network namespace.
        ast_check: TEST ONLY. False skips the allowlist and gives the program the full builtins, so
            that only the OS limits hold it.
        tmp_dir: where the per-run temporary directories go (default: the system's temp dir).
    """

    def __init__(
        self,
        limits: Limits | None = None,
        *,
        workers: int = 1,
        uid: int = 65534,
        gid: int = 65534,
        cut_network: bool = True,
        ast_check: bool = True,
        tmp_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if limits is None:
            limits = Limits()
        if not isinstance(limits, Limits):
            raise InvalidTypeError(f"`limits` must be a Limits, got {type(limits).__name__}")
        self.limits = limits
        self.workers = check_int("workers", workers, low=1, high=256)
        self.uid = check_int("uid", uid, low=1, high=2**32 - 2)
        self.gid = check_int("gid", gid, low=1, high=2**32 - 2)
        self.cut_network = check_bool("cut_network", cut_network)
        self.ast_check = check_bool("ast_check", ast_check)
        if tmp_dir is not None and not os.path.isdir(tmp_dir):
            raise InvalidValueError(f"`tmp_dir` must be an existing directory, got {tmp_dir!r}")
        self.tmp_dir = None if tmp_dir is None else os.fspath(tmp_dir)
        self._argv = [sys.executable, "-s", "-S", "-B"] + (["-P"] if sys.version_info >= (3, 11) else [])

    def __repr__(self) -> str:
        return f"Sandbox({self.limits}, workers={self.workers}, ast_check={self.ast_check})"

    # ------------------------------------------------------------------ public calls

    def run(self, job: Job, *, hash_seed: int = 0) -> RunResult:
        """Run ``job`` once in a fresh child with ``PYTHONHASHSEED=hash_seed``."""
        return self._run_job(self._check_job(job), check_int("hash_seed", hash_seed, low=0, high=2**32 - 1))

    def run_many(self, jobs: Sequence[Job], *, hash_seed: int = 0) -> list[RunResult]:
        """Run every job once (``workers`` at a time); results in the order of ``jobs``."""
        jobs = [self._check_job(job) for job in jobs]
        seed = check_int("hash_seed", hash_seed, low=0, high=2**32 - 1)
        return self._map(lambda job: self._run_job(job, seed), jobs)

    def validate(self, job: Job) -> RunResult:
        """Run ``job`` with hash seeds 0 and 1: the seed-0 result when both are ``ok`` and agree (outputs,
        matches, printed text); the first failure when one failed; else status ``nondeterministic``."""
        return self.validate_many([job])[0]

    def validate_many(self, jobs: Sequence[Job]) -> list[RunResult]:
        """:meth:`validate` for every job (``workers`` children at a time)."""
        jobs = [self._check_job(job) for job in jobs]
        pairs = [(job, seed) for job in jobs for seed in (0, 1)]
        runs = self._map(lambda pair: self._run_job(*pair), pairs)
        return [_agree(runs[2 * i], runs[2 * i + 1]) for i in range(len(jobs))]

    def same_value(self, a: str, b: str) -> bool:
        """Whether the literals ``a`` and ``b`` are equal values of the same types (read in a child: the
        text may be model-written). False when either is not a literal or the child fails."""
        if not isinstance(a, str) or not isinstance(b, str):
            raise InvalidTypeError(f"`a` and `b` must be str, got {type(a).__name__} and {type(b).__name__}")
        if len(a) + len(b) > MAX_TEXT_CHARS:
            return False
        result = self._spawn({"mode": "same", "a": a, "b": b, "preload": []}, 0)
        return result.ok and result.matches == (True,)

    # ------------------------------------------------------------------ internals

    def _check_job(self, job: Job) -> Job:
        if not isinstance(job, Job):
            raise InvalidTypeError(f"a job must be a Job, got {type(job).__name__}")
        return job

    def _map(self, fn, items: list) -> list:
        if self.workers == 1 or len(items) <= 1:
            return [fn(item) for item in items]
        with ThreadPoolExecutor(max_workers=min(self.workers, len(items))) as pool:
            return list(pool.map(fn, items))

    def _run_job(self, job: Job, seed: int) -> RunResult:
        if len(job.source) > MAX_SOURCE_CHARS:
            return RunResult("refused", message=f"the program has over {MAX_SOURCE_CHARS} characters")
        text = sum(map(len, job.inputs)) + (sum(map(len, job.expect)) if job.expect is not None else 0)
        if text > MAX_TEXT_CHARS:
            return RunResult("refused", message=f"the inputs and outputs have over {MAX_TEXT_CHARS} characters")
        payload = {
            "mode": "run",
            "source": job.source,
            "inputs": list(job.inputs),
            "entry": job.entry,
            "expect": None if job.expect is None else list(job.expect),
            "ast": self.ast_check,
            "preload": _preload(job.source, self.ast_check),
            "allowed": {k: (None if v is None else list(v)) for k, v in ALLOWED_MODULES.items()},
            "builtins": list(SAFE_BUILTINS),
            "denied_names": sorted(DENIED_NAMES),
            "denied_attrs": sorted(DENIED_ATTRIBUTES),
        }
        return self._spawn(payload, seed)

    def _spawn(self, payload: dict, seed: int) -> RunResult:
        limits = self.limits
        payload = dict(
            payload,
            cpu_s=float(limits.cpu_s),
            memory_bytes=limits.memory_bytes,
            out_chars=limits.output_chars,
            file_bytes=limits.file_bytes,
            open_files=limits.open_files,
            uid=self.uid,
            gid=self.gid,
            net=self.cut_network,
        )
        payload.setdefault("ast", True)
        root = os.geteuid() == 0
        netns = _shared_netns() if self.cut_network and root else None
        payload["netns_fd"] = netns
        workdir = tempfile.mkdtemp(prefix="populora-sandbox-", dir=self.tmp_dir)
        try:
            with open(os.path.join(workdir, "job.bin"), "wb") as fh:
                fh.write(marshal.dumps(payload))
            if root:
                os.chown(workdir, self.uid, self.gid)
            proc = subprocess.Popen(
                [*self._argv, "-c", RUNNER],
                cwd=workdir,
                env={"PYTHONHASHSEED": str(seed)},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                close_fds=True,
                pass_fds=() if netns is None else (netns,),
                start_new_session=True,
            )
            cpu = 0.0
            try:
                data, stop = _collect(proc, limits.wall_s, 8 * limits.output_chars + 2**16)
            finally:
                # the group is killed while its leader is not yet reaped, so its id cannot be reused
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                assert proc.stdout is not None  # stdout=PIPE
                proc.stdout.close()
                _, status, usage = os.wait4(proc.pid, 0)
                proc.returncode = os.waitstatus_to_exitcode(status)
                cpu = usage.ru_utime + usage.ru_stime
        finally:
            _remove(workdir)
        return dataclasses.replace(_classify(data, stop, proc.returncode, limits), cpu_s=cpu)


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


def _collect(proc: subprocess.Popen, wall_s: float, cap: int) -> tuple[bytes, str]:
    """Read the child's output until EOF and exit (``"done"``), the deadline (``"wall"``) or more than
    ``cap`` bytes (``"output"``)."""
    deadline = time.monotonic() + wall_s
    assert proc.stdout is not None  # started with stdout=PIPE
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    size = 0
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return b"".join(chunks), "wall"
            if not selector.select(left):
                continue
            try:
                chunk = os.read(fd, 2**16)
            except BlockingIOError:
                continue
            if not chunk:
                break
            size += len(chunk)
            chunks.append(chunk)
            if size > cap:
                return b"".join(chunks), "output"
    data = b"".join(chunks)
    # EOF came first; the exit follows at once. WNOWAIT leaves the child unreaped (its process
    # group id stays reserved until the caller has killed the group).
    while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
        if time.monotonic() >= deadline:
            return data, "wall"
        time.sleep(0.001)
    return data, "done"


def _classify(data: bytes, stop: str, returncode: int | None, limits: Limits) -> RunResult:
    if stop == "wall":
        return RunResult("timeout", message=f"wall-clock limit ({limits.wall_s} s)")
    if stop == "output":
        return RunResult("output_limit", message="the child wrote more than the parent reads")
    lines = data.rstrip(b"\n").rsplit(b"\n", 1)
    record = None
    try:
        record = json.loads(lines[-1].decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        pass
    if returncode == 0 and isinstance(record, dict) and record.get("status") in STATUSES:
        try:
            return RunResult(
                status=record["status"],
                outputs=tuple(str(x) for x in record.get("outputs") or ()),
                matches=tuple(x is True for x in record.get("matches") or ()),
                stdout=str(record.get("stdout") or ""),
                message=str(record.get("message") or ""),
                guards=tuple(str(x) for x in record.get("guards") or ()),
            )
        except (TypeError, AttributeError):
            pass
    if returncode is not None and returncode < 0:
        sig = -returncode
        if sig in (signal.SIGPROF, signal.SIGXCPU, signal.SIGKILL):
            return RunResult("timeout", message=f"CPU limit ({limits.cpu_s} s): killed by {signal.Signals(sig).name}")
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return RunResult("error", message=f"the child was killed by {name}")
    tail = data[-300:].decode("utf-8", "replace")
    if b"MemoryError" in data[-2000:]:
        return RunResult("memory", message="MemoryError outside the program")
    return RunResult("error", message=f"the child exited with code {returncode} and no result: {tail!r}")


def _agree(first: RunResult, second: RunResult) -> RunResult:
    for result in (first, second):
        if not result.ok:
            return result
    if (first.outputs, first.matches, first.stdout) != (second.outputs, second.matches, second.stdout):
        return dataclasses.replace(
            first,
            status="nondeterministic",
            message=f"hash seeds 0 and 1 disagree: {first.outputs[:3]} vs {second.outputs[:3]}"[:300],
        )
    return first


def _remove(path: str) -> None:
    """Remove a run's directory, even one whose files the child made unreadable."""
    shutil.rmtree(path, ignore_errors=True)
    if os.path.exists(path):
        for root, dirs, _ in os.walk(path):
            for name in dirs:
                try:
                    os.chmod(os.path.join(root, name), 0o700)
                except OSError:
                    pass
        shutil.rmtree(path, ignore_errors=True)
