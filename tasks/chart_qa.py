"""Chart question answering with ChartQA's relaxed accuracy.

A sample holds a chart image and a question; the target is a number (``44``, ``"0.57"``,
``"35%"``) or a short text (``"Yes"``, ``"D"``). With ``meta["choices"]`` (e.g. the chart's
categories for "Which category has the largest value?") the answer must name exactly one of
them (:func:`mmrft.rewards.answers.match_choice`). The prompt does not list the choices: as in
ChartQA, the chart shows them.

**Relaxed accuracy** (ChartQA, Masry et al. 2022, the metric every chart-QA paper reports): a
numeric answer is correct when ``|answer − target| ≤ 0.05 · |target|`` (exact when the target is
0), a text answer when it equals the target after normalisation (lower case, surrounding
punctuation and articles dropped; :func:`mmrft.rewards.answers.normalise_text`). Unlike ChartQA's
script, which ``float()``\\ s the whole answer, the numeric answer is the one number the answer
states (:func:`mmrft.rewards.answers.parse_number`: ``44``, ``44%``, ``1,234``, ``about 44`` all
read 44; two numbers are a failure, never a pick), and everything is read from the one
``<answer>`` block.

Dataset formats:

* ``mmrft``: the project JSONL (the bundled ``assets/benchmarks/charts/{train,test}.jsonl``)::

      {"id": "charts-test-0001",
       "messages": [{"role": "user", "content": [
           {"type": "image", "image": "images/test-0001.png"},
           {"type": "text", "text": "What is the value of A?"}]}],
       "target": 44, "meta": {"question_type": "value", "image_size": [160, 120]}}

* ``chartqa``: ChartQA's annotation files (``test/test_human.json``, ``test_augmented.json``,
  ...), one JSON list of ``{"imgname": "41699051005347.png", "query": "...", "label": "..."}``;
  images under the task parameter ``image_root`` (default: the ``png`` folder beside the file,
  ChartQA's layout). Sample ids are ``<file stem>-<index>`` (the item's 0-based position).
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
    require_fields,
)
from mmrft.rewards.answers import extract_answer, is_number_literal, normalise_text, parse_number
from mmrft.rewards.task import (
    EvalRecord,
    ExampleData,
    Task,
    ThinkMode,
    check_choice_target,
    check_choices,
    choice_chance,
    evaluate_choice,
    task,
)
from mmrft.typecheck import ConfigError

REL_TOL = 0.05
"""ChartQA's relative tolerance for numeric answers."""


def _target_number(target: Any) -> float | None:
    if not is_number_literal(target):
        return None
    if isinstance(target, str):
        return parse_number(target)[0]
    return float(target)


def relaxed_match(value: float, target: float, rel_tol: float = REL_TOL) -> bool:
    """ChartQA's relaxed numeric match: ``|value − target| ≤ rel_tol · |target|``.

    >>> relaxed_match(46, 44), relaxed_match(47, 44), relaxed_match(0, 0)
    (True, False, True)
    """
    return abs(value - target) <= rel_tol * abs(target)


