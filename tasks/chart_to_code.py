"""Chart-to-code: the model sees a chart and writes matplotlib code that reproduces it.

Data: the project JSONL with the chart image in the user turn and the reference script as the
target (the bundled ``assets/benchmarks/charts/code_{train,test}.jsonl``; ``meta.image_size`` is
the chart's size in pixels). The answer tag holds the code, optionally inside a ```python
fence.

Reward (default): ``format`` + ``chart_code`` — the code runs in the sandbox and is compared with
the reference's render and drawn elements (ChartMimic-style text / type / colour / layout
scores and SSIM; see ``verifiers/render.py``).

Evaluation (ChartMimic's numbers, arXiv:2406.09961): ``exec_rate`` (the code runs and draws),
``low_level`` (mean of the text, type, colour and layout F1, 0 when the code fails), ``ssim``
and ``score`` (the verifier's combined score). Primary: ``low_level``. Parsing is the
verifier's, which is already strict: no answer tag, no code or a failed run score 0 with the
reason reported apart.
"""

from __future__ import annotations

from typing import Any, ClassVar

from mmrft.verifiers.render import extract_code

from mmrft.data import DataError, Sample
from mmrft.plugins import VERIFIERS
from mmrft.rewards.task import EvalRecord, ExampleData, Task, ThinkMode, task

LOW_LEVEL_PARTS = ("text_f1", "type_f1", "colour", "layout_f1")


@task("chart_to_code")
class ChartToCodeTask(Task):
    """Write the matplotlib code that redraws a chart image; scored by running it in the
    sandbox and comparing the figure and its elements with the reference's."""

    template = (
        "{question}\nThe code must save the figure; keep the chart's size.\n{format_instruction}"
    )
    primary_metric = "low_level"
    example_data: ClassVar[ExampleData] = {
        "mmrft": ("charts/code_train.jsonl", "charts/code_test.jsonl", {})
    }

    def __init__(
        self, *, think: ThinkMode = "required", template: str | None = None, timeout_s: float = 10.0
    ) -> None:
        """
        Args:
            timeout_s: wall-clock budget of one sandboxed run (seconds), for reward and evaluation.
        """
        super().__init__(think=think, template=template)
        self.timeout_s = timeout_s
        self._checker: Any = None

    def parse_record(self, record: Any, base: Any, where: str) -> Sample:
        sample = super().parse_record(record, base, where)
        if not isinstance(sample.target, str) or not sample.target.strip():
            raise DataError(f"{where}: the target must be the reference code (a non-empty string)")
        if not sample.media("image"):
            raise DataError(f"{where}: a chart-to-code sample needs the chart image")
        return sample

    def default_verifiers(self) -> list[dict[str, Any]]:
        return self.format_and("chart_code", {"timeout_s": self.timeout_s})

    def reference_answer(self, sample: Sample) -> str:
        return f"```python\n{sample.target}```"

    def evaluate(self, completions: list[str], samples: list[Sample]) -> list[EvalRecord]:
        """All completions of the split go through the verifier in one batch (its sandbox pool
        runs them in parallel)."""
        if self._checker is None:
            self._checker = VERIFIERS.get("chart_code").bind({"timeout_s": self.timeout_s})
        scores = self._checker(completions, samples)
        records = []
        for completion, sample, score in zip(completions, samples, scores):
            parts = dict(score.parts) if score is not None else {}
            executed = float(parts.get("exec", 0.0))
            low = sum(float(parts.get(p, 0.0)) for p in LOW_LEVEL_PARTS) / len(LOW_LEVEL_PARTS)
            values = {
                "exec_rate": executed,
                "low_level": executed * low,
                "ssim": executed * float(parts.get("ssim", 0.0)),
                "score": float(score.value) if score is not None else 0.0,
                **{p: executed * float(parts.get(p, 0.0)) for p in LOW_LEVEL_PARTS},
            }
            # a reason whenever the verifier gave one (nothing parsed, the run failed, a blank
            # render); exec_rate tells runs that drew nothing from runs that failed
            reason = score.reason if score is not None else "not scored"
            code, _ = extract_code(completion)
            records.append(
                EvalRecord(sample.id, completion, code, values["low_level"], reason, values)
            )
        return records

    def evaluate_one(self, completion: str, sample: Sample) -> EvalRecord:
        return self.evaluate([completion], [sample])[0]
