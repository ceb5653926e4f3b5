"""Audio question answering with the options as text (R1-AQA, Omni-R1; MMAU).

A sample holds one audio clip and a question; ``meta["choices"]`` lists the option texts in the
data's order (never shuffled) and the target is the correct option's *text*. As in R1-AQA the
prompt lists the options as a Python list and the answer is the option's text::

    How does the pitch of the tone change? Please choose the answer from the following
    options: ['falling', 'rising', 'steady', 'rising then falling'].

An answer names one option by its text (normalised equality) or its letter
(:func:`mmrft.rewards.answers.match_choice`); an answer naming several options (``rising or
falling``, every option listed) scores 0, and substrings never count (docs/reference.md pitfall 3:
Omni-R1's "contains the correct option" reward is hackable that way).

**Think mode.** R1-AQA trains Qwen2-Audio-7B-Instruct *without* a think block: its prompt ends
"Output the final answer in <answer> </answer>." and its format reward wants
``<answer>…</answer>`` alone, which did better than forced thinking for that small an audio
model. This task keeps the framework's default (``think: required``); set
``task.params.think: none`` to train the R1-AQA way (``configs/recipes/r1_aqa.yaml`` does).

Dataset formats:

* ``mmrft``: the project JSONL with an audio part, ``meta.choices`` and the target text::

      {"id": "audio_pitch-test-0000",
       "messages": [{"role": "user", "content": [
           {"type": "audio", "audio": "audio/test-0000.wav"},
           {"type": "text", "text": "How does the pitch of the tone change?"}]}],
       "target": "falling",
       "meta": {"choices": ["falling", "rising", "steady", "rising then falling"]}}

* ``r1_aqa``: R1-AQA's training JSONL (its converted AVQA lines)::

      {"id": 0, "question_text": "How does the pitch of the tone change?",
       "multi_choice": ["falling", "rising", "steady", "rising then falling"],
       "answer": 0, "dataset_name": "AVQA", "audio_path": "audio/test-0000.wav"}

  ``answer`` is the correct option's 0-based index (R1-AQA's loader writes
  ``<answer>multi_choice[answer]</answer>`` as the solution). As R1-AQA's loader does, an
  ``AVQA`` line's question has "video" replaced by "audio" (AVQA was written for videos; the
  model hears only the soundtrack). Sample ids are the ``id`` field.
* ``mmau``: MMAU's benchmark file (``mmau-test-mini.json``), one JSON list::

      [{"id": "...", "audio_id": "./audio/test-0000.wav", "question": "...",
        "choices": ["falling", "rising", ...], "answer": "falling", "task": "sound",
        "category": "...", "sub-category": "...", "difficulty": "easy", ...}, ...]

  ``answer`` is the option text. MMAU's unanswered ``test`` split (scored by its server) has
  no ``answer`` and is refused. ``task``, ``category``, ``sub-category``, ``difficulty``,
  ``split`` and ``dataset`` are kept in ``meta``.

In both peer formats the audio paths are relative to the task parameter ``audio_root``
(default: the annotation file's folder).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from mmrft.tasks.video_qa import user_turn

from mmrft.data import (
    DataError,
    OnError,
    ReadStats,
    Sample,
    read_json_list,
    read_records,
    require_fields,
    string_field,
)
from mmrft.rewards.answers import choice_index
from mmrft.rewards.task import (
    ChoiceTask,
    ExampleData,
    ThinkMode,
    check_choice_target,
    check_choices,
    task,
)

MMAU_META = ("task", "category", "sub-category", "difficulty", "split", "dataset")
"""MMAU fields kept in ``meta`` (for per-category breakdowns)."""


@task("audio_qa")
class AudioQATask(ChoiceTask):
    """Pick one option of ``meta["choices"]`` about an audio clip; the target is the option text.

    Template fields: ``{question}`` (the question followed by "Please choose the answer from the
    following options: [...]." as in R1-AQA) and ``{format_instruction}``. Reward: format +
    accuracy in choice mode (weights 1, 1; exact option text or letter, several options 0).
    Metric: ``accuracy`` (0/1 per sample, primary); chance = uniform guessing
    over the options that occur as targets (:func:`mmrft.rewards.task.uniform_target_chance`:
    0.5 on the bundled pitch benchmark, whose four options hold only two correct answers).
    The reference answer is the correct option's text (R1-AQA's ``<answer>`` content).
    """

    template = "{question}\n{format_instruction}"
    primary_metric = "accuracy"
    # MMAU reports accuracy per sound / music / speech ("task") and per difficulty
    category_keys = ("task", "difficulty", "category")
    formats = ("mmrft", "r1_aqa", "mmau")
    example_data: ClassVar[ExampleData] = {
        "mmrft": ("audio_pitch/train.jsonl", "audio_pitch/test.jsonl", {}),
        "r1_aqa": (
            "audio_pitch/r1_aqa_train.jsonl",
            "audio_pitch/r1_aqa_test.jsonl",
            {"audio_root": "audio_pitch"},
        ),
        "mmau": (
            "audio_pitch/mmau_test.json",
            "audio_pitch/mmau_test.json",
            {"audio_root": "audio_pitch"},
        ),
    }

    def __init__(
        self,
        *,
        think: ThinkMode = "required",
        template: str | None = None,
        audio_root: str | None = None,
    ) -> None:
        """
        Args:
            think: whether the answer format asks for a ``<think>`` block first; R1-AQA uses
                ``none`` (see the module docstring).
            template: replaces the prompt template (same fields).
            audio_root: folder the ``r1_aqa`` / ``mmau`` audio paths are relative to; default:
                the annotation file's folder. The ``mmrft`` format always resolves media
                against its JSONL file.
        """
        super().__init__(think=think, template=template)
        self.audio_root = audio_root

    # -- data ---------------------------------------------------------------------------------
    def read_format(
        self, path: Path, fmt: str, on_error: OnError, check: Callable[[Sample], None] | None
    ) -> tuple[list[Sample], ReadStats]:
        """Read ``path`` in this task's other formats (module docstring)."""
        root = Path(self.audio_root).expanduser() if self.audio_root else path.parent
        if fmt == "r1_aqa":

            def parse_line(record: Any, base: Path, where: str) -> Sample:
                return self._parse_r1_aqa(record, root, where)

            return read_records(path, parse_line, on_error=on_error, check=check)
        if fmt == "mmau":

            def parse_item(record: Any, where: str, sample_id: str) -> Sample:
                return self._parse_mmau(record, root, where)

            return read_json_list(path, parse_item, on_error, check)
        return super().read_format(path, fmt, on_error, check)

    def parse_record(self, record: Any, base: Path, where: str) -> Sample:
        sample = super().parse_record(record, base, where)
        if not sample.media("audio"):
            raise DataError(f"{where}: an audio QA sample needs an audio part")
        choices = check_choices(sample.meta.get("choices"), where, "'meta.choices'")
        check_choice_target(sample.target, choices, where)
        return sample

    def _parse_r1_aqa(self, record: Any, root: Path, where: str) -> Sample:
        record = require_fields(
            record, ("id", "question_text", "multi_choice", "answer", "audio_path"), where
        )
        question = string_field(record, "question_text", where)
        audio = string_field(record, "audio_path", where)
        choices = check_choices(record["multi_choice"], where, "'multi_choice'")
        answer = record["answer"]
        if not (
            isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < len(choices)
        ):
            raise DataError(
                f"{where}: 'answer' must be the index of an option (0–{len(choices) - 1}), "
                f"got {answer!r}"
            )
        meta: dict[str, Any] = {"choices": choices}
        if "dataset_name" in record:
            meta["dataset"] = record["dataset_name"]
        if record.get("dataset_name") == "AVQA":
            question = question.replace("video", "audio")
        messages = user_turn("audio", audio, question, root, where)
        return Sample(str(record["id"]), messages, target=choices[answer], meta=meta)

    def _parse_mmau(self, record: Any, root: Path, where: str) -> Sample:
        record = require_fields(record, ("id", "audio_id", "question", "choices"), where)
        if "answer" not in record:
            raise DataError(
                f"{where}: missing field 'answer' (MMAU's test split is scored by its server; "
                "use test-mini)"
            )
        question = string_field(record, "question", where)
        audio = string_field(record, "audio_id", where)
        choices = check_choices(record["choices"], where, "'choices'")
        answer = record["answer"]
        if not isinstance(answer, str) or choice_index(answer, choices) is None:
            raise DataError(f"{where}: answer {answer!r} is not one of 'choices'")
        meta: dict[str, Any] = {"choices": choices}
        meta.update({k: record[k] for k in MMAU_META if k in record})
        messages = user_turn("audio", audio, question, root, where)
        return Sample(str(record["id"]), messages, target=answer, meta=meta)

    # -- prompts ------------------------------------------------------------------------------
    def question(self, sample: Sample) -> str:
        """R1-AQA's layout: the question, then ``Please choose the answer from the following
        options: ['a', 'b', ...].`` (the options as a Python list, in the data's order)."""
        options = str([str(c) for c in sample.meta["choices"]])
        return f"{sample.text()} Please choose the answer from the following options: {options}."
