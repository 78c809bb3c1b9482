"""The sandbox: normal programs are reported faithfully; hostile ones (endless loops, memory
hogs, fork bombs, writes outside the working directory, network calls) get a clear verdict while
the host stays unharmed, under kernel isolation and under the audit-hook fallback."""

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from metagen.tools.sandbox import SandboxResult, run_python
from tests.scoring.conftest import leftovers, no_leftovers  # noqa: F401 - no sandbox process may stay behind

KERNEL_LAYERS = {"pid-ns", "net-ns", "read-only-root", "private-tmp"}


@pytest.fixture(scope="module")
def kernel_isolation() -> bool:
    return KERNEL_LAYERS <= set(run_python("pass").isolation)


def test_normal_program_stdout_stdin_and_exit_codes(no_leftovers):
    result = run_python("import sys\nname = sys.stdin.read().strip()\nprint(f'hello {name}')", stdin="ada\n")
    assert isinstance(result, SandboxResult)
    assert (result.status, result.returncode, result.stdout, result.stderr) == ("ok", 0, "hello ada\n", "")
    assert result.ok and 0 < result.wall_seconds < 10
    assert {"rlimits", "process-group", "clean-env"} <= set(result.isolation)

    exited = run_python("import sys\nprint('partial')\nsys.exit(3)")
    assert (exited.status, exited.returncode, exited.stdout) == ("error", 3, "partial\n")

    raised = run_python("def f(x):\n    return 1 / x\n\nf(0)\n")
    assert (raised.status, raised.returncode) == ("error", 1)
    assert 'File "main.py", line 2, in f' in raised.stderr
    assert raised.stderr.rstrip().endswith("ZeroDivisionError: division by zero")

    syntax = run_python("def f(:\n    pass")
    assert syntax.status == "error" and "SyntaxError" in syntax.stderr


def test_program_sees_a_clean_environment_and_its_files(no_leftovers):
    code = "import os, sys\nprint(sorted(os.environ))\nprint(os.getcwd() == os.environ['HOME'])\nprint(open('data/in.txt').read())\nprint(sys.flags.isolated, sys.flags.no_site)"
    result = run_python(code, files={"data/in.txt": "payload"})
    assert result.stdout.splitlines() == ["['HOME', 'LANG', 'PATH', 'TMPDIR']", "True", "payload", "1 1"]
    with pytest.raises(ValueError, match="files key '../x'"):
        run_python("pass", files={"../x": ""})


def test_infinite_loop_times_out(no_leftovers, leftovers):
    result = run_python("while True:\n    pass", timeout=1.5)
    assert (result.status, result.returncode) == ("timeout", None)
    assert "wall-clock" in result.detail and 1.5 <= result.wall_seconds < 5
    # leaving the session does not help a program outlive its run, with or without namespaces
    for isolation in ("auto", "audit"):
        escaped = run_python("import os\nos.setsid()\nwhile True:\n    pass", timeout=1.0, isolation=isolation)
        assert escaped.status == "timeout" and leftovers() == []


def test_cpu_limit_stops_a_busy_program_before_the_wall_clock(no_leftovers):
    result = run_python("while True:\n    pass", timeout=20, cpu_seconds=1)
    assert result.status == "timeout" and result.returncode < 0 and "CPU limit" in result.detail
    assert result.wall_seconds < 10


def test_memory_hog_is_stopped(no_leftovers):
    result = run_python("blocks = []\nwhile True:\n    blocks.append(bytearray(10**7))", memory_mb=128)
    assert result.status == "memory" and "MemoryError" in result.stderr


def test_output_flood_is_cut(no_leftovers):
    result = run_python("while True:\n    print('x' * 1000)", max_output_bytes=5000)
    assert result.status == "output_limit" and len(result.stdout) == 5000


