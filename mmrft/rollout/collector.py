"""The collector: everything that turns the policy into one RL step's training batch.

One step, in the order the code runs (:meth:`Collector.collect`)::

    prompt source ─► engine (G completions per prompt) ─► verifiers ─► group transforms ─► StepBatch
    (data stream)     (mmrft.rollout.Engine)              (reward)       overlong shaping
                                                                         auxiliary rollouts
                                                                         dynamic sampling

1. **draw**: this process's ``train.prompts_per_step / world`` prompts from the prompt source
   (:class:`~mmrft.rollout.sampling.PromptSource`; the trainer's is a ``data.sampler`` drawing from the
   per-prompt statistics, :mod:`mmrft.rollout.sampling`). Every rank draws the whole round's prompts
   from the same statistics and keeps its own slice, so the ranks' prompts are disjoint.
   A sample whose media fail to load when it is drawn (a video cut in half that passed the
   start-up probe) obeys ``data.on_error``: ``skip`` marks it bad, logs it with its
   ``file:line``, counts it and draws its replacement (:meth:`DataStream.index_at`) so the step
   stays full; ``raise`` stops the run with :class:`BadMediaError` (``failure.json`` names it).
2. **generate**: the engine samples ``G = rollout.group_size`` completions per prompt,
   group-contiguous, through the :class:`~mmrft.rollout.Engine` protocol only. With
   ``rollout.perturb.share`` (NoisyRollout, :class:`mmrft.rollout.perturb.NoisyRollout`) ``m`` of the
   ``G`` are sampled on a distorted copy of the prompt's media and the group is assembled with
   every completion pointing at the clean prompt row: they are trained on as the clean ones. With tools
   (``rollout.tools.names``) this is the multi-turn loop (:class:`mmrft.rollout.tool_loop.ToolLoop`):
   turn 1 as above, then every trajectory that called a tool gets the observation appended
   and continues, all of them in one batch per turn, until it answers or a budget ends it.
3. **verify**: the weighted reward of every completion, reasons counted. With an async
   verifier configured (:mod:`mmrft.rewards`, a served judge) and an engine that decodes in
   rounds and reports them (``hf``: ``rollout.batch_size`` < P·G), this overlaps step 2: the
   groups a decode round finishes are scored in the background
   (:meth:`~mmrft.rewards.WeightedReward.submit`) while the next round decodes, and the
   round's reward is assembled from those parts, in group order, before shaping. What is
   sampled is unchanged (same tokens, same random draws); scores are those of one call over
   the batch, except for a verifier that looks across groups without being group-aware (it
   sees one round's groups at a time), and a judge's "every call of a batch failed" counts
   per part. ``time/reward_s`` is then the scoring time left after generation. Without an
   async verifier, or with NoisyRollout, tools or another engine, the batch is scored after
   generation.
4. **shape**: DAPO's overlong penalty, then the auxiliary rollouts: completions sampled on
   perturbed prompts that shape the reward of the real ones without being trained on
   (:class:`AuxiliaryRollouts`; T-GRPO's shuffled frames, :class:`TemporalContrast`, is one).
   Their scores join the reward as named sub-scores (``train/reward/<name>``).
5. **filter**: with dynamic sampling (DAPO) groups whose rewards are all equal carry no
   advantage and are dropped; steps 1–4 repeat on fresh prompts until ``prompts_per_step``
   groups are kept or ``algorithm.max_sampling_tries`` rounds ran.
6. **observe**: after every round each group's outcome (mean reward, correctness, reward
   variance, answer diversity, dropped or not) updates its prompt's statistics
   (:attr:`Collector.stats`); every rank applies every rank's outcomes, in rank order.

The result is a :class:`StepBatch`: the kept groups, everything generated (the reward metrics
are over it, so dropping groups hides nothing), counts and timings.

Two things that could look like collector stages are not: the KL-to-reference reward term
(``algorithm.kl_mode: reward``) needs forward passes of the policy and the reference model, so
the trainer adds it after collection, on the kept groups only; and advantages, which are pure
functions of the kept rewards (:mod:`mmrft.algorithms`), are computed by the trainer too.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import logging
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from mmrft.algorithms import (
    filter_zero_variance_groups,
    overlong_penalty,
    temporal_contrast_bonus,
    temporal_contrast_decided,
)
from mmrft.config import RunConfig, TemporalContrastConfig
from mmrft.data import DataError, Sample, count_skip
from mmrft.data.video import with_shuffled_frames
from mmrft.plugins import did_you_mean
from mmrft.policy.model import Policy
from mmrft.rewards.reward import RewardBreakdown, WeightedReward
from mmrft.rewards.task import Task
from mmrft.rewards.verifier import Score
from mmrft.rollout.base import Engine, Rollouts, Sampling
from mmrft.rollout.perturb import NoisyRollout, prompt_seed
from mmrft.rollout.preflight import configured_environment, configured_tools
from mmrft.rollout.sampling import DataStream as DataStream  # re-exported: the uniform order
from mmrft.rollout.sampling import PromptSource, PromptStats, group_outcome
from mmrft.rollout.tool_loop import LoopLimits, ToolLoop
from mmrft.runtime import distributed
from mmrft.runtime.checkpoint import rng_state, set_rng_state
from mmrft.typecheck import ConfigError

log = logging.getLogger("mmrft")

Conversation = list[dict[str, Any]]


# ---------------------------------------------------------------------------------------------
# What the collector hands the trainer


@dataclass
class StepBatch:
    """The completions one RL step trains on, and what it took to get them.

    Attributes:
        samples / rollouts / rewards: the kept groups, group-contiguous (``rewards`` includes
            the shaping terms).
        generated / generated_samples / scored: every completion sampled this step, kept or
            not, with its sample and reward breakdown (the train/reward metrics are over these,
            so dropping groups hides nothing).
        counts: ``rollout/generated``, ``rollout/kept``, ``rollout/discarded``,
            ``rollout/tries``, and the auxiliary rollouts' metrics.
        timings: ``time/rollout_s`` (generation, auxiliary rollouts included), its breakdown
            where the engine measures one (``time/rollout_encode_s``, ``…_prefill_s``,
            ``…_decode_s``) and ``time/reward_s`` (verifiers and shaping).
    """

    samples: list[Sample]
    rollouts: Rollouts
    rewards: torch.Tensor
    generated: Rollouts
    generated_samples: list[Sample]
    scored: RewardBreakdown
    counts: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Stage 1: which prompts (the prompt source, the samplers and the statistics: mmrft.rollout.sampling)


class BadMediaError(DataError):
    """Media that failed to load when a step drew their sample, under ``data.on_error=raise``.

    Attributes:
        failed: one ``{"index", "id", "where", "error"}`` per failing sample (``index`` into
            the training samples, ``where`` its dataset ``file:line``).
    """

    def __init__(self, message: str, failed: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.failed = failed


# ---------------------------------------------------------------------------------------------
# Stage 4: shaping the reward


@dataclass
class Round:
    """One sampling round of this process: ``len(samples)`` groups of ``G`` completions.

    Attributes:
        samples: one per group; ``positions`` their data positions (for per-prompt seeds).
        conversations: the rendered prompt of each group.
        rollouts / scored: the ``len(samples) × G`` completions and their rewards.
    """

    samples: list[Sample]
    positions: list[int]
    conversations: list[Conversation]
    rollouts: Rollouts
    scored: RewardBreakdown
    group_size: int
    perturbed: list[bool] | None = None
    """Per completion, whether it was sampled on distorted media (NoisyRollout); ``None``
    without ``rollout.perturb``."""

    @property
    def expanded(self) -> list[Sample]:
        """The sample of every completion."""
        return [s for s in self.samples for _ in range(self.group_size)]


def add_shaping(scored: RewardBreakdown, name: str, scores: list[Score | None]) -> None:
    """Add a shaping term to the reward: ``total_i += scores_i`` (``None``: nothing), logged as
    the sub-score ``train/reward/<name>``."""
    scored.scores[name] = scores
    scored.total = [t + s.value if s is not None else t for t, s in zip(scored.total, scores)]


def overlong_scores(
    rollouts: Rollouts, max_new_tokens: int, buffer: int, penalty: float
) -> list[Score | None]:
    """DAPO's soft overlong penalty of every completion (:func:`mmrft.algorithms.overlong_penalty`)."""
    lengths = torch.tensor([len(c) for c in rollouts.completion_ids])
    return [Score(float(p)) for p in overlong_penalty(lengths, max_new_tokens, buffer, penalty)]


