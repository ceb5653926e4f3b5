"""The verifier API and the weighted reward built from verifiers.

A verifier is a plain function, batched::

    @verifier("my_check", low=0.0, high=1.0)
    def my_check(completions: list[str], samples: list[Sample], *, strict: bool = True):
        return [Score(1.0) if ok(c, s) else Score(0.0, reason="no answer tag") for ...]

A verifier that also wants to see multi-turn tool rollouts declares a third positional
parameter named ``trajectories``: it then receives, per completion, the
:class:`mmrft.rollout.tool_loop.Trajectory` (turns, calls, observations' facts) or ``None`` for a
single-turn completion. Verifiers without it are called exactly as before, on the last turn's
text.

A **group-aware** verifier (``@verifier("rank_bonus", group=True)``) is called once per GRPO
group instead of once per batch: ``completions`` and ``samples`` (and ``trajectories``, when it
takes them) are the ``G`` completions of one prompt, in group order, ``samples`` ``G`` copies of
that prompt's sample, so ``len(completions)`` is the group size. It returns one result per
completion of the group, under the contract below (count, type, range, NaN checks), and may
score a completion relative to the others (rank or normalise within the group, a diversity
bonus, a pairwise judge). Groups are given by the caller (``group_size``: the collector's G, an
auxiliary stage's n); a caller that gives none (evaluation) makes each run of consecutive
completions of the same sample one group. Group-aware verifiers run in the trainer's process
(never in a verifier worker, whose timeout retries would split a group), under a thread's
``reward.timeout_s`` budget for the whole batch; with NoisyRollout the group holds the
perturbed completions too. The empty-batch start-up call is made as for any verifier.

Contract: one result per completion, in order; a result is a :class:`Score`, a
plain float, or ``None`` for "not applicable to this sample" (it then adds nothing to the
reward and is not averaged into the verifier's metric). A verifier never raises on model
output: malformed output scores ``low`` with a short ``reason``. Parameters are keyword-only
with type hints; :meth:`VerifierSpec.bind` type-checks them and then calls the verifier once
on an empty batch, so a verifier that validates its parameter *values* at the top of its body
fails at start-up rather than mid-run.

A plugin that breaks the contract mid-run stops scoring with a :class:`RewardError` whose
message is one line naming the verifier, the step (from the caller's ``context``) and the
samples, and which carries them as attributes for ``failure.json`` (:func:`write_failure`):

* :class:`VerifierError`: the verifier raised, returned the wrong number of results, a result
  that is not a number, or a value outside its declared ``[low, high]`` (beyond a relative
  tolerance of 1e-6, within which it is clipped);
* :class:`NonFiniteRewardError`: a score, a sub-score or the weighted total is NaN or ±inf;
* :class:`VerifierTimeoutError`: over ``reward.timeout_s`` under ``reward.on_timeout: stop``.

``mmrft`` prints such an error as one line and exits with status 2.

Where verifiers run: :func:`build_reward` starts verifier worker processes
(:mod:`mmrft.rewards.pool`, ``reward.isolation: process``) that are killed at
``reward.timeout_s``; the contract checks above stay in this process. Running out of memory
is not a contract breach: a call that raises ``MemoryError`` (over a worker's cap, or in this
process for the verifiers that run here) scores its completions the verifier's minimum with
reason ``memory``, and the run goes on.

**Asynchronous verifiers.** A verifier may be an ``async def`` (batched or ``group=True``),
for a verifier that waits on something (a served judge, a sandbox, a remote check)::

    @verifier("remote_check", low=0.0, high=1.0)
    async def remote_check(completions, samples, *, url: str = "http://127.0.0.1:8000"):
        verdicts = await ask(url, completions)  # e.g. httpx.AsyncClient
        return [Score(1.0) if v else Score(0.0, reason="rejected") for v in verdicts]

The contract is the same (one result per completion, Score/float/None, the range and NaN
checks, typed keyword parameters, the awaited start-up call on an empty batch). A verifier is
async when its start-up call returns an awaitable: every ``async def``, and a sync function that
returns a coroutine for some parameters (the ``judge`` verifier with ``backend: http``; with
``backend: local`` it stays sync). Async verifiers run in the trainer's process, never in a
verifier worker (the workers are for sync code that may hang in C), as coroutines on one
event loop in a daemon thread of the reward (:class:`WeightedReward`), each under
``reward.timeout_s`` (past it the coroutine is cancelled and scores the minimum with reason
``timeout``, or stops the run under ``on_timeout: stop``). They must not block: a blocking
call inside one stalls every coroutine on the loop (use ``await asyncio.to_thread(...)``).
:meth:`WeightedReward.__call__` runs one batch's verifiers at the same time (async ones on
the loop, sync in-process ones each in its budget thread, pooled ones through the pool) and
assembles them in configured order; with an async verifier configured, the collector also
scores the groups a decode round finishes while the next round decodes
(:meth:`WeightedReward.submit`, :mod:`mmrft.rollout.collector`), with the same tokens sampled.
Measured by ``python benchmarks/judge.py`` (docs/tasks.md quotes it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
import math
import numbers
import queue
import re
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmrft.data import Sample
from mmrft.plugins import VERIFIERS
from mmrft.typecheck import ConfigError, bind_keyword_params

log = logging.getLogger(__name__)


@dataclass
class Score:
    """One verifier's verdict on one completion.

    Attributes:
        value: the score, inside the verifier's declared ``[low, high]``.
        reason: why the score is the minimum (``"no answer tag"``, ``"unparsable box"``, ...);
            ``None`` otherwise.
        parts: named sub-scores, logged as ``train/reward/<verifier>/<part>``.
    """

    value: float
    reason: str | None = None
    parts: dict[str, float] = field(default_factory=dict)


class RewardError(RuntimeError):
    """Scoring stopped because a verifier broke its contract; the message is one line.

    Attributes:
        verifier: the verifier's name (``"reward"`` for the weighted total).
        sample_ids: the samples concerned (the offending one, or the whole batch), in order.
        step: the training step, read from the caller's ``context`` (``"at step 12"``, which
            the message names too), else ``None``.
        value: the offending value, when there is one.
    """

    def __init__(
        self,
        message: str,
        *,
        verifier: str,
        sample_ids: Sequence[str] = (),
        context: str = "",
        value: float | None = None,
    ) -> None:
        self.verifier = verifier
        self.sample_ids = list(dict.fromkeys(sample_ids))
        self.context = context
        self.step = _step_of(context)
        self.value = value
        super().__init__(" ".join(message.split()))  # one line, whatever the plugin's message

    def failure(self) -> dict[str, Any]:
        """The ``failure.json`` record: step, reason, verifier, samples."""
        return {
            "step": self.step,
            "reason": str(self),
            "verifier": self.verifier,
            "samples": self.sample_ids,
        }


class VerifierError(RewardError):
    """A verifier raised, or returned something its declaration rules out."""


class NonFiniteRewardError(RewardError):
    """A verifier (or the weighted total) gave NaN or inf for a sample."""


class VerifierTimeoutError(RewardError):
    """A verifier call exceeded ``reward.timeout_s`` under ``reward.on_timeout: stop``."""


def _step_of(context: str) -> int | None:
    match = re.search(r"\bstep (\d+)", context or "")
    return int(match.group(1)) if match else None


def _sample_id(sample: Any) -> str:
    """A sample's id for messages (a caller may pass placeholders without one)."""
    return str(getattr(sample, "id", sample))


