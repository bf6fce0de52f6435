# populora-sandbox-runner
"""The sandbox's child: trusted code that confines itself and only then reads program text.

Started by :mod:`populora.tasks.sandbox` as ``python -s -S -B -P <this file>`` in a fresh run
directory holding ``job.bin`` (a ``marshal`` of plain values). It imports only the standard library
(never anything of populora: after the chroot nothing can be imported, and a module of the library
would widen what a program reaches). The process tree and the record it writes are described in
the module docstring of :mod:`populora.tasks.sandbox`; in short:

- the runner (R) reads the job, imports what programs may use, joins the empty network namespace,
  makes new PID, IPC and mount namespaces, mounts a size-bounded tmpfs on the run directory and
  chroots into it;
- with a PID namespace it forks a reaper (I, PID 1 of the namespace) that forks the program's
  process (P); without one it forks P itself. P is never PID 1, so the CPU timer's ``SIGPROF``
  kills it like any process;
- P takes a uid of its own, drops every capability, sets ``no_new_privs``, ``PR_SET_DUMPABLE`` 0,
  the resource limits and a seccomp filter, writes the ``guards`` frame, and only then reads program
  text. It returns nothing but what the program returned, each value in canonical type-tagged JSON
  (:func:`encode`), in one ``result`` frame on the record descriptor, and ends with ``os._exit``
  right after, so that no program code (finalisers, ``atexit``, a generator's ``finally:``) runs
  later;
- the process that forked P waits for it and writes the ``exit`` frame (its wait status and CPU).

Frames are lines of JSON on the record descriptor (never stdout). The expected outputs never
enter this process: the parent compares.
"""

from __future__ import annotations

import ctypes
import marshal
import os
import resource
import signal
import sys
from _json import encode_basestring as quote  # JSON string literal, non-ASCII kept, control characters escaped

# typing costs a child about 4 ms to import: the annotations are for the type checker only
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# prctl / syscall constants (linux/prctl.h, linux/sched.h, linux/seccomp.h, linux/filter.h)
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
PR_SET_PDEATHSIG = 1
SECCOMP_MODE_FILTER = 2
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEW_ANY = (
    CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
)
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REC = 0x4000
MS_PRIVATE = 1 << 18

# The syscalls the filter denies (EPERM), by architecture: tracing and reading other processes, the
# keyrings (shared by every process of a uid, so state that would outlive a run), and everything that
# changes namespaces or mounts. clone3 answers ENOSYS (its flags sit behind a pointer that a filter
# cannot read; libc then falls back to clone, whose namespace flags are checked).
_DENIED = {
    # AUDIT_ARCH_X86_64
    0xC000003E: {
        "ptrace": 101,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "keyctl": 250,
        "add_key": 248,
        "request_key": 249,
        "unshare": 272,
        "setns": 308,
        "mount": 165,
        "umount2": 166,
        "pivot_root": 155,
        "chroot": 161,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsmount": 432,
        "perf_event_open": 298,
        "bpf": 321,
        "userfaultfd": 323,
        "kcmp": 312,
        "io_uring_setup": 425,
    },
    # AUDIT_ARCH_AARCH64
    0xC00000B7: {
        "ptrace": 117,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "keyctl": 219,
        "add_key": 217,
        "request_key": 218,
        "unshare": 97,
        "setns": 268,
        "mount": 40,
        "umount2": 39,
        "pivot_root": 41,
        "chroot": 51,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsmount": 432,
        "perf_event_open": 241,
        "bpf": 280,
        "userfaultfd": 282,
        "kcmp": 272,
        "io_uring_setup": 425,
    },
}
_CLONE = {0xC000003E: 56, 0xC00000B7: 220}
_CLONE3 = 435
_MACHINE_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7, "arm64": 0xC00000B7}


