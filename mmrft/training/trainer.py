"""The GRPO training loop, top to bottom.

``train`` is set-up (:func:`mmrft.training.setup.setup`: everything the loop holds, a
:class:`~mmrft.training.setup.Run`), the start (:func:`begin`: resume from a checkpoint,
:mod:`.resume`; or the warm start, :mod:`.warm_start`, and the evaluation before RL), then per
step:

1. **collect** (:class:`mmrft.rollout.collector.Collector`): ``train.prompts_per_step`` prompts, ``G``
   completions each, verified, shaped and filtered into a :class:`~mmrft.rollout.collector.StepBatch`;
2. **advantages** (:func:`advantages`): A_i from the group's rewards
   (``algorithm.advantage``), after the KL-to-reference term when it is part of the reward;
3. **update** (:func:`update`): μ = ``algorithm.updates_per_batch`` optimizer updates
   (:func:`mmrft.training.update.grpo_update`: micro-batches → forward → clipped surrogate
   (+ β·KL to a reference model, − entropy bonus) with the denominators of the *whole* step →
   backward → clip, AdamW step, LR schedule step); then the engine gets the new weights;
4. **log / eval / checkpoint** (:func:`log_step`, :func:`run_eval`, :func:`save`);

and the end (:func:`finish`: evaluation after RL, the last checkpoint, the summary).

The optional supervised warm start (``warm_start``) runs before RL; the before/after
evaluation brackets the RL stage alone.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.markup import escape

from mmrft.algorithms import group_advantages, group_stats
from mmrft.config import RunConfig, to_dict, validate_config
from mmrft.data import Sample, skip_counts
from mmrft.evaluation.evaluate import EvalResult, evaluate_configured, print_table, write_eval
from mmrft.evaluation.prompt_view import row_prompt_text
from mmrft.evaluation.report import report_runs
from mmrft.evaluation.runlog import (
    GracefulStop,
    Heartbeat,
    media_counters,
    merge_rank_metrics,
    progress_bar,
    quiet_libraries,
)
from mmrft.policy.model import Policy, save_pretrained
from mmrft.rewards.verifier import RewardError, write_failure
from mmrft.rollout.base import Rollouts
from mmrft.rollout.collector import BadMediaError, StepBatch
from mmrft.rollout.hf import HFEngine
from mmrft.rollout.sampling import SamplerError
from mmrft.runtime import distributed, zero
from mmrft.runtime.checkpoint import (
    find_resume_checkpoint,
    list_checkpoints,
    load_trainer_state,
    replace_dir,
    save_checkpoint,
    write_step_failure,
)
from mmrft.training.resume import (
    check_replicas,
    checkpoint_times,
    finished_summary,
    load_weights,
    record_start,
    restore_rng,
    resume_point,
    saved_times,
    skip_failed_media,
    summary_times,
)
from mmrft.training.setup import Run, setup
from mmrft.training.update import grpo_update, sequence_kl
from mmrft.training.warm_start import REFERENCE_FILE, warm_start, warm_started_reference

log = logging.getLogger("mmrft")


# ---------------------------------------------------------------------------------------------
# The run: start, loop, end (set-up: mmrft.training.setup)


class TrainResult(dict):
    """What :func:`train` returns: the run summary (``summary.json``'s keys, read as a dict:
    ``result["run_dir"]``) with attributes for code: ``run_dir`` (Path), ``checkpoint`` (the
    newest complete checkpoint's Path, or None), ``metrics`` (the last evaluation's metrics,
    ``{}`` without one), ``evals`` (each evaluation's metrics by name: before, after) and
    ``before`` / ``after`` (the primary metric, or None)."""

    def __init__(self, summary: dict[str, Any], evals: dict[str, dict[str, float]]):
        super().__init__(summary)
        self.run_dir = Path(summary["run_dir"])
        found = list_checkpoints(self.run_dir / "checkpoints")
        self.checkpoint: Path | None = found[-1] if found else None
        self.evals = dict(evals)
        self.metrics: dict[str, float] = dict(evals.get("after") or evals.get("before") or {})

    @property
    def before(self) -> float | None:
        return self.get("before")

    @property
    def after(self) -> float | None:
        return self.get("after")


def train(cfg: RunConfig, console: Console | None = None, verbose: bool = True) -> TrainResult:
    """Run warm start (optional), evaluation, GRPO, evaluation; return the run summary as a
    :class:`TrainResult`. ``verbose=False``: nothing on stdout/stderr (no banner, tables or
    progress bars); train.log and the run's files are written in full, warnings still reach
    :mod:`logging`. A finished run (its checkpoint at ``train.steps``) changes nothing and
    returns its summary; a resume with a changed config is refused (:func:`resume_point`). A
    config built or changed in Python is checked first as a file is
    (:func:`mmrft.config.validate_config`: types, unknown attributes, ranges), before anything
    is written."""
    if not isinstance(verbose, bool):
        raise TypeError(f"mmrft.train: verbose: expected True or False, got {verbose!r}")
    cfg = validate_config(cfg, "mmrft.train", console)
    console = console if verbose else Console(quiet=True)
    with quiet_libraries(verbose):
        finished = finished_summary(cfg, resume_point(cfg), console or Console())
        if finished is not None:
            return TrainResult(finished, _saved_evals(Path(finished["run_dir"])))
        return _run(cfg, console)


def _run(cfg: RunConfig, console: Console | None) -> TrainResult:
    """:func:`train` after its checks: set-up, the loop, the end; the set-up closed after."""
    run = setup(cfg, console)
    try:
        start_step = begin(run)
        run.collector.start(start_step + 1, cfg.train.steps)
        t_train = run.t_train = time.perf_counter()
        progress = run.progress = progress_bar(run.console)
        with progress, GracefulStop() as stop, Heartbeat(cfg.train.heartbeat_s) as heartbeat:
            bar = progress.add_task("RL step", total=cfg.train.steps, completed=start_step, info="")
            for step in range(start_step + 1, cfg.train.steps + 1):
                t0 = time.perf_counter()
                heartbeat.phase(f"rollout and verifiers, step {step}")
                batch = collect(run, step)
                advantage = advantages(run, batch, step, heartbeat)
                t_update = time.perf_counter()
                heartbeat.phase(f"update, step {step}")
                stats = update(run, batch, advantage, step)
                t_end = time.perf_counter()
                timings = {"time/update_s": t_end - t_update, "time/step_s": t_end - t0}
                reward = log_step(run, step, batch, stats, timings)
                progress.update(bar, completed=step, info=f"reward {reward:.3f}")
                log.info("step %d done: reward %.4f, %.1fs", step, reward, t_end - t0)

                if due(cfg.eval.every, step, cfg.train.steps) and evaluates(run):
                    heartbeat.phase(f"evaluation, step {step}")
                    run_eval(run, run.run_dir / "eval" / f"step-{step:06d}", step)
                if due(cfg.checkpoint.every, step, cfg.train.steps):
                    heartbeat.phase(f"checkpoint, step {step}")
                    save(run, step)
                if distributed.sum_scalar(1.0 if stop.requested else 0.0) > 0:
                    stop.requested = stop.requested or "a signal on another rank"
                    save(run, step)
                    run.console.print(
                        f"stopped by {stop.requested} after step {step}; checkpoint saved, "
                        "run the same command to resume (checkpoint.resume=auto)"
                    )
                    raise KeyboardInterrupt(stop.requested)
        run.progress = None
        return TrainResult(finish(run, start_step, time.perf_counter() - t_train), run.evals)
    finally:
        run.collector.close()  # the rollout thread, if one runs ahead
        run.engine.close()
        run.reward.close()  # the verifier workers
        if run.eval_verifiers is not None:
            run.eval_verifiers.close()
        run.runlog.close()


def begin(run: Run) -> int:
    """Resume from the newest checkpoint (``checkpoint.resume``), or run the warm start and the
    evaluation before RL; hand the optimizer to the sharding engine. Returns the last step
    already done (0 for a new run)."""
    cfg, start_step = run.cfg, 0
    checkpoint = find_resume_checkpoint(run.run_dir, cfg.checkpoint.resume)  # train() checked it
    if checkpoint is not None:
        state = load_trainer_state(checkpoint)
        load_weights(run.policy, checkpoint)
        run.scheduler.load_state_dict(state["scheduler"])
        restore_rng(state, cfg, run.rank, run.world)
        run.stream.position = state["data_position"]
        run.stream.bad = set(state.get("bad_samples", []))
        run.collector.stats.load_state_dict(state.get("prompt_stats", {}))
        run.evals = state.get("evals", {})
        run.categories = state.get("eval_categories", {})
        run.best = state.get("best")
        run.times_before = saved_times(state)  # None: an older checkpoint, without totals
        start_step = state["step"]
        run.runlog.truncate_after(start_step)
        run.resumed_from = checkpoint
        run.console.print(
            f"resumed from {checkpoint} at step {start_step} (data position {run.stream.position})"
        )
    else:
        run.runlog.truncate_after(-1)
        if cfg.warm_start.steps and run.train_samples:
            losses = warm_start(
                run.policy,
                run.task,
                run.train_samples,
                cfg,
                run.console,
                run.collector.tool_loop,
            )
            run.runlog.warm_start(losses)
            if run.reference is not None:
                run.reference = None  # model.path's copy goes before the new one is made
                run.reference = warm_started_reference(
                    cfg, run.policy, run.run_dir, run.rank, run.world, load=False
                )
    if run.rank == 0:  # config.history.yaml and train.log: what this process changed
        line = record_start(
            cfg, run.run_dir, run.previous_config, run.world, checkpoint, start_step
        )
        if checkpoint is not None:
            run.console.print(line, highlight=False, markup=False)
    skip_failed_media(cfg, run.run_dir, run.train_samples, run.stream, run.console)
    saved = run.run_dir / REFERENCE_FILE  # the warm start's reference, not model.path's
    if checkpoint is not None and run.reference is not None and saved.is_file():
        run.reference = None
        run.reference = warm_started_reference(
            cfg, run.policy, run.run_dir, run.rank, run.world, load=True
        )
    run.collector.sync_weights(start_step)  # an engine with its own weights starts from these
    if checkpoint is None and cfg.eval.before and evaluates(run):
        run.evals["before"] = run_eval(run, run.run_dir / "eval" / "before", 0)
    # DeepSpeed: the engine takes the model and optimizer now, after weights were loaded
    distributed.prepare_optimizer(
        run.policy.model,
        run.optimizer,
        cfg.train.sharding,
        zero.run_deepspeed_config(cfg, run.world),
    )
    if checkpoint is not None:
        distributed.load_full_optimizer_state(run.policy.model, run.optimizer, state["optimizer"])
    check_replicas(run.policy, "start")
    return start_step


def collect(run: Run, step: int) -> StepBatch:
    """The step's batch from the collector. A verifier that breaks its contract (raises,
    returns a value outside its range, NaN, over its budget under ``on_timeout: stop``) stops
    the run with ``failure.json`` naming the step, the verifier and the samples; so do media
    that fail when drawn under ``data.on_error=raise`` (``bad_media``: each sample's id,
    dataset line and error, which a resume skips: :func:`skip_failed_media`), and a sampler
    that breaks its contract (``sampler``: its name; the step whose draw failed)."""
    try:
        return run.collector.collect(step)
    except RewardError as exc:
        if run.rank == 0:
            write_failure(run.run_dir, exc, step)
        raise
    except SamplerError as exc:
        if run.rank == 0:
            write_step_failure(run.run_dir, exc.step, str(exc), exc.sample_ids, sampler=exc.sampler)
        raise
    except BadMediaError as exc:
        if run.rank == 0:
            ids = (f["id"] for f in exc.failed)
            write_step_failure(run.run_dir, step, str(exc), ids, bad_media=exc.failed)
        raise


def advantages(run: Run, batch: StepBatch, step: int, heartbeat: Heartbeat) -> torch.Tensor:
    """A_i of the kept completions from their group's rewards (``algorithm.advantage``), after
    subtracting β·KL(π_θ ‖ π_ref) per completion when ``algorithm.kl_mode`` is ``reward``."""
    cfg = run.cfg
    if run.reference is not None and cfg.algorithm.kl_mode == "reward":
        heartbeat.phase(f"KL to the reference, step {step}")
        kl = sequence_kl(run.policy, run.reference, batch, cfg)
        batch.rewards = batch.rewards - cfg.algorithm.beta * kl
        batch.counts["train/kl_in_reward"] = float(kl.mean()) if len(kl) else 0.0
    if not len(batch.rewards):
        return batch.rewards
    return group_advantages(
        batch.rewards, cfg.rollout.group_size, mode=cfg.algorithm.advantage, eps=cfg.algorithm.eps
    )


def update(run: Run, batch: StepBatch, advantage: torch.Tensor, step: int) -> dict[str, float]:
    """The optimizer updates of one step (:func:`mmrft.training.update.grpo_update`), then the
    new weights to the engine. A non-finite loss or gradient writes ``failure.json`` naming the
    step and samples."""
    try:
        stats = grpo_update(
            run.policy,
            run.reference,
            run.optimizer,
            run.scheduler,
            batch,
            advantage,
            run.cfg,
            step,
            teacher=run.teacher,
        )
    except FloatingPointError as exc:
        write_step_failure(run.run_dir, step, str(exc), (s.id for s in batch.samples))
        raise
    run.collector.sync_weights(step)
    return stats


def log_step(
    run: Run, step: int, batch: StepBatch, stats: dict[str, float], timings: dict[str, float]
) -> float:
    """One ``metrics.jsonl`` line for all ranks (every ``train.log_every`` steps) and the sample
    completions (every ``train.completions_every``); returns the mean reward."""
    cfg, G = run.cfg, run.cfg.rollout.group_size
    rollouts, scored = batch.generated, batch.scored
    times = {k: v for k, v in stats.items() if k.startswith(("time/", "rollout/", "distill/"))}
    # the model's own tokens (tool observations are not generated and not trained on)
    generated_tokens = sum(rollouts.loss_tokens(i) for i in range(len(rollouts.texts)))
    trained_tokens = sum(batch.rollouts.loss_tokens(i) for i in range(len(batch.rollouts.texts)))
    metrics = {
        **scored.metrics("train/reward"),
        **{f"train/{k}": v for k, v in stats.items() if k not in times},
        **{f"rollout/{k}": v for k, v in group_stats(torch.tensor(scored.total), G).items()},
        **batch.counts,
        "rollout/len_mean": generated_tokens / max(len(rollouts.texts), 1),
        "rollout/truncated": float(np.mean(rollouts.truncated)),
        "train/lr": run.scheduler.get_last_lr()[0],
        "train/epoch": run.stream.position / max(len(run.train_samples), 1),
        **batch.timings,
        **times,
        **timings,
        # completion tokens generated per second of rollout, trained per second of update
        "throughput/rollout_tokens_per_s": generated_tokens
        / max(batch.timings.get("time/rollout_s", 0.0), 1e-9),
        "throughput/train_tokens_per_s": trained_tokens / max(timings["time/update_s"], 1e-9),
    }
    metrics.update({f"train/reasons/{k}": float(n) for k, n in scored.reasons.items()})
    metrics.update(media_counters())
    metrics = merge_rank_metrics(metrics)
    if step % cfg.train.log_every == 0:
        run.runlog.metrics(step, metrics)
    if cfg.train.completions_every and step % cfg.train.completions_every == 0:
        rows = _completion_rows(run.policy, rollouts, batch.generated_samples, scored, G)
        run.runlog.completions(step, rows)
    reasons = {k.removeprefix("train/reasons/"): v for k, v in metrics.items() if "/reasons/" in k}
    warning = run.no_signal.update(metrics["rollout/frac_zero_std"], reasons)
    if warning and run.rank == 0:
        run.console.print(f"[yellow]warning:[/yellow] step {step}: {escape(warning)}")
        log.warning("step %d: %s", step, warning)
    return metrics["train/reward"]


def evaluates(run: Run) -> bool:
    """The run has something to evaluate (the same answer on every rank): a test split, or
    a harness (``eval.harness``)."""
    return bool(run.test_samples) or bool(run.cfg.eval.harness)


def run_eval(run: Run, directory: Path, step: int) -> dict[str, float]:
    """Greedy evaluation on rank 0 (greedy decoding draws no random numbers, so no rank's
    sampling stream moves): the task's metrics on the test split, then the harness's
    (``eval.harness``: ``harness/<task>/<metric>``, lmms-eval's files in
    ``directory/lmms_eval``), one ``metrics.jsonl`` line with ``time/eval_s`` (both) and
    ``time/harness_s``; the metrics reach every rank. Then ``checkpoint.keep_best``."""
    cfg, task, shared = run.cfg, run.task, None
    # sharded: every rank takes part in gathering the parameters, then rank 0 alone generates
    with distributed.gathered(run.policy.model):
        if distributed.is_main():
            start = time.perf_counter()
            # an engine with its own weights (vLLM) holds the current ones; hf builds its own
            # with the evaluation batch size
            engine = None if run.engine.name == "hf" else run.engine
            metrics: dict[str, float] = {}
            logged: dict[str, float] = {}
            categories: dict[str, Any] = {}
            if run.test_samples:
                result = _evaluate_task(run, engine)
                write_eval(result, directory, {"step": step})
                metrics, categories = dict(result.metrics), result.categories
                logged = {f"eval/{task.name}/{k}": v for k, v in metrics.items() if k != "primary"}
                run.console.print(
                    f"eval step {step}: {task.primary_metric} = {result.primary:.3f} "
                    f"(format_fail {result.metrics.get('format_fail', 0):.3f}, "
                    f"{result.seconds:.1f}s)"
                )
            if run.harness is not None:
                on = engine or HFEngine(run.policy, cfg.eval.batch_size)
                harness = run.harness.run(run.policy, on)
                harness.write(directory / "lmms_eval")
                metrics.update(harness.metrics)
                logged.update(harness.metrics)
                logged["time/harness_s"] = harness.seconds
                shown = ", ".join(
                    f"{k.removeprefix('harness/')} = {v:.3f}"
                    for k, v in harness.metrics.items()
                    if "_stderr" not in k
                )
                run.console.print(f"harness step {step}: {shown} ({harness.seconds:.1f}s)")
            logged["time/eval_s"] = time.perf_counter() - start
            run.runlog.metrics(step, logged)
            shared = (metrics, categories, logged)
    metrics, run.categories[directory.name], logged = distributed.broadcast_object(shared)
    if cfg.checkpoint.keep_best:
        keep_best(run, logged, step)
    return metrics


def _evaluate_task(run: Run, engine: Any) -> EvalResult:
    """The task's evaluation on the test split, on the RL loop's display when it runs."""
    # a bar on the RL loop's display while it runs, else a display of its own
    own = progress_bar(run.console, transient=True)
    with nullcontext(run.progress) if run.progress else own as progress:
        return evaluate_configured(
            run.cfg,
            run.policy,
            run.task,
            run.test_samples,
            progress,
            engine=engine,
            tool_loop=run.collector.tool_loop,
            verifiers=run.eval_verifiers,
        )


def keep_best(run: Run, logged: dict[str, float], step: int) -> None:
    """``checkpoint.keep_best``: when this evaluation's metric beats the best so far
    (``keep_best_mode`` max or min; the first one always does), the policy's weights go to
    ``<run dir>/best`` (as a step checkpoint's model files) with ``best.json`` (metric, value,
    step). Collective: every rank calls it (the weights are gathered when sharded)."""
    cfg = run.cfg.checkpoint
    value = logged.get(cfg.keep_best)
    if value is None:
        if run.rank == 0:
            log.warning("checkpoint.keep_best: %s was not logged at step %d", cfg.keep_best, step)
        return
    if run.best is not None:  # strictly better, or the earlier evaluation stays
        best = run.best["value"]
        if not (value > best if cfg.keep_best_mode == "max" else value < best):
            return
    run.best = {"metric": cfg.keep_best, "value": value, "step": step}
    weights = distributed.full_model_state(run.policy.model)
    if run.rank == 0:

        def write(folder: Path) -> None:
            save_pretrained(run.policy, folder, state_dict=weights)
            (folder / "best.json").write_text(json.dumps(run.best, indent=2) + "\n")

        # a kill leaves the previous best or the new one, whole
        target = replace_dir(run.run_dir / "best", write)
        run.console.print(f"best {cfg.keep_best} = {value:.3f} at step {step}: {target}")
    distributed.barrier()


def save(run: Run, step: int) -> None:
    """Write the checkpoint of ``step`` (collective: every rank takes part, rank 0 writes)."""
    check_replicas(run.policy, f"step {step}")
    collector_state = run.collector.resume_state(step)
    state = {
        "step": step,
        # full, in the unsharded layout, so any world size resumes
        "optimizer": distributed.full_optimizer_state(run.policy.model, run.optimizer),
        "scheduler": run.scheduler.state_dict(),
        # the collector's state before step + 1 (data position, bad media, prompt statistics,
        # random state: "rng" is rank 0's, kept for single-process readers)
        **collector_state,
        "rng_by_rank": distributed.gather_objects(collector_state["rng"]),
        "world_size": run.world,
        "evals": run.evals,
        "eval_categories": run.categories,
        "best": run.best,
        "config": to_dict(run.cfg),
        # wall-clock seconds of the run's processes up to this checkpoint (summary.json)
        "times": checkpoint_times(run),
    }
    # sharded: a collective, rank 0 gets the full weights (None: the model's own)
    weights = distributed.full_model_state(run.policy.model)
    if run.rank == 0:
        path = save_checkpoint(
            run.run_dir / "checkpoints",
            step,
            lambda d: save_pretrained(run.policy, d, state_dict=weights),
            state,
            run.cfg.checkpoint.keep_last,
        )
        log.info("checkpoint %s", path)
        run.collector.stats.write_jsonl(run.run_dir / "prompt_stats.jsonl")
    distributed.barrier()


def finish(run: Run, start_step: int, train_seconds: float) -> dict[str, Any]:
    """Evaluation after RL, the last checkpoint, the before/after table and ``summary.json``."""
    cfg, task = run.cfg, run.task
    run.train_seconds = train_seconds  # the RL loop's clock stops here
    if cfg.eval.after and evaluates(run):
        run.evals["after"] = run_eval(run, run.run_dir / "eval" / "after", cfg.train.steps)
    if cfg.train.steps > start_step or run.resumed_from is None:
        save(run, cfg.train.steps)
    if run.evals:
        print_table(
            f"{task.name} on {cfg.data.test}",
            run.evals,
            run.console,
            categories={name: run.categories.get(name, {}) for name in run.evals},
            primary=task.primary_metric,
        )
    summary = {
        "run_dir": str(run.run_dir),
        "task": task.name,
        "metric": f"eval/{task.name}/{task.primary_metric}",
        "chance": task.chance(run.test_samples) if run.test_samples else None,
        "before": run.evals.get("before", {}).get("primary"),
        "after": run.evals.get("after", {}).get("primary"),
        "steps": cfg.train.steps,
        **({"best": run.best} if run.best else {}),
        # summed over the run's processes; this process's and the ones before apart
        **summary_times(run),
    }
    if run.rank == 0:
        (run.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        if (run.run_dir / "metrics.jsonl").is_file():  # none: a warm start alone, no evaluation
            report_runs([run.run_dir])
    skipped = skip_counts() - run.skipped_before
    if skipped:
        run.console.print(
            "skipped samples (data.on_error=skip; each named in train.log): "
            + ", ".join(f"{reason} ×{n}" for reason, n in sorted(skipped.items())),
            highlight=False,
            markup=False,
        )
    run.console.print(f"summary: {json.dumps(summary)}")
    return summary


# ---------------------------------------------------------------------------------------------
# Helpers


def _saved_evals(run_dir: Path) -> dict[str, dict[str, float]]:
    """A finished run's ``eval/before`` and ``eval/after`` metrics from their results.json."""
    evals = {}
    for name in ("before", "after"):
        path = run_dir / "eval" / name / "results.json"
        if path.is_file():
            evals[name] = json.loads(path.read_text()).get("metrics", {})
    return evals


