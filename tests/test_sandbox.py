"""mmrft.rewards.sandbox: well-behaved code works, hostile code is contained and leaves nothing behind.

Issue 12 (the parent's side): reasons the code tries to forge on the status pipe are ignored,
outputs over their caps are never read, the code sees no file but its interpreter's (private
root, or Landlock read rules), and nothing outlives a caller killed with SIGKILL, whose
directories the next process's pool removes.

Every hostile job prints its working directory first; after the job the test checks that the
directory is gone, that no process forked from a sandbox server (matched by the HOME in its
environment block, which daemons keep after reparenting) or started in the workdir survives,
and that nothing was written outside.
"""

from __future__ import annotations

import glob
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
from PIL import Image

from mmrft import sandbox
from mmrft.rewards.sandbox import SandboxJob, SandboxPool, run_python

REPO = Path(__file__).resolve().parents[1]
IS_ROOT = os.geteuid() == 0
LANDLOCK = sandbox._landlock_abi()
PRELUDE = "import os, sys; print('CWD', os.getcwd(), flush=True)\n"
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root (namespaces, uid drop)")
needs_landlock = pytest.mark.skipif(LANDLOCK < 1, reason="kernel without Landlock")


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=2) as p:
        yield p


@pytest.fixture(scope="module")
def mpl_pool():
    with SandboxPool(workers=2, preload=("matplotlib.pyplot",)) as p:
        p.start()
        yield p


def _pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"


def _survivors(homes: tuple[str, ...], exclude: set[int]) -> list[str]:
    """Live processes whose environment says HOME is under one of ``homes``."""
    found = []
    for pid in _pids():
        if pid in exclude or _state(pid) in ("Z", "X"):
            continue
        for var in _environ(pid):
            if var.startswith(b"HOME=") and var[5:].decode(errors="replace").startswith(homes):
                found.append(f"{pid}: {_cmdline(pid)}")
    return found


def _run(pool: SandboxPool, code: str, **kwargs):
    """Run hostile code, then check that it left no process and no workdir behind."""
    result = pool.run(PRELUDE + textwrap.dedent(code), **kwargs)
    assert_contained(pool, result)
    return result


def assert_contained(pool: SandboxPool, result) -> None:
    cwd = [line.split(" ", 1)[1] for line in result.stdout.splitlines() if line.startswith("CWD ")]
    servers = {s.proc.pid: s.dir for s in list(pool._servers) if s.alive}
    homes = tuple(servers.values()) + tuple(cwd)
    assert _survivors(homes, set(servers)) == [], "a sandboxed process outlived its job"
    for workdir in cwd:
        assert not os.path.exists(os.path.dirname(workdir)), "workdir left behind"
    # Nothing but idle servers (direct children, of any pool) descends from this test process.
    me = os.getpid()
    children = {}
    for pid in _pids():
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(pid)
    stack, descendants = list(children.get(me, [])), []
    while stack:
        pid = stack.pop()
        if _state(pid) not in ("Z", "X"):
            descendants.append(pid)
        stack += children.get(pid, [])
    idle_servers = {p for p in children.get(me, []) if "sandbox.py --serve" in _cmdline(p)}
    # multiprocessing's resource tracker belongs to the test session (other tests spawn
    # workers), not to any sandbox job
    session = {p for p in children.get(me, []) if "multiprocessing.resource_tracker" in _cmdline(p)}
    assert set(descendants) <= idle_servers | session, [_cmdline(p) for p in descendants]


# --------------------------------------------------------------------------- well-behaved code


def test_matplotlib_png_comes_back(mpl_pool):
    code = textwrap.dedent(
        """
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(4, 3), dpi=50)
        ax.bar(["a", "b", "c"], [3, 1, {k}])
        ax.set_title("chart {k}")
        fig.savefig("out.png")
        """
    )
    jobs = [SandboxJob(code.format(k=k), outputs=("out.png",), timeout_s=20) for k in range(4)]
    results = mpl_pool.map(jobs)
    for result in results:
        assert result.ok, (result.reason, result.stderr)
        png = result.files["out.png"]
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        assert Image.open(io.BytesIO(png)).size == (200, 150)
    assert len({r.files["out.png"] for r in results}) == 4  # each job drew its own chart