def js(value: Any) -> str:
    """JSON text of a frame's plain values (None, bool, int, float, str, lists, dicts with str keys), by
    the C string encoder of ``_json``: importing ``json`` itself (and ``re`` with it) costs a child
    several milliseconds."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    kind = type(value)
    if kind is int or kind is float:
        return repr(value)
    if kind is str:
        return quote(value)
    if kind is list or kind is tuple:
        return "[" + ",".join([js(v) for v in value]) + "]"
    return "{" + ",".join([quote(k) + ":" + js(v) for k, v in value.items()]) + "}"


def write_frame(fd: int, frame: dict) -> None:
    """One line of JSON on the record descriptor, written in full."""
    data = (js(frame) + "\n").encode("utf-8", "surrogatepass")
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# ---------------------------------------------------------------------------------------- values


def plain(value, max_items):
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


def encode(value):
    """Canonical type-tagged JSON text of a plain literal (checked by :func:`plain` first).

    ``["none"]``, ``["bool", true]``, ``["int", "12"]``, ``["float", "1.5"]`` (``repr``; -0.0 is
    written 0.0, as ``==`` treats them), ``["str", "..."]``, ``["bytes", "<hex>"]``, ``["list", [...]]``,
    ``["tuple", [...]]``, ``["set", [...]]`` and ``["dict", [[k, v], ...]]``, the items of sets and the
    entries of dicts sorted by their own encoding, so equal values have equal texts whatever the
    insertion order or hash seed, and ``1``, ``1.0`` and ``True`` never do.
    """
    kind = type(value)
    if value is None:
        return '["none"]'
    if kind is bool:
        return '["bool",true]' if value else '["bool",false]'
    if kind is int:
        return f'["int","{int.__repr__(value)}"]'
    if kind is float:
        return f'["float","{float.__repr__(0.0 if value == 0 else value)}"]'
    if kind is str:
        return '["str",' + quote(value) + "]"
    if kind is bytes:
        return '["bytes","' + value.hex() + '"]'
    if kind is list or kind is tuple:
        return '["' + kind.__name__ + '",[' + ",".join([encode(x) for x in value]) + "]]"
    if kind is set:
        return '["set",[' + ",".join(sorted([encode(x) for x in value])) + "]]"
    if kind is dict:
        pairs = sorted([(encode(k), encode(v)) for k, v in value.items()])
        return '["dict",[' + ",".join(["[" + k + "," + v + "]" for k, v in pairs]) + "]]"
    raise TypeError(f"not a plain literal: {kind.__name__}")


def same(a, b):
    """Equal values of the same types, all the way down (the read-back check of an output)."""
    return encode(a) == encode(b)


def literal(text):
    import ast

    return ast.literal_eval(text.strip())


def arguments(text, entry):
    import ast

    tree = ast.parse(entry + "(" + text + "\n)", mode="eval")
    call = tree.body
    if (
        type(call) is not ast.Call
        or type(call.func) is not ast.Name
        or call.func.id != entry
        or call.keywords
        or any(type(a) is ast.Starred for a in call.args)
    ):
        raise ValueError("not an argument list")
    return tuple(ast.literal_eval(a) for a in call.args)


def describe(exc):
    """``Type: text`` of an exception raised by the runner itself (never of a program's exception:
    ``str`` of a program object would run program code)."""
    try:
        text = str(exc)
    except BaseException:
        text = ""
    return (type(exc).__name__ + (": " + text if text else ""))[:300]


def describe_program(exc):
    """The type name of a program's exception and, only for the exact builtin exception types whose
    arguments are plain str / int, their text: nothing here calls a method a program could replace."""
    kind = type(exc)
    name = kind.__name__ if kind.__module__ == "builtins" else "an exception of a program-defined class"
    args = exc.args if kind.__module__ == "builtins" and type(exc.args) is tuple else ()
    parts = []
    for arg in args[:3]:
        if type(arg) is str:
            parts.append(arg[:200])
        elif type(arg) is int and -(10**50) < arg < 10**50:
            parts.append(int.__repr__(arg))
        else:
            parts = []
            break
    return (name + (": " + ", ".join(parts) if parts else ""))[:300]


class Capture:
    """sys.stdout of a program: a buffer bounded in characters."""

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


# ---------------------------------------------------------------------------------------- allowlist


def check(tree, allowed, denied_names, denied_attrs, max_nodes):
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
    }  # fmt: skip

    def bad_name(name):
        return name is not None and (name.startswith("__") or name in denied_names)

    count = 0
    walk: Any = ast.walk(tree)  # the node classes' own fields are read below
    for node in walk:
        count += 1
        if count > max_nodes:
            return f"the program has more than {max_nodes} syntax nodes"
        kind = type(node).__name__
        if kind not in nodes_ok:
            return f"`{kind}` is not allowed"
        if kind == "Name" and bad_name(node.id):
            return f"the name `{node.id}` is not allowed"
        if kind == "Attribute" and (node.attr.startswith("_") or node.attr in denied_attrs):
            return f"the attribute `.{node.attr}` is not allowed"
        if kind == "FunctionDef" and bad_name(node.name):
            return f"the function name `{node.name}` is not allowed"
        if kind == "arg" and bad_name(node.arg):
            return f"the argument name `{node.arg}` is not allowed"
        if kind == "keyword" and bad_name(node.arg):
            return f"the keyword `{node.arg}` is not allowed"
        if kind == "ExceptHandler" and bad_name(node.name):
            return f"the name `{node.name}` is not allowed"
        if kind == "Nonlocal" and any(bad_name(n) for n in node.names):
            return "a name in `nonlocal` is not allowed"
        if kind == "Import":
            for a in node.names:
                if a.name not in allowed:
                    return "importing `{}` is not allowed (allowed: {})".format(a.name, ", ".join(sorted(allowed)))
                if bad_name(a.asname):
                    return f"the name `{a.asname}` is not allowed"
        if kind == "ImportFrom":
            if node.level or node.module not in allowed:
                return "importing from `{}` is not allowed (allowed: {})".format(
                    node.module, ", ".join(sorted(allowed))
                )
            names = allowed[node.module]
            for a in node.names:
                if (
                    a.name == "*"
                    or a.name.startswith("_")
                    or bad_name(a.asname)
                    or (names is not None and a.name not in names)
                ):
                    return f"`from {node.module} import {a.name}` is not allowed"
    return None


# ---------------------------------------------------------------------------------------- OS layer


def seccomp_program(arch):
    """The BPF program of the filter (classic BPF, ``struct sock_filter`` entries) for ``arch``."""
    ld_abs, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, kill, eperm, enosys = 0x7FFF0000, 0x80000000, 0x00050000 | 1, 0x00050000 | 38
    denied = sorted(_DENIED[arch].values())
    prog = [(ld_abs, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, kill), (ld_abs, 0, 0, 0)]
    if arch == 0xC000003E:
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, kill)]  # the x32 ABI: the same calls, other numbers
    prog += [(jeq, 0, 1, _CLONE3), (ret, 0, 0, enosys)]
    for nr in denied:
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, eperm)]
    # clone with a namespace flag (flags are the first argument: seccomp_data.args[0], low word at 16)
    prog += [(jeq, 0, 3, _CLONE[arch]), (ld_abs, 0, 0, 16), (jset, 0, 1, CLONE_NEW_ANY), (ret, 0, 0, eperm)]
    prog += [(ret, 0, 0, allow)]
    return prog


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def install_seccomp(libc: Any) -> str | None:
    """Install the filter; None when it holds, else why not."""
    arch = _MACHINE_ARCH.get(os.uname().machine)
    if arch is None:
        return f"no filter for the architecture {os.uname().machine}"

    prog = seccomp_program(arch)
    table = (SockFilter * len(prog))(*[SockFilter(*entry) for entry in prog])
    fprog = SockFprog(len(prog), table)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        return f"prctl(PR_SET_SECCOMP) failed: {os.strerror(ctypes.get_errno())}"
    return None


def drop_capabilities(libc: Any) -> str | None:
    """capset with empty sets (what setuid does from root; under a user namespace nothing else would)."""
    header = CapHeader(0x20080522, 0)
    data = (CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        return f"capset failed: {os.strerror(ctypes.get_errno())}"
    for cap in range(64):  # the bounding set: nothing can be regained, not even through a file capability
        if libc.prctl(24, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:  # PR_CAPBSET_DROP; EINVAL: no such cap
            break
    return None


def write_file(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class Setup:
    """What the runner applied, and why what it did not apply is missing."""

    def __init__(self):
        self.guards = []
        self.missing = []

    def held(self, name):
        self.guards.append(name)

    def lost(self, name, why):
        self.missing.append(f"{name}: {why}")


def confine_runner(job: dict, libc: Any, setup: Setup) -> str | None:
    """R's part, as root or in a user namespace of its own (module docstring of the sandbox)."""
    root = os.geteuid() == 0
    uid0, gid0 = os.getuid(), os.getgid()
    flags = CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNS
    userns = False
    if job["net"]:
        fd = job["netns_fd"]
        joined = fd is not None and root and libc.setns(fd, CLONE_NEWNET) == 0
        if fd is not None:
            os.close(fd)
        if joined:
            setup.held("netns")
        else:
            flags |= CLONE_NEWNET  # a fresh one below, with the other namespaces
    if not root:
        flags |= CLONE_NEWUSER
    if libc.unshare(flags) == 0:
        userns = not root
    else:
        err = os.strerror(ctypes.get_errno())
        # one at a time, to keep what the kernel grants
        flags_left = flags & ~CLONE_NEWUSER
        if not root:
            setup.lost("userns", f"unshare(CLONE_NEWUSER) failed: {err}")
            flags_left = 0
        flags = 0
        for flag in (CLONE_NEWPID, CLONE_NEWIPC, CLONE_NEWNS, CLONE_NEWNET):
            if flags_left & flag and libc.unshare(flag) == 0:
                flags |= flag
        if not flags & CLONE_NEWNS:
            setup.lost("mountns", f"unshare(CLONE_NEWNS) failed: {err}")
    if job["net"] and "netns" not in setup.guards:
        if flags & CLONE_NEWNET:
            setup.held("netns")
        else:
            setup.lost("netns", "no network namespace could be made or joined")
    if userns:
        setup.held("userns")
        # the parent's uid and gid only, mapped to themselves: the process keeps its capabilities in the new
        # namespace (for the mounts below) and P drops them all before the program runs
        try:
            write_file("/proc/self/setgroups", "deny")
            write_file("/proc/self/uid_map", f"{uid0} {uid0} 1")
            write_file("/proc/self/gid_map", f"{gid0} {gid0} 1")
        except OSError as exc:
            return "could not map the user namespace: " + describe(exc)
    for flag, name in ((CLONE_NEWPID, "pidns"), (CLONE_NEWIPC, "ipcns")):
        if flags & flag:
            setup.held(name)
        else:
            setup.lost(name, "unshare refused it")
    if flags & CLONE_NEWNS:
        setup.held("mountns")
        here = os.getcwd()
        options = f"size={job['disk_bytes']},nr_inodes={job['disk_files']},mode=0700"
        if root:
            options += f",uid={job['uid']},gid={job['gid']}"
        if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
            setup.lost("tmpfs", f"could not make / private: {os.strerror(ctypes.get_errno())}")
        elif libc.mount(b"tmpfs", here.encode(), b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, options.encode()) != 0:
            setup.lost("tmpfs", f"mount tmpfs failed: {os.strerror(ctypes.get_errno())}")
        else:
            os.chdir(here)  # into the mount, which hides the run directory on disk
            setup.held("tmpfs")
    else:
        setup.lost("tmpfs", "no mount namespace")
    if root or userns:
        try:
            os.chroot(".")
            os.chdir("/")
            setup.held("chroot")
        except OSError as exc:
            return "could not chroot: " + describe(exc)
    else:
        setup.lost("chroot", "not root and no user namespace")
    return None


