"""Run untrusted Python (model-written programs) in a throw-away sandbox.

    result = run_python("print(sum(range(10)))", timeout=5)
    result.status, result.stdout, result.isolation   # "ok", "45\\n", ("pid-ns", "net-ns", ...)

Threat model: the program is arbitrary, possibly hostile code written by a language model. It must
not hang the caller, exhaust the machine's memory or process table, write outside a scratch
directory, reach the network, or outlive its run; whatever it does, the caller gets a verdict.

Process tree (all three are the same Python as the caller, started with `-I -S -B`: isolated
mode, no site-packages, no .pyc writes):

    caller --Popen--> launcher: unshare namespaces, mounts, report layers     (new session)
                        '--fork--> supervisor: PID 1 of the new PID namespace; seccomp; waits, reports
                                     '--fork+exec--> user program: rlimits, unprivileged, no caps;
                                                     runs `sandbox_guard` first, then the code

Layers, strongest first; `SandboxResult.isolation` names the ones that were active:
- `pid-ns`: the program sees only its own processes; when the supervisor (PID 1) exits, the
  kernel kills everything left in the namespace, so nothing outlives the run.
- `net-ns`: a network namespace with only a downed loopback, so no connection (not even to
  127.0.0.1 of the host, nor to an abstract UNIX socket) can be made. `ipc-ns`, `uts-ns`: no
  SysV IPC / hostname sharing.
- `mount-ns` + `read-only-root`: every mount is remounted read-only in a private mount
  namespace; `private-tmp`: a fresh size-limited tmpfs on /tmp is the working directory (and
  HOME, TMPDIR), freed when the namespace dies; `hidden-host-dirs`: every top-level directory
  but the system's (/usr, /bin, /sbin, /lib*, /etc, /nix, /gnu) is covered by an empty tmpfs, and
  so is $HOME, with only the Python installation bound back in read-only: /home, /root, /var,
  /run, /opt, /srv, /mnt, the code and data of the caller (where tests and their expected
  answers may lie), and the host's socket files (read-only does not stop `connect()` to a
  socket) are out of sight; `minimal-dev`: /dev holds only null, zero, full, random, urandom (no
  /dev/shm); `private-proc`: /proc shows the namespace's processes only.
- `user-ns` (callers that are not root): the namespaces above are created inside a user namespace
  mapping only the caller's uid; `unprivileged-uid` (root callers): the program runs as a fresh,
  random uid/gid that owns nothing on the host, so RLIMIT_NPROC counts exactly its processes;
  `no-new-privs`: setuid binaries and file capabilities grant nothing; exec drops all
  capabilities.
- `seccomp` (Linux x86_64 / aarch64, `sandbox_seccomp`): a kernel filter on the program's system
  calls: no AF_UNIX socket anywhere (so no host socket file, wherever it lies), no io_uring, no
  other ABI; in the fallback below also no socket at all, no writing open relative to a directory
  descriptor, no mknod, no pidfd, ptrace or process_vm_*, no open by file handle.
- `rlimits`: RLIMIT_CPU, RLIMIT_AS (memory), RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE = 0, and
  with the namespaces RLIMIT_NPROC (fork bombs; it counts the processes and threads of a uid, so
  it is set only where the program's uid is its own). `process-group`: the caller kills the
  whole session on a wall-clock timeout, on output overflow and after every run; the launcher
  is a child subreaper and returns only when every process of the run has been reaped.
  `clean-env`: only PATH, HOME, TMPDIR, LANG.
- `audit-hook` (fallback, when a kernel layer is missing or with `isolation="audit"`; see
  `sandbox_guard`): the working directory is a fresh host temp dir (deleted after the run) and
  the program keeps the caller's uid (root stays root). A `sys.addaudithook` hook refuses
  process creation, signals to other processes, opening other processes' /proc files, sockets,
  ctypes, setting rlimits, mkfifo / mknod and native modules that write files on their own
  (sqlite3, dbm, shared memory, readline); it lets open-for-writing, remove, rmdir, mkdir, rename, link, symlink, chmod,
  chown, utime, truncate, setxattr and rmtree through only inside the working directory,
  judging the real place: dir_fd-relative paths and file descriptors are resolved through
  /proc/self/fd, symlinks followed. Not protected in this mode: reads of anything the uid may
  read; a race in which another thread swaps a checked path for a symlink before the call uses
  it; code that gets past the hook (a C extension, an interpreter bug), except for what the
  seccomp filter refuses in the kernel; writes through an API the hook does not know. It is a
  tripwire for a careless or ordinary program, not a boundary against a determined one.

Not protected: reading host files that the program's uid may read (in namespace mode: the system
directories and the Python installation; in the fallback: everything); CPU time taken from other
processes up to the limits; kernel exploits; side channels. The
namespace and seccomp layers need Linux; elsewhere only rlimits, the audit hook and the process
group apply.
"""

