"""Verifier (and tool) worker processes: ``reward.timeout_s`` enforced by the operating system.

A Python thread cannot be stopped while it holds the GIL in one long C call (a big-integer
power inside sympy, a regular expression backtracking), so a deadline kept by a thread never
fires. The pool runs verifiers in worker processes instead and SIGKILLs the worker whose call
runs past its deadline. How one batch is scored (:meth:`VerifierPool.call`):

1. One call per verifier per batch (split into ``workers`` contiguous parts run side by side),
   each under the deadline ``timeout_s``.
2. A part over its deadline: its worker is killed and replaced (recycled), and its completions
   are re-scored one at a time, each under the deadline, so that one bad completion does not
   zero the batch: only the completions that time out alone are reported (``TIMEOUT``).
   Isolation charges the time its calls run (not the workers' restarts) to a budget of
   ``ISOLATION_FACTOR × timeout_s`` and starts no call once it is spent, so a batch takes at
   most about ``(ISOLATION_FACTOR + 2) × timeout_s`` plus one worker start per timeout;
   completions it did not reach are reported as timed out too (and counted as unreached).
3. Memory: a worker's address space is capped (``RLIMIT_AS``, Linux) at what it holds after
   loading the verifiers plus ``reward.worker_memory_mb``, so a completion that makes a
   verifier allocate without bound (a sympy expression that explodes, a regex's state) raises
   ``MemoryError`` in the worker, not the kernel's OOM killer in the largest process, the
   trainer. A part whose call raised ``MemoryError`` is treated like one over its deadline:
   the worker is replaced and the part's completions are re-scored one at a time; the ones
   that go over alone are reported (``over_memory``).
4. A verifier that raises comes back as :class:`WorkerRaised` (its type and first line); a
   worker that dies (segfault, ``os._exit``, the kernel's OOM killer) as :class:`WorkerDied`.
   :mod:`mmrft.rewards` turns both into its one-line ``VerifierError`` and keeps the contract
   checks (count, range, NaN) in the parent. A worker found dead between calls is replaced
   with a warning.

Workers re-create the verifier registry from what the parent recorded (:func:`source`): the
built-ins, the plugin files (:func:`mmrft.plugins.load_plugin`, same module names), the
modules that define verifiers, and plain reward functions ``FILE.py:fn``
(:func:`mmrft.rewards.functions.register_function`); at start-up each worker reports the
function it found under each name and a mismatch is a :class:`ConfigError`. A verifier
defined in ``__main__`` or inside a function cannot be re-created; :mod:`mmrft.rewards` keeps
those (and those declared ``@verifier(..., isolate=False)``) in the parent.

Workers start when the pool is built (the reward's start-up), run their verifiers in their
main thread (math_verify's ``signal.alarm`` then works), die with the parent
(``PR_SET_PDEATHSIG`` on Linux, and end of file on their socket) and are shut down by
:meth:`VerifierPool.close`, when the pool is garbage-collected, or at exit. Payloads are
pickled: samples as they are (paths, targets, meta; media are loaded lazily by path, so a
sample carries no decoded media), tool trajectories without their observations' media
tensors (``media``, ``engine_media``), which verifiers do not read. The demo's batch (128
completions of 16 samples) pickles to 3.3 KB in 0.06 ms, and a call costs about 1 ms more than
in the parent; a dataset that keeps decoded images in ``meta`` pays for them (16 distinct
1024² RGB images: 50 MB, about 0.2 s per call).

The machinery is generic (:class:`WorkerPool`: processes that re-create one registry's
functions, a deadline per call kept by SIGKILL, the memory cap, replacement after a timeout,
``MemoryError`` or death, shutdown with the parent); :class:`VerifierPool` adds the batch
splitting and isolation above, and the rollout's tools use :meth:`WorkerPool.call_one` with
their own request handler (:class:`mmrft.rollout.tool.ToolPool`).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import importlib
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from mmrft.typecheck import ConfigError

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0
"""Seconds a worker may take to start (import the built-ins and the plugins)."""
ISOLATION_FACTOR = 2.0
"""Isolation's budget of call time, in multiples of ``timeout_s`` (module docstring)."""
CLOSE_GRACE_S = 2.0
"""Seconds a worker has to exit after the pool closes before it is killed."""
WORKER_MEMORY_MB = 4096
"""Default memory cap of a worker (MiB beyond what it holds after loading its functions), as
``reward.worker_memory_mb`` and ``rollout.tools.worker_memory_mb`` default to."""
_REGISTRIES = {"verifiers": "VERIFIERS", "tools": "TOOLS", "environments": "ENVIRONMENTS"}
"""The registries a pool's functions come from (:mod:`mmrft.plugins`' names)."""


