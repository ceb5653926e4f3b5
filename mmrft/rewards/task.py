"""The task-adapter API.

A task turns a dataset into :class:`~mmrft.data.Sample` s, owns the prompt template (with the
model family's coordinate convention), names its default verifiers with weights, and its
evaluation metrics. Built-in tasks live in the repository's ``tasks/`` folder (shipped as
``mmrft.tasks``) and register themselves exactly like a user's task::

    @task("my_task")
    class MyTask(Task):
        template = "{question}\\n{format_instruction}"
        def default_verifiers(self): return [{"name": "format"}, {"name": "accuracy"}]
        def evaluate_one(self, completion, sample): ...

Prompt templates are ``str.format`` strings with the fields ``{question}`` (the text of the
sample's last user turn), ``{format_instruction}`` (how to lay out think/answer tags) and, for
box tasks, ``{box_instruction}`` (the model family's coordinate convention).
"""

from __future__ import annotations

import logging
import string
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from mmrft.data import (
    LAYOUTS,
    STANDARD_FIELDS,
    DataError,
    OnError,
    ReadStats,
    Sample,
    parse_mmrft_record,
    read_records,
    record_layout,
)
from mmrft.plugins import TASKS
from mmrft.rewards.answers import (
    choice_index,
    extract_answer,
    match_choice,
    normalise_text,
    parse_number,
)
from mmrft.typecheck import ConfigError, bind_keyword_params

if TYPE_CHECKING:
    from mmrft.models.family import ModelFamily

log = logging.getLogger(__name__)

ThinkMode = Literal["required", "optional", "none"]
ExampleData = dict[str, tuple[str, str, dict[str, str]]]
"""Bundled data of a task per format: (train, test, folder parameters), see ``Task.example_data``."""

FORMAT_INSTRUCTIONS: dict[str, str] = {
    "required": (
        "First think about the question inside <think> </think> tags, then give the final "
        "answer inside <answer> </answer> tags."
    ),
    "optional": (
        "You may think inside <think> </think> tags first; give the final answer inside "
        "<answer> </answer> tags."
    ),
    "none": "Give only the final answer inside <answer> </answer> tags.",
}


@dataclass
class EvalRecord:
    """The evaluation of one completion.

    Attributes:
        id: the sample id.
        completion: the model's text.
        parsed: the answer as the strict evaluation parser read it (``None`` if unparsable).
        score: the task's primary per-sample metric (accuracy 0/1, IoU, ...).
        reason: why nothing usable was parsed (``"no answer tag"``, ...), else ``None``.
        values: every per-sample metric; the benchmark result is the mean of each.
        trajectory: a tool rollout's record turn by turn (:meth:`Trajectory.to_json`), when
            the evaluation ran the tool loop; ``completion`` is then its last turn.
        target: the sample's ground truth (set by :func:`mmrft.evaluation.evaluate.evaluate`).
    """

    id: str
    completion: str
    parsed: Any
    score: float
    reason: str | None = None
    values: dict[str, float] = field(default_factory=dict)
    trajectory: dict[str, Any] | None = None
    target: Any = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "id": self.id,
            "target": self.target,
            "completion": self.completion,
            "parsed": self.parsed,
            "score": self.score,
            "reason": self.reason,
            **self.values,
        }
        if self.trajectory is not None:
            out["trajectory"] = self.trajectory
        return out


