"""Isolated execution of model-written Python code (chart-to-code, SVG and other render verifiers).

``run_python(code, ...)`` runs one program and returns a :class:`SandboxResult`;
:class:`SandboxPool` runs many at once on warm fork servers. Both never raise on the code
itself: whatever the code does comes back as ``ok=False`` with a short, stable ``reason``
that a verifier can count.

Reasons
    ``"timeout"`` (wall clock), ``"cpu limit"``, ``"memory limit"`` (MemoryError, as under the
    address-space limit), ``"file too large"`` (a write past ``max_file_mb`` or the workdir
    quota, or an output over its cap), ``"output too large"`` (more than
    ``OUTPUT_KILL_FACTOR × max_output_bytes`` written to stdout + stderr), ``"killed by signal
    N"``, ``"exit code N"``, ``"syntax error"`` (the code does not compile; it is not run),
    ``"exception: <Type>"`` (uncaught exception: the nearest *builtin* class, so a closed set of
    names), ``"no output file"`` (exit 0 but a requested output is missing or not a regular
    file), ``"sandbox error"`` (the sandbox itself failed: never the code's fault). ``ok`` is
    true only for exit status 0 with every requested output present.

    Every reason is decided by the supervisor from what it observed itself: its own clock and
    output counters, the kernel's wait status and CPU time, its own ``compile()`` of the code,
    the sizes of the files in the workdir. The code's process may make one claim, and only in
    one form: after an uncaught exception (exit status 1) the runner writes ``exception:
    <builtin class>`` on a status pipe, which is accepted if it is the only thing on it. The
    code can write that line too, but it gains nothing it could not get by raising that
    exception; any other text on the pipe (a forged ``timeout``, ``syntax error``, a second
    line) leaves ``exit code N``.

Process layout (one job)
    caller ──pipe──► fork server F (a fresh ``python -I -B`` with a scrubbed environment, its
    own session; imports ``preload`` once) ──fork──► supervisor J (trusted, outside the
    sandbox: enforces the wall clock, reads stdout/stderr/status pipes, collects outputs)
    ──fork──► init I (pid 1 of a new PID namespace; builds the private root, reaps, reports
    the code's wait status) ──fork──► the code's process U (applies every restriction below,
    then ``exec``s the code as ``__main__``). Results travel J → F → caller as length-prefixed
    JSON; outputs are read by J from a directory fd opened before the code ran
    (``O_NOFOLLOW``, regular files with one link only, each under its own size cap, checked
    before reading), never from anything the code's process hands over. The caller refuses a
    reply larger than the job's caps allow, so its memory is bounded by the job's limits.

    Each process dies with its parent (``PR_SET_PDEATHSIG``: F with the caller, J with F, I
    with J, and the namespace with I), so nothing outlives a caller killed with SIGKILL; F is
    started from a thread that lives as long as the caller, since the signal follows the
    forking *thread*. Temporary directories are named ``mmrft-sandbox-<pid>.<start time>-*``
    after their owner; the first pool of a later process removes those whose owner no longer
    runs (:func:`remove_stale_dirs`).

What is isolated (each layer is detected at run time and reported in ``isolation``)
    * Resources: ``RLIMIT_CPU`` (``cpu_s``, default ``timeout_s + 1``; SIGXCPU then SIGKILL),
      ``RLIMIT_AS`` (``memory_mb``: the whole address space, including ~150 MB of preloaded
      matplotlib), ``RLIMIT_FSIZE`` (``max_file_mb``), ``RLIMIT_NPROC`` (``max_procs`` tasks
      — processes and threads — on top of what the code's uid already runs), ``RLIMIT_CORE``
      0, ``RLIMIT_NOFILE`` 256.
    * Wall clock: J kills the job at ``timeout_s``. With a PID namespace, killing its init kills
      every process in it, daemons included, and the kernel reaps them. Without one, J kills the
      code's session and, being a child subreaper, every orphan reparented to it until none is
      left.
    * Environment: only PATH, HOME/TMPDIR (= the workdir), LANG, MPLBACKEND=Agg,
      MPLCONFIGDIR (in the workdir), PYTHONDONTWRITEBYTECODE, single-threaded BLAS/OpenMP and
      the job's ``env``. The fork server is started with the same scrubbed set, so
      ``/proc/self/environ`` holds no secret either.
    * Files the code can read: with a mount namespace (root callers, or a user namespace) the
      job gets a *private root*: an empty read-only tmpfs holding only the interpreter's
      prefixes (standard library, site-packages), the system directories (``/usr``, ``/bin``,
      ``/sbin``, ``/lib*``), a few files of ``/etc`` (the loader's cache, ``passwd``,
      ``group``, ``localtime``, ``nsswitch.conf``, fonts), ``/var/cache/fontconfig``,
      ``/dev/{null,zero,full,random,urandom}``, its own ``/proc`` and the workdir, all bound
      read-only at their usual paths; then ``pivot_root`` (``chroot`` where the root cannot
      be pivoted). The caller's home, the repository and its datasets, ``/tmp`` and every other
      job's workdir do not exist there (``isolation["visible"]`` lists what does). Without a
      mount namespace, Landlock read rules allow reading only beneath the same paths (and
      nothing of ``/proc``); without either, every file the code's uid may read is readable
      and a fallback says so. A caller must never place a verifier's answer (the reference,
      the target) in a job's inputs.
    * Files the code can write: an empty workdir (``<tmp>/mmrft-sandbox-*/work``, created by
      the caller, removed by the caller in all cases). With a mount namespace it is a private
      tmpfs of ``WORKDIR_QUOTA_FACTOR × max_file_mb`` MB and 4096 inodes, seen only by the
      job and gone with its last process. Writes anywhere else fail by up to three layers:
      Landlock (write rights only beneath the workdir and ``/dev/null``), the read-only mounts
      of the private root, and, when the caller is root, the uid ``nobody``. If ``nobody``
      cannot read the interpreter's directory at all, the code runs as root without
      capabilities instead (a fallback).
    * Network: a new network namespace (no interfaces up, not even loopback) when running as
      root or in a user namespace. Otherwise Landlock (ABI ≥ 4) denies TCP connect/bind and
      the ``socket`` module is disabled at the Python level, which ctypes can bypass: the
      ``isolation["network"]`` string says which.
    * Other processes: a PID namespace with its own ``/proc`` (the caller's pid does not
      exist there), a different uid (root callers) so ``/proc/<pid>/environ`` of the caller is
      unreadable, Landlock scoping (ABI ≥ 6: no signals to and no abstract-socket connections
      with processes outside the sandbox), and new IPC and UTS namespaces. Without namespaces
      and without a uid change, Landlock denies reading ``/proc`` altogether.
    * Privileges: ``no_new_privs``; every capability is gone (setuid away from root, or
      explicitly dropped inside a user namespace).

What is NOT isolated
    * Reads of the interpreter's prefixes and the system directories: whatever lies there
      (site-packages, ``/usr/share``) is readable. Data must not live there.
    * Pathname Unix sockets stay reachable subject to their file permissions; without a
      network namespace UDP is blocked only at the Python level.
    * Concurrent jobs of root callers all run as ``nobody``: Landlock keeps them out of each
      other's workdirs for writes; with a private root they cannot even see them, without one
      they could read them. They share the nobody process count. There is no cgroup: memory is capped per process (RLIMIT_AS), not
      per job, and CPU time likewise; the tmpfs workdir's pages are RAM outside RLIMIT_AS.
      Without a mount namespace the workdir has no quota beyond RLIMIT_FSIZE per file.
    * Without a PID namespace, a process the code detached (new session, double fork) is
      killed at the job's end by the supervisor's sweep, but not if the caller dies first.
    * Kernel exploits. This is a sandbox against buggy or mischievous model output, not a
      security boundary against a determined attacker with a kernel 0-day.

Decision: a fork server per worker, not a fresh interpreter per job (measured, 2-core VM)
    A fresh interpreter pays start-up + ``import matplotlib.pyplot`` (0.6-1.0 s) before it
    draws anything; a child forked from a server that preloaded matplotlib (and drew one
    warm-up figure, then ``gc.freeze()``) starts drawing at once. The sandbox itself adds
    ~30 ms per job (three forks, namespaces, the private root's ~20 mounts and ``pivot_root``
    ~10 ms of it, Landlock, result transfer). So the pool keeps one warm fork server per worker
    and forks a fresh, fully restricted child per job; state never leaks between jobs because
    each child is a copy of the pristine server. ``benchmarks/sandbox_throughput.py`` (a group
    of 8 two-panel charts, 2-core VM): naive sequential ``subprocess.run`` 4.4 s,
    ``SandboxPool(2)`` warm 0.81 s (5.4×, ≈ ceil(8/2) × one render), cold including server
    start 1.5 s; earlier, with other jobs loading the VM, 15-17 s vs 1.9-2.5 s.
    One-shot ``run_python`` costs ~0.15 s + the code, or ~1 s with matplotlib preloaded: it
    starts and stops a server around the call, paying the import each time.

Execution details
    Linux only (namespaces, Landlock, ``pidfd``, ``prctl`` through ctypes). The code runs as
    the body of ``__main__`` with ``sys.argv == ["<sandbox>"]``; ``SystemExit`` behaves as in
    a script; when it returns, the namespace is cleared and collected (so open files are
    flushed), stdout/stderr are flushed and the process ends with ``os._exit``: ``atexit``
    handlers and non-daemon threads are not waited for. Tracebacks show the code's own lines.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import errno
import fcntl
import gc
import importlib
import io
import json
import logging
import math
import os
import pwd
import queue
import re
import resource
import select
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn

__all__ = [
    "MECHANISMS",
    "OUTPUT_KILL_FACTOR",
    "WORKDIR_QUOTA_FACTOR",
    "SandboxJob",
    "SandboxPool",
    "SandboxResult",
    "remove_stale_dirs",
    "run_python",
]

log = logging.getLogger("mmrft.rewards.sandbox")

#: The code is killed ("output too large") once stdout + stderr exceed this × max_output_bytes.
OUTPUT_KILL_FACTOR = 16
#: With a mount namespace the workdir is a tmpfs of this × max_file_mb megabytes.
WORKDIR_QUOTA_FACTOR = 4
#: Isolation layers a job may switch off with ``disable=`` (for tests and diagnosis).
MECHANISMS = frozenset({"uid", "userns", "pidns", "netns", "mountns", "landlock"})

_NOFILE = 256
_WORKDIR_INODES = 4096
_MIB = 1024 * 1024
_GRACE_S = 30.0  # the caller's own deadline on top of timeout_s, should the server hang
_START_TIMEOUT_S = 120.0  # server start (preloading matplotlib the first time builds a font cache)
_SCRIPT = os.path.abspath(__file__)
_SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
#: The only claim the code's process may make (see "Reasons"): the builtin exception class it
#: ended on. Anything else it writes to the status pipe is ignored.
_CLAIM_RE = re.compile(rb"exception: ([A-Za-z]{1,40})\n")
_BUILTIN_EXCEPTIONS = frozenset(
    name
    for name, value in vars(__import__("builtins")).items()
    if isinstance(value, type) and issubclass(value, BaseException)
)
#: What the code sees of the filesystem besides the interpreter's prefixes and its workdir
#: (see "Files"): system directories, the loader's and fontconfig's files, a few devices.
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_ENTRIES = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "passwd", "group",
    "nsswitch.conf", "fonts",
)  # fmt: skip
_DEVICES = ("null", "zero", "full", "random", "urandom")
_DIR_RE = re.compile(r"mmrft-sandbox-(?:server-)?(\d+)\.(\d+)-")
_HEADER = struct.Struct(">Q")
_KEEP: list[Any] = []  # objects that must never be finalised in a forked child


# --------------------------------------------------------------------------- public types


@dataclass(frozen=True)
class SandboxResult:
    """What happened to one program.

    Attributes:
        ok: exit status 0 and every requested output present.
        reason: ``None`` when ok, else one of the stable strings in the module docstring.
        exit_code: the exit status, ``None`` when killed by a signal (or never started).
        signal: the signal that killed the code's process, else ``None``. A wall-clock or
            output kill is reported as ``reason`` with ``signal=None``.
        stdout, stderr: decoded as UTF-8 (invalid bytes replaced); longer than
            ``max_output_bytes`` keeps the first and the last half with a marker between.
        files: the requested outputs that exist (regular files, at most ``max_file_mb``).
        seconds: wall time of the sandboxed processes, set-up included.
        isolation: which protections were active for this run: ``uid`` (inside its user
            namespace, if any), ``user_namespace``, ``namespaces`` (pid, net, ipc, uts, mnt),
            ``network``, ``reads`` and ``visible`` (what of the filesystem the code could
            read), ``writes`` (the layers that block writes outside the workdir), ``proc``,
            ``landlock_abi`` (0 = off), ``no_new_privs``,
            ``no_capabilities``, ``cleanup``, ``workdir``, ``limits``, and ``fallbacks`` (one
            line per weaker mechanism taken; each is also logged once per process as a
            warning).
    """

    ok: bool
    reason: str | None
    exit_code: int | None
    signal: int | None
    stdout: str
    stderr: str
    files: dict[str, bytes]
    seconds: float
    isolation: dict[str, Any]


@dataclass(frozen=True)
class SandboxJob:
    """One program and its limits; the keyword arguments of :func:`run_python`.

    ``preload=None`` means "the pool's preload" (nothing for ``run_python``). Parameters are
    checked here and raise ``ValueError``: they come from the programmer, not the model.
    """

    code: str
    timeout_s: float = 10.0
    cpu_s: float | None = None
    memory_mb: int = 1024
    max_file_mb: int = 64
    max_procs: int = 32
    max_output_bytes: int = 65536
    inputs: Mapping[str, bytes] = field(default_factory=dict)
    outputs: Sequence[str] | Mapping[str, int] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    preload: Sequence[str] | None = None
    disable: Collection[str] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.code, str):
            raise ValueError(f"code must be a str, got {type(self.code).__name__}")
        if not (isinstance(self.timeout_s, int | float) and 0 < self.timeout_s < math.inf):
            raise ValueError(f"timeout_s must be a positive number, got {self.timeout_s!r}")
        if self.cpu_s is not None and not (0 < self.cpu_s < math.inf):
            raise ValueError(f"cpu_s must be positive or None, got {self.cpu_s!r}")
        for name in ("memory_mb", "max_file_mb", "max_procs", "max_output_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        inputs = dict(self.inputs or {})
        for name, data in inputs.items():
            _check_name(name, "input")
            if not isinstance(data, bytes | bytearray | memoryview):
                raise ValueError(f"input {name!r} must be bytes")
        file_cap = self.max_file_mb * _MIB
        if isinstance(self.outputs, Mapping):
            outputs = dict(self.outputs)
        else:
            outputs = dict.fromkeys(self.outputs, file_cap)
        for name, cap in outputs.items():
            _check_name(name, "output")
            if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
                raise ValueError(f"output {name!r}: the size cap must be a positive int")
            outputs[name] = min(cap, file_cap)
        env = dict(self.env or {})
        for key, value in env.items():
            if not (isinstance(key, str) and isinstance(value, str)) or not key:
                raise ValueError(f"env entries must be str → str, got {key!r}: {value!r}")
            if "=" in key or "\0" in key or "\0" in value:
                raise ValueError(f"invalid env entry {key!r}")
        unknown = set(self.disable) - MECHANISMS
        if unknown:
            raise ValueError(
                f"unknown mechanisms in disable: {sorted(unknown)}; know {sorted(MECHANISMS)}"
            )
        object.__setattr__(self, "inputs", {k: bytes(v) for k, v in inputs.items()})
        object.__setattr__(self, "outputs", outputs)
        object.__setattr__(self, "env", env)
        object.__setattr__(self, "disable", tuple(sorted(set(self.disable))))
        if self.preload is not None:
            object.__setattr__(self, "preload", tuple(self.preload))


def _check_name(name: object, what: str) -> None:
    if (
        not isinstance(name, str)
        or not name
        or name in (".", "..")
        or "/" in name
        or "\0" in name
        or len(name) > 255
    ):
        raise ValueError(f"{what} names are plain file names inside the workdir, got {name!r}")


def run_python(
    code: str,
    *,
    timeout_s: float = 10.0,
    cpu_s: float | None = None,
    memory_mb: int = 1024,
    max_file_mb: int = 64,
    max_procs: int = 32,
    max_output_bytes: int = 65536,
    inputs: Mapping[str, bytes] | None = None,
    outputs: Sequence[str] | Mapping[str, int] = (),
    env: Mapping[str, str] | None = None,
    preload: Sequence[str] = (),
    disable: Collection[str] = (),
) -> SandboxResult:
    """Run ``code`` once in a fresh sandbox and return what happened (never raises on the code).

    Args:
        code: Python source, run as ``__main__`` in an empty working directory.
        timeout_s: wall-clock limit; the whole process tree is killed at the deadline.
        cpu_s: CPU-seconds limit of each process (default ``timeout_s + 1``; RLIMIT_CPU counts
            whole seconds, so it is rounded up).
        memory_mb: address-space limit of each process (RLIMIT_AS).
        max_file_mb: largest file the code may write (RLIMIT_FSIZE) and largest output returned.
        max_procs: tasks (processes + threads, its own process included) the code may run.
        max_output_bytes: stdout and stderr are each truncated to this many bytes.
        inputs: files to place in the workdir first (plain names → content).
        outputs: plain file names to read back from the workdir afterwards, or a mapping of
            names to the largest size (bytes) accepted for each (never above ``max_file_mb``);
            a larger output fails the run with ``"file too large"`` and is not read.
        env: extra environment variables for the code.
        preload: modules the fork server imports before forking (e.g. ``"matplotlib.pyplot"``).
            A one-shot call pays for the import; use :class:`SandboxPool` to pay once.
        disable: isolation layers to switch off (names in :data:`MECHANISMS`), for tests.
    """
    job = SandboxJob(
        code,
        timeout_s=timeout_s,
        cpu_s=cpu_s,
        memory_mb=memory_mb,
        max_file_mb=max_file_mb,
        max_procs=max_procs,
        max_output_bytes=max_output_bytes,
        inputs=inputs or {},
        outputs=outputs,
        env=env or {},
        preload=preload,
        disable=disable,
    )
    with SandboxPool(workers=1) as pool:
        return pool.run(job)


class SandboxPool:
    """Warm fork servers running up to ``workers`` sandboxed programs at once.

    Each worker owns one fork server (started lazily, or all at once by :meth:`start`); a job
    whose ``preload`` differs from its worker's server restarts that server. A server that
    stops answering is killed with its whole process group and replaced at the next job.
    Thread-safe; use as a context manager or call :meth:`close`.

    :meth:`map` runs each job in a daemon thread that waits for an idle server (not a
    ``ThreadPoolExecutor``, whose threads the interpreter joins at exit before any ``atexit``
    handler could stop the servers: a caller that gave up on a job, e.g. after its verifier's
    time budget, would wait for the job's own timeout to exit).
    """

    def __init__(self, workers: int | None = None, *, preload: Sequence[str] = ()) -> None:
        self.workers = max(1, workers if workers is not None else _cpu_count())
        self.preload = tuple(preload)
        self._idle: queue.SimpleQueue[_Server | None] = queue.SimpleQueue()
        for _ in range(self.workers):
            self._idle.put(None)
        self._servers: set[_Server] = set()
        self._lock = threading.Lock()
        self._closed = False
        key = f"{os.getpid()}:{tempfile.gettempdir()}"
        if key not in _cleaned:
            _cleaned.add(key)
            remove_stale_dirs()

    def start(self) -> None:
        """Start every worker's server now (in parallel) instead of at its first job."""
        self._in_threads([lambda: self._with_server(self.preload, lambda s: None)] * self.workers)

    def run(self, job: SandboxJob | str, **kwargs: Any) -> SandboxResult:
        """Run one job (a :class:`SandboxJob`, or code plus :func:`run_python` keywords)."""
        job = self._as_job(job, kwargs)
        preload = tuple(job.preload or ())
        return self._with_server(preload, lambda server: server.run(job))

    def map(self, jobs: Iterable[SandboxJob | Mapping[str, Any]]) -> list[SandboxResult]:
        """Run jobs (SandboxJob or dicts of :func:`run_python` keywords) ``workers`` at a time;
        results come back in the order of ``jobs``."""
        items = [
            job if isinstance(job, SandboxJob) else self._as_job(dict(job), {}) for job in jobs
        ]
        return self._in_threads([lambda job=job: self.run(job) for job in items])

    def _in_threads(self, calls: Sequence[Any]) -> list[Any]:
        """Each call in a daemon thread (at most ``workers`` hold a server at a time); the
        results in order, or the first exception."""
        results: list[Any] = [None] * len(calls)
        errors: list[BaseException] = []

        def work(i: int) -> None:
            try:
                results[i] = calls[i]()
            except BaseException as exc:  # handed to the caller
                errors.append(exc)

        threads = [
            threading.Thread(target=work, args=(i,), name="mmrft-sandbox", daemon=True)
            for i in range(len(calls))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return results

    def close(self) -> None:
        """Stop every server at once, jobs in flight included (they end as ``sandbox error``),
        so that closing never waits for a job's timeout. Idempotent."""
        self._closed = True
        with self._lock:
            servers, self._servers = list(self._servers), set()
        for server in servers:
            server.close()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _as_job(self, job: SandboxJob | str | dict[str, Any], kwargs: dict[str, Any]) -> SandboxJob:
        if isinstance(job, dict):
            job = SandboxJob(**job)
        elif isinstance(job, str):
            job = SandboxJob(job, **kwargs)
        elif kwargs:
            raise TypeError("keyword arguments go with code, not with a SandboxJob")
        if job.preload is None:
            job = replace(job, preload=self.preload)
        return job

    def _with_server(self, preload: tuple[str, ...], fn: Any) -> Any:
        if self._closed:
            raise RuntimeError("SandboxPool is closed")
        server = self._idle.get()
        try:
            if server is not None and (not server.alive or server.preload != preload):
                server.close()
                with self._lock:
                    self._servers.discard(server)
                server = None
            if server is None:
                try:
                    server = _Server(preload)
                except (OSError, RuntimeError) as exc:
                    log.error("sandbox server failed to start: %s", exc)
                    return _result(_failure("sandbox error", f"server failed to start: {exc}"))
                with self._lock:
                    self._servers.add(server)
                if self._closed:  # closed while this one started: close() did not see it
                    server.close()
                    return _result(_failure("sandbox error", "the pool was closed"))
            return fn(server)
        finally:
            self._idle.put(server)


# --------------------------------------------------------------------------- caller side


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_fallbacks(isolation: Mapping[str, Any]) -> None:
    for note in isolation.get("fallbacks", ()):
        with _warned_lock:
            if note in _warned:
                continue
            _warned.add(note)
        log.warning("sandbox isolation fallback: %s", note)


def _base_env(home: str) -> dict[str, str]:
    return {
        "PATH": _SAFE_PATH,
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": os.path.join(home, ".config", "matplotlib"),
        "PYTHONDONTWRITEBYTECODE": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _start_time(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks after boot), ``None`` if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _owner_tag() -> str:
    """``<pid>.<start time>`` of this process, in the names of its temporary directories: a
    later process removes the directories of an owner that no longer runs (pid gone or reused)."""
    return f"{os.getpid()}.{_start_time(os.getpid()) or 0}"


_cleaned: set[str] = set()


def remove_stale_dirs(directory: str | None = None) -> list[str]:
    """Remove the sandbox directories (``mmrft-sandbox-<pid>.<start>-*``) left in ``directory``
    (default: the temporary directory) by processes that no longer run, e.g. a trainer killed
    with SIGKILL. Directories of live processes and of other users are kept; processes that
    share a temporary directory are assumed to share a PID namespace (a container sharing
    ``/tmp`` with another would see the other's owners as gone). Returns the paths removed.
    Called once per process and directory by the first :class:`SandboxPool`."""
    directory = directory or tempfile.gettempdir()
    removed = []
    try:
        entries = os.listdir(directory)
    except OSError:
        return removed
    for entry in entries:
        match = _DIR_RE.match(entry)
        if match is None:
            continue
        pid, start = int(match.group(1)), int(match.group(2))
        if pid == os.getpid() or _start_time(pid) == start:
            continue  # its owner still runs
        path = os.path.join(directory, entry)
        with contextlib.suppress(OSError):
            info = os.lstat(path)
            if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid():  # ours, not a link
                _remove_tree(path)
                removed.append(path)
    if removed:
        log.info("removed %d sandbox directories left by stopped processes", len(removed))
    return removed


_spawner_lock = threading.Lock()
_spawner: tuple[int, queue.SimpleQueue[Any]] | None = None


def _spawn(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen`` from one thread that lives as long as this process.

    Servers ask for ``PR_SET_PDEATHSIG``, which fires when the *thread* that forked them ends,
    not the process: started from a short-lived thread (a verifier's time-budget thread, a
    pool's executor) they would be killed with it.
    """
    global _spawner
    with _spawner_lock:
        if _spawner is None or _spawner[0] != os.getpid():  # none yet, or inherited by fork()
            requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
            threading.Thread(
                target=_spawn_loop, args=(requests,), name="mmrft-sandbox-spawner", daemon=True
            ).start()
            _spawner = (os.getpid(), requests)
        requests = _spawner[1]
    done = threading.Event()
    box: dict[str, Any] = {}
    requests.put((argv, kwargs, box, done))
    done.wait()
    if "error" in box:
        raise box["error"]
    return box["proc"]


def _spawn_loop(requests: queue.SimpleQueue[Any]) -> None:
    while True:
        argv, kwargs, box, done = requests.get()
        try:
            box["proc"] = subprocess.Popen(argv, **kwargs)
        except BaseException as exc:  # handed to the caller
            box["error"] = exc
        done.set()


class _Server:
    """Caller-side handle of one fork server process."""

    def __init__(self, preload: tuple[str, ...]) -> None:
        self.preload = preload
        self.dir = tempfile.mkdtemp(prefix=f"mmrft-sandbox-server-{_owner_tag()}-")
        try:
            self.proc = _spawn(
                [sys.executable, "-I", "-B", _SCRIPT, "--serve", str(os.getpid()), *preload],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=_base_env(self.dir),
                cwd=self.dir,
                close_fds=True,
                start_new_session=True,
            )
        except OSError:
            _remove_tree(self.dir)
            raise
        self._finalizer = weakref.finalize(self, _stop_server, self.proc, self.dir)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._tx, self._rx = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        try:
            hello = _read_frame(self._rx, time.monotonic() + _START_TIMEOUT_S)
        except (OSError, TimeoutError, ValueError) as exc:
            self.close()
            raise RuntimeError(f"sandbox server did not start: {exc}") from exc
        if not isinstance(hello, dict) or not hello.get("ready"):
            self.close()
            raise RuntimeError("sandbox server did not start (no hello)")
        for module, error in hello.get("failed", {}).items():
            log.warning("sandbox preload of %s failed: %s", module, error)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, job: SandboxJob) -> SandboxResult:
        base = tempfile.mkdtemp(prefix=f"mmrft-sandbox-{_owner_tag()}-")
        try:
            os.chmod(base, 0o711)  # the code's uid may traverse, not list or rename
            work = os.path.join(base, "work")
            os.mkdir(work, 0o700)
            os.mkdir(os.path.join(base, "root"), 0o700)  # where the job's filesystem view is built
            request = {
                "code": job.code,
                "timeout_s": float(job.timeout_s),
                "cpu_s": job.cpu_s,
                "memory_mb": job.memory_mb,
                "max_file_mb": job.max_file_mb,
                "max_procs": job.max_procs,
                "max_output_bytes": job.max_output_bytes,
                "inputs": {k: base64.b64encode(v).decode() for k, v in job.inputs.items()},
                "outputs": dict(job.outputs),
                "env": {**_base_env(work), **job.env},
                "disable": list(job.disable),
                "workdir": work,
            }
            try:
                _write_frame(self._tx, request)
                reply = _read_frame(
                    self._rx, time.monotonic() + job.timeout_s + _GRACE_S, _reply_limit(job)
                )
            except (OSError, TimeoutError, ValueError) as exc:
                reply = None
                error = f"{type(exc).__name__}: {exc}"
            else:
                error = "server exited"
            if not isinstance(reply, dict):
                if self._finalizer.alive:  # not stopped on purpose by its pool's close()
                    log.error("sandbox server failed (%s); restarting it", error)
                self.close()
                return _result(_failure("sandbox error", error))
        finally:
            _remove_tree(base)
        result = _result(reply)
        _warn_fallbacks(result.isolation)
        if result.reason == "sandbox error":
            log.warning("sandbox error: %s", result.stderr[-500:].strip())
        return result

    def close(self) -> None:
        self._finalizer()


def _reply_limit(job: SandboxJob) -> int:
    """The largest reply a job can produce: its outputs in base64, stdout and stderr with every
    character escaped by JSON (at most 6 bytes each), and 1 MiB for the rest."""
    streams = 2 * 6 * (job.max_output_bytes + 200)
    return sum(job.outputs.values()) * 4 // 3 + 16 * len(job.outputs) + streams + _MIB  # type: ignore[union-attr]


def _stop_server(proc: subprocess.Popen[bytes], directory: str) -> None:
    if proc.poll() is None:  # not reaped yet, so its process group id cannot have been reused
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)  # the server, its supervisor and the job's init
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    _remove_tree(directory)


def _remove_tree(path: str) -> None:
    """Remove a workdir even if the code chmod-ed parts of it to 000."""

    def fix(function: Any, failed: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed), 0o700)
            os.chmod(failed, 0o700)
        with contextlib.suppress(OSError):
            if os.path.isdir(failed) and not os.path.islink(failed):
                shutil.rmtree(failed, ignore_errors=True)
            else:
                os.unlink(failed)

    if os.path.lexists(path):
        if sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=fix)
        else:
            shutil.rmtree(path, onerror=fix)
    if os.path.lexists(path):
        log.warning("sandbox could not remove %s", path)


def _result(wire: Mapping[str, Any]) -> SandboxResult:
    return SandboxResult(
        ok=bool(wire["ok"]),
        reason=wire["reason"],
        exit_code=wire["exit_code"],
        signal=wire["signal"],
        stdout=wire["stdout"],
        stderr=wire["stderr"],
        files={k: base64.b64decode(v) for k, v in wire["files"].items()},
        seconds=float(wire["seconds"]),
        isolation=dict(wire["isolation"]),
    )


def _failure(
    reason: str, detail: str = "", isolation: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "ok": False,
        "reason": reason,
        "exit_code": None,
        "signal": None,
        "stdout": "",
        "stderr": detail,
        "files": {},
        "seconds": 0.0,
        "isolation": isolation or {},
    }


# --------------------------------------------------------------------------- framing


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _write_frame(fd: int, obj: Any) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode()
    _write_all(fd, _HEADER.pack(len(data)) + data)


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes | None:
    chunks: list[bytes] = []
    while n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError("no reply in time")
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _read_frame(fd: int, deadline: float | None = None, limit: int = 1 << 34) -> Any:
    header = _read_exact(fd, _HEADER.size, deadline)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > limit:
        raise ValueError(f"frame of {size} bytes, more than the {limit} expected at most")
    body = _read_exact(fd, size, deadline)
    return None if body is None else json.loads(body)


# --------------------------------------------------------------------------- Linux primitives

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_CHILD_SUBREAPER = 36
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_NOATIME, _MS_NODIRATIME, _MS_BIND = 32, 1024, 2048, 4096
_MS_REC, _MS_PRIVATE, _MS_RELATIME, _MS_STRICTATIME = 16384, 1 << 18, 1 << 21, 1 << 24
_MOUNT_OPTION_FLAGS = {
    "nosuid": _MS_NOSUID,
    "nodev": _MS_NODEV,
    "noexec": _MS_NOEXEC,
    "noatime": _MS_NOATIME,
    "nodiratime": _MS_NODIRATIME,
    "relatime": _MS_RELATIME,
    "strictatime": _MS_STRICTATIME,
}

# Landlock (uapi/linux/landlock.h); the syscall numbers are the same on every architecture.
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LL_EXECUTE, _LL_WRITE_FILE, _LL_READ_FILE, _LL_READ_DIR = 1, 2, 4, 8
_LL_REMOVE_DIR, _LL_REMOVE_FILE, _LL_MAKE_CHAR, _LL_MAKE_DIR = 16, 32, 64, 128
_LL_MAKE_REG, _LL_MAKE_SOCK, _LL_MAKE_FIFO, _LL_MAKE_BLOCK = 256, 512, 1024, 2048
_LL_MAKE_SYM, _LL_REFER, _LL_TRUNCATE, _LL_IOCTL_DEV = 4096, 8192, 16384, 32768
_LL_FILE_RIGHTS = _LL_EXECUTE | _LL_WRITE_FILE | _LL_READ_FILE | _LL_TRUNCATE | _LL_IOCTL_DEV
_LL_NET_BIND_TCP, _LL_NET_CONNECT_TCP = 1, 2
_LL_SCOPE_ABSTRACT_UNIX_SOCKET, _LL_SCOPE_SIGNAL = 1, 2


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


_libc_handle: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    global _libc_handle
    if _libc_handle is None:
        _libc_handle = ctypes.CDLL(None, use_errno=True)
        _libc_handle.syscall.restype = ctypes.c_long
    return _libc_handle


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def _unshare(flags: int) -> None:
    _check(_libc().unshare(ctypes.c_int(flags)), "unshare")


def _prctl(option: int, arg: int) -> None:
    ul = ctypes.c_ulong
    _check(_libc().prctl(ctypes.c_int(option), ul(arg), ul(0), ul(0), ul(0)), "prctl")


def _enc(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
) -> None:
    ret = _libc().mount(
        ctypes.c_char_p(_enc(source)), ctypes.c_char_p(_enc(target)), ctypes.c_char_p(_enc(fstype)),
        ctypes.c_ulong(flags), ctypes.c_char_p(_enc(data)),
    )  # fmt: skip
    _check(ret, f"mount {target}")


def _syscall(number: int, *args: Any) -> int:
    return _check(_libc().syscall(ctypes.c_long(number), *args), f"syscall {number}")


def _landlock_abi() -> int:
    try:
        return _syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    except OSError:
        return 0


def _landlock(workdir: str, readable: Sequence[str] | None) -> int:
    """Restrict this process (and its future children) with Landlock; returns the ABI used.

    Handled (denied unless a rule allows them): every write-like filesystem right, allowed
    beneath ``workdir`` and on ``/dev/null``; TCP bind/connect (ABI ≥ 4), never allowed;
    signals and abstract Unix sockets across the sandbox boundary (ABI ≥ 6). With ``readable``,
    reading files and listing directories are handled too and allowed only beneath ``workdir``
    and those paths (a path that does not exist is skipped).
    """
    abi = _landlock_abi()
    if abi < 1:
        raise OSError(errno.ENOSYS, "Landlock is not supported by this kernel")
    fs = (
        _LL_WRITE_FILE | _LL_REMOVE_DIR | _LL_REMOVE_FILE | _LL_MAKE_CHAR | _LL_MAKE_DIR
        | _LL_MAKE_REG | _LL_MAKE_SOCK | _LL_MAKE_FIFO | _LL_MAKE_BLOCK | _LL_MAKE_SYM
    )  # fmt: skip
    fs |= (_LL_REFER if abi >= 2 else 0) | (_LL_TRUNCATE if abi >= 3 else 0)
    read = _LL_READ_FILE | _LL_READ_DIR
    handled_fs = fs | (read if readable is not None else 0)
    net = _LL_NET_BIND_TCP | _LL_NET_CONNECT_TCP if abi >= 4 else 0
    scoped = _LL_SCOPE_ABSTRACT_UNIX_SOCKET | _LL_SCOPE_SIGNAL if abi >= 6 else 0
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    attr = _RulesetAttr(handled_fs, net, scoped)
    ruleset = _syscall(
        _SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0)
    )
    try:

        def allow(path: str, access: int) -> None:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    access &= _LL_FILE_RIGHTS
                rule = _PathBeneathAttr(access & handled_fs, fd)
                _syscall(
                    _SYS_LANDLOCK_ADD_RULE,
                    ctypes.c_int(ruleset),
                    ctypes.c_int(1),
                    ctypes.byref(rule),
                    ctypes.c_uint32(0),
                )
            finally:
                os.close(fd)

        allow(workdir, handled_fs)
        allow("/dev/null", _LL_WRITE_FILE | _LL_TRUNCATE | _LL_READ_FILE)
        for path in readable or ():
            with contextlib.suppress(OSError):
                allow(path, read)
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)
        _syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
    finally:
        os.close(ruleset)
    return abi


def _drop_capabilities() -> None:
    """Clear every capability of this process (capset v3 with empty sets)."""
    header = _CapHeader(0x20080522, 0)
    data = (_CapData * 2)()
    _check(_libc().capset(ctypes.byref(header), ctypes.byref(data)), "capset")


def _no_capabilities() -> bool:
    """Whether this process's effective capability set is empty (capget; no /proc needed)."""
    header = _CapHeader(0x20080522, 0)
    data = (_CapData * 2)()
    _check(_libc().capget(ctypes.byref(header), ctypes.byref(data)), "capget")
    return not any(d.effective for d in data)


def _mountinfo() -> list[tuple[str, set[str]]]:
    """(mount point, per-mount options) of this mount namespace, parents before children."""
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[4])
            mounts.append((point, set(parts[5].split(","))))
    return mounts


def _remount_read_only(point: str, options: set[str]) -> None:
    """Make one mount read-only, keeping its other per-mount flags (a user namespace may not
    clear nosuid, nodev, noexec or the atime flags of a mount it did not make)."""
    flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY
    for option in options:
        flags |= _MOUNT_OPTION_FLAGS.get(option, 0)
    _mount(None, point, None, flags)


def _private_mounts(workdir: str, new_proc: bool) -> list[str]:
    """Fallback when no private root can be built: a new mount namespace with private
    propagation, its own /proc (if ``new_proc``) and every mount read-only except ``workdir``.
    The host's files stay visible. Returns the mount points that stayed writable."""
    _unshare(_CLONE_NEWNS)
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing below propagates to the host
    if new_proc:
        _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    _mount(workdir, workdir, None, _MS_BIND)
    writable = []
    for point, options in _mountinfo():
        if point == workdir or (new_proc and point.startswith("/proc/")):
            continue  # the workdir stays writable; the host's /proc submounts are hidden
        try:
            _remount_read_only(point, options)
        except OSError:
            writable.append(point)
    return writable


@dataclass(frozen=True)
class _View:
    """What the code may read, worked out by the supervisor (which still sees the host's files).

    Attributes:
        links: ``(path, target)`` top-level symbolic links to recreate (``/bin -> usr/bin``).
        binds: ``(source, target)`` directories and files bound read-only; ``target`` has no
            symbolic link in its path (``source`` is resolved on the host).
        devices: character devices (``/dev/null``, ...) bound at the same path.
        essential: the interpreter's directories (the code cannot run without them).
    """

    links: tuple[tuple[str, str], ...]
    binds: tuple[tuple[str, str], ...]
    devices: tuple[str, ...]
    essential: tuple[str, ...]

    @property
    def visible(self) -> list[str]:
        """The paths of the private root, besides the workdir and /proc."""
        paths = {target for _, target in self.binds} | {link for link, _ in self.links}
        return sorted(paths | set(self.devices))

    @property
    def readable(self) -> list[str]:
        """What Landlock lets the code read on the host's filesystem (no private root)."""
        return sorted(set(self.visible) | {source for source, _ in self.binds})


def _interpreter_paths() -> list[str]:
    """Directories the code needs to read: the interpreter's prefixes (the standard library and
    site-packages are beneath them) and the directory of the real executable. ``sys.path``
    entries outside the prefixes (a source checkout added by an editable install, say) are not
    included: the preloaded modules are already imported, and such a directory may hold data."""
    prefixes = [sys.base_prefix, sys.prefix, sys.base_exec_prefix, sys.exec_prefix]
    candidates = [*prefixes, os.path.dirname(os.path.realpath(sys.executable))]
    return _outermost(os.path.realpath(p) for p in candidates if p and os.path.isdir(p))


def _outermost(paths: Iterable[str]) -> list[str]:
    """The paths that are not beneath another of them, sorted."""
    kept: list[str] = []
    for path in sorted(set(paths)):  # sorted: an ancestor comes before its descendants
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


def _filesystem_view(uid: int | None, gid: int | None) -> _View:
    """The job's filesystem (see "Files"). Optional entries that ``uid`` cannot read are left
    out; the interpreter's directories are always in (see :func:`_unreachable`)."""
    links: list[tuple[str, str]] = []
    dirs: list[str] = []
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):  # /bin -> usr/bin: the link, and what it points to
            links.append((path, os.readlink(path)))
            if os.path.isdir(path):
                dirs.append(os.path.realpath(path))
        elif os.path.isdir(path):
            dirs.append(path)
    essential = _interpreter_paths()
    optional = [os.path.join("/etc", entry) for entry in _ETC_ENTRIES]
    optional.append("/var/cache/fontconfig")
    binds = [(path, path) for path in _outermost([*dirs, *essential])]
    covered = [target for _, target in binds]
    for path in optional:
        if not os.path.exists(path):
            continue
        target = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
        source = os.path.realpath(path)
        if any(target.startswith(c.rstrip("/") + "/") for c in covered):
            continue
        if uid is None or not (_unreachable(uid, gid or 0, [source])[0]):
            binds.append((source, target))
    devices = []
    for name in _DEVICES:
        path = f"/dev/{name}"
        with contextlib.suppress(OSError):
            if stat.S_ISCHR(os.stat(path).st_mode):
                devices.append(path)
    return _View(tuple(links), tuple(binds), tuple(devices), tuple(essential))


def _build_root(workdir: str, mountpoint: str, new_proc: bool, view: _View) -> dict[str, Any]:
    """Enter a new mount namespace whose root is an empty tmpfs holding only ``view`` (bound
    read-only at the same paths), the workdir (writable), ``/dev`` with a few devices and, with
    ``new_proc``, the PID namespace's own ``/proc``; everything else of the host is gone.

    ``mountpoint`` (an empty directory) is where the tree is assembled before ``pivot_root``
    (``chroot`` where the current root cannot be pivoted, e.g. an initramfs). Returns what was
    done, for the isolation report; raises OSError when the root could not be entered.
    """
    _unshare(_CLONE_NEWNS)
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing below propagates to the host
    root = mountpoint.rstrip("/")
    _mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=1m,nr_inodes=4096")

    def place(target: str, directory: bool) -> str:
        path = root + target
        os.makedirs(os.path.dirname(path), 0o755, exist_ok=True)
        if directory:
            os.makedirs(path, 0o755, exist_ok=True)
        elif not os.path.lexists(path):
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o644))
        return path

    for link, target in view.links:
        os.symlink(target, root + link)
    for source, target in view.binds:
        _mount(source, place(target, os.path.isdir(source)), None, _MS_BIND | _MS_REC)
    for device in view.devices:
        _mount(device, place(device, False), None, _MS_BIND)
    if os.path.isdir(root + "/dev"):
        for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                             ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):  # fmt: skip
            os.symlink(target, f"{root}/dev/{name}")
    work = place(workdir, True)
    _mount(workdir, work, None, _MS_BIND | _MS_REC)
    proc = False
    if new_proc:
        with contextlib.suppress(OSError):  # refused in some containers: then there is no /proc
            _mount("proc", place("/proc", True), "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
            proc = True
    writable = []
    for point, options in _mountinfo():
        inside = point == root or point.startswith(root + "/")
        if not inside or point in (work, root + "/proc") or point.startswith(root + "/dev/"):
            continue  # the workdir stays writable; devices are not files
        try:
            _remount_read_only(point, options)
        except OSError:
            writable.append(point[len(root) :] or "/")
    return {"how": _enter_root(root), "proc": proc, "writable": writable}


_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "loongarch64": 41}
_MNT_DETACH = 2