from __future__ import annotations

import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ISOLATION_MODES = ("auto", "namespaces", "audit")
MARKER = "metagen-sandbox"  # in every sandbox process's command line
LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_launcher.py")


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up (not a verdict about the program)."""


@dataclass
class SandboxResult:
    """What a run did.

    status: "ok" (exit code 0), "error" (non-zero exit or uncaught exception), "timeout" (wall
        clock or CPU limit), "memory" (MemoryError / allocation failure), "output_limit"
        (stdout or stderr passed max_output_bytes) or "killed" (ended by another signal, or its
        supervisor was killed so how it ended is unknown).
    returncode: the exit code, or -signal when a signal ended it (None when the caller killed it
        or it is unknown).
    stdout, stderr: decoded as UTF-8 (invalid bytes replaced), each cut at max_output_bytes.
    detail: one line on why the run ended when it did not end by itself.
    isolation: the layers that were active (see the module docstring).
    """

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_seconds: float
    isolation: tuple[str, ...]
    cpu_seconds: float = 0.0
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def run_python(
    code: str,
    *,
    stdin: str = "",
    timeout: float = 10.0,
    memory_mb: int = 512,
    cpu_seconds: float | None = None,
    max_output_bytes: int = 1_000_000,
    files: dict[str, str] | None = None,
    disk_mb: int = 64,
    max_processes: int = 16,
    isolation: str = "auto",
) -> SandboxResult:
    """Run `code` as a Python program in a sandbox and report how it ended.

    timeout: wall-clock seconds, startup included. cpu_seconds: RLIMIT_CPU (default: timeout).
    memory_mb: RLIMIT_AS. disk_mb: size of the working tmpfs and RLIMIT_FSIZE. max_processes:
    RLIMIT_NPROC, processes and threads at once (namespace isolation only; the audit hook refuses
    process creation instead). files: relative path -> text written into the working directory.
    isolation: "auto" (strongest available), "namespaces" (raise SandboxError without them),
    "audit" (no namespaces: rlimits, the audit hook and, on Linux, the fallback's seccomp filter).
    Only the standard library is importable (the interpreter runs with -I -S).
    """
    _check_arguments(timeout, memory_mb, cpu_seconds, max_output_bytes, disk_mb, max_processes, isolation)
    files = dict(files or {})
    for name in files:
        parts = name.replace("\\", "/").split("/")
        if not name or name.startswith("/") or ".." in parts:
            raise ValueError(f"files key {name!r} must be a relative path inside the working directory")
    job_dir = tempfile.mkdtemp(prefix=MARKER + "-")
    try:
        os.mkdir(os.path.join(job_dir, "work"), 0o700)
        job = {
            "code": code,
            "files": files,
            "fallback_workdir": os.path.join(job_dir, "work"),
            "isolation": isolation,
            "python": os.path.realpath(sys.executable),
            "keep_visible": _python_install_paths(),
            "home": os.path.expanduser("~"),
            "cpu_seconds": math.ceil(cpu_seconds if cpu_seconds is not None else timeout),
            "memory_bytes": memory_mb << 20,
            "disk_mb": disk_mb,
            "max_processes": max_processes,
        }
        job_path = os.path.join(job_dir, "job.json")
        with open(job_path, "w", encoding="utf-8") as handle:
            json.dump(job, handle)
        stdin_path = os.path.join(job_dir, "stdin")
        with open(stdin_path, "w", encoding="utf-8") as handle:
            handle.write(stdin)
        return _run_launcher(job_path, stdin_path, timeout, max_output_bytes)
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)


def _python_install_paths() -> list[str]:
    """The directories the program's interpreter needs (binary, stdlib), outermost only."""
    paths = {os.path.realpath(sys.base_prefix), os.path.dirname(os.path.realpath(sys.executable))}
    return sorted(p for p in paths if not any(p != q and p.startswith(q + "/") for q in paths))


def _check_arguments(timeout, memory_mb, cpu_seconds, max_output_bytes, disk_mb, max_processes, isolation) -> None:
    for name, value, low in (("timeout", timeout, 0.0), ("cpu_seconds", cpu_seconds, 0.0)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > low):
            raise ValueError(f"{name}={value!r} is out of range: must be a number > 0")
    for name, value, low in (("memory_mb", memory_mb, 32), ("max_output_bytes", max_output_bytes, 1),
                             ("disk_mb", disk_mb, 1), ("max_processes", max_processes, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name}={value!r} is out of range: must be an int >= {low}")
    if isolation not in ISOLATION_MODES:
        raise ValueError(f"isolation={isolation!r} must be one of {ISOLATION_MODES}")


def _run_launcher(job_path: str, stdin_path: str, timeout: float, limit: int) -> SandboxResult:
    """Start the launcher in a new session, read its pipes until EOF, the deadline or the output
    limit, then kill the session whatever happened."""
    start = time.monotonic()
    report_read, report_write = os.pipe()
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    try:
        with open(stdin_path, "rb") as stdin:
            process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", LAUNCHER, "--launch", job_path, str(report_write)],
                stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd="/",
                start_new_session=True, pass_fds=(report_write,),
            )
    finally:
        os.close(report_write)
    report_file = os.fdopen(report_read, "rb")
    streams = {process.stdout: bytearray(), process.stderr: bytearray(), report_file: bytearray()}
    reason = ""
    try:
        with selectors.DefaultSelector() as selector:
            for stream in streams:
                selector.register(stream, selectors.EVENT_READ)
            while selector.get_map() and not reason:
                remaining = start + timeout - time.monotonic()
                if remaining <= 0:
                    reason = "timeout"
                    break
                for key, _ in selector.select(remaining):
                    data = os.read(key.fd, 65536)
                    if not data:
                        selector.unregister(key.fileobj)
                        continue
                    streams[key.fileobj] += data
                    if key.fileobj is not report_file and len(streams[key.fileobj]) > limit:
                        reason = "output_limit"
    finally:  # also when the caller is interrupted
        _stop(process)
    wall = time.monotonic() - start
    for stream in streams:
        stream.close()
    stdout, stderr = (bytes(streams[s][:limit]).decode("utf-8", "replace") for s in (process.stdout, process.stderr))
    report: dict = {}
    for line in bytes(streams[report_file]).decode("utf-8", "replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:  # a line cut short by the kill
            continue
        if isinstance(record, dict):
            report.update(record)
    if "error" in report:
        raise SandboxError(f"sandbox setup failed: {report['error']}")
    if "layers" not in report:
        raise SandboxError(f"sandbox launcher ended without a report (exit {process.returncode}): {stderr[-2000:]}")
    if not reason and "returncode" not in report:  # set up, then the supervisor died: the program's doing
        reason = "lost"
    return _verdict(reason, report, stdout, stderr, wall, timeout, limit)


def _stop(process: subprocess.Popen) -> None:
    """End the run and everything it started before returning.

    SIGTERM asks the launcher to kill the supervisor and wait for it; when PID 1 of a namespace
    has died, the kernel has killed and reaped every other process in it. Then SIGKILL goes to the
    whole session (what is left without a PID namespace, or a launcher that did not answer),
    while the launcher is still unreaped, so the session id cannot have been reused.
    """
    def exited() -> bool:  # without reaping (Popen.poll would reap)
        return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None

    if not exited():
        os.kill(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 2.0
    while not exited() and time.monotonic() < deadline:
        time.sleep(0.005)
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def _verdict(reason: str, report: dict, stdout: str, stderr: str, wall: float, timeout: float, limit: int):
    isolation = tuple(report.get("layers", ()))
    returncode, cpu = report.get("returncode"), float(report.get("cpu_seconds", 0.0))
    result = SandboxResult("ok", returncode, stdout, stderr, wall, isolation, cpu)
    tail = stderr.strip().splitlines()[-1:] if stderr.strip() else []
    if reason == "timeout":
        result.status, result.returncode, result.detail = "timeout", None, f"wall-clock limit of {timeout:g} s reached"
    elif reason == "output_limit":
        result.status, result.returncode, result.detail = "output_limit", None, f"output passed {limit} bytes"
    elif reason == "lost":
        result.status, result.returncode, result.detail = "killed", None, "the sandbox's supervisor was killed"
    elif returncode is not None and returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else str(-returncode)
        if -returncode == signal.SIGXCPU or (-returncode == signal.SIGKILL and cpu >= report.get("cpu_limit", math.inf)):
            result.status, result.detail = "timeout", f"CPU limit of {report.get('cpu_limit')} s reached ({name})"
        else:
            result.status, result.detail = "killed", f"ended by {name}"
    elif returncode:
        memory = tail and (tail[0].startswith("MemoryError") or "Cannot allocate memory" in tail[0])
        result.status = "memory" if memory else "error"
        result.detail = "memory limit reached" if memory else f"exit code {returncode}"
    return result