def _ids(sample_ids: Sequence[str], most: int = 20) -> str:
    """``a, b, c`` (the first ``most`` distinct ids, then how many more)."""
    ids = list(dict.fromkeys(sample_ids))
    text = ", ".join(ids[:most])
    return text + (f" (+{len(ids) - most} more)" if len(ids) > most else "")


def write_failure(run_dir: str | Path, error: RewardError, step: int | None = None) -> Path:
    """Write ``run_dir/failure.json`` for a run stopped by ``error`` (``step`` overrides the
    one read from its context), atomically; returns its path. Earlier checkpoints are left as
    they are."""
    from mmrft.runtime.checkpoint import write_failure_record

    record = error.failure()
    if step is not None:
        record["step"] = step
    return write_failure_record(run_dir, record)


def call_with_budget(fn: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Run ``fn()`` in a daemon thread and wait at most ``timeout_s`` seconds (0 = no limit).

    Raises :class:`TimeoutError` naming ``what`` when the budget is exceeded. The budget of the
    verifiers that run in this process (``reward.isolation: inline``, ``isolate=False``): a
    Python thread cannot be killed, so a verifier that never returns keeps its thread until the
    process ends, and one that holds the GIL in a long C call stalls the caller too; the
    verifier worker processes (:mod:`mmrft.rewards.pool`) are killed instead.
    """
    if not timeout_s:
        return fn()
    return _Running(fn, what).result(timeout_s)


class _Running:
    """``fn()`` started now in a daemon thread; :meth:`result` waits for it within a budget
    counted from the start (:func:`call_with_budget` split in two, so that several run at once)."""

    def __init__(self, fn: Callable[[], Any], what: str) -> None:
        self.what = what
        self.box: dict[str, Any] = {}
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._run, args=(fn,), name=f"mmrft:{what}")
        self.thread.daemon = True
        self.thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.box["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            self.box["error"] = exc

    def result(self, timeout_s: float) -> Any:
        """``fn``'s value or exception; :class:`TimeoutError` past ``timeout_s`` from the start
        (0 = wait as long as it takes)."""
        if timeout_s:
            self.thread.join(max(0.0, self.started + timeout_s - time.monotonic()))
        else:
            self.thread.join()
        if self.thread.is_alive():
            raise TimeoutError(f"{self.what} exceeded its {timeout_s:g}s budget")
        if "error" in self.box:
            raise self.box["error"]
        return self.box["value"]


def _run_now(awaitable: Awaitable[Any]) -> Any:
    """Await ``awaitable`` to the end on a fresh event loop in a thread of its own (the caller
    may be inside a running loop, where ``asyncio.run`` is refused): the start-up call of an
    async verifier."""

    async def main() -> Any:
        return await awaitable

    return _Running(lambda: asyncio.run(main()), "verifier start-up").result(0)


async def _cancel_all() -> None:
    """Cancel the other tasks of the running loop and let them finish (3 s at most)."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=3.0)


class _LoopThread:
    """An asyncio event loop running in a daemon thread: where a reward's async verifiers run.

    Why one long-lived loop rather than ``asyncio.run`` per call: :meth:`WeightedReward.submit`
    scores while the caller's thread decodes the next round, so the coroutines need a loop that
    runs without the caller; one loop serves every batch and every async verifier of the
    reward (they share it, as the HTTP judge's requests share its connection gate); and
    ``asyncio.run`` is refused where the caller already runs a loop (a notebook)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="mmrft:verifier-loop", daemon=True
        )
        self.thread.start()

    def run(self, coroutine: Any) -> concurrent.futures.Future:
        """Schedule ``coroutine`` on the loop; its Future can be waited on from any thread."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def close(self) -> None:
        if self.loop.is_closed():
            return
        if threading.current_thread() is not self.thread:
            # as asyncio.run ends: cancel what is left (a judge's HTTP client closes, a batch
            # in flight ends); a loop stuck in a blocking call is stopped all the same
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(_cancel_all(), self.loop).result(5.0)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5.0)
        if not self.thread.is_alive():
            self.loop.close()