@dataclass
class AuxRequest:
    """What an auxiliary stage asks for: ``n`` completions of each of ``conversations`` (one per
    entry of ``groups``, the round's group indices), scored by the run's verifier ``verifier``
    alone (raw score, no weight). ``state`` is the stage's own, handed back to ``shape``."""

    conversations: list[Conversation]
    groups: list[int]
    n: int
    verifier: str
    label: str
    state: Any = None


class AuxiliaryRollouts(Protocol):
    """Completions sampled on perturbed prompts to shape the reward of the real ones, never
    trained on. The collector generates and scores what ``request`` asks for (the engine, the
    time budget and the accounting are the collector's), then adds ``shape``'s per-completion
    scores to the reward as the sub-score ``name``. ``metrics`` reports this step's counts
    and resets them (it may be a collective: every rank calls it once per step)."""

    name: str

    def request(self, rnd: Round) -> AuxRequest: ...

    def shape(
        self, rnd: Round, request: AuxRequest, scores: list[Score | None]
    ) -> list[Score | None]: ...

    def metrics(self) -> dict[str, float]: ...


def shuffle_seed(seed: int, position: int) -> int:
    """The frame-shuffle seed of the prompt drawn at data ``position``: a pure function of the
    run seed and the position, so exact resumes and any world size shuffle alike."""
    return prompt_seed(seed, position)  # NoisyRollout's distortions add the step


