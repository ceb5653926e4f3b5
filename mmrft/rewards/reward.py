"""The weighted reward of a run: every configured verifier bound to its params and weight,
called batched (in-process, on the event loop, or in verifier worker processes), its scores
combined into one reward per completion with the breakdown by verifier and the reasons counted
(:class:`WeightedReward`, built by :func:`build_reward` from ``reward.verifiers``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from mmrft.data import Sample
from mmrft.plugins import VERIFIERS
from mmrft.rewards.functions import function_labels, is_function_spec, register_function
from mmrft.rewards.pool import (
    TIMEOUT,
    WORKER_MEMORY_MB,
    NotSendable,
    VerifierPool,
    WorkerDied,
    WorkerRaised,
    WrongCount,
    source,
)
from mmrft.rewards.verifier import (
    BoundVerifier,
    NonFiniteRewardError,
    Score,
    VerifierTimeoutError,
    _ids,
    _LoopThread,
    _Running,
    _sample_id,
    _SerialThread,
    call_with_budget,
)
from mmrft.typecheck import ConfigError

log = logging.getLogger(__name__)


@dataclass
class RewardBreakdown:
    """The rewards of a batch of completions.

    Attributes:
        total: Σ_v weight_v · score_v per completion (``None`` scores add nothing).
        scores: verifier label (:attr:`WeightedReward.labels`) → the per-completion :class:`Score`
            (or ``None``).
        reasons: ``"<verifier>/<reason>"`` → count over the batch.
    """

    total: list[float]
    scores: dict[str, list[Score | None]]
    reasons: Counter

    @classmethod
    def concat(cls, parts: list[RewardBreakdown]) -> RewardBreakdown:
        """One breakdown over several batches (e.g. the rounds of dynamic sampling)."""
        names = list(parts[0].scores)
        return cls(
            total=[t for p in parts for t in p.total],
            scores={n: [s for p in parts for s in p.scores[n]] for n in names},
            reasons=sum((p.reasons for p in parts), Counter()),
        )

    def metrics(self, prefix: str = "train/reward") -> dict[str, float]:
        """Mean total and per-verifier means (and sub-scores), namespaced under ``prefix``."""
        out = {prefix: sum(self.total) / max(len(self.total), 1)}
        for name, scores in self.scores.items():
            present = [s for s in scores if s is not None]
            if present:
                out[f"{prefix}/{name}"] = sum(s.value for s in present) / len(present)
                for part in sorted({p for s in present for p in s.parts}):
                    values = [s.parts[part] for s in present if part in s.parts]
                    out[f"{prefix}/{name}/{part}"] = sum(values) / len(values)
        return out


@dataclass
class WeightedReward:
    """reward = Σ_v weight_v · score_v over the configured verifiers.

    The range of the total is Σ_v weight_v · [low_v, high_v]; :attr:`range` reports it so that
    unequal scales (GIoU + 1 up to 2, bonuses of 0.3) are visible rather than silent.
    """

    verifiers: list[tuple[BoundVerifier, float]]
    timeout_s: float = 0.0
    on_timeout: str = "zero"
    pool: VerifierPool | None = None
    """Worker processes running the verifiers it names (:mod:`mmrft.rewards.pool`); the
    others, and all of them without a pool, run in this process: async ones on the reward's
    event loop, sync ones under a thread's budget."""
    _threads: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)
    _lock: threading.Lock = field(
        default_factory=threading.Lock, init=False, repr=False, compare=False
    )

    @property
    def labels(self) -> dict[str, str]:
        """Each verifier's name in metrics and results (:func:`function_labels`): a plain
        function ``/home/.../my_rewards.py:brief`` is ``brief`` (``my_rewards:brief`` where two
        share a name), a registered verifier its own name."""
        return function_labels([bound.name for bound, _ in self.verifiers])

    def close(self) -> None:
        """Stop the verifier worker processes, the event loop and the background scorer, if
        any (also done at exit; the threads are daemons)."""
        if self.pool is not None:
            self.pool.close()
        with self._lock:
            threads, self._threads = self._threads, {}
        for thread in threads.values():
            thread.close()

    @property
    def is_async(self) -> bool:
        """Whether any configured verifier is async (the collector then overlaps scoring with
        generation)."""
        return any(bound.is_async for bound, _ in self.verifiers)

    def _thread(self, kind: str) -> Any:
        """The reward's event loop (``"loop"``) or background scorer (``"scorer"``), started on
        first use and stopped by :meth:`close` or when the reward is garbage-collected."""
        with self._lock:
            if kind not in self._threads:
                made = _LoopThread() if kind == "loop" else _SerialThread("mmrft:scoring")
                weakref.finalize(self, made.close)
                self._threads[kind] = made
            return self._threads[kind]

    def submit(
        self, completions: Sequence[str], samples: Sequence[Sample], *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future:
        """Score a batch in the background (the arguments of :meth:`__call__`; the lists are
        copied now); the Future's ``result()`` is what :meth:`__call__` returns (or raises what
        it raises). Submitted batches are scored one at a time in submission order, in a daemon
        thread of the reward, so every batch sees the verdicts cached by the ones before it and
        a judge's budgets, concurrency and rate limits hold per batch as for a direct call. The
        collector scores the groups of one decode round this way while the next round decodes."""
        batch = (list(completions), list(samples), *args)
        return self._thread("scorer").submit(lambda: self(*batch, **kwargs))

    @property
    def range(self) -> tuple[float, float]:
        low = sum(min(w * v.spec.low, w * v.spec.high) for v, w in self.verifiers)
        high = sum(max(w * v.spec.low, w * v.spec.high) for v, w in self.verifiers)
        return low, high

    def __call__(
        self,
        completions: Sequence[str],
        samples: Sequence[Sample],
        context: str = "",
        trajectories: Sequence[Any] | None = None,
        group_size: int | None = None,
    ) -> RewardBreakdown:
        """Score a batch. ``context`` (e.g. ``"at step 12"``) goes into every error and timeout
        message. A NaN or inf total (weights times scores overflowing) is an error too.
        ``trajectories``: tool rollouts' records for the verifiers that take them;
        ``group_size``: the completions per group, for group-aware verifiers (``None``: each
        run of consecutive completions of one sample is a group)."""
        total = [0.0] * len(completions)
        by_name: dict[str, list[Score | None]] = {}
        reasons: Counter = Counter()
        every = self._all_scores(completions, samples, context, trajectories, group_size)
        labels = self.labels
        for (bound, weight), scores in zip(self.verifiers, every):
            by_name[labels[bound.name]] = scores
            for i, score in enumerate(scores):
                if score is None:
                    continue
                total[i] += weight * score.value
                if score.reason:
                    reasons[f"{labels[bound.name]}/{score.reason}"] += 1
        for value, sample in zip(total, samples):
            if not math.isfinite(value):
                raise NonFiniteRewardError(
                    f"the weighted reward is {value} for sample '{_sample_id(sample)}'"
                    f"{f' {context}' if context else ''} (weights × scores overflow)",
                    verifier="reward",
                    sample_ids=[_sample_id(sample)],
                    context=context,
                    value=value,
                )
        return RewardBreakdown(total=total, scores=by_name, reasons=reasons)

    def bound(self, name: str) -> BoundVerifier:
        """The configured verifier ``name`` (its label, or a plain function's full spec);
        KeyError naming the configured ones otherwise."""
        labels = self.labels
        for bound, _ in self.verifiers:
            if name in (bound.name, labels[bound.name]):
                return bound
        raise KeyError(f"no verifier '{name}' in this reward ({', '.join(self.names)})")

    @property
    def names(self) -> list[str]:
        """The verifiers' labels (:attr:`labels`), in configured order: the keys of
        :attr:`RewardBreakdown.scores`."""
        labels = self.labels
        return [labels[bound.name] for bound, _ in self.verifiers]

    def score_one(
        self,
        name: str,
        completions: Sequence[str],
        samples: Sequence[Sample],
        context: str = "",
        group_size: int | None = None,
    ) -> list[Score | None]:
        """The raw scores (no weight) of verifier ``name`` alone, under the same time budget and
        ``on_timeout`` rule as a full call (e.g. the correctness of T-GRPO's shuffled-frame
        completions, which are scored but not trained on)."""
        return self._scores(self.bound(name), completions, samples, context, None, group_size)

    def _pooled_here(self, bound: BoundVerifier) -> bool:
        return self.pool is not None and bound.name in self.pool.names

    def _all_scores(
        self,
        completions: Sequence[str],
        samples: Sequence[Sample],
        context: str,
        trajectories: Sequence[Any] | None,
        group_size: int | None,
    ) -> list[list[Score | None]]:
        """Every configured verifier's scores, in configured order, the verifiers run at the
        same time: the async ones as coroutines on the reward's event loop, the sync ones of
        this process each in its budget thread, the pooled ones one after another through the
        pool in this thread (the pool serialises its callers, :meth:`VerifierPool.call`).
        Every outcome is awaited, then the first failure in configured order is raised, so
        scores and errors are those of the verifiers run one after the other. With a single
        lane of work (one verifier, or only pooled ones) they run exactly so, in this thread."""
        batch = (completions, samples, context, trajectories, group_size)
        bounds = [bound for bound, _ in self.verifiers]
        waiting = [i for i, b in enumerate(bounds) if b.is_async and not self._pooled_here(b)]
        pooled = [i for i, b in enumerate(bounds) if self._pooled_here(b)]
        threaded = [i for i in range(len(bounds)) if i not in waiting and i not in pooled]
        if len(threaded) + len(waiting) + bool(pooled) <= 1:
            return [self._scores(bound, *batch) for bound in bounds]
        coroutines = None
        if waiting:

            async def together() -> list[Any]:
                calls = [self._async_scores(bounds[i], *batch) for i in waiting]
                return await asyncio.gather(*calls, return_exceptions=True)

            coroutines = self._thread("loop").run(together())
        running = {
            i: _Running(partial(bounds[i], *batch), f"verifier '{bounds[i].name}'")
            for i in threaded
        }
        outcomes: dict[int, Any] = {}
        for i in pooled:
            outcomes[i] = _outcome(
                partial(self._pooled, bounds[i], completions, samples, context, trajectories)
            )
        for i, run in running.items():
            outcomes[i] = _outcome(partial(self._budgeted, bounds[i], run, samples, context))
        if coroutines is not None:
            outcomes.update(zip(waiting, coroutines.result()))
        ordered = [outcomes[i] for i in range(len(bounds))]
        for outcome in ordered:
            if isinstance(outcome, BaseException):
                raise outcome
        return ordered

    def _scores(
        self,
        bound: BoundVerifier,
        completions: Sequence[str],
        samples: Sequence[Sample],
        context: str,
        trajectories: Sequence[Any] | None = None,
        group_size: int | None = None,
    ) -> list[Score | None]:
        """One verifier's scores, in the caller's thread (the pool, or a budget thread, or the
        reward's event loop for an async verifier)."""
        if self._pooled_here(bound):
            return self._pooled(bound, completions, samples, context, trajectories)
        if bound.is_async:
            batch = (completions, samples, context, trajectories, group_size)
            return self._thread("loop").run(self._async_scores(bound, *batch)).result()
        try:
            return call_with_budget(
                lambda: bound(completions, samples, context, trajectories, group_size),
                self.timeout_s,
                f"verifier '{bound.name}'",
            )
        except TimeoutError as exc:  # the budget's own: a verifier's exceptions are wrapped
            return self._timed_out(bound, str(exc), samples, context)

    def _budgeted(
        self, bound: BoundVerifier, running: _Running, samples: Sequence[Sample], context: str
    ) -> list[Score | None]:
        """A sync verifier's scores from its budget thread, or its timeout's."""
        try:
            return running.result(self.timeout_s)
        except TimeoutError as exc:  # the budget's own: a verifier's exceptions are wrapped
            return self._timed_out(bound, str(exc), samples, context)

    async def _async_scores(
        self,
        bound: BoundVerifier,
        completions: Sequence[str],
        samples: Sequence[Sample],
        context: str,
        trajectories: Sequence[Any] | None,
        group_size: int | None,
    ) -> list[Score | None]:
        """An async verifier's scores on the running loop, under ``timeout_s``: past it the
        coroutine is cancelled and the batch scored as a timeout (:meth:`_timed_out`)."""
        task = asyncio.ensure_future(
            bound.acall(completions, samples, context, trajectories, group_size)
        )
        if not self.timeout_s:
            return await task
        # asyncio.wait, then cancel, rather than asyncio.wait_for: wait_for also waits for the
        # cancelled coroutine to finish, which one that swallows CancelledError never does;
        # this returns at the budget whatever the coroutine does with its cancellation.
        done, _ = await asyncio.wait({task}, timeout=self.timeout_s)
        if task not in done:
            task.cancel()
            what = f"verifier '{bound.name}' exceeded its {self.timeout_s:g}s budget"
            return self._timed_out(bound, what, samples, context)
        return task.result()

    def _timed_out(
        self, bound: BoundVerifier, what: str, samples: Sequence[Sample], context: str
    ) -> list[Score | None]:
        """A whole batch over its budget: every completion scores the minimum with reason
        ``timeout`` (logged), or :class:`VerifierTimeoutError` under ``on_timeout: stop``."""
        ids = sorted({_sample_id(s) for s in samples})
        message = f"{what} {context} on {len(samples)} completions of samples {_ids(ids)}"
        if self.on_timeout == "stop":
            raise VerifierTimeoutError(
                message, verifier=bound.name, sample_ids=ids, context=context
            ) from None
        log.warning("%s; scored %g with reason 'timeout'", message, timeout_score(bound))
        return [Score(timeout_score(bound), reason="timeout") for _ in samples]

    def _pooled(
        self,
        bound: BoundVerifier,
        completions: Sequence[str],
        samples: Sequence[Sample],
        context: str,
        trajectories: Sequence[Any] | None,
    ) -> list[Score | None]:
        """One batch through the worker processes: a call past ``timeout_s`` is killed and
        only the completions that time out alone score the minimum with reason ``timeout``
        (or stop the run under ``on_timeout: stop``); see :meth:`VerifierPool.call`."""
        assert self.pool is not None
        if len(completions) != len(samples):
            raise ValueError(f"{len(completions)} completions for {len(samples)} samples")
        given = None
        if bound.spec.wants_trajectories:
            given = list(trajectories) if trajectories is not None else [None] * len(samples)
        try:
            call = self.pool.call(
                bound.name, bound.params, list(completions), list(samples), given, self.timeout_s
            )
        except WorkerRaised as exc:
            what = f"raised {exc.kind}: {exc.message}"
            raise bound.failed(what, samples, context) from exc.error
        except WrongCount as exc:
            what = f"returned {exc.count} results for {exc.expected} completions"
            raise bound.failed(what, samples, context) from None
        except WorkerDied as exc:
            raise bound.failed(f"ended its worker process ({exc})", samples, context) from None
        except NotSendable as exc:
            what = (
                f"could not be sent its batch ({exc}); declare it @verifier(..., isolate=False) "
                "or set reward.isolation=inline"
            )
            raise bound.failed(what, samples, context) from exc

        def alone(what: str, indices: list[int]) -> tuple[str, list[str]]:
            ids = [_sample_id(samples[i]) for i in indices]
            where = f" {context}" if context else ""
            return (
                f"verifier '{bound.name}' {what}{where} on {len(indices)} of {len(samples)} "
                f"completions (run alone), of samples {_ids(ids)}"
            ), ids

        if call.over_memory:
            what = "went over its worker's memory cap (reward.worker_memory_mb)"
            message, _ = alone(what, call.over_memory)
            log.warning("%s; scored %g with reason 'memory'", message, timeout_score(bound))
        late = sorted(call.timed_out + call.unreached)
        if late:
            message, ids = alone(f"exceeded its {self.timeout_s:g}s budget", late)
            if call.unreached:
                message += (
                    f"; {len(call.unreached)} of them were not re-scored alone (the isolation "
                    "budget was spent)"
                )
            if self.on_timeout == "stop":
                raise VerifierTimeoutError(
                    message, verifier=bound.name, sample_ids=ids, context=context
                )
            log.warning("%s; scored %g with reason 'timeout'", message, timeout_score(bound))
        scored = [i for i, r in enumerate(call.results) if r is not TIMEOUT]
        checked = bound.check(
            [call.results[i] for i in scored], [samples[i] for i in scored], context
        )
        over = set(call.over_memory)
        scores: list[Score | None] = [
            Score(timeout_score(bound), reason="memory" if i in over else "timeout")
            for i in range(len(samples))
        ]
        for i, score in zip(scored, checked):
            scores[i] = score
        return scores


def _outcome(fn: Callable[[], Any]) -> Any:
    """``fn()``, or the exception it raised (raised later, in configured order)."""
    try:
        return fn()
    except Exception as exc:
        return exc


def timeout_score(bound: BoundVerifier) -> float:
    """What a completion scores when its verifier call times out: the verifier's minimum, or 0
    for a plain reward function, whose range is unbounded (its minimum, −inf, would stop the
    run as a non-finite reward)."""
    return bound.spec.low if math.isfinite(bound.spec.low) else 0.0


def bind_verifiers(
    specs: Sequence[Mapping[str, Any]], key: str = "reward.verifiers"
) -> list[tuple[BoundVerifier, float]]:
    """Each entry of ``[{"name": ..., "weight": 1.0, "params": {...}}, ...]`` (the config list
    ``key``) as a verifier bound to its checked parameters, with its weight: what
    :func:`build_reward` builds from, and what a run's start-up checks before anything heavy
    (:mod:`mmrft.rollout.preflight`). ConfigError naming ``key[i]`` and what is wrong."""
    if not specs:
        raise ConfigError(f"{key}: at least one verifier is needed")
    verifiers = []
    seen = set()
    for i, spec in enumerate(specs):
        unknown = set(spec) - {"name", "weight", "params"}
        if unknown:
            raise ConfigError(
                f"{key}[{i}]: unknown key(s) {sorted(unknown)}; valid: name, weight, params"
            )
        if "name" not in spec:
            raise ConfigError(f"{key}[{i}]: missing 'name'")
        name = spec["name"]
        if name in seen:
            raise ConfigError(f"{key}[{i}]: verifier '{name}' listed twice")
        seen.add(name)
        weight = spec.get("weight", 1.0)
        if (
            not isinstance(weight, (int, float))
            or isinstance(weight, bool)
            or not math.isfinite(weight)
        ):
            raise ConfigError(f"{key}[{i}].weight: expected a finite number, got {weight!r}")
        try:
            if is_function_spec(str(name)):  # a plain function, FILE.py:FUNCTION
                registered = register_function(name)
            else:
                registered = VERIFIERS.get(name)
        except (KeyError, ConfigError) as exc:
            raise ConfigError(f"{key}[{i}].name: {exc}") from None
        verifiers.append((registered.bind(spec.get("params") or {}), float(weight)))
    return verifiers


def build_reward(
    specs: Sequence[Mapping[str, Any]],
    timeout_s: float = 0.0,
    on_timeout: str = "zero",
    isolation: str = "process",
    workers: int = 1,
    worker_memory_mb: int | None = WORKER_MEMORY_MB,
) -> WeightedReward:
    """Build the reward from ``[{"name": ..., "weight": 1.0, "params": {...}}, ...]``.

    ``isolation="process"`` starts ``workers`` verifier worker processes now (start-up, not
    step 0) for the verifiers that can run there (:mod:`mmrft.rewards.pool`), each allowed
    ``worker_memory_mb`` MiB beyond what it holds after loading them (default as
    ``reward.worker_memory_mb``; None = no cap);
    ``"inline"`` runs every verifier in this process. Close the pool with
    :meth:`WeightedReward.close`.
    """
    if isolation not in ("process", "inline"):
        raise ConfigError(f"reward.isolation: expected process or inline, got {isolation!r}")
    verifiers = bind_verifiers(specs)
    pooled = {}
    for bound, _ in verifiers if isolation == "process" else []:
        if not bound.spec.isolate or bound.is_async:  # these run in this process
            continue
        if source(bound.spec.fn) is None:
            log.warning(
                "verifier '%s' is defined in __main__ or inside a function, where a worker "
                "process cannot re-create it: it runs in this process, where reward.timeout_s "
                "cannot stop a call stuck in C code (define it in a plugin file, or declare "
                "@verifier(..., isolate=False))",
                bound.name,
            )
            continue
        pooled[bound.name] = bound.spec
    pool = VerifierPool(pooled, workers, worker_memory_mb) if pooled else None
    reward = WeightedReward(verifiers, timeout_s=timeout_s, on_timeout=on_timeout, pool=pool)
    for name, label in reward.labels.items():
        if is_function_spec(name):  # metrics say only the label: where it came from, once
            log.info("reward function '%s' is %s", label, name)
    return reward
