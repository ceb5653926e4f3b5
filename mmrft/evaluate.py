"""Benchmark evaluation: greedy decoding on a test split, the task's strict metrics.

The evaluation parser is the task's ``evaluate_one`` (strict: answer tag required, one option,
one box), never the training reward, and format failures are reported separately
(``format_fail``) from wrong answers (docs/reference.md pitfall 10).

Outputs: a table on screen, ``results.json`` (metrics) and ``predictions.jsonl`` (one line per
sample: completion, parsed answer, score, reason, per-sample values).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from mmrft.data import Sample
from mmrft.policy import Policy
from mmrft.rollout import HFEngine, Rollouts, Sampling
from mmrft.task import EvalRecord, Task


@dataclass
class EvalResult:
    """Metrics (means over samples, plus ``format_fail``) and the per-sample records."""

    task: str
    metrics: dict[str, float]
    records: list[EvalRecord]
    seconds: float

    @property
    def primary(self) -> float:
        return self.metrics.get("primary", float("nan"))


def evaluate(
    policy: Policy,
    task: Task,
    samples: list[Sample],
    batch_size: int,
    max_new_tokens: int,
    progress: Progress | None = None,
) -> EvalResult:
    """Greedy-decode every sample once and score it with the task's strict evaluation.

    Prompts go to the engine ``batch_size`` at a time (the batches the engine would form
    itself, so the completions are the same), each batch advancing a bar on ``progress`` (a
    live :func:`mmrft.runlog.progress_bar`) when one is given."""
    start = time.perf_counter()
    engine = HFEngine(policy, batch_size)
    conversations = [task.prompt(s, policy.family) for s in samples]
    sampling = Sampling(max_new_tokens, greedy=True)
    bar = None if progress is None else progress.add_task("eval", total=len(samples), info="")
    rollouts = Rollouts()
    for begin in range(0, len(conversations), batch_size):
        rollouts.extend(engine.generate(conversations[begin : begin + batch_size], 1, sampling))
        if bar is not None:
            progress.update(bar, completed=len(rollouts.texts))  # type: ignore[union-attr]
    if bar is not None:
        progress.remove_task(bar)  # type: ignore[union-attr]
    records = task.evaluate(rollouts.texts, samples)
    metrics = task.aggregate(records)
    metrics["primary"] = metrics.get(task.primary_metric, float("nan"))
    metrics["truncated"] = sum(rollouts.truncated) / max(len(samples), 1)
    return EvalResult(task.name, metrics, records, time.perf_counter() - start)


def write_eval(result: EvalResult, directory: Path, extra: dict[str, Any] | None = None) -> None:
    """Write ``results.json`` and ``predictions.jsonl`` into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    payload = {
        "task": result.task,
        "metrics": result.metrics,
        "samples": len(result.records),
        **(extra or {}),
    }
    (directory / "results.json").write_text(json.dumps(payload, indent=2) + "\n")
    with (directory / "predictions.jsonl").open("w", encoding="utf-8") as f:
        for record in result.records:
            f.write(json.dumps(record.to_json(), ensure_ascii=False) + "\n")


def print_table(
    title: str, columns: dict[str, dict[str, float]], console: Console | None = None
) -> None:
    """One row per metric, one column per evaluation (e.g. before / after)."""
    console = console or Console()
    table = Table(title=title)
    table.add_column("metric")
    for name in columns:
        table.add_column(name, justify="right")
    keys = sorted({k for metrics in columns.values() for k in metrics if k != "primary"})
    for key in keys:
        table.add_row(
            key, *(f"{metrics.get(key, float('nan')):.3f}" for metrics in columns.values())
        )
    console.print(table)
