"""Object counting (R1-V on CLEVR, SuperCLEVR): how many objects does the image show?

A sample holds the media and a question; the target is a non-negative integer. Optional
``meta["count_range"] = [lo, hi]`` (inclusive) states the counts the dataset can hold; it
defines the chance level and must contain the target::

    {"id": "shapes_counting-test-0000",
     "messages": [{"role": "user", "content": [
         {"type": "image", "image": "images/test-0000.png"},
         {"type": "text", "text": "How many shapes are in the image?"}]}],
     "target": 3,
     "meta": {"count_range": [1, 6], "image_size": [84, 84]}}

Answers are read strictly: exactly one number in the one answer block
(:func:`mmrft.rewards.answers.parse_number`: digits or the words zero–twenty), equal to the target.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from mmrft.data import DataError, Sample
from mmrft.rewards.task import (
    EvalRecord,
    ExampleData,
    Task,
    evaluate_number,
    task,
    uniform_target_chance,
)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@task("counting")
class CountingTask(Task):
    """Count objects; the target is an integer ≥ 0.

    Template fields: ``{question}``, ``{format_instruction}``. Reward: format + accuracy in
    number mode (weights 1, 1; exact equality). Metric: ``accuracy`` (0/1 per sample); chance
    = uniform guessing over the counts of ``meta["count_range"]`` that occur as targets
    (:func:`mmrft.rewards.task.uniform_target_chance`) when every sample has a range.
    """

    template = "{question} Answer with a number.\n{format_instruction}"
    primary_metric = "accuracy"
    formats = ("mmrft",)
    example_data: ClassVar[ExampleData] = {
        "mmrft": ("shapes_counting/train.jsonl", "shapes_counting/test.jsonl", {})
    }

    # -- data ---------------------------------------------------------------------------------
    def parse_record(self, record: Any, base: Path, where: str) -> Sample:
        sample = super().parse_record(record, base, where)
        if not _is_count(sample.target):
            raise DataError(f"{where}: target must be an integer ≥ 0, got {sample.target!r}")
        bounds = sample.meta.get("count_range")
        if bounds is not None:
            if not (
                isinstance(bounds, list)
                and len(bounds) == 2
                and all(_is_count(b) for b in bounds)
                and bounds[0] <= bounds[1]
            ):
                raise DataError(f"{where}: meta.count_range must be [lo, hi] with 0 ≤ lo ≤ hi")
            if not bounds[0] <= sample.target <= bounds[1]:
                raise DataError(f"{where}: target {sample.target} is outside count_range {bounds}")
        return sample

    # -- rewards and metrics --------------------------------------------------------------------
    def default_verifiers(self) -> list[dict[str, Any]]:
        return self.format_and("accuracy", {"mode": "number"})

    def reference_answer(self, sample: Sample) -> str:
        """The count in digits, e.g. ``"3"``."""
        return str(sample.target)

    def evaluate_one(self, completion: str, sample: Sample) -> EvalRecord:
        """Strict parse: exactly one answer block stating exactly one number.

        Value ``accuracy`` = 1 if that number equals the target, else 0. Reasons for no number:
        the answer-tag reasons, ``no number``, ``several numbers``; a wrong count has none.
        ``parsed`` is the number (an int when whole).
        """
        return evaluate_number(completion, sample, sample.target)

    def chance(self, samples: list[Sample]) -> float | None:
        """Uniform guessing among the counts of each sample's ``count_range`` that are the
        target of some sample of the split (:func:`mmrft.rewards.task.uniform_target_chance`);
        ``None`` unless every sample has a ``count_range``."""
        ranges = [s.meta.get("count_range") for s in samples]
        if not ranges or any(r is None for r in ranges):
            return None

        def options(sample: Sample) -> tuple[range, int]:
            lo, hi = sample.meta["count_range"]
            return range(lo, hi + 1), sample.target

        return uniform_target_chance(samples, options)