class _SerialThread:
    """Calls submitted from any thread, run one at a time in submission order in a daemon
    thread (:meth:`WeightedReward.submit`)."""

    def __init__(self, name: str) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._work, name=name, daemon=True)
        self.thread.start()

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.jobs.put((fn, future))
        return future

    def close(self) -> None:
        self.jobs.put(None)

    def _work(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            fn, future = job
            job = None  # hold no reference to the reward between jobs
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:  # handed to whoever waits on the future
                    future.set_exception(exc)
            fn = future = None


VerifierFn = Callable[
    ..., Sequence[Score | float | None] | Awaitable[Sequence[Score | float | None]]
]


@dataclass(frozen=True)
class VerifierSpec:
    """A registered verifier: the function, its declared score range, and whether it may run
    in a verifier worker process (``isolate``; see :func:`verifier`; never for an ``async def``
    or a group-aware one)."""

    name: str
    fn: VerifierFn
    low: float
    high: float
    isolate: bool = True
    group: bool = False
    """Called once per group (module docstring, "group-aware")."""

    @property
    def doc(self) -> str:
        return (self.fn.__doc__ or "").strip()

    @property
    def wants_trajectories(self) -> bool:
        """Whether the function takes ``trajectories`` (a third positional parameter)."""
        positional = [
            p.name
            for p in inspect.signature(self.fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        return len(positional) >= 3 and positional[2] == "trajectories"

    def bind(self, params: Mapping[str, Any] | None = None) -> BoundVerifier:
        """Check ``params`` (names, types, then values via an empty call) and bind them. The
        bound verifier is async when that call returns an awaitable (which is then awaited, so
        an async verifier's checks at the top of its body run now too). The empty call is made
        once per function and parameters in a process: a run's start-up checks its verifiers
        before anything heavy (:mod:`mmrft.rollout.preflight`) and builds its reward later,
        and a plugin sees one start-up call, not two."""
        checked = bind_keyword_params(self.fn, params or {}, where=f"verifier '{self.name}'")
        key = (self.fn, repr(sorted(checked.items())))
        if key in _PROBED:
            return BoundVerifier(self, checked, is_async=_PROBED[key])
        try:
            if self.wants_trajectories:
                result = self.fn([], [], [], **checked)
            else:
                result = self.fn([], [], **checked)
            is_async = inspect.isawaitable(result)
            if is_async:
                _run_now(result)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"verifier '{self.name}': {exc}") from exc
        _PROBED[key] = is_async
        return BoundVerifier(self, checked, is_async=is_async)


_PROBED: dict[tuple[Any, str], bool] = {}
"""Whether each (function, parameters) bound in this process is async: its empty call ran."""


def verifier(
    name: str, *, low: float = 0.0, high: float = 1.0, isolate: bool = True, group: bool = False
) -> Callable[[VerifierFn], VerifierFn]:
    """Register a batched verifier under ``name`` with score range ``[low, high]``.

    ``group=True``: the verifier is called once per GRPO group with that group's completions
    and samples (module docstring, "group-aware"); it always runs in the trainer's process.

    An ``async def`` verifier (module docstring, "asynchronous verifiers") always runs in the
    trainer's process too, as a coroutine on the reward's event loop, under
    ``reward.timeout_s`` (cancelled past it); ``reward.isolation: process`` leaves it there.

    ``isolate=False``: the verifier always runs in the trainer's process, even under
    ``reward.isolation: process`` (one that needs the parent's state, e.g. a judge holding a
    client); there ``reward.timeout_s`` is kept by a thread, which a call stuck in C code
    outlives. The decorated function is returned unchanged, so it stays callable in a notebook.
    """
    if not low < high:
        raise ValueError(f"verifier '{name}': low ({low}) must be below high ({high})")

    def register(fn: VerifierFn) -> VerifierFn:
        spec = VerifierSpec(
            name=name,
            fn=fn,
            low=float(low),
            high=float(high),
            isolate=isolate and not group and not inspect.iscoroutinefunction(fn),
            group=group,
        )
        VERIFIERS.add(name, spec)
        return fn

    return register


def as_score(result: Score | float | None, low: float) -> Score | None:
    """Normalise one verifier result. A bare float at the minimum gets reason ``"minimum"``."""
    if result is None or isinstance(result, Score):
        return result
    value = float(result)
    return Score(value, reason="minimum" if value <= low else None)


#: Values this far outside ``[low, high]`` (relative to ``high - low``, at least 1) are clipped
#: (floating-point noise); further out they are an error.
RANGE_TOLERANCE = 1e-6


def _first_line(exc: BaseException, most: int = 200) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= most else text[: most - 1] + "…"


def _raised(exc: BaseException) -> str:
    """``raised <type>: <first line>``, what a verifier that raised ``exc`` did."""
    return f"raised {type(exc).__name__}: {_first_line(exc)}"


@dataclass(frozen=True)
class BoundVerifier:
    """A verifier with checked parameters, called as ``bound(completions, samples)`` (sync) or
    ``await bound.acall(completions, samples)`` (async, :attr:`is_async`)."""

    spec: VerifierSpec
    params: dict[str, Any]
    is_async: bool = False
    """Whether the function returns an awaitable with these parameters (found at start-up)."""

    @property
    def name(self) -> str:
        return self.spec.name

    def __call__(
        self,
        completions: Sequence[str],
        samples: Sequence[Sample],
        context: str = "",
        trajectories: Sequence[Any] | None = None,
        group_size: int | None = None,
    ) -> list[Score | None]:
        """Score a batch and check what the verifier returned; a breach of the contract raises
        a :class:`RewardError` naming this verifier, ``context`` (``"at step 12"``) and the
        samples (see the module docstring). ``trajectories``: the tool rollouts' records, for
        a verifier that takes them (``None`` per completion when absent). ``group_size``: the
        completions per group, for a group-aware verifier (:func:`group_spans`)."""
        out: list[Score | None] = []
        for start, end, what in self._calls(completions, samples, group_size):
            given = None if trajectories is None else trajectories[start:end]
            out += self._call_batch(
                completions[start:end], samples[start:end], context, given, what
            )
        return out

    async def acall(
        self,
        completions: Sequence[str],
        samples: Sequence[Sample],
        context: str = "",
        trajectories: Sequence[Any] | None = None,
        group_size: int | None = None,
    ) -> list[Score | None]:
        """:meth:`__call__` for an async verifier, on the caller's event loop: the function's
        awaitable is awaited (a group-aware one's groups concurrently) and checked alike; the
        first failing group in order is raised."""
        calls = [
            self._acall_batch(
                completions[start:end],
                samples[start:end],
                context,
                None if trajectories is None else trajectories[start:end],
                what,
            )
            for start, end, what in self._calls(completions, samples, group_size)
        ]
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        out: list[Score | None] = []
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
            out += outcome
        return out

    def _calls(
        self, completions: Sequence[str], samples: Sequence[Sample], group_size: int | None
    ) -> list[tuple[int, int, str]]:
        """``(start, end, what)`` of each call: the whole batch, or each group of a group-aware
        verifier (``what`` words the count check's message)."""
        if len(completions) != len(samples):
            raise ValueError(f"{len(completions)} completions for {len(samples)} samples")
        if self.spec.group:
            return [(start, end, "group of ") for start, end in group_spans(samples, group_size)]
        return [(0, len(completions), "")]

    def _invoke(
        self,
        completions: Sequence[str],
        samples: Sequence[Sample],
        trajectories: Sequence[Any] | None,
    ) -> Any:
        """The function called on one batch or group (its results, or an awaitable of them)."""
        if self.spec.wants_trajectories:
            given = list(trajectories) if trajectories is not None else [None] * len(samples)
            return self.spec.fn(list(completions), list(samples), given, **self.params)
        return self.spec.fn(list(completions), list(samples), **self.params)

    def _call_batch(
        self,
        completions: Sequence[str],
        samples: Sequence[Sample],
        context: str,
        trajectories: Sequence[Any] | None,
        what: str = "",
    ) -> list[Score | None]:
        """One call of the function on ``completions`` (the batch, or one group) and the
        contract checks of its results."""
        try:
            raw = self._invoke(completions, samples, trajectories)
            if inspect.isawaitable(raw):  # async now, though its start-up call was not
                if inspect.iscoroutine(raw):
                    raw.close()
                raise TypeError("an awaitable, where its start-up call returned results")
            count = len(raw)
        except MemoryError:
            return self.over_memory(samples, context)
        except Exception as exc:
            raise self.failed(_raised(exc), samples, context) from exc
        return self._counted(raw, count, completions, samples, context, what)

    async def _acall_batch(
        self,
        completions: Sequence[str],
        samples: Sequence[Sample],
        context: str,
        trajectories: Sequence[Any] | None,
        what: str = "",
    ) -> list[Score | None]:
        """:meth:`_call_batch` of an async verifier: its awaitable awaited, then the same
        checks."""
        try:
            raw = self._invoke(completions, samples, trajectories)
            if inspect.isawaitable(raw):
                raw = await raw
            count = len(raw)
        except MemoryError:
            return self.over_memory(samples, context)
        except Exception as exc:
            raise self.failed(_raised(exc), samples, context) from exc
        return self._counted(raw, count, completions, samples, context, what)

    def _counted(
        self,
        raw: Sequence[Any],
        count: int,
        completions: Sequence[str],
        samples: Sequence[Sample],
        context: str,
        what: str,
    ) -> list[Score | None]:
        """The count check, then :meth:`check`."""
        if count != len(completions):
            raise self.failed(
                f"returned {count} results for a {what}{len(completions)} completions",
                samples,
                context,
            )
        return self.check(raw, samples, context)

    def over_memory(self, samples: Sequence[Sample], context: str) -> list[Score | None]:
        """A call in this process that raised ``MemoryError``: each of its completions scores
        the verifier's minimum (0 for an unbounded one) with reason ``memory`` (counted, logged
        with the sample ids), as a worker over its cap does; the run goes on."""
        low = self.spec.low if math.isfinite(self.spec.low) else 0.0
        ids = sorted({_sample_id(s) for s in samples})
        where = f" {context}" if context else ""
        log.warning(
            "verifier '%s' raised MemoryError%s on %d completions of samples %s; scored %g "
            "with reason 'memory'",
            self.name,
            where,
            len(samples),
            _ids(ids),
            low,
        )
        return [Score(low, reason="memory") for _ in samples]

    def failed(self, what: str, samples: Sequence[Sample], context: str) -> VerifierError:
        """``verifier '<name>' <what> <context> on samples <ids>`` as a VerifierError."""
        ids = [_sample_id(s) for s in samples]
        where = f" {context}" if context else ""
        return VerifierError(
            f"verifier '{self.name}' {what}{where} on samples {_ids(ids)}",
            verifier=self.name,
            sample_ids=ids,
            context=context,
        )

    def check(
        self, raw: Sequence[Any], samples: Sequence[Sample], context: str
    ) -> list[Score | None]:
        """The raw results of one batch (one per sample, counted by the caller) checked
        against the contract: fresh Scores inside ``[low, high]``, or a RewardError."""
        return [self._checked(r, sample, context) for r, sample in zip(raw, samples)]

    def _checked(self, result: Any, sample: Sample, context: str) -> Score | None:
        """One result as a fresh :class:`Score` inside ``[low, high]``, or a RewardError."""
        if result is None:
            return None
        low, high = self.spec.low, self.spec.high
        value = result.value if isinstance(result, Score) else result
        parts = dict(result.parts) if isinstance(result, Score) else {}
        reason = result.reason if isinstance(result, Score) else None
        where = f" {context}" if context else ""

        def fail(kind: type[RewardError], what: str, number: float | None = None) -> RewardError:
            return kind(
                f"verifier '{self.name}' returned {what} for sample '{_sample_id(sample)}'{where}",
                verifier=self.name,
                sample_ids=[_sample_id(sample)],
                context=context,
                value=number,
            )

        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise fail(VerifierError, f"a {type(value).__name__}, not a number,")
        if reason is not None and not isinstance(reason, str):
            raise fail(VerifierError, f"a {type(reason).__name__} as reason")
        value = float(value)
        if not math.isfinite(value):
            raise fail(NonFiniteRewardError, str(value), value)
        tolerance = RANGE_TOLERANCE * max(1.0, high - low)
        if not low - tolerance <= value <= high + tolerance:
            raise fail(
                VerifierError, f"{value:g}, outside its declared range [{low:g}, {high:g}],", value
            )
        for name, part in parts.items():
            if isinstance(part, bool) or not isinstance(part, numbers.Real):
                raise fail(VerifierError, f"sub-score '{name}' = {part!r}, not a number,")
            if not math.isfinite(part):
                raise fail(NonFiniteRewardError, f"sub-score '{name}' = {part}", float(part))
        value = min(high, max(low, value))
        if value <= low and reason is None:
            reason = "minimum"
        return Score(value, reason=reason, parts={k: float(v) for k, v in parts.items()})


def group_spans(samples: Sequence[Any], group_size: int | None) -> list[tuple[int, int]]:
    """``[start, end)`` of each group of a batch: consecutive blocks of ``group_size``
    completions (ValueError when it does not divide the batch), or, when ``None``, each run of
    consecutive completions of the same sample (same id).

    >>> group_spans(["a", "a", "b", "b", "b"], None), group_spans(list("aabb"), 2)
    ([(0, 2), (2, 5)], [(0, 2), (2, 4)])
    """
    n = len(samples)
    if group_size is not None:
        if group_size < 1 or n % group_size:
            raise ValueError(f"{n} completions do not split into groups of {group_size}")
        return [(i, i + group_size) for i in range(0, n, group_size)]
    spans: list[tuple[int, int]] = []
    start = 0
    for i in range(1, n + 1):
        if i == n or _sample_id(samples[i]) != _sample_id(samples[start]):
            spans.append((start, i))
            start = i
    return spans
