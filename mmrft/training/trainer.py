"""The GRPO training loop, top to bottom.

``train`` is set-up (:func:`setup`), the start (:func:`begin`: resume from a checkpoint, or
the warm start and the evaluation before RL), then per step:

1. **collect** (:class:`mmrft.rollout.collector.Collector`): ``train.prompts_per_step`` prompts, ``G``
   completions each, verified, shaped and filtered into a :class:`~mmrft.rollout.collector.StepBatch`;
2. **advantages** (:func:`advantages`): A_i from the group's rewards
   (``algorithm.advantage``), after the KL-to-reference term when it is part of the reward;
3. **update** (:func:`update`): μ = ``algorithm.updates_per_batch`` optimizer updates; each
   forwards the completions in micro-batches, loss = aggregated clipped surrogate (+ β·KL to a
   reference model, − entropy bonus) with the denominators of the *whole* step so that gradient
   accumulation equals one big batch; backward; clip; AdamW step; LR schedule step; then the
   engine gets the new weights;
4. **log / eval / checkpoint** (:func:`log_step`, :func:`run_eval`, :func:`save`);

and the end (:func:`finish`: evaluation after RL, the last checkpoint, the summary).

What this loop keeps of the papers and what it drops: one optimizer update per rollout batch
by default (μ = 1, so the old policy is the current one and the ratio is 1 at the update, as in
DeepSeekMath's GRPO as run by TRL / R1-V / VLM-R1); completions whose advantage is exactly 0
are not forwarded when they cannot contribute a gradient (β = 0 and no entropy bonus): their
loss term is exactly zero, and they still count in the token/sequence denominators, so the
update is identical and cheaper.

The optional supervised warm start (``warm_start``) runs before RL; the before/after
evaluation brackets the RL stage alone.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress

from mmrft import judges
from mmrft.algorithms import (
    group_advantages,
    group_stats,
    grpo_loss,
    kl_penalty,
    truncated_importance_weights,
)
from mmrft.config import RunConfig, check_config, config_diff, resolve_path, to_dict, to_yaml
from mmrft.data import (
    Sample,
    count_skip,
    skip_counts,
)
from mmrft.evaluation.evaluate import EvalResult, eval_verifiers, evaluate, print_table, write_eval
from mmrft.evaluation.prompt_view import row_prompt_text, show_prompt
from mmrft.evaluation.report import report_runs
from mmrft.evaluation.runlog import (
    GracefulStop,
    Heartbeat,
    NoSignalWatch,
    RunLog,
    attach_file_log,
    cpu_model,
    media_counters,
    merge_rank_metrics,
    progress_bar,
)
from mmrft.evaluation.tracking import build_trackers
from mmrft.plugins import load_plugins
from mmrft.policy.group import check_attention, packing, rollout_logps
from mmrft.policy.model import (
    Policy,
    completion_logps,
    is_lora,
    load_policy,
    merged_weights,
    pad_completions,
    resolve_family,
    save_pretrained,
)
from mmrft.rewards.reward import WeightedReward, build_reward
from mmrft.rewards.task import Task, build_task
from mmrft.rewards.verifier import RewardError, write_failure
from mmrft.rollout.ahead import AheadCollector, rollout_copy
from mmrft.rollout.base import Engine, Rollouts
from mmrft.rollout.collector import (
    BadMediaError,
    Collector,
    StepBatch,
    build_auxiliaries,
)
from mmrft.rollout.engine import build_engine
from mmrft.rollout.sampling import SampledStream, build_sampler
from mmrft.rollout.setup import read_data
from mmrft.rollout.tool_loop import ToolLoop, demonstration_call
from mmrft.runtime import distributed, zero
from mmrft.runtime.checkpoint import (
    checkpoint_step,
    find_resume_checkpoint,
    load_trainer_state,
    save_checkpoint,
    set_rng_state,
    write_failure_record,
)
from mmrft.runtime.device import pick_device, seed_everything
from mmrft.typecheck import ConfigError

log = logging.getLogger("mmrft")


# ---------------------------------------------------------------------------------------------
# Set-up helpers


def run_name(cfg: RunConfig) -> str:
    """``<task>__<model>__<seed>`` unless the config names the run."""
    return cfg.name or f"{cfg.task.name}__{Path(cfg.model.path).name}__{cfg.train.seed}"


def demonstration_turns(sample: Sample, answer: str, tool_loop: ToolLoop) -> list[str]:
    """A scripted trajectory's turn texts: the call on the sample's target when it has one,
    then the answer."""
    call = demonstration_call(sample, tool_loop.family, sorted(tool_loop.tools))
    return [call, answer_completion(answer)] if call else [answer_completion(answer)]


def answer_completion(reference: str) -> str:
    """The shortest correct completion for a reference answer, before the end-of-turn token:
    ``<answer>reference</answer>`` (what the warm start trains on)."""
    return f"<answer>{reference}</answer>"


def answers_over_budget(
    tokenizer: Any, task: Task, samples: list[Sample], max_new_tokens: int
) -> tuple[int, int]:
    """(how many, longest): samples whose shortest correct completion (:func:`answer_completion`
    and the end-of-turn token) is longer than ``max_new_tokens`` tokens. Such a sample can never
    earn the full reward (it is cut off before the answer closes), which no training curve shows
    by itself: the tiny detection recipe lost every 3- and 4-box image to a 112-token budget
    this way. (0, 0) for a task without reference answers."""
    texts = []
    for sample in samples:
        try:
            texts.append(answer_completion(task.reference_answer(sample)))
        except NotImplementedError:
            return 0, 0
        except Exception:  # a check, not a gate: a sample it cannot phrase is not counted
            continue
    if not texts:
        return 0, 0
    lengths = [len(ids) + 1 for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    return sum(n > max_new_tokens for n in lengths), max(lengths)


def warn_answers_over_budget(
    cfg: RunConfig,
    run_tokenizer: Any,
    task: Task,
    train_samples: list[Sample],
    test_samples: list[Sample],
) -> list[str]:
    """The start-up warnings of :func:`answers_over_budget` for the rollout and evaluation
    budgets, each naming the key to raise; logged and returned."""
    warnings = []
    checks = [
        ("rollout.max_new_tokens", cfg.rollout.max_new_tokens, train_samples, "training"),
        (
            "eval.max_new_tokens" if cfg.eval.max_new_tokens else "rollout.max_new_tokens",
            cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens,
            test_samples,
            "test",
        ),
    ]
    for key, budget, samples, split in checks:
        over, longest = answers_over_budget(run_tokenizer, task, samples, budget)
        if over:
            warnings.append(
                f"{key}={budget}: {over} of {len(samples)} {split} samples need more tokens for "
                f"a correct answer alone (the longest {longest}); they cannot earn full reward "
                f"or a correct evaluation. Raise {key} to at least {longest}."
            )
            log.warning(warnings[-1])
    return warnings


def lr_lambda(cfg: RunConfig):
    # counted in optimizer updates: train.steps × algorithm.updates_per_batch
    warmup, schedule = cfg.optim.warmup_steps, cfg.optim.schedule
    total = max(cfg.train.steps * cfg.algorithm.updates_per_batch, 1)

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if schedule == "cosine":
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0

    return factor


def micro_batches(indices: list[int], size: int) -> Iterator[list[int]]:
    for begin in range(0, len(indices), size):
        yield indices[begin : begin + size]


def media_limits(samples: list[Sample], tool_media: int = 0) -> dict[str, int]:
    """The most images, videos and audio clips one sample holds (what an engine reserves),
    each raised by ``tool_media``, the images and clips tools may add to a trajectory."""
    return {
        kind: max((len(s.media(kind)) for s in samples), default=0)
        + (tool_media if kind != "audio" else 0)
        for kind in ("image", "video", "audio")
    }


# ---------------------------------------------------------------------------------------------
# The warm start (optional, supervised)


def warm_start(
    policy: Policy,
    task: Task,
    samples: list[Sample],
    cfg: RunConfig,
    console: Console,
    tool_loop: ToolLoop | None = None,
) -> list[float]:
    """Supervised steps on ``<answer>reference</answer>`` completions; returns the loss of
    every step (shown on a progress bar as it runs).

    With ``warm_start.demonstrations`` (and the run's ``tool_loop``) a completion is the
    trajectory of a scripted "look closer" policy (:func:`mmrft.rollout.tool_loop.demonstration_call`,
    then the answer), built by the loop's own code, trained on the model's tokens only.

    ``labels="random"`` pairs each prompt with the reference answer of another random sample:
    the model learns the answer *format* and the label distribution, but nothing about the
    image, so the accuracy after the warm start stays at chance and every gain measured across
    RL is RL's. ``labels="target"`` is ordinary SFT.
    """
    ws = cfg.warm_start
    if task.think == "required":
        raise ValueError(
            "warm_start needs task.params.think 'none' or 'optional' (it writes no think block)"
        )
    rng = random.Random(cfg.train.seed + 1)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=ws.lr, weight_decay=0.0)
    end_of_turn = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    references = [task.reference_answer(s) for s in samples]
    losses: list[float] = []
    world, rank = distributed.world_size(), distributed.rank()
    with progress_bar(console) as progress:
        bar = progress.add_task("warm start", total=ws.steps, info="")
        for step in range(ws.steps):
            drawn = [rng.randrange(len(samples)) for _ in range(ws.batch_size)]
            labels = [rng.randrange(len(samples)) for _ in range(ws.batch_size)]
            share = slice(rank * ws.batch_size // world, (rank + 1) * ws.batch_size // world)
            batch, labels = drawn[share], labels[share]
            answers = [
                references[j] if ws.labels == "random" else references[i]
                for i, j in zip(batch, labels)
            ]
            conversations = [task.prompt(samples[i], policy.family) for i in batch]
            trajectories = None
            if ws.demonstrations and tool_loop is not None:
                conversations = [
                    tool_loop.with_tools(c, samples[i]) for c, i in zip(conversations, batch)
                ]
                trajectories = [
                    tool_loop.demonstration(
                        samples[i], demonstration_turns(samples[i], a, tool_loop)
                    )
                    for i, a in zip(batch, answers)
                ]
            prepared = policy.family.prepare(
                policy.processor, conversations, add_generation_prompt=True
            )
            rows = policy.family.split_rows(prepared, policy.processor)
            if trajectories is not None:
                completions = [t.ids for t in trajectories]
            else:
                completions = [
                    policy.tokenizer.encode(answer_completion(a), add_special_tokens=False)
                    + [end_of_turn]
                    for a in answers
                ]
            logps, mask, _ = completion_logps(policy, rows, completions, trajectories=trajectories)
            if trajectories is not None:  # the model's own tokens only
                loss_mask, _ = pad_completions([t.loss_mask for t in trajectories], 0)
                mask = mask * loss_mask.to(mask.device)
            tokens = distributed.sum_scalar(float(mask.sum()))  # mean over every rank's tokens
            loss = -(logps * mask).sum() / tokens
            loss.backward()
            distributed.sum_gradients(params)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(distributed.sum_scalar(loss.item()))
            recent = float(np.mean(losses[-20:]))
            progress.update(bar, completed=step + 1, info=f"loss {recent:.3f}")
            if (step + 1) % 20 == 0 or step + 1 == ws.steps:
                log.info("warm start %d/%d: loss %.3f", step + 1, ws.steps, recent)
    return losses


# ---------------------------------------------------------------------------------------------
# The run: set-up, start, loop, end


@dataclass
class Run:
    """Everything a training run holds between set-up and the end."""

    cfg: RunConfig
    console: Console
    rank: int
    world: int
    run_dir: Path
    task: Task
    reward: WeightedReward
    policy: Policy
    reference: Policy | None
    train_samples: list[Sample]
    test_samples: list[Sample]
    engine: Engine
    collector: Collector | AheadCollector
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    stream: SampledStream
    runlog: RunLog
    t_start: float
    no_signal: NoSignalWatch
    evals: dict[str, dict[str, float]] = field(default_factory=dict)
    # per-category results of each evaluation, by its directory name (before, after, step-N)
    categories: dict[str, dict[str, Any]] = field(default_factory=dict)
    resumed_from: Path | None = None
    progress: Progress | None = None  # the RL loop's live progress display, while it runs
    eval_verifiers: Any = None  # eval.verifiers, built at set-up (a bad entry fails there)
    skipped_before: Counter = field(default_factory=Counter)  # skip_counts() at set-up


# Keys a resumed run may change: how long it trains, how it evaluates, logs and checkpoints,
# where and how it is laid out in memory (sharding, chunks, recomputation): none changes what a
# step computes beyond float summation order (a checkpoint resumes on any world size).
RESUME_FREE = (
    "train.steps",
    "train.log_every",
    "train.completions_every",
    "train.heartbeat_s",
    "train.trackers",
    "train.threads",
    "train.micro_batch_size",
    "train.sharding",
    "train.deepspeed",
    "rollout.micro_group",
    "rollout.vllm.gpu_memory_utilization",
    "rollout.vllm.kv_cache_gb",
    "rollout.vllm.sleep",
    "model.gradient_checkpointing",
    "eval.",
    "checkpoint.",
    "output_dir",
    "name",
    "device",
    "rollout.batch_size",
    "data.max_test_samples",
    "data.test",
)


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}{key}."))
    return {k.rstrip("."): v for k, v in out.items()}


def config_changes(saved_text: str, cfg: RunConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """The keys (dotted) where a run's saved ``config.yaml`` (``saved_text``) differs from
    ``cfg``: ``({key: saved value}, {key: value in cfg})``, sorted by key. A key the saved
    run did not know (added to mmrft since) ran as its default then, and counts as such."""
    from mmrft.config import yaml_load

    saved = _flat(yaml_load(saved_text) or {})
    now = _flat(yaml_load(to_yaml(cfg)))
    defaults = _flat(yaml_load(to_yaml(RunConfig())))
    saved = {**{k: v for k, v in defaults.items() if k not in saved}, **saved}
    changed = [k for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)]
    return {k: saved.get(k) for k in changed}, {k: now.get(k) for k in changed}


def resume_point(cfg: RunConfig) -> Path | None:
    """The checkpoint ``cfg`` resumes from (``checkpoint.resume``), checked before anything
    loads: with ``auto`` (or a path) a run whose saved ``config.yaml`` differs from ``cfg`` in
    a key outside :data:`RESUME_FREE` (a key missing there, newer than the run, counts as its
    default) is refused with a :class:`ConfigError` naming each
    changed key and the three ways out; ``force`` resumes all the same."""
    run_dir = resolve_path(cfg.output_dir) / run_name(cfg)
    checkpoint = find_resume_checkpoint(run_dir, cfg.checkpoint.resume)
    saved_file = run_dir / "config.yaml"
    if checkpoint is None or cfg.checkpoint.resume == "force" or not saved_file.is_file():
        return checkpoint
    saved, now = config_changes(saved_file.read_text(encoding="utf-8"), cfg)
    changed = [key for key in saved if not key.startswith(RESUME_FREE)]
    if changed:
        shown = "; ".join(f"{k}: {saved.get(k)!r} → {now.get(k)!r}" for k in changed[:8])
        more = f" (and {len(changed) - 8} more)" if len(changed) > 8 else ""
        raise ConfigError(
            f"checkpoint.resume: {run_dir} has a checkpoint ({checkpoint.name}) made with other "
            f"settings: {shown}{more}. To start over: checkpoint.resume=never; to keep both "
            "runs: a new name=; to continue with the new settings: checkpoint.resume=force"
        )
    return checkpoint


def finished_summary(cfg: RunConfig, checkpoint: Path | None, console: Console) -> dict | None:
    """The saved summary of a run whose checkpoint is already at ``train.steps`` (``None``
    otherwise): a finished run says so and changes nothing."""
    step = checkpoint_step(checkpoint) if checkpoint is not None else None
    if step is None or step < cfg.train.steps:
        return None
    run_dir = resolve_path(cfg.output_dir) / run_name(cfg)
    console.print(
        f"{run_dir} is finished (checkpoint at step {step}, train.steps {cfg.train.steps}); "
        "nothing to do. To train further raise train.steps; to start over "
        "checkpoint.resume=never."
    )
    summary_file = run_dir / "summary.json"
    summary = (
        json.loads(summary_file.read_text())
        if summary_file.is_file()
        else {"run_dir": str(run_dir), "steps": step}
    )
    console.print(f"summary: {json.dumps(summary)}")
    return summary


def train(cfg: RunConfig, console: Console | None = None) -> dict[str, Any]:
    """Run warm start (optional), evaluation, GRPO, evaluation; return the run summary. A
    finished run (its checkpoint at ``train.steps``) changes nothing and returns its summary;
    a resume with a changed config is refused (:func:`resume_point`)."""
    finished = finished_summary(cfg, resume_point(cfg), console or Console())
    if finished is not None:
        return finished
    run = setup(cfg, console)
    try:
        start_step = begin(run)
        run.collector.start(start_step + 1, cfg.train.steps)
        t_train = time.perf_counter()
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

                if due(cfg.eval.every, step, cfg.train.steps) and run.test_samples:
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
        return finish(run, start_step, time.perf_counter() - t_train)
    finally:
        run.collector.close()  # the rollout thread, if one runs ahead
        run.engine.close()
        run.reward.close()  # the verifier workers
        if run.eval_verifiers is not None:
            run.eval_verifiers.close()
        run.runlog.close()


def run_banner(cfg: RunConfig, policy: Policy, task: str, device: Any, world: int) -> str:
    """What the run is, shown whether or not it equals a default: model (family, dtype), task,
    device, processes, trainable parameters (of all; LoRA's rank), tools."""
    parameters = list(policy.model.parameters())
    trainable = sum(p.numel() for p in parameters if p.requires_grad)
    total = sum(p.numel() for p in parameters)
    lora = f", LoRA r={cfg.model.lora.r}" if cfg.model.lora.enabled else ""
    tools = cfg.rollout.tools
    used = (
        f"; tools {', '.join(tools.names)} (at most {tools.max_turns} turns)" if tools.names else ""
    )
    return (
        f"run: model {cfg.model.path} ({policy.family.name}, {cfg.model.dtype}); task {task}; "
        f"device {device}; {world} process{'es' if world > 1 else ''}; trainable parameters "
        f"{trainable:,} of {total:,}{lora}{used}"
    )


def due(every: int, step: int, last: int) -> bool:
    """Whether a periodic action (every ``every`` steps; 0 = never) runs after ``step``; the
    last step is left to :func:`finish`."""
    return bool(every) and step % every == 0 and step != last


def setup(cfg: RunConfig, console: Console | None = None) -> Run:
    """Processes, config checks, run directory, task, reward, model(s), data, engine, optimizer,
    collector and logs: everything the loop needs, nothing trained yet."""
    t_start = time.perf_counter()
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    rank, world = distributed.setup()
    # an accelerate config's FSDP / DeepSpeed settings become train.sharding (mmrft owns the loop)
    cfg.train.sharding, cfg.train.deepspeed = distributed.sharding_from_launcher(
        cfg.train.sharding, cfg.train.deepspeed
    )
    check_config(cfg)
    console = (console or Console()) if rank == 0 else Console(quiet=True)
    if cfg.train.prompts_per_step % world:
        raise ConfigError(
            f"train.prompts_per_step: {cfg.train.prompts_per_step} prompts do not split over {world} processes"
        )
    seed_everything(cfg.train.seed + rank)  # rank 0 draws exactly as a single process would
    device = pick_device(cfg.device)
    load_plugins(cfg.plugins)

    run_dir = resolve_path(cfg.output_dir) / run_name(cfg)
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(to_yaml(cfg))
        attach_file_log(run_dir / "train.log")
        log.info(
            "machine: %s, torch %s, %d threads",
            cpu_model(),
            torch.__version__,
            torch.get_num_threads(),
        )
    distributed.barrier()
    judges.use_run_dir(run_dir, rank)  # judges' verdicts outlive the process (judge_cache*.jsonl)
    console.rule(f"[bold]mmrft train[/bold] → {escape(str(run_dir))}")
    console.print(
        f"config, what differs from the defaults (all of it: {run_dir / 'config.yaml'}):\n"
        + to_yaml(config_diff(cfg)).rstrip(),
        highlight=False,
        markup=False,
    )

    task = build_task(cfg.task.name, cfg.task.params, cfg.task.system_prompt)
    reward = build_reward(
        cfg.reward.verifiers or task.default_verifiers(),
        cfg.reward.timeout_s,
        cfg.reward.on_timeout,
        cfg.reward.isolation,
        cfg.reward.workers,
        cfg.reward.worker_memory_mb,
    )
    auxiliaries = build_auxiliaries(cfg, reward)  # checked against the verifiers now
    low, high = reward.range
    console.print(
        "reward = "
        + " + ".join(f"{w:g}·{v.name}[{v.spec.low:g},{v.spec.high:g}]" for v, w in reward.verifiers)
        + f"  ∈ [{low:g}, {high:g}]",
        highlight=False,
        markup=False,
    )
    family = resolve_family(cfg.model)
    skipped_before = skip_counts()
    train_samples, test_samples = read_data(cfg, task, family)
    sampler = build_sampler(cfg.data.sampler, cfg.data.sampler_params, train_samples)
    policy = load_policy(cfg.model, device, family=family)
    if rank == 0:
        if cfg.name.endswith("-smoke"):  # --smoke cuts every budget to 8 tokens on purpose
            console.print(
                "smoke run: completions are cut at a few tokens on purpose (the pipeline is "
                "checked, not the answers)"
            )
        else:
            for warning in warn_answers_over_budget(
                cfg, policy.tokenizer, task, train_samples, test_samples
            ):
                console.print(f"[yellow]warning:[/yellow] {escape(warning)}")
    if rank == 0 and (train_samples or test_samples):  # what the model is shown, once
        sample = (train_samples or test_samples)[0]
        shown = show_prompt(policy, task.prompt(sample, family), sample.id)
        console.print(shown, highlight=False, markup=False)
        log.info(shown)
    console.print(run_banner(cfg, policy, task.name, device, world), highlight=False, markup=False)
    distributed.broadcast_parameters(policy.model)
    if cfg.rollout.max_staleness and world > 1 and cfg.rollout.engine == "vllm":
        raise ConfigError(
            "rollout.max_staleness: under several processes the colocated vLLM engine shares "
            "the trainer's process group, which the rollout thread cannot use; use "
            "rollout.engine=hf or vllm_server, or set rollout.max_staleness=0"
        )
    # asynchronous rollouts sample in a thread from a copy of the weights (mmrft.rollout.ahead): for
    # hf a whole copy of the model, made before the policy is sharded; the vLLM engines hold
    # their own
    ahead_copy = cfg.rollout.max_staleness and cfg.rollout.engine == "hf"
    sampler_policy = rollout_copy(policy) if ahead_copy else policy
    distributed.shard_model(policy.model, cfg.train.sharding)
    reference = load_policy(cfg.model, device, trainable=False) if cfg.algorithm.beta > 0 else None
    if reference is not None:  # sharded like the policy, freed after every forward
        distributed.shard_model(
            reference.model,
            cfg.train.sharding,
            frozen=True,
            deepspeed_config=deepspeed_config(cfg, world, training=False),
        )
    if cfg.rollout.group_shared:
        try:
            check_attention(policy.model)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    engine = build_engine(
        cfg.rollout,
        sampler_policy,
        model_path=str(resolve_path(cfg.model.path)),
        limits=media_limits(
            train_samples + test_samples,
            cfg.rollout.tools.max_media if cfg.rollout.tools.names else 0,
        ),
        seed=cfg.train.seed + rank,
    )
    if engine.name != "hf" and train_samples:  # the engine must see the trainer's tokens
        probe = train_samples[:4]
        engine.check_parity([task.prompt(s, family) for s in probe], [s.id for s in probe])
    if cfg.algorithm.tis_cap and not (engine.name != "hf" or cfg.rollout.group_shared):
        raise ConfigError(
            "algorithm.tis_cap: needs an engine that reports its sampling log-probs "
            "(rollout.engine=vllm, or hf with rollout.group_shared=true)"
        )
    params = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=cfg.optim.lr, betas=tuple(cfg.optim.betas), weight_decay=cfg.optim.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    stream = SampledStream(sampler, train_samples, cfg.train.seed, cfg.train.steps, reward.range)
    runlog = RunLog(
        run_dir,
        trackers=build_trackers(
            cfg.train.trackers if rank == 0 else [],
            run_dir,
            run_name(cfg),
            to_dict(cfg),
            cfg.train.wandb_project,
            cfg.train.wandb_mode,
        ),
        enabled=rank == 0,
    )
    collector: Collector | AheadCollector = Collector(
        cfg, task, sampler_policy, engine, reward, train_samples, stream, auxiliaries
    )
    if cfg.rollout.max_staleness:
        collector = AheadCollector(
            collector, policy, cfg.rollout.max_staleness, cfg.rollout.partial_rollouts
        )
    return Run(
        cfg=cfg,
        console=console,
        rank=rank,
        world=world,
        run_dir=run_dir,
        task=task,
        reward=reward,
        policy=policy,
        reference=reference,
        train_samples=train_samples,
        test_samples=test_samples,
        engine=engine,
        collector=collector,
        optimizer=optimizer,
        scheduler=scheduler,
        stream=stream,
        runlog=runlog,
        t_start=t_start,
        no_signal=NoSignalWatch(cfg.train.warn_no_signal_steps),
        eval_verifiers=eval_verifiers(cfg),
        skipped_before=skipped_before,
    )


def begin(run: Run) -> int:
    """Resume from the newest checkpoint (``checkpoint.resume``), or run the warm start and the
    evaluation before RL; hand the optimizer to the sharding engine. Returns the last step
    already done (0 for a new run)."""
    cfg, start_step = run.cfg, 0
    checkpoint = find_resume_checkpoint(run.run_dir, cfg.checkpoint.resume)  # train() checked it
    if checkpoint is not None:
        state = load_trainer_state(checkpoint)
        _load_weights(run.policy, checkpoint)
        run.scheduler.load_state_dict(state["scheduler"])
        _restore_rng(state, cfg, run.rank, run.world)
        run.stream.position = state["data_position"]
        run.stream.bad = set(state.get("bad_samples", []))
        run.collector.stats.load_state_dict(state.get("prompt_stats", {}))
        run.evals = state.get("evals", {})
        run.categories = state.get("eval_categories", {})
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
                run.reference = warm_started_reference(run, load=False)
    skip_failed_media(run)
    saved = run.run_dir / REFERENCE_FILE  # the warm start's reference, not model.path's
    if checkpoint is not None and run.reference is not None and saved.is_file():
        run.reference = None
        run.reference = warm_started_reference(run, load=True)
    run.collector.sync_weights(start_step)  # an engine with its own weights starts from these
    if checkpoint is None and cfg.eval.before and run.test_samples:
        run.evals["before"] = run_eval(run, run.run_dir / "eval" / "before", 0)
    # DeepSpeed: the engine takes the model and optimizer now, after weights were loaded
    distributed.prepare_optimizer(
        run.policy.model, run.optimizer, cfg.train.sharding, deepspeed_config(cfg, run.world)
    )
    if checkpoint is not None:
        distributed.load_full_optimizer_state(run.policy.model, run.optimizer, state["optimizer"])
    _check_replicas(run.policy, "start")
    return start_step


REFERENCE_FILE = "reference.safetensors"


def warm_started_reference(run: Run, load: bool) -> Policy:
    """The KL reference after a warm start: a frozen copy of the warm-started policy, the model
    RL starts from (the papers' reference is the SFT model RL begins with). The reference read
    from ``model.path`` would be the model *before* the warm start: KL to it pulls the policy
    back to not writing the answer format at all.

    After the warm start (``load`` False) rank 0 writes its weights to
    ``run_dir/reference.safetensors`` (the plain model's tensors, LoRA merged in, so any
    sharding mode reads it back); a resumed run (``load`` True) reads them back on every rank,
    so the reference is the same model after a resume. Unsharded without LoRA, every rank
    copies its own policy (identical on every rank), never reading a file rank 0 may still be
    writing. Otherwise the policy's full weights are gathered to rank 0 (a collective when
    sharded), merged and written, and every rank loads the file into a fresh frozen model from
    ``model.path``, sharded like the one it replaces.
    """
    import copy

    from safetensors.torch import load_model, save_model

    cfg, policy = run.cfg, run.policy
    path = run.run_dir / REFERENCE_FILE
    lora = is_lora(policy.model)
    if cfg.train.sharding == "none" and not lora:
        model = copy.deepcopy(policy.model).eval()
        for param in model.parameters():
            param.requires_grad_(False)
        if load:
            load_model(model, str(path))
        elif run.rank == 0:
            save_model(model, str(path))
        return Policy(policy.family, model, policy.processor)
    reference = load_policy(cfg.model, policy.device, trainable=False)
    if not load:
        weights = distributed.full_model_state(policy.model)  # collective: rank 0's is full
        if weights is None:  # unsharded or ZeRO-2: every rank's parameters are whole already
            weights = policy.model.state_dict() if run.rank == 0 else {}
        if run.rank == 0:  # written as the unsharded path writes it (tied weights once)
            if lora:
                weights = dict(merged_weights(policy.model, weights))
            reference.model.load_state_dict(weights)
            save_model(reference.model, str(path))
        del weights
        distributed.barrier()
    load_model(reference.model, str(path))
    distributed.shard_model(
        reference.model,
        cfg.train.sharding,
        frozen=True,
        deepspeed_config=deepspeed_config(cfg, run.world, training=False),
    )
    return reference


def finish(run: Run, start_step: int, train_seconds: float) -> dict[str, Any]:
    """Evaluation after RL, the last checkpoint, the before/after table and ``summary.json``."""
    cfg, task = run.cfg, run.task
    if cfg.eval.after and run.test_samples:
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
        "train_seconds": round(train_seconds, 1),
        "total_seconds": round(time.perf_counter() - run.t_start, 1),
    }
    if run.rank == 0:
        (run.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
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


def collect(run: Run, step: int) -> StepBatch:
    """The step's batch from the collector. A verifier that breaks its contract (raises,
    returns a value outside its range, NaN, over its budget under ``on_timeout: stop``) stops
    the run with ``failure.json`` naming the step, the verifier and the samples; so do media
    that fail when drawn under ``data.on_error=raise`` (``bad_media``: each sample's id,
    dataset line and error, which a resume skips: :func:`skip_failed_media`)."""
    try:
        return run.collector.collect(step)
    except RewardError as exc:
        if run.rank == 0:
            write_failure(run.run_dir, exc, step)
        raise
    except BadMediaError as exc:
        if run.rank == 0:
            record = {
                "step": step,
                "reason": str(exc),
                "samples": sorted({f["id"] for f in exc.failed}),
                "bad_media": exc.failed,
            }
            write_failure_record(run.run_dir, record)
        raise


def skip_failed_media(run: Run) -> None:
    """After a run stopped on media that failed when drawn (``failure.json``'s ``bad_media``),
    a resume never draws those samples again: each still at its index (same id) joins the
    stream's bad set and is named on the console."""
    failure = run.run_dir / "failure.json"
    if run.cfg.checkpoint.resume == "never" or not failure.is_file():
        return
    try:
        bad_media = json.loads(failure.read_text(encoding="utf-8")).get("bad_media") or []
    except (json.JSONDecodeError, AttributeError):
        return
    for bad in bad_media:
        index = bad.get("index")
        if not (isinstance(index, int) and 0 <= index < len(run.train_samples)):
            continue
        if run.train_samples[index].id != bad.get("id") or index in run.stream.bad:
            continue
        run.stream.bad.add(index)
        count_skip("media failed when drawn (failure.json)")
        log.warning("skipped %s (sample %s): named by %s", bad.get("where"), bad["id"], failure)
        run.console.print(
            f"{failure} stopped the last run on sample {bad['id']} ({bad.get('where')}): "
            "it is skipped from now on",
            highlight=False,
            markup=False,
        )


def advantages(run: Run, batch: StepBatch, step: int, heartbeat: Heartbeat) -> torch.Tensor:
    """A_i of the kept completions from their group's rewards (``algorithm.advantage``), after
    subtracting β·KL(π_θ ‖ π_ref) per completion when ``algorithm.kl_mode`` is ``reward``."""
    cfg = run.cfg
    if run.reference is not None and cfg.algorithm.kl_mode == "reward":
        heartbeat.phase(f"KL to the reference, step {step}")
        kl = _sequence_kl(run.policy, run.reference, batch, cfg)
        batch.rewards = batch.rewards - cfg.algorithm.beta * kl
        batch.counts["train/kl_in_reward"] = float(kl.mean()) if len(kl) else 0.0
    if not len(batch.rewards):
        return batch.rewards
    return group_advantages(
        batch.rewards, cfg.rollout.group_size, mode=cfg.algorithm.advantage, eps=cfg.algorithm.eps
    )


def update(run: Run, batch: StepBatch, advantage: torch.Tensor, step: int) -> dict[str, float]:
    """The optimizer updates of one step (:func:`_update`), then the new weights to the engine.
    A non-finite loss or gradient writes ``failure.json`` naming the step and samples."""
    try:
        stats = _update(
            run.policy,
            run.reference,
            run.optimizer,
            run.scheduler,
            batch,
            advantage,
            run.cfg,
            step,
        )
    except FloatingPointError as exc:
        _write_failure(run.run_dir, step, str(exc), batch.samples)
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
    times = {k: v for k, v in stats.items() if k.startswith(("time/", "rollout/"))}
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


def save(run: Run, step: int) -> None:
    """Write the checkpoint of ``step`` (collective: every rank takes part, rank 0 writes)."""
    _check_replicas(run.policy, f"step {step}")
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
        "config": to_dict(run.cfg),
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


def run_eval(run: Run, directory: Path, step: int) -> dict[str, float]:
    """Greedy evaluation on rank 0 (greedy decoding draws no random numbers, so no rank's
    sampling stream moves); the metrics reach every rank."""
    cfg, task, shared = run.cfg, run.task, None
    # sharded: every rank takes part in gathering the parameters, then rank 0 alone generates
    with distributed.gathered(run.policy.model):
        if distributed.is_main():
            # a bar on the RL loop's display while it runs, else a display of its own
            own = progress_bar(run.console, transient=True)
            with nullcontext(run.progress) if run.progress else own as progress:
                result: EvalResult = evaluate(
                    run.policy,
                    task,
                    run.test_samples,
                    cfg.eval.batch_size,
                    cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens,
                    progress,
                    # an engine with its own weights (vLLM) holds the current ones; hf builds
                    # its own with the evaluation batch size
                    engine=None if run.engine.name == "hf" else run.engine,
                    tool_loop=run.collector.tool_loop,
                    n=cfg.eval.n,
                    temperature=cfg.eval.temperature,
                    seed=cfg.train.seed,
                    verifiers=run.eval_verifiers,
                )
            write_eval(result, directory, {"step": step})
            run.runlog.metrics(
                step,
                {f"eval/{task.name}/{k}": v for k, v in result.metrics.items() if k != "primary"},
            )
            run.console.print(
                f"eval step {step}: {task.primary_metric} = {result.primary:.3f} "
                f"(format_fail {result.metrics.get('format_fail', 0):.3f}, {result.seconds:.1f}s)"
            )
            shared = (result.metrics, result.categories)
    metrics, run.categories[directory.name] = distributed.broadcast_object(shared)
    return metrics


# ---------------------------------------------------------------------------------------------
# The GRPO update


def _update(
    policy: Policy,
    reference: Policy | None,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batch: StepBatch,
    advantages: torch.Tensor,
    cfg: RunConfig,
    step: int,
) -> dict[str, float]:
    """μ = ``updates_per_batch`` optimizer updates on one rollout batch.

    Each update runs every micro-batch forward/backward with the denominators of the whole
    batch, then clips and steps. With μ = 1 the old policy *is* the current one (ratio 1 at the
    update, detached log-probs); with μ > 1 the old log-probs are computed once before the first
    update and stored, so later updates see a real ratio and the clip acts. Completions with
    advantage 0 are skipped when they cannot contribute (β = 0, no entropy bonus): their loss
    term is exactly zero and they still count in the denominators. Sharded (``train.sharding``),
    a rank with fewer micro-batches than another adds passes with loss 0 (``_padding_passes``).
    """
    algo = cfg.algorithm
    rollouts = batch.rollouts
    n = len(rollouts.completion_ids)
    # completions left out of the loss (algorithm.mask_truncated_completions)
    masked = {i for i in range(n) if algo.mask_truncated_completions and rollouts.truncated[i]}
    # step-wide denominators over every rank, so the summed gradients equal one big batch's
    num_seqs = distributed.sum_scalar(float(n))
    num_tokens = distributed.sum_scalar(
        float(sum(rollouts.loss_tokens(i) for i in range(n) if i not in masked))
    )
    if num_seqs == 0:
        return {"active_frac": 0.0}
    needs_all = (algo.beta > 0 and algo.kl_mode == "loss") or algo.entropy_coef > 0
    active = [i for i in range(n) if i not in masked and (needs_all or advantages[i].item() != 0.0)]
    chunks = list(micro_batches(active, cfg.train.micro_batch_size))
    padding = _padding_passes(policy, len(chunks))

    def forward(
        model: Policy, chunk: list[int], with_grad: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        with torch.set_grad_enabled(with_grad):
            return training_forward(model, rollouts, chunk, cfg, with_entropy=with_grad)

    clock = Clock(policy.device)
    stored_old: list[torch.Tensor | None] = [None] * len(chunks)
    stored_ref: list[torch.Tensor | None] = [None] * len(chunks)
    for k, chunk in enumerate(chunks):
        if algo.updates_per_batch > 1:
            stored_old[k] = forward(policy, chunk, with_grad=False)[0]
        if reference is not None and algo.kl_mode == "loss":
            stored_ref[k] = forward(reference, chunk, with_grad=False)[0]
    for _ in range(padding):  # the same no-grad passes, in the same order, as other ranks
        with torch.no_grad():
            if algo.updates_per_batch > 1:
                _padding_pass(policy, rollouts, cfg)
            if reference is not None and algo.kl_mode == "loss":
                _padding_pass(reference, rollouts, cfg)
    clock.lap("no_grad_forward_s")

    totals: Counter = Counter()
    weight = 0.0
    grad_norms = []
    gap = Counter()  # the sampler's log-probs against π_old's (engines that report them)
    for update in range(algo.updates_per_batch):
        for k, chunk in enumerate(chunks):
            logps, mask, entropy = forward(policy, chunk, with_grad=True)
            old = stored_old[k] if stored_old[k] is not None else logps.detach()
            sampler = sampler_logps(rollouts, chunk, old)
            if sampler is not None and update == 0:
                diff = (old - sampler).abs() * mask
                gap["sum"] += float(diff.sum())
                gap["tokens"] += float(mask.sum())
                gap["max"] = max(gap["max"], float(diff.max()) if diff.numel() else 0.0)
            tis = (
                truncated_importance_weights(old, sampler, algo.tis_cap)
                if algo.tis_cap and sampler is not None
                else None
            )
            loss, stats = grpo_loss(
                logps,
                old,
                advantages[chunk].to(logps.device),
                mask.float(),
                ref_logps=stored_ref[k],
                beta=algo.beta if algo.kl_mode == "loss" else 0.0,
                kl_estimator=algo.kl_estimator,
                entropy=entropy if algo.entropy_coef > 0 else entropy.detach(),
                entropy_coef=algo.entropy_coef,
                clip_low=algo.clip_low,
                clip_high=algo.clip_high,
                ratio_level=algo.ratio_level,
                dual_clip=algo.dual_clip,
                agg_mode=algo.agg_mode,
                num_tokens=num_tokens,
                num_seqs=num_seqs,
                max_len=cfg.rollout.max_new_tokens,
                token_weights=tis,
            )
            if not torch.isfinite(loss):
                ids_text = ", ".join(sorted({batch.samples[i].id for i in chunk}))
                raise FloatingPointError(f"non-finite loss at step {step} (samples: {ids_text})")
            distributed.backward(policy.model, loss)
            tokens = float(mask.sum().item())
            weight += tokens
            totals["loss"] += loss.item() / algo.updates_per_batch
            for key, value in stats.items():
                totals[key] += float(value) * tokens
        for _ in range(padding):
            distributed.backward(policy.model, _padding_pass(policy, rollouts, cfg))
        clock.lap("forward_backward_s")

        def check_norm(norm: float) -> None:
            if not math.isfinite(norm):
                ids_text = ", ".join(sorted({s.id for s in batch.samples}))
                raise FloatingPointError(
                    f"non-finite gradient norm at step {step} (samples: {ids_text})"
                )

        grad_norms.append(
            distributed.clip_and_step(policy.model, optimizer, cfg.optim.max_grad_norm, check_norm)
        )
        scheduler.step()
        clock.lap("optimizer_s")
    out = {k: v / weight for k, v in totals.items() if k != "loss" and weight}
    out["loss"] = totals["loss"]
    out["grad_norm"] = float(np.mean(grad_norms)) if grad_norms else 0.0
    out["active_frac"] = len(active) / max(n, 1)
    if algo.mask_truncated_completions:
        out["masked_truncated_frac"] = len(masked) / max(n, 1)
    out.update({f"time/{k}": v for k, v in clock.totals.items()})
    if gap["tokens"]:
        out["rollout/logp_gap_mean"] = gap["sum"] / gap["tokens"]
        out["rollout/logp_gap_max"] = gap["max"]
    return out


def sampler_logps(rollouts: Rollouts, chunk: list[int], like: torch.Tensor) -> torch.Tensor | None:
    """The engine's log-probs of the completions ``chunk``, right-padded like ``like``
    (``[n, C]``), or None when the engine reports none."""
    if rollouts.logprobs is None:
        return None
    out = torch.zeros_like(like)
    for row, i in enumerate(chunk):
        values = rollouts.logprobs[i][: out.shape[1]]
        out[row, : len(values)] = torch.tensor(values, dtype=out.dtype)
    return out


def training_forward(
    policy: Policy, rollouts: Rollouts, indices: list[int], cfg: RunConfig, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """log-probs (mask, entropy) of the completions ``indices``: group-shared packed rows
    (``rollout.group_shared``, at most ``rollout.micro_group`` completions per prompt pass) or
    one sequence per completion."""
    return rollout_logps(
        policy,
        rollouts,
        indices,
        group_shared=cfg.rollout.group_shared,
        micro_group=cfg.rollout.micro_group,
        with_entropy=with_entropy,
    )


class Clock:
    """Seconds between laps, summed per name (CUDA work synchronised before each reading)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.totals: dict[str, float] = {}
        self.last = self._now()

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def lap(self, name: str) -> None:
        now = self._now()
        self.totals[name] = self.totals.get(name, 0.0) + now - self.last
        self.last = now


def _sequence_kl(
    policy: Policy, reference: Policy, batch: StepBatch, cfg: RunConfig
) -> torch.Tensor:
    """Σ_t KL_t(π_θ ‖ π_ref) per completion with ``algorithm.kl_estimator``, no gradient."""
    rollouts, out = batch.rollouts, []
    chunks = list(
        micro_batches(list(range(len(rollouts.completion_ids))), cfg.train.micro_batch_size)
    )
    for chunk in chunks:
        with torch.no_grad():
            logps, mask, _ = training_forward(policy, rollouts, chunk, cfg, with_entropy=False)
            ref_logps, _, _ = training_forward(reference, rollouts, chunk, cfg, with_entropy=False)
        per_token = kl_penalty(logps, ref_logps, cfg.algorithm.kl_estimator) * mask
        out.append(per_token.sum(dim=1).cpu())
    for _ in range(_padding_passes(policy, len(chunks))):
        with torch.no_grad():
            _padding_pass(policy, rollouts, cfg)
            _padding_pass(reference, rollouts, cfg)
    return torch.cat(out) if out else torch.zeros(0)


def _padding_passes(policy: Policy, real: int) -> int:
    """Sharded: how many passes with loss 0 (``_padding_pass``) this rank adds to its ``real``
    micro-batches so that it runs as many forward/backward passes as the rank with the most:
    FSDP all-gathers in every forward and reduce-scatters in every backward, ZeRO reduces
    gradients in every backward, and each collective needs its partner on every rank.
    Unsharded: 0 (a collective-free count)."""
    if not distributed.passes_must_match(policy.model):
        return 0
    return int(distributed.max_scalar(float(real))) - real


def _padding_pass(policy: Policy, rollouts: Rollouts, cfg: RunConfig) -> torch.Tensor:
    """A forward whose loss is exactly 0 (so is its gradient). FSDP: two padding tokens, the
    cheapest pass. ZeRO needs the same modules on every rank (mmrft/zero.py), and a model
    packed by prefix (Qwen3.5) calls the model twice per pass (the prompts, then the
    completions from their cache), so FSDP's collectives pair up only with two calls there too:
    the rank's first completion again, with its media, × 0."""
    repeat = distributed.same_graph_required(policy.model) or packing(policy.model) == "prefix"
    if repeat and rollouts.completion_ids:
        logps, _, _ = training_forward(policy, rollouts, [0], cfg, with_entropy=False)
        return logps.sum() * 0.0
    return distributed.padding_loss(policy.model, policy.pad_token_id)


def deepspeed_config(cfg: RunConfig, world: int, training: bool = True) -> dict[str, Any]:
    """The DeepSpeed config of ``train.sharding`` (deepspeed_zero2/3) and ``train.deepspeed``;
    ``{}`` for other modes."""
    if cfg.train.sharding not in zero.STAGES:
        return {}
    return zero.deepspeed_config(
        zero.STAGES[cfg.train.sharding],
        micro_batch_size=cfg.train.micro_batch_size,
        world_size=world,
        dtype=cfg.model.dtype,
        max_grad_norm=cfg.optim.max_grad_norm,
        zero=cfg.train.deepspeed,
        training=training,
    )


# ---------------------------------------------------------------------------------------------
# Helpers


def _write_failure(run_dir: Path, step: int, reason: str, samples: list[Sample]) -> None:
    """``failure.json``: what stopped the run, at which step, on which samples."""
    record = {"step": step, "reason": reason, "samples": sorted({s.id for s in samples})}
    write_failure_record(run_dir, record)


def _restore_rng(state: dict[str, Any], cfg: RunConfig, rank: int, world: int) -> None:
    """Each rank's RNG as saved when the world size is unchanged (exact resume); otherwise a
    fresh seed from (seed, step, rank), since the old streams cannot be split or merged."""
    by_rank = state.get("rng_by_rank") or [state["rng"]]
    if len(by_rank) == world:
        set_rng_state(by_rank[rank])
        return
    log.warning(
        "checkpoint written by %d process(es), resuming on %d: sampling streams are reseeded",
        len(by_rank),
        world,
    )
    seed_everything(cfg.train.seed + 1000 * state["step"] + rank)


def _check_replicas(policy: Policy, when: str) -> None:
    """Every rank must hold the same parameters (a cheap checksum, compared across ranks).

    Sharded parameters are skipped: each rank holds a different part of one copy, so there
    is no replica to compare.
    """
    if distributed.world_size() == 1 or distributed.is_sharded(policy.model):
        return
    with torch.no_grad():
        checksum = float(sum(p.double().sum().item() for p in policy.model.parameters()))
    sums = distributed.gather_objects(checksum)
    if max(sums) - min(sums) > 1e-6 * max(1.0, abs(sums[0])):
        raise RuntimeError(f"ranks hold different parameters at {when}: checksums {sums}")


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


def _load_weights(policy: Policy, checkpoint: Path) -> None:
    """Load a checkpoint's weights into the live policy (LoRA: the adapter; else the model).

    The full model is read back through the family's own loader, so transformers' key
    conversions apply exactly as they do for a user loading the checkpoint.
    """
    if (checkpoint / "adapter").is_dir() and is_lora(policy.model):
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        adapter = checkpoint / "adapter" / "adapter_model.safetensors"
        if not distributed.is_sharded(policy.model):
            set_peft_model_state_dict(policy.model, load_file(str(adapter)))
            return
        # FSDP2: rank 0 reads the adapter and scatters it into the shards under the model's
        # own names (peft's file leaves out the adapter's name: lora_A.weight for
        # lora_A.default.weight); the frozen base weights stay as model.path loaded them
        full = {}
        if distributed.is_main():
            saved = load_file(str(adapter))
            for name in policy.model.state_dict():
                plain = name.replace(".default.", ".")
                if ".lora_" in name and plain in saved:
                    full[name] = saved.pop(plain)
            if saved:
                raise ValueError(
                    f"{adapter}: tensors the model has no place for: {sorted(saved)[:3]}"
                )
        distributed.load_full_model_state(policy.model, full, strict=False)
        return
    if distributed.is_sharded(policy.model):  # rank 0 reads the checkpoint and scatters it
        full = (
            policy.family.load_model(
                str(checkpoint), dtype=str(policy.model.dtype).removeprefix("torch.")
            ).state_dict()
            if distributed.is_main()
            else {}
        )
        distributed.load_full_model_state(policy.model, full)
        return
    loaded = policy.family.load_model(
        str(checkpoint), dtype=str(policy.model.dtype).removeprefix("torch.")
    )
    policy.model.load_state_dict(loaded.state_dict())