class TemporalContrast:
    """T-GRPO (Video-R1, arXiv:2503.21776) as an auxiliary rollout stage.

    For every prompt with a video, ``G'`` (``shuffled_per_prompt``, default ``G // 2`` as
    Video-R1's code) completions are sampled with the same prompt and the video's frames
    shuffled (:func:`mmrft.data.video.with_shuffled_frames`, seeded by the prompt's data position
    through :func:`shuffle_seed`), scored by the correctness verifier alone (a ``None`` score
    counts as its minimum), and :func:`mmrft.algorithms.temporal_contrast_bonus` joins the
    reward as the sub-score ``temporal`` (``None`` for prompts without a video). With
    ``skip_decided`` the groups whose bonus the shuffled completions cannot change
    (:func:`mmrft.algorithms.temporal_contrast_decided`) are not sampled: same rewards, fewer
    completions. Each rank contrasts its own groups.

    Raises :class:`ConfigError` at construction when ``verifier`` is not one of the run's
    verifiers or a verifier is named ``temporal`` (this stage's sub-score).
    """

    name = "temporal"

    def __init__(
        self, tc: TemporalContrastConfig, group_size: int, seed: int, reward: WeightedReward
    ) -> None:
        if tc.verifier not in reward.names:
            raise ConfigError(
                f"algorithm.temporal_contrast.verifier: '{tc.verifier}' is not one of the run's "
                f"verifiers; {did_you_mean(tc.verifier, reward.names)}"
            )
        if self.name in reward.names:
            raise ConfigError(
                "reward.verifiers: a verifier named 'temporal' clashes with the temporal contrast "
                "bonus's sub-score (train/reward/temporal)"
            )
        self.tc = tc
        self.group_size = group_size
        self.seed = seed
        self.n = tc.shuffled_per_prompt or max(1, group_size // 2)
        self.spec = reward.bound(tc.verifier).spec
        self.counts: Counter = Counter()

    def _values(self, scores: list[Score | None]) -> torch.Tensor:
        rows = [s.value if s is not None else self.spec.low for s in scores]
        return torch.tensor(rows, dtype=torch.float64)  # float64: the bonus adds exactly α

    def request(self, rnd: Round) -> AuxRequest:
        tc, G = self.tc, self.group_size
        video = [g for g, s in enumerate(rnd.samples) if s.media("video")]
        ordered = self._values(rnd.scored.scores[tc.verifier]).view(len(rnd.samples), G)[video]
        if tc.skip_decided and video:
            needed = ~temporal_contrast_decided(
                ordered, ratio=tc.ratio, high=self.spec.high, correct_above=tc.correct_above
            )
        else:
            needed = torch.ones(len(video), dtype=torch.bool)
        sampled = needed.nonzero().flatten().tolist()  # rows of `video`
        conversations = [
            with_shuffled_frames(
                rnd.conversations[video[i]], shuffle_seed(self.seed, rnd.positions[video[i]])
            )
            for i in sampled
        ]
        return AuxRequest(
            conversations=conversations,
            groups=[video[i] for i in sampled],
            n=self.n,
            verifier=tc.verifier,
            label="shuffled frames",
            state=(video, ordered, sampled),
        )

    def shape(
        self, rnd: Round, request: AuxRequest, scores: list[Score | None]
    ) -> list[Score | None]:
        tc, G = self.tc, self.group_size
        video, ordered, sampled = request.state
        out: list[Score | None] = [None] * len(rnd.scored.total)
        if not video:
            return out
        # rows not sampled are decided: any scores in [low, high] give the same bonus
        shuffled = torch.full((len(video), self.n), self.spec.low, dtype=torch.float64)
        if sampled:
            shuffled[sampled] = self._values(scores).view(len(sampled), self.n)
            self.counts["generated"] += len(scores)
            self.counts["sampled_groups"] += len(sampled)
            self.counts["ordered_sum"] += float(ordered[sampled].sum())
            self.counts["ordered_n"] += ordered[sampled].numel()
            self.counts["shuffled_sum"] += float(shuffled[sampled].sum())
            self.counts["shuffled_n"] += len(scores)
        bonus = temporal_contrast_bonus(
            ordered, shuffled, ratio=tc.ratio, bonus=tc.bonus, correct_above=tc.correct_above
        ).view(len(video), G)
        self.counts["groups"] += len(video)
        self.counts["bonus_groups"] += int((bonus > 0).any(dim=1).sum())
        for row, g in enumerate(video):
            for j in range(G):
                out[g * G + j] = Score(float(bonus[row, j]))
        return out

    def metrics(self) -> dict[str, float]:
        """This rank's ``rollout/temporal_generated`` (summed over ranks when merged) and, over
        every rank's groups (one collective, identical on every rank):
        ``train/temporal_bonus_rate`` (share of video groups whose correct completions got the
        bonus), and over the groups that got shuffled completions
        ``train/temporal_ordered_accuracy`` and ``train/temporal_shuffled_accuracy`` (mean
        correctness score on ordered / shuffled frames: the gap is how much the policy uses
        the frame order). Resets the counts."""
        counts, self.counts = self.counts, Counter()
        keys = ("groups", "bonus_groups", "ordered_sum", "ordered_n", "shuffled_sum", "shuffled_n")
        totals = [sum(c) for c in zip(*distributed.gather_objects([counts[k] for k in keys]))]
        total = dict(zip(keys, totals))
        out = {"rollout/temporal_generated": float(counts["generated"])}
        if total["groups"]:
            out["train/temporal_bonus_rate"] = total["bonus_groups"] / total["groups"]
        if total["shuffled_n"]:
            out["train/temporal_ordered_accuracy"] = total["ordered_sum"] / total["ordered_n"]
            out["train/temporal_shuffled_accuracy"] = total["shuffled_sum"] / total["shuffled_n"]
        return out


def correctness_verifier(name: str, reward: WeightedReward) -> str | None:
    """The verifier whose score is the correctness of the per-prompt statistics
    (``data.stats_verifier``): ``name``, or when empty the first of the run's verifiers other
    than ``format``; ``None`` (the normalised reward) for ``reward`` or when there is none."""
    if name == "reward":
        return None
    if not name:
        return next((n for n in reward.names if n != "format"), None)
    if name not in reward.names:
        raise ConfigError(
            f"data.stats_verifier: '{name}' is not one of the run's verifiers; "
            f"{did_you_mean(name, [*reward.names, 'reward'])}"
        )
    return name


def build_auxiliaries(cfg: RunConfig, reward: WeightedReward) -> list[AuxiliaryRollouts]:
    """The auxiliary rollout stages the config turns on, checked against the run's verifiers."""
    out: list[AuxiliaryRollouts] = []
    if cfg.algorithm.temporal_contrast.enabled:
        out.append(
            TemporalContrast(
                cfg.algorithm.temporal_contrast, cfg.rollout.group_size, cfg.train.seed, reward
            )
        )
    return out


def build_perturb(cfg: RunConfig, policy: Policy) -> NoisyRollout | None:
    """NoisyRollout's perturbation stage when ``rollout.perturb.share`` > 0, else ``None``
    (the values were checked by :func:`mmrft.config.check_config`). Audio families decode
    audio for ``audio_noise`` through their own loader (the model's rate and length bound)."""
    p = cfg.rollout.perturb
    if p.share <= 0:
        return None
    family, processor = policy.family, getattr(policy, "processor", None)
    load_audio = None
    if callable(getattr(family, "load_audio", None)):

        def load_audio(source: Any) -> np.ndarray:
            return family.load_audio(source, processor)

    return NoisyRollout(p, cfg.rollout.group_size, cfg.train.seed, cfg.train.steps, load_audio)


# ---------------------------------------------------------------------------------------------
# Stage 2 with tools


def build_tool_loop(cfg: RunConfig, policy: Policy, engine: Engine) -> ToolLoop | None:
    """The multi-turn loop ``rollout.tools`` asks for, or ``None`` (no tools named). Start-up
    checks, each a :class:`ConfigError` naming the key: unknown tool names (with the closest
    registered one), an engine without :meth:`~mmrft.rollout.Engine.continue_rows`, a family
    without tool observations, a chat template that cannot render them."""

    tools = cfg.rollout.tools
    enabled = configured_tools(cfg)
    if not enabled:
        return None
    environment = configured_environment(cfg)
    if environment is not None and cfg.warm_start.demonstrations and not environment.demonstration:
        raise ConfigError(
            f"warm_start.demonstrations: environment '{environment.name}' declares no "
            "demonstration (@environment(..., demonstration=...)); set it to false"
        )
    if not callable(getattr(engine, "continue_rows", None)):
        raise ConfigError(
            f"rollout.tools: the '{engine.name}' engine cannot continue trajectories "
            "(it has no continue_rows); use rollout.engine=hf, vllm or vllm_server"
        )
    family = policy.family
    for name, value in (("max_turns", tools.max_turns), ("max_media", tools.max_media)):
        if value < 1:
            raise ConfigError(f"rollout.tools.{name}: must be at least 1, got {value}")
    limits = LoopLimits(tools.max_turns, tools.max_tokens, tools.max_media, tools.max_visual_tokens)
    return ToolLoop(
        family,
        policy.processor,
        enabled,
        limits,
        describe=tools.describe,
        worker_memory_mb=tools.worker_memory_mb,
        environment=environment,
    )


# ---------------------------------------------------------------------------------------------
# Scripted completions (smoke runs)


SCRIPT_MARK = "scripted by mmrft --smoke"
"""The think text of a scripted completion (where the task thinks), so no reader of
``completions.jsonl`` mistakes it for the model's."""


@dataclass(frozen=True)
class Script:
    """What a smoke run (``mmrft train … --smoke``) forces where a tiny model with a few tokens
    never gets: per group, the first completion writes one valid tool call (``tool_call``: the
    first enabled tool with an example for the sample, :meth:`ToolLoop.example_call`), and the
    next one (the first without a call) writes an answer in the task's format (``answer``:
    the reference answer where the task has one) so that a judge, or a verifier that runs code
    in the sandbox, has something to grade. Scripted tokens are
    forced in the engine (:attr:`mmrft.rollout.hf.HFEngine.script`), their log-probs the
    model's; the tool's observation and every later turn are the model's own. Counted as
    ``smoke/scripted`` (completions), ``smoke/scripted_answers`` and ``smoke/scripted_calls``
    (their tool calls, each marked ``"scripted": true`` in its trajectory's record)."""

    tool_call: bool = False
    answer: bool = False
    max_tokens: int = 512
    """Longest script (tokens; the bundled charts' reference programs are 380–500); a longer
    call or answer is not scripted (the engine scores a script in one forward pass, its length
    a context the tiny models hold)."""


_SCRIPT: Script | None = None


@contextmanager
def scripted(script: Script) -> Iterator[None]:
    """Collectors built inside this block script ``script`` (the smoke run's ``train`` call;
    nothing scripts outside it)."""
    global _SCRIPT
    before, _SCRIPT = _SCRIPT, script
    try:
        yield
    finally:
        _SCRIPT = before


# ---------------------------------------------------------------------------------------------
# The collector


@dataclass
class Scoring:
    """Groups of a round submitted for scoring while the engine generates (the overlap)."""

    groups: list[int]
    future: concurrent.futures.Future


def reports_groups(engine: Engine) -> bool:
    """Whether ``engine.generate`` takes ``on_groups`` (:data:`mmrft.rollout.base.GroupsDone`)."""
    try:
        return "on_groups" in inspect.signature(engine.generate).parameters
    except (TypeError, ValueError):
        return False


class Collector:
    """Draws, generates, verifies, shapes and filters one step's groups (module docstring).

    Args:
        samples: the training split (indices of ``source`` point into it).
        auxiliaries: auxiliary rollout stages (:func:`build_auxiliaries`).

    Attributes:
        stats: the per-prompt statistics (:class:`~mmrft.rollout.sampling.PromptStats`), the same on
            every rank; the prompt source draws from them, the trainer checkpoints them.
    """

    def __init__(
        self,
        cfg: RunConfig,
        task: Task,
        policy: Policy,
        engine: Engine,
        reward: WeightedReward,
        samples: list[Sample],
        source: PromptSource,
        auxiliaries: list[AuxiliaryRollouts] | None = None,
    ) -> None:
        self.cfg = cfg
        self.task = task
        self.policy = policy
        self.engine = engine
        self.reward = reward
        self.samples = samples
        self.source = source
        self.auxiliaries = auxiliaries or []
        rollout = cfg.rollout
        self.sampling = Sampling(
            rollout.max_new_tokens,
            rollout.temperature,
            rollout.top_p,
            rollout.top_k,
            min_p=rollout.min_p,
            repetition_penalty=rollout.repetition_penalty,
            ignore_eos=rollout.ignore_eos,
        )
        self.tool_loop = build_tool_loop(cfg, policy, engine)
        self.perturb = build_perturb(cfg, policy)
        self.stats = PromptStats(cfg.data.stats_ema)
        self.correctness = correctness_verifier(cfg.data.stats_verifier, reward)
        self.overlap = reward.is_async and reports_groups(engine)
        """Score the groups of each decode round while the next one decodes (module docstring,
        step 3): only with an async verifier, on an engine that reports its rounds."""
        self.script = _SCRIPT if getattr(engine, "scriptable", False) else None
        """What this collector scripts (:class:`Script`; inside :func:`scripted` only)."""
        # scripted completions, answers and calls since the step began
        self.script_counts: Counter = Counter()

    def sync_weights(self, version: int) -> None:
        """The trainer's weights are now ``version`` (RL updates included): an engine with its
        own copy reloads them (:meth:`Engine.sync_weights`)."""
        self.engine.sync_weights()

    def start(self, first_step: int, last_step: int) -> None:
        """Nothing runs ahead: every step is collected when the trainer asks for it."""

    def resume_state(self, step: int) -> dict[str, Any]:
        """What a checkpoint after ``step`` keeps of the collector: the data position, the
        samples whose media failed, the prompt statistics and the random state (this process's;
        the trainer gathers every rank's)."""
        return {
            "data_position": self.source.position,
            "bad_samples": sorted(self.source.bad),  # media that failed when drawn: never again
            "prompt_stats": self.stats.state_dict(),  # the same on every rank
            "rng": rng_state(),
        }

    def close(self) -> None:
        """Stop the tool worker process, if one started; nothing else runs in the background."""
        if self.tool_loop is not None:
            self.tool_loop.close()

    def collect(self, step: int) -> StepBatch:
        """This process's share of step ``step``'s batch (collective under several processes:
        every rank runs as many rounds)."""
        # sharded: every rank gathers the parameters, then generates with no collective
        with distributed.gathered(self.policy.model):
            return self._collect(step)

    def _collect(self, step: int) -> StepBatch:
        algo, G = self.cfg.algorithm, self.cfg.rollout.group_size
        P = self.cfg.train.prompts_per_step // distributed.world_size()  # this rank's groups
        kept_samples: list[Sample] = []
        kept = Rollouts()
        kept_rewards: list[torch.Tensor] = []
        generated = Rollouts()
        generated_samples: list[Sample] = []
        breakdowns: list[RewardBreakdown] = []
        reward_seconds = 0.0
        rounds = algo.max_sampling_tries if algo.dynamic_sampling else 1
        tries = 0
        for tries in range(1, rounds + 1):  # noqa: B007 (the count is reported)
            rnd, seconds = self._round(step, P)
            reward_seconds += seconds
            rewards = torch.tensor(rnd.scored.total, dtype=torch.float32)
            generated.extend(rnd.rollouts)
            generated_samples += rnd.expanded
            breakdowns.append(rnd.scored)
            keep = (
                filter_zero_variance_groups(rewards, G)
                if algo.dynamic_sampling
                else torch.ones(P, dtype=torch.bool)
            )
            self.observe(rnd, keep if algo.dynamic_sampling else None, step)
            for group in keep.nonzero().flatten().tolist()[: P - len(kept_samples) // G]:
                indices = list(range(group * G, (group + 1) * G))
                kept_samples += [rnd.samples[group]] * G
                kept.extend(rnd.rollouts.select(indices))
                kept_rewards.append(rewards[indices])
            # collective: every rank draws another round while any rank still needs groups
            if distributed.sum_scalar(float(len(kept_samples) < P * G)) == 0:
                break
        if not kept_samples:
            log.warning(
                "step %d: every group had equal rewards in %d tries; nothing to train on",
                step,
                tries,
            )
        counts = {
            "rollout/generated": float(len(generated.texts)),
            "rollout/kept": float(len(kept_samples)),
            "rollout/discarded": float(len(generated.texts) - len(kept_samples)),
            "rollout/tries": float(tries),
        }
        for aux in self.auxiliaries:
            counts.update(aux.metrics())
        if self.perturb is not None:
            counts.update(self.perturb.metrics())
        if self.tool_loop is not None:
            counts.update(self.tool_loop.metrics())
        if self.script is not None:
            counts["smoke/scripted"] = float(self.script_counts["completions"])
            counts["smoke/scripted_calls"] = float(self.script_counts["calls"])
            counts["smoke/scripted_answers"] = float(self.script_counts["answers"])
            self.script_counts.clear()
        return StepBatch(
            samples=kept_samples,
            rollouts=kept,
            rewards=torch.cat(kept_rewards) if kept_rewards else torch.zeros(0),
            generated=generated,
            generated_samples=generated_samples,
            scored=RewardBreakdown.concat(breakdowns),
            counts=counts,
            timings={
                "time/rollout_s": generated.seconds,
                **{f"time/rollout_{k}": v for k, v in generated.timings.items()},
                "time/reward_s": reward_seconds,
            },
        )

    def _round(self, step: int, P: int) -> tuple[Round, float]:
        """Stages 1–4 on ``P`` fresh prompts of this rank; returns the round and the seconds
        spent verifying and shaping. Samples whose media fail to load are dropped and replaced
        (:meth:`_drop_bad`) and the generation runs again from the same random state."""
        world, rank = distributed.world_size(), distributed.rank()
        first = self.source.position + rank * P  # data position of this rank's first prompt
        # every rank draws the same prompts from the same statistics and keeps its slice
        drawn = self.source.take(P * world, self.stats, step)
        indices = drawn[rank * P : (rank + 1) * P]
        positions = list(range(first, first + P))
        G = self.cfg.rollout.group_size
        while True:
            samples = [self.samples[i] for i in indices]
            conversations = [self.task.prompt(s, self.policy.family) for s in samples]
            if self.tool_loop is not None:
                conversations = [
                    self.tool_loop.with_tools(c, s) for c, s in zip(conversations, samples)
                ]
            before = rng_state()
            failed: list[dict[str, Any]] = []
            perturbed: list[bool] | None = None
            parts: list[Scoring] | None = None  # the groups scored while generating
            script = self._script(samples, G) if self.perturb is None else {}
            if script:
                self.engine.script = {i: ids for i, (ids, _) in script.items()}  # type: ignore[attr-defined]
            try:
                if self.perturb is not None:
                    noisy = self.perturb.generate(
                        self.engine,
                        conversations,
                        positions,
                        [s.id for s in samples],
                        step,
                        self.sampling,
                    )
                    rollouts, perturbed = noisy.rollouts, noisy.perturbed
                elif self.tool_loop is not None:
                    rollouts = self.tool_loop.run(
                        self.engine, conversations, samples, G, self.sampling
                    )
                elif self.overlap:
                    rollouts, parts = self._generate_scoring(conversations, samples, step)
                else:
                    rollouts = self.engine.generate(conversations, G, self.sampling)
            except DataError as exc:
                failed = self._failing(indices, conversations, exc)
            # collective: every rank learns every bad sample, so the shared order stays shared
            every = distributed.gather_objects(failed)
            failed = list({f["index"]: f for part in every for f in part}.values())
            if not failed:
                break
            self._drop_bad(failed, step)
            set_rng_state(before)  # the retry samples as if the bad samples were known
            indices = [self.source.index_at(p) for p in positions]
        self._mark_scripted(rollouts, script)
        t0 = time.perf_counter()
        rnd = Round(
            samples=samples,
            positions=list(range(first, first + P)),
            conversations=conversations,
            rollouts=rollouts,
            scored=self._score(rollouts, samples, step, parts),
            group_size=G,
            perturbed=perturbed,
        )
        algo = self.cfg.algorithm
        if algo.overlong_buffer:
            add_shaping(
                rnd.scored,
                "overlong",
                overlong_scores(
                    rollouts,
                    self.cfg.rollout.max_new_tokens,
                    algo.overlong_buffer,
                    algo.overlong_penalty,
                ),
            )
        seconds = time.perf_counter() - t0
        for aux in self.auxiliaries:
            seconds += self.run_auxiliary(aux, rnd, step)
        if self.perturb is not None and rnd.perturbed is not None:
            self.perturb.observe(rnd.scored.total, rnd.perturbed)
        return rnd, seconds

    def _script(self, samples: list[Sample], G: int) -> dict[int, tuple[list[int], str]]:
        """The scripted completions of a round (:class:`Script`): completion index →
        (forced token ids, ``"call"`` or ``"answer"``); empty when nothing is scripted."""
        script = self.script
        if script is None:
            return {}
        tokenizer = self.policy.tokenizer
        think = (
            f"<think>{SCRIPT_MARK}</think>" if getattr(self.task, "think", "none") != "none" else ""
        )
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        stops = list(getattr(self.engine, "stop_ids", []))
        if end not in stops and stops:
            end = stops[0]
        out: dict[int, tuple[list[int], str]] = {}
        for g, sample in enumerate(samples):
            first = g * G
            if script.tool_call and self.tool_loop is not None:
                call = self.tool_loop.example_call(sample)
                if call is not None:
                    ids = tokenizer.encode(think + call, add_special_tokens=False)
                    if self.tool_loop.tool_call_token is None:
                        ids.append(end)  # the call ends the turn
                    if len(ids) <= script.max_tokens:
                        out[first] = (ids, "call")
            member = first + int(first in out)
            if script.answer and member < first + G:
                try:
                    reference = str(self.task.reference_answer(sample))
                except Exception:  # a task without reference answers (e.g. free captions)
                    reference = "an answer"
                text = f"{think}<answer>{reference}</answer>"
                ids = tokenizer.encode(text, add_special_tokens=False) + [end]
                if len(ids) <= script.max_tokens:
                    out[member] = (ids, "answer")
        return out

    def _mark_scripted(self, rollouts: Rollouts, script: dict[int, tuple[list[int], str]]) -> None:
        """Count the round's scripted completions and mark the tool calls of their scripted
        first turns ``"scripted": true`` in the trajectories' records."""
        self.script_counts["completions"] += len(script)
        self.script_counts["answers"] += sum(kind == "answer" for _, kind in script.values())
        if rollouts.trajectories is None:
            return
        for i, (_, kind) in script.items():
            turns = rollouts.trajectories[i].turns
            if kind == "call" and turns:
                for call in turns[0].calls:
                    call["scripted"] = True
                    self.script_counts["calls"] += 1

    def _generate_scoring(
        self, conversations: list[Conversation], samples: list[Sample], step: int
    ) -> tuple[Rollouts, list[Scoring]]:
        """``engine.generate`` with each decode round's finished groups submitted for scoring
        in the background (:meth:`WeightedReward.submit`) while the next round decodes."""
        G = self.cfg.rollout.group_size
        parts: list[Scoring] = []

        def on_groups(groups: list[int], texts: list[str]) -> None:
            expanded = [samples[g] for g in groups for _ in range(G)]
            future = self.reward.submit(texts, expanded, context=f"at step {step}", group_size=G)
            parts.append(Scoring(groups, future))

        rollouts = self.engine.generate(conversations, G, self.sampling, on_groups=on_groups)
        return rollouts, parts

    def _score(
        self, rollouts: Rollouts, samples: list[Sample], step: int, parts: list[Scoring] | None
    ) -> RewardBreakdown:
        """The round's reward: one call over the batch, or (``parts``, the overlap) the parts
        scored during generation joined in group order, and the groups the engine did not
        report scored now."""
        G = self.cfg.rollout.group_size
        expanded = [s for s in samples for _ in range(G)]
        context = f"at step {step}"
        if parts is None:
            return self.reward(
                rollouts.texts,
                expanded,
                context=context,
                trajectories=rollouts.trajectories,
                group_size=G,
            )
        joined: list[RewardBreakdown] = []
        done = 0  # groups joined so far
        for part in parts:
            if part.groups != list(range(done, done + len(part.groups))):
                raise RuntimeError(
                    f"engine '{self.engine.name}' reported groups {part.groups} after {done} "
                    "groups (on_groups must report consecutive groups in order)"
                )
            joined.append(part.future.result())
            done += len(part.groups)
        if done < len(samples):
            rest = rollouts.texts[done * G :]
            joined.append(self.reward(rest, expanded[done * G :], context=context, group_size=G))
        return RewardBreakdown.concat(joined)

    def observe(self, rnd: Round, passed: torch.Tensor | None, step: int) -> None:
        """Update :attr:`stats` with the outcome of each group of the round on every rank
        (collective: one gather; every rank applies all outcomes in rank order). ``passed``:
        which groups dynamic sampling keeps (``None``: no filter)."""
        G = rnd.group_size
        accuracies = self.accuracies(rnd.scored)
        outcomes = [
            group_outcome(
                sample.id,
                step,
                rnd.scored.total[g * G : (g + 1) * G],
                accuracies[g * G : (g + 1) * G],
                rnd.rollouts.texts[g * G : (g + 1) * G],
                discarded=passed is not None and not bool(passed[g]),
            )
            for g, sample in enumerate(rnd.samples)
        ]
        for part in distributed.gather_objects(outcomes):
            for outcome in part:
                self.stats.update(outcome)

    def accuracies(self, scored: RewardBreakdown) -> list[float | None]:
        """Each completion's correctness in [0, 1] (:class:`~mmrft.rollout.sampling.PromptStats`): the
        correctness verifier's score normalised to its range, or the total reward normalised to
        the reward's range (clipped) when there is none; ``None`` where the verifier gave none."""
        if self.correctness is None:
            low, high = self.reward.range
            span = max(high - low, 1e-12)
            return [min(max((t - low) / span, 0.0), 1.0) for t in scored.total]
        spec = self.reward.bound(self.correctness).spec
        span = max(spec.high - spec.low, 1e-12)
        return [
            (s.value - spec.low) / span if s is not None else None
            for s in scored.scores[self.correctness]
        ]

    def _failing(
        self, indices: list[int], conversations: list[Conversation], exc: DataError
    ) -> list[dict[str, Any]]:
        """The drawn samples whose media fail to load, each prepared alone (only after a
        generation failed, so the usual path costs nothing); ``exc`` again when none fails
        alone (the failure is not a sample's)."""
        family, processor = self.policy.family, self.policy.processor
        failed = []
        for index, conversation in zip(indices, conversations):
            try:
                family.prepare(processor, [conversation])
            except DataError as error:
                sample = self.samples[index]
                failed.append(
                    {"index": index, "id": sample.id, "where": sample.where, "error": str(error)}
                )
        if not failed:
            raise exc
        return failed

    def _drop_bad(self, failed: list[dict[str, Any]], step: int) -> None:
        """Mark the failing samples bad in the prompt source, log each with its dataset line
        and count it; under ``data.on_error=raise`` stop with :class:`BadMediaError`."""
        first = failed[0]
        if self.cfg.data.on_error == "raise":
            raise BadMediaError(
                f"{first['where'] or first['id']}: {first['error']} (drawn at step {step}; "
                "data.on_error=skip skips and replaces such samples)",
                failed,
            )
        for bad in failed:
            self.source.bad.add(bad["index"])
            count_skip("media failed when drawn")
            log.warning(
                "step %d: skipped %s (sample %s): %s; a replacement is drawn",
                step,
                bad["where"] or "?",
                bad["id"],
                bad["error"],
            )

    def run_auxiliary(self, aux: AuxiliaryRollouts, rnd: Round, step: int) -> float:
        """Generate and score what ``aux`` requests, add its shaping term to the round's reward;
        the generation time counts as rollout time, the returned seconds as verification."""
        request = aux.request(rnd)
        scores: list[Score | None] = []
        seconds = 0.0
        if request.conversations:
            generated = self.engine.generate(request.conversations, request.n, self.sampling)
            rnd.rollouts.seconds += generated.seconds
            t0 = time.perf_counter()
            expanded = [rnd.samples[g] for g in request.groups for _ in range(request.n)]
            scores = self.reward.score_one(
                request.verifier,
                generated.texts,
                expanded,
                context=f"at step {step} ({request.label})",
                group_size=request.n,
            )
            seconds = time.perf_counter() - t0
        add_shaping(rnd.scored, aux.name, aux.shape(rnd, request, scores))
        return seconds
