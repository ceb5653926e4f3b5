"""Learning on CPU: does every bundled task learn through RL, and how far could it?

    python benchmarks/learning.py                          # every recipe under configs/learn/
    python benchmarks/learning.py --only audio_pitch shapes_kind
    python benchmarks/learning.py --out runs/learning --no-sft
    python benchmarks/learning.py --only shapes_kind -- optim.lr=3e-4   # overrides for both runs
    python benchmarks/learning.py --seeds 3                # every recipe at train.seed 0, 1, 2
    python benchmarks/learning.py --seeds 3 --jobs 2       # two runs at a time, 1 thread each
    python benchmarks/learning.py --only tools/zoom_sites  # a tool recipe (TOOL_RECIPES)

For each recipe ``configs/learn/NAME.yaml`` (the same file ``mmrft train learn/NAME`` runs),
and each tool recipe of :data:`TOOL_RECIPES` (``configs/tools/NAME.yaml``, named
``tools/NAME``: the tool rows, whose capacity check is the warm start on demonstrations of the
right call with the true answer):

1. **capacity check** (skipped with ``--no-sft``): ordinary supervised training on the *true*
   labels, with the same model, data, media budget and budget of optimizer steps as the RL
   recipe (``warm_start.steps + train.steps × algorithm.updates_per_batch`` steps of
   ``warm_start.batch_size`` samples at the RL stage's lr ``optim.lr``; ``warm_start.labels=target``, no RL), then the recipe's own
   evaluation.
   Its figure, the *SFT ceiling*, says what this model can learn from this data in this many
   steps: a task whose SFT stays at chance cannot be expected to learn by RL either.
2. **RL recipe**, as written: the format-only warm start (random labels, so the evaluation
   before RL is at chance and every gain is RL's), GRPO, the evaluation every ``eval.every``
   steps and after.

``--seeds N`` runs both N times, at ``train.seed`` 0 … N−1 (the seed of the data order, the
warm start's random labels, the sampling and the model's dropout-free initialisation of the
optimizer state), and the table gives the mean and the [min, max] over seeds of the figures
after RL and of the SFT ceiling. A target is *met* only when the **minimum** over seeds meets
it: a recipe that learns at one seed and not at another has not met it.

Both runs write ordinary run directories under ``--out`` (``NAME-sK-sft``, ``NAME-sK``, K the
seed), with ``summary.json``, ``metrics.jsonl`` and ``report.png``. This script then writes
``--out/learning.md`` (the table: task, metric, chance, before RL, after RL, SFT ceiling,
target, RL seconds), ``--out/learning.json`` (the same figures, every seed's among them) and
``--out/learning.png`` (the held-out metric against the RL step for every task: the mean over
seeds, the band between the lowest and highest seed, the chance level dotted).

Targets (issue "Learning that shows"): the held-out primary metric after RL at least halfway
from chance to 1.0 (0.85 for a tool row, issue 37); grounding Acc@0.5 and temporal grounding
R1@0.5 at least 0.5, detection AP50 at least 0.3, and 0.5 for a metric without a chance level
(chart QA). RL seconds are the RL loop's wall time (``summary.json`` ``train_seconds``:
rollouts, verifiers, updates and the periodic evaluations), without the warm start and model
loading.

Each recipe sets ``train.threads: 2``; run on an otherwise idle machine for timings.
``--jobs N`` runs N of the runs (a recipe's seeds, its capacity checks) at a time, each in a
process of its own at the same ``train.threads`` as with ``--jobs 1``: the thread count sets the
order of a float reduction, so it is never changed behind the user's back, and ``--jobs N``
gives the figures of ``--jobs 1``. On 2 cores the tiny models are overhead-bound: ``--jobs 2
train.threads=1`` finishes two 1-thread runs sooner than ``--jobs 1`` runs two 2-thread ones
(their figures are the 1-thread ones, which differ from 2-thread ones as that order does).

Each row names the learner (the model directory) and its parameter count, the threads per run
and whether the runs shared the machine: the other load is the machine's busy time
(``/proc/stat``) less the CPU time of this benchmark's own processes, per second of wall time,
in cores; above 0.25 cores the RL seconds are marked as measured beside other jobs. The header
of ``learning.md`` names the CPU model: floating-point paths differ between CPUs, and a recipe
on a knife-edge can learn on one and not on another (the reason for ``--seeds``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import date
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LEARN = REPO / "configs" / "learn"
TOOL_RECIPES = ("tools/zoom_sites", "tools/zoom_slots")
"""The tool recipes with a row: tools that pay off, in an image (crop) and in a video
(video_frames), each starting from its committed reader (``scripts/make_reader.py``)."""


def recipes() -> list[str]:
    """Every recipe name under ``configs/learn/``, sorted, then :data:`TOOL_RECIPES`."""
    return [*sorted(p.stem for p in LEARN.glob("*.yaml")), *TOOL_RECIPES]


def config_name(recipe: str) -> str:
    """The config a recipe name loads: ``learn/NAME``, or a tool recipe's ``tools/NAME``."""
    return recipe if "/" in recipe else f"learn/{recipe}"


