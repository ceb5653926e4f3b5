"""Prompt samplers and NoisyRollout at equal compute, and what each costs per step.

    python benchmarks/sampling.py --quick                 # a few steps, one seed (minutes)
    python benchmarks/sampling.py --seeds 3               # the full comparison
    python benchmarks/sampling.py --seeds 3 --tasks demo  # the demo only (and the step times)
    python benchmarks/sampling.py --seeds 3 --out runs/sampling -- optim.lr=3e-4
    python benchmarks/sampling.py --seeds 5 --reuse       # adds seeds 3, 4 to a finished run
    python benchmarks/sampling.py --merge A/sampling.json B/sampling.json --out C  # one report

**Learning at equal compute.** Each method trains each task's CPU recipe (``configs/demo.yaml``:
shape colour, 4 options; ``configs/learn/shapes_counting.yaml``: counting 1–6) with everything
but the method unchanged:

* ``uniform``: ``data.sampler=uniform`` (the order of the data, reshuffled every epoch);
* ``variance``: MMR1's variance-aware sampling (``data.sampler=variance``, default parameters);
* ``difficulty``: the online difficulty filter ThinkLite-VL's selection is built on
  (``data.sampler=difficulty``, default parameters);
* ``noisyrollout``: uniform draws, half of each group sampled on noisy images
  (``rollout.perturb.share=0.5``, the default noise and sigmoid annealing).

Compute is the number of generated completions: with no dynamic sampling every step generates
``train.prompts_per_step × rollout.group_size`` completions whatever the method (NoisyRollout's
perturbed completions are part of the G), so equal steps are equal compute; the x axis is the
cumulative ``rollout/generated`` of ``metrics.jsonl``. Every method runs at ``train.seed`` 0 …
N−1 (``--seeds N``); the figure shows, per task, the training reward and the held-out primary
metric against generated completions, the mean over seeds as a line and the band between the
lowest and highest seed.

**Step time.** On the demo, each sampler (and NoisyRollout) runs the same short training with
``rollout.ignore_eos=true`` (every completion ``max_new_tokens`` long, so the work per step does
not depend on which prompts were drawn), no warm start and no evaluation, in interleaved rounds
(uniform, variance, difficulty, noisyrollout, uniform, ...) so that a machine's drift hits all
alike. The figure is the median ``time/step_s`` (draw, generation, verifiers and update) over
the steps after the first, and its ratio to ``uniform``'s; the issue's bound is 5 % for the
samplers. NoisyRollout's ratio is reported too: its two ``generate`` calls per round (clean and
distorted prompts) prefill every prompt twice.

Outputs under ``--out`` (default ``runs/sampling``): ordinary run directories
(``TASK-METHOD-sK``, ``time-METHOD-rR``), ``sampling.md`` (the tables), ``sampling.json`` (every
figure) and ``sampling.png``. ``--quick`` cuts every run to a few steps and the held-out set to
16 samples (a check that the script works, not a result). Run the full comparison on an
otherwise idle machine: two busy cores make the step times meaningless.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TASKS = {"demo": "demo", "shapes_counting": "learn/shapes_counting"}
"""Benchmark task name → the config it trains (``mmrft train`` names)."""

METHODS: dict[str, list[str]] = {
    "uniform": ["data.sampler=uniform"],
    "variance": ["data.sampler=variance"],
    "difficulty": ["data.sampler=difficulty"],
    "noisyrollout": ["data.sampler=uniform", "rollout.perturb.share=0.5"],
}
SAMPLERS = ("variance", "difficulty")
"""The methods held to the 5 % step-time bound against ``uniform``."""
STEP_TIME_BOUND = 0.05


def common(out: Path, name: str, seed: int) -> list[str]:
    """Overrides of every run: its directory, its seed, no trackers or checkpoints, a fresh
    start, equal compute (no dynamic sampling: every step generates P × G completions)."""
    return [
        f"output_dir={out}",
        f"name={name}",
        f"train.seed={seed}",
        "train.trackers=[]",
        "checkpoint.every=0",
        "checkpoint.resume=never",
        "algorithm.dynamic_sampling=false",
    ]


def quick_overrides() -> list[str]:
    """``--quick``: four RL steps of 4 prompts after a 30-step warm start (the answer format),
    evaluation at steps 0, 2 and 4 on 16 held-out samples."""
    return [
        "train.steps=4",
        "train.prompts_per_step=4",
        "warm_start.steps=30",
        "eval.every=2",
        "eval.before=true",
        "data.max_test_samples=16",
    ]


def run(config: str, overrides: list[str], reuse: bool = False) -> dict[str, Any]:
    """Train ``config`` with ``overrides`` in this process; its ``summary.json`` dict. With
    ``reuse``, a finished run of the same name (its ``summary.json`` written, its saved
    ``config.yaml`` the same config: equal in every key but ``output_dir``, a key newer than
    the run counting as its default) is read instead of trained again: a comparison can grow
    by seeds or tasks without repeating the runs it has."""
    from mmrft.config import load_config, resolve_path
    from mmrft.training.resume import config_changes, run_name
    from mmrft.training.trainer import train

    cfg = load_config(config, overrides)
    run_dir = resolve_path(cfg.output_dir) / run_name(cfg)
    summary, saved = run_dir / "summary.json", run_dir / "config.yaml"
    if reuse and summary.is_file() and saved.is_file():
        changed = set(config_changes(saved.read_text(), cfg)[0]) - {"output_dir"}
        if not changed:
            print(f"reusing the finished run {run_dir}", flush=True)
            return json.loads(summary.read_text())
        print(f"not reusing {run_dir}: it differs in {', '.join(sorted(changed))}", flush=True)
    return train(cfg)


def curves(run_dir: Path, metric: str) -> dict[str, list[float]]:
    """From ``metrics.jsonl``: ``reward_x`` / ``reward`` (cumulative generated completions at
    each training step, the step's mean reward) and ``eval_x`` / ``eval`` (cumulative
    generated completions when the held-out ``metric`` was measured; 0 before RL)."""
    from mmrft.evaluation.report import read_history

    history = read_history(run_dir)
    generated: dict[int, float] = {0: 0.0}
    reward_x, reward = [], []
    total = 0.0
    for line in sorted((h for h in history if "rollout/generated" in h), key=lambda h: h["step"]):
        total += float(line["rollout/generated"])
        generated[line["step"]] = total
        reward_x.append(total)
        reward.append(float(line["train/reward"]))
    points = sorted({h["step"]: h[metric] for h in history if metric in h}.items())
    return {
        "reward_x": reward_x,
        "reward": reward,
        "eval_x": [generated.get(s, total) for s, _ in points],
        "eval": [float(v) for _, v in points],
    }


def learning(args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    """Every (task, method, seed) run; per task and method the curves of every seed."""
    out: dict[str, Any] = {}
    for task in args.tasks:
        config = TASKS[task]
        out[task] = {}
        for method, method_overrides in METHODS.items():
            runs = []
            for seed in range(args.seeds):
                name = f"{task}-{method}-s{seed}"
                overrides = [*common(args.out, name, seed), *method_overrides]
                if args.quick:
                    overrides += quick_overrides()
                summary = run(config, [*overrides, *extra], reuse=args.reuse)
                runs.append(
                    {
                        "seed": seed,
                        "metric": summary["metric"],
                        "after": summary.get("after"),
                        "train_seconds": summary.get("train_seconds"),
                        **curves(Path(summary["run_dir"]), summary["metric"]),
                    }
                )
            out[task][method] = runs
    return out


def step_times(args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    """Median ``time/step_s`` (steps after the first) of each method on the demo, over
    ``rounds`` interleaved rounds, and its ratio to ``uniform``'s."""
    from mmrft.evaluation.report import read_history

    steps = 4 if args.quick else 40
    rounds = 1 if args.quick else 3
    times: dict[str, list[float]] = {m: [] for m in METHODS}
    for r in range(rounds):
        for method, method_overrides in METHODS.items():
            name = f"time-{method}-r{r}"
            summary = run(
                TASKS["demo"],
                [
                    *common(args.out, name, 0),
                    *method_overrides,
                    f"train.steps={steps}",
                    "warm_start.steps=0",
                    "rollout.ignore_eos=true",
                    "eval.before=false",
                    "eval.after=false",
                    "eval.every=0",
                    *extra,
                ],
            )
            history = read_history(Path(summary["run_dir"]))
            times[method] += [h["time/step_s"] for h in history if "time/step_s" in h][1:]
    medians = {m: statistics.median(v) for m, v in times.items()}
    base = medians["uniform"]
    draws = draw_cost(100 if args.quick else 1000)
    fastest = min(times["uniform"])  # the least contended uniform step: the largest share
    return {
        "steps": steps,
        "rounds": rounds,
        "median_step_s": medians,
        "min_step_s": {m: min(v) for m, v in times.items()},
        "ratio": {m: v / base for m, v in medians.items()},
        "within_bound": {m: abs(medians[m] / base - 1) <= STEP_TIME_BOUND for m in SAMPLERS},
        "draw_s": draws,
        "draw_share": {m: (draws[m] - draws["uniform"]) / fastest for m in SAMPLERS},
    }


