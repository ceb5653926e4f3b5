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
from rich.table import Table

from mmrft.data import Sample
from mmrft.policy import Policy
from mmrft.rollout import HFEngine, Sampling
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
    policy: Policy, task: Task, samples: list[Sample], batch_size: int, max_new_tokens: int
) -> EvalResult:
    """Greedy-decode every sample once and score it with the task's strict evaluation."""
    start = time.perf_counter()
    engine = HFEngine(policy, batch_size)
    conversations = [task.prompt(s, policy.family) for s in samples]
    rollouts = engine.generate(conversations, n=1, sampling=Sampling(max_new_tokens, greedy=True))
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