def confine_program(job: dict, libc: Any, setup: Setup, pid1: int) -> str | None:
    """P's part, in the process that will run the program; None or why it must not run."""
    root = os.geteuid() == 0 and "userns" not in setup.guards
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0:
        setup.held("nnp")
    else:
        setup.lost("nnp", os.strerror(ctypes.get_errno()))
    if root:
        uid, gid = job["uid"], job["gid"]
        try:
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
        except OSError as exc:
            return "could not drop privileges: " + describe(exc)
        setup.held("uid")
    else:
        setup.lost("uid", "not root: the program runs as the parent's own uid")
    # after the uid change, which clears it: the program dies with its reaper
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != pid1:  # the reaper died before the line above: nothing may run unwatched
        return "the runner is gone"
    why = drop_capabilities(libc)
    if why is None:
        setup.held("caps")
    else:
        setup.lost("caps", why)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0:
        setup.held("nodump")
    else:
        setup.lost("nodump", os.strerror(ctypes.get_errno()))
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (job["file_bytes"], job["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (job["open_files"], job["open_files"]))
    resource.setrlimit(resource.RLIMIT_AS, (job["memory_bytes"], job["memory_bytes"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    setup.held("rlimits")
    # RLIMIT_NPROC is not enforced for a process that keeps CAP_SYS_RESOURCE or CAP_SYS_ADMIN
    if "uid" in setup.guards or "userns" in setup.guards or not root:
        setup.held("nproc")
    why = install_seccomp(libc)
    if why is None:
        setup.held("seccomp")
    else:
        setup.lost("seccomp", why)
    missing = [name for name in job["require"] if name not in setup.guards]
    if missing:
        return "required guards unavailable: " + "; ".join(
            [m for m in setup.missing if m.split(":")[0] in missing] or missing
        )
    return None


# ---------------------------------------------------------------------------------------- the run


def run_program(job, loaded, capture):
    """Read, check and run the program; the result frame (what the program returned, encoded)."""
    import ast
    import builtins

    limit = job["out_chars"]
    entry = job["entry"]
    if job["ast"]:
        try:
            tree = ast.parse(job["source"], "<program>", "exec")
        except BaseException as exc:
            return {"status": "refused", "message": describe(exc)}
        problem = check(tree, job["allowed"], set(job["denied_names"]), set(job["denied_attrs"]), 20000)
        if problem is None and not any(type(node) is ast.FunctionDef and node.name == entry for node in tree.body):
            problem = f"the program defines no function `{entry}`"
        if problem is not None:
            return {"status": "refused", "message": problem}
        proxies: dict[str, Any] = {}
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
                raise ImportError(f"importing {name} is not allowed")
            return proxies[name]

        table = {n: getattr(builtins, n) for n in job["builtins"] if hasattr(builtins, n)}
        table["__import__"] = importer
        scope: dict[str, Any] = {"__builtins__": table, "__name__": "__program__"}
        try:
            code = compile(tree, "<program>", "exec", dont_inherit=True)
        except BaseException as exc:
            return {"status": "refused", "message": describe(exc)}
    else:
        scope = {"__builtins__": builtins, "__name__": "__program__"}
        try:
            code = compile(job["source"], "<program>", "exec", dont_inherit=True)
        except BaseException as exc:
            return {"status": "refused", "message": describe(exc)}
    try:
        args = [arguments(text, entry) for text in job["inputs"]]
    except BaseException as exc:
        return {"status": "refused", "message": "an input is not a literal argument list: " + describe(exc)}
    values = []
    sys.stdout = capture
    try:
        exec(code, scope)
        fn: Any = scope.get(entry)
        if type(fn).__name__ != "function":
            return {"status": "error", "message": f"the program defines no function `{entry}`"}
        for values_in in args:
            value = fn(*values_in)
            if capture.over:
                break
            problem = plain(value, limit)
            if problem == "large":
                capture.over = True
                break
            if problem is not None:
                return {"status": "error", "message": f"the output is not a plain literal (it holds {problem})"}
            text = repr(value)  # exact builtin types only (checked above): no program method runs
            if len(text) > limit:
                capture.over = True
                break
            if not same(ast.literal_eval(text), value):
                return {"status": "error", "message": f"the output {text[:100]} does not read back as a literal"}
            tagged = encode(value)
            if len(tagged) > 12 * limit + 64:
                capture.over = True
                break
            values.append(tagged)
    except BaseException as exc:
        # the exception is the program's object: only its exact type is looked at
        if capture.over:
            pass  # the printed text went over the limit: the RuntimeError of Capture.write, or what came of it
        elif type(exc) is MemoryError:
            return {"status": "memory", "message": "MemoryError"}
        else:
            return {"status": "error", "message": describe_program(exc)}
    finally:
        sys.stdout = sys.__stdout__
    if capture.over:
        return {"status": "output_limit", "message": f"printed text or an output over {limit} characters"}
    return {"status": "ok", "values": values}


def encode_literals(job):
    """The ``encode`` mode: literal texts (model-written answers) to tagged values; runs no program."""
    values = []
    for text in job["texts"]:
        try:
            value = literal(text)
            problem = plain(value, job["out_chars"])
            values.append(encode(value) if problem is None else None)
        except BaseException:
            values.append(None)
    return {"status": "ok", "values": values}


def finish(fd, frame, stdout_parts):
    """Write the one result frame and end the process at once: nothing of the program runs later."""
    try:
        import gc

        gc.disable()  # no finaliser of a program object runs while the frame is built
        dumps = js
        text = '{{"k":"result","status":{},"message":{},"stdout":{},"values":[{}]}}\n'.format(
            dumps(frame["status"]),
            dumps(frame.get("message", "")),
            dumps("".join(stdout_parts or ())),
            ",".join(["null" if v is None else v for v in frame.get("values", ())]),
        )
        data = text.encode("utf-8", "surrogatepass")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except MemoryError:
        os._exit(3)
    except BaseException:
        os._exit(4)
    os._exit(0)


def reap(fd, pid):
    """Wait for P and write the exit frame (its wait status and CPU seconds); then end."""
    while True:
        try:
            _, status, usage = os.wait4(pid, 0)
            break
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    frame = {"k": "exit", "code": code if code >= 0 else 0, "signal": -code if code < 0 else 0}
    frame["cpu"] = usage.ru_utime + usage.ru_stime
    try:
        write_frame(fd, frame)
    finally:
        os._exit(0)


def main():
    with open("job.bin", "rb") as fh:
        job = marshal.loads(fh.read())
    os.unlink("job.bin")
    fd = job["record_fd"]
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    if job["mode"] == "encode":
        # no program code runs in this mode: only literal texts are read
        resource.setrlimit(resource.RLIMIT_AS, (job["memory_bytes"], job["memory_bytes"]))
        write_frame(fd, {"k": "guards", "guards": [], "missing": []})
        frame = encode_literals(job)
        frame["k"] = "result"
        finish(fd, frame, None)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    import ast  # noqa: F401  (before the chroot: run_program needs it after)
    import builtins  # noqa: F401
    import unicodedata  # noqa: F401  (NFKC normalisation of non-ASCII identifiers needs it)

    loaded = {}
    for name in job["preload"]:
        try:
            loaded[name] = __import__(name)
        except Exception:
            pass
    setup = Setup()
    why = confine_runner(job, libc, setup)
    # nothing of the same uid can trace the runner either (not earlier: a process that is not dumpable
    # cannot write its own uid_map)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    if why is not None:
        write_frame(fd, {"k": "setup", "message": why, "guards": setup.guards, "missing": setup.missing})
        os._exit(0)
    spent = resource.getrusage(resource.RUSAGE_SELF)
    cpu_left = max(0.01, job["cpu_s"] - (spent.ru_utime + spent.ru_stime))
    runner = os.getpid()
    if "pidns" in setup.guards:
        pid = os.fork()  # PID 1 of the namespace: the reaper; the program's process is its child
        if pid:
            _, status = os.waitpid(pid, 0)
            os._exit(0 if os.waitstatus_to_exitcode(status) == 0 else 5)
        runner = os.getpid()  # 1
    pid = os.fork()
    if pid:
        reap(fd, pid)
    try:
        why = confine_program(job, libc, setup, runner)
        if why is None:
            signal.setitimer(signal.ITIMER_PROF, cpu_left)
            hard = int(cpu_left) + 1
            resource.setrlimit(resource.RLIMIT_CPU, (hard, hard + 1))
    except BaseException as exc:
        why = "the runner failed to set up: " + describe(exc)
    if why is not None:
        write_frame(fd, {"k": "setup", "message": why, "guards": setup.guards, "missing": setup.missing})
        os._exit(0)
    write_frame(fd, {"k": "guards", "guards": setup.guards, "missing": setup.missing})
    capture = Capture(job["out_chars"])
    try:
        frame = run_program(job, loaded, capture)
    except MemoryError:
        frame = {"status": "memory", "message": "MemoryError"}
    except BaseException:
        frame = {"status": "error", "message": "the runner failed"}
    frame["k"] = "result"
    finish(fd, frame, capture.parts)


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        os._exit(6)
