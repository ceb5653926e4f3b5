"""On-policy distillation against GRPO on CPU: RL steps and seconds to the teacher's accuracy.

    python benchmarks/distill.py                      # seeds 0-2, into runs/distill/
    python benchmarks/distill.py --seeds 1 --distill-steps 100

1. **teacher**: ``mmrft train demo`` at ``--teacher-seed`` (the recipe ``make demo`` runs: the
   tiny Qwen2.5-VL, a format-only warm start, 600 GRPO steps), its final checkpoint; its
   held-out accuracy ``T`` after RL must be ≥ 0.95, else the script stops.
2. **students**, at each seed S (``train.seed``): the same tiny model and the same format-only
   warm start (random labels: before RL at chance), then
   - ``grpo``: the demo recipe as it is (format + accuracy rewards, KL β = 0.04 to the warm
     start, 600 steps);
   - ``distill-sampled`` and ``distill-full``: pure on-policy distillation from the teacher
     (``teacher.path``, ``algorithm.reward_coef=0``: the verifiers score and log but do not
     enter the loss; β = 0, the teacher is the anchor), ``--distill-steps`` steps, with the
     per-token estimate in the advantage (``algorithm.distill_loss=sampled``) and with the
     exact KL over the whole distribution (``full``);
   both with the held-out evaluation every ``--eval-every`` steps.
3. For each run: the first evaluated step whose accuracy is within 0.05 of ``T``, the RL
   seconds to it (the sum of ``time/step_s`` up to that step: rollouts, verifiers, teacher and
   updates, the evaluations left out) and the accuracy after RL. Written to
   ``--out/distill.md`` (with the CPU, threads, commit and command), ``--out/distill.json``
   and ``--out/distill.png`` (held-out accuracy against RL step, every run).

The claim it checks (docs/algorithms.md): distillation alone reaches the teacher's accuracy
within 0.05 in fewer RL steps and less RL time than GRPO alone, at every seed (exit 0 when
one of the two distillation losses does).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from learning import commit, eval_curve  # noqa: E402  (benchmarks/ is not a package)

METRIC = "eval/classification/accuracy"
WITHIN = 0.05


def train_demo(out: Path, name: str, overrides: list[str]) -> dict[str, Any]:
    """``mmrft train demo`` in this process into ``out/name``; returns its summary."""
    from mmrft.config import load_config
    from mmrft.training.trainer import train

    cfg = load_config("demo", [f"output_dir={out}", f"name={name}", *overrides])
    return train(cfg, verbose=False)


def curve(run_dir: Path) -> tuple[list[tuple[int, float]], dict[int, float]]:
    """``([(step, held-out accuracy)], {step: seconds of that RL step})`` of a run."""
    from mmrft.evaluation.report import read_history

    seconds = {h["step"]: h["time/step_s"] for h in read_history(run_dir) if "time/step_s" in h}
    return list(zip(*eval_curve(run_dir, METRIC))), seconds


def reached(run_dir: Path, goal: float) -> dict[str, Any]:
    """The first evaluated step at accuracy ≥ ``goal`` and the RL seconds to it (None if
    never), the accuracy after RL and the curve."""
    evals, seconds = curve(run_dir)
    step = next((s for s, v in evals if v >= goal), None)
    return {
        "step": step,
        "seconds": None
        if step is None
        else round(float(sum(t for s, t in seconds.items() if s <= step)), 1),
        "before": evals[0][1] if evals else None,
        "after": evals[-1][1] if evals else None,
        "curve": evals,
        "rl_seconds": round(sum(seconds.values()), 1),
    }


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "never"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def table(teacher: dict[str, Any], rows: list[dict[str, Any]], goal: float) -> str:
    lines = [
        f"Teacher: the demo recipe at seed {teacher['seed']}, held-out accuracy {teacher['after']:.3f}; "
        f"goal: ≥ {goal:.3f} (within {WITHIN} of the teacher).",
        "",
        "| seed | method | RL steps | before RL | after RL | first step at the goal | RL seconds to it | RL seconds in all |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['seed']} | {r['method']} | {r['steps']} | {fmt(r['before'])} | {fmt(r['after'])} | "
            f"{fmt(r['step'])} | {fmt(r['seconds'], 1)} | {r['rl_seconds']:.1f} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], teacher: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    colours = {"grpo": "tab:blue", "distill-sampled": "tab:orange", "distill-full": "tab:green"}
    for r in rows:
        steps, values = zip(*r["curve"]) if r["curve"] else ((), ())
        label = f"{r['method']}" if r["seed"] == rows[0]["seed"] else None
        ax.plot(steps, values, color=colours[r["method"]], alpha=0.8, label=label)
    ax.axhline(teacher, color="black", linestyle="--", label=f"teacher {teacher:.3f}")
    ax.axhline(0.25, color="grey", linestyle=":", label="chance 0.25")
    ax.set_xlabel("RL step")
    ax.set_ylabel("held-out accuracy")
    ax.set_title("demo task: on-policy distillation vs GRPO (one line per seed)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    from mmrft.evaluation.runlog import cpu_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "runs" / "distill"))
    parser.add_argument("--seeds", type=int, default=3, help="student seeds 0 … N−1")
    parser.add_argument("--teacher-seed", type=int, default=0)
    parser.add_argument("--distill-steps", type=int, default=300)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument(
        "--min-teacher", type=float, default=0.95, help="the teacher's least held-out accuracy"
    )
    parser.add_argument(
        "overrides", nargs="*", help="key=value for every run, e.g. train.threads=1"
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    teacher_name = f"teacher-s{args.teacher_seed}"
    summary = train_demo(out, teacher_name, [f"train.seed={args.teacher_seed}", *args.overrides])
    teacher_after = summary["after"]
    checkpoints = sorted((out / teacher_name / "checkpoints").glob("step-*"))
    teacher = {"seed": args.teacher_seed, "after": teacher_after, "path": str(checkpoints[-1])}
    print(f"teacher: {teacher}", flush=True)
    if teacher_after < args.min_teacher:
        print(
            f"the teacher reached {teacher_after:.3f} < {args.min_teacher}; no comparison",
            file=sys.stderr,
        )
        return 1
    goal = teacher_after - WITHIN
    every = f"eval.every={args.eval_every}"
    distill = [
        every,
        f"teacher.path={teacher['path']}",
        "algorithm.reward_coef=0",
        "algorithm.beta=0",
        f"train.steps={args.distill_steps}",
    ]
    methods = {
        "grpo": [every],
        "distill-sampled": [*distill, "algorithm.distill_loss=sampled"],
        "distill-full": [*distill, "algorithm.distill_loss=full"],
    }
    rows = []
    for seed in range(args.seeds):
        for method, extra in methods.items():
            name = f"{method}-s{seed}"
            run = train_demo(out, name, [f"train.seed={seed}", *extra, *args.overrides])
            row = {
                "seed": seed,
                "method": method,
                "steps": run["steps"],
                **reached(out / name, goal),
            }
            print(json.dumps({k: v for k, v in row.items() if k != "curve"}), flush=True)
            rows.append(row)

    header = (
        f"`python benchmarks/distill.py {' '.join(argv if argv is not None else sys.argv[1:])}` "
        f"at commit {commit()}, {cpu_model()}, {time.perf_counter() - t0:.0f} s in all"
    )
    text = table(teacher, rows, goal)
    (out / "distill.md").write_text(f"{header}\n\n{text}\n")
    (out / "distill.json").write_text(
        json.dumps({"teacher": teacher, "goal": goal, "rows": rows, "header": header}, indent=1)
        + "\n"
    )
    plot(rows, teacher_after, out / "distill.png")
    print(header)
    print(text)
    by = {(r["seed"], r["method"]): r for r in rows}
    verdicts = {}
    for method in ("distill-sampled", "distill-full"):
        verdicts[method] = all(
            by[s, method]["step"] is not None
            and (
                by[s, "grpo"]["step"] is None
                or (
                    by[s, method]["step"] < by[s, "grpo"]["step"]
                    and by[s, method]["seconds"] < by[s, "grpo"]["seconds"]
                )
            )
            for s in range(args.seeds)
        )
        print(
            f"{method} reached the goal in fewer steps and seconds than GRPO at every seed: {verdicts[method]}"
        )
    return 0 if any(verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