def draw_cost(steps: int, config: str = "demo") -> dict[str, float]:
    """Seconds per step of each sampler's draw alone on ``config``'s training split: the
    prompt statistics are fed a random group outcome per drawn prompt (as the collector does),
    then ``train.prompts_per_step`` prompts are drawn, ``steps`` times; the median over steps.
    This is the only work a sampler adds to a step, measured without the noise of generation
    and updates (which do not depend on the sampler)."""
    import random
    import time

    from mmrft.config import load_config
    from mmrft.policy.model import resolve_family
    from mmrft.rewards.task import build_task
    from mmrft.rollout.sampling import PromptStats, SampledStream, build_sampler, group_outcome
    from mmrft.rollout.setup import read_data

    cfg = load_config(config, ["train.trackers=[]"])
    task = build_task(cfg.task.name, cfg.task.params, cfg.task.system_prompt)
    train_samples, _ = read_data(cfg, task, resolve_family(cfg.model))
    P, G = cfg.train.prompts_per_step, cfg.rollout.group_size
    out = {}
    for method in ("uniform", *SAMPLERS):
        sampler = build_sampler(method, {}, train_samples)
        stream = SampledStream(sampler, train_samples, 0, steps, (0.0, 2.0))
        stats, rng, times = PromptStats(cfg.data.stats_ema), random.Random(0), []
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            drawn = stream.take(P, stats, step)
            times.append(time.perf_counter() - t0)
            for i in drawn:
                rewards = [float(rng.random() < 0.5) for _ in range(G)]
                texts = [str(rng.randrange(4)) for _ in range(G)]
                stats.update(
                    group_outcome(train_samples[i].id, step, rewards, rewards, texts, False)
                )
        out[method] = statistics.median(times)
    return out