def test_fork_limit_and_fork_bomb(no_leftovers, kernel_isolation, leftovers):
    if not kernel_isolation:
        pytest.skip("needs PID namespace isolation")
    count_forks = (
        "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(60)\n"
        "            os._exit(0)\n        n += 1\nexcept OSError as error:\n    print(n, error.errno)\n"
    )
    counted = run_python(count_forks, max_processes=8)
    # the program itself plus at most 7 sleeping children; EAGAIN (11) after that, and the
    # sleepers die with the namespace when the program exits (checked by no_leftovers)
    assert counted.status == "ok" and counted.stdout.split() == ["7", "11"]
    assert counted.wall_seconds < 10

    bomb = run_python("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", timeout=2, max_processes=8)
    assert bomb.status == "timeout"
    assert leftovers() == []
    assert subprocess.run(["true"], timeout=10).returncode == 0  # the host can still spawn


def write_attempts(tmp_path: Path) -> tuple[str, list[Path]]:
    tag = uuid.uuid4().hex
    targets = [tmp_path / f"outside-{tag}.txt", Path.home() / f".sandbox-probe-{tag}", Path("/var/tmp") / f"sandbox-probe-{tag}"]
    code = "import sys\nfor path in sys.stdin.read().split():\n    try:\n        open(path, 'w').write('x')\n        print('WROTE', path)\n    except OSError as error:\n        print('refused', type(error).__name__)\n"
    return code, targets


def test_writes_outside_the_working_directory_do_not_reach_the_host(tmp_path, no_leftovers):
    code, targets = write_attempts(tmp_path)
    for isolation in ("auto", "audit"):
        result = run_python(code, stdin="\n".join(map(str, targets)), isolation=isolation)
        assert result.status == "ok", result.stderr
        assert "WROTE" not in result.stdout and result.stdout.count("refused") == len(targets)
        assert not any(path.exists() for path in targets)
    audited = run_python(code, stdin=str(targets[0]), isolation="audit")
    assert "audit-hook" in audited.isolation and "PermissionError" in audited.stdout


@pytest.fixture
def tcp_server():
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    accepted = []

    def serve():
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except OSError:
                continue
            accepted.append(connection)
            connection.close()

    stop = threading.Event()
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


def test_network_calls_fail_inside_but_work_outside(tcp_server, no_leftovers):
    port, accepted = tcp_server
    code = f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    print('CONNECTED')\nexcept OSError as error:\n    print('refused', type(error).__name__)\n"
    for isolation in ("auto", "audit"):
        result = run_python(code, isolation=isolation)
        assert result.status == "ok" and result.stdout.startswith("refused"), result.stdout + result.stderr
    assert accepted == []
    socket.create_connection(("127.0.0.1", port), timeout=2).close()  # the server does work
    deadline = time.monotonic() + 5
    while not accepted and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(accepted) == 1


def test_kernel_layers_when_available(kernel_isolation, no_leftovers):
    if not kernel_isolation:
        pytest.skip("namespaces are not available here")
    result = run_python("import os\nprint(os.listdir('/tmp'), os.getpid(), os.geteuid() != 0)")
    assert result.stdout.split("\n")[0] == "[] 2 True"  # empty private /tmp, PID 2 under the supervisor
    assert {"mount-ns", "no-new-privs"} <= set(result.isolation) and "audit-hook" not in result.isolation
    # the host's data (this repository, /var, /run, /home) is out of sight; the system is not
    this_file = Path(__file__).resolve()
    code = f"import os\nprint(os.path.exists({str(this_file)!r}), os.listdir('/var'), os.listdir('/run'), os.path.isdir('/usr/lib'))"
    assert run_python(code).stdout == "False [] [] True\n"
    assert this_file.exists() and os.listdir("/var")


@pytest.mark.parametrize(
    "arguments, message",
    [({"timeout": 0}, "timeout=0"), ({"memory_mb": 8}, "memory_mb=8"), ({"isolation": "none"}, "isolation='none'"),
     ({"max_processes": 0}, "max_processes=0")],
)
def test_bad_arguments_name_the_field(arguments, message):
    with pytest.raises(ValueError, match=message):
        run_python("pass", **arguments)


def test_killed_by_a_signal(kernel_isolation):
    if not kernel_isolation:
        pytest.skip("the audit hook refuses os.kill")
    result = run_python("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    assert (result.status, result.returncode) == ("killed", -9) and "SIGKILL" in result.detail


def system_python() -> str | None:
    """A Python >= 3.10 outside root's home that another uid can run, if the machine has one."""
    for path in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(path) and os.stat(os.path.realpath(path)).st_mode & 0o001:
            version = subprocess.run([path, "-c", "import sys; print(sys.version_info >= (3, 10))"],
                                     capture_output=True, text=True).stdout.strip()
            if version == "True":
                return path
    return None


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or system_python() is None,
                    reason="needs root, setpriv and a system Python to act as an unprivileged caller")