def _enter_root(root: str) -> str:
    """Make ``root`` this mount namespace's root: ``pivot_root`` and detach the old root, else
    ``chroot`` (the code never holds the capability that undoes a chroot)."""
    import platform

    os.chdir(root)
    number = _PIVOT_ROOT.get(platform.machine())
    if number is not None:
        try:
            _syscall(number, ctypes.c_char_p(b"."), ctypes.c_char_p(b"."))
        except OSError:
            pass
        else:
            _check(_libc().umount2(ctypes.c_char_p(b"."), ctypes.c_int(_MNT_DETACH)), "umount2")
            os.chdir("/")
            return "pivot_root"
    os.chroot(".")
    os.chdir("/")
    return "chroot"


def _may(info: os.stat_result, uid: int, gid: int, bits: int) -> bool:
    """Whether ``uid``/``gid`` (no supplementary groups) has ``bits`` (r=4, x=1) on a file."""
    shift = 6 if info.st_uid == uid else 3 if info.st_gid == gid else 0
    return (info.st_mode >> shift) & bits == bits


def _unreachable(uid: int, gid: int, paths: Iterable[str]) -> tuple[list[str], list[str]]:
    """For an unprivileged ``uid``: the paths it cannot read itself, and those it could read
    but cannot reach because a directory above is closed to it (a pyenv interpreter under
    ``/root``, 0700). A private root reaches the second kind (its own directories are 0755);
    nothing but root reaches the first."""
    unreadable, behind = [], []
    for path in paths:
        try:
            info = os.stat(path)
            if not _may(info, uid, gid, 5 if stat.S_ISDIR(info.st_mode) else 4):
                unreadable.append(path)
                continue
            parts = path.strip("/").split("/")
            for i in range(len(parts)):
                if not _may(os.stat("/" + "/".join(parts[:i])), uid, gid, 1):
                    behind.append(path)
                    break
        except OSError:
            unreadable.append(path)
    return unreadable, behind


