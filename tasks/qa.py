"""Free-form questions with a short answer: a word or phrase, a number, or a math expression.

The generic task for a dataset that is none of the specialised ones: the target is a
non-empty string or a number, options (``meta["choices"]``) are optional. The answer is the
one ``<answer>`` block, checked by the ``accuracy`` verifier's rules in the task's ``mode``
(:mod:`mmrft.verifiers.accuracy`)::

    {"id": "q1", "messages": [{"role": "user", "content": [
         {"type": "image", "image": "images/q1.png"},
         {"type": "text", "text": "What is written on the sign?"}]}],
     "target": "stop"}

``mode: auto`` (the default) picks per sample: ``choice`` when the sample lists options,
``number`` when the target is a number, else ``exact`` (case and surrounding punctuation
ignored); ``math`` compares expressions with math-verify (``$\\frac{1}{2}$`` = ``0.5``).
Evaluation and reward use the same rule, so the reward is the metric.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from mmrft.data import DataError, Sample
from mmrft.rewards.answers import extract_answer
from mmrft.rewards.task import EvalRecord, ExampleData, Task, ThinkMode, task

Mode = Literal["auto", "exact", "number", "math"]


@task("qa")
class QATask(Task):
    """A free-form question with a short answer (text, number or math), options optional.

    Template fields: ``{question}``, ``{format_instruction}``. Reward: format + accuracy in
    the task's ``mode``. Metric: ``accuracy`` (0/1 per sample), the same rule.
    """

    template = "{question}\n{format_instruction}"
    primary_metric = "accuracy"
    # for --smoke without the config's data: chart questions (numbers and short texts)
    example_data: ClassVar[ExampleData] = {"mmrft": ("charts/train.jsonl", "charts/test.jsonl", {})}

    def __init__(
        self, *, think: ThinkMode = "required", template: str | None = None, mode: Mode = "auto"
    ) -> None:
        """
        Args:
            mode: the accuracy verifier's mode for every sample (``auto``: per sample).
        """
        super().__init__(think=think, template=template)
        self.mode = mode

    def parse_record(self, record: Any, base: Path, where: str) -> Sample:
        sample = super().parse_record(record, base, where)
        target = sample.target
        if isinstance(target, bool) or not (
            isinstance(target, (int, float)) or (isinstance(target, str) and target.strip())
        ):
            raise DataError(f"{where}: target must be a number or a non-empty string")
        return sample

    def default_verifiers(self) -> list[dict[str, Any]]:
        return self.format_and("accuracy", {"mode": self.mode})

    def reference_answer(self, sample: Sample) -> str:
        return str(sample.target)

    def evaluate_one(self, completion: str, sample: Sample) -> EvalRecord:
        """The accuracy verifier's verdict in ``mode`` (strict: one answer block). Value
        ``accuracy`` 0/1; ``parsed`` the answer block's text."""
        from mmrft.verifiers.accuracy import accuracy

        answer, reason = extract_answer(completion)
        if answer is None:
            return EvalRecord(sample.id, completion, None, 0.0, reason, {"accuracy": 0.0})
        (score,) = accuracy([completion], [sample], mode=self.mode)
        value = float(score.value >= 1.0)
        wrong = None if value else score.reason
        return EvalRecord(sample.id, completion, answer, value, wrong, {"accuracy": value})