def test_inputs_outputs_env_and_scrubbed_environment(pool):
    code = """
        import json, os
        rows = open("data.csv").read().split()
        json.dump({"rows": rows, "env": sorted(os.environ), "mine": os.environ["MINE"],
                   "home": os.environ["HOME"] == os.getcwd()}, open("out.json", "w"))
    """
    result = _run(
        pool, code, inputs={"data.csv": b"a\nb\n"}, outputs=["out.json"], env={"MINE": "1"}
    )
    assert result.ok, result.stderr
    data = json.loads(result.files["out.json"])
    assert data["rows"] == ["a", "b"] and data["mine"] == "1" and data["home"]
    assert set(data["env"]) <= {
        "PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "MPLBACKEND", "MPLCONFIGDIR", "MINE",
        "PYTHONDONTWRITEBYTECODE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    }  # fmt: skip


def test_output_truncated_with_marker(pool):
    result = _run(pool, "print('x' * 10000); print('END')", max_output_bytes=1000)
    assert result.ok
    assert "bytes truncated" in result.stdout and result.stdout.rstrip().endswith("END")
    assert len(result.stdout) < 1200


def test_missing_and_symlinked_outputs(pool):
    result = _run(pool, "pass", outputs=["a.png"])
    assert (result.ok, result.reason, result.exit_code) == (False, "no output file", 0)
    # A symlink to a file the sandbox cannot read must not be followed by the (root) supervisor.
    result = _run(pool, "os.symlink('/etc/shadow', 'a.png')", outputs=["a.png"])
    assert result.reason == "no output file" and result.files == {}


@pytest.mark.parametrize(
    ("code", "reason", "exit_code"),
    [
        ("def f(:\n", "syntax error", None),  # found by the supervisor: never run
        ("1 / 0", "exception: ZeroDivisionError", 1),
        ("sys.exit(2)", "exit code 2", 2),
        ("os._exit(3)", "exit code 3", 3),
    ],
)
def test_failure_reasons(pool, code, reason, exit_code):
    result = _run(pool, code, timeout_s=5)
    outcome = (result.ok, result.reason, result.exit_code, result.signal)
    assert outcome == (False, reason, exit_code, None)


# --------------------------------------------------------------------------- hostile code


@pytest.mark.serial  # wall-clock budget: make test runs it alone
def test_infinite_loop_times_out(pool):
    start = time.monotonic()
    result = _run(pool, "while True: pass", timeout_s=1)
    assert (result.ok, result.reason) == (False, "timeout")
    assert 0.9 < result.seconds < 3 and time.monotonic() - start < 6


def test_cpu_limit(pool):
    result = _run(pool, "while True: pass", timeout_s=8, cpu_s=1)
    assert (result.reason, result.signal) == ("cpu limit", signal.SIGXCPU)


@pytest.mark.serial  # wall-clock budget: make test runs it alone
def test_fork_bomb_is_contained(pool):
    code = """
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """
    start = time.monotonic()
    result = _run(pool, code, timeout_s=1.5, max_procs=16)
    assert (result.ok, result.reason) == (False, "timeout")
    assert time.monotonic() - start < 8


def test_memory_bomb(pool):
    result = _run(
        pool, "chunks = []\nwhile True: chunks.append(bytearray(50_000_000))", memory_mb=300
    )
    assert (result.ok, result.reason) == (False, "memory limit")


def test_file_too_large(pool):
    result = _run(pool, "open('big', 'wb').write(b'x' * (3 << 20))", max_file_mb=1)
    assert (result.ok, result.reason) == (False, "file too large")


@needs_root
def test_workdir_quota(pool):
    # Each file is under max_file_mb, together they exceed the workdir's tmpfs quota.
    code = "for i in range(10):\n    open(f'f{i}', 'wb').write(b'x' * (1 << 20))"
    result = _run(pool, code, max_file_mb=1)
    assert (result.ok, result.reason) == (False, "file too large")
    assert "No space left" in result.stderr and result.isolation["workdir"].startswith("tmpfs")


@pytest.mark.serial  # wall-clock budget: make test runs it alone
def test_printing_gigabytes_is_cut_short(pool):
    start = time.monotonic()
    result = _run(pool, "while True: sys.stdout.write('x' * 1_000_000)", timeout_s=10)
    assert (result.ok, result.reason) == (False, "output too large")
    assert time.monotonic() - start < 5 and len(result.stdout) < 66_000


def test_segfault(pool):
    result = _run(pool, "import ctypes; ctypes.string_at(0)")
    assert (result.ok, result.reason, result.signal) == (False, "killed by signal 11", 11)


def _escape_targets() -> list[Path]:
    tag = uuid.uuid4().hex[:8]
    return [Path(f"/tmp/escape-{tag}"), REPO / f"escape-{tag}", Path.home() / f"escape-{tag}"]


@pytest.mark.parametrize("target", [0, 1, 2], ids=["tmp", "repo", "home"])
def test_writes_outside_workdir_fail(pool, target):
    path = _escape_targets()[target]
    result = _run(pool, f"open({str(path)!r}, 'w').write('escaped')")
    assert result.ok is False and result.reason in (
        "exception: PermissionError",
        "exception: OSError",
    )
    assert not path.exists()


@needs_root
@needs_landlock
@pytest.mark.parametrize(
    ("disable", "layer"),
    [(("mountns", "uid"), "landlock"), (("landlock", "uid"), "read-only mounts")],
    ids=["landlock-alone", "read-only-mounts-alone"],
)
def test_each_write_barrier_alone(pool, disable, layer):
    paths = _escape_targets()
    code = "".join(
        f"\ntry:\n    open({str(p)!r}, 'w').write('x')\n    print('WROTE')\nexcept OSError as e:\n    print('DENIED', e.errno)"
        for p in paths
    )
    result = _run(pool, code, disable=disable)
    assert result.isolation["writes"] == [layer]
    assert result.stdout.count("DENIED") == 3 and "WROTE" not in result.stdout
    assert not any(p.exists() for p in paths)


PEEK_ENV = """
    import json, os
    token, test_pid = {token!r}, {pid}
    seen, readable = [], []
    if any(token in v for v in os.environ.values()):
        seen.append("os.environ")
    try:
        others = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        others = []
    for pid in [test_pid, os.getppid(), *others]:
        try:
            data = open(f"/proc/{{pid}}/environ", "rb").read()
        except OSError:
            continue
        readable.append(int(pid))
        if token.encode() in data:
            seen.append(pid)
    print(json.dumps({{"seen": seen, "test_pid_readable": test_pid in readable}}))
"""


@pytest.mark.parametrize(
    "disable", [(), ("uid", "pidns", "netns", "mountns")], ids=["default", "no-namespaces"]
)
def test_parent_environment_is_invisible(monkeypatch, disable):
    if disable and LANDLOCK < 1:
        pytest.skip("without namespaces only Landlock hides /proc")
    token = "secret-" + uuid.uuid4().hex
    monkeypatch.setenv("MMRFT_SANDBOX_TEST_SECRET", token)
    result = run_python(
        textwrap.dedent(PEEK_ENV).format(token=token, pid=os.getpid()),
        timeout_s=10,
        disable=disable,
    )
    assert result.ok, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"seen": [], "test_pid_readable": False}


