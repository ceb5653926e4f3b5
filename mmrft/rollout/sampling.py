"""Which prompts a step draws: the per-prompt statistics and the sampler plugins.

The collector keeps a :class:`PromptStats` table with one :class:`PromptStat` per training prompt
it has drawn (keyed by sample id) and updates it after every sampling round from the round's
groups (:func:`group_outcome`). Under several processes each rank's outcomes are gathered and
applied in rank order, so every rank holds the same table. The table is part of the checkpoint
and written as ``prompt_stats.jsonl`` next to it.

A sampler (``data.sampler``, registered with :func:`sampler`) decides which prompts the next
round draws: :class:`SampledStream` hands it a :class:`SamplerView` (the statistics, the step,
the data position, the run seed) and takes the indices it returns. A draw is a pure function of
that view, so a resumed run draws what the interrupted one would have, and the ``P × world``
prompts of a round are drawn at once and split into disjoint slices by rank.

Built-ins: ``uniform`` (the seeded epoch order, the default), ``variance`` (MMR1), ``difficulty``
(Time-R1 / ThinkLite-VL online, DAPO's filter across steps) and ``curriculum`` (Platanios et
al. 2019). A user's sampler subclasses :class:`Sampler`, takes keyword-only parameters
(``data.sampler_params``, type-checked at start-up) and implements :meth:`Sampler.weights`
(or :meth:`Sampler.draw` for an order that is not a weighted draw).

A sampler is held to its contract as a verifier is: every number of ``data.sampler_params`` is
checked at start-up (finite, in its range), and a draw that raises, gives weights that are not
one finite number ≥ 0 per training sample, or indices that are not training samples, stops the
run with one line (:class:`SamplerError`: the sampler, the step, the samples) and
``failure.json``.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from mmrft.data import DataError, Sample
from mmrft.plugins import SAMPLERS, UnknownNameError
from mmrft.rewards.answers import extract_answer, normalise_text
from mmrft.typecheck import ConfigError, bind_keyword_params, check_number

# ---------------------------------------------------------------------------------------------
# Per-prompt statistics


@dataclass
class PromptStat:
    """What the run has seen of one prompt.

    Attributes:
        drawn: rounds that drew it (its groups generated, kept or not).
        last_step: the step that drew it last.
        reward: exponential mean over its groups of the group's mean reward (the trained reward,
            shaping included): m ← (1 − α)·m + α·x, the first group's x as is (α = ``data.stats_ema``).
        accuracy: the same exponential mean of the group's mean correctness in [0, 1] (see
            :class:`PromptStats`); ``None`` while no group had a correctness score.
        variance: the population variance of the rewards of its latest group, (1/G)·Σ (r_i − r̄)².
        diversity: distinct answers in its latest group / G, in [1/G, 1]: answers are the
            normalised ``<answer>`` contents (:func:`mmrft.rewards.answers.normalise_text`), every
            completion without one counting as the same answer "".
        discarded: its groups dropped by dynamic sampling (all rewards equal).
    """

    drawn: int = 0
    last_step: int = 0
    reward: float = 0.0
    accuracy: float | None = None
    variance: float = 0.0
    diversity: float = 0.0
    discarded: int = 0


@dataclass
class GroupOutcome:
    """What one group told about its prompt (:func:`group_outcome`)."""

    id: str
    step: int
    reward: float
    accuracy: float | None
    variance: float
    diversity: float
    discarded: bool


def group_outcome(
    sample_id: str,
    step: int,
    rewards: list[float],
    accuracies: list[float | None],
    texts: list[str],
    discarded: bool,
) -> GroupOutcome:
    """The outcome of a group of G completions: mean and population variance of ``rewards``,
    mean of the ``accuracies`` that are not ``None`` (``None`` when all are), and the share of
    distinct normalised answers among ``texts``.

    >>> o = group_outcome("a", 3, [1.0, 0.0, 1.0, 0.0], [1.0, 0.0, None, 0.0],
    ...                   ["<answer>Red</answer>", "<answer>blue</answer>", "red.", "x"], False)
    >>> (o.reward, o.variance, round(o.accuracy, 4), o.diversity)
    (0.5, 0.25, 0.3333, 0.75)
    """
    values = np.asarray(rewards, dtype=np.float64)
    present = [a for a in accuracies if a is not None]
    answers = set()
    for text in texts:
        content, _ = extract_answer(text)
        answers.add(normalise_text(content) if content is not None else "")
    return GroupOutcome(
        id=sample_id,
        step=step,
        reward=float(values.mean()),
        accuracy=float(np.mean(present)) if present else None,
        variance=float(values.var()),
        diversity=len(answers) / len(texts),
        discarded=discarded,
    )


class PromptStats:
    """The per-prompt statistics of a run: sample id → :class:`PromptStat`.

    A completion's correctness, the ``accuracy`` statistic, is the raw score of the run's
    correctness verifier (``data.stats_verifier``; by default the first of the run's verifiers
    other than ``format``: accuracy, iou, ...) normalised to its range, (s − low)/(high − low);
    with ``data.stats_verifier=reward``, or when the run has no verifier besides ``format``, it
    is the total reward normalised to the reward's range and clipped to [0, 1].

    Args:
        ema: α, the weight of the newest group in the exponential means, in (0, 1].
    """

    def __init__(self, ema: float) -> None:
        self.ema = ema
        self.table: dict[str, PromptStat] = {}

    def get(self, sample_id: str) -> PromptStat | None:
        return self.table.get(sample_id)

    def update(self, outcome: GroupOutcome) -> None:
        """Fold one group's outcome into its prompt's statistics."""
        stat = self.table.get(outcome.id)
        first = stat is None
        if stat is None:
            stat = self.table[outcome.id] = PromptStat()
        a = self.ema
        stat.reward = outcome.reward if first else (1 - a) * stat.reward + a * outcome.reward
        if outcome.accuracy is not None:
            old = stat.accuracy
            stat.accuracy = (
                outcome.accuracy if old is None else (1 - a) * old + a * outcome.accuracy
            )
        stat.drawn += 1
        stat.last_step = outcome.step
        stat.variance = outcome.variance
        stat.diversity = outcome.diversity
        stat.discarded += int(outcome.discarded)

    def state_dict(self) -> dict[str, dict[str, Any]]:
        """The table as plain dicts (for the checkpoint)."""
        return {key: asdict(stat) for key, stat in self.table.items()}

    def load_state_dict(self, state: Mapping[str, Mapping[str, Any]]) -> None:
        self.table = {key: PromptStat(**value) for key, value in state.items()}

    def write_jsonl(self, path: Path) -> None:
        """Write one ``{"id", "drawn", "last_step", "reward", "accuracy", "variance",
        "diversity", "discarded"}`` line per prompt, sorted by id, atomically (a temporary file
        renamed over ``path``)."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        with tmp.open("w", encoding="utf-8") as f:
            for key in sorted(self.table):
                f.write(json.dumps({"id": key, **asdict(self.table[key])}) + "\n")
        os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# The prompt source and the sampler API


