"""Video question answering: multiple choice and numeric answers (Video-R1, SEED-Bench-R1).

Each sample has its own problem type (``meta["problem_type"]``), read per sample everywhere:
in the prompt, the reward (the accuracy verifier's ``auto`` mode) and the evaluation. Video-R1's
reward reads the type of the *first* sample of a batch for the whole batch (docs/reference.md
pitfall 8); here a batch may mix types freely.

* ``"multiple choice"``: ``meta["choices"]`` lists the option texts in the data's order and the
  target is the correct option's text. The prompt lists the options lettered (``A. left``) and
  asks for the letter; an answer names one option by its letter or its text
  (:func:`mmrft.rewards.answers.match_choice`; several options, or a first-letter guess such as
  "A dog", score 0).
* ``"numerical"``: no choices; the target is a number (or a numeral string). The answer must
  state exactly one number (:func:`mmrft.rewards.answers.parse_number`), equal to the target.

Dataset formats:

* ``mmrft``: the project JSONL with a video (or image) part and the question text::

      {"id": "video_direction-test-0000",
       "messages": [{"role": "user", "content": [
           {"type": "video", "video": "videos/test-0000.mp4"},
           {"type": "text", "text": "Which direction does the green circle move?"}]}],
       "target": "left",
       "meta": {"choices": ["right", "up", "left", "down"], "duration": 4.0}}

  The type is ``meta.problem_type`` when given, else ``"multiple choice"`` when there are
  choices and ``"numerical"`` otherwise.
* ``video_r1``: Video-R1's JSON list (``Video-R1-260k.json``)::

      [{"problem_id": 0, "problem": "Which direction does the green circle move?",
        "data_type": "video", "problem_type": "multiple choice",
        "options": ["A. right", "B. up", "C. left", "D. down"],
        "solution": "<answer>C</answer>", "path": "./videos/test-0000.mp4",
        "data_source": "..."}, ...]

  ``path`` is relative to the task parameter ``media_root`` (Video-R1's data root; default: the
  JSON file's folder); ``data_type`` ``"image"`` items become image samples. ``options`` must be
  lettered ``A.``, ``B.``, … in order; the letter in ``solution`` picks the target. Types other
  than ``multiple choice`` and ``numerical`` (Video-R1's ``OCR``, ``free-form``,
  ``regression``) are refused with a DataError naming the item's line, so
  ``data.on_error=skip`` drops and counts them. Sample ids are ``<file stem>-<index>`` (the
  item's 0-based position; ``problem_id`` is not unique across Video-R1's sources, it is kept
  in ``meta["problem_id"]``).

This module also holds :func:`user_turn`, the one-turn message builder the other media tasks
share; the JSON-list reader and the raise / skip-and-count loop they use are
:func:`mmrft.data.iter_json_list` and :func:`mmrft.data.collect_samples`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from mmrft.data import (
    DataError,
    OnError,
    ReadStats,
    Sample,
    normalise_messages,
    read_json_list,
    require_fields,
    string_field,
)
from mmrft.rewards.answers import choice_index, extract_answer, is_number_literal, parse_number
from mmrft.rewards.task import (
    LETTERS,
    EvalRecord,
    ExampleData,
    Task,
    ThinkMode,
    check_choices,
    choice_chance,
    correct_choice,
    evaluate_choice,
    evaluate_number,
    lettered_choices,
    task,
)

PROBLEM_TYPES = ("multiple choice", "numerical")
"""The problem types this task scores (Video-R1's names)."""

_OPTION = re.compile(r"\s*([A-Z])\s*[.):]\s*(.*\S)\s*", re.DOTALL)


# -- shared readers ----------------------------------------------------------------------------
def user_turn(kind: str, source: str, text: str, root: Path, where: str) -> list[dict[str, Any]]:
    """One user turn ``[media, text]`` with the media path resolved against ``root``."""
    return normalise_messages(
        [
            {
                "role": "user",
                "content": [{"type": kind, kind: source}, {"type": "text", "text": text}],
            }
        ],
        root,
        where,
    )


def problem_type(sample: Sample) -> str:
    """The sample's own type: ``meta["problem_type"]``, else ``"multiple choice"`` when it has
    ``meta["choices"]`` and ``"numerical"`` otherwise."""
    kind = sample.meta.get("problem_type")
    if kind is None:
        kind = "multiple choice" if sample.meta.get("choices") is not None else "numerical"
    return kind


def _number(value: Any) -> int | float:
    number = float(value) if not isinstance(value, str) else parse_number(value)[0]
    assert number is not None
    return int(number) if number.is_integer() else number


# -- the task ----------------------------------------------------------------------------------
@task("video_qa")
class VideoQATask(Task):
    """Multiple-choice or numeric questions about a video (or an image), typed per sample.

    Template fields: ``{question}`` (the question; for multiple choice followed by the lettered
    options and "Answer with the option's letter from the given choices.", for numerical
    questions by "Answer with a number (e.g., 42 or 3.14).") and ``{format_instruction}``.
    Reward: format + accuracy in ``auto`` mode (weights 1, 1): choice matching where the sample
    has choices, number equality where its target is a number — decided per sample. Metric:
    ``accuracy`` (0/1 per sample, primary); chance = uniform guessing over the options that
    occur as targets (:func:`mmrft.rewards.task.uniform_target_chance`) when every sample is multiple
    choice, else undefined.
    """

    template = "{question}\n{format_instruction}"
    primary_metric = "accuracy"
    # Video-R1 mixes problem types; its benchmarks report each source apart
    category_keys = ("problem_type", "data_source", "category")
    formats = ("mmrft", "video_r1")
    example_data: ClassVar[ExampleData] = {
        "mmrft": ("video_direction/train.jsonl", "video_direction/test.jsonl", {}),
        "video_r1": (
            "video_direction/video_r1_train.json",
            "video_direction/video_r1_test.json",
            {"media_root": "video_direction"},
        ),
    }

    def __init__(
        self,
        *,
        think: ThinkMode = "required",
        template: str | None = None,
        media_root: str | None = None,
    ) -> None:
        """
        Args:
            think: whether the answer format asks for a ``<think>`` block first (Video-R1:
                required).
            template: replaces the prompt template (same fields).
            media_root: folder the ``video_r1`` format's ``path`` values are relative to
                (Video-R1's data root); default: the JSON file's folder. The ``mmrft`` format
                always resolves media against its JSONL file.
        """
        super().__init__(think=think, template=template)
        self.media_root = media_root

    # -- data ---------------------------------------------------------------------------------
    def read_format(
        self, path: Path, fmt: str, on_error: OnError, check: Callable[[Sample], None] | None
    ) -> tuple[list[Sample], ReadStats]:
        """Read ``path`` in this task's other formats (module docstring)."""
        if fmt == "video_r1":
            root = Path(self.media_root).expanduser() if self.media_root else path.parent

            def parse(record: Any, where: str, sample_id: str) -> Sample:
                return self._parse_video_r1(record, root, where, sample_id)

            return read_json_list(path, parse, on_error, check)
        return super().read_format(path, fmt, on_error, check)

    def parse_record(self, record: Any, base: Path, where: str) -> Sample:
        sample = super().parse_record(record, base, where)
        if not (sample.media("video") or sample.media("image")):
            raise DataError(f"{where}: a video QA sample needs a video (or image) part")
        choices = sample.meta.get("choices")
        kind = problem_type(sample)
        if kind not in PROBLEM_TYPES:
            raise DataError(
                f"{where}: meta.problem_type {kind!r} is not one of {', '.join(PROBLEM_TYPES)}"
            )
        if kind == "multiple choice":
            check_choices(choices, where, most=len(LETTERS))
            if choice_index(sample.target, choices) is None:
                raise DataError(f"{where}: target {sample.target!r} is not one of meta.choices")
        else:
            if choices is not None:
                raise DataError(f"{where}: a numerical question has no meta.choices")
            if not is_number_literal(sample.target):
                raise DataError(f"{where}: target must be a number, got {sample.target!r}")
        sample.meta["problem_type"] = kind
        return sample

    def _parse_video_r1(self, record: Any, root: Path, where: str, sample_id: str) -> Sample:
        record = require_fields(record, ("problem", "problem_type", "solution", "path"), where)
        kind = record["problem_type"]
        if kind not in PROBLEM_TYPES:
            raise DataError(
                f"{where}: problem_type {kind!r} is not supported "
                f"(video_qa reads {' and '.join(repr(t) for t in PROBLEM_TYPES)})"
            )
        problem = string_field(record, "problem", where)
        source = string_field(record, "path", where)
        data_type = record.get("data_type", "video")
        if data_type not in ("video", "image"):
            raise DataError(f"{where}: data_type must be 'video' or 'image', got {data_type!r}")
        solution, reason = extract_answer(str(record["solution"]))
        if solution is None:
            raise DataError(f"{where}: 'solution' has no single <answer> block ({reason})")
        meta: dict[str, Any] = {"problem_type": kind}
        if kind == "multiple choice":
            options = record.get("options")
            if not isinstance(options, list) or not 2 <= len(options) <= len(LETTERS):
                raise DataError(f"{where}: 'options' must list 2 to 26 lettered options")
            choices = []
            for i, option in enumerate(options):
                m = _OPTION.fullmatch(option) if isinstance(option, str) else None
                if m is None or m.group(1) != LETTERS[i]:
                    raise DataError(
                        f"{where}: options[{i}] must read '{LETTERS[i]}. <text>', got {option!r}"
                    )
                choices.append(m.group(2))
            picked = choice_index(solution, [LETTERS[i] for i in range(len(choices))])
            if picked is None:
                raise DataError(f"{where}: solution {solution!r} is not an option letter")
            meta["choices"] = choices
            target: Any = choices[picked]
        else:
            if not is_number_literal(solution):
                raise DataError(f"{where}: solution {solution!r} is not a number")
            target = _number(solution)
        for key in ("problem_id", "data_source"):
            if key in record:
                meta[key] = record[key]
        messages = user_turn(data_type, source, problem, root, where)
        return Sample(id=sample_id, messages=messages, target=target, meta=meta)

    # -- prompts ------------------------------------------------------------------------------
    def question(self, sample: Sample) -> str:
        """The question, then the lettered options and the letter request (multiple choice) or
        the number request (numerical), by this sample's own type."""
        text = sample.text()
        if problem_type(sample) == "numerical":
            return f"{text}\nAnswer with a number (e.g., 42 or 3.14)."
        listed = lettered_choices(sample.meta["choices"])
        return (
            f"{text}\nOptions:\n{listed}\nAnswer with the option's letter from the given choices."
        )

    # -- rewards and metrics --------------------------------------------------------------------
    def default_verifiers(self) -> list[dict[str, Any]]:
        return self.format_and("accuracy", {"mode": "auto"})

    def reference_answer(self, sample: Sample) -> str:
        """The correct option's letter (multiple choice) or the number (numerical)."""
        if problem_type(sample) == "numerical":
            return str(_number(sample.target))
        return LETTERS[correct_choice(sample)]

    def evaluate_one(self, completion: str, sample: Sample) -> EvalRecord:
        """Strict parse by the sample's type: exactly one answer block naming exactly one option
        (multiple choice; ``parsed`` the option text) or stating exactly one number (numerical;
        ``parsed`` the number).

        Value ``accuracy`` = 1 when correct, else 0. Reasons when nothing usable was read: the
        answer-tag reasons, ``no option matched``, ``several options``, ``no number``,
        ``several numbers``; a wrong answer has none.
        """
        if problem_type(sample) != "numerical":
            return evaluate_choice(completion, sample)
        return evaluate_number(completion, sample, _number(sample.target))

    def chance(self, samples: list[Sample]) -> float | None:
        """Uniform guessing among each sample's options that are the target of some sample
        of the split (:func:`mmrft.rewards.task.uniform_target_chance`) when every sample is multiple
        choice; ``None`` otherwise."""
        if not samples or any(problem_type(s) == "numerical" for s in samples):
            return None
        return choice_chance(samples)