def test_cannot_signal_the_caller(pool):
    result = _run(pool, f"os.kill({os.getpid()}, 0)\nprint('COULD SIGNAL')")
    assert result.reason in ("exception: ProcessLookupError", "exception: PermissionError")
    assert "COULD SIGNAL" not in result.stdout


def test_network_is_unreachable(pool):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        result = _run(
            pool, f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)"
        )
        assert result.ok is False and result.reason.startswith("exception:")
        if result.isolation["namespaces"] and "net" in result.isolation["namespaces"]:
            # The namespace holds even against code that bypasses Python's socket module.
            raw = f"""
                import ctypes, struct
                libc = ctypes.CDLL(None, use_errno=True)
                fd = libc.socket(2, 1, 0)
                addr = struct.pack("=H", 2) + struct.pack("!H", {port}) + bytes([127, 0, 0, 1]) + bytes(8)
                if libc.connect(fd, addr, len(addr)) != 0:
                    raise OSError(ctypes.get_errno(), "connect failed")
                print("CONNECTED")
            """
            raw_result = _run(pool, raw, disable=("landlock",))
            assert (
                raw_result.reason == "exception: OSError" and "CONNECTED" not in raw_result.stdout
            )
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()


DAEMON = """
    import time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            {grandchild}
        os._exit(0)
    {parent}
"""


