"""Asynchronous rollouts: the collector running ahead of the trainer (``rollout.max_staleness``).

**Versions.** The weights' *version* is the number of RL steps whose update they include: RL
starts from version ``s₀`` (0, or the step a run resumes from) and step t's update makes
version t. A synchronous step t trains on completions sampled at version t − 1. With
``rollout.max_staleness = k`` a rollout thread runs the whole collector (prompts, engine, tool
turns, verifiers, shaping, filters; :class:`mmrft.rollout.collector.Collector`, unchanged) on its own
copy of the weights and starts step t's batch as soon as the trainer's weights reach version
t − 1 − k, while the trainer updates earlier steps::

    k = 1   rollout thread   batch 1 (v0) | batch 2 (v0) | batch 3 (v1) | batch 4 (v2) | ...
            trainer                       | update 1     | update 2     | update 3     | ...

The *lag* of a token trained at step t is (t − 1) − v, v the version that sampled it; the gate
keeps it in [0, k]. k = 0 through this class alternates strictly and equals the synchronous
path (the trainer itself uses the plain collector for k = 0).

**Weights.** After each update the trainer thread copies the weights into a pending snapshot
(:meth:`AheadCollector.sync_weights`), which the rollout thread loads before its next batch.
With ``rollout.engine=hf`` the rollout thread samples from a copy of the model
(:func:`rollout_copy`) and the snapshot holds only the trainable tensors (only they change:
with LoRA, the adapters); with ``rollout.partial_rollouts`` it is loaded between two decode
steps, so a completion cut by an update continues under the new weights, each token recording
the version that sampled it (the KV cache of its earlier tokens is kept, computed by the older
weights, as verl's and AReaL's partial rollouts do). An engine with its own copy of the weights
(``vllm``, ``vllm_server``) gets the snapshot in its checkpoint format (LoRA merged) through its
``load_weights`` and reports no per-token versions: each completion records its batch's
version, as tool rollouts do (the oldest its tokens can be).

**Correction.** The engine reports every token's log-probability under the weights that sampled
it, log π_v(y_t); the loss weights each token by min(π_old(y_t) / π_v(y_t), tis_cap) (truncated
importance sampling, :func:`mmrft.algorithms.truncated_importance_weights`; ``algorithm.tis_cap``
is required for k > 0). A group holding a token more than k versions behind is dropped before
the update and counted (``rollout/stale_dropped``): the gate makes this a guard, not routine.

**Metrics.** ``rollout/lag_mean`` and ``rollout/lag_max`` over the trained tokens;
``time/wait_s``: the trainer waiting for its batch; ``time/rollout_idle_s``: the rollout thread
waiting at the gate (each side's idle time).

**Resume.** The checkpoint after step t holds the collector's state as it was before collecting
step t + 1 (data position, bad samples, prompt statistics, random state): a resume regenerates
every step after t from there, sampled by version t. With k > 0 a resumed run is therefore equal
in distribution to an uninterrupted one, not bit for bit (the uninterrupted run sampled those
steps with older weights); k = 0 resumes exactly.

**Several processes.** Every rank runs a rollout thread on its share of the prompts. Its
collectives (the collector's reductions) run on a gloo group of their own
(:func:`mmrft.runtime.distributed.side_group`, routed by :func:`mmrft.runtime.distributed.collectives_on`), so
they never pair up with the trainer's, which run on the default group at the same time. With
``hf`` the copy is made before the policy is sharded, and a sharded policy's snapshot is
gathered by every rank in the trainer's thread.

**Limits.** ``rollout.engine=hf`` needs ``group_shared`` (the path that reports sampling
log-probs); partial rollouts only on ``hf``; memory for a second copy of the model (``hf``) or
one snapshot of the weights (the vLLM engines); the colocated ``vllm`` engine runs ahead in
one process only (it shares the trainer's process group).
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

from mmrft.policy.model import Policy
from mmrft.rollout.collector import Collector, StepBatch
from mmrft.runtime import distributed

log = logging.getLogger("mmrft")

JOIN_TIMEOUT_S = 120.0  # close(): how long to wait for the rollout thread's current call


class _Stopped(Exception):
    """Raised inside the rollout thread between two decode steps when the run closes."""


def rollout_copy(policy: Policy) -> Policy:
    """A frozen copy of ``policy`` for the rollout thread (same family and processor)."""
    model = copy.deepcopy(policy.model)
    model.requires_grad_(False)
    model.eval()
    return Policy(family=policy.family, model=model, processor=policy.processor)


def _snapshot(weights: Any) -> dict[str, torch.Tensor]:
    """Detached copies of named tensors; names sharing one tensor (tied embeddings) share its
    copy, so a writer that stores a tensor once still does."""
    copies: dict[tuple[int, int, tuple[int, ...]], torch.Tensor] = {}
    out = {}
    for name, tensor in weights:
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key not in copies:
            copies[key] = tensor.detach().clone()
        out[name] = copies[key]
    return out


def stale_groups(
    token_versions: Sequence[Sequence[int]], group_size: int, current: int, bound: int
) -> list[int]:
    """Indices of the groups (``group_size`` consecutive completions) holding a token sampled
    by a version older than ``current − bound``; a completion with no tokens counts as its
    group's other completions do."""
    oldest = current - bound
    groups = len(token_versions) // group_size
    return [
        g
        for g in range(groups)
        if any(
            v < oldest
            for versions in token_versions[g * group_size : (g + 1) * group_size]
            for v in versions
        )
    ]