def due(every: int, step: int, last: int) -> bool:
    """Whether a periodic action (every ``every`` steps; 0 = never) runs after ``step``; the
    last step is left to :func:`finish`."""
    return bool(every) and step % every == 0 and step != last


def _completion_rows(
    policy: Policy, rollouts: Rollouts, samples: list[Sample], scored: Any, group_size: int
) -> list[dict[str, Any]]:
    """The first two groups of a step, with the rendered prompt (media placeholders
    summarised, :func:`mmrft.evaluation.prompt_view.row_prompt_text`; ``None`` when the engine kept no
    prompt tokens) and media referenced by path."""
    rows = []
    for i in range(min(len(samples), 2 * group_size)):
        k = rollouts.prompt_index[i] if i < len(rollouts.prompt_index) else None
        prompt = rollouts.prompts[k] if k is not None and k < len(rollouts.prompts) else {}
        rows.append(
            {
                "id": samples[i].id,
                "prompt": row_prompt_text(policy, prompt) if "input_ids" in prompt else None,
                "media": samples[i].media(),
                "target": samples[i].target,
                "completion": rollouts.texts[i],
                **(
                    {"trajectory": rollouts.trajectories[i].to_json()}
                    if rollouts.trajectories is not None
                    else {}
                ),
                "reward": scored.total[i],
                "scores": {k: (s[i].value if s[i] else None) for k, s in scored.scores.items()},
                "reasons": {
                    k: s[i].reason for k, s in scored.scores.items() if s[i] and s[i].reason
                },
            }
        )
    return rows