class _Timeout:
    def __repr__(self) -> str:
        return "TIMEOUT"


TIMEOUT = _Timeout()
"""The result of a completion whose verifier call ran past the deadline on its own."""


class PoolError(RuntimeError):
    """A verifier call that failed in its worker; :mod:`mmrft.rewards` words the message."""


class _OverMemory(Exception):
    """A worker's reply: its verifier call raised ``MemoryError`` (the cap, see the module
    docstring)."""


class WorkerRaised(PoolError):
    """The verifier raised in the worker: ``kind`` is the exception's type name, ``message``
    its first line, ``error`` the exception itself (unpickled; its ``__cause__`` holds the
    worker's traceback) or ``None`` when it does not pickle."""

    def __init__(self, kind: str, message: str, error: BaseException | None = None) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind, self.message, self.error = kind, message, error


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker process, as its text."""


class WorkerDied(PoolError):
    """The worker process ended during the call; the message says how (``signal 11,
    SIGSEGV``, ``exit status 3``)."""


class NotSendable(PoolError):
    """The batch (samples, trajectories, parameters) does not pickle; the message says why."""


class WrongCount(PoolError):
    """The verifier returned ``count`` results for ``expected`` completions."""

    def __init__(self, count: int, expected: int) -> None:
        super().__init__(f"{count} results for {expected} completions")
        self.count, self.expected = count, expected


@dataclasses.dataclass
class Call:
    """What :meth:`VerifierPool.call` returns.

    Attributes:
        results: one raw verifier result per completion, :data:`TIMEOUT` where it timed out.
        timed_out: the indices of the completions that ran past the deadline alone.
        unreached: the indices isolation did not re-score (its budget was spent); also
            :data:`TIMEOUT` in ``results``.
        over_memory: the indices whose call alone went over the worker's memory cap; also
            :data:`TIMEOUT` in ``results``.
    """

    results: list[Any]
    timed_out: list[int]
    unreached: list[int]
    over_memory: list[int] = dataclasses.field(default_factory=list)


def source(fn: Any) -> tuple[str, str] | None:
    """How a worker re-creates the verifier function ``fn``: ``("function", "FILE.py:fn")``,
    ``("file", plugin path)``, ``("module", dotted name)``, or ``None`` when it cannot (defined
    in ``__main__``, inside a function, a lambda)."""
    from mmrft.plugins import FILE_PLUGIN_PREFIX
    from mmrft.rewards.functions import RewardFunction

    if isinstance(fn, RewardFunction):
        return ("function", fn.spec)
    module_name = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", type(fn).__qualname__)
    if not module_name or module_name in ("__main__", "__mp_main__") or "<" in qualname:
        return None
    module = sys.modules.get(module_name)
    if module_name.startswith(FILE_PLUGIN_PREFIX):
        path = getattr(module, "__file__", None)
        return ("file", path) if path else None
    return ("module", module_name)


def origin(fn: Any) -> str:
    """The identity compared between the parent and a worker: ``module:qualname`` (or the
    plain function's ``FILE.py:fn``)."""
    from mmrft.rewards.functions import RewardFunction

    if isinstance(fn, RewardFunction):
        return f"function {fn.spec}"
    qualname = getattr(fn, "__qualname__", type(fn).__qualname__)
    return f"{getattr(fn, '__module__', '?')}:{qualname}"


def compact_trajectory(trajectory: Any) -> Any:
    """A tool trajectory without its observations' media tensors (``media``,
    ``engine_media``), the part of its pickle that verifiers do not read."""
    if dataclasses.is_dataclass(trajectory) and hasattr(trajectory, "engine_media"):
        return dataclasses.replace(trajectory, media={}, engine_media=[])
    return trajectory


class _Worker:
    """Parent-side handle of one worker process and its socket; ``what`` names what it holds
    (``verifier``, ``tool``) in messages, ``hint`` says how to keep a function out of it."""

    def __init__(self, init: bytes, what: str = "verifier", hint: str = "") -> None:
        from mmrft.rewards.sandbox import _spawn  # Popen from a thread that lives as long as we do

        self.what = what
        self.hint = hint or (
            "set reward.isolation=inline, or declare the verifier with @verifier(..., isolate=False)"
        )

        ours, theirs = socket.socketpair()
        self.proc = _spawn(
            [sys.executable, "-c", "from mmrft.rewards.pool import main; main()"]
            + [str(os.getpid()), str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.conn = Connection(ours.detach())
        self.conn.send_bytes(init)
        self.ready = False

    def wait_ready(self, expected: dict[str, str]) -> None:
        """Wait for the worker's registry; ConfigError when it failed or differs."""
        if self.ready:
            return
        if not self.conn.poll(START_TIMEOUT_S):
            self.kill()
            raise ConfigError(
                f"a {self.what} worker process did not start in {START_TIMEOUT_S:g} s"
            )
        try:
            status, payload = self.conn.recv()
        except (EOFError, OSError):
            how = self.exit_status()
            raise ConfigError(f"a {self.what} worker process ended at start-up ({how})") from None
        if status != "ready":
            self.kill()
            raise ConfigError(
                f"a {self.what} worker process could not load the {self.what}s: {payload}"
            )
        for name, want in expected.items():
            if payload.get(name) != want:
                self.kill()
                raise ConfigError(
                    f"{self.what} '{name}': a worker process found "
                    f"{payload.get(name) or 'nothing'} under that name instead of {want}; "
                    f"{self.hint}"
                )
        self.ready = True

    def exit_status(self) -> str:
        """How the process ended: ``signal 11, SIGSEGV`` or ``exit status 3``."""
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "its socket closed"
        if code < 0:
            return f"signal {-code}, {signal.Signals(-code).name}"
        return f"exit status {code}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.conn.close()


def _shutdown(workers: list[_Worker], owner: int) -> None:
    """Ask every worker to exit, then kill the ones still running after ``CLOSE_GRACE_S``
    (only in the process that started them, not in a fork of it)."""
    if os.getpid() != owner:
        return
    for worker in workers:
        with contextlib.suppress(OSError):  # a worker that already ended
            worker.conn.send_bytes(b"")
    end = time.monotonic() + CLOSE_GRACE_S
    for worker in workers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.proc.wait(timeout=max(0.0, end - time.monotonic()))
        worker.kill()
    workers.clear()


class WorkerPool:
    """``workers`` processes holding the functions ``specs`` (name → spec with ``fn`` and
    ``name``) of the registry ``registry`` (``verifiers`` or ``tools``, :mod:`mmrft.plugins`),
    each call under a deadline kept by SIGKILL, each process's memory capped at what it holds
    after loading them plus ``memory_mb`` MiB (None = no cap).

    ``handler``: ``"module:function"`` that serves one request in a worker (imported there;
    ``None``: a verifier call, :meth:`VerifierPool.call`). ``start=False`` starts the processes at
    the first call instead of now. ``what`` and ``hint`` word the messages (``tool``; how to keep
    a function in the caller's process).
    """

    def __init__(
        self,
        specs: dict[str, Any],
        workers: int = 1,
        memory_mb: int | None = None,
        *,
        registry: str = "verifiers",
        handler: str | None = None,
        start: bool = True,
        what: str = "verifier",
        hint: str = "",
    ) -> None:
        if workers < 1:
            raise ConfigError(f"reward.workers: must be ≥ 1, got {workers}")
        if registry not in _REGISTRIES:
            raise ValueError(f"registry: one of {', '.join(_REGISTRIES)}, got {registry!r}")
        sources = []
        for spec in specs.values():
            where = source(spec.fn)
            if where is None:
                raise ValueError(f"{what} '{spec.name}' cannot be re-created in a worker")
            if where not in sources:
                sources.append(where)
        self.names = set(specs)
        self.what, self.hint, self.count = what, hint, workers
        self._expected = {name: origin(spec.fn) for name, spec in specs.items()}
        self._init = pickle.dumps(
            (list(sys.path), sources, sorted(specs), memory_mb, registry, handler)
        )
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _shutdown, self._workers, os.getpid())
        if start:
            self._start()

    def _start(self) -> None:
        """Start the processes and wait until each holds the functions (ConfigError else)."""
        for _ in range(self.count):
            self._workers.append(_Worker(self._init, self.what, self.hint))
        try:
            for worker in self._workers:
                worker.wait_ready(self._expected)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        self._finalizer()

    @property
    def pids(self) -> list[int]:
        """The workers' process ids (for tests and the log)."""
        return [w.proc.pid for w in self._workers]

    def call_one(self, request: Any, timeout_s: float) -> tuple[str, Any]:
        """Send ``request`` to the handler in a worker and wait at most ``timeout_s`` seconds
        (0 = no deadline) from when the worker has it (a start-up is not counted). Returns
        ``("ok", reply)``, ``("timeout", None)`` (the worker was killed and is replaced) or
        ``("memory", None)`` (the call raised ``MemoryError`` under the cap; the worker is
        replaced). Raises :class:`WorkerRaised`, :class:`WorkerDied` or :class:`NotSendable`;
        the workers start here if they have not. One call at a time (a lock)."""
        with self._lock:
            if not self._finalizer.alive:
                raise RuntimeError(f"the {self.what} pool is closed")
            if not self._workers:
                self._start()
            return self._run(lambda job: request, [[0]], timeout_s)[0]

    def _run(
        self,
        payload: Callable[[list[int]], tuple],
        jobs: list[list[int]],
        timeout_s: float,
        budget_s: float | None = None,
    ) -> list[tuple[str, Any]]:
        """Run ``jobs`` (lists of completion indices; ``payload(job)`` is the call a worker
        receives: verifier name, parameters and the job's completions, samples and
        trajectories) over the idle workers, each under
        ``timeout_s``; no job starts once the calls have run ``budget_s`` in all. Returns one
        ``("ok", results)``, ``("timeout", None)``, ``("memory", None)`` (the call raised
        ``MemoryError``; its worker is replaced) or ``("unreached", None)`` per job."""
        outcomes: list[tuple[str, Any] | None] = [None] * len(jobs)
        pending = deque(range(len(jobs)))
        running: dict[int, tuple[int, float, float | None]] = {}  # worker → job, start, deadline
        spent = 0.0  # seconds the finished calls ran
        try:
            while pending or running:
                over = budget_s is not None and spent >= budget_s
                for w, worker in enumerate(self._workers):
                    if w in running or not pending or over:
                        continue
                    worker.wait_ready(self._expected)
                    job = pending.popleft()
                    sent = payload(jobs[job])
                    try:
                        data = pickle.dumps(sent, pickle.HIGHEST_PROTOCOL)
                    except Exception as exc:
                        raise NotSendable(f"{type(exc).__name__}: {_first_line(exc)}") from exc
                    self._send(w, data)
                    now = time.monotonic()
                    running[w] = (job, now, now + timeout_s if timeout_s else None)
                if not running:  # the budget is spent: what is left is unreached
                    for job in pending:
                        outcomes[job] = ("unreached", None)
                    break
                deadlines = [d for _, _, d in running.values() if d is not None]
                wait_s = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
                ready = wait([self._workers[w].conn for w in running], wait_s)
                for w in list(running):
                    worker, (job, started, deadline) = self._workers[w], running[w]
                    now = time.monotonic()
                    if worker.conn in ready:
                        del running[w]
                        spent += now - started
                        try:
                            outcomes[job] = ("ok", self._receive(w))
                        except _OverMemory:
                            outcomes[job] = ("memory", None)
                            self._recycle(w)  # its heap may be left fragmented or half-built
                    elif deadline is not None and now >= deadline:
                        del running[w]
                        spent += now - started
                        outcomes[job] = ("timeout", None)
                        self._recycle(w)
        except BaseException:
            for w in running:  # a call still in flight would answer the next one
                self._recycle(w)
            raise
        assert all(o is not None for o in outcomes)
        return outcomes  # type: ignore[return-value]

    def _send(self, w: int, data: bytes) -> None:
        """Send a request to worker ``w``; one that ended while idle (a kill, the kernel's OOM
        killer) is replaced, with a warning, and the request goes to its replacement."""
        try:
            if self._workers[w].proc.poll() is not None:  # reaped: it ended before this call
                raise BrokenPipeError
            self._workers[w].conn.send_bytes(data)
        except OSError:
            how = self._workers[w].exit_status()
            log.warning("a %s worker process ended while idle (%s); replaced it", self.what, how)
            self._recycle(w)
            self._workers[w].wait_ready(self._expected)
            self._workers[w].conn.send_bytes(data)

    def _receive(self, w: int) -> list[Any]:
        worker = self._workers[w]
        try:
            status, *payload = worker.conn.recv()
        except (EOFError, OSError):
            how = worker.exit_status()
            self._recycle(w)
            raise WorkerDied(how) from None
        if status == "memory":
            raise _OverMemory
        if status == "raised":
            kind, message, pickled, trace = payload
            try:
                error = pickle.loads(pickled) if pickled else None
            except Exception:
                error = None
            if error is not None:
                error.__cause__ = RemoteTraceback(trace)
            raise WorkerRaised(kind, message, error)
        return payload[0]

    def _recycle(self, w: int) -> None:
        """Kill worker ``w`` and start its replacement (ready checked on its next job)."""
        self._workers[w].kill()
        self._workers[w] = _Worker(self._init, self.what, self.hint)


class VerifierPool(WorkerPool):
    """``workers`` processes holding the verifiers ``specs`` (name → :class:`VerifierSpec`)."""

    def __init__(
        self, specs: dict[str, Any], workers: int = 1, memory_mb: int | None = None
    ) -> None:
        super().__init__(specs, workers, memory_mb)

    def call(
        self,
        name: str,
        params: dict[str, Any],
        completions: Sequence[str],
        samples: Sequence[Any],
        trajectories: Sequence[Any] | None,
        timeout_s: float,
    ) -> Call:
        """Score one batch with verifier ``name`` (module docstring): one call per part, then
        one call per completion of a part that ran past ``timeout_s`` (0 = no deadline).

        ``trajectories``: a list (one per completion) for a verifier that takes them, else
        ``None``. Raises :class:`WorkerRaised`, :class:`WorkerDied`, :class:`WrongCount` or
        :class:`NotSendable`. One call at a time (a lock serialises callers' threads).
        """
        with self._lock:
            if not self._finalizer.alive or not self._workers:
                raise RuntimeError("the verifier pool is closed")
            n = len(completions)
            if n == 0:
                return Call([], [], [])
            if trajectories is not None:
                trajectories = [compact_trajectory(t) for t in trajectories]

            def payload(job: list[int]) -> tuple:
                return (
                    name,
                    params,
                    [completions[i] for i in job],
                    [samples[i] for i in job],
                    None if trajectories is None else [trajectories[i] for i in job],
                )

            bounds = _split(n, len(self._workers))
            jobs = [list(range(a, b)) for a, b in bounds]
            results: list[Any] = [TIMEOUT] * n
            outcomes = self._run(payload, jobs, timeout_s)
            late: list[int] = []
            counts = 0
            for job, (kind, value) in zip(jobs, outcomes):
                if kind in ("timeout", "memory"):
                    late.extend(job)
                    counts += len(job)
                    continue
                counts += len(value)
                if len(value) == len(job):
                    for i, result in zip(job, value):
                        results[i] = result
            if counts != n:
                raise WrongCount(counts, n)
            if not late:
                return Call(results, [], [])
            budget = ISOLATION_FACTOR * timeout_s
            singles = [[i] for i in late]
            outcomes = self._run(payload, singles, timeout_s, budget)
            alone: dict[str, list[int]] = {"timeout": [], "unreached": [], "memory": []}
            for (i,), (kind, value) in zip(singles, outcomes):
                if kind == "ok" and len(value) != 1:
                    raise WrongCount(len(value), 1)
                if kind == "ok":
                    results[i] = value[0]
                else:
                    alone[kind].append(i)
            return Call(results, alone["timeout"], alone["unreached"], alone["memory"])


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    """``[start, end)`` of at most ``parts`` contiguous, near-equal, non-empty slices of n."""
    parts = max(1, min(parts, n))
    size, extra = divmod(n, parts)
    bounds, start = [], 0
    for k in range(parts):
        end = start + size + (k < extra)
        if end > start:
            bounds.append((start, end))
        start = end
    return bounds


# -- the worker process ------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> None:
    """SIGKILL this process when its parent ends (Linux ``prctl``); elsewhere the closed
    socket ends the worker once its call returns."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent ended before the line above
        os._exit(0)


def _first_line(exc: BaseException, most: int = 200) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= most else text[: most - 1] + "…"


def _load(
    sources: list[tuple[str, str]], names: list[str], registry: str = "verifiers"
) -> dict[str, str]:
    from mmrft import plugins
    from mmrft.plugins import load_builtins, load_plugin
    from mmrft.rewards.functions import register_function

    found = getattr(plugins, _REGISTRIES[registry])
    load_builtins()
    for kind, value in sources:
        if kind == "file":
            load_plugin(value)
        elif kind == "module":
            importlib.import_module(value)
        else:
            register_function(value)
    return {name: origin(found.get(name).fn) for name in names if name in found}


def _verify(request: tuple) -> list[Any]:
    """A verifier call in a worker: its raw results for a batch (a :class:`VerifierPool`
    request: name, parameters, completions, samples, trajectories or None)."""
    from mmrft.plugins import VERIFIERS

    name, params, completions, samples, trajectories = request
    spec = VERIFIERS.get(name)
    if trajectories is not None:
        raw = spec.fn(completions, samples, trajectories, **params)
    else:
        raw = spec.fn(completions, samples, **params)
    len(raw)  # a result without a length raises here, as in the parent
    return list(raw)


def _serve(conn: Connection, handle: Callable[[Any], Any] = _verify) -> None:
    """Answer requests until the pool closes: ``("ok", handle(request))``, ``("memory",)``
    when the call raised ``MemoryError`` (the cap), or the exception (:func:`_raised`)."""
    while True:
        try:
            request = conn.recv_bytes()
        except (EOFError, OSError):
            return
        if not request:  # the pool closes
            return
        try:
            reply = ("ok", handle(pickle.loads(request)))
        except MemoryError:
            reply = ("memory",)
        except Exception as exc:
            reply = _raised(exc)
        try:
            conn.send(reply)
        except Exception as exc:  # a result that does not pickle
            conn.send(_raised(type(exc)(f"a result could not be sent back: {exc}")))


def _raised(exc: BaseException) -> tuple[str, str, str, bytes | None, str]:
    """The reply for a verifier's exception: type name, first line, pickle, traceback."""
    try:
        pickled: bytes | None = pickle.dumps(exc)
        pickle.loads(pickled)  # a class the parent can rebuild; else the text is enough
    except Exception:
        pickled = None
    trace = "".join(traceback.format_exception(exc))
    return ("raised", type(exc).__name__, _first_line(exc), pickled, trace)


def cap_memory(memory_mb: int | None) -> int | None:
    """Cap this process's address space (``RLIMIT_AS``) at what it maps now plus
    ``memory_mb`` MiB (never above the hard limit); the cap in bytes, or None where there is
    no ``/proc/self/statm`` to read (not Linux: no cap) or ``memory_mb`` is None."""
    if memory_mb is None:
        return None
    try:
        import resource

        with open("/proc/self/statm") as statm:
            mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (ImportError, OSError, ValueError):
        return None
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = mapped + memory_mb * 2**20
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    return cap


def main() -> None:
    """A worker: ``python -c '…main()' PARENT_PID SOCKET_FD`` (started by :class:`_Worker`)."""
    parent, fd = int(sys.argv[1]), int(sys.argv[2])
    _die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    os.dup2(2, 1)  # a verifier's print goes to stderr; the socket carries the replies
    conn = Connection(fd)
    path, sources, names, memory_mb, registry, handler = pickle.loads(conn.recv_bytes())
    sys.path[:] = path
    try:
        found = _load(sources, names, registry)
        handle = _verify
        if handler is not None:  # "module:function", e.g. the tools' (mmrft.rollout.tool)
            module, function = handler.split(":")
            handle = getattr(importlib.import_module(module), function)
    except BaseException as exc:
        conn.send(("failed", f"{type(exc).__name__}: {_first_line(exc)}"))
        return
    cap_memory(memory_mb)
    conn.send(("ready", found))
    _serve(conn, handle)