@pytest.mark.parametrize(
    "disable", [(), ("uid", "pidns", "netns", "mountns")], ids=["default", "no-namespaces"]
)
def test_daemon_does_not_outlive_the_sandbox(pool, disable):
    # Grandchild that stays a Python process (matched by HOME) while the parent exits at once.
    code = DAEMON.format(
        grandchild="time.sleep(60)", parent="time.sleep(0.3); print('parent done')"
    )
    result = _run(pool, code, timeout_s=5, disable=disable)
    assert result.ok and "parent done" in result.stdout
    # Grandchild that execs another program while the parent spins until the timeout.
    marker = f"{60 + uuid.uuid4().int % 1000 / 1000:.3f}"
    code = DAEMON.format(
        grandchild=f"os.execv('/bin/sleep', ['sleep', '{marker}'])", parent="while True: pass"
    )
    result = _run(pool, code, timeout_s=1.5, disable=disable)
    assert result.reason == "timeout"
    assert not [p for p in _pids() if _cmdline(p).startswith(f"sleep {marker}")]


def test_dead_server_is_replaced(pool):
    assert pool.run("print('warm')").ok
    for server in list(pool._servers):
        os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
    result = pool.run("print('again')")
    assert result.ok and result.stdout == "again\n"


@pytest.mark.serial  # wall-clock budget: make test runs it alone
def test_pool_runs_jobs_in_parallel(pool):
    pool.start()
    start = time.monotonic()
    results = pool.map([{"code": f"import time; time.sleep(1); print({i})"} for i in range(4)])
    elapsed = time.monotonic() - start
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(4)]
    assert elapsed < 3.5, elapsed  # 2 workers: ≈ 2 × 1 s, not 4 × 1 s


def test_bad_parameters_raise():
    for kwargs in (
        {"timeout_s": 0},
        {"memory_mb": 0},
        {"outputs": ["../x"]},
        {"inputs": {"a/b": b""}},
        {"disable": ["magic"]},
    ):
        with pytest.raises(ValueError):
            SandboxJob("pass", **kwargs)


@needs_root
def test_isolation_report_as_root(pool):
    result = pool.run("import os; print(os.getuid())")
    iso = result.isolation
    assert result.ok and iso["fallbacks"] == []
    assert {"pid", "net", "mnt", "ipc", "uts"} <= set(iso["namespaces"])
    assert int(result.stdout) == iso["uid"] != 0
    assert "read-only mounts" in iso["writes"] and "unprivileged uid" in iso["writes"]
    assert iso["no_capabilities"] and iso["no_new_privs"] and iso["cleanup"] == "pid namespace"
    assert iso["proc"].startswith("private") and iso["workdir"].startswith("tmpfs")
    if LANDLOCK:
        assert "landlock" in iso["writes"] and iso["landlock_abi"] == LANDLOCK