@task("chart_qa")
class ChartQATask(Task):
    """Answer a question about a chart: a number (5 % relative tolerance) or a short text.

    Template fields: ``{question}`` and ``{format_instruction}``; the template adds ChartQA's
    "Answer the question using a single word or phrase.". Reward: format + accuracy in
    ``auto`` mode with ``rel_tol: 0.05`` (weights 1, 1): per sample, choice matching when it has
    ``meta.choices``, the relaxed numeric match when its target is a number, normalised text
    equality otherwise. Metric: ``relaxed_accuracy`` (0/1 per sample, primary). Chance: mean
    of 1 / #choices when every sample has choices, else undefined.
    """

    template = (
        "{question}\nAnswer the question using a single word or phrase.\n{format_instruction}"
    )
    primary_metric = "relaxed_accuracy"
    formats = ("mmrft", "chartqa")
    example_data: ClassVar[ExampleData] = {"mmrft": ("charts/train.jsonl", "charts/test.jsonl", {})}

    def __init__(
        self,
        *,
        think: ThinkMode = "required",
        template: str | None = None,
        image_root: str | None = None,
        rel_tol: float = REL_TOL,
    ) -> None:
        """
        Args:
            think: whether the answer format asks for a ``<think>`` block first.
            template: replaces the prompt template (same fields).
            image_root: folder of the ``chartqa`` format's images; default: ``png/`` beside the
                annotation file. The ``mmrft`` format always resolves media against its JSONL
                file.
            rel_tol: relative tolerance of numeric answers (ChartQA: 0.05), used by the default
                reward and by the evaluation.
        """
        super().__init__(think=think, template=template)
        if not 0 <= rel_tol < 1:
            raise ConfigError(f"task '{self.name}'.rel_tol must be in [0, 1), got {rel_tol}")
        self.image_root = image_root
        self.rel_tol = rel_tol

    # -- data ---------------------------------------------------------------------------------
    def read_format(
        self, path: Path, fmt: str, on_error: OnError, check: Callable[[Sample], None] | None
    ) -> tuple[list[Sample], ReadStats]:
        """Read ``path`` in this task's other formats (module docstring)."""
        if fmt == "chartqa":
            root = Path(self.image_root).expanduser() if self.image_root else path.parent / "png"

            def parse(record: Any, where: str, sample_id: str) -> Sample:
                return self._parse_chartqa(record, root, where, sample_id)

            return read_json_list(path, parse, on_error, check)
        return super().read_format(path, fmt, on_error, check)

    def _check_target(self, sample: Sample, where: str) -> Sample:
        target, choices = sample.target, sample.meta.get("choices")
        if choices is not None:
            check_choice_target(target, check_choices(choices, where), where)
        elif isinstance(target, bool) or not (
            isinstance(target, (int, float)) or (isinstance(target, str) and target.strip())
        ):
            raise DataError(f"{where}: target must be a number or a non-empty string")
        elif isinstance(target, float) and target != target:
            raise DataError(f"{where}: target is NaN")
        return sample

    def parse_record(self, record: Any, base: Path, where: str) -> Sample:
        sample = super().parse_record(record, base, where)
        if not sample.media("image"):
            raise DataError(f"{where}: a chart QA sample needs the chart image")
        return self._check_target(sample, where)

    def _parse_chartqa(self, record: Any, root: Path, where: str, sample_id: str) -> Sample:
        record = require_fields(record, ("imgname", "query", "label"), where)
        for key in ("imgname", "query"):
            if not isinstance(record[key], str) or not record[key].strip():
                raise DataError(f"{where}: '{key}' must be a non-empty string")
        label = record["label"]
        if isinstance(label, (int, float)) and not isinstance(label, bool):
            label = str(label)
        if not isinstance(label, str) or not label.strip():
            raise DataError(f"{where}: 'label' must be a non-empty string, got {label!r}")
        messages = user_turn("image", record["imgname"], record["query"].strip(), root, where)
        sample = Sample(sample_id, messages, target=label.strip(), meta={})
        return self._check_target(sample, where)

    # -- rewards and metrics --------------------------------------------------------------------
    def default_verifiers(self) -> list[dict[str, Any]]:
        return self.format_and("accuracy", {"mode": "auto", "rel_tol": self.rel_tol})

    def reference_answer(self, sample: Sample) -> str:
        """The target as written (``44``, ``0.57``, ``Yes``, ``D``)."""
        return str(sample.target)

    def evaluate_one(self, completion: str, sample: Sample) -> EvalRecord:
        """Strict parse of the one answer block, by this sample's kind: one option (choices),
        one number within ``rel_tol`` of the target (numeric target), or normalised text
        equality (text target).

        Value ``relaxed_accuracy`` = 1 when correct, else 0. Reasons when nothing usable was
        read: the answer-tag reasons, ``no option matched`` / ``several options`` (choices),
        ``no number`` / ``several numbers`` (numeric); a wrong answer has none. ``parsed`` is
        the option text, the number, or the normalised text.
        """

        def record(parsed: Any, correct: float, reason: str | None = None) -> EvalRecord:
            return EvalRecord(
                sample.id, completion, parsed, correct, reason, {"relaxed_accuracy": correct}
            )

        if sample.meta.get("choices"):
            return evaluate_choice(completion, sample, metric="relaxed_accuracy")
        answer, reason = extract_answer(completion)
        if answer is None:
            return record(None, 0.0, reason)
        expected = _target_number(sample.target)
        if expected is not None:
            value, reason = parse_number(answer)
            if value is None:
                return record(None, 0.0, reason)
            parsed = int(value) if value.is_integer() else value
            return record(parsed, float(relaxed_match(value, expected, self.rel_tol)))
        norm = normalise_text(answer)
        return record(norm, float(bool(norm) and norm == normalise_text(str(sample.target))))

    def chance(self, samples: list[Sample]) -> float | None:
        """Uniform guessing among each sample's choices that are the target of some sample
        of the split (:func:`mmrft.rewards.task.uniform_target_chance`) when every sample has
        choices; ``None`` otherwise."""
        if not samples or any(not s.meta.get("choices") for s in samples):
            return None
        return choice_chance(samples)