def lag_stats(token_versions: Sequence[Sequence[int]], current: int) -> tuple[float, float]:
    """(mean, max) over every token of ``current − version``; (0, 0) without tokens."""
    lags = [current - v for versions in token_versions for v in versions]
    if not lags:
        return 0.0, 0.0
    return sum(lags) / len(lags), float(max(lags))


def drop_groups(batch: StepBatch, groups: Sequence[int], group_size: int) -> StepBatch:
    """``batch`` without the kept groups ``groups`` (what was generated and scored stays: the
    reward metrics are over everything sampled)."""
    drop = set(groups)
    n_groups = len(batch.samples) // group_size
    keep = [
        i
        for g in range(n_groups)
        if g not in drop
        for i in range(g * group_size, (g + 1) * group_size)
    ]
    return StepBatch(
        samples=[batch.samples[i] for i in keep],
        rollouts=batch.rollouts.select(keep),
        rewards=batch.rewards[keep] if keep else batch.rewards[:0],
        generated=batch.generated,
        generated_samples=batch.generated_samples,
        scored=batch.scored,
        counts=dict(batch.counts),
        timings=dict(batch.timings),
    )


class AheadCollector:
    """Runs ``collector`` in a rollout thread up to ``max_staleness`` updates ahead of the
    trainer; the trainer sees the synchronous collector's interface (module docstring).

    Args:
        collector: the collector whose engine samples: ``hf`` on :func:`rollout_copy` of
            ``policy``, or an engine with its own weights and a ``load_weights`` method.
        policy: the trainer's policy (its weights are snapshot after every update).
        max_staleness: k, the largest lag of a trained token, in updates.
        partial_rollouts: load new weights between decode steps (else between batches).
    """

    def __init__(
        self,
        collector: Collector,
        policy: Policy,
        max_staleness: int,
        partial_rollouts: bool = False,
    ) -> None:
        self.collector = collector
        self.engine = collector.engine
        self.max_staleness = max_staleness
        self.partial_rollouts = partial_rollouts
        self.policy = policy
        # hf samples from a copy of the model; the vLLM engines hold their own weights
        self.own_copy = collector.policy is not policy
        if not self.own_copy and not hasattr(self.engine, "current_weights"):
            raise TypeError(f"engine '{self.engine.name}' cannot take a snapshot of the weights")
        self._rollout_params = dict(collector.policy.model.named_parameters())
        self._rollout_buffers = dict(collector.policy.model.named_buffers())
        self._trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]
        self.engine.version = 0
        self._cond = threading.Condition()
        self._version = 0  # the trainer's weights
        self._pending: tuple[int, dict[str, torch.Tensor]] | None = None
        self._loaded_once = False
        self._ready: dict[int, StepBatch] = {}
        self._states: dict[int, dict[str, Any]] = {}  # step → collector state before it
        self._error: BaseException | None = None
        self._stop = False
        self._finished = False
        self._idle_s = 0.0
        self._thread: threading.Thread | None = None
        # several processes: the rollout thread's collectives (the collector's reductions)
        # run on a group of their own, never interleaved with the trainer's
        self._group = distributed.side_group()
        if self.own_copy:
            self.engine.between_tokens = self._between_tokens

    # -- what the trainer calls (its thread) -----------------------------------------------
    @property
    def stats(self) -> Any:
        return self.collector.stats

    @property
    def tool_loop(self) -> Any:
        return self.collector.tool_loop

    def sync_weights(self, version: int) -> None:
        """The trainer's weights are now ``version``: snapshot them (for the rollout copy, the
        first call copies every parameter and buffer and later ones the trainable tensors; for
        an engine with its own weights, what its push sends: ``current_weights``) and open the gate
        for the batches that version allows."""
        with torch.no_grad():
            if not self.own_copy:  # what the engine's push sends (full or an adapter)
                tensors = _snapshot(self.engine.current_weights())
            else:  # sharded: gathered, every rank takes part; else the model's own tensors
                with distributed.gathered(self.policy.model):
                    tensors = self._copy(distributed.gathered_state(self.policy.model))
            self._loaded_once = True
        with self._cond:
            pending = self._pending
            if self.own_copy and pending is not None and not pending[1].keys() <= tensors.keys():
                tensors = {**pending[1], **tensors}  # a full snapshot not yet loaded
            self._pending = (version, tensors)
            self._version = version
            self._cond.notify_all()

    def _copy(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Copies of what the rollout copy takes from the trainer's state dict ``state``:
        every parameter and persistent buffer (as ``buffer:NAME``) the first time, the
        trainable parameters later. Non-persistent buffers (not in a state dict) never change:
        the copy has them from :func:`rollout_copy`."""
        if self._loaded_once:
            return {n: state[n].detach().clone() for n in self._trainable}
        out = {n: state[n].detach().clone() for n in self._rollout_params}
        for name in self._rollout_buffers:
            if name in state:
                out[f"buffer:{name}"] = state[name].detach().clone()
        return out

    def start(self, first_step: int, last_step: int) -> None:
        """Start the rollout thread on steps ``first_step … last_step``."""
        if first_step > last_step:
            return
        self._thread = threading.Thread(
            target=self._produce, args=(first_step, last_step), name="mmrft-rollout", daemon=True
        )
        self._thread.start()

    def collect(self, step: int) -> StepBatch:
        """Step ``step``'s batch, waiting for the rollout thread if needed; an error it met
        while collecting this step is raised here. Stale groups are dropped and counted."""
        t0 = time.perf_counter()
        with self._cond:
            while step not in self._ready and self._error is None:
                if self._thread is None or not self._thread.is_alive():
                    raise RuntimeError(f"step {step}: the rollout thread is not running")
                self._cond.wait(timeout=1.0)
            if step not in self._ready:
                raise self._error  # type: ignore[misc]
            batch = self._ready.pop(step)
            idle, self._idle_s = self._idle_s, 0.0
        waited = time.perf_counter() - t0
        current, G = step - 1, self.collector.cfg.rollout.group_size
        versions = batch.rollouts.token_versions or []
        stale = stale_groups(versions, G, current, self.max_staleness)
        if stale:
            log.warning(
                "step %d: %d group(s) sampled more than %d updates ago dropped",
                step,
                len(stale),
                self.max_staleness,
            )
            batch = drop_groups(batch, stale, G)
            versions = batch.rollouts.token_versions or []
        lag_mean, lag_max = lag_stats(versions, current)
        batch.counts.update(
            {
                "rollout/stale_dropped": float(len(stale) * G),
                "rollout/lag_mean": lag_mean,
                "rollout/lag_max": lag_max,
            }
        )
        batch.timings.update({"time/wait_s": waited, "time/rollout_idle_s": idle})
        return batch

    def resume_state(self, step: int) -> dict[str, Any]:
        """The collector's state before it collected step ``step + 1`` (what the checkpoint
        of ``step`` saves; module docstring, Resume), waiting until the rollout thread reaches
        that step; after the last step, its state now."""
        with self._cond:
            while (
                step + 1 not in self._states
                and not self._finished
                and self._error is None
                and self._thread is not None
                and self._thread.is_alive()
            ):
                self._cond.wait(timeout=1.0)
            for old in [s for s in self._states if s <= step]:
                del self._states[old]
            if step + 1 in self._states:
                return self._states[step + 1]
        return self.collector.resume_state(step)

    def close(self) -> None:
        """Stop the rollout thread (between two decode steps, or after its current call), then
        the collector's tool worker."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(JOIN_TIMEOUT_S)
            if self._thread.is_alive():
                log.warning("the rollout thread did not stop in %.0f s", JOIN_TIMEOUT_S)
        self.engine.between_tokens = None
        self.collector.close()

    # -- the rollout thread ------------------------------------------------------------------
    def _produce(self, first_step: int, last_step: int) -> None:
        with distributed.collectives_on(self._group):
            self._produce_steps(first_step, last_step)

    def _produce_steps(self, first_step: int, last_step: int) -> None:
        step = first_step
        try:
            for step in range(first_step, last_step + 1):
                t0 = time.perf_counter()
                with self._cond:
                    while not self._stop and self._version < step - 1 - self.max_staleness:
                        self._cond.wait()
                    if self._stop:
                        return
                    self._idle_s += time.perf_counter() - t0
                self._load_pending()
                state = self.collector.resume_state(step - 1)
                with self._cond:
                    self._states[step] = state
                    self._cond.notify_all()
                started = self.engine.version
                batch = self.collector.collect(step)
                for rollouts in (batch.rollouts, batch.generated):
                    if rollouts.token_versions is None:  # tool rollouts: the batch's start
                        rollouts.token_versions = [
                            [started] * len(i) for i in rollouts.completion_ids
                        ]
                with self._cond:
                    self._ready[step] = batch
                    self._cond.notify_all()
            with self._cond:
                self._finished = True
                self._cond.notify_all()
        except _Stopped:
            return
        except BaseException as exc:  # handed to the trainer, raised where it waits
            log.debug("the rollout thread stopped at step %d: %r", step, exc)
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def _between_tokens(self) -> None:
        if self._stop:
            raise _Stopped
        if self.partial_rollouts:
            self._load_pending()

    def _load_pending(self) -> None:
        """Load the newest snapshot the trainer left, if any, into the rollout copy."""
        with self._cond:
            pending, self._pending = self._pending, None
        if pending is None:
            return
        version, tensors = pending
        if not self.own_copy:
            self.engine.load_weights(list(tensors.items()))
            self.engine.version = version
            return
        with torch.no_grad():
            for name, tensor in tensors.items():
                if name.startswith("buffer:"):
                    self._rollout_buffers[name[len("buffer:") :]].copy_(tensor)
                else:
                    self._rollout_params[name].copy_(tensor)
        self.engine.version = version
