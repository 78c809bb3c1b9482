"""Run untrusted Python (model-written programs) in a throw-away sandbox.

    result = run_python("print(sum(range(10)))", timeout=5)
    result.status, result.stdout, result.isolation   # "ok", "45\\n", ("pid-ns", "net-ns", ...)

Threat model: the program is arbitrary, possibly hostile code written by a language model. It must
not hang the caller, exhaust the machine's memory or process table, write outside a scratch
directory, reach the network, or outlive its run; whatever it does, the caller gets a verdict.

Process tree (all three are the same Python as the caller, started with `-I -S -B`: isolated
mode, no site-packages, no .pyc writes):

    caller --Popen--> launcher: unshare namespaces, mounts, report layers     (new session)
                        '--fork--> supervisor: PID 1 of the new PID namespace; waits, reports
                                     '--fork+exec--> user program: rlimits, unprivileged, no caps

Layers, strongest first; `SandboxResult.isolation` names the ones that were active:
- `pid-ns`: the program sees only its own processes; when the supervisor (PID 1) exits, the
  kernel kills everything left in the namespace, so nothing outlives the run.
- `net-ns`: a network namespace with only a downed loopback, so no connection (not even to
  127.0.0.1 of the host) can be made. `ipc-ns`, `uts-ns`: no SysV IPC / hostname sharing.
- `mount-ns` + `read-only-root`: every mount is remounted read-only in a private mount
  namespace; `private-tmp`: a fresh size-limited tmpfs on /tmp is the working directory (and
  HOME, TMPDIR), freed when the namespace dies; `hidden-home`: /root, /home and $HOME are covered
  by an empty tmpfs, with only the Python installation bound back in read-only;
  `minimal-dev`: /dev holds only null, zero, full, random, urandom; `private-proc`: /proc shows
  the namespace's processes only.
- `user-ns` (callers that are not root): the namespaces above are created inside a user namespace
  mapping only the caller's uid; `unprivileged-uid` (root callers): the program runs as a fresh,
  random uid/gid that owns nothing on the host, so RLIMIT_NPROC counts exactly its processes;
  `no-new-privs`: setuid binaries and file capabilities grant nothing; exec drops all
  capabilities.
- `rlimits`: RLIMIT_CPU, RLIMIT_AS (memory), RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE = 0, and
  with the namespaces RLIMIT_NPROC (fork bombs; it counts the processes and threads of a uid, so
  it is set only where the program's uid is its own). `process-group`: the caller kills the
  whole session on a wall-clock timeout, on output overflow and after every run. `clean-env`:
  only PATH, HOME, TMPDIR, LANG.
- `audit-hook` (fallback, when a kernel layer is missing or with `isolation="audit"`): a
  `sys.addaudithook` hook installed before the program runs refuses sockets, process creation
  (fork, exec, subprocess, os.system), signals to other processes, ctypes, and file writes
  outside the working directory (then a fresh host temp dir, deleted after the run). This is
  much weaker than kernel isolation: audit hooks are a tripwire, not a security boundary (a C
  extension or an interpreter bug bypasses them), and the program keeps the caller's uid.

Not protected: reading host files that the program's uid may read (the code, the stdlib, /etc);
CPU time taken from other processes up to the limits; kernel exploits; side channels. The
namespace layers need Linux; elsewhere only rlimits, the audit hook and the process group apply.
"""

from __future__ import annotations

import errno
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
FILE_LIMIT = 64  # RLIMIT_NOFILE of the program
UID_BASE = 2_000_000_000  # random per-run uids for root callers: far above any real account
MARKER = "metagen-sandbox"  # in every sandbox process's command line


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up (not a verdict about the program)."""


@dataclass
class SandboxResult:
    """What a run did.

    status: "ok" (exit code 0), "error" (non-zero exit or uncaught exception), "timeout" (wall
        clock or CPU limit), "memory" (MemoryError / allocation failure), "output_limit"
        (stdout or stderr passed max_output_bytes) or "killed" (ended by another signal).
    returncode: the exit code, or -signal when a signal ended it (None when the caller killed it).
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
    "audit" (rlimits + audit hook only: the portable fallback).
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
                [sys.executable, "-I", "-S", "-B", os.path.abspath(__file__), "--launch", job_path, str(report_write)],
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
            report.update(json.loads(line))
        except ValueError:  # a line cut short by the kill
            pass
    if "error" in report:
        raise SandboxError(f"sandbox setup failed: {report['error']}")
    if not reason and "returncode" not in report:
        raise SandboxError(f"sandbox launcher ended without a report (exit {process.returncode}): {stderr[-2000:]}")
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