def test_unprivileged_callers_get_a_user_namespace(tmp_path, no_leftovers):
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import sandbox\n"
        "result = sandbox.run_python('import os\\nprint(os.getuid(), os.listdir(\"/tmp\"))')\n"
        "print(result.status, result.stdout.strip(), ' '.join(result.isolation))\n"
    )
    directory = Path(__file__).resolve().parents[2] / "src" / "metagen" / "tools"
    command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", system_python(), "-c", script, str(directory)]
    output = subprocess.run(command, capture_output=True, text=True, timeout=30, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    status, uid, files, *layers = output.stdout.split()
    assert (status, uid, files) == ("ok", "65534", "[]"), output.stderr
    assert {"user-ns", "pid-ns", "net-ns", "read-only-root", "private-tmp"} <= set(layers) or "audit-hook" in layers


@pytest.fixture
def unix_listeners():
    """Listening AF_UNIX sockets that any uid may connect to: files in /tmp, /var/tmp and /run,
    and one in the abstract namespace. Yields (their addresses, a function listing the
    connections they received)."""
    tag = uuid.uuid4().hex[:12]
    addresses = [f"{directory}/metagen-probe-{tag}.sock" for directory in ("/tmp", "/var/tmp", "/run")]
    addresses.append(f"\0metagen-probe-{tag}")
    servers = []
    for address in addresses:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(address)
        if not address.startswith("\0"):
            os.chmod(address, 0o777)
        server.listen(8)
        server.setblocking(False)
        servers.append(server)

    def connections() -> list[str]:
        received = []
        for address, server in zip(addresses, servers):
            try:
                server.accept()[0].close()
                received.append(address)
            except BlockingIOError:
                pass
        return received

    yield addresses, connections
    for address, server in zip(addresses, servers):
        server.close()
        if not address.startswith("\0"):
            os.unlink(address)


UNIX_CONNECT = (
    "import socket, sys\n"
    "for address in sys.stdin.read().split('\\n'):\n"
    "    address = address.replace('@', '\\0', 1)\n"
    "    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):\n"
    "        try:\n"
    "            client = socket.socket(socket.AF_UNIX, kind)\n"
    "            client.settimeout(2)\n"
    "            client.connect(address)\n"
    "            print('CONNECTED', repr(address))\n"
    "        except OSError as error:\n"
    "            print('refused', type(error).__name__)\n"
)


def test_host_unix_sockets_cannot_be_reached(unix_listeners, no_leftovers):
    addresses, connections = unix_listeners
    stdin = "\n".join(address.replace("\0", "@") for address in addresses)
    assert run_python("print(1)").ok
    for isolation in ("auto", "audit"):
        result = run_python(UNIX_CONNECT, stdin=stdin, isolation=isolation)
        assert result.status == "ok", result.stderr
        assert "CONNECTED" not in result.stdout and result.stdout.count("refused") == 2 * len(addresses)
        if "seccomp" in result.isolation:  # refused when the socket is made, wherever its peer is
            assert result.stdout.count("refused PermissionError") == 2 * len(addresses), result.stdout
    assert connections() == []
    for address in addresses:  # the listeners do answer outside the sandbox
        client = socket.socket(socket.AF_UNIX)
        client.connect(address)
        client.close()
    assert connections() == addresses


# Each attempt writes outside the working directory through a call the audit hook used to miss:
# relative to a descriptor of an outside directory (dir_fd), through a descriptor of an outside
# file, or with os.mkfifo / os.mknod (no audit event at all).
OUTSIDE_WRITES = {
    "open dir_fd": "os.close(os.open('new', os.O_WRONLY | os.O_CREAT, dir_fd=d))",
    "open opener": "open('new', 'w', opener=lambda path, flags: os.open(path, flags, dir_fd=d)).close()",
    "open O_TRUNC dir_fd": "os.close(os.open('file', os.O_RDWR | os.O_TRUNC, dir_fd=d))",
    "remove dir_fd": "os.remove('file', dir_fd=d)",
    "unlink dir_fd": "os.unlink('file', dir_fd=d)",
    "rmdir dir_fd": "os.rmdir('empty', dir_fd=d)",
    "mkdir dir_fd": "os.mkdir('new', dir_fd=d)",
    "rename dir_fd": "os.rename('file', 'new', src_dir_fd=d, dst_dir_fd=d)",
    "replace dir_fd": "os.replace('file', 'new', src_dir_fd=d, dst_dir_fd=d)",
    "link dir_fd": "os.link('file', 'new', src_dir_fd=d, dst_dir_fd=d)",
    "link into work": "os.link('file', 'hardlink', src_dir_fd=d)",
    "symlink dir_fd": "os.symlink('file', 'new', dir_fd=d)",
    "chmod dir_fd": "os.chmod('file', 0o777, dir_fd=d)",
    "chown dir_fd": "os.chown('file', 12345, 12345, dir_fd=d)",
    "utime dir_fd": "os.utime('file', (0, 0), dir_fd=d)",
    "mkfifo": "os.mkfifo(os.path.join(outside, 'new'))",
    "mkfifo dir_fd": "os.mkfifo('new', dir_fd=d)",
    "mknod": "os.mknod(os.path.join(outside, 'new'))",
    "mknod fifo dir_fd": "os.mknod('new', 0o600 | stat.S_IFIFO, dir_fd=d)",
    "fchmod": "os.chmod(os.open(os.path.join(outside, 'file'), os.O_RDONLY), 0o777)",
    "fchown": "os.chown(os.open(os.path.join(outside, 'file'), os.O_RDONLY), 12345, 12345)",
    "futime": "os.utime(os.open(os.path.join(outside, 'file'), os.O_RDONLY), (0, 0))",
    "fsetxattr": "os.setxattr(os.open(os.path.join(outside, 'file'), os.O_RDONLY), 'user.probe', b'1')",
    "setxattr": "os.setxattr(os.path.join(outside, 'file'), 'user.probe', b'1')",
    "rmtree dir_fd": "shutil.rmtree('subdir', dir_fd=d)",
}


def outside_state(directory: Path) -> dict:
    """Everything the attempts could change: names, types, modes, owners, times, contents, xattrs."""
    state = {}
    for path in sorted(directory.rglob("*")):
        info = path.lstat()
        xattrs = sorted(os.listxattr(path, follow_symlinks=False)) if hasattr(os, "listxattr") else []
        content = path.read_bytes() if path.is_file() and not path.is_symlink() else None
        state[str(path.relative_to(directory))] = (info.st_mode, info.st_uid, info.st_gid, info.st_mtime_ns, content, xattrs)
    return state


@pytest.mark.parametrize("isolation", ["audit", "auto"])
def test_writes_relative_to_outside_descriptors_are_refused(tmp_path, isolation, no_leftovers):
    directories = {}
    for number, name in enumerate(OUTSIDE_WRITES):  # one fresh directory per attempt
        directories[name] = tmp_path / f"outside-{number}"
        (directories[name] / "subdir").mkdir(parents=True)
        (directories[name] / "subdir" / "inner").write_text("inner")
        (directories[name] / "empty").mkdir()
        (directories[name] / "file").write_text("original")
    before = outside_state(tmp_path)
    code = (
        "import json, os, shutil, stat, sys\n"
        "for name, (outside, statement) in json.loads(sys.stdin.read()).items():\n"
        "    try:\n"
        "        d = os.open(outside, os.O_RDONLY)\n"
        "        exec(statement)\n"
        "        print('DID', name)\n"
        "    except OSError as error:\n"
        "        print('refused', type(error).__name__, name)\n"
    )
    attempts = {name: (str(directories[name]), statement) for name, statement in OUTSIDE_WRITES.items()}
    result = run_python(code, stdin=json.dumps(attempts), isolation=isolation)
    assert result.status == "ok", result.stderr
    assert "DID" not in result.stdout, result.stdout
    # the hook or the kernel refuses (not "no such file": the directory is there in the fallback)
    refusal = "refused PermissionError" if isolation == "audit" else "refused"
    assert result.stdout.count(refusal) == len(OUTSIDE_WRITES), result.stdout
    assert outside_state(tmp_path) == before


# Getting around the fallback's Python-level replacements: the original os.open from the
# replacement's closure, a fresh copy of the posix module. The seccomp filter still refuses.
BYPASSES = {
    "closure open dir_fd": "real = next(c.cell_contents for c in os.open.__closure__ if type(c.cell_contents).__name__ == 'builtin_function_or_method')\n"
                           "os.close(real('new', os.O_WRONLY | os.O_CREAT, dir_fd=d))",
    "fresh open dir_fd": "os.close(fresh.open('new', os.O_WRONLY | os.O_CREAT, dir_fd=d))",
    "fresh mkfifo": "fresh.mkfifo(os.path.join(outside, 'new'))",
    "fresh mknod": "fresh.mknod(os.path.join(outside, 'new'))",
    "fresh pidfd": "signal.pidfd_send_signal(fresh.pidfd_open(os.getppid()), signal.SIGKILL)",
}


def test_the_kernel_filter_holds_where_the_fallback_guard_is_bypassed(tmp_path, no_leftovers):
    if "seccomp" not in run_python("pass", isolation="audit").isolation:
        pytest.skip("no seccomp filter on this machine")
    (tmp_path / "file").write_text("original")
    before = outside_state(tmp_path)
    code = (
        "import importlib.util, os, signal, sys\n"
        "fresh = importlib.util.module_from_spec(importlib.util.find_spec('posix'))\n"
        "outside = sys.stdin.readline().strip()\n"
        "for name, statement in eval(sys.stdin.read()).items():\n"
        "    try:\n"
        "        d = os.open(outside, os.O_RDONLY)\n"
        "        exec(statement)\n"
        "        print('DID', name)\n"
        "    except OSError as error:\n"
        "        print('refused', type(error).__name__, name)\n"
    )
    result = run_python(code, stdin=f"{tmp_path}\n{BYPASSES!r}", isolation="audit")
    assert result.status == "ok", result.stderr
    assert result.stdout.count("refused PermissionError") == len(BYPASSES), result.stdout
    assert outside_state(tmp_path) == before


def test_the_fallback_still_allows_work_inside_the_working_directory(no_leftovers):
    code = (
        "import os, shutil, tempfile\n"
        "os.makedirs('a/b')\n"
        "with open('a/b/f.txt', 'w') as f:\n    f.write('x')\n"
        "d = os.open('a', os.O_RDONLY)\n"
        "os.close(os.open('g.txt', os.O_WRONLY | os.O_CREAT, dir_fd=d))\n"
        "os.rename('g.txt', 'h.txt', src_dir_fd=d, dst_dir_fd=d)\n"
        "os.chmod('a/h.txt', 0o600)\n"
        "os.symlink('b/f.txt', 'a/link')\n"
        "print(open('a/link').read(), sorted(os.listdir('a')))\n"
        "with tempfile.TemporaryDirectory() as scratch:\n    open(os.path.join(scratch, 'x'), 'w').close()\n"
        "shutil.rmtree('a')\n"
        "print(os.listdir('.'))\n"
    )
    result = run_python(code, isolation="audit")
    assert (result.status, result.stdout) == ("ok", "x ['b', 'h.txt', 'link']\n[]\n"), result.stderr


def test_the_fallback_cannot_open_other_processes_files(no_leftovers):
    # in the fallback the program keeps the caller's uid: its memory (which holds, e.g., the
    # expected answers of a code verifier's tests) must stay closed
    code = ("import os, sys\npid = sys.stdin.read().strip()\n"
            "for name in ('mem', 'environ', 'cmdline', 'task/' + pid + '/mem'):\n"
            "    try:\n        open(f'/proc/{pid}/{name}', 'rb').read(10)\n        print('READ', name)\n"
            "    except OSError as error:\n        print('refused', type(error).__name__)\n"
            "print(len(open('/proc/self/status').read()) > 0)\n")
    result = run_python(code, stdin=str(os.getpid()), isolation="audit")
    assert result.stdout == "refused PermissionError\n" * 4 + "True\n", result.stdout + result.stderr
