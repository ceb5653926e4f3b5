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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from mmrft.config import eval_budget
from mmrft.data import Sample
from mmrft.evaluation.harness import build_harness
from mmrft.policy.model import Policy
from mmrft.rewards.task import EvalRecord, Task
from mmrft.rollout.base import Engine, Rollouts, Sampling
from mmrft.rollout.hf import HFEngine


@dataclass
class EvalResult:
    """Metrics (means over samples, plus ``format_fail``), the per-sample records, and the
    per-category metrics where the benchmark defines categories (:meth:`Task.categories`:
    ``{key: {value: metrics with primary and samples}}``, e.g. MMAU's ``task`` sound / music
    / speech and ``difficulty``)."""

    task: str
    metrics: dict[str, float]
    records: list[EvalRecord]
    seconds: float
    categories: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    primary_metric: str = "primary"
    # eval.harness: lmms-eval's results (mmrft.evaluation.harness.HarnessResult), whose
    # harness/<task>/<metric> numbers are also in ``metrics``
    harness: Any = None

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
    engine: Engine | None = None,
    tool_loop: Any = None,
    n: int = 1,
    temperature: float = 1.0,
    seed: int = 0,
    verifiers: Any = None,
) -> EvalResult:
    """Decode every sample (greedy, or ``n`` samples each) and score it with the task's strict
    evaluation.

    Prompts go to the engine (``engine``, e.g. a run's vLLM engine holding the current weights;
    by default the ``hf`` engine on ``policy``) ``batch_size`` at a time (the batches the engine
    would form itself, so the completions are the same), each batch advancing a bar on
    ``progress`` (a live :func:`mmrft.evaluation.runlog.progress_bar`) when one is given.

    ``n > 1``: ``n`` completions per sample at ``temperature``, drawn under a torch RNG forked
    and seeded with ``seed`` (the same samples every time, and a training run's RNG does not
    move); the metrics are means over all completions, and when the task's per-sample metric
    is 0/1 they add ``pass@k`` for k = 1, 2, 4, … ≤ n and k = n, the unbiased estimator
    ``1 − C(n − c, k) / C(n, k)`` with ``c`` correct of ``n`` (Chen et al. 2021), averaged over
    samples. Records come ``n`` per sample, in order.

    ``verifiers`` (a :class:`mmrft.rewards.WeightedReward`, ``eval.verifiers``): each of its
    verifiers also scores every completion, reported as ``verifier/<name>`` (the mean of the
    scores that apply; tool trajectories go to the verifiers that take them).

    With ``tool_loop`` (a run's :class:`mmrft.rollout.tool_loop.ToolLoop`) every sample runs the
    multi-turn tool loop, the task scores its last turn, each record keeps the whole
    trajectory, and the metrics add ``tools/turns_mean``, ``tools/use_rate``,
    ``tools/call_success`` and the ``tools/stop/<reason>`` shares."""
    import torch

    start = time.perf_counter()
    engine = engine or HFEngine(policy, batch_size)
    conversations = [task.prompt(s, policy.family) for s in samples]
    greedy = n == 1
    sampling = Sampling(max_new_tokens, temperature=temperature, greedy=greedy)
    bar = None if progress is None else progress.add_task("eval", total=len(samples), info="")
    rollouts = Rollouts()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for begin in range(0, len(conversations), batch_size):
            chunk = conversations[begin : begin + batch_size]
            if tool_loop is None:
                rollouts.extend(engine.generate(chunk, n, sampling))
            else:
                part = samples[begin : begin + batch_size]
                chunk = [tool_loop.with_tools(c, s) for c, s in zip(chunk, part)]
                rollouts.extend(tool_loop.run(engine, chunk, part, n, sampling))
            if bar is not None:
                progress.update(bar, completed=len(rollouts.texts) // n)  # type: ignore[union-attr]
    if bar is not None:
        progress.remove_task(bar)  # type: ignore[union-attr]
    expanded = [s for s in samples for _ in range(n)]
    records = task.evaluate(rollouts.texts, expanded)
    for record, sample in zip(records, expanded):
        record.target = sample.target
    metrics = task.aggregate(records)
    metrics["primary"] = metrics.get(task.primary_metric, float("nan"))
    metrics["truncated"] = sum(rollouts.truncated) / max(len(expanded), 1)
    if n > 1:
        metrics.update(pass_at_k([r.values.get(task.primary_metric) for r in records], n))
    if verifiers is not None:
        scored = verifiers(rollouts.texts, expanded, "at evaluation", rollouts.trajectories)
        for name, scores in scored.scores.items():
            values = [score.value for score in scores if score is not None]
            if values:
                metrics[f"verifier/{name}"] = sum(values) / len(values)
        if task.scored_by_reward:  # the task's metric is the verifiers' weighted reward
            for record, total in zip(records, scored.total):
                record.score = record.values["reward"] = total
            metrics["reward"] = metrics["primary"] = sum(scored.total) / max(len(records), 1)
    if tool_loop is not None:
        for record, trajectory in zip(records, rollouts.trajectories or []):
            record.trajectory = trajectory.to_json()
        metrics.update(tool_loop.metrics(prefix="tools"))
    categories = task.categories(records, expanded)
    return EvalResult(
        task.name,
        metrics,
        records,
        time.perf_counter() - start,
        categories,
        task.primary_metric,
    )


def evaluate_configured(
    cfg: Any,
    policy: Policy,
    task: Task,
    samples: list[Sample],
    progress: Progress | None,
    *,
    engine: Engine | None = None,
    tool_loop: Any = None,
    verifiers: Any = None,
) -> EvalResult:
    """:func:`evaluate` with a config's evaluation settings (``eval.batch_size``, the budget,
    ``eval.n``, ``eval.temperature``, seeded by ``train.seed``): a run's evaluations and
    ``mmrft eval`` alike."""
    return evaluate(
        policy,
        task,
        samples,
        cfg.eval.batch_size,
        eval_budget(cfg),
        progress,
        engine=engine,
        tool_loop=tool_loop,
        n=cfg.eval.n,
        temperature=cfg.eval.temperature,
        seed=cfg.train.seed,
        verifiers=verifiers,
    )


def pass_at_k(values: list[Any], n: int) -> dict[str, float]:
    """``pass@k`` for k = 1, 2, 4, … ≤ n and k = n from per-completion 0/1 values (``n`` per
    sample, in order): the mean over samples of ``1 − C(n − c, k) / C(n, k)``; empty when a
    value is not 0 or 1 (a continuous metric such as IoU has no pass@k)."""
    from math import comb

    if not values or any(v not in (0, 1, 0.0, 1.0, True, False) for v in values):
        return {}
    ks = sorted({k for k in (2**i for i in range(n.bit_length())) if k <= n} | {n})
    groups = [values[i : i + n] for i in range(0, len(values), n)]
    out = {}
    for k in ks:
        scores = [1.0 - comb(n - int(sum(g)), k) / comb(n, k) for g in groups]
        out[f"pass@{k}"] = sum(scores) / len(scores)
    return out


def evaluate_config(cfg: Any, console: Console | None = None, verbose: bool = True) -> EvalResult:
    """Evaluate ``cfg.model.path`` on ``cfg.data.test`` as ``mmrft eval`` does (the Python
    API's evaluation): the config's task, data format and media budgets, greedy decoding with
    the ``hf`` engine, through the config's tool loop when ``rollout.tools`` names tools. The
    data (lines and media) is checked before any weights load. ``verbose=False``: no progress
    bar or other output on stdout/stderr; warnings still reach :mod:`logging`."""
    from mmrft.config import validate_config
    from mmrft.evaluation.runlog import quiet_libraries

    if not isinstance(verbose, bool):
        raise TypeError(f"mmrft.evaluate_config: verbose: expected True or False, got {verbose!r}")
    cfg = validate_config(cfg, "mmrft.evaluate_config", console, training=False)
    console = (console or Console()) if verbose else Console(quiet=True)
    with quiet_libraries(verbose):
        return _evaluate_config(cfg, console)


def _evaluate_config(cfg: Any, console: Console) -> EvalResult:
    """:func:`evaluate_config` after its checks."""
    from mmrft.evaluation.report import describe_run
    from mmrft.evaluation.runlog import progress_bar
    from mmrft.policy.model import load_policy
    from mmrft.rollout.preflight import preflight
    from mmrft.rollout.setup import read_data
    from mmrft.runtime.device import pick_device, seed_everything
    from mmrft.typecheck import ConfigError

    seed_everything(cfg.train.seed)
    if not cfg.data.test and not cfg.eval.harness:
        raise ConfigError("data.test: evaluation needs a test file (or eval.harness=lmms_eval)")
    task, family = preflight(cfg, training=False)
    samples: list[Sample] = []
    if cfg.data.test:
        (samples,) = read_data(cfg, task, family, splits=("test",))  # as training reads it
    # its task index built (and a bad task name refused) before the weights load
    harness = build_harness(cfg)
    verifiers = eval_verifiers(cfg)  # a bad entry fails before any weights load
    policy = load_policy(cfg.model, pick_device(cfg.device), trainable=False, family=family)
    console.print(escape(describe_run(cfg, policy.family.name, policy.device, len(samples))))
    tool_loop = None
    if cfg.rollout.tools.active:  # the config's tools: the same loop as training, greedy
        from mmrft.rollout.collector import build_tool_loop

        tool_loop = build_tool_loop(cfg, policy, HFEngine(policy, cfg.eval.batch_size))
    try:
        result = EvalResult(task.name, {}, [], 0.0, primary_metric=task.primary_metric)
        if samples:
            with progress_bar(console, transient=True) as progress:
                result = evaluate_configured(
                    cfg, policy, task, samples, progress, tool_loop=tool_loop, verifiers=verifiers
                )
        if harness is not None:
            result.harness = harness.run(policy, HFEngine(policy, cfg.eval.batch_size))
            result.metrics.update(result.harness.metrics)
            result.seconds += result.harness.seconds
        return result
    finally:
        if verifiers is not None:
            verifiers.close()  # their worker processes
        if tool_loop is not None:
            tool_loop.close()  # its tool worker process


def eval_verifiers(cfg: Any) -> Any:
    """``eval.verifiers`` built like the reward (under its time budget), or ``None``; for a
    task :attr:`~mmrft.rewards.task.Task.scored_by_reward` without them, ``reward.verifiers``."""
    from mmrft.plugins import TASKS
    from mmrft.rewards.reward import build_reward

    entries = cfg.eval.verifiers
    if not entries and TASKS.get(cfg.task.name).scored_by_reward:
        entries = cfg.reward.verifiers  # the task's metric is the reward
    if not entries:
        return None
    return build_reward(
        entries,
        cfg.reward.timeout_s,
        cfg.reward.on_timeout,
        cfg.reward.isolation,
        cfg.reward.workers,
        cfg.reward.worker_memory_mb,
    )


def write_eval(result: EvalResult, directory: Path, extra: dict[str, Any] | None = None) -> None:
    """Write ``results.json`` and ``predictions.jsonl`` into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    payload = {
        "task": result.task,
        "metrics": result.metrics,
        "samples": len(result.records),
        "categories": result.categories,
        **(extra or {}),
    }
    (directory / "results.json").write_text(json.dumps(payload, indent=2) + "\n")
    with (directory / "predictions.jsonl").open("w", encoding="utf-8") as f:
        for record in result.records:
            f.write(json.dumps(record.to_json(), ensure_ascii=False) + "\n")


def print_table(
    title: str,
    columns: dict[str, dict[str, float]],
    console: Console | None = None,
    categories: dict[str, dict[str, dict[str, dict[str, float]]]] | None = None,
    primary: str = "primary",
) -> None:
    """One row per metric, one column per evaluation (e.g. before / after); then, where the
    benchmark has categories (``categories``: per column, :attr:`EvalResult.categories`), one
    row per category value with its ``primary`` metric and its number of samples."""
    console = console or Console()
    console.print(escape(title), style="bold")  # above: a table's title wraps to its width
    table = Table()
    table.add_column("metric")
    for name in columns:
        table.add_column(escape(name), justify="right")
    keys = sorted({k for metrics in columns.values() for k in metrics if k != "primary"})
    for key in keys:
        table.add_row(
            escape(key), *(f"{metrics.get(key, float('nan')):.3f}" for metrics in columns.values())
        )
    by_column = [(categories or {}).get(name) or {} for name in columns]
    splits = {key: None for cats in by_column for key in cats}
    for key in splits:
        table.add_section()
        for value in sorted({v for cats in by_column for v in cats.get(key, {})}):
            counts = {int(c[key][value]["samples"]) for c in by_column if value in c.get(key, {})}
            label = f"{primary} · {key} = {value} (n={'/'.join(map(str, sorted(counts)))})"
            cells = [
                f"{c[key][value]['primary']:.3f}" if value in c.get(key, {}) else "—"
                for c in by_column
            ]
            table.add_row(escape(label), *cells)
    console.print(table)