ROOTLESS = """
import json, os, sys
sys.path.insert(0, {repo!r})
from mmrft import sandbox as sb
from mmrft.rewards.sandbox import SandboxPool
if os.geteuid() == 0:  # become nobody, with the interpreter reachable (it may live in /root)
    sb._unshare(sb._CLONE_NEWNS)
    sb._mount(None, "/", None, sb._MS_REC | sb._MS_PRIVATE)
    # the package too: a checkout in a directory closed to nobody (mktemp -d) stays importable
    needed = [
        *sb._filesystem_view(None, None).essential,
        os.path.dirname(__file__),
        os.path.join({repo!r}, "mmrft"),
    ]
    covers = {{}}  # a directory closed to nobody -> what beneath it must stay reachable
    for path in sb._unreachable(65534, 65534, needed)[1]:
        parts = path.strip("/").split("/")
        for i in range(1, len(parts)):
            closed = "/" + "/".join(parts[:i])
            if not sb._may(os.stat(closed), 65534, 65534, 1):
                covers.setdefault(closed, []).append(path)
                break
    for closed, paths in covers.items():  # an empty tmpfs over it, the needed paths bound back
        handles = [os.open(p, os.O_PATH) for p in paths]
        sb._mount("tmpfs", closed, "tmpfs", 0, "mode=0755")
        for p, fd in zip(paths, handles):
            os.makedirs(p, exist_ok=True)
            sb._mount(f"/proc/self/fd/{{fd}}", p, None, sb._MS_BIND | sb._MS_REC)
    os.setgroups([]); os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)
    os.execve(sys.executable, [sys.executable, __file__], {{"PATH": "/usr/bin:/bin", "HOME": "/tmp"}})
codes = {{
    "escape": "open({escape!r}, 'w').write('x')",
    "bomb": "import os\\nwhile True: os.fork()",
    "daemon": "import os, time\\nif os.fork() == 0:\\n    os.setsid()\\n    os.fork() or time.sleep(60)\\n    os._exit(0)\\nwhile True: pass",
    "net": "import socket; socket.create_connection(('127.0.0.1', 9), timeout=1)",
}}
def survivors(homes, exclude):
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) not in exclude):
        try:
            env = open(f"/proc/{{pid}}/environ", "rb").read().split(b"\\0")
        except OSError:
            continue
        found += [pid for v in env if v.startswith(b"HOME=") and v[5:].decode().startswith(homes)]
    return found
with SandboxPool(1) as pool:
    out = {{k: pool.run(c, timeout_s=1.5, max_procs=16) for k, c in codes.items()}}
    servers = {{s.proc.pid: s.dir for s in pool._servers}}
    left = survivors(tuple(servers.values()), set(servers))
print(json.dumps({{"left": left, **{{k: [r.reason, r.isolation] for k, r in out.items()}}}}))
"""


@needs_root
def test_unprivileged_caller_uses_a_user_namespace(tmp_path):
    if (
        not os.path.exists("/proc/self/ns/user")
        or subprocess.run(["unshare", "-U", "true"], capture_output=True).returncode
    ):
        pytest.skip("user namespaces unavailable")
    escape = f"/tmp/escape-{uuid.uuid4().hex[:8]}"
    script = tmp_path / "rootless.py"
    script.write_text(ROOTLESS.format(repo=str(REPO), escape=escape))
    tmp_path.chmod(0o755)
    script.chmod(0o644)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    iso = out["escape"][1]
    if not iso["user_namespace"]:
        pytest.skip(f"no user namespace for unprivileged users here: {iso['fallbacks']}")
    assert {"pid", "net", "mnt"} <= set(iso["namespaces"]) and iso["no_capabilities"]
    assert out["escape"][0] in ("exception: PermissionError", "exception: OSError")
    assert out["bomb"][0] in ("exception: BlockingIOError", "timeout")
    assert out["daemon"][0] == "timeout" and out["net"][0].startswith("exception:")
    assert iso["reads"].startswith("private root"), iso  # built inside the user namespace
    assert not os.path.exists(escape) and out["left"] == []


