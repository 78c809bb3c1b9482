# metagen-sandbox program bootstrap
"""Runs first in the sandboxed program's interpreter (`sandbox_launcher` passes this file's text
with -c; standard library only): read the program from fd 3, in the fallback mode arm the
guard, then run the program as __main__ in file "main.py" (tracebacks show its lines).

The guard (fallback mode: no namespaces, the program keeps the caller's uid) is an audit hook
plus replacements of the few `os` functions whose audit events say too little:
- refused outright: process creation (fork, exec, posix_spawn, subprocess, os.system, pty),
  signals to processes (os.kill, os.killpg, signal.pthread_kill, pidfds), opening anything in
  /proc/<pid> of another process (the caller's memory holds the expected answers of a code
  verifier's tests), sockets, ctypes,
  raising or setting resource limits (root could lift its own), new audit hooks, os.mkfifo and
  os.mknod, and importing native modules that write files by themselves (_sqlite3: ATTACH;
  _dbm, _gdbm, _posixshmem, _multiprocessing, readline);
- writes only inside the working directory: opening for writing (open, os.open, O_CREAT or
  O_TRUNC included), remove / unlink, rmdir, mkdir, rename / replace, link, symlink, chmod,
  chown, utime, truncate, setxattr, removexattr, shutil.rmtree. The place checked is the real
  one: a path relative to a directory descriptor (dir_fd, src_dir_fd, dst_dir_fd) is resolved
  against that directory, a file descriptor (os.chmod(fd), ...) to its file, both through
  /proc/self/fd (unresolvable means refused), and symlinks are followed. A symlink's target
  must lie inside too, and a relative target may not climb with "..". `os.open(..., dir_fd=)`
  writing is turned into an open of the full path, which the hook then checks.
The seccomp filter (`sandbox_seccomp`) enforces in the kernel what these Python-level
replacements cannot: no dir_fd-relative writing open, no mknod, no pidfd, no socket.
"""


def _prepare():
    import linecache
    import os
    import sys
    import traceback

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
        _guard(os.path.realpath(workdir))
    return code


def _guard(root: str) -> None:
    """Install the audit hook and the `os` replacements that keep writes inside `root`."""
    import os
    import posix
    import signal
    import sys

    refused = {"os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
               "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill",
               "socket.__new__", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function",
               "sys.addaudithook", "resource.setrlimit", "resource.prlimit"}
    native = {"_posixsubprocess", "_ctypes", "_sqlite3", "_dbm", "_gdbm", "_posixshmem", "_multiprocessing", "readline"}
    # event -> (argument holding a path, argument holding its dir_fd or None), per path written
    paths = {"os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),), "os.chmod": ((0, 2),),
             "os.chown": ((0, 3),), "os.utime": ((0, 3),), "os.rename": ((0, 2), (1, 3)), "os.link": ((0, 2), (1, 3)),
             "os.truncate": ((0, None),), "os.setxattr": ((0, None),), "os.removexattr": ((0, None),),
             "shutil.rmtree": ((0, 1),)}
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    readlink, realpath, fsdecode, isabs, join, dirname = (os.readlink, os.path.realpath, os.fsdecode,
                                                          os.path.isabs, os.path.join, os.path.dirname)

    def descriptor(fd):
        """The path of the file or directory open as `fd`, or None."""
        try:
            return readlink(f"/proc/self/fd/{int(fd)}")
        except (OSError, ValueError, TypeError):
            return None

    def location(path, dir_fd=None):
        """The real path a call on `path` (relative to `dir_fd`, if one) reaches, or None."""
        if isinstance(path, int):
            return descriptor(path)
        path = fsdecode(path)
        if dir_fd is not None and dir_fd >= 0 and not isabs(path):
            base = descriptor(dir_fd)
            if base is None:
                return None
            path = join(base, path)
        return realpath(path)

    def inside(real):
        return real is not None and (real == root or real.startswith(root + "/"))

    own = str(os.getpid())

    def other_process(path):
        """Whether `path` lies in /proc/<pid> of another process (its memory, environment, fds)."""
        path = fsdecode(path)
        for candidate in (os.path.abspath(path), realpath(path)):
            parts = candidate.split("/")
            if len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and parts[2] != own:
                return True
        return False

    def refuse(what):
        raise PermissionError(f"sandbox: {what} outside the working directory is not allowed")

    def hook(event, args):
        if event in refused or (event == "import" and args[0] in native):
            what = f"importing {args[0]}" if event == "import" else event
            raise PermissionError(f"sandbox: {what} is not allowed")
        if event == "open" and not isinstance(args[0], int):
            if (args[2] or 0) & writing and not inside(location(args[0])):
                refuse(f"writing {args[0]!r}")
            if other_process(args[0]):
                raise PermissionError(f"sandbox: opening {args[0]!r} of another process is not allowed")
        for path_at, dir_fd_at in paths.get(event, ()):
            dir_fd = args[dir_fd_at] if dir_fd_at is not None and dir_fd_at < len(args) else None
            if not inside(location(args[path_at], dir_fd)):
                refuse(f"{event} on {args[path_at]!r}")
        if event == "os.symlink":
            link = location(args[1], args[2])
            target = fsdecode(args[0])
            climbs = not isabs(target) and ".." in target.replace("\\", "/").split("/")
            if not inside(link) or climbs or not inside(realpath(join(dirname(link), target))):
                refuse(f"a symlink {args[1]!r} -> {target!r}")

    real_open = posix.open

    def open(path, flags, mode=0o777, *, dir_fd=None):  # noqa: A001 - replaces os.open
        if dir_fd is not None and flags & writing and not isabs(fsdecode(path)):
            base = os.getcwd() if dir_fd < 0 else descriptor(dir_fd)
            if base is None:
                refuse(f"writing relative to descriptor {dir_fd}")
            path, dir_fd = join(base, fsdecode(path)), None  # the hook checks the whole path
        return real_open(path, flags, mode, dir_fd=dir_fd)

    def refusing(name):
        def refused_call(*args, **kwargs):
            raise PermissionError(f"sandbox: {name} is not allowed")
        return refused_call

    replacements = {"open": open, "mkfifo": refusing("os.mkfifo"), "mknod": refusing("os.mknod"),
                    "pidfd_open": refusing("os.pidfd_open")}
    originals = set()
    for module, name, replacement in [(m, n, r) for m in (os, posix) for n, r in replacements.items()] + \
            [(signal, "pidfd_send_signal", refusing("signal.pidfd_send_signal"))]:
        if hasattr(module, name):
            originals.add(getattr(module, name))
            setattr(module, name, replacement)
    for supported in (os.supports_dir_fd, os.supports_fd, os.supports_follow_symlinks, os.supports_effective_ids):
        supported.difference_update(originals)  # so shutil and others use the checked path calls
    sys.addaudithook(hook)


if __name__ == "__main__":
    _code = _prepare()
    del _prepare, _guard
    __doc__ = None
    try:
        exec(globals().pop("_code"))
    except SystemExit:
        raise
    except BaseException as _error:
        _error = _error.with_traceback(_error.__traceback__.tb_next)  # drop this file's frame
        __import__("traceback").print_exception(type(_error), _error, _error.__traceback__)
        raise SystemExit(1)