def run_label(recipe: str) -> str:
    """A recipe's name in run directory names: ``tools/zoom_sites`` → ``tools-zoom_sites``."""
    return recipe.replace("/", "-")


BESIDE = 0.25  # cores of other load above which a timing is marked as shared


def parameter_count(model_path: str | Path) -> int | None:
    """Parameters of the model directory's ``*.safetensors`` (from the headers, nothing
    loaded; a tensor tied to another is stored, and so counted, once); ``None`` without them."""
    from safetensors import safe_open

    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                numel = 1
                for size in f.get_slice(key).get_shape():
                    numel *= size
                total += numel
    return total


def learner(cfg: Any) -> dict[str, Any]:
    """The model a recipe trains: its directory's name and parameter count."""
    path = Path(cfg.model.path)
    return {"name": path.name, "parameters": parameter_count(path)}


def fmt_parameters(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / 1e6:.2f} M" if n >= 1e5 else f"{n / 1e3:.0f} k"


class OtherLoad:
    """The machine's CPU load besides this process and its waited-for children, in cores:
    (busy ticks of ``/proc/stat`` / ticks per second − this process tree's CPU seconds) / wall
    seconds since the start. ``None`` where ``/proc/stat`` is absent (not Linux)."""

    def __init__(self) -> None:
        self.start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float] | None:
        try:
            fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        except OSError:
            return None
        # user nice system idle iowait irq softirq steal (guest is counted in user)
        ticks = [int(x) for x in fields[:8]]
        busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
        own = sum(os.times()[:4])
        return busy, own, time.monotonic()

    def cores(self) -> float | None:
        now = self._sample()
        if self.start is None or now is None or now[2] <= self.start[2]:
            return None
        busy, own = now[0] - self.start[0], now[1] - self.start[1]
        return max(0.0, busy - own) / (now[2] - self.start[2])


def sft_overrides(cfg: Any, out: Path, name: str) -> list[str]:
    """The capacity check of a recipe: true labels, the warm start + RL budget in SFT steps
    (one per RL optimizer update: ``train.steps × algorithm.updates_per_batch``) at the RL
    stage's lr (``optim.lr``), no RL, the recipe's evaluation once after training.

    The RL lr, not the format warm start's: the warm start's higher lr suits learning a
    format and understates what the model can learn (tiny Qwen2.5-VL on shapes_kind, 460 SFT
    steps: 0.48 at 3e-3, 0.81 at 1e-3; measured 2026-11-24)."""
    steps = cfg.warm_start.steps + cfg.train.steps * cfg.algorithm.updates_per_batch
    return [
        f"output_dir={out}",
        f"name={name}-sft",
        "warm_start.labels=target",
        f"warm_start.steps={steps}",
        f"warm_start.lr={cfg.optim.lr}",
        "train.steps=0",
        "eval.every=0",
        "eval.before=true",
        "eval.after=false",
        "checkpoint.every=0",
    ]


def run_one(name: str, overrides: list[str]) -> dict[str, Any]:
    """``mmrft train learn/NAME`` (or ``tools/NAME``) in this process with ``overrides``;
    returns summary.json."""
    from mmrft.config import load_config
    from mmrft.training.trainer import train

    return train(load_config(config_name(name), overrides))