def band(
    runs: list[dict[str, Any]], key: str
) -> tuple[list[float], list[float], list[float], list[float]]:
    """x, mean, min, max over seeds of one curve (seeds share x: equal compute)."""
    xs = runs[0][f"{key}_x"] if key == "eval" else runs[0]["reward_x"]
    series = [r[key] for r in runs]
    n = min(len(s) for s in series)
    cols = [[s[i] for s in series] for i in range(n)]
    return (
        list(xs[:n]),
        [sum(c) / len(c) for c in cols],
        [min(c) for c in cols],
        [max(c) for c in cols],
    )


def moving_mean(values: list[float], window: int) -> list[float]:
    """Mean of each value and the ``window − 1`` before it (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def plot(results: dict[str, Any], path: Path) -> None:
    """Per task (rows): training reward and held-out metric (columns) against generated
    completions, one colour per method, mean line and min–max band over seeds; the reward
    curves are moving means over 2 % of the steps (each seed's before the band)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(results)
    fig, axes = plt.subplots(len(tasks), 2, figsize=(11, 3.6 * len(tasks)), squeeze=False)
    for row, task in enumerate(tasks):
        for col, key in enumerate(("reward", "eval")):
            ax = axes[row][col]
            for method, runs in results[task].items():
                if key == "reward":
                    window = max(1, len(runs[0]["reward"]) // 50)
                    runs = [{**r, "reward": moving_mean(r["reward"], window)} for r in runs]
                xs, mean, low, high = band(runs, key)
                (line,) = ax.plot(xs, mean, marker="o" if key == "eval" else None, label=method)
                if len(runs) > 1:
                    ax.fill_between(xs, low, high, color=line.get_color(), alpha=0.15)
            metric = next(iter(results[task].values()))[0]["metric"]
            title = "training reward (moving mean)" if key == "reward" else metric
            ax.set_title(f"{task}: {title}")
            ax.set_xlabel("generated completions")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def report(results: dict[str, Any], timing: dict[str, Any], args: argparse.Namespace) -> str:
    """``sampling.md``: held-out metric after RL per task and method (mean [min, max] over
    seeds), the generated completions, and the step-time table."""
    from mmrft.evaluation.runlog import cpu_model

    lines = [
        "# Samplers and NoisyRollout at equal compute",
        "",
        f"{'--quick (a check, not a result)' if args.quick else 'full run'}; seeds 0 … "
        f"{args.seeds - 1}; CPU: {cpu_model()} ({platform.machine()}).",
        "",
        "| task | method | seeds | generated completions | final training reward | "
        "held-out metric after RL |",
        "|---|---|---|---|---|---|",
    ]
    for task, methods in results.items():
        for method, runs in methods.items():
            after = [r["eval"][-1] for r in runs if r["eval"]]
            reward = [r["reward"][-1] for r in runs if r["reward"]]
            generated = runs[0]["reward_x"][-1] if runs[0]["reward_x"] else 0
            lines.append(
                f"| {task} | {method} | {len(runs)} | {generated:.0f} | "
                f"{fmt(statistics.mean(reward)) if reward else '—'} | "
                + (
                    f"{fmt(statistics.mean(after))} [{fmt(min(after))}, {fmt(max(after))}]"
                    if after
                    else "—"
                )
                + f" ({runs[0]['metric']}) |"
            )
    lines += [
        "",
        f"Step time on the demo (median time/step_s over {timing['rounds']} round(s) of "
        f"{timing['steps']} steps, ignore_eos, the first step of each run left out):",
        "",
        "| method | median step (s) | fastest step (s) | ratio to uniform | within 5 % |",
        "|---|---|---|---|---|",
    ]
    for method, seconds in timing["median_step_s"].items():
        bound = timing["within_bound"].get(method)
        mark = "—" if bound is None else ("yes" if bound else "**no**")
        lines.append(
            f"| {method} | {seconds:.3f} | {timing['min_step_s'][method]:.3f} | "
            f"{timing['ratio'][method]:.3f} | {mark} |"
        )
    if timing.get("draw_s"):
        lines += [
            "",
            "The sampler's own work per step (draw of train.prompts_per_step prompts from the "
            "statistics of the demo's split, median; the rest of a step does not depend on the "
            "sampler), and its extra cost over uniform's draw as a share of uniform's fastest "
            "step (the least contended one, so the largest share):",
            "",
            "| sampler | draw (ms) | extra over uniform, share of a step |",
            "|---|---|---|",
        ]
        for method, seconds in timing["draw_s"].items():
            share = timing["draw_share"].get(method)
            lines.append(
                f"| {method} | {1000 * seconds:.3f} | {'—' if share is None else f'{share:.4%}'} |"
            )
    return "\n".join(lines) + "\n"


NO_TIMING: dict[str, Any] = {
    "steps": 0,
    "rounds": 0,
    "median_step_s": {},
    "min_step_s": {},
    "ratio": {},
    "within_bound": {},
}


def merged(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """``--merge``: the learning results of every file (by task) and the step times of the
    last file that has them; ``args.seeds`` and ``args.quick`` become what the files say
    (the smallest seed count)."""
    results: dict[str, Any] = {}
    timing = NO_TIMING
    seeds, quick = [], False
    for path in args.merge:
        saved = json.loads(path.read_text())
        results.update(saved["learning"])
        seeds.append(saved["seeds"])
        quick = quick or saved["quick"]
        if saved["timing"]["median_step_s"]:
            timing = saved["timing"]
    args.seeds, args.quick = min(seeds), quick
    return results, timing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few steps per run, one check")
    parser.add_argument(
        "--seeds", type=int, default=None, help="seeds per method (quick: 1, else 3)"
    )
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "sampling")
    parser.add_argument("--no-timing", action="store_true", help="skip the step-time runs")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="read learning runs already finished under --out with the same config",
    )
    parser.add_argument(
        "--tasks",
        nargs="+",
        choices=list(TASKS),
        default=list(TASKS),
        help="learning runs on these",
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        metavar="SAMPLING_JSON",
        help="train nothing: combine the sampling.json of earlier runs (tasks and step times, "
        "the later file winning) into one report and figure under --out",
    )
    parser.add_argument("overrides", nargs="*", help="config overrides for every run (after --)")
    args = parser.parse_args(argv)
    args.seeds = args.seeds or (1 if args.quick else 3)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        results, timing = merged(args)
    else:
        results = learning(args, args.overrides)
        timing = NO_TIMING if args.no_timing else step_times(args, args.overrides)
    (args.out / "sampling.json").write_text(
        json.dumps(
            {"quick": args.quick, "seeds": args.seeds, "learning": results, "timing": timing},
            indent=1,
        )
    )
    plot(results, args.out / "sampling.png")
    text = report(results, timing, args)
    (args.out / "sampling.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