class Task:
    """Base class of task adapters; subclasses set the class attributes and override hooks.

    Class attributes:
        name: registry name (set by ``@task``).
        template: the prompt template (see the module docstring).
        primary_metric: the key of :attr:`EvalRecord.values` reported as *the* metric.
        category_keys: ``meta`` keys whose values split the evaluation into categories
            reported apart (:meth:`categories`); default ``("category",)``.
        example_data: bundled data of the task, per format: ``(train, test, params)`` with
            paths relative to the checkout's ``assets/benchmarks`` and ``params`` the task
            parameters naming its folders; ``mmrft train CONFIG --smoke`` runs on it when the
            config's data is not on this machine (:mod:`mmrft.smoke`).
        scored_by_reward: the task has no metric of its own; its evaluation reports the
            weighted reward of the configured verifiers as ``reward`` (the ``prompt`` task).
        formats: the task's own dataset formats, read by :meth:`read_format`, besides the
            layouts every task reads (:data:`mmrft.data.LAYOUTS`: ``"mmrft"``, the project
            records or any layout through ``data.fields``, and ``"conversations"``).
    """

    name: ClassVar[str] = ""
    template: ClassVar[str] = "{question}\n{format_instruction}"
    primary_metric: ClassVar[str] = "accuracy"
    category_keys: ClassVar[tuple[str, ...]] = ("category",)
    example_data: ClassVar[ExampleData] = {}
    formats: ClassVar[tuple[str, ...]] = ("mmrft",)
    scored_by_reward: ClassVar[bool] = False
    system_prompt: str = ""  # set by build_task from task.system_prompt

    def __init__(self, *, think: ThinkMode = "required", template: str | None = None) -> None:
        """
        Args:
            think: whether the answer format asks for a ``<think>`` block first. Small models
                often do better answering directly (R1-V, R1-AQA, CLS-RL), hence ``"none"``.
            template: replaces the task's prompt template (same fields); the escapes ``\\n``
                and ``\\t`` typed as two characters (a shell or a single-quoted YAML string
                keeps them so) become a newline and a tab.
        """
        self.think = think
        if template is not None:
            template = template.replace("\\n", "\n").replace("\\t", "\t")
            self.template = template  # type: ignore[misc]
        try:
            self.template.format(question="", format_instruction="", box_instruction="")
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(f"task '{self.name}'.template: bad template field {exc}") from None

    # -- data ---------------------------------------------------------------------------------
    def read(
        self,
        path: str | Path,
        fmt: str = "mmrft",
        on_error: OnError = "raise",
        check: Callable[[Sample], None] | None = None,
        *,
        fields: dict[str, str] | None = None,
        media_root: str | Path | None = None,
    ) -> tuple[list[Sample], ReadStats]:
        """Read a dataset in format ``fmt``.

        The layouts every task reads (``mmrft``, ``conversations``) come from any container
        (:func:`mmrft.data.iter_records`: JSON lines, a JSON list, parquet, a ``datasets``
        directory), each record made a project record (through ``fields`` when given) and
        parsed by :meth:`parse_record`, media relative to ``media_root`` (default: the file's
        folder). A task's own formats (:attr:`formats`) go to :meth:`read_format`."""
        if fmt in LAYOUTS:
            try:
                layout = record_layout(fmt, fields)
            except DataError as exc:
                raise ConfigError(str(exc)) from None
            parse = self.parse_record
            if layout is not None:

                def parse(record: Any, base: Path, where: str) -> Sample:
                    return self.parse_record(layout(record, base, where), base, where)

            return read_records(path, parse, on_error=on_error, check=check, media_root=media_root)
        if fmt not in self.formats:
            known = ", ".join(dict.fromkeys([*LAYOUTS, *self.formats]))
            raise ConfigError(f"data.format: task '{self.name}' reads {known}, not '{fmt}'")
        if fields:
            raise ConfigError(
                f"data.fields: the mapping reads flat records (data.format mmrft), not '{fmt}'"
            )
        return self.read_format(Path(path), fmt, on_error, check)

    def read_format(
        self, path: Path, fmt: str, on_error: OnError, check: Callable[[Sample], None] | None
    ) -> tuple[list[Sample], ReadStats]:
        """Read a format other than ``mmrft`` (tasks that list more :attr:`formats`)."""
        raise NotImplementedError(f"task '{self.name}' lists format '{fmt}' but cannot read it")

    def parse_record(self, record: Any, base: Path, where: str) -> Sample:
        """One project-JSONL line → Sample; tasks extend it to validate their targets (raise
        :class:`~mmrft.data.DataError` naming ``where``). A record without a target is
        refused unless the task is :attr:`scored_by_reward`."""
        sample = parse_mmrft_record(record, base, where)
        if sample.target is None and not self.scored_by_reward:
            raise DataError(
                f"{where}: no answer (task '{self.name}' needs one: a column "
                f"{'/'.join(STANDARD_FIELDS['answer'])}, data.fields answer, or the record's "
                "'target'; task.name=prompt trains on prompts and reward functions alone)"
            )
        return sample

    # -- prompts ------------------------------------------------------------------------------
    def format_instruction(self) -> str:
        return FORMAT_INSTRUCTIONS[self.think]

    def question(self, sample: Sample) -> str:
        """The ``{question}`` field: the text of the sample's last user turn (tasks may add to it,
        e.g. the list of options)."""
        return sample.text()

    def prompt(self, sample: Sample, family: ModelFamily) -> list[dict[str, Any]]:
        """The chat messages sent to the model: the sample's messages with the last user
        turn's text replaced by the filled template (media parts kept, in order), after a
        system message of :attr:`system_prompt` when one is set and the sample has none."""
        text = self.template.format(
            question=self.question(sample),
            format_instruction=self.format_instruction(),
            box_instruction=family.box_instruction,
        ).strip()
        messages = [dict(m) for m in sample.messages]
        for i in range(len(messages) - 1, -1, -1):
            if messages[i]["role"] == "user":
                content = messages[i]["content"]
                media = (
                    [p for p in content if p.get("type") != "text"]
                    if isinstance(content, list)
                    else []
                )
                messages[i] = {"role": "user", "content": [*media, {"type": "text", "text": text}]}
                break
        if self.system_prompt and not any(m.get("role") == "system" for m in messages):
            system = {"type": "text", "text": self.system_prompt}
            messages.insert(0, {"role": "system", "content": [system]})
        return messages

    # -- rewards and metrics --------------------------------------------------------------------
    def default_verifiers(self) -> list[dict[str, Any]]:
        """``[{"name", "weight", "params"}]`` used when the config names no verifiers."""
        return self.format_and("accuracy")

    def format_and(self, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The default verifiers of most tasks: ``format`` (in this task's think mode) and the
        verifier ``name`` with ``params``, weights 1 and 1."""
        return [
            {"name": "format", "weight": 1.0, "params": {"think": self.think}},
            {"name": name, "weight": 1.0, "params": params or {}},
        ]

    def reference_answer(self, sample: Sample) -> str:
        """The text a correct answer puts inside the answer tags (used by the warm start)."""
        raise NotImplementedError(f"task '{self.name}' defines no reference answer")

    def evaluate_one(self, completion: str, sample: Sample) -> EvalRecord:
        """Strictly parse and score one completion (greedy evaluation)."""
        raise NotImplementedError

    def evaluate(self, completions: list[str], samples: list[Sample]) -> list[EvalRecord]:
        return [self.evaluate_one(c, s) for c, s in zip(completions, samples)]

    def aggregate(self, records: list[EvalRecord]) -> dict[str, float]:
        """Mean of every per-sample value, plus ``format_fail`` (share with a parse reason)."""
        if not records:
            return {}
        keys = sorted({k for r in records for k in r.values})
        out = {k: sum(r.values.get(k, 0.0) for r in records) / len(records) for k in keys}
        out["format_fail"] = sum(r.reason is not None for r in records) / len(records)
        return out

    def categories(
        self, records: list[EvalRecord], samples: list[Sample]
    ) -> dict[str, dict[str, dict[str, float]]]:
        """Per-category results, the way benchmarks with categories are reported: for each of
        :attr:`category_keys` that some sample's ``meta`` holds, and each of its values, the
        :meth:`aggregate` of that value's records with ``primary`` and ``samples`` (their
        number) added. Samples without the key are left out of its split."""
        out: dict[str, dict[str, dict[str, float]]] = {}
        for key in self.category_keys:
            groups: dict[str, list[EvalRecord]] = {}
            for record, sample in zip(records, samples):
                value = sample.meta.get(key)
                if value is not None and not isinstance(value, (list, dict)):
                    groups.setdefault(str(value), []).append(record)
            if groups:
                out[key] = {}
                for value, members in sorted(groups.items()):
                    metrics = self.aggregate(members)
                    metrics["primary"] = metrics.get(self.primary_metric, float("nan"))
                    out[key][value] = {**metrics, "samples": float(len(members))}
        return out

    def chance(self, samples: list[Sample]) -> float | None:
        """Expected primary metric of a guess that ignores the media, when it is defined (else
        ``None``). Tasks with a closed answer set use :func:`uniform_target_chance`: uniform
        guessing over the sample's options that are the target of some sample of the split."""
        return None


def uniform_target_chance(
    samples: list[Sample],
    options: Callable[[Sample], tuple[Iterable[Hashable], Hashable]],
) -> float | None:
    """Chance of a split: the expected accuracy of guessing uniformly among the answers that
    can actually be correct, knowing nothing of the media.

    ``options(sample)`` gives the sample's distinct answers (hashable keys: normalised option
    texts, counts) and its correct one. With T = {correct answer of s : s in samples} (the
    answers that occur as targets in the split) and O_s the options of sample s::

        chance = (1 / N) · Σ_s 1 / |O_s ∩ T|

    (the target of s is always in O_s ∩ T, so each term is the probability that a uniform
    draw from O_s ∩ T is right). This is what a policy reaches that has learnt the answer
    format and which answers ever occur, but not the media — the level the random-label warm
    start is meant to leave. Options that are never correct do not dilute it: audio_pitch
    lists 4 options but only "rising" / "falling" are targets, so its chance is 1/2, not 1/4.
    When the split's targets are balanced over T (every bundled benchmark), it equals the
    accuracy of the best constant answer in expectation; it is not inflated, as the best
    constant answer measured on the split is, by the sampling noise of a small split's class
    frequencies (a split whose targets are very unbalanced makes a constant answer a stronger
    baseline than this). ``None`` for no samples, and for a split whose samples all have the
    same answer (a tiny or filtered split: "chance 1.0" would say nothing about the task).

    >>> s = [Sample("a", [], "x", {}), Sample("b", [], "y", {})]
    >>> uniform_target_chance(s, lambda x: (["x", "y", "z", "w"], x.target))
    0.5
    """
    if not samples:
        return None
    keyed = [options(s) for s in samples]
    targets = {correct for _, correct in keyed}
    if len(targets) < 2:
        return None
    total = 0.0
    for answers, correct in keyed:
        possible = set(answers) & targets
        possible.add(correct)
        total += 1.0 / len(possible)
    return total / len(samples)


def choice_chance(samples: list[Sample]) -> float | None:
    """:func:`uniform_target_chance` of multiple-choice samples: the options are
    ``meta["choices"]`` (compared by normalised text, so a split whose options come in
    different orders, or a target written as a letter, counts each option once)."""

    def options(sample: Sample) -> tuple[list[str], str]:
        choices = [normalise_text(c) for c in sample.meta["choices"]]
        return choices, choices[correct_choice(sample)]

    return uniform_target_chance(samples, options)


# -- multiple choice: what the choice-QA tasks share ----------------------------------------------
LETTERS = string.ascii_uppercase
"""The option letters, ``A`` for the first option (at most 26 options can be lettered)."""


def check_choices(
    choices: Any, where: str, what: str = "meta.choices", most: int | None = None
) -> list[str]:
    """``choices`` if it lists at least 2 (and at most ``most``) non-empty option strings, else
    a DataError ``"<where>: <what> must list at least 2 option strings"`` (``2 to <most>``)."""
    if not (
        isinstance(choices, list)
        and len(choices) >= 2
        and (most is None or len(choices) <= most)
        and all(isinstance(c, str) and c.strip() for c in choices)
    ):
        count = "at least 2" if most is None else f"2 to {most}"
        raise DataError(f"{where}: {what} must list {count} option strings")
    return choices


def check_choice_target(target: Any, choices: list[str], where: str) -> None:
    """A DataError unless ``target`` is a string naming one of ``choices``
    (:func:`~mmrft.rewards.answers.choice_index`: the option's text, or its letter)."""
    if not isinstance(target, str) or choice_index(target, choices) is None:
        raise DataError(f"{where}: target {target!r} is not one of meta.choices")


def lettered_choices(choices: list[str]) -> str:
    """The options one a line, lettered: ``A. red\nB. green``."""
    return "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(choices))


def correct_choice(sample: Sample) -> int:
    """The 0-based index of the sample's correct option in ``meta["choices"]``; ValueError when
    its target names none."""
    index = choice_index(sample.target, sample.meta["choices"])
    if index is None:
        raise ValueError(f"sample '{sample.id}': target {sample.target!r} is not an option")
    return index


def evaluate_choice(completion: str, sample: Sample, metric: str = "accuracy") -> EvalRecord:
    """Strict parse of a multiple-choice answer: exactly one answer block naming exactly one
    option of ``meta["choices"]`` (its letter or its text,
    :func:`~mmrft.rewards.answers.match_choice`).

    Value ``metric`` = 1 for the correct option, else 0. Reasons when no single option was
    named: the answer-tag reasons, ``no option matched``, ``several options``; a wrong option
    has none. ``parsed`` is the named option's text.
    """
    choices = sample.meta["choices"]
    answer, reason = extract_answer(completion)
    picked = None
    if answer is not None:
        picked, reason = match_choice(answer, choices)
    if picked is None:
        return EvalRecord(sample.id, completion, None, 0.0, reason, {metric: 0.0})
    correct = float(picked == choice_index(sample.target, choices))
    return EvalRecord(sample.id, completion, choices[picked], correct, None, {metric: correct})


def evaluate_number(
    completion: str, sample: Sample, expected: float, metric: str = "accuracy"
) -> EvalRecord:
    """Strict parse of a numeric answer: exactly one answer block stating exactly one number
    (:func:`~mmrft.rewards.answers.parse_number`).

    Value ``metric`` = 1 if that number equals ``expected``, else 0. Reasons for no number: the
    answer-tag reasons, ``no number``, ``several numbers``; a wrong number has none.
    ``parsed`` is the number (an int when whole).
    """
    answer, reason = extract_answer(completion)
    value = None
    if answer is not None:
        value, reason = parse_number(answer)
    if value is None:
        return EvalRecord(sample.id, completion, None, 0.0, reason, {metric: 0.0})
    parsed = int(value) if value.is_integer() else value
    correct = float(value == expected)
    return EvalRecord(sample.id, completion, parsed, correct, None, {metric: correct})


class ChoiceTask(Task):
    """Base of the tasks whose every sample picks one option of ``meta["choices"]`` (the target
    is the option's text, or its letter); subclasses check their samples and write the prompt.

    Reward: format + accuracy in choice mode (weights 1, 1). Evaluation:
    :func:`evaluate_choice` into :attr:`primary_metric`. Reference answer: the correct option's
    text, or its letter when :attr:`lettered`. Chance: :func:`choice_chance`.
    """

    lettered: bool = False
    """Whether the prompt letters the options and asks for the letter."""

    def default_verifiers(self) -> list[dict[str, Any]]:
        return self.format_and("accuracy", {"mode": "choice"})

    def reference_answer(self, sample: Sample) -> str:
        """The correct option's text, or its letter when :attr:`lettered`."""
        index = correct_choice(sample)
        return LETTERS[index] if self.lettered else sample.meta["choices"][index]

    def evaluate_one(self, completion: str, sample: Sample) -> EvalRecord:
        """Strict parse: exactly one answer block naming exactly one option (letter or text),
        :func:`evaluate_choice`.

        Value :attr:`primary_metric` = 1 for the correct option, else 0. Reasons when no single
        option was named: the answer-tag reasons, ``no option matched``, ``several options``; a
        wrong option has none. ``parsed`` is the named option's text.
        """
        return evaluate_choice(completion, sample, self.primary_metric)

    def chance(self, samples: list[Sample]) -> float | None:
        """Uniform guessing among each sample's options that are the target of some sample
        of the split (:func:`choice_chance`); ``None`` for no samples."""
        return choice_chance(samples)


def task(name: str) -> Callable[[type[Task]], type[Task]]:
    """Register a :class:`Task` subclass under ``name``."""

    def register(cls: type[Task]) -> type[Task]:
        if not (isinstance(cls, type) and issubclass(cls, Task)):
            raise TypeError(f"@task('{name}') decorates a Task subclass, got {cls!r}")
        return TASKS.named(name)(cls)

    return register


def read_split(
    task: Task,
    family: ModelFamily,
    path: str | Path,
    *,
    fmt: str = "mmrft",
    on_error: OnError = "raise",
    limit: int | None = None,
    fields: dict[str, str] | None = None,
    media_root: str | Path | None = None,
) -> list[Sample]:
    """Read a dataset split, check every line and its media, and annotate the samples.

    Each line is parsed by the task and each local media file checked by the model family
    (:meth:`ModelFamily.check_media`: images decoded, videos probed, audio decoded by the
    audio families), so a missing or corrupt file stops the read with one message naming the
    dataset's ``file:line`` and the media path (``data.on_error="skip"``: skipped and
    counted). Only the family adapter is needed (``mmrft.policy.resolve_family``), not the
    model: call this before loading any weights, so that a data error costs seconds, not a
    model load. ``limit`` keeps the first samples; no usable sample is a DataError. ``fields``
    and ``media_root``: ``data.fields`` and ``data.media_root`` (:meth:`Task.read`).
    """
    # the layout keys only when set, so that a task overriding read() with the older
    # signature keeps working
    layout = {k: v for k, v in (("fields", fields), ("media_root", media_root)) if v}
    samples, stats = task.read(path, fmt=fmt, on_error=on_error, check=family.check_media, **layout)
    log.info(stats.summary())
    if not samples:
        raise DataError(f"{path}: no usable samples ({stats.summary()})")
    samples = samples[:limit] if limit else samples
    for sample in samples:
        family.annotate(sample)
    return samples


def build_task(
    name: str,
    params: dict[str, Any] | None = None,
    system_prompt: str = "",
    sources: dict[str, str] | None = None,
) -> Task:
    """Instantiate the registered task ``name`` with type-checked ``params``; ``system_prompt``
    (``task.system_prompt``) goes before every prompt it builds (:meth:`Task.prompt`). A param
    the task refuses is named with where it was set, from ``sources``
    (``TaskConfig.param_sources``: ``configs/demo.yaml: task.params.think``)."""
    try:
        cls = TASKS.get(name)
    except KeyError as exc:
        raise ConfigError(f"task.name: {exc}") from None
    bound: dict[str, Any] = {}
    for key, value in (params or {}).items():
        try:
            bound.update(bind_keyword_params(cls, {key: value}, where=f"task '{name}'"))
        except ConfigError as exc:
            source = (sources or {}).get(key)
            raise ConfigError(f"{exc} (set by {source})" if source else str(exc)) from None
    built = cls(**bound)
    built.system_prompt = system_prompt
    return built
