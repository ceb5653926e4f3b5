"""Learning on CPU: does every bundled task learn through RL, and how far could it?

    python benchmarks/learning.py                          # every recipe under configs/learn/
    python benchmarks/learning.py --only audio_pitch shapes_kind
    python benchmarks/learning.py --out runs/learning --no-sft
    python benchmarks/learning.py --only shapes_kind -- optim.lr=3e-4   # overrides for both runs

For each recipe ``configs/learn/NAME.yaml`` (the same file ``mmrft train learn/NAME`` runs):

1. **capacity check** (skipped with ``--no-sft``): ordinary supervised training on the *true*
   labels, with the same model, data, media budget and budget of optimizer steps as the RL
   recipe (``warm_start.steps + train.steps`` steps of ``warm_start.batch_size`` samples at the
   RL stage's lr ``optim.lr``; ``warm_start.labels=target``, no RL), then the recipe's own
   evaluation.
   Its figure, the *SFT ceiling*, says what this model can learn from this data in this many
   steps: a task whose SFT stays at chance cannot be expected to learn by RL either.
2. **RL recipe**, as written: the format-only warm start (random labels, so the evaluation
   before RL is at chance and every gain is RL's), GRPO, the evaluation every ``eval.every``
   steps and after.

Both runs write ordinary run directories under ``--out`` (``NAME-sft``, ``NAME``), with
``summary.json``, ``metrics.jsonl`` and ``report.png``. This script then writes
``--out/learning.md`` (the table: task, metric, chance, before RL, after RL, SFT ceiling,
target, RL seconds), ``--out/learning.json`` (the same figures) and ``--out/learning.png``
(the held-out metric against the RL step for every task, each with its chance level dotted).

Targets (issue "Learning that shows"): the held-out primary metric after RL at least halfway
from chance to 1.0; grounding Acc@0.5 and temporal grounding R1@0.5 at least 0.5, detection
AP50 at least 0.3, and 0.5 for a metric without a chance level (chart QA). RL seconds are the
RL loop's wall time (``summary.json`` ``train_seconds``: rollouts, verifiers, updates and the
periodic evaluations), without the warm start and model loading.

Each recipe sets ``train.threads: 2``; run on an otherwise idle machine for timings.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LEARN = REPO / "configs" / "learn"


def recipes() -> list[str]:
    """Every recipe name under ``configs/learn/``, sorted."""
    return sorted(p.stem for p in LEARN.glob("*.yaml"))


def sft_overrides(cfg: Any, out: Path, name: str) -> list[str]:
    """The capacity check of a recipe: true labels, the warm start + RL budget in SFT steps
    at the RL stage's lr (``optim.lr``), no RL, the recipe's evaluation once after training.

    The RL lr, not the format warm start's: the warm start's higher lr suits learning a
    format and understates what the model can learn (tiny Qwen2.5-VL on shapes_kind, 460 SFT
    steps: 0.48 at 3e-3, 0.81 at 1e-3; measured 2026-11-24)."""
    steps = cfg.warm_start.steps + cfg.train.steps
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
    """``mmrft train learn/NAME`` in this process with ``overrides``; returns summary.json."""
    from mmrft.config import load_config
    from mmrft.trainer import train

    return train(load_config(f"learn/{name}", overrides))


def eval_curve(run_dir: Path, metric: str) -> tuple[list[int], list[float]]:
    """The held-out primary metric by RL step from ``metrics.jsonl`` (step 0: before RL)."""
    from mmrft.report import read_history

    points = sorted({h["step"]: h[metric] for h in read_history(run_dir) if metric in h}.items())
    return [s for s, _ in points], [v for _, v in points]


def target(chance: float | None, metric: str) -> float:
    """The issue's targets: 0.3 for detection AP50 (mean over the categories of the AP at IoU
    0.5, the "mAP" Visual-RFT reports); 0.5 for grounding Acc@0.5, temporal R1@0.5 and any
    metric without a chance level; otherwise halfway from chance to 1.0."""
    if metric.endswith("AP50"):
        return 0.3
    if chance is None or metric.endswith(("acc@0.5", "R1@0.5")):
        return 0.5
    return chance + (1.0 - chance) / 2.0


def fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| recipe | task | metric | chance | before RL | after RL | SFT ceiling | target | met | RL seconds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        met = "—" if r["after"] is None else ("yes" if r["after"] >= r["target"] else "no")
        lines.append(
            f"| {r['recipe']} | {r['task']} | {r['metric'].rsplit('/', 1)[-1]} | "
            f"{fmt(r['chance'])} | {fmt(r['before'])} | {fmt(r['after'])} | {fmt(r['sft'])} | "
            f"{fmt(r['target'])} | {met} | {fmt(r['rl_seconds'], 0)} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, r in enumerate(rows):
        colour = colours[i % len(colours)]
        label = f"{r['recipe']} ({r['metric'].rsplit('/', 1)[-1]})"
        ax.plot(r["steps"], r["values"], marker="o", ms=3, lw=1.6, color=colour, label=label)
        if r["chance"] is not None:
            ax.axhline(r["chance"], color=colour, linestyle=":", lw=1)
        if r["sft"] is not None:
            ax.scatter(
                [r["steps"][-1] if r["steps"] else 0],
                [r["sft"]],
                marker="*",
                s=90,
                color=colour,
                edgecolor="black",
                zorder=5,
            )
    ax.set_xlabel("RL step (0: after the format-only warm start)")
    ax.set_ylabel("held-out primary metric")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Learning on CPU: held-out metric vs RL step (dotted: chance; ★: SFT ceiling)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="recipes to run (default: all)")
    parser.add_argument("--out", default=str(REPO / "runs" / "learning"), help="output folder")
    parser.add_argument("--no-sft", action="store_true", help="skip the capacity checks")
    parser.add_argument("overrides", nargs="*", help="key=value overrides for every run")
    args = parser.parse_args(argv)

    from mmrft.config import load_config

    names = args.only or recipes()
    unknown = sorted(set(names) - set(recipes()))
    if unknown:
        parser.error(f"no recipe {', '.join(unknown)} under {LEARN}; have {', '.join(recipes())}")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    started = time.perf_counter()
    for name in names:
        cfg = load_config(f"learn/{name}", args.overrides)
        sft = None
        if not args.no_sft:
            summary = run_one(name, [*args.overrides, *sft_overrides(cfg, out, name)])
            sft = summary["before"]
        summary = run_one(name, [*args.overrides, f"output_dir={out}", f"name={name}"])
        steps, values = eval_curve(Path(summary["run_dir"]), summary["metric"])
        rows.append(
            {
                "recipe": name,
                "task": summary["task"],
                "metric": summary["metric"],
                "chance": summary["chance"],
                "before": summary["before"],
                "after": summary["after"],
                "sft": sft,
                "target": target(summary["chance"], summary["metric"]),
                "rl_steps": summary["steps"],
                "rl_seconds": summary["train_seconds"],
                "steps": steps,
                "values": values,
            }
        )
        # written after every recipe, so an interrupted run keeps what it measured
        header = (
            f"Measured {date.today().isoformat()} on {platform.machine()} "
            f"({platform.processor() or 'CPU'}), 2 threads per run; command: "
            f"`{' '.join(['python benchmarks/learning.py', *sys.argv[1:]])}`"
        )
        (out / "learning.md").write_text(header + "\n\n" + table(rows) + "\n")
        (out / "learning.json").write_text(json.dumps(rows, indent=1) + "\n")
        plot(rows, out / "learning.png")
    print(table(rows))
    print(
        f"wrote {out / 'learning.md'}, {out / 'learning.png'} ({time.perf_counter() - started:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