def _nobody() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534


def _tasks_of(uid: int) -> int:
    """Tasks (threads included, as RLIMIT_NPROC counts them) of ``uid`` seen in /proc."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                count += int(fields["Threads"])
        except (OSError, KeyError, ValueError):
            continue
    return count


def _children_of(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                kids.append(int(entry))
    return kids


def _describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit code {os.WEXITSTATUS(status)}"


# --------------------------------------------------------------------------- server side


def _serve(parent: int, preload: Sequence[str]) -> None:
    """Fork server main loop: one request frame in, one result frame out, until EOF.

    The server dies with its caller (``PR_SET_PDEATHSIG``; the caller starts it from a thread
    that lives as long as the caller), its supervisor with it, and the job's init with that.
    """
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the caller died before the line above
        os._exit(0)
    requests, replies = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)  # stray prints of preloaded modules must not corrupt the protocol
    os.close(null)
    sys.dont_write_bytecode = True
    failed = {}
    for name in preload:
        try:
            importlib.import_module(name)
        except Exception as exc:
            failed[name] = f"{type(exc).__name__}: {exc}"
    _warm_up()
    gc.collect()
    gc.freeze()  # children never rescan the preloaded objects, and their pages stay shared
    _write_frame(replies, {"ready": True, "failed": failed})
    while True:
        request = _read_frame(requests)
        if request is None:
            return
        try:
            reply = _fork_supervisor(request)
        except Exception as exc:  # e.g. fork failing under memory pressure
            reply = _failure("sandbox error", f"server: {type(exc).__name__}: {exc}")
        _write_frame(replies, reply)


def _warm_up() -> None:
    """Draw one figure so that lazily imported backend modules and fonts live in the server."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    with contextlib.suppress(Exception):
        fig = pyplot.figure(figsize=(1, 1))
        fig.gca().plot([0, 1], [0, 1], label="x")
        fig.gca().set_title("warm-up")
        fig.savefig(io.BytesIO(), format="png")
        pyplot.close(fig)


