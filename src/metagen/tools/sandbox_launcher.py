"""The inside of the sandbox: run as a script by `sandbox.run_python`,

    python -I -S -B sandbox_launcher.py --launch JOB.json REPORT_FD

it creates the namespaces and mounts, forks the supervisor (PID 1 of the new PID namespace), which
loads the seccomp filter (`sandbox_seccomp.py`) and execs the user program under rlimits, starting
with `sandbox_guard.py` (see `sandbox.py` for the layers and the threat model). Only the standard
library is used: the interpreter runs isolated, without site-packages.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys

FILE_LIMIT = 64  # RLIMIT_NOFILE of the program
UID_BASE = 2_000_000_000  # random per-run uids for root callers: far above any real account

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE = 1024, 2048, 4096, 16384, 1 << 18
MS_RELATIME, MS_STRICTATIME = 1 << 21, 1 << 24
MOUNT_OPTION_FLAGS = {"ro": MS_RDONLY, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
                      "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME,
                      "strictatime": MS_STRICTATIME}
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38
DEVICES = ("null", "zero", "full", "random", "urandom")
VISIBLE_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "nix", "gnu")  # system, at /
NEVER_HIDDEN = ("/", "/tmp", "/proc", "/dev", *(f"/{name}" for name in VISIBLE_DIRS))
HERE = os.path.dirname(os.path.abspath(__file__))


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
        with open(os.path.join(HERE, "sandbox_guard.py"), encoding="utf-8") as handle:
            job["guard"] = handle.read()  # read now: the mounts below may hide this directory
        job["seccomp"] = _load_module("sandbox_seccomp")
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
    kernel.prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of the run become ours, to be reaped below
    supervisor[0] = os.fork()
    if supervisor[0] == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _supervise(kernel, job, layers, identity, workdir, report, launcher)
    if stop[0]:
        os.kill(supervisor[0], signal.SIGKILL)
    report.close()
    os.waitpid(supervisor[0], 0)  # returns once the supervisor is dead, so its namespace is empty
    while True:  # without namespaces: the program, killed by its parent-death signal
        try:
            os.wait()
        except ChildProcessError:
            break
    os._exit(0)


def _load_module(name: str):
    """A module of this directory, loaded by path (the launcher runs isolated, without sys.path
    entries of its own)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    """Private propagation, everything read-only, then fresh tmpfs on /tmp and /dev, and empty
    ones over every other top-level directory but the system's (VISIBLE_DIRS) and over the homes."""
    kernel.mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates to the host
    keep = [path for path in job["keep_visible"] if os.path.isdir(path)]
    host = {f"/{name}" for name in os.listdir("/") if name not in VISIBLE_DIRS and os.path.isdir(f"/{name}")}
    host = {path for path in host if not os.path.islink(path)}  # e.g. /var/run: covered with its target
    homes = {os.path.realpath(p) for p in ("/root", "/home", job["home"]) if os.path.isdir(p)}
    hidden = _outermost(host | homes)
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
        for directory in sorted(hidden):
            _hide(kernel, directory, keep, handles)
        layers.append("hidden-host-dirs")
    finally:
        for handle in (*handles.values(), *devices.values()):
            os.close(handle)


def _outermost(directories: set[str]) -> set[str]:
    """The directories not inside another of them, nor a system directory or in /tmp."""
    directories = {d for d in directories if d not in NEVER_HIDDEN and not d.startswith("/tmp/")}
    return {d for d in directories if not any(d.startswith(other + "/") for other in directories)}


def _hide(kernel: _Kernel, directory: str, keep: list[str], handles: dict[str, int]) -> None:
    """Cover `directory` with an empty read-only tmpfs, binding back (read-only) the kept paths
    inside it (the Python installation)."""
    kernel.mount("tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
    for path in keep:
        if path == directory or path.startswith(directory + "/"):
            os.makedirs(path, 0o755, exist_ok=True)
            kernel.mount(f"/proc/self/fd/{handles[path]}", path, None, MS_BIND | MS_REC)
            kernel.mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    kernel.mount(None, directory, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


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
            except OSError:
                pass  # e.g. a container that masks parts of /proc; the host's stays read-only
        kernel.prctl(PR_SET_NO_NEW_PRIVS, 1)  # (also what lets an unprivileged caller add a filter)
        if job["seccomp"].install(kernel.libc, fallback="audit-hook" in layers):  # inherited by the program
            layers.append("seccomp")
        report.write(json.dumps({"layers": layers}) + "\n")
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
        os.execve(python, [python, "-I", "-S", "-B", "-X", "utf8", "-c", job["guard"], workdir, audit], env)
    except BaseException as error:  # noqa: BLE001 - reported through the close-on-exec pipe
        os.write(error_write, f"{type(error).__name__}: {error}".encode())
    finally:
        os._exit(127)


if __name__ == "__main__" and sys.argv[1:2] == ["--launch"]:
    _launch(sys.argv[2], int(sys.argv[3]))
