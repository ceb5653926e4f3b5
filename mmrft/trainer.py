"""The GRPO training loop, top to bottom.

One RL step (``train``, the loop body):

1. take ``train.prompts_per_step`` prompts in a seeded order that is a pure function of the
   position in the data (so a resume continues the same order);
2. sample ``G = rollout.group_size`` completions per prompt (group-contiguous);
3. score them with the weighted verifiers → reward r_i, with reasons counted;
4. advantages A_i from the group's rewards (``algorithm.advantage``);
5. forward the completions in micro-batches, loss = aggregated clipped surrogate
   (+ β·KL to a reference model, − entropy bonus), with the denominators of the *whole* step
   so that gradient accumulation equals one big batch; backward;
6. clip gradients, AdamW step, LR schedule step;
7. log metrics, sample completions, checkpoint, periodic evaluation.

What this loop keeps of the papers and what it drops: one optimizer update per rollout batch
(μ = 1, so the old policy is the current one and the ratio is 1 at the update, as in
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
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from mmrft import distributed, zero
from mmrft.algorithms import (
    filter_zero_variance_groups,
    group_advantages,
    group_stats,
    grpo_loss,
    kl_penalty,
    overlong_penalty,
    temporal_contrast_bonus,
    temporal_contrast_decided,
)
from mmrft.checkpoint import (
    find_resume_checkpoint,
    load_trainer_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from mmrft.config import RunConfig, check_config, resolve_path, to_dict, to_yaml
from mmrft.data import DataError, Sample
from mmrft.evaluate import EvalResult, evaluate, print_table, write_eval
from mmrft.plugins import did_you_mean, load_plugins
from mmrft.policy import Policy, completion_logps, load_policy, save_pretrained
from mmrft.report import report_runs
from mmrft.rewards import RewardBreakdown, Score, WeightedReward, build_reward
from mmrft.rollout import HFEngine, Rollouts, Sampling, build_engine
from mmrft.task import Task, build_task
from mmrft.tracking import build_trackers
from mmrft.typecheck import ConfigError
from mmrft.video import with_shuffled_frames

log = logging.getLogger("mmrft")


# ---------------------------------------------------------------------------------------------
# Set-up helpers


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device: 'cuda' requested but no CUDA device is available")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run_name(cfg: RunConfig) -> str:
    """``<task>__<model>__<seed>`` unless the config names the run."""
    return cfg.name or f"{cfg.task.name}__{Path(cfg.model.path).name}__{cfg.train.seed}"


def load_split(
    task: Task, policy: Policy, cfg: RunConfig, path: str, limit: int | None
) -> list[Sample]:
    """Read a split, check its media, annotate it with the model family's frames."""
    samples, stats = task.read(
        resolve_path(path),
        fmt=cfg.data.format,
        on_error=cfg.data.on_error,
        check=policy.family.check_media,
    )
    log.info(stats.summary())
    if not samples:
        raise DataError(f"{path}: no usable samples ({stats.summary()})")
    samples = samples[:limit] if limit else samples
    for sample in samples:
        policy.family.annotate(sample)
    return samples


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


@dataclass
class DataStream:
    """Prompt order as a pure function of the position: epoch e uses permutation(seed + e)."""

    size: int
    seed: int
    position: int = 0

    def take(self, count: int) -> list[int]:
        out = []
        for _ in range(count):
            epoch, offset = divmod(self.position, self.size)
            order = np.random.default_rng(self.seed + epoch).permutation(self.size)
            out.append(int(order[offset]))
            self.position += 1
        return out