# --------------------------------------------------------------------------- issue 12: the parent


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("os.write(3, b'memory limit\\n'); os._exit(1)", "exit code 1"),
        ("os.write(3, b'timeout\\n'); sys.exit(1)", "exit code 1"),
        ("os.write(3, b'file too large\\n'); os._exit(1)", "exit code 1"),
        ("os.write(3, b'syntax error\\n'); raise ValueError", "exit code 1"),  # two lines
        ("os.write(3, b'exception: NotABuiltin\\n'); os._exit(1)", "exit code 1"),
        ("os.write(3, b'exception: ' + b'E' * 500 + b'\\n'); os._exit(1)", "exit code 1"),
        ("os.write(3, b'exception: ValueError\\n'); os._exit(2)", "exit code 2"),
        # the one claim it can make is what raising that builtin exception gives anyway
        ("os.write(3, b'exception: KeyError\\n'); os._exit(1)", "exception: KeyError"),
        ("class Mine(KeyError): pass\nraise Mine('x')", "exception: KeyError"),
        ("raise type('X' * 300, (Exception,), {})()", "exception: Exception"),
        ("import errno\nraise OSError(errno.EFBIG, 'File too large')", "exception: OSError"),
        ("compile('(', 'x', 'exec')", "exception: SyntaxError"),  # ran, then raised
    ],
)
def test_reasons_come_from_the_supervisor_not_the_code(pool, code, reason):
    result = _run(pool, code, timeout_s=5)
    assert (result.ok, result.reason) == (False, reason)


def test_forged_reasons_corpus(pool):
    code = (REPO / "tests" / "hostile" / "forge_reason.py").read_text()
    assert _run(pool, code, timeout_s=5).reason == "exit code 1"


def test_output_caps_are_checked_before_reading(pool):
    code = "open('small', 'wb').write(b'x' * 500); open('big', 'wb').write(b'x' * 5000)"
    result = _run(pool, code, outputs={"small": 1000})
    assert result.ok and result.files == {"small": b"x" * 500}
    result = _run(pool, code, outputs={"small": 1000, "big": 1000})
    assert (result.ok, result.reason) == (False, "file too large")
    assert "big" not in result.files
    with pytest.raises(ValueError):
        SandboxJob("pass", outputs={"a": 0})
    assert SandboxJob("pass", max_file_mb=1, outputs={"a": 10**9}).outputs == {"a": 1 << 20}


LOOK = """
    import json, os
    out = {{}}
    for path in {paths!r}:
        try:
            with open(path, "rb") as fh:
                out[path] = "read " + str(len(fh.read(100)))
        except OSError as exc:
            out[path] = type(exc).__name__
    try:
        out["/"] = sorted(os.listdir("/"))
    except OSError as exc:
        out["/"] = type(exc).__name__
    import numpy  # the interpreter's libraries stay readable
    print("LOOK " + json.dumps(out))
"""


@needs_root
@pytest.mark.parametrize("disable", [(), ("mountns",)], ids=["private-root", "landlock"])
def test_the_code_sees_no_file_but_its_interpreter(pool, tmp_path, disable):
    if disable and not LANDLOCK:
        pytest.skip("without a mount namespace only Landlock hides files")
    secret = tmp_path / "answer.jsonl"
    secret.write_text('{"target": "the answer"}\n')
    os.chmod(tmp_path, 0o755)
    os.chmod(secret, 0o644)  # readable by anyone: only the sandbox hides it
    dataset = REPO / "assets" / "benchmarks" / "charts" / "code_test.jsonl"
    readme, stdlib = REPO / "README.md", Path(os.__file__)
    paths = [str(secret), str(dataset), str(readme), "/etc/hostname", str(stdlib)]
    result = _run(pool, LOOK.format(paths=paths), disable=disable)
    assert result.ok, result.stderr
    seen = json.loads(next(x for x in result.stdout.splitlines() if x.startswith("LOOK "))[5:])
    hidden = {str(secret), str(dataset), str(readme), "/etc/hostname"}
    assert all(not seen[p].startswith("read") for p in hidden), seen
    assert seen[str(stdlib)].startswith("read")
    if disable:  # Landlock: the paths exist but may not be read; "/" may not be listed
        assert result.isolation["reads"].startswith("landlock") and seen["/"] == "PermissionError"
    else:  # the private root: they do not exist at all
        assert all(seen[p] == "FileNotFoundError" for p in hidden), seen
        assert result.isolation["reads"].startswith("private root")
        assert set(seen["/"]) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc",
                                  "sbin", "tmp", "usr", "var", *Path(sys.prefix).parts[1:2],
                                  *Path(sys.base_prefix).parts[1:2]}  # fmt: skip