def submit(pool: ThreadPoolExecutor | None, name: str, overrides: list[str]) -> Future | dict:
    """:func:`run_one` now in this process, or (``pool``) in a child process of its own
    (``--single``), waited on by a pool thread."""
    if pool is None:
        return run_one(name, overrides)
    return pool.submit(run_in_child, name, overrides)


def run_in_child(name: str, overrides: list[str]) -> dict[str, Any]:
    """``python benchmarks/learning.py --single NAME overrides``; its last stdout line is the
    run's summary.json. The child's output is kept in ``--out`` beside the run directories."""
    out = next(o.split("=", 1)[1] for o in overrides if o.startswith("output_dir="))
    run = next(o.split("=", 1)[1] for o in overrides if o.startswith("name="))
    log_path = Path(out) / f"{run}.log"
    command = [sys.executable, str(Path(__file__).resolve()), "--single", name, *overrides]
    with open(log_path, "w") as log_file:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=log_file, text=True)
        log_file.write(done.stdout)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"run {run} failed (exit {done.returncode}); its log: {log_path}")
    return json.loads(lines[-1])


def result(run: Future | dict) -> dict[str, Any]:
    """A run's summary.json, waiting for a pool's run to end."""
    return run.result() if isinstance(run, Future) else run


def eval_curve(run_dir: Path, metric: str) -> tuple[list[int], list[float]]:
    """The held-out primary metric by RL step from ``metrics.jsonl`` (step 0: before RL)."""
    from mmrft.evaluation.report import read_history

    points = sorted({h["step"]: h[metric] for h in read_history(run_dir) if metric in h}.items())
    return [s for s, _ in points], [v for _, v in points]


TOOL_TARGET = 0.85
"""A tool row's target: held-out accuracy with the tool at every seed (issue 37)."""


def target(chance: float | None, metric: str, recipe: str = "") -> float:
    """The issue's targets: :data:`TOOL_TARGET` for a tool recipe (:data:`TOOL_RECIPES`); 0.3
    for detection AP50 (mean over the categories of the AP at IoU 0.5, the "mAP" Visual-RFT
    reports); 0.5 for grounding Acc@0.5, temporal R1@0.5 and any metric without a chance
    level; otherwise halfway from chance to 1.0."""
    if recipe in TOOL_RECIPES:
        return TOOL_TARGET
    if metric.endswith("AP50"):
        return 0.3
    if chance is None or metric.endswith(("acc@0.5", "R1@0.5")):
        return 0.5
    return chance + (1.0 - chance) / 2.0


def fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def spread(values: list[float | None]) -> dict[str, float | None]:
    """Mean, min and max of one figure over seeds (``None`` when any seed has none)."""
    if not values or any(v is None for v in values):
        return {"mean": None, "min": None, "max": None}
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values)}


def fmt_spread(s: dict[str, float | None]) -> str:
    """``mean [min, max]``, or the mean alone when every seed gave the same figure."""
    if s["mean"] is None or s["min"] == s["max"]:
        return fmt(s["mean"])
    return f"{fmt(s['mean'])} [{fmt(s['min'])}, {fmt(s['max'])}]"


def met(row: dict[str, Any]) -> str:
    """ "yes" when the *lowest* seed's figure after RL reaches the target."""
    low = row["after"]["min"]
    return "—" if low is None else ("yes" if low >= row["target"] else "no")


def fmt_seconds(row: dict[str, Any]) -> str:
    """Mean RL seconds; ``*`` when the runs shared the machine with other jobs."""
    seconds = fmt(row["rl_seconds"]["mean"], 0)
    load = row.get("other_load")
    return seconds + (
        f" * ({load:.1f} cores besides)" if load is not None and load > BESIDE else ""
    )


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| recipe | task | metric | learner (parameters) | seeds | chance | before RL | "
        "after RL: mean [min, max] | SFT ceiling: mean [min, max] | target | met (min) | "
        "RL seconds | threads |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        model = r.get("learner") or {"name": "?", "parameters": None}
        lines.append(
            f"| {r['recipe']} | {r['task']} | {r['metric'].rsplit('/', 1)[-1]} | "
            f"{model['name']} ({fmt_parameters(model['parameters'])}) | "
            f"{len(r['seeds'])} | {fmt(r['chance'])} | {fmt_spread(r['before'])} | "
            f"{fmt_spread(r['after'])} | {fmt_spread(r['sft'])} | {fmt(r['target'])} | "
            f"{met(r)} | {fmt_seconds(r)} | {r.get('threads') or '?'} |"
        )
    return "\n".join(lines)


