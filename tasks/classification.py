"""Image classification and multiple-choice QA (Visual-RFT classification, SEED-Bench-R1, R1-AQA).

A sample holds the media and a question; ``meta["choices"]`` lists the options in the data's
order (kept as is, never shuffled), and the target is the correct option's *text*, e.g.::

    {"id": "shapes_colour-test-0000",
     "messages": [{"role": "user", "content": [
         {"type": "image", "image": "images/test-0000.png"},
         {"type": "text", "text": "What colour is the shape?"}]}],
     "target": "red",
     "meta": {"choices": ["red", "green", "blue", "yellow"], "image_size": [56, 56]}}

(A target that is a single letter such as ``"B"`` and matches no option's text is read as
that letter's option, as :func:`mmrft.rewards.answers.choice_index` does.)

The prompt lists the options after the question (``show_choices``), either as
``Options: red, green, blue, yellow`` or, with ``lettered``, one per line as ``A. red`` followed
by "Answer with the option letter only.". Answers are matched strictly
(:func:`mmrft.rewards.answers.match_choice`: the option's letter or its text, never a substring).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from mmrft.data import DataError, Sample
from mmrft.rewards.task import (
    LETTERS,
    ChoiceTask,
    ExampleData,
    ThinkMode,
    check_choice_target,
    check_choices,
    lettered_choices,
    task,
)
from mmrft.typecheck import ConfigError


@task("classification")
class ClassificationTask(ChoiceTask):
    """Pick one option of ``meta["choices"]``; the target is the option text.

    Template fields: ``{question}`` (the sample's question, with the options appended when
    ``show_choices``) and ``{format_instruction}``. Reward: format + accuracy in choice mode
    (weights 1, 1). Metric: ``accuracy`` (0/1 per sample); chance = uniform guessing over the
    options that occur as targets (:func:`mmrft.rewards.task.uniform_target_chance`).
    """

    template = "{question}\n{format_instruction}"
    primary_metric = "accuracy"
    formats = ("mmrft",)
    example_data: ClassVar[ExampleData] = {
        "mmrft": ("shapes_kind/train.jsonl", "shapes_kind/test.jsonl", {})
    }

    def __init__(
        self,
        *,
        think: ThinkMode = "required",
        template: str | None = None,
        show_choices: bool = True,
        lettered: bool = False,
    ) -> None:
        """
        Args:
            think: whether the answer format asks for a ``<think>`` block first.
            template: replaces the prompt template (same fields).
            show_choices: list the options after the question (``Options: a, b, c``); turn off
                when the question text already lists them.
            lettered: list them one per line as ``A. red`` and ask for the letter; the
                reference answer is then the letter.
        """
        super().__init__(think=think, template=template)
        if lettered and not show_choices:
            raise ConfigError(f"task '{self.name}': lettered needs show_choices")
        self.show_choices = show_choices
        self.lettered = lettered

    # -- data ---------------------------------------------------------------------------------
    def parse_record(self, record: Any, base: Path, where: str) -> Sample:
        sample = super().parse_record(record, base, where)
        choices = check_choices(sample.meta.get("choices"), where)
        if self.lettered and len(choices) > len(LETTERS):
            raise DataError(f"{where}: {len(choices)} options are too many to letter A–Z")
        check_choice_target(sample.target, choices, where)
        return sample

    # -- prompts ------------------------------------------------------------------------------
    def question(self, sample: Sample) -> str:
        """The question text with the options appended (when ``show_choices``)."""
        text = sample.text()
        if not self.show_choices:
            return text
        choices = sample.meta["choices"]
        if self.lettered:
            listed = lettered_choices(choices)
            return f"{text}\nOptions:\n{listed}\nAnswer with the option letter only."
        return f"{text}\nOptions: {', '.join(choices)}"