def _fork_supervisor(request: dict[str, Any]) -> dict[str, Any]:
    """Run one job in a forked supervisor (namespaces are per process, so never in the server)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            result = _supervise(request)
        except BaseException as exc:
            result = _failure("sandbox error", f"supervisor: {type(exc).__name__}: {exc}")
        try:
            _write_frame(write_end, result)
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        result = _read_frame(read_end)
    except (OSError, ValueError):
        result = None
    finally:
        os.close(read_end)
    _, status = os.waitpid(pid, 0)
    if not isinstance(result, dict):
        return _failure("sandbox error", f"supervisor {_describe_status(status)}")
    return result


@dataclass
class _Plan:
    """What the supervisor decided; read by the init and the code's process after fork."""

    job: dict[str, Any]
    workdir: str
    run_uid: int | None  # setuid target when the supervisor is root, else None
    run_gid: int | None
    view: _View  # what the code may read (see _build_root)
    behind: list[str]  # needed paths run_uid reaches only in a private root (_unreachable)
    user_namespace: bool
    namespaces: list[str]
    nproc: int
    fds: dict[str, int]
    tmpfs: bool  # the workdir is a size-limited tmpfs
    root: dict[str, Any] | None = None  # what _build_root did (or its error), once it ran


class _Capture:
    """Keeps the first and last ``limit // 2`` bytes of a stream and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.half = max(1, limit // 2)
        self.limit = limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.half:
                del self.tail[: len(self.tail) - self.half]

    def text(self) -> str:
        if self.total <= self.limit:
            data = bytes(self.head + self.tail)
            return data.decode("utf-8", "replace")
        tail = bytes(self.tail[-self.half :])
        dropped = self.total - len(self.head) - len(tail)
        marker = f"\n[... mmrft sandbox: {dropped} bytes truncated ...]\n"
        return self.head.decode("utf-8", "replace") + marker + tail.decode("utf-8", "replace")


def _supervise(job: dict[str, Any]) -> dict[str, Any]:
    """The supervisor J: set up, fork the sandbox, enforce the deadline, collect the result.

    Every reason is decided here from what this process saw itself (see "Reasons").
    """
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    problem = _syntax_error(job["code"])
    if problem is not None:  # never run: the code would not compile
        return _failure("syntax error", problem)
    disabled = set(job["disable"])
    workdir = job["workdir"]
    fallbacks: list[str] = []
    is_root = os.geteuid() == 0
    host_uid, host_gid = os.getuid(), os.getgid()
    run_uid = run_gid = None
    if is_root and "uid" not in disabled:
        run_uid, run_gid = _nobody()
    elif is_root:
        fallbacks.append("uid drop disabled: the code runs as root without capabilities")
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    nproc_base = _tasks_of(run_uid if run_uid is not None else host_uid)

    user_namespace = False
    if not is_root and "userns" in disabled:
        fallbacks.append("user namespace disabled: no pid/net/mount namespaces")
    elif not is_root:
        try:
            _enter_user_namespace(host_uid, host_gid)
            user_namespace = True
            nproc_base = 2  # the supervisor and the init (counted per user namespace)
        except OSError as exc:
            fallbacks.append(f"no user namespace ({exc.strerror}): no pid/net/mount namespaces")
    quota_mb = WORKDIR_QUOTA_FACTOR * job["max_file_mb"]
    tmpfs = False
    if (is_root or user_namespace) and "mountns" not in disabled:
        try:
            _tmpfs_workdir(workdir, quota_mb, run_uid, run_gid)
            tmpfs = True
        except OSError as exc:
            fallbacks.append(f"no tmpfs workdir ({exc.strerror}): no quota on the workdir")

    view = _filesystem_view(run_uid, run_gid)
    dirfd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        behind: list[str] = []
        if run_uid is not None:
            assert run_gid is not None
            os.fchown(dirfd, run_uid, run_gid)
            unreadable, behind = _unreachable(run_uid, run_gid, [*view.essential, workdir])
            if unreadable or (behind and "mountns" in disabled):
                fallbacks.append(
                    f"uid {run_uid} cannot reach {', '.join(unreadable or behind)}: the code "
                    "runs as root without capabilities (RLIMIT_NPROC does not bind root)"
                )
                run_uid = run_gid = None
                behind = []
                os.fchown(dirfd, 0, 0)
        for name, data in job["inputs"].items():
            fd = os.open(
                name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dirfd
            )
            try:
                _write_all(fd, base64.b64decode(data))
            finally:
                os.close(fd)
        namespaces: list[str] = []
        if is_root or user_namespace:
            for flag, name, key in (
                (_CLONE_NEWPID, "pid", "pidns"),
                (_CLONE_NEWNET, "net", "netns"),
                (_CLONE_NEWIPC, "ipc", None),
                (_CLONE_NEWUTS, "uts", None),
            ):
                if key in disabled:
                    continue
                try:
                    _unshare(flag)
                    namespaces.append(name)
                except OSError as exc:
                    fallbacks.append(f"no {name} namespace ({exc.strerror})")

        fds = {}
        fds["out_r"], fds["out_w"] = os.pipe()
        fds["err_r"], fds["err_w"] = os.pipe()
        fds["status_r"], fds["status_w"] = os.pipe()
        fds["report_r"], fds["report_w"] = os.pipe()
        nproc = nproc_base + job["max_procs"]
        plan = _Plan(
            job, workdir, run_uid, run_gid, view, behind, user_namespace, namespaces, nproc, fds,
            tmpfs,
        )  # fmt: skip
        pidns = "pid" in namespaces
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            if pidns:
                _init(plan)
            _child(plan)
        for name in ("out_w", "err_w", "status_w", "report_w"):
            os.close(fds[name])
        killed_for, status, cpu, out, err = _watch(plan, pid, pidns, start)
        seconds = time.monotonic() - start
        report_line, _, claim = _read_available(fds["status_r"], 1 << 16).partition(b"\n")
        for name in ("out_r", "err_r", "status_r", "report_r"):
            os.close(fds[name])
        limit_hit = _file_limit_hit(dirfd, job["max_file_mb"] * _MIB, tmpfs)
        files, file_problem = _collect_outputs(dirfd, job["outputs"])
    finally:
        os.close(dirfd)

    try:
        report = json.loads(report_line)
        if not isinstance(report, dict):
            raise ValueError
    except ValueError:
        report = {"setup_error": "the sandboxed process died before it was set up"}
    isolation = _isolation(plan, report, fallbacks, pidns)

    exit_code = sig = None
    if status is not None:
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
        else:
            exit_code = os.WEXITSTATUS(status)
    cpu_limit = _cpu_limit(job)
    if killed_for:
        reason = killed_for
    elif "setup_error" in report:
        reason = "sandbox error"
        err.feed(f"\n[mmrft sandbox setup failed: {report['setup_error']}]\n".encode())
    elif status is None:
        reason = "sandbox error"
    elif sig is not None:
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= cpu_limit - 0.05):
            reason = "cpu limit"
        elif sig == signal.SIGXFSZ:
            reason = "file too large"
        else:
            reason = f"killed by signal {sig}"
    elif exit_code:
        reason = _exit_reason(exit_code, claim, limit_hit)
    else:
        reason = file_problem
    return {
        "ok": reason is None,
        "reason": reason,
        "exit_code": exit_code,
        "signal": sig,
        "stdout": out.text(),
        "stderr": err.text(),
        "files": {k: base64.b64encode(v).decode() for k, v in files.items()},
        "seconds": seconds,
        "isolation": isolation,
    }


def _syntax_error(code: str) -> str | None:
    """``None`` when ``code`` compiles, else the one-line error (this process's own check)."""
    try:
        compile(code, "<sandbox>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as exc:
        return "".join(traceback.format_exception_only(type(exc), exc))[-2000:]
    return None


def _exit_reason(exit_code: int, claim: bytes, limit_hit: bool) -> str:
    """The reason for a non-zero exit status.

    ``"file too large"`` when this process finds a file of ``max_file_mb`` or a full workdir;
    else the code's claim, only when it is exactly the one line the runner writes for an
    uncaught exception (status 1) naming a builtin exception class; else ``"exit code N"``.
    Whatever else the code wrote to the status pipe is ignored.
    """
    if limit_hit:
        return "file too large"
    match = _CLAIM_RE.fullmatch(claim)
    if exit_code == 1 and match and match.group(1).decode() in _BUILTIN_EXCEPTIONS:
        name = match.group(1).decode()
        return "memory limit" if name == "MemoryError" else f"exception: {name}"
    return f"exit code {exit_code}"


def _file_limit_hit(dirfd: int, cap: int, tmpfs: bool, budget: int = 10000) -> bool:
    """Whether the code's files reached a limit: a file of ``cap`` bytes (``RLIMIT_FSIZE``) or,
    for a tmpfs workdir, no space or inode left. Looks at no more than ``budget`` entries and
    follows no symbolic link."""
    with contextlib.suppress(OSError):
        if tmpfs:
            fs = os.fstatvfs(dirfd)
            if fs.f_bavail * fs.f_frsize < 64 * 1024 or (fs.f_files and fs.f_favail == 0):
                return True
        seen = 0
        for _, dirs, files, fd in os.fwalk(".", dir_fd=dirfd, follow_symlinks=False):
            seen += len(dirs) + len(files)
            for name in files:
                with contextlib.suppress(OSError):
                    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if stat.S_ISREG(info.st_mode) and info.st_size >= cap:
                        return True
            if seen > budget:
                break
    return False


def _cpu_limit(job: Mapping[str, Any]) -> int:
    return max(1, math.ceil(job["cpu_s"] if job["cpu_s"] is not None else job["timeout_s"] + 1))


def _tmpfs_workdir(workdir: str, size_mb: int, uid: int | None, gid: int | None) -> None:
    """Give this process a private mount namespace in which ``workdir`` is a fresh tmpfs of
    ``size_mb`` (the workdir quota). Everything in it vanishes with the job's last process."""
    _unshare(_CLONE_NEWNS)
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing below propagates to the host
    owner = f",uid={uid},gid={gid}" if uid is not None else ""
    options = f"size={size_mb}m,nr_inodes={_WORKDIR_INODES},mode=0700{owner}"
    _mount("tmpfs", workdir, "tmpfs", _MS_NOSUID | _MS_NODEV, options)


def _enter_user_namespace(uid: int, gid: int) -> None:
    """Become root of a new user namespace mapped onto the caller's own uid and gid."""
    _unshare(_CLONE_NEWUSER)
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def _watch(
    plan: _Plan, pid: int, pidns: bool, start: float
) -> tuple[str | None, int | None, float, _Capture, _Capture]:
    """Pump stdout/stderr until the sandbox ends or must be killed; kill and reap everything.

    Returns (kill reason, wait status of the code's process, its CPU seconds, captures).
    """
    job, fds = plan.job, plan.fds
    limit = job["max_output_bytes"]
    out, err = _Capture(limit), _Capture(limit)
    streams = {fds["out_r"]: out, fds["err_r"]: err}
    deadline = start + job["timeout_s"]
    kill_above = OUTPUT_KILL_FACTOR * limit
    try:
        pidfd: int | None = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    killed_for = None
    try:
        while True:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                killed_for = "timeout"
                break
            waitables = list(streams) + ([pidfd] if pidfd is not None else [])
            ready = select.select(
                waitables, [], [], remaining if pidfd is not None else min(remaining, 0.02)
            )[0]
            for fd in ready:
                if fd in streams:
                    data = os.read(fd, 1 << 16)
                    if data:
                        streams[fd].feed(data)
                    else:
                        del streams[fd]
            if out.total + err.total > kill_above:
                killed_for = "output too large"
                break
    finally:
        if pidfd is not None:
            os.close(pidfd)

    # Kill: the init of a PID namespace takes every process of the namespace with it; otherwise
    # the code's session, then every orphan that the subreaper (this process) inherits.
    if killed_for or not pidns:
        with contextlib.suppress(OSError):
            if pidns:
                os.kill(pid, signal.SIGKILL)
            else:
                os.killpg(pid, signal.SIGKILL)
    status: int | None
    _, status, usage = os.wait4(pid, 0)
    cpu = usage.ru_utime + usage.ru_stime
    if not pidns:
        _sweep()
    elif killed_for:
        status = None
    else:  # the init reports the code's own wait status
        status, cpu = None, 0.0
        report = _read_available(fds["report_r"], 256).split()
        if len(report) == 2:
            status, cpu = int(report[0]), float(report[1])
    if killed_for and not pidns:
        status = None
    # Every writer is dead now: drain what is left in the pipes.
    for fd, capture in list(streams.items()):
        while capture.total <= kill_above and (data := _read_nonblocking(fd)):
            capture.feed(data)
    return killed_for, status, cpu, out, err


def _sweep(budget_s: float = 5.0) -> None:
    """Kill and reap every remaining child of this (subreaper) process."""
    me, end = os.getpid(), time.monotonic() + budget_s
    while time.monotonic() < end:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                break
        for kid in _children_of(me):
            with contextlib.suppress(OSError):
                os.kill(kid, signal.SIGKILL)
        time.sleep(0.002)


def _read_nonblocking(fd: int) -> bytes:
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return b""


def _read_available(fd: int, limit: int) -> bytes:
    data = bytearray()
    while len(data) < limit and (chunk := _read_nonblocking(fd)):
        data += chunk
    return bytes(data[:limit])


def _collect_outputs(dirfd: int, caps: Mapping[str, int]) -> tuple[dict[str, bytes], str | None]:
    """Read requested outputs through the workdir fd: regular, single-link, each at most its
    cap (checked with fstat before reading, and again while reading)."""
    files: dict[str, bytes] = {}
    problem = None
    for name, cap in caps.items():
        try:
            fd = os.open(
                name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dirfd
            )
        except OSError:
            problem = problem or "no output file"
            continue
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
                problem = problem or "no output file"
                continue
            if info.st_size > cap:
                problem = problem or "file too large"
                continue
            chunks, size = [], 0
            while size <= cap and (chunk := os.read(fd, min(1 << 20, cap + 1 - size))):
                chunks.append(chunk)
                size += len(chunk)
            if size > cap:
                problem = problem or "file too large"
                continue
            files[name] = b"".join(chunks)
        finally:
            os.close(fd)
    return files, problem


def _isolation(
    plan: _Plan, report: dict[str, Any], fallbacks: list[str], pidns: bool
) -> dict[str, Any]:
    """The ``isolation`` record: what was active for this run, and every fallback taken."""
    job = plan.job
    fallbacks = fallbacks + list(report.get("fallbacks", ()))
    namespaces = list(plan.namespaces) + (["mnt"] if report.get("read_only_mounts") else [])
    landlock = int(report.get("landlock_abi", 0))
    if "net" in plan.namespaces:
        network = "network namespace (no interfaces)"
    elif landlock >= 4:
        network = "landlock tcp + python-level socket block (udp only python-level)"
    else:
        network = "python-level socket block only (bypassable with ctypes)"
    writes = [
        name
        for name, active in (
            ("landlock", landlock > 0),
            ("read-only mounts", report.get("read_only_mounts", False)),
            ("unprivileged uid", report.get("unprivileged_uid", False)),
        )
        if active
    ]
    root, landlock_reads = report.get("private_root"), report.get("landlock_reads", False)
    if root:
        reads = f"private root ({root}): only the paths in 'visible' and the workdir"
    elif landlock_reads:
        reads = "landlock: only beneath the paths in 'visible' and the workdir"
    else:
        reads = "unrestricted: every file the code's uid may read"
    if report.get("private_proc"):
        proc = "private /proc of a pid namespace"
    elif root:
        proc = "no /proc (private root without a pid namespace)"
    elif report.get("unprivileged_uid") and not landlock_reads:
        proc = "host /proc, other processes' environ unreadable (different uid)"
    elif report.get("proc_denied"):
        proc = "/proc unreadable (landlock)"
    elif report.get("unprivileged_uid"):
        proc = "host /proc, other processes' environ unreadable (different uid)"
    else:
        proc = "host /proc readable, same uid: the caller's environ is readable"
    return {
        "uid": report.get("uid"),
        "reads": reads,
        "visible": plan.view.visible if root or landlock_reads else ["/"],
        "user_namespace": plan.user_namespace,
        "namespaces": namespaces,
        "network": network,
        "writes": writes,
        "proc": proc,
        "landlock_abi": landlock,
        "no_new_privs": bool(report.get("no_new_privs")),
        "no_capabilities": bool(report.get("no_capabilities")),
        "cleanup": "pid namespace" if pidns else "process group + subreaper sweep",
        "workdir": (
            f"tmpfs of {WORKDIR_QUOTA_FACTOR * job['max_file_mb']} MB, {_WORKDIR_INODES} inodes"
            if plan.tmpfs
            else "host directory, no quota"
        ),
        "limits": {
            "wall_s": job["timeout_s"],
            "cpu_s": _cpu_limit(job),
            "address_space_mb": job["memory_mb"],
            "file_mb": job["max_file_mb"],
            "nproc": plan.nproc,
            "nofile": _NOFILE,
            "core": 0,
        },
        "fallbacks": fallbacks,
    }


def _init(plan: _Plan) -> NoReturn:
    """pid 1 of the job's PID namespace: fork the code's process, reap everything, and report
    the code's wait status; the kernel kills the rest of the namespace when this exits."""
    try:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        _make_root(plan)  # here, so that no process of the namespace sees the host's files
        child = os.fork()
        if child == 0:
            _child(plan)
        for name in ("out_r", "err_r", "status_r", "report_r", "out_w", "err_w", "status_w"):
            os.close(plan.fds[name])
        while True:
            pid, status, usage = os.wait4(-1, 0)
            if pid == child:
                cpu = usage.ru_utime + usage.ru_stime
                os.write(plan.fds["report_w"], f"{status} {cpu:.6f}\n".encode())
                os._exit(0)
    except BaseException:
        os._exit(70)


def _make_root(plan: _Plan) -> None:
    """Build and enter the private root (:func:`_build_root`) when a mount namespace is
    allowed; ``plan.root`` records what happened for the code's process."""
    if plan.root is not None or "mountns" in plan.job["disable"] or os.geteuid() != 0:
        return
    try:
        plan.root = _build_root(
            plan.workdir,
            os.path.join(os.path.dirname(plan.workdir), "root"),
            "pid" in plan.namespaces,
            plan.view,
        )
    except OSError as exc:
        plan.root = {"error": exc.strerror or str(exc)}


def _child(plan: _Plan) -> NoReturn:
    """The code's process: isolate, limit, report, then run the code. Never returns."""
    job, fds = plan.job, plan.fds
    disabled = set(job["disable"])
    report: dict[str, Any] = {"fallbacks": []}
    fallbacks: list[str] = report["fallbacks"]
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        high = [
            fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
            for fd in (null, fds["out_w"], fds["err_w"], fds["status_w"])
        ]
        for target, fd in enumerate(high):
            os.dup2(fd, target)
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        os.closerange(4, soft if 0 < soft < 1 << 20 else 1 << 20)
        _reset_stdio()
    except BaseException:
        os._exit(126)
    try:
        has_caps = os.geteuid() == 0  # root, or root of our user namespace
        pidns = "pid" in plan.namespaces
        run_uid = plan.run_uid
        if has_caps and "mountns" not in disabled:
            _make_root(plan)  # done by the init when there is one
            root = plan.root or {"error": "not built"}
            if "error" not in root:
                report["private_root"] = root["how"]
                report["private_proc"] = root["proc"]
                report["read_only_mounts"] = "/" not in root["writable"]
                if root["writable"]:
                    fallbacks.append(f"mounts left writable: {', '.join(root['writable'][:5])}")
            else:
                fallbacks.append(
                    f"no private root ({root['error']}): the host's files are readable "
                    "unless Landlock hides them"
                )
                try:
                    writable = _private_mounts(plan.workdir, pidns)
                    report["private_proc"] = pidns
                    report["read_only_mounts"] = "/" not in writable
                    if writable:
                        fallbacks.append(f"mounts left writable: {', '.join(writable[:5])}")
                except OSError as exc:
                    fallbacks.append(f"no private mount namespace ({exc.strerror})")
                if plan.behind:
                    fallbacks.append(
                        f"uid {run_uid} cannot reach {', '.join(plan.behind)}: "
                        "running as root without capabilities"
                    )
                    run_uid = None
                    os.chown(plan.workdir, 0, 0)
        os.chdir(plan.workdir)
        os.environ.clear()
        os.environ.update(job["env"])
        tempfile.tempdir = None
        if run_uid is not None:
            os.setgroups([])
            os.setresgid(plan.run_gid, plan.run_gid, plan.run_gid)
            os.setresuid(run_uid, run_uid, run_uid)
        elif has_caps:
            _drop_capabilities()
        report["no_capabilities"] = _no_capabilities()
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)
        report["no_new_privs"] = True
        # Reads: the private root holds nothing else; without one, Landlock hides the rest.
        readable = None if report.get("private_root") else plan.view.readable
        if "landlock" not in disabled:
            try:
                report["landlock_abi"] = _landlock(plan.workdir, readable)
                report["landlock_reads"] = readable is not None
                report["proc_denied"] = readable is not None
            except OSError as exc:
                fallbacks.append(
                    f"no landlock ({exc.strerror}): writes outside the workdir rely on other layers"
                )
        if not report.get("private_root") and not report.get("landlock_reads"):
            fallbacks.append(
                "no private root and no landlock: every file the uid reads is readable"
            )
        if "net" not in plan.namespaces:
            _block_sockets()
            fallbacks.append("no network namespace: sockets blocked at the Python level only")
        cpu = _cpu_limit(job)
        limits = (
            (resource.RLIMIT_CORE, 0),
            (resource.RLIMIT_CPU, cpu, cpu + 1),
            (resource.RLIMIT_FSIZE, job["max_file_mb"] * _MIB),
            (resource.RLIMIT_NOFILE, _NOFILE),
            (resource.RLIMIT_NPROC, plan.nproc),
        )
        for res, soft, *hard in limits:
            _, current_hard = resource.getrlimit(res)
            want = hard[0] if hard else soft
            if current_hard != resource.RLIM_INFINITY:
                want, soft = min(want, current_hard), min(soft, current_hard)
            resource.setrlimit(res, (soft, want))
        if not pidns:
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # after setuid, which clears it
        report["uid"] = os.getuid()
        report["unprivileged_uid"] = run_uid is not None
        line = json.dumps(report).encode() + b"\n"
        # Last, so that a memory_mb below the preloaded footprint fails the code ("memory
        # limit"), not the sandbox's own set-up.
        resource.setrlimit(resource.RLIMIT_AS, (job["memory_mb"] * _MIB,) * 2)
        os.write(3, line)
    except BaseException as exc:
        with contextlib.suppress(BaseException):
            os.write(
                3, json.dumps({"setup_error": f"{type(exc).__name__}: {exc}"}).encode() + b"\n"
            )
        os._exit(125)
    _exec_code(job["code"])


def _reset_stdio() -> None:
    """Fresh sys.std* on fds 0-2; the server's objects are kept alive so they never close them."""
    _KEEP.extend([sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__, sys.__stderr__])
    stdin, stdout, stderr = (
        open(fd, mode, buffering=1, errors="backslashreplace", closefd=False)  # noqa: SIM115
        for fd, mode in ((0, "r"), (1, "w"), (2, "w"))
    )
    sys.stdin = sys.__stdin__ = stdin
    sys.stdout = sys.__stdout__ = stdout
    sys.stderr = sys.__stderr__ = stderr


def _block_sockets() -> None:
    """Python-level network block (weak: ctypes or a subprocess bypass it)."""
    import _socket
    import socket

    class _NoSocket(socket.socket):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise PermissionError(errno.EACCES, "network access is disabled in the mmrft sandbox")

    socket.socket = socket.SocketType = _NoSocket  # type: ignore[misc]
    _socket.socket = _socket.SocketType = _NoSocket  # type: ignore[misc]
    socket.socketpair = socket.fromfd = _NoSocket  # type: ignore[assignment]


def _exec_code(code: str) -> NoReturn:
    """Compile and run ``code`` as ``__main__``; exit like a script would. An uncaught exception
    exits with status 1 after writing its claim ``exception: <builtin class>`` to fd 3, which
    the supervisor accepts only in that exact form (see :func:`_exit_reason`)."""
    import builtins
    import linecache

    status = ""
    exit_code = 0
    me = os.getpid()  # processes the code forks end here too: only this one makes the claim
    linecache.cache["<sandbox>"] = (len(code), None, code.splitlines(True), "<sandbox>")
    try:
        compiled = compile(code, "<sandbox>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, OverflowError) as exc:  # the supervisor compiled it already
        with contextlib.suppress(BaseException):
            traceback.print_exc(limit=0)
        status, exit_code = _classify(exc), 1
    except BaseException as exc:
        status, exit_code = _classify(exc), 1
    else:
        namespace: dict[str, Any] = {
            "__name__": "__main__",
            "__builtins__": builtins,
            "__file__": "<sandbox>",
        }
        sys.argv = ["<sandbox>"]
        try:
            exec(compiled, namespace)
        except SystemExit as exc:
            exit_code = _script_exit_code(exc.code)
        except BaseException as exc:
            status, exit_code = _classify(exc), 1
            with contextlib.suppress(BaseException):
                traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        with contextlib.suppress(BaseException):
            namespace.clear()
            gc.collect()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    if status and os.getpid() == me:
        with contextlib.suppress(BaseException):
            os.write(3, status.encode() + b"\n")
    os._exit(exit_code)


def _classify(exc: BaseException) -> str:
    """``exception: <name>`` of the nearest builtin class of ``exc`` (``JSONDecodeError`` →
    ``ValueError``): a closed set of names, whatever classes the code defines."""
    for cls in type(exc).__mro__:
        if cls.__module__ == "builtins" and cls.__name__ in _BUILTIN_EXCEPTIONS:
            return f"exception: {cls.__name__}"
    return "exception: BaseException"


def _script_exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(BaseException):
        print(code, file=sys.stderr)
    return 1


if __name__ == "__main__" and sys.argv[1:2] == ["--serve"]:
    _serve(int(sys.argv[2]), sys.argv[3:])