@dataclass
class RunLog:
    """metrics.jsonl and completions.jsonl of a run directory."""

    run_dir: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    trackers: list[Any] = field(default_factory=list)
    enabled: bool = True  # False on ranks > 0: only rank 0 writes

    def truncate_after(self, step: int) -> None:
        """On resume: forget lines of steps after the checkpoint (they will be redone)."""
        if not self.enabled:
            return
        for name in ("metrics.jsonl", "completions.jsonl"):
            path = self.run_dir / name
            if path.exists():
                keep = [
                    line
                    for line in path.read_text().splitlines()
                    if json.loads(line).get("step", 0) <= step
                ]
                path.write_text("".join(line + "\n" for line in keep))
        path = self.run_dir / "metrics.jsonl"
        self.history = (
            [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        )

    def metrics(self, step: int, values: dict[str, float]) -> None:
        record = {"step": step, **{k: float(v) for k, v in values.items()}}
        self.history.append(record)
        if not self.enabled:
            return
        with (self.run_dir / "metrics.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")
        for tracker in self.trackers:
            tracker.log(step, values)

    def completions(self, step: int, rows: list[dict[str, Any]]) -> None:
        if not self.enabled:
            return
        with (self.run_dir / "completions.jsonl").open("a", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps({"step": step, **row}, ensure_ascii=False) + "\n")
        for tracker in self.trackers:
            tracker.log_completions(step, rows)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()


def media_counters() -> dict[str, float]:
    """Running counts of media the budgets changed (clips truncated, videos given fewer frames
    or pixels), so nothing is shortened silently."""
    from mmrft.audio import AUDIO_STATS
    from mmrft.video import video_stats

    video = video_stats()
    return {
        "data/audio_truncated": float(AUDIO_STATS.get("truncated", 0)),
        "data/video_fps_lowered": float(video.get("fps_lowered", 0)),
        "data/video_pixels_lowered": float(video.get("pixels_lowered", 0)),
    }


def micro_batches(indices: list[int], size: int) -> Iterator[list[int]]:
    for begin in range(0, len(indices), size):
        yield indices[begin : begin + size]


# ---------------------------------------------------------------------------------------------
# The warm start (optional, supervised)


def warm_start(
    policy: Policy, task: Task, samples: list[Sample], cfg: RunConfig, console: Console
) -> None:
    """Supervised steps on ``<answer>reference</answer>`` completions.

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
    losses = []
    world, rank = distributed.world_size(), distributed.rank()
    for step in range(ws.steps):
        drawn = [rng.randrange(len(samples)) for _ in range(ws.batch_size)]
        labels = [rng.randrange(len(samples)) for _ in range(ws.batch_size)]
        share = slice(rank * ws.batch_size // world, (rank + 1) * ws.batch_size // world)
        batch, labels = drawn[share], labels[share]
        answers = [
            references[j] if ws.labels == "random" else references[i] for i, j in zip(batch, labels)
        ]
        conversations = [task.prompt(samples[i], policy.family) for i in batch]
        prepared = policy.family.prepare(
            policy.processor, conversations, add_generation_prompt=True
        )
        rows = policy.family.split_rows(prepared, policy.processor)
        completions = [
            policy.tokenizer.encode(f"<answer>{a}</answer>", add_special_tokens=False)
            + [end_of_turn]
            for a in answers
        ]
        logps, mask, _ = completion_logps(policy, rows, completions)
        tokens = distributed.sum_scalar(float(mask.sum()))  # mean over every rank's tokens
        loss = -(logps * mask).sum() / tokens
        loss.backward()
        distributed.sum_gradients(params)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(distributed.sum_scalar(loss.item()))
        if (step + 1) % 20 == 0 or step + 1 == ws.steps:
            console.print(f"warm start {step + 1}/{ws.steps}: loss {np.mean(losses[-20:]):.3f}")


# ---------------------------------------------------------------------------------------------
# The RL loop


def train(cfg: RunConfig, console: Console | None = None) -> dict[str, Any]:
    """Run warm start (optional), evaluation, GRPO, evaluation; return the run summary."""
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

    run_dir = (
        resolve_path(cfg.output_dir) / run_name(cfg)
        if not Path(cfg.output_dir).is_absolute()
        else Path(cfg.output_dir) / run_name(cfg)
    )
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(to_yaml(cfg))
        _attach_file_log(run_dir / "train.log")
    distributed.barrier()
    console.rule(f"[bold]mmrft train[/bold] → {run_dir}")
    console.print(to_yaml(cfg), highlight=False)

    # Task, reward, model, data ------------------------------------------------------------
    task = build_task(cfg.task.name, cfg.task.params)
    reward = build_reward(
        cfg.reward.verifiers or task.default_verifiers(),
        cfg.reward.timeout_s,
        cfg.reward.on_timeout,
    )
    _check_temporal_contrast(cfg, reward)
    low, high = reward.range
    console.print(
        "reward = "
        + " + ".join(f"{w:g}·{v.name}[{v.spec.low:g},{v.spec.high:g}]" for v, w in reward.verifiers)
        + f"  ∈ [{low:g}, {high:g}]"
    )
    policy = load_policy(cfg.model, device)
    distributed.broadcast_parameters(policy.model)
    distributed.shard_model(policy.model, cfg.train.sharding)
    reference = load_policy(cfg.model, device, trainable=False) if cfg.algorithm.beta > 0 else None
    if reference is not None:  # sharded like the policy, freed after every forward
        distributed.shard_model(
            reference.model,
            cfg.train.sharding,
            frozen=True,
            deepspeed_config=deepspeed_config(cfg, world, training=False),
        )
    train_samples = (
        load_split(task, policy, cfg, cfg.data.train, cfg.data.max_train_samples)
        if cfg.data.train
        else []
    )
    test_samples = (
        load_split(task, policy, cfg, cfg.data.test, cfg.data.max_test_samples)
        if cfg.data.test
        else []
    )
    G = cfg.rollout.group_size
    engine = build_engine(cfg.rollout.engine, policy, cfg.rollout.batch_size, cfg.rollout.timeout_s)
    sampling = Sampling(
        cfg.rollout.max_new_tokens, cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.top_k
    )

    params = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=cfg.optim.lr, betas=tuple(cfg.optim.betas), weight_decay=cfg.optim.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    stream = DataStream(len(train_samples) or 1, cfg.train.seed)
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
    try:
        evals: dict[str, dict[str, float]] = {}
        start_step = 0

        # Resume or warm start ---------------------------------------------------------------------
        checkpoint = find_resume_checkpoint(run_dir, cfg.checkpoint.resume)
        if checkpoint is not None:
            state = load_trainer_state(checkpoint)
            _load_weights(policy, checkpoint)
            scheduler.load_state_dict(state["scheduler"])
            _restore_rng(state, cfg, rank, world)
            stream.position = state["data_position"]
            evals = state.get("evals", {})
            start_step = state["step"]
            runlog.truncate_after(start_step)
            console.print(
                f"resumed from {checkpoint} at step {start_step} (data position {stream.position})"
            )
        else:
            runlog.truncate_after(-1)
            if cfg.warm_start.steps and train_samples:
                warm_start(policy, task, train_samples, cfg, console)
            if cfg.eval.before and test_samples:
                evals["before"] = _run_eval(
                    policy, task, test_samples, cfg, run_dir / "eval" / "before", runlog, 0, console
                )
        # DeepSpeed: the engine takes the model and optimizer now, after weights were loaded
        distributed.prepare_optimizer(
            policy.model, optimizer, cfg.train.sharding, deepspeed_config(cfg, world)
        )
        if checkpoint is not None:
            distributed.load_full_optimizer_state(policy.model, optimizer, state["optimizer"])
        _check_replicas(policy, "start")

        def trainer_state(step: int) -> dict[str, Any]:
            return {
                "step": step,
                # full, in the unsharded layout, so any world size resumes
                "optimizer": distributed.full_optimizer_state(policy.model, optimizer),
                "scheduler": scheduler.state_dict(),
                "rng": rng_state(),  # rank 0's, kept for single-process readers
                "rng_by_rank": distributed.gather_objects(rng_state()),
                "world_size": world,
                "data_position": stream.position,
                "evals": evals,
                "config": to_dict(cfg),
            }

        def checkpoint_now(step: int) -> None:
            _check_replicas(policy, f"step {step}")
            state = trainer_state(step)  # collective (gathers every rank's RNG state)
            # sharded: a collective, rank 0 gets the full weights (None: the model's own)
            weights = distributed.full_model_state(policy.model)
            if rank == 0:
                path = save_checkpoint(
                    run_dir / "checkpoints",
                    step,
                    lambda d: save_pretrained(policy, d, state_dict=weights),
                    state,
                    cfg.checkpoint.keep_last,
                )
                log.info("checkpoint %s", path)
            distributed.barrier()

        # The loop ---------------------------------------------------------------------------------
        t_train = time.perf_counter()
        progress = Progress(
            TextColumn("[bold]step {task.completed}/{task.total}"),
            BarColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        stop = GracefulStop()
        heartbeat = Heartbeat(cfg.train.heartbeat_s)
        with progress, stop, heartbeat:
            bar = progress.add_task("rl", total=cfg.train.steps, completed=start_step, info="")
            for step in range(start_step + 1, cfg.train.steps + 1):
                t0 = time.perf_counter()
                # 1-4. prompts, rollouts, rewards (dynamic sampling refills), advantages
                heartbeat.phase(f"rollout and verifiers, step {step}")
                with distributed.gathered(policy.model):  # sharded: generate with no collective
                    batch = _collect(
                        task, policy, engine, sampling, reward, train_samples, stream, cfg, step
                    )
                if reference is not None and cfg.algorithm.kl_mode == "reward":
                    heartbeat.phase(f"KL to the reference, step {step}")
                    kl = _sequence_kl(policy, reference, batch, cfg)
                    batch.rewards = batch.rewards - cfg.algorithm.beta * kl
                    batch.counts["train/kl_in_reward"] = float(kl.mean()) if len(kl) else 0.0
                advantages = (
                    group_advantages(
                        batch.rewards, G, mode=cfg.algorithm.advantage, eps=cfg.algorithm.eps
                    )
                    if len(batch.rewards)
                    else batch.rewards
                )
                # 5-6. μ optimizer updates on this batch
                t2 = time.perf_counter()
                heartbeat.phase(f"update, step {step}")
                try:
                    stats = _update(
                        policy, reference, optimizer, scheduler, batch, advantages, cfg, step
                    )
                except FloatingPointError as exc:
                    _write_failure(run_dir, step, str(exc), batch.samples)
                    raise
                t3 = time.perf_counter()
                rollouts, scored = batch.generated, batch.scored

                # 7. logs
                metrics = {
                    **scored.metrics("train/reward"),
                    **{f"train/{k}": v for k, v in stats.items()},
                    **{
                        f"rollout/{k}": v
                        for k, v in group_stats(torch.tensor(scored.total), G).items()
                    },
                    **batch.counts,
                    "rollout/len_mean": float(np.mean([len(c) for c in rollouts.completion_ids])),
                    "rollout/truncated": float(np.mean(rollouts.truncated)),
                    "train/lr": scheduler.get_last_lr()[0],
                    "train/epoch": stream.position / max(len(train_samples), 1),
                    "time/rollout_s": rollouts.seconds,
                    "time/reward_s": batch.reward_seconds,
                    "time/update_s": t3 - t2,
                    "time/step_s": t3 - t0,
                }
                metrics.update({f"train/reasons/{k}": float(n) for k, n in scored.reasons.items()})
                metrics.update(media_counters())
                metrics = _merge_rank_metrics(metrics)
                if step % cfg.train.log_every == 0:
                    runlog.metrics(step, metrics)
                if cfg.train.completions_every and step % cfg.train.completions_every == 0:
                    runlog.completions(
                        step, _completion_rows(rollouts, batch.generated_samples, scored, G)
                    )
                progress.update(bar, completed=step, info=f"reward {metrics['train/reward']:.3f}")
                log.info("step %d done: reward %.4f, %.1fs", step, metrics["train/reward"], t3 - t0)

                if (
                    cfg.eval.every
                    and step % cfg.eval.every == 0
                    and step != cfg.train.steps
                    and test_samples
                ):
                    heartbeat.phase(f"evaluation, step {step}")
                    _run_eval(
                        policy,
                        task,
                        test_samples,
                        cfg,
                        run_dir / "eval" / f"step-{step:06d}",
                        runlog,
                        step,
                        console,
                    )
                if (
                    cfg.checkpoint.every
                    and step % cfg.checkpoint.every == 0
                    and step != cfg.train.steps
                ):
                    heartbeat.phase(f"checkpoint, step {step}")
                    checkpoint_now(step)
                if distributed.sum_scalar(1.0 if stop.requested else 0.0) > 0:
                    stop.requested = stop.requested or "a signal on another rank"
                    checkpoint_now(step)
                    console.print(
                        f"stopped by {stop.requested} after step {step}; checkpoint saved, resume with resume=auto"
                    )
                    raise KeyboardInterrupt(stop.requested)
        train_seconds = time.perf_counter() - t_train

        # After RL -----------------------------------------------------------------------------------
        if cfg.eval.after and test_samples:
            evals["after"] = _run_eval(
                policy,
                task,
                test_samples,
                cfg,
                run_dir / "eval" / "after",
                runlog,
                cfg.train.steps,
                console,
            )
        if cfg.train.steps > start_step or checkpoint is None:
            checkpoint_now(cfg.train.steps)
        if evals:
            print_table(f"{task.name} on {cfg.data.test}", evals, console)
        summary = {
            "run_dir": str(run_dir),
            "task": task.name,
            "metric": f"eval/{task.name}/{task.primary_metric}",
            "chance": task.chance(test_samples) if test_samples else None,
            "before": evals.get("before", {}).get("primary"),
            "after": evals.get("after", {}).get("primary"),
            "steps": cfg.train.steps,
            "train_seconds": round(train_seconds, 1),
            "total_seconds": round(time.perf_counter() - t_start, 1),
        }
        if rank == 0:
            (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
            report_runs([run_dir])
        console.print(f"summary: {json.dumps(summary)}")
        return summary
    finally:
        runlog.close()


@dataclass
class StepBatch:
    """The completions one RL step trains on, and what it took to get them.

    Attributes:
        samples / rollouts / rewards: the kept groups, group-contiguous (``rewards`` includes
            the overlong shaping).
        generated / generated_samples / scored: every completion sampled this step, kept or
            not, with its sample and reward
            breakdown (the train/reward metrics are over these, so dropping groups hides nothing).
        counts: ``rollout/generated``, ``rollout/kept``, ``rollout/discarded``, ``rollout/tries``
            (and with the temporal contrast :func:`_temporal_metrics`).
    """

    samples: list[Sample]
    rollouts: Rollouts
    rewards: torch.Tensor
    generated: Rollouts
    generated_samples: list[Sample]
    scored: RewardBreakdown
    counts: dict[str, float]
    reward_seconds: float


def _collect(
    task: Task,
    policy: Policy,
    engine: HFEngine,
    sampling: Sampling,
    reward: WeightedReward,
    train_samples: list[Sample],
    stream: DataStream,
    cfg: RunConfig,
    step: int,
) -> StepBatch:
    """Sample G completions for ``prompts_per_step`` prompts and score them.

    With ``algorithm.dynamic_sampling`` (DAPO), groups whose rewards are all equal carry no
    advantage and are dropped; more prompts are drawn until ``prompts_per_step`` groups are kept
    or ``max_sampling_tries`` rounds ran (then the step trains on what it kept, possibly less).
    With ``algorithm.temporal_contrast`` (Video-R1's T-GRPO) each round's video prompts also get
    completions on shuffled frames (:func:`_temporal_contrast`) and the bonus joins the reward
    before the groups are filtered; each rank contrasts its own groups.
    """
    algo, G = cfg.algorithm, cfg.rollout.group_size
    world, rank = distributed.world_size(), distributed.rank()
    P = cfg.train.prompts_per_step // world  # this rank's prompts per round, whole groups
    kept_samples: list[Sample] = []
    kept = Rollouts()
    kept_rewards: list[torch.Tensor] = []
    generated = Rollouts()
    generated_samples: list[Sample] = []
    breakdowns: list[RewardBreakdown] = []
    reward_seconds = 0.0
    temporal: Counter = Counter()
    tries = 0
    while tries < (algo.max_sampling_tries if algo.dynamic_sampling else 1):
        tries += 1
        first = stream.position + rank * P  # data position of this rank's first prompt
        drawn = stream.take(P * world)  # every rank advances the shared order identically
        samples = [train_samples[i] for i in drawn[rank * P : (rank + 1) * P]]
        rollouts = engine.generate([task.prompt(s, policy.family) for s in samples], G, sampling)
        expanded = [s for s in samples for _ in range(G)]
        t0 = time.perf_counter()
        scored = reward(rollouts.texts, expanded, context=f"at step {step}")
        if algo.overlong_buffer:
            lengths = torch.tensor([len(c) for c in rollouts.completion_ids])
            penalty = overlong_penalty(
                lengths, cfg.rollout.max_new_tokens, algo.overlong_buffer, algo.overlong_penalty
            )
            scored.scores["overlong"] = [Score(float(p)) for p in penalty]
            scored.total = [t + float(p) for t, p in zip(scored.total, penalty)]
        reward_seconds += time.perf_counter() - t0
        if algo.temporal_contrast.enabled:
            positions = list(range(first, first + P))
            contrast = _temporal_contrast(
                task,
                policy,
                engine,
                sampling,
                reward,
                samples,
                positions,
                rollouts,
                scored,
                cfg,
                step,
            )
            reward_seconds += contrast.pop("seconds", 0.0)
            temporal.update(contrast)
        rewards = torch.tensor(scored.total, dtype=torch.float32)
        generated.extend(rollouts)
        generated_samples += expanded
        breakdowns.append(scored)
        keep = (
            filter_zero_variance_groups(rewards, G)
            if algo.dynamic_sampling
            else torch.ones(P, dtype=torch.bool)
        )
        for group in keep.nonzero().flatten().tolist()[: P - len(kept_samples) // G]:
            indices = list(range(group * G, (group + 1) * G))
            kept_samples += [expanded[i] for i in indices]
            kept.extend(rollouts.select(indices))
            kept_rewards.append(rewards[indices])
        # collective: every rank draws another round while any rank still needs groups
        if distributed.sum_scalar(float(len(kept_samples) < P * G)) == 0:
            break
    if not kept_samples:
        log.warning(
            "step %d: every group had equal rewards in %d tries; nothing to train on", step, tries
        )
    counts = {
        "rollout/generated": float(len(generated.texts)),
        "rollout/kept": float(len(kept_samples)),
        "rollout/discarded": float(len(generated.texts) - len(kept_samples)),
        "rollout/tries": float(tries),
    }
    if algo.temporal_contrast.enabled:
        counts.update(_temporal_metrics(temporal))
    return StepBatch(
        samples=kept_samples,
        rollouts=kept,
        rewards=torch.cat(kept_rewards) if kept_rewards else torch.zeros(0),
        generated=generated,
        generated_samples=generated_samples,
        scored=RewardBreakdown.concat(breakdowns),
        counts=counts,
        reward_seconds=reward_seconds,
    )


def _check_temporal_contrast(cfg: RunConfig, reward: WeightedReward) -> None:
    """``algorithm.temporal_contrast.verifier`` must name one of the run's verifiers, and no
    verifier may be called ``temporal`` (the bonus's own sub-score)."""
    tc = cfg.algorithm.temporal_contrast
    if not tc.enabled:
        return
    if tc.verifier not in reward.names:
        raise ConfigError(
            f"algorithm.temporal_contrast.verifier: '{tc.verifier}' is not one of the run's "
            f"verifiers; {did_you_mean(tc.verifier, reward.names)}"
        )
    if "temporal" in reward.names:
        raise ConfigError(
            "reward.verifiers: a verifier named 'temporal' clashes with the temporal contrast "
            "bonus's sub-score (train/reward/temporal)"
        )


def _shuffle_seed(seed: int, position: int) -> int:
    """The frame-shuffle seed of the prompt drawn at data ``position``: a pure function of the
    run seed and the position, so exact resumes and any world size shuffle alike."""
    return int(np.random.SeedSequence([seed & 0xFFFFFFFF, position]).generate_state(1)[0])


def _temporal_contrast(
    task: Task,
    policy: Policy,
    engine: HFEngine,
    sampling: Sampling,
    reward: WeightedReward,
    samples: list[Sample],
    positions: list[int],
    rollouts: Rollouts,
    scored: RewardBreakdown,
    cfg: RunConfig,
    step: int,
) -> Counter:
    """T-GRPO (Video-R1, arXiv:2503.21776) on one round of ``len(samples)`` groups.

    For every prompt with a video, ``G'`` (``shuffled_per_prompt``, default ``G // 2`` as
    Video-R1's code) completions are sampled with the same prompt and the video's frames
    shuffled (:func:`mmrft.video.with_shuffled_frames`, seeded by the prompt's data position),
    scored by the correctness verifier alone (a ``None`` score counts as its minimum), and
    :func:`mmrft.algorithms.temporal_contrast_bonus` is added to ``scored.total`` in place, as the
    sub-score ``temporal`` (``None`` for prompts without a video). With ``skip_decided`` the groups whose bonus the shuffled completions
    cannot change (:func:`mmrft.algorithms.temporal_contrast_decided`) are not sampled: same
    rewards, fewer completions. Shuffled completions are never trained on; their generation time
    is added to ``rollouts.seconds``.

    Returns counts for :func:`_temporal_metrics` (this rank's) and ``seconds`` spent scoring.
    """
    tc, G = cfg.algorithm.temporal_contrast, cfg.rollout.group_size
    n_shuffled = tc.shuffled_per_prompt or max(1, G // 2)
    spec = reward.bound(tc.verifier).spec

    def values(scores: list[Score | None]) -> torch.Tensor:
        rows = [s.value if s is not None else spec.low for s in scores]
        return torch.tensor(rows, dtype=torch.float64)  # float64: the bonus adds exactly α

    out: Counter = Counter()
    subscores: list[Score | None] = [None] * len(scored.total)
    video = [g for g, s in enumerate(samples) if s.media("video")]
    if video:
        ordered = values(scored.scores[tc.verifier]).view(len(samples), G)[video]
        if tc.skip_decided:
            needed = ~temporal_contrast_decided(
                ordered, ratio=tc.ratio, high=spec.high, correct_above=tc.correct_above
            )
        else:
            needed = torch.ones(len(video), dtype=torch.bool)
        sampled = needed.nonzero().flatten().tolist()
        # rows not sampled are decided: any scores in [low, high] give the same bonus
        shuffled = torch.full((len(video), n_shuffled), spec.low, dtype=torch.float64)
        if sampled:
            conversations = [
                with_shuffled_frames(
                    task.prompt(samples[video[i]], policy.family),
                    _shuffle_seed(cfg.train.seed, positions[video[i]]),
                )
                for i in sampled
            ]
            generated = engine.generate(conversations, n_shuffled, sampling)
            rollouts.seconds += generated.seconds
            t0 = time.perf_counter()
            expanded = [samples[video[i]] for i in sampled for _ in range(n_shuffled)]
            scores = reward.score_one(
                tc.verifier, generated.texts, expanded, context=f"at step {step} (shuffled frames)"
            )
            out["seconds"] += time.perf_counter() - t0
            shuffled[sampled] = values(scores).view(len(sampled), n_shuffled)
            out["generated"] += len(generated.texts)
            out["sampled_groups"] += len(sampled)
            out["ordered_sum"] += float(ordered[sampled].sum())
            out["ordered_n"] += ordered[sampled].numel()
            out["shuffled_sum"] += float(shuffled[sampled].sum())
            out["shuffled_n"] += len(generated.texts)
        bonus = temporal_contrast_bonus(
            ordered, shuffled, ratio=tc.ratio, bonus=tc.bonus, correct_above=tc.correct_above
        ).view(len(video), G)
        out["groups"] += len(video)
        out["bonus_groups"] += int((bonus > 0).any(dim=1).sum())
        for row, g in enumerate(video):
            for j in range(G):
                subscores[g * G + j] = Score(float(bonus[row, j]))
                scored.total[g * G + j] += float(bonus[row, j])
    scored.scores["temporal"] = subscores
    return out


def _temporal_metrics(temporal: Counter) -> dict[str, float]:
    """This rank's ``rollout/temporal_generated`` (summed over ranks when merged) and, over
    every rank's groups (one collective, identical on every rank): ``train/temporal_bonus_rate``
    (share of video groups whose correct completions got the bonus), and over the groups that
    got shuffled completions ``train/temporal_ordered_accuracy`` and
    ``train/temporal_shuffled_accuracy`` (mean correctness score on ordered / shuffled frames:
    the gap is how much the policy uses the frame order)."""
    keys = ("groups", "bonus_groups", "ordered_sum", "ordered_n", "shuffled_sum", "shuffled_n")
    totals = [sum(c) for c in zip(*distributed.gather_objects([temporal[k] for k in keys]))]
    total = dict(zip(keys, totals))
    out = {"rollout/temporal_generated": float(temporal["generated"])}
    if total["groups"]:
        out["train/temporal_bonus_rate"] = total["bonus_groups"] / total["groups"]
    if total["shuffled_n"]:
        out["train/temporal_ordered_accuracy"] = total["ordered_sum"] / total["ordered_n"]
        out["train/temporal_shuffled_accuracy"] = total["shuffled_sum"] / total["shuffled_n"]
    return out


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
    # step-wide denominators over every rank, so the summed gradients equal one big batch's
    num_seqs = distributed.sum_scalar(float(n))
    num_tokens = distributed.sum_scalar(float(sum(len(c) for c in rollouts.completion_ids)))
    if num_seqs == 0:
        return {"active_frac": 0.0}
    needs_all = (algo.beta > 0 and algo.kl_mode == "loss") or algo.entropy_coef > 0
    active = [i for i in range(n) if needs_all or advantages[i].item() != 0.0]
    chunks = list(micro_batches(active, cfg.train.micro_batch_size))
    padding = _padding_passes(policy, len(chunks))

    def forward(
        chunk: list[int], with_grad: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        rows = [rollouts.prompt_rows[i] for i in chunk]
        ids = [rollouts.completion_ids[i] for i in chunk]
        with torch.set_grad_enabled(with_grad):
            return completion_logps(policy, rows, ids, with_entropy=with_grad)

    stored_old: list[torch.Tensor | None] = [None] * len(chunks)
    stored_ref: list[torch.Tensor | None] = [None] * len(chunks)
    for k, chunk in enumerate(chunks):
        if algo.updates_per_batch > 1:
            stored_old[k] = forward(chunk, with_grad=False)[0]
        if reference is not None and algo.kl_mode == "loss":
            with torch.no_grad():
                rows = [rollouts.prompt_rows[i] for i in chunk]
                stored_ref[k] = completion_logps(
                    reference, rows, [rollouts.completion_ids[i] for i in chunk]
                )[0]
    for _ in range(padding):  # the same no-grad passes, in the same order, as other ranks
        with torch.no_grad():
            if algo.updates_per_batch > 1:
                _padding_pass(policy, rollouts)
            if reference is not None and algo.kl_mode == "loss":
                _padding_pass(reference, rollouts)

    totals: Counter = Counter()
    weight = 0.0
    grad_norms = []
    for _ in range(algo.updates_per_batch):
        for k, chunk in enumerate(chunks):
            logps, mask, entropy = forward(chunk, with_grad=True)
            old = stored_old[k] if stored_old[k] is not None else logps.detach()
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
            distributed.backward(policy.model, _padding_pass(policy, rollouts))

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
    out = {k: v / weight for k, v in totals.items() if k != "loss" and weight}
    out["loss"] = totals["loss"]
    out["grad_norm"] = float(np.mean(grad_norms)) if grad_norms else 0.0
    out["active_frac"] = len(active) / max(n, 1)
    return out


def _sequence_kl(
    policy: Policy, reference: Policy, batch: StepBatch, cfg: RunConfig
) -> torch.Tensor:
    """Σ_t KL_t(π_θ ‖ π_ref) per completion with ``algorithm.kl_estimator``, no gradient."""
    rollouts, out = batch.rollouts, []
    chunks = list(
        micro_batches(list(range(len(rollouts.completion_ids))), cfg.train.micro_batch_size)
    )
    for chunk in chunks:
        rows = [rollouts.prompt_rows[i] for i in chunk]
        ids = [rollouts.completion_ids[i] for i in chunk]
        with torch.no_grad():
            logps, mask, _ = completion_logps(policy, rows, ids)
            ref_logps, _, _ = completion_logps(reference, rows, ids)
        per_token = kl_penalty(logps, ref_logps, cfg.algorithm.kl_estimator) * mask
        out.append(per_token.sum(dim=1).cpu())
    for _ in range(_padding_passes(policy, len(chunks))):
        with torch.no_grad():
            _padding_pass(policy, rollouts)
            _padding_pass(reference, rollouts)
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


def _padding_pass(policy: Policy, rollouts: Rollouts) -> torch.Tensor:
    """A forward whose loss is exactly 0 (so is its gradient). FSDP: two padding tokens, the
    cheapest pass. ZeRO needs the same modules on every rank (mmrft/zero.py): the rank's first
    completion again, with its media, × 0."""
    if distributed.same_graph_required(policy.model) and rollouts.completion_ids:
        logps, _, _ = completion_logps(
            policy, rollouts.prompt_rows[:1], rollouts.completion_ids[:1]
        )
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


class Heartbeat:
    """A daemon thread that logs a warning naming the current phase and how long it has run,
    every ``seconds``, while a phase lasts longer than that: a run that hangs says on what."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.current = "start"
        self.since = time.monotonic()
        self._stop = threading.Event()

    def phase(self, name: str) -> None:
        self.current, self.since = name, time.monotonic()

    def _watch(self) -> None:
        while not self._stop.wait(self.seconds):
            waited = time.monotonic() - self.since
            if waited >= self.seconds:
                log.warning("still in %s after %.0f s", self.current, waited)

    def __enter__(self) -> Heartbeat:
        if self.seconds > 0:
            threading.Thread(target=self._watch, name="mmrft:heartbeat", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()


class GracefulStop:
    """Turn the first Ctrl-C (SIGINT) or SIGTERM into a request to stop after the current step,
    so the checkpoint then written is exact; a second signal interrupts at once."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name
        log.warning(
            "%s received: stopping after this step (send again to abort now)", self.requested
        )

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _write_failure(run_dir: Path, step: int, reason: str, samples: list[Sample]) -> None:
    """``failure.json``: what stopped the run, at which step, on which samples."""
    record = {"step": step, "reason": reason, "samples": sorted({s.id for s in samples})}
    (run_dir / "failure.json").write_text(json.dumps(record, indent=2) + "\n")
    log.error("run stopped at step %d: %s", step, reason)


def _run_eval(
    policy: Policy,
    task: Task,
    samples: list[Sample],
    cfg: RunConfig,
    directory: Path,
    runlog: RunLog,
    step: int,
    console: Console,
) -> dict[str, float]:
    """Greedy evaluation on rank 0 (greedy decoding draws no random numbers, so no rank's
    sampling stream moves); the metrics reach every rank."""
    metrics = None
    # sharded: every rank takes part in gathering the parameters, then rank 0 alone generates
    with distributed.gathered(policy.model):
        if distributed.is_main():
            result: EvalResult = evaluate(
                policy,
                task,
                samples,
                cfg.eval.batch_size,
                cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens,
            )
            write_eval(result, directory, {"step": step})
            runlog.metrics(
                step,
                {f"eval/{task.name}/{k}": v for k, v in result.metrics.items() if k != "primary"},
            )
            console.print(
                f"eval step {step}: {task.primary_metric} = {result.primary:.3f} "
                f"(format_fail {result.metrics.get('format_fail', 0):.3f}, {result.seconds:.1f}s)"
            )
            metrics = result.metrics
    return distributed.broadcast_object(metrics)


COUNT_METRICS = (
    "rollout/generated",
    "rollout/kept",
    "rollout/discarded",
    "rollout/temporal_generated",
    "train/reasons/",
)


def _merge_rank_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """One metrics line for all ranks: counts are summed, everything else averaged (ranks hold
    equal numbers of prompts, so the mean of means is the global mean)."""
    gathered = distributed.gather_objects(metrics)
    if len(gathered) == 1:
        return metrics
    keys = sorted({k for m in gathered for k in m})
    out = {}
    for key in keys:
        values = [m[key] for m in gathered if key in m]
        out[key] = sum(values) if key.startswith(COUNT_METRICS) else sum(values) / len(values)
    return out


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
    rollouts: Rollouts, samples: list[Sample], scored: Any, group_size: int
) -> list[dict[str, Any]]:
    """The first two groups of a step, with media referenced by path."""
    rows = []
    for i in range(min(len(samples), 2 * group_size)):
        rows.append(
            {
                "id": samples[i].id,
                "media": samples[i].media(),
                "target": samples[i].target,
                "completion": rollouts.texts[i],
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
    if (checkpoint / "adapter").is_dir() and hasattr(policy.model, "load_adapter"):
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(
            policy.model, load_file(str(checkpoint / "adapter" / "adapter_model.safetensors"))
        )
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


def _attach_file_log(path: Path) -> None:
    root = logging.getLogger("mmrft")
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler):
            root.removeHandler(handler)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)