class PromptSource(Protocol):
    """Which training prompts come next: ``take(count, stats, step)`` returns indices into the
    training samples and advances ``position``, the number of prompts drawn so far; ``bad``
    holds the indices of samples whose media failed when drawn, never drawn again:
    ``index_at(position)`` is the sample drawn at a position of the latest ``take`` given them.
    Both are saved in checkpoints, so a resumed run draws what the interrupted one would have."""

    position: int
    bad: set[int]

    def take(self, count: int, stats: PromptStats | None = None, step: int = 0) -> list[int]: ...

    def index_at(self, position: int) -> int: ...


@dataclass
class DataStream:
    """Prompt order as a pure function of the position and the bad samples: epoch e uses
    permutation(seed + e); a bad sample's place goes to its replacement (:meth:`index_at`).
    The statistics are not looked at (the ``uniform`` sampler's order)."""

    size: int
    seed: int
    position: int = 0
    bad: set[int] = field(default_factory=set)

    def index_at(self, position: int) -> int:
        """The sample drawn at ``position``: entry ``position mod size`` of epoch
        ``position // size``'s permutation or, when that sample is in :attr:`bad`, the first
        sample not in it of a permutation seeded by (seed, position): a pure function of the
        seed, the position and the bad set, so a resume with the saved bad set is exact."""
        epoch, offset = divmod(position, self.size)
        index = int(np.random.default_rng(self.seed + epoch).permutation(self.size)[offset])
        if index not in self.bad:
            return index
        if len(self.bad) >= self.size:
            raise DataError(f"every one of the {self.size} training samples failed to load")
        order = np.random.default_rng([self.seed & 0xFFFFFFFF, position]).permutation(self.size)
        return next(int(i) for i in order if int(i) not in self.bad)

    def take(self, count: int, stats: PromptStats | None = None, step: int = 0) -> list[int]:
        out = [self.index_at(self.position + i) for i in range(count)]
        self.position += count
        return out