KILLED_CALLER = """
import sys, threading, time
sys.path.insert(0, {repo!r})
from mmrft.rewards.sandbox import SandboxPool
pool = SandboxPool(2)
pool.start()
for code in {codes!r}:
    threading.Thread(target=pool.run, args=(code,), kwargs={{"timeout_s": 120}}, daemon=True).start()
print("STARTED", flush=True)
time.sleep(600)
"""

BURN = "while True:\n    pass\n"
DETACH = (
    "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
    "        while True: time.sleep(1)\n    os._exit(0)\nwhile True:\n    pass\n"
)


def _owned_by(pid: int, tag: str) -> list[str]:
    """Live processes whose HOME is one of the sandbox directories of process ``pid`` (named
    with ``tag``, its pid and start time): its servers, supervisors, jobs and whatever the
    code started keep it."""
    prefixes = tuple(
        os.path.join(tempfile.gettempdir(), f"mmrft-sandbox-{kind}{tag}")
        for kind in ("", "server-")
    )
    return _survivors(prefixes, {pid})


@needs_root
def test_nothing_survives_a_killed_caller_and_its_directories_are_removed_later(tmp_path):
    script = tmp_path / "caller.py"
    script.write_text(KILLED_CALLER.format(repo=str(REPO), codes=[BURN, DETACH]))
    caller = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert caller.stdout.readline().strip() == "STARTED"
        tag = f"{caller.pid}.{sandbox._start_time(caller.pid)}-"
        deadline = time.monotonic() + 60
        while len(_owned_by(caller.pid, tag)) < 9 and time.monotonic() < deadline:
            time.sleep(0.1)  # 2 servers, 2 supervisors, 2 inits, the codes and the detached one
        running = _owned_by(caller.pid, tag)
        assert len(running) >= 9, running
    finally:
        caller.kill()
        caller.wait()
    deadline = time.monotonic() + 10
    while _owned_by(caller.pid, tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _owned_by(caller.pid, tag) == [], "a process outlived its killed caller"
    left = glob.glob(os.path.join(tempfile.gettempdir(), f"mmrft-sandbox-*{tag}*"))
    assert left, "expected the killed caller's directories to be left behind"
    # The next process that starts a pool removes them (and nobody else's).
    mine = glob.glob(os.path.join(tempfile.gettempdir(), f"mmrft-sandbox-*{os.getpid()}.*"))
    subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
         "from mmrft.rewards.sandbox import SandboxPool\nSandboxPool(1).close()"],
        check=True, timeout=60,
    )  # fmt: skip
    assert not [p for p in left if os.path.exists(p)]
    assert all(os.path.exists(p) for p in mine)


@pytest.mark.serial  # wall-clock budget: make test runs it alone
def test_closing_a_pool_does_not_wait_for_its_jobs():
    with SandboxPool(1) as pool:
        pool.start()
        worker = threading.Thread(target=pool.run, args=(BURN,), kwargs={"timeout_s": 60})
        worker.start()
        time.sleep(1.0)
        start = time.monotonic()
    worker.join(30)
    assert not worker.is_alive() and time.monotonic() - start < 10
