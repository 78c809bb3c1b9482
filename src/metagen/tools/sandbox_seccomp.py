"""A seccomp-bpf filter for the sandboxed program (loaded by `sandbox_launcher`; standard library
only). The kernel applies it to every system call of the program and of anything it starts, so
native code (ctypes, a C extension) cannot get around it the way it could get around an audit hook.

Always (namespace and fallback mode):
- no AF_UNIX socket (`socket(AF_UNIX, ...)`): a read-only mount does not stop `connect()` to a
  world-writable socket file of the host; `socketpair(AF_UNIX, ...)` only for SOCK_STREAM (an
  already connected pair; a datagram socket could `sendto()` any socket file);
- no io_uring (its requests run outside this filter); no system call of another ABI (x32, or
  32-bit calls on a 64-bit kernel).
In the fallback (no namespaces; the program keeps the caller's uid, root included) also:
- no socket at all;
- no `openat` that writes relative to a directory descriptor (`os.open(..., dir_fd=d)`: its
  audit event names the path but not the directory), no `openat2`;
- no `mknod` / `mknodat` (`os.mkfifo`, `os.mknod` raise no audit event);
- no pidfds, ptrace, process_vm_readv/writev, name_to_handle_at / open_by_handle_at (ways to
  signal or read other processes, or open files without a path, that no audit event covers).
Denied calls fail with EPERM. Supported on x86_64 and aarch64 Linux; elsewhere `install` returns
False and the layer is missing.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import socket
import struct

ARCHES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}  # column in SYSCALLS, AUDIT_ARCH
X32_SYSCALL_BIT = 0x40000000
SYSCALLS = {  # name: (x86_64, aarch64); None where the architecture lacks the call
    "socket": (41, 198), "socketpair": (53, 199), "openat": (257, 56), "openat2": (437, 437),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "mknod": (133, None), "mknodat": (259, 33), "ptrace": (101, 117),
    "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "pidfd_open": (434, 434), "pidfd_send_signal": (424, 424), "pidfd_getfd": (438, 438),
    "name_to_handle_at": (303, 264), "open_by_handle_at": (304, 265),
}
ALWAYS_DENIED = ("io_uring_setup", "io_uring_enter", "io_uring_register")
FALLBACK_DENIED = ("socket", "openat2", "mknod", "mknodat", "ptrace", "process_vm_readv", "process_vm_writev",
                   "pidfd_open", "pidfd_send_signal", "pidfd_getfd", "name_to_handle_at", "open_by_handle_at")
AT_FDCWD = 0xFFFFFF9C  # -100 as an unsigned 32-bit argument
OPEN_WRITE_FLAGS = 0o1 | 0o2 | 0o100 | 0o1000 | 0o2000  # O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND
SOCK_FLAGS = 0o4000 | 0o2000000  # SOCK_NONBLOCK | SOCK_CLOEXEC
RET_ALLOW, RET_DENY = 0x7FFF0000, 0x00050000 | errno.EPERM  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO
LD_ABS, JEQ, JGE, JSET, AND, RET = 0x20, 0x15, 0x35, 0x45, 0x54, 0x06  # BPF opcodes (with BPF_K / BPF_W)
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2


def _argument(index: int) -> int:
    """Offset of the low 32 bits of argument `index` in struct seccomp_data (little-endian)."""
    return 16 + 8 * index


def program(fallback: bool) -> list[tuple[int, int, int, int]] | None:
    """The filter as BPF instructions (code, jt, jf, k), or None on an unsupported machine."""
    machine = platform.machine()
    if machine not in ARCHES:
        return None
    column, audit_arch = ARCHES[machine]
    number = {name: numbers[column] for name, numbers in SYSCALLS.items() if numbers[column] is not None}
    denied = [number[name] for name in ALWAYS_DENIED + (FALLBACK_DENIED if fallback else ()) if name in number]
    # (op, k, jump-if-true label, jump-if-false label); None = the next instruction
    code = [("ld", 4), ("jeq", audit_arch, None, "deny"), ("ld", 0)]
    if machine == "x86_64":
        code.append(("jge", X32_SYSCALL_BIT, "deny", None))
    code += [("jeq", n, "deny", None) for n in denied]
    code += [("jeq", number["socketpair"], "socketpair", None)]
    code += [("jeq", number["openat"], "openat", None)] if fallback else []
    code += [("jeq", number["socket"], "socket", None), ("ret", RET_ALLOW)]
    code += ["socket", ("ld", _argument(0)), ("jeq", socket.AF_UNIX, "deny", "allow")]
    code += ["socketpair", ("ld", _argument(0)), ("jeq", socket.AF_UNIX, None, "allow"), ("ld", _argument(1)),
             ("and", ~SOCK_FLAGS & 0xFFFFFFFF), ("jeq", socket.SOCK_STREAM, "allow", "deny")]
    if fallback:
        code += ["openat", ("ld", _argument(0)), ("jeq", AT_FDCWD, "allow", None), ("ld", _argument(2)),
                 ("jset", OPEN_WRITE_FLAGS, "deny", "allow")]
    code += ["allow", ("ret", RET_ALLOW), "deny", ("ret", RET_DENY)]
    return _assemble(code)


def _assemble(code: list) -> list[tuple[int, int, int, int]]:
    """Resolve labels (strings in `code`) into the forward jump offsets of classic BPF."""
    labels, position = {}, 0
    for item in code:
        if isinstance(item, str):
            labels[item] = position
        else:
            position += 1
    instructions = []
    for item in code:
        if isinstance(item, str):
            continue
        here = len(instructions)
        offset = lambda label: 0 if label is None else labels[label] - here - 1  # noqa: E731
        op = item[0]
        if op in ("jeq", "jge", "jset"):
            _, k, true, false = item
            instructions.append(({"jeq": JEQ, "jge": JGE, "jset": JSET}[op], offset(true), offset(false), k))
        else:
            instructions.append(({"ld": LD_ABS, "and": AND, "ret": RET}[op], 0, 0, item[1]))
    assert all(0 <= jt < 256 and 0 <= jf < 256 for _, jt, jf, _ in instructions)
    return instructions


def install(libc, fallback: bool) -> bool:
    """Load the filter into this process (no_new_privs must be set); False when this machine has
    no such filter or the kernel refuses it."""
    instructions = program(fallback)
    if instructions is None:
        return False
    raw = b"".join(struct.pack("=HBBI", *instruction) for instruction in instructions)
    buffer = ctypes.create_string_buffer(raw, len(raw))

    class Program(ctypes.Structure):  # struct sock_fprog
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = Program(len(instructions), ctypes.addressof(buffer))
    c_ulong = ctypes.c_ulong
    result = libc.prctl(PR_SET_SECCOMP, c_ulong(SECCOMP_MODE_FILTER), c_ulong(ctypes.addressof(fprog)), c_ulong(0), c_ulong(0))
    return result == 0