# ---------------------------------------------------------------------------------------------
# Inside the sandbox: this file run as a script (`python -I -S -B sandbox.py --launch job fd`).
# Only the standard library is used below.

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE = 1024, 2048, 4096, 16384, 1 << 18
MS_RELATIME, MS_STRICTATIME = 1 << 21, 1 << 24
MOUNT_OPTION_FLAGS = {"ro": MS_RDONLY, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
                      "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME,
                      "strictatime": MS_STRICTATIME}
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
DEVICES = ("null", "zero", "full", "random", "urandom")
SYSTEM_DIRS = ("/", "/tmp", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/var", "/opt", "/proc", "/dev", "/sys")


class _Kernel:
    """unshare(2), mount(2), prctl(2) through libc (os.unshare needs Python >= 3.12)."""

    def __init__(self) -> None:
        import ctypes

        self.ctypes = ctypes
        self.libc = ctypes.CDLL(None, use_errno=True)

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            error = self.ctypes.get_errno()
            raise OSError(error, f"{what}: {os.strerror(error)}")

    def unshare(self, flags: int) -> None:
        self._check(self.libc.unshare(self.ctypes.c_int(flags)), "unshare")

    def mount(self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
        encode = lambda text: None if text is None else text.encode()  # noqa: E731
        result = self.libc.mount(encode(source), encode(target), encode(fstype), self.ctypes.c_ulong(flags), encode(data))
        self._check(result, f"mount {target}")

    def prctl(self, option: int, value: int) -> None:
        c_ulong = self.ctypes.c_ulong
        self._check(self.libc.prctl(option, c_ulong(value), c_ulong(0), c_ulong(0), c_ulong(0)), f"prctl {option}")


def _launch(job_path: str, report_fd: int) -> None:
    """Enter the namespaces, build the filesystem view, fork the supervisor, wait for it."""
    with open(job_path, encoding="utf-8") as handle:
        job = json.load(handle)
    report = os.fdopen(report_fd, "w", buffering=1)
    try:
        kernel = _Kernel()
        layers, identity = ["rlimits", "process-group", "clean-env", "no-new-privs"], None
        if job["isolation"] != "audit":
            identity = _enter_namespaces(kernel, job, layers)
        if identity is None and job["isolation"] == "namespaces":
            raise OSError("namespaces are not available here (isolation='namespaces')")
        workdir = job["fallback_workdir"]
        if identity is not None:
            workdir = "/tmp"
            _build_filesystem(kernel, job, identity, layers)
        if not {"pid-ns", "net-ns", "read-only-root"} <= set(layers):
            layers.append("audit-hook")
        report.write(json.dumps({"layers": layers, "cpu_limit": job["cpu_seconds"]}) + "\n")
    except Exception as error:  # noqa: BLE001 - any setup failure is reported to the caller
        report.write(json.dumps({"error": f"{type(error).__name__}: {error}"}) + "\n")
        os._exit(1)
    launcher, supervisor, stop = os.getpid(), [0], [False]

    def on_terminate(signum, frame) -> None:  # the caller's "stop now"
        if os.getpid() == launcher:  # (not in the supervisor between fork and its own reset)
            stop[0] = True
            if supervisor[0]:
                os.kill(supervisor[0], signal.SIGKILL)

    signal.signal(signal.SIGTERM, on_terminate)
    supervisor[0] = os.fork()
    if supervisor[0] == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _supervise(kernel, job, layers, identity, workdir, report, launcher)
    if stop[0]:
        os.kill(supervisor[0], signal.SIGKILL)
    report.close()
    os.waitpid(supervisor[0], 0)  # returns once the supervisor is dead, so its namespace is empty
    os._exit(0)


def _enter_namespaces(kernel: _Kernel, job: dict, layers: list[str]) -> tuple[int, int] | None:
    """unshare the namespaces; the uid/gid the program will run as, or None without namespaces.

    Root keeps the initial user namespace (it may set any uid) and later drops to a random uid;
    other users need a user namespace that maps their own uid only.
    """
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    uid, gid = os.geteuid(), os.getegid()
    try:
        if uid == 0:
            kernel.unshare(flags)
            layers.append("unprivileged-uid")
            offset = int.from_bytes(os.urandom(4), "little") % 100_000_000
            identity = (UID_BASE + offset, UID_BASE + offset)
        else:
            kernel.unshare(flags | CLONE_NEWUSER)
            for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                with open(f"/proc/self/{name}", "w") as handle:
                    handle.write(text)
            layers.append("user-ns")
            identity = (uid, gid)
    except OSError:
        return None
    layers += ["pid-ns", "net-ns", "ipc-ns", "uts-ns", "mount-ns"]
    return identity


def _build_filesystem(kernel: _Kernel, job: dict, identity: tuple[int, int], layers: list[str]) -> None:
    """Private propagation, everything read-only, then fresh tmpfs on /tmp, /dev and the homes."""
    kernel.mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates to the host
    keep = [path for path in job["keep_visible"] if os.path.isdir(path)]
    homes = {os.path.realpath(p) for p in ("/root", "/home", job["home"]) if os.path.isdir(p)}
    homes = {h for h in homes if h not in SYSTEM_DIRS and not h.startswith("/tmp/")}
    homes = {h for h in homes if not any(h.startswith(other + "/") for other in homes)}  # outermost
    handles = {path: os.open(path, os.O_PATH) for path in keep}
    devices = {name: os.open(f"/dev/{name}", os.O_PATH) for name in DEVICES if os.path.exists(f"/dev/{name}")}
    if not _remount_all_read_only(kernel):
        layers.append("read-only-root")
    uid, gid = identity
    disk_mb = job["disk_mb"]
    kernel.mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={disk_mb}m,mode=0700,uid={uid},gid={gid}")
    layers.append("private-tmp")
    try:
        kernel.mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755")
        for name, handle in devices.items():
            open(f"/dev/{name}", "w").close()
            kernel.mount(f"/proc/self/fd/{handle}", f"/dev/{name}", None, MS_BIND)
        for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                             ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
            os.symlink(target, f"/dev/{name}")
        kernel.mount(None, "/dev", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC)
        layers.append("minimal-dev")
        for home in sorted(homes):
            kernel.mount("tmpfs", home, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
            for path in keep:
                if path == home or path.startswith(home + "/"):  # the Python install lives here
                    os.makedirs(path, 0o755, exist_ok=True)
                    kernel.mount(f"/proc/self/fd/{handles[path]}", path, None, MS_BIND | MS_REC)
                    kernel.mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
            kernel.mount(None, home, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        if homes:
            layers.append("hidden-home")
    finally:
        for handle in (*handles.values(), *devices.values()):
            os.close(handle)


def _remount_all_read_only(kernel: _Kernel) -> list[str]:
    """Bind-remount every mount read-only, keeping its nosuid/nodev/noexec/atime flags (a user
    namespace may not clear them); the mount points that could not be remounted. Mounts hidden
    under another mount cannot be reached by path and are skipped."""
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    failed = []
    for line in lines:
        fields = line.split()
        target = fields[4].encode().decode("unicode_escape")  # \040 for spaces
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for option in fields[5].split(","):
            flags |= MOUNT_OPTION_FLAGS.get(option, 0)
        try:
            kernel.mount(None, target, None, flags)
        except OSError as error:
            if target == "/" or error.errno not in (errno.ENOENT, errno.ENOTDIR):
                failed.append(target)
    return failed


def _supervise(kernel, job, layers, identity, workdir, report, launcher: int) -> None:
    """The supervisor (PID 1 of the namespace): start the program, reap every process, report the
    program's exit status and CPU time. Its exit kills whatever is left in the namespace."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        kernel.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() not in (launcher, 0):  # the launcher died before the signal was armed
            os._exit(1)  # (0: PID 1 of a namespace sees no parent; the caller's killpg covers it)
        kernel.prctl(PR_SET_DUMPABLE, 0)
        if "pid-ns" in layers:
            try:
                kernel.mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY)
                layers.append("private-proc")
                report.write(json.dumps({"layers": layers}) + "\n")
            except OSError:
                pass  # e.g. a container that masks parts of /proc; the host's stays read-only
        code_read, code_write = os.pipe()
        error_read, error_write = os.pipe2(os.O_CLOEXEC)
        supervisor = os.getpid()
        pid = os.fork()
        if pid == 0:
            kernel.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # dies with the supervisor, even after setsid()
            if os.getppid() != supervisor:
                os._exit(1)
            _exec_program(kernel, job, layers, identity, workdir, code_read, code_write, error_write, report)
        os.close(code_read)
        os.close(error_write)
        try:
            with os.fdopen(code_write, "wb") as pipe:
                pipe.write(job["code"].encode("utf-8"))
        except BrokenPipeError:
            pass
        with os.fdopen(error_read, "rb") as pipe:
            failure = pipe.read().decode("utf-8", "replace")
        while True:
            finished, status, usage = os.wait4(-1, 0)
            if finished == pid:
                break
        if failure:
            report.write(json.dumps({"error": failure}) + "\n")
        else:
            returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            report.write(json.dumps({"layers": layers, "returncode": returncode,
                                     "cpu_seconds": usage.ru_utime + usage.ru_stime}) + "\n")
    except Exception as error:  # noqa: BLE001 - any supervisor failure is reported to the caller
        report.write(json.dumps({"error": f"{type(error).__name__}: {error}"}) + "\n")
    finally:
        report.flush()
        os._exit(0)


def _exec_program(kernel, job, layers, identity, workdir, code_read, code_write, error_write, report) -> None:
    """In the program's process: fds, identity, input files, limits, then exec a fresh interpreter
    (so the program starts with no capabilities and none of the launcher's state)."""
    import fcntl
    import resource

    try:
        report.close()
        os.close(code_write)
        error_write = fcntl.fcntl(error_write, fcntl.F_DUPFD_CLOEXEC, 100)  # out of the way
        code_read = fcntl.fcntl(code_read, fcntl.F_DUPFD_CLOEXEC, 100)
        os.closerange(3, 100)
        os.dup2(code_read, 3)  # the program's source, read by the bootstrap
        os.closerange(4, error_write)
        os.closerange(error_write + 1, 1 << 16)
        os.chdir(workdir)
        if "unprivileged-uid" in layers:
            uid, gid = identity
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)  # leaving uid 0 clears every capability
        for name, text in job["files"].items():
            os.makedirs(os.path.dirname(name) or ".", exist_ok=True)
            with open(name, "w", encoding="utf-8") as handle:
                handle.write(text)
        spare = 2 if "user-ns" in layers else 0  # launcher and supervisor share the program's uid there
        limits = {resource.RLIMIT_CPU: (job["cpu_seconds"], job["cpu_seconds"] + 1),
                  resource.RLIMIT_AS: (job["memory_bytes"],) * 2,
                  resource.RLIMIT_FSIZE: (job["disk_mb"] << 20,) * 2,
                  resource.RLIMIT_NOFILE: (FILE_LIMIT,) * 2,
                  resource.RLIMIT_CORE: (0, 0)}
        if "pid-ns" in layers:  # only there is the program's uid its own (the count is per uid)
            limits[resource.RLIMIT_NPROC] = (job["max_processes"] + spare,) * 2
        for kind, (soft, hard) in limits.items():
            current = resource.getrlimit(kind)[1]
            hard = hard if current == resource.RLIM_INFINITY else min(hard, current)
            resource.setrlimit(kind, (min(soft, hard), hard))
        kernel.prctl(PR_SET_NO_NEW_PRIVS, 1)
        env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
        audit = "1" if "audit-hook" in layers else "0"
        python = job["python"]
        os.execve(python, [python, "-I", "-S", "-B", "-X", "utf8", "-c", _PROGRAM_BOOTSTRAP, workdir, audit], env)
    except BaseException as error:  # noqa: BLE001 - reported through the close-on-exec pipe
        os.write(error_write, f"{type(error).__name__}: {error}".encode())
    finally:
        os._exit(127)


# Runs first in the program's interpreter: read the program from fd 3, optionally install the
# audit hook, then run it as __main__ in file "main.py" (tracebacks show its lines).
_PROGRAM_BOOTSTRAP = r'''# metagen-sandbox program bootstrap
def _prepare():
    import linecache, os, sys, traceback
    chunks = []
    while chunk := os.read(3, 1 << 16):
        chunks.append(chunk)
    os.close(3)
    source = b"".join(chunks).decode("utf-8", "replace")
    linecache.cache["main.py"] = (len(source), None, source.splitlines(True), "main.py")
    try:
        code = compile(source, "main.py", "exec")
    except (SyntaxError, ValueError) as error:
        traceback.print_exception(type(error), error, None)
        sys.exit(1)
    workdir, audit = sys.argv[1], sys.argv[2] == "1"
    sys.argv = ["main.py"]
    if audit:
        sys.addaudithook(_hook(os.path.realpath(workdir)))
    return code

def _hook(root):
    import os
    refused = {"os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
               "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill",
               "socket.__new__", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "sys.addaudithook"}
    path_events = {"os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "os.chmod": 1, "os.chown": 1,
                   "os.truncate": 1, "os.utime": 1, "os.rename": 2, "os.link": 2, "os.symlink": 2,
                   "shutil.rmtree": 1, "sqlite3.connect": 1}
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    realpath, fspath = os.path.realpath, os.fspath

    def inside(path):
        if isinstance(path, int):
            return True
        path = realpath(fspath(path))
        return path == root or path.startswith(root + "/")

    def hook(event, args):
        if event in refused or (event == "import" and args[0] in ("_posixsubprocess", "_ctypes")):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "open" and args[2] & writing and not inside(args[0]):
            raise PermissionError(f"sandbox: writing {args[0]!r} outside the working directory is not allowed")
        if event in path_events and not all(inside(a) for a in args[: path_events[event]]):
            raise PermissionError(f"sandbox: {event} outside the working directory is not allowed")

    return hook

_code = _prepare()
del _prepare, _hook
try:
    exec(globals().pop("_code"))
except SystemExit:
    raise
except BaseException as _error:
    _error = _error.with_traceback(_error.__traceback__.tb_next)  # drop this file's frame
    __import__("traceback").print_exception(type(_error), _error, _error.__traceback__)
    raise SystemExit(1)
'''


if __name__ == "__main__" and sys.argv[1:2] == ["--launch"]:
    _launch(sys.argv[2], int(sys.argv[3]))