def recipe_row(
    name: str,
    runs: list[dict[str, Any]],
    learner: dict[str, Any] | None = None,
    threads: int | None = None,
    other_load: float | None = None,
) -> dict[str, Any]:
    """One table row from a recipe's runs, one per seed: each run ``{"seed", "summary",
    "sft", "steps", "values"}``; the figures as ``{"mean", "min", "max"}`` over seeds.
    ``learner``: :func:`learner`'s; ``other_load``: :class:`OtherLoad`'s cores when the
    recipe's last run ended."""
    first = runs[0]["summary"]
    return {
        "recipe": name,
        "learner": learner,
        "threads": threads,
        "other_load": other_load,
        "task": first["task"],
        "metric": first["metric"],
        "chance": first["chance"],
        "target": target(first["chance"], first["metric"], name),
        "seeds": [r["seed"] for r in runs],
        "before": spread([r["summary"]["before"] for r in runs]),
        "after": spread([r["summary"]["after"] for r in runs]),
        "sft": spread([r["sft"] for r in runs]),
        "rl_steps": first["steps"],
        "rl_seconds": spread([r["summary"]["train_seconds"] for r in runs]),
        "runs": [
            {
                "seed": r["seed"],
                "before": r["summary"]["before"],
                "after": r["summary"]["after"],
                "sft": r["sft"],
                "rl_seconds": r["summary"]["train_seconds"],
                "steps": r["steps"],
                "values": r["values"],
            }
            for r in runs
        ],
    }


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, r in enumerate(rows):
        colour = colours[i % len(colours)]
        label = f"{r['recipe']} ({r['metric'].rsplit('/', 1)[-1]}, {len(r['seeds'])} seeds)"
        # the steps every seed evaluated at (the same schedule, unless a run stopped early)
        steps = sorted(set.intersection(*(set(run["steps"]) for run in r["runs"])))
        curves = [[dict(zip(run["steps"], run["values"]))[s] for s in steps] for run in r["runs"]]
        mean = [sum(v) / len(v) for v in zip(*curves)]
        ax.plot(steps, mean, marker="o", ms=3, lw=1.6, color=colour, label=label)
        if len(curves) > 1:
            low, high = [min(v) for v in zip(*curves)], [max(v) for v in zip(*curves)]
            ax.fill_between(steps, low, high, color=colour, alpha=0.18, lw=0)
        if r["chance"] is not None:
            ax.axhline(r["chance"], color=colour, linestyle=":", lw=1)
        if r["sft"]["mean"] is not None:
            ax.errorbar(
                [steps[-1] if steps else 0],
                [r["sft"]["mean"]],
                yerr=[[r["sft"]["mean"] - r["sft"]["min"]], [r["sft"]["max"] - r["sft"]["mean"]]],
                color=colour,
                capsize=3,
                lw=1,
            )
            ax.scatter(
                [steps[-1] if steps else 0],
                [r["sft"]["mean"]],
                marker="*",
                s=90,
                color=colour,
                edgecolor="black",
                zorder=5,
            )
    ax.set_xlabel("RL step (0: after the format-only warm start)")
    ax.set_ylabel("held-out primary metric")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(
        "Learning on CPU: held-out metric vs RL step, mean over seeds (band: min–max;\n"
        "dotted: chance; ★: SFT ceiling, bar: its min–max)",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def commit() -> str:
    """The checkout's commit (``+dirty`` with uncommitted changes), else ``unknown``."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return (head + ("+dirty" if dirty else "")) if head else "unknown"


def main(argv: list[str] | None = None) -> int:
    from mmrft.evaluation.runlog import cpu_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="recipes to run (default: all)")
    parser.add_argument("--out", default=str(REPO / "runs" / "learning"), help="output folder")
    parser.add_argument("--no-sft", action="store_true", help="skip the capacity checks")
    parser.add_argument(
        "--seeds", type=int, default=1, help="runs per recipe, at train.seed 0 … N-1 (default 1)"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs at a time, each in its own process at the same train.threads (default 1)",
    )
    parser.add_argument("overrides", nargs="*", help="key=value overrides for every run")
    parser.add_argument("--single", metavar="NAME", help=argparse.SUPPRESS)  # a --jobs child
    args = parser.parse_args(argv)
    if args.single:
        print(json.dumps(run_one(args.single, args.overrides)))
        return 0
    if args.jobs < 1:
        parser.error("--jobs needs at least 1")

    from mmrft.config import load_config

    names = args.only or recipes()
    unknown = sorted(set(names) - set(recipes()))
    if unknown:
        parser.error(f"no recipe {', '.join(unknown)} under {LEARN}; have {', '.join(recipes())}")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.seeds < 1:
        parser.error("--seeds needs at least 1")
    common = list(args.overrides)
    threads_used = load_config(config_name(names[0]), common).train.threads
    cores = os.cpu_count() or 1
    if args.jobs * threads_used > cores:
        print(
            f"note: {args.jobs} runs at a time × {threads_used} threads > {cores} cores: the "
            f"runs share cores (the figures are those of --jobs 1; for speed on this machine "
            f"pass train.threads={max(1, cores // args.jobs)})",
            file=sys.stderr,
        )
    load = OtherLoad()
    started = time.perf_counter()
    # every run submitted at once; a recipe's row is written as soon as its runs are done
    # each run in a child process: torch's thread pools are per process
    pool = ThreadPoolExecutor(args.jobs) if args.jobs > 1 else None
    pending: dict[str, list[tuple[int, Future | dict, Future | dict | None]]] = {}
    for name in names:
        for seed in range(args.seeds):
            overrides = [*common, f"train.seed={seed}"]
            cfg = load_config(config_name(name), overrides)
            label = f"{run_label(name)}-s{seed}"
            check = None
            if not args.no_sft:
                check = submit(pool, name, [*overrides, *sft_overrides(cfg, out, label)])
            rl = submit(pool, name, [*overrides, f"output_dir={out}", f"name={label}"])
            pending.setdefault(name, []).append((seed, rl, check))
    rows = []
    for name in names:
        runs = []
        for seed, rl, check in pending[name]:
            summary = result(rl)
            sft = result(check)["before"] if check is not None else None
            steps, values = eval_curve(Path(summary["run_dir"]), summary["metric"])
            runs.append(
                {"seed": seed, "summary": summary, "sft": sft, "steps": steps, "values": values}
            )
        cfg = load_config(config_name(name), common)
        rows.append(recipe_row(name, runs, learner(cfg), cfg.train.threads, load.cores()))
        # written after every recipe, so an interrupted run keeps what it measured
        other = load.cores()
        shared = (
            "other load unknown"
            if other is None
            else f"other load {other:.2f} cores on average"
            + (" (* measured beside other jobs)" if other > BESIDE else " (idle otherwise)")
        )
        header = (
            f"Measured {date.today().isoformat()} on {cpu_model()} ({platform.machine()}, "
            f"{cores} cores), {threads_used} thread(s) per run, {args.jobs} run(s) at a time, "
            f"{shared}, train.seed 0 … {args.seeds - 1}, commit {commit()}; command: "
            f"`{' '.join(['python benchmarks/learning.py', *sys.argv[1:]])}`"
        )
        (out / "learning.md").write_text(header + "\n\n" + table(rows) + "\n")
        (out / "learning.json").write_text(json.dumps(rows, indent=1) + "\n")
        plot(rows, out / "learning.png")
    if pool is not None:
        pool.shutdown()
    print(table(rows))
    print(
        f"wrote {out / 'learning.md'}, {out / 'learning.png'} ({time.perf_counter() - started:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