@dataclass
class SamplerView:
    """What a sampler decides from: ``count`` prompts for the round that starts at data
    ``position`` of ``step`` (of ``total_steps``), given the statistics, the samples (their ids
    key the statistics, their ``meta`` may hold a difficulty), the bad samples (never drawn)
    and the range [low, high] of the reward."""

    count: int
    position: int
    step: int
    total_steps: int
    seed: int
    samples: list[Sample]
    stats: PromptStats
    bad: set[int]
    reward_range: tuple[float, float]

    def rng(self) -> np.random.Generator:
        """The draw's generator, seeded by (run seed, position): the same on every rank and
        after a resume."""
        return np.random.default_rng([self.seed & 0xFFFFFFFF, self.position, 7])

    def column(self, name: str, unseen: float) -> np.ndarray:
        """One statistic of every sample, in index order (``unseen`` where the prompt was never
        drawn or the statistic is ``None``)."""
        out = np.full(len(self.samples), unseen, dtype=np.float64)
        for i, sample in enumerate(self.samples):
            stat = self.stats.get(sample.id)
            value = getattr(stat, name) if stat is not None else None
            if value is not None:
                out[i] = value
        return out


class SamplerContractError(ValueError):
    """What a sampler gave breaks its contract (:func:`checked_weights`, :func:`checked_indices`);
    ``sample_ids`` are the samples concerned. :class:`SampledStream` turns it into a
    :class:`SamplerError` naming the sampler and the step."""

    def __init__(self, message: str, sample_ids: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.sample_ids = list(sample_ids)


class SamplerError(DataError):
    """A sampler broke its contract while drawing: it raised, or gave weights or indices
    :func:`checked_weights` / :func:`checked_indices` refuse. The message is one line naming
    the sampler, the step and the samples; :meth:`failure` is the ``failure.json`` record.

    Attributes:
        sampler: its name (``data.sampler``).
        step: the training step whose draw failed.
        sample_ids: the samples concerned (those of a bad weight), in order; may be empty.
    """

    def __init__(
        self, message: str, *, sampler: str, step: int, sample_ids: Sequence[str] = ()
    ) -> None:
        self.sampler, self.step = sampler, step
        self.sample_ids = list(dict.fromkeys(sample_ids))
        super().__init__(" ".join(message.split()))  # one line, whatever the plugin's message

    def failure(self) -> dict[str, Any]:
        """The ``failure.json`` record: step, reason, sampler, samples."""
        return {
            "step": self.step,
            "reason": str(self),
            "sampler": self.sampler,
            "samples": self.sample_ids,
        }


def _ids(ids: Sequence[str], most: int = 10) -> str:
    shown = ", ".join(ids[:most])
    return shown + (f" (+{len(ids) - most} more)" if len(ids) > most else "")


def checked_weights(weights: Any, samples: Sequence[Sample]) -> np.ndarray:
    """``weights`` as a float64 array when it holds one finite number ≥ 0 per sample, else a
    :class:`SamplerContractError` naming the samples whose weight is NaN, ±inf or negative
    (a NaN weight once sent the draw into an endless loop; a short array drew only the first
    prompts)."""
    try:
        out = np.asarray(weights, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise SamplerContractError(f"gave weights that are not numbers ({exc})") from None
    if out.ndim != 1 or len(out) != len(samples):
        raise SamplerContractError(
            f"gave weights of shape {out.shape} for {len(samples)} training samples "
            "(one weight per sample)"
        )
    for broken, what in ((~np.isfinite(out), "not finite"), (out < 0, "negative")):
        where = np.flatnonzero(broken)
        if len(where):
            ids = [samples[int(i)].id for i in where]
            raise SamplerContractError(
                f"gave weights that are {what} ({float(out[where[0]])!r} for {len(where)} of "
                f"{len(samples)} samples: {_ids(ids)}); a weight is a finite number ≥ 0",
                ids,
            )
    return out


def checked_indices(drawn: Any, count: int, size: int, bad: set[int]) -> list[int]:
    """The ``count`` indices a draw returned as ints, each a training sample (0 ≤ i <
    ``size``) not in ``bad``, else a :class:`SamplerContractError` (an iterator is read up to
    ``count + 1`` items, so an endless one cannot hang the run)."""
    try:
        items = list(itertools.islice(iter(drawn), count + 1))
    except TypeError:
        raise SamplerContractError(
            f"returned {type(drawn).__name__} {drawn!r:.60}, not a list of sample indices"
        ) from None
    if len(items) != count:
        got = f"{count}+" if len(items) > count else str(len(items))
        raise SamplerContractError(f"returned {got} indices for a round of {count} prompts")
    out = []
    for i in items:
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise SamplerContractError(f"returned {i!r:.60}, not a sample index (an int)")
        if not 0 <= int(i) < size:
            raise SamplerContractError(f"returned index {int(i)}, outside [0, {size - 1}]")
        if int(i) in bad:
            raise SamplerContractError(
                f"returned index {int(i)}, a sample whose media failed (view.bad)"
            )
        out.append(int(i))
    return out


def weighted_draw(
    weights: np.ndarray, count: int, bad: set[int], rng: np.random.Generator
) -> list[int]:
    """``count`` indices drawn without replacement with probability ∝ ``weights`` among the
    samples of positive weight; when those run out the rest come uniformly from the samples of
    weight 0, and only when every sample was drawn does a new pass begin (so a round's prompts
    are distinct whenever the data allows). Bad samples are never drawn. ``weights`` must be
    finite and ≥ 0 (:class:`ValueError` otherwise: a NaN would leave samples in no pool).

    >>> weighted_draw(np.array([0.0, 1.0, 0.0, 2.0]), 3, set(), np.random.default_rng(0))[:2]
    [3, 1]
    """
    weights = np.asarray(weights, dtype=np.float64)
    size = len(weights)
    if weights.ndim != 1 or not np.isfinite(weights).all() or (weights < 0).any():
        raise ValueError("weighted_draw needs one finite weight ≥ 0 per sample")
    usable = np.ones(size, dtype=bool)
    usable[sorted(bad)] = False
    if not usable.any():
        raise DataError(f"every one of the {size} training samples failed to load")
    weights = np.where(usable, weights, 0.0)
    top = weights.max()
    if top > 0:
        weights = weights / top  # the sum of huge weights stays finite
    out: list[int] = []
    while len(out) < count:  # each pass draws ≥ 1: the two pools cover every usable sample
        for weighted, pool in ((True, weights > 0), (False, usable & (weights <= 0))):
            indices = np.flatnonzero(pool)
            k = min(count - len(out), len(indices))
            if k == 0:
                continue
            p = weights[indices] / weights[indices].sum() if weighted else None
            out += [int(i) for i in rng.choice(indices, size=k, replace=False, p=p)]
    return out


class Sampler:
    """A rule for which prompts the next round draws (``data.sampler``). Subclasses take
    keyword-only parameters (``data.sampler_params``) and implement :meth:`weights`, or
    :meth:`draw` for an order that is not a weighted draw. A draw must be a pure function of the
    view (resume and several processes rely on it)."""

    name = ""

    def check(self, samples: list[Sample]) -> None:
        """Start-up checks against the training samples; raise :class:`ConfigError`."""

    def weights(self, view: SamplerView) -> np.ndarray:
        """A non-negative weight per training sample (0 = not now)."""
        raise NotImplementedError

    def draw(self, view: SamplerView) -> list[int]:
        """The round's ``view.count`` indices: :func:`weighted_draw` of :meth:`weights`
        (checked first: :func:`checked_weights`)."""
        weights = checked_weights(self.weights(view), view.samples)
        return weighted_draw(weights, view.count, view.bad, view.rng())


def sampler(name: str) -> Callable[[type[Sampler]], type[Sampler]]:
    """Register a :class:`Sampler` subclass as ``data.sampler: name``."""
    return SAMPLERS.named(name)


@dataclass
class SampledStream:
    """The trainer's prompt source: a :class:`Sampler` drawing from the statistics.

    Args:
        sampler: the rule.
        samples: the training split.
        seed: the run seed (``train.seed``).
        total_steps: ``train.steps`` (the curriculum's default length).
        reward_range: the reward's [low, high].
    """

    sampler: Sampler
    samples: list[Sample]
    seed: int
    total_steps: int
    reward_range: tuple[float, float] = (0.0, 1.0)
    position: int = 0
    bad: set[int] = field(default_factory=set)
    _latest: tuple[dict[int, int], PromptStats, int] = field(
        default_factory=lambda: ({}, PromptStats(1.0), 0), repr=False
    )

    def _view(self, position: int, count: int, stats: PromptStats, step: int) -> SamplerView:
        return SamplerView(
            count, position, step, self.total_steps, self.seed, self.samples, stats, self.bad,
            self.reward_range,
        )  # fmt: skip

    def _draw(self, position: int, count: int, stats: PromptStats, step: int) -> list[int]:
        """The sampler's draw, held to its contract: anything it raises, and weights or
        indices it should not give, become a :class:`SamplerError`."""
        if len(self.bad) >= len(self.samples):
            raise DataError(f"every one of the {len(self.samples)} training samples failed to load")
        name = self.sampler.name or type(self.sampler).__name__
        prompts = f"{count} prompt{'s' * (count != 1)}"
        where = f"at step {step} (a round of {prompts} at data position {position})"
        try:
            drawn = self.sampler.draw(self._view(position, count, stats, step))
            return checked_indices(drawn, count, len(self.samples), self.bad)
        except SamplerContractError as exc:
            ids = exc.sample_ids
            raise SamplerError(
                f"data.sampler '{name}' {where} {exc}", sampler=name, step=step, sample_ids=ids
            ) from None
        except Exception as exc:  # a plugin's own error: one line, as a verifier's
            raise SamplerError(
                f"data.sampler '{name}' {where} raised {type(exc).__name__}: {exc}",
                sampler=name,
                step=step,
            ) from exc

    def take(self, count: int, stats: PromptStats | None = None, step: int = 0) -> list[int]:
        stats = stats if stats is not None else PromptStats(1.0)
        out = self._draw(self.position, count, stats, step)
        self._latest = ({self.position + i: j for i, j in enumerate(out)}, stats, step)
        self.position += count
        return out

    def index_at(self, position: int) -> int:
        """The sample the latest :meth:`take` drew at ``position`` or, when it is bad now, a
        one-prompt draw at that position from the same statistics."""
        drawn, stats, step = self._latest
        index = drawn.get(position)
        if index is not None and index not in self.bad:
            return index
        return self._draw(position, 1, stats, step)[0]


def build_sampler(name: str, params: Mapping[str, Any], samples: list[Sample]) -> Sampler:
    """The sampler ``data.sampler`` names with ``data.sampler_params`` checked against its
    keyword-only parameters, then against the training samples; each error is a
    :class:`ConfigError` naming the key."""
    try:
        cls = SAMPLERS.get(name)
    except UnknownNameError as exc:
        raise ConfigError(f"data.sampler: {exc}") from None
    checked = bind_keyword_params(cls, params, where="data.sampler_params")
    for key, value in checked.items():
        check_finite(value, f"data.sampler_params.{key}")
    try:
        out = cls(**checked)
    except ValueError as exc:  # "floor: must be ≥ 0, ..." names its parameter
        named = re.match(r"[A-Za-z_]\w*: ", str(exc)) is not None
        raise ConfigError(
            f"data.sampler_params.{exc}" if named else f"data.sampler_params: {exc}"
        ) from None
    except Exception as exc:  # a plugin's constructor: one line, not a traceback
        raise ConfigError(
            f"data.sampler: '{name}' raised {type(exc).__name__}: {exc} on its parameters"
        ) from None
    try:
        out.check(samples)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(
            f"data.sampler: '{name}' check() raised {type(exc).__name__}: {exc}"
        ) from None
    return out


def _finite(value: float) -> bool:
    """A finite number that fits a float (``10**400`` does not)."""
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def check_finite(value: Any, key: str, depth: int = 0) -> None:
    """Refuse a NaN or infinite number in a sampler parameter (inside lists and mappings too,
    to 8 levels), naming ``key``."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and not _finite(value):
        raise ConfigError(f"{key}: must be a finite number, got {value!r:.60}")
    if depth < 8 and isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_finite(item, f"{key}[{i}]", depth + 1)
    if depth < 8 and isinstance(value, Mapping):
        for k, item in value.items():
            check_finite(item, f"{key}.{k}", depth + 1)


# ---------------------------------------------------------------------------------------------
# Built-in samplers


@sampler("uniform")
class Uniform(Sampler):
    """Every prompt once per epoch in a seeded random order (:class:`DataStream`: epoch e is
    permutation(seed + e)); the statistics are kept but not used. The default."""

    def draw(self, view: SamplerView) -> list[int]:
        return DataStream(len(view.samples), view.seed, view.position, view.bad).take(view.count)


@sampler("variance")
class Variance(Sampler):
    """MMR1's variance-aware sampling (Leng et al. 2025): prompts whose rollouts disagree carry
    the advantage signal (the expected policy improvement is bounded below by the reward
    variance), so a prompt's weight is its variance promotion score

        w = max(floor, α · Var(r) / Var_max + β · diversity),   Var_max = (high − low)² / 4

    (Var(r) the latest in-group reward variance, whose largest value on [low, high] is
    Var_max: the paper's outcome variance p(1 − p) when the reward is a 0/1 correctness;
    diversity the latest distinct-answer share, standing in for its trajectory diversity), and
    an unseen prompt gets ``unseen`` so that every prompt is tried. As in the paper a share
    1 − λ of the draws stays uniform: P(i) = λ · w_i / Σ w + (1 − λ) / N. Without replacement
    within a round.

    Args:
        variance_weight: α ≥ 0.
        diversity_weight: β ≥ 0.
        floor: smallest weight of a seen prompt (> 0: none starves).
        unseen: weight of a prompt never drawn.
        mix: λ ∈ [0, 1], the share of the probability given by the score (1 = all of it).
    """

    def __init__(
        self,
        *,
        variance_weight: float = 1.0,
        diversity_weight: float = 1.0,
        floor: float = 0.05,
        unseen: float = 1.0,
        mix: float = 1.0,
    ) -> None:
        for key, value in (
            ("variance_weight", variance_weight), ("diversity_weight", diversity_weight),
            ("floor", floor), ("unseen", unseen),
        ):  # fmt: skip
            check_number(key, value, 0)
        check_number("mix", mix, 0, 1)
        self.mix = mix
        self.alpha, self.beta, self.floor, self.unseen = (
            variance_weight, diversity_weight, floor, unseen,
        )  # fmt: skip

    def weights(self, view: SamplerView) -> np.ndarray:
        low, high = view.reward_range
        top = max((high - low) ** 2 / 4, 1e-12)
        seen = view.column("drawn", 0.0) > 0
        score = self.alpha * view.column("variance", 0.0) / top
        score = score + self.beta * view.column("diversity", 0.0)
        weights = np.where(seen, np.maximum(score, self.floor), self.unseen)
        if self.mix == 1 or weights.sum() <= 0:
            return weights
        return self.mix * weights / weights.sum() + (1 - self.mix) / len(weights)


@sampler("difficulty")
class Difficulty(Sampler):
    """Online difficulty filtering (Time-R1's filter of too-easy and too-hard samples,
    ThinkLite-VL's choice of prompts the model neither always nor never solves; DAPO's
    zero-variance filter applied across steps instead of within one): a prompt drawn at least
    ``min_drawn`` times whose accuracy mean is ≤ ``low`` or ≥ ``high`` is set aside (weight
    ``aside_weight``: 0 = not drawn, between 0 and 1 = down-weighted) until ``readmit_after``
    steps have passed since it was last drawn; every other prompt has weight 1.

    Args:
        low / high: the accuracy bounds, 0 ≤ low < high ≤ 1 (accuracy ≤ low: unsolved, ≥ high:
            solved).
        readmit_after: steps after its last draw at which a set-aside prompt may be drawn again.
        min_drawn: draws needed before a prompt can be set aside.
        aside_weight: weight of a set-aside prompt, in [0, 1].
    """

    def __init__(
        self,
        *,
        low: float = 0.05,
        high: float = 0.95,
        readmit_after: int = 10,
        min_drawn: int = 1,
        aside_weight: float = 0.0,
    ) -> None:
        check_number("low", low, 0, 1)
        check_number("high", high, 0, 1)
        if not low < high:
            raise ValueError(f"low: needs 0 ≤ low < high ≤ 1, got low={low}, high={high}")
        check_number("readmit_after", readmit_after, 1, integer=True)
        check_number("min_drawn", min_drawn, 1, integer=True)
        check_number("aside_weight", aside_weight, 0, 1)
        self.low, self.high, self.readmit_after = low, high, readmit_after
        self.min_drawn, self.aside_weight = min_drawn, aside_weight

    def aside(self, view: SamplerView) -> np.ndarray:
        """Which prompts are set aside at ``view.step``."""
        accuracy = view.column("accuracy", 0.5)
        drawn, last = view.column("drawn", 0.0), view.column("last_step", 0.0)
        extreme = (accuracy <= self.low) | (accuracy >= self.high)
        return (drawn >= self.min_drawn) & extreme & (view.step - last < self.readmit_after)

    def weights(self, view: SamplerView) -> np.ndarray:
        return np.where(self.aside(view), self.aside_weight, 1.0)


Schedule = Literal["linear", "step", "competence"]


def curriculum_share(schedule: Schedule, t: int, T: int, c0: float, stages: int = 4) -> float:
    """The share c(t) ∈ [c0, 1] of the easiest prompts open at step t of a curriculum of T steps:
    linear c = c0 + (1 − c0)·t/T; step-wise c = c0 + (1 − c0)·min(⌊S·t/T⌋, S − 1)/(S − 1) with S
    ``stages``; competence (Platanios et al. 2019, square root) c = √(t(1 − c0²)/T + c0²);
    every one is 1 from t = T on.

    >>> round(curriculum_share("competence", 3, 12, 0.5), 4), curriculum_share("step", 6, 12, 0.25, 3)
    (0.6614, 0.625)
    """
    if T <= 0 or t >= T:
        return 1.0
    if schedule == "linear":
        return c0 + (1 - c0) * t / T
    if schedule == "step":
        return c0 + (1 - c0) * min(stages * t // T, stages - 1) / (stages - 1)
    return min(1.0, math.sqrt(t * (1 - c0**2) / T + c0**2))


@sampler("curriculum")
class Curriculum(Sampler):
    """Curriculum over steps (Platanios et al. 2019, competence-based curriculum learning): the
    prompts are ordered from easy to hard, and step t draws uniformly, without replacement,
    from the easiest max(⌈c(t)·N⌉, count) of the N prompts, c(t) the schedule's open share
    (:func:`curriculum_share`); ties in difficulty are broken by a permutation of the run seed.

    Args:
        by: ``meta``: the difficulty is the sample's ``meta[key]`` (a number, higher = harder);
            ``accuracy``: it is 1 − the prompt's accuracy mean (statistics), ``unseen`` for a
            prompt never drawn.
        key: the meta field under ``by=meta``.
        schedule: ``linear``, ``step`` or ``competence``.
        start: c0, the share open at step 0, in (0, 1].
        steps: T, the steps until every prompt is open (0 = ``train.steps``).
        stages: S, the steps of the step-wise schedule (≥ 2).
        unseen: the difficulty of a prompt never drawn under ``by=accuracy``.
    """

    def __init__(
        self,
        *,
        by: Literal["meta", "accuracy"] = "meta",
        key: str = "difficulty",
        schedule: Schedule = "competence",
        start: float = 0.01,
        steps: int = 0,
        stages: int = 4,
        unseen: float = 0.5,
    ) -> None:
        check_number("start", start, 0, 1, open_low=True)
        check_number("steps", steps, 0, integer=True, unit="0 = train.steps")
        check_number("stages", stages, 2, integer=True)
        check_number("unseen", unseen, 0, 1, unit="a difficulty, 1 − accuracy")
        self.by, self.key, self.schedule, self.start = by, key, schedule, start
        self.steps, self.stages, self.unseen = steps, stages, unseen

    def check(self, samples: list[Sample]) -> None:
        if self.by != "meta":
            return
        for sample in samples:
            value = sample.meta.get(self.key)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not _finite(value):  # NaN would sort anywhere
                raise ConfigError(
                    f"data.sampler_params.key: {sample.where or sample.id}: meta.{self.key} "
                    f"should be a finite number (the sample's difficulty), got {value!r:.60}"
                )

    def difficulty(self, view: SamplerView) -> np.ndarray:
        if self.by == "meta":
            return np.array([float(s.meta[self.key]) for s in view.samples])
        return 1.0 - view.column("accuracy", 1.0 - self.unseen)

    def weights(self, view: SamplerView) -> np.ndarray:
        n = len(view.samples)
        share = curriculum_share(
            self.schedule, view.step, self.steps or view.total_steps, self.start, self.stages
        )
        tie = np.random.default_rng(view.seed & 0xFFFFFFFF).permutation(n)
        order = np.lexsort((tie, self.difficulty(view)))  # easiest first
        open_ = order[: max(math.ceil(share * n), view.count)]
        out = np.zeros(n)
        out[open_] = 1.0
        return out
